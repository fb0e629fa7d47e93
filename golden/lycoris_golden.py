"""LyCORIS golden fixtures for wanbake (issue 14, spec/lycoris.md).

Builds LyCORIS adapters of each kind with the real `lycoris-lora` library (pinned in
golden/README.md, section "LyCORIS") on Linear modules of the tiny WAN in golden/models/t2v,
and records the merged weight the library's TRAINING FORWARD (rebuild mode, bypass_mode=False)
applies: the module is hooked onto an nn.Linear holding the base weight, called on the identity
matrix, and the change of its output (minus the unchanged base output) is the delta the forward
adds. Reference = W0 + that delta, in f32.

Why not `merge_to()` / `get_merged_weight()`: in lycoris-lora 4.1.3 they scale LoHa and LoKr
by s^2 instead of s whenever alpha != rank (get_weight already applies s, get_diff_weight applies
it again), while the training forward, PEFT, ComfyUI and musubi apply s once (spec lycoris.md §3).
The forward is what a trained adapter was trained with, so it is the oracle.

Outputs (small, committed):
  golden/adapters/lycoris/<case>.safetensors   the module's state_dict under `lycoris_<diffusers
                                               module, . -> _>.<tensor>` (LyCORIS's own naming)
  golden/adapters/lycoris/<case>__kohya.safetensors  the same tensors under
                                               `lora_unet_<original-Wan module>.<tensor>`
  golden/references/lycoris/<case>[__s0.5].safetensors  {diffusers base name: merged f32 weight}
     at multiplier 1 (and 0.5 for the strength check: wanbake's rule W0 + λ·(f(W0) − W0) is
     computed here from the multiplier-1 forward, because LyCORIS's multiplier means something
     else for OFT/BOFT; for LoHa/LoKr/GLoRA/full the library's own multiplier-0.5 forward is
     also recorded as `__lyco_s0.5` and must agree with the rule).

Not covered yet: PEFT LOHA/LOKR folders.

Run: PYTHONPATH=<dir with lycoris-lora 4.1.3, einops, toml> python golden/lycoris_golden.py
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

import lycoris  # noqa: E402
from lycoris.modules import (  # noqa: E402
    ButterflyOFTModule,
    DiagOFTModule,
    FullModule,
    GLoRAModule,
    IA3Module,
    LohaModule,
    LokrModule,
)

ROOT = os.path.dirname(os.path.abspath(__file__))
BASE = load_file(os.path.join(ROOT, "models/t2v/diffusion_pytorch_model.safetensors"))
ADIR = os.path.join(ROOT, "adapters/lycoris")
RDIR = os.path.join(ROOT, "references/lycoris")

# diffusers module -> original Wan module (spec conventions.md §5, wan.md)
ORIG = {
    "attn1.to_q": "self_attn.q",
    "attn1.to_k": "self_attn.k",
    "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o",
    "attn2.to_q": "cross_attn.q",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
}


def kohya_name(module):
    if module == "patch_embedding":
        return "lora_unet_patch_embedding"
    parts = module.split(".", 2)  # blocks, N, rest
    return "lora_unet_" + f"blocks.{parts[1]}.{ORIG[parts[2]]}".replace(".", "_")


def linear(module):
    w = BASE[module + ".weight"]
    if w.dim() == 5:  # Conv3d patch_embedding, kernel = stride
        k = tuple(w.shape[2:])
        conv = torch.nn.Conv3d(w.shape[1], w.shape[0], k, stride=k, bias=True)
        with torch.no_grad():
            conv.weight.copy_(w)
            conv.bias.copy_(BASE[module + ".bias"])
        return conv
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=True)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(BASE[module + ".bias"])
    return lin


def forward_weight(mod, lin, module, mult):
    """(W0 + the weight delta, b0 + the bias delta) the module's rebuild forward applies at
    multiplier `mult`: the output on the identity minus the output on zero is W'ᵀ, the output
    on zero is b'."""
    mod.multiplier = mult
    shape = BASE[module + ".weight"].shape
    n = shape[1:].numel()
    eye = torch.eye(n, dtype=torch.float32).reshape(n, *shape[1:])  # one-hot patches for a conv
    zero = torch.zeros(1, *shape[1:], dtype=torch.float32)
    with torch.no_grad():
        bias = lin(zero).reshape(-1)  # lycoris forward (apply_to replaced lin.forward)
        weight = (lin(eye).reshape(n, -1) - bias).T.reshape(shape)
    return weight.contiguous(), bias.contiguous()


def randomise(mod, seed, std=0.1, keep=("alpha", "on_input")):
    g = torch.Generator().manual_seed(seed)
    sd = mod.state_dict()
    for k, v in sd.items():
        if k.split(".")[-1] in keep or k in keep or not v.is_floating_point():
            continue
        sd[k] = std * torch.randn(v.shape, generator=g, dtype=v.dtype)
    mod.load_state_dict(sd)


CASES = []


def case(name, module, cls, seed, mults_lyco=True, prep=None, **kw):
    CASES.append((name, module, cls, seed, mults_lyco, prep, kw))


