"""The (IA)3, BOFT and Tucker shape rules against lycoris-lora 4.1.3 (issue 28, "validate once").

wanbake's bind-time fit (`adapter::lycoris`, `Module::fit`) decides which shapes of an (IA)3
weight and of BOFT's `oft_blocks` fit a target. Before issue 28 the merge kernel re-checked them
with rules of its own that disagreed with the fit's:
  - (IA)3 on the input side: the fit takes exactly the target's input channels (`shape[1]`),
    the kernel any count that divides in·∏k (a weight of in·∏k values, one per column, or of
    fewer channels, each spread over several);
  - BOFT: the fit takes 1 ≤ m ≤ log2(n)+1 stages for n blocks, the kernel's `1 << (m - 1)`
    overflowed from m = 65 on;
  - Tucker cores (LoHa `hada_t1/t2`, LoKr `lokr_t2`): the fit took a 2-D core `(r1, r2)` on a
    Linear (its kernel `()` matched the target's), the kernel wanted at least 3 axes.
Each case here holds one such tensor shape on a target of golden/models/t2v and records what
the library does with it, in two ways:
  - formula: the library's module made for the target (what a trainer would make), its tensors
    replaced by the case's (as stored), called in rebuild mode on the identity, as
    golden/lycoris_golden.py does (its `linear` and `forward_weight` are reused): either the
    merged weight (then `<case>__ref.safetensors` holds it) or the error the formula raises
    (or, when the module has no such tensor at all, as a Linear has no Tucker core: there is
    no formula that uses it);
  - loader: a fresh module's `load_state_dict` of the case's tensors (how LycorisNetwork loads
    a file): "accepts", or its error.
`library_makes` is the shape the library's module has for that target (null: it has none).

Outputs (small, committed), in golden/lycoris/rules/:
  <case>.safetensors        the module under `lycoris_<diffusers module, . -> _>.<tensor>`
  <case>__ref.safetensors   {diffusers base name: merged f32 weight}, when the formula accepts
  outcomes.json             every case: shapes, both outcomes, the errors

Pins: golden/requirements.txt (torch 2.15.0, safetensors 0.8.0, lycoris-lora 4.1.3,
einops 0.8.2, toml 0.10.2; lycoris imports tqdm, unpinned, not used here).
Run: PYTHONPATH=<dir with lycoris-lora 4.1.3, einops, toml> python golden/lycoris_shape_rules.py
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

import lycoris_golden as lg  # noqa: E402  (sets torch's thread count and determinism)
from lycoris.modules import ButterflyOFTModule, IA3Module, LohaModule, LokrModule  # noqa: E402

OUT = os.path.join(lg.ROOT, "lycoris/rules")

IA3_IN = dict(train_on_input=True)
BOFT = dict(lora_dim=4, alpha=0)
TUCKER = dict(lora_dim=2, alpha=2, use_tucker=True)

# (case, diffusers module, class, options, tensor, stored shape, seed, what it shows[, the
# other tensors stored in another shape than the module's: {name: shape}])
CASES = [
    ("ia3_in_conv_channels", "patch_embedding", IA3Module, IA3_IN, "weight", (1, 4, 1, 1, 1), 21,
     "one value per input channel on the Conv3d (32, 4, 1, 2, 2): each scales its 4 kernel "
     "columns (the fit's rule)"),
    ("ia3_in_conv_columns", "patch_embedding", IA3Module, IA3_IN, "weight", (1, 16, 1, 1, 1), 22,
     "one value per column in*k = 16 (the kernel's old rule took it, one value per column)"),
    ("ia3_in_conv_groups", "patch_embedding", IA3Module, IA3_IN, "weight", (1, 2, 1, 1, 1), 23,
     "2 values for 4 input channels (the kernel's old rule took it, 8 columns each)"),
    ("ia3_in_linear_half", "blocks.1.attn2.to_q", IA3Module, IA3_IN, "weight", (16,), 24,
     "16 values for a Linear of 32 inputs (the kernel's old rule took it, 2 columns each)"),
    ("boft_stages_2", "blocks.0.ffn.net.2", ButterflyOFTModule, BOFT, "oft_blocks", (2, 8, 4, 4), 25,
     "2 stages of 8 blocks of 4 (fewer than log2(8)+1 = 4)"),
    ("boft_stages_4", "blocks.0.ffn.net.2", ButterflyOFTModule, BOFT, "oft_blocks", (4, 8, 4, 4), 26,
     "log2(8)+1 = 4 stages, the most 8 blocks allow"),
    ("boft_stages_5", "blocks.0.ffn.net.2", ButterflyOFTModule, BOFT, "oft_blocks", (5, 8, 4, 4), 27,
     "5 stages for 8 blocks, one too many"),
    ("boft_stages_65", "blocks.0.ffn.net.2", ButterflyOFTModule, BOFT, "oft_blocks", (65, 8, 4, 4),
     28, "65 stages (the kernel's old 1 << (m - 1) overflowed here)"),
    ("loha_tucker_linear", "blocks.0.attn1.to_q", LohaModule, TUCKER, "hada_t1", (2, 2), 29,
     "Tucker cores (2, 2) on a Linear (the fit took them, the kernel did not)",
     {"hada_t2": (2, 2), "hada_w1_a": (2, 32), "hada_w1_b": (2, 32), "hada_w2_a": (2, 32),
      "hada_w2_b": (2, 32)}),
    ("lokr_tucker_linear", "blocks.0.attn1.to_q", LokrModule, dict(TUCKER, factor=4), "lokr_t2",
     (2, 2), 30, "a Tucker W2 core (2, 2) on a Linear (the fit took it, the kernel did not)",
     {"lokr_w2_a": (2, 8), "lokr_w2_b": (2, 8)}),
]


def message(e):
    """The error's lines joined (torch's load_state_dict error names the tensor on line 2)."""
    return " ".join(line.strip() for line in str(e).strip().splitlines())


def make(cls, module, name, kw):
    lin = lg.linear(module)
    mod = cls(name, lin, multiplier=1.0, bypass_mode=False, **kw)
    mod.apply_to()
    return mod, lin


def main():
    os.makedirs(OUT, exist_ok=True)
    outcomes = []
    for case, module, cls, kw, tensor, shape, seed, what, *rest in CASES:
        stored = {tensor: shape, **(rest[0] if rest else {})}
        torch.manual_seed(seed)
        name = "lycoris_" + module.replace(".", "_")
        mod, lin = make(cls, module, name, kw)
        own = mod.state_dict()
        made = list(own[tensor].shape) if tensor in own else None
        g = torch.Generator().manual_seed(seed)
        values = {k: 0.1 * torch.randn(v, generator=g, dtype=torch.float32)
                  for k, v in sorted(stored.items())}
        sd = {k: v.detach().clone() for k, v in own.items()}
        sd.update(values)
        save_file({f"{name}.{k}": v.contiguous() for k, v in sorted(sd.items())},
                  os.path.join(OUT, case + ".safetensors"))
        fresh, _ = make(cls, module, name, kw)
        try:
            fresh.load_state_dict(sd)
            loader = "accepts"
        except RuntimeError as e:
            loader = message(e)
        row = {
            "case": case,
            "module": module,
            "target_shape": list(lg.BASE[module + ".weight"].shape),
            "tensor": tensor,
            "stored_shape": list(shape),
            "library_makes": made,
            "what": what,
            "loader": loader,
        }
        absent = sorted(k for k in values if k not in own)
        if absent:
            row["formula"] = "refuses"
            row["formula_error"] = "%s for this target holds no %s: no formula uses it" % (
                cls.__name__, ", ".join(absent))
        else:
            for k, v in values.items():
                setattr(mod, k, torch.nn.Parameter(v))
            try:
                w1, _ = lg.forward_weight(mod, lin, module, 1.0)
                row["formula"] = "accepts"
                save_file({module + ".weight": w1},
                          os.path.join(OUT, case + "__ref.safetensors"))
                row["max_abs_delta"] = float((w1 - lg.BASE[module + ".weight"]).abs().max())
            except RuntimeError as e:
                row["formula"] = "refuses"
                row["formula_error"] = message(e)
        outcomes.append(row)
        print(case, row["formula"], row.get("formula_error", ""), "| loader:", loader)
    doc = {
        "generator": "golden/lycoris_shape_rules.py",
        "library": "lycoris-lora 4.1.3, torch %s" % torch.__version__.split("+")[0],
        "cases": outcomes,
    }
    # one case a line
    cases = ",\n  ".join(json.dumps(c, sort_keys=True) for c in outcomes)
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, sort_keys=True)[1:-1]
    with open(os.path.join(OUT, "outcomes.json"), "w") as f:
        f.write("{%s,\n \"cases\": [\n  %s\n ]\n}\n" % (head, cases))


if __name__ == "__main__":
    sys.exit(main())
