"""PEFT LOHA/LOKR golden fixtures for wanbake (issue 14, spec/lycoris.md §1).

Builds PEFT LoHa and LoKr adapters with the real `peft` library (pinned in
golden/requirements.txt: peft 0.21.2, torch 2.15.0) on Linear modules of the tiny WAN in
golden/models/t2v (diffusers names), saves them with `save_pretrained` (adapter_config.json +
adapter_model.safetensors: keys `base_model.model.<module>.hada_w1_a` / `.lokr_w1` ...), and
records the weights PEFT's own `merge_and_unload()` produces: the oracle for PEFT folders.

Why PEFT's merge and not lycoris-lora's `merge_to()`: these are PEFT files, scaled by PEFT's
rule (config `alpha / r` after rank_pattern/alpha_pattern, for every module, a LoKr with both
factors full included), which is not LyCORIS's rule; and lycoris-lora's `merge_to()` scales
LoHa/LoKr by s^2 anyway (spec lycoris.md §3, golden/lycoris_golden.py).

Outputs (small, committed):
  golden/adapters/lycoris/peft_<case>/{adapter_config.json, adapter_model.safetensors}
  golden/references/lycoris/peft_<case>.safetensors  {diffusers base name: merged f32 weight}
  golden/references/lycoris/peft_<case>__s0.5.safetensors  wanbake's rule W0 + 0.5·(W1 − W0)

Run: python golden/lycoris_peft_golden.py   (in a venv with golden/requirements.txt)
"""
import json
import os
import shutil
import sys

import torch
from peft import LoHaConfig, LoKrConfig, get_peft_model
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

ROOT = os.path.dirname(os.path.abspath(__file__))
BASE = load_file(os.path.join(ROOT, "models/t2v/diffusion_pytorch_model.safetensors"))
ADIR = os.path.join(ROOT, "adapters/lycoris")
RDIR = os.path.join(ROOT, "references/lycoris")


def model(targets):
    """A module tree holding the targets as nn.Linear with the base's weights and biases,
    under their diffusers names."""
    root = torch.nn.Module()
    for name in targets:
        cur = root
        parts = name.split(".")
        for p in parts[:-1]:
            if not hasattr(cur, p):
                cur.add_module(p, torch.nn.Module())
            cur = getattr(cur, p)
        w = BASE[name + ".weight"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=True)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(BASE[name + ".bias"])
        cur.add_module(parts[-1], lin)
    return root


CASES = [
    # LoHa, alpha != r, with a rank and an alpha pattern on the second module
    ("loha", LoHaConfig, dict(r=4, alpha=2,
                              target_modules=["blocks.0.attn1.to_q", "blocks.1.attn1.to_k"],
                              rank_pattern={"blocks.1.attn1.to_k": 2},
                              alpha_pattern={"blocks.1.attn1.to_k": 6})),
    # LoKr, w1 full and w2 = w2_a@w2_b (r small), alpha != r, decompose_factor
    ("lokr", LoKrConfig, dict(r=2, alpha=3, decompose_factor=4,
                              target_modules=["blocks.0.ffn.net.0.proj", "blocks.2.attn2.to_q"])),
    # LoKr with decompose_both: w1 = w1_a@w1_b too
    ("lokr_both_dec", LoKrConfig, dict(r=2, alpha=1, decompose_both=True, decompose_factor=8,
                                       target_modules=["blocks.1.ffn.net.0.proj"])),
    # LoKr whose factors are both full (r large): PEFT still scales by alpha / r (= 0.25 here),
    # where LyCORIS's rule would give 1
    ("lokr_full", LoKrConfig, dict(r=64, alpha=16, decompose_factor=4,
                                   target_modules=["blocks.1.attn1.to_v"])),
]


def main():
    for name, cls, kw in CASES:
        torch.manual_seed(100)
        targets = kw["target_modules"]
        peft_model = get_peft_model(model(targets), cls(**kw))
        g = torch.Generator().manual_seed(len(name))
        with torch.no_grad():
            for n, p in sorted(peft_model.named_parameters()):
                if "hada_" in n or "lokr_" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        out = os.path.join(ADIR, "peft_" + name)
        shutil.rmtree(out, ignore_errors=True)
        peft_model.save_pretrained(out)
        # keep the config stable across runs: PEFT keeps target_modules as a set, so its
        # order depends on the hash seed
        cfg_path = os.path.join(out, "adapter_config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["target_modules"] = sorted(cfg["target_modules"])
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
        readme = os.path.join(out, "README.md")
        if os.path.exists(readme):
            os.remove(readme)
        merged = peft_model.merge_and_unload()
        sd = merged.state_dict()
        refs = {t + ".weight": sd[t + ".weight"].contiguous() for t in targets}
        save_file(refs, os.path.join(RDIR, f"peft_{name}.safetensors"))
        half = {k: (BASE[k] + 0.5 * (v - BASE[k])).contiguous() for k, v in refs.items()}
        save_file(half, os.path.join(RDIR, f"peft_{name}__s0.5.safetensors"))
        keys = load_file(os.path.join(out, "adapter_model.safetensors"))
        print(name, {k: tuple(v.shape) for k, v in keys.items()},
              {k: "%.3g" % (v - BASE[k]).abs().max().item() for k, v in refs.items()})


if __name__ == "__main__":
    sys.exit(main())