# LoHa, alpha != r (the s^2 trap): r = 4, alpha = 2
case("loha", "blocks.0.attn1.to_q", LohaModule, 1, lora_dim=4, alpha=2)
# LoKr, w1 full, w2 = w2_a@w2_b, alpha != r: s = alpha / r(w2_b)
case("lokr_w2ab", "blocks.0.ffn.net.0.proj", LokrModule, 2, lora_dim=2, alpha=3, factor=4)
# LoKr, w1 = w1_a@w1_b and w2 = w2_a@w2_b (decompose_both)
case("lokr_both_dec", "blocks.1.ffn.net.0.proj", LokrModule, 3, lora_dim=2, alpha=1,
     factor=8, decompose_both=True)
# LoKr, both factors full (lora_dim huge): s = 1 whatever alpha; created with alpha 16, dim 10000
case("lokr_full", "blocks.1.attn1.to_v", LokrModule, 4, lora_dim=10000, alpha=16, factor=4)
# Diag-OFT with an active constraint (alpha is the constraint) and rescale
case("oft", "blocks.2.attn1.to_out.0", DiagOFTModule, 5, lora_dim=8, alpha=1e-3,
     constraint=1e-3, rescaled=True)
# Diag-OFT, no constraint
case("oft_free", "blocks.2.attn2.to_q", DiagOFTModule, 6, lora_dim=8, alpha=0)
# BOFT: several stages (stage order matters), constraint off
case("boft", "blocks.0.ffn.net.2", ButterflyOFTModule, 7, lora_dim=4, alpha=0)
# GLoRA: `.weight` keys, alpha != r
case("glora", "blocks.2.ffn.net.0.proj", GLoRAModule, 8, lora_dim=4, alpha=2)
# (IA)3 on output and on input
case("ia3_out", "blocks.1.attn1.to_q", IA3Module, 9, train_on_input=False)
case("ia3_in", "blocks.1.attn2.to_q", IA3Module, 10, train_on_input=True)
# full diff + diff_b
case("full", "blocks.0.attn1.to_v", FullModule, 11)
# Conv3d patch_embedding (32, 4, 1, 2, 2), no Tucker
case("conv_loha", "patch_embedding", LohaModule, 12, lora_dim=2, alpha=3)
case("conv_lokr", "patch_embedding", LokrModule, 13, lora_dim=2, alpha=1, factor=2)
case("conv_lokr_full", "patch_embedding", LokrModule, 14, lora_dim=10000, alpha=5, factor=4)
case("conv_oft", "patch_embedding", DiagOFTModule, 15, lora_dim=8, alpha=0)
case("conv_ia3_in", "patch_embedding", IA3Module, 16, train_on_input=True)
# Tucker cores on the Conv3d (kernel (1, 2, 2))
case("conv_loha_tucker", "patch_embedding", LohaModule, 17, lora_dim=2, alpha=3, use_tucker=True)
case("conv_lokr_tucker", "patch_embedding", LokrModule, 18, lora_dim=2, alpha=1, factor=2,
     use_tucker=True)


def save_adapter(path, lyco_name, sd):
    save_file({f"{lyco_name}.{k}": v.contiguous() for k, v in sorted(sd.items())}, path)


def main():
    os.makedirs(ADIR, exist_ok=True)
    os.makedirs(RDIR, exist_ok=True)
    for name, module, cls, seed, _, _, kw in CASES:
        torch.manual_seed(seed)
        lin = linear(module)
        lyco_name = "lycoris_" + module.replace(".", "_")
        mod = cls(lyco_name, lin, multiplier=1.0, bypass_mode=False, **kw)
        mod.apply_to()
        # Tucker deltas are products of five factors: larger factors keep them well above
        # the test tolerance
        randomise(mod, seed, std=0.5 if "tucker" in name else 0.1)
        if name == "lokr_full":
            # the trap: both factors full, stored alpha 1 (as other trainers write it) != dim;
            # the forward ignores it (scale 1), so the file and the oracle agree on it
            sd0 = mod.state_dict()
            sd0["alpha"] = torch.tensor(1.0)
            mod.load_state_dict(sd0)
        sd = {k: v.detach().clone() for k, v in mod.state_dict().items()}
        save_adapter(os.path.join(ADIR, name + ".safetensors"), lyco_name, sd)
        save_adapter(os.path.join(ADIR, name + "__kohya.safetensors"), kohya_name(module), sd)
        w0 = BASE[module + ".weight"]
        w1, b1 = forward_weight(mod, lin, module, 1.0)
        refs = {module + ".weight": w1}
        if cls is FullModule:
            refs[module + ".bias"] = b1
        save_file(refs, os.path.join(RDIR, name + ".safetensors"))
        # wanbake's strength rule at lambda = 0.5, from the multiplier-1 forward
        half = {module + ".weight": (w0 + 0.5 * (w1 - w0)).contiguous()}
        if cls is FullModule:
            b0 = BASE[module + ".bias"]
            half[module + ".bias"] = (b0 + 0.5 * (b1 - b0)).contiguous()
        save_file(half, os.path.join(RDIR, name + "__s0.5.safetensors"))
        if cls in (LohaModule, LokrModule, GLoRAModule, FullModule):
            lyco_half, _ = forward_weight(mod, lin, module, 0.5)
            save_file({module + ".weight": lyco_half},
                      os.path.join(RDIR, name + "__lyco_s0.5.safetensors"))
        print(name, module, {k: tuple(v.shape) for k, v in sd.items()},
              "max|dW|=%.3g" % (w1 - w0).abs().max().item())


if __name__ == "__main__":
    sys.exit(main())
