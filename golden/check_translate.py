"""Check `wanbake translate --to peft` with real PEFT.

Run by hand after `cargo build --release`:

    /work/pyenv/bin/python golden/check_translate.py

For every golden adapter that PEFT can express, this script runs
`target/release/wanbake translate <adapter> --to peft --out <tmp>`, loads the result with
`peft.PeftModel.from_pretrained` on the tiny diffusers `WanTransformer3DModel` it was made for,
calls `merge_and_unload()`, and compares every parameter with the golden reference:

* tensors the reference lists must match it to 4·eps_f32·max|ref| (the README's bound for
  f32 tool outputs, which covers PEFT's own f32 rounding);
* every other parameter must be bit-identical to the base.

The references are independent of wanbake: PEFT merge_and_unload / diffusers fuse_lora of the
original files, float64 hand derivations where diffusers refuses the file, or the Qwix float64
deltas. So a pass means the translated file, read by PEFT itself, merges to the same weights as
the original convention did in its own reference tool. It also runs the refusal cases and checks
that nothing is written. It writes a summary to stdout and exits non-zero on any failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel
from peft import PeftModel
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden"
BIN = ROOT / "target" / "release" / "wanbake"
EPS32 = float(torch.finfo(torch.float32).eps)

# (name, adapter, extra translate args, base model dir, reference files (later ones win per key),
#  delta reference (Qwix: base + delta) or None)
CASES = [
    ("peft_plain", "adapters/peft_plain", [], "t2v", ["references/peft_plain"], None),
    ("peft_rslora_pattern", "adapters/peft_rslora_pattern", [], "t2v", ["references/peft_rslora_pattern"], None),
    ("peft_dora", "adapters/peft_dora", [], "t2v", ["references/peft_dora"], None),
    ("peft_bias", "adapters/peft_bias", [], "t2v", ["references/peft_bias"], None),
    ("peft_i2v", "adapters/peft_i2v", [], "i2v", ["references/peft_i2v"], None),
    ("diffusers_lora", "adapters/diffusers_lora", [], "t2v", ["references/diffusers_lora"], None),
    ("diffusers_lora_nometa", "adapters/diffusers_lora_nometa", [], "t2v", ["references/diffusers_lora_nometa"], None),
    ("comfy_lora_ab", "adapters/comfy_lora_ab", [], "t2v", ["references/comfy_lora_ab__handderived"], None),
    ("kohya_lora", "adapters/kohya_lora", [], "t2v", ["references/kohya_lora"], None),
    ("kohya_wanfun", "adapters/kohya_wanfun", [], "t2v", ["references/kohya_wanfun__handderived"], None),
    ("a14b_high", "adapters/a14b_pair/high.safetensors", [], "a14b/transformer", ["references/a14b_pair__transformer"], None),
    ("a14b_low", "adapters/a14b_pair/low.safetensors", [], "a14b/transformer_2", ["references/a14b_pair__transformer_2"], None),
    ("qwix_per_layer", "qwix/qwix_per_layer.safetensors", [], "t2v", [], "qwix/references/qwix_per_layer__delta"),
    ("qwix_stacked", "qwix/qwix_stacked.safetensors", [], "t2v", [], "qwix/references/qwix_stacked__delta"),
    ("qwix_noscale", "qwix/qwix_noscale.safetensors", ["--scale", "2"], "t2v", [], "qwix/references/qwix_noscale__delta"),
    # With the base: the Conv3d kernel and names come from the base's own keys.
    ("peft_rslora_pattern+base", "adapters/peft_rslora_pattern", ["--base", "golden/models/t2v"], "t2v", ["references/peft_rslora_pattern"], None),
]

# Files PEFT cannot express: translate must refuse and write nothing.
REFUSALS = ["adapters/comfy_lora", "adapters/comfy_i2v", "sa3/adapters/bora.safetensors"]


def load_model(name: str) -> WanTransformer3DModel:
    return WanTransformer3DModel.from_pretrained(GOLDEN / "models" / name, torch_dtype=torch.float32).eval()


def expected(base: dict, refs: list[str], delta: str | None) -> dict:
    want: dict[str, torch.Tensor] = {}
    for r in refs:
        want.update(load_file(GOLDEN / f"{r}.safetensors"))
    if delta is not None:
        for k, d in load_file(GOLDEN / f"{delta}.safetensors").items():
            want[k] = (base[k].double() + d.double()).float()
    return want


def run_case(name, adapter, extra, base_name, refs, delta, tmp: Path) -> tuple[bool, str]:
    out = tmp / name.replace("+", "_")
    cmd = [str(BIN), "--quiet", "translate", str(GOLDEN / adapter), "--to", "peft", "--out", str(out), *extra]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        return False, f"translate failed: {p.stderr.strip()}"
    base_model = load_model(base_name)
    base = {k: v.detach().clone() for k, v in base_model.state_dict().items()}
    model = PeftModel.from_pretrained(base_model, str(out))
    merged = {k: v.detach() for k, v in model.merge_and_unload().state_dict().items()}
    want = expected(base, refs, delta)
    worst = 0.0
    for k, v in merged.items():
        if k in want:
            ref = want[k].to(v.dtype)
            err = (v - ref).abs().max().item()
            tol = 4 * EPS32 * max(ref.abs().max().item(), 1e-30)
            worst = max(worst, err / tol)
            if err > tol:
                return False, f"{k}: max |peft - ref| = {err:.3e} > {tol:.3e}"
        elif not torch.equal(v, base[k]):
            return False, f"{k}: changed, but the reference leaves it untouched"
    missing = sorted(set(want) - set(merged))
    if missing:
        return False, f"reference keys absent from the model: {missing[:5]}"
    cfg = json.loads((out / "adapter_config.json").read_text())
    return True, (
        f"{len(want)} tensors match (worst {worst:.2f} of the bound), r={cfg['r']} "
        f"lora_alpha={cfg['lora_alpha']} rslora={cfg['use_rslora']} dora={cfg['use_dora']} "
        f"lora_bias={cfg['lora_bias']} patterns={len(cfg['rank_pattern'])}/{len(cfg['alpha_pattern'])}"
    )


def run_refusal(adapter: str, tmp: Path) -> tuple[bool, str]:
    out = tmp / ("refused_" + Path(adapter).stem)
    p = subprocess.run([str(BIN), "translate", str(GOLDEN / adapter), "--to", "peft", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    ok = p.returncode == 1 and not out.exists() and "cannot be expressed" in p.stderr
    first = p.stderr.strip().splitlines()[0] if p.stderr.strip() else "(no message)"
    return ok, first


def main() -> int:
    if not BIN.is_file():
        print(f"build first: {BIN} is missing (cargo build --release)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="wanbake-check-translate-") as d:
        tmp = Path(d)
        for case in CASES:
            ok, msg = run_case(*case, tmp)
            failures += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {case[0]}: {msg}")
        for adapter in REFUSALS:
            ok, msg = run_refusal(adapter, tmp)
            failures += not ok
            print(f"{'PASS' if ok else 'FAIL'}  refuse {adapter}: {msg}")
    print(f"{len(CASES) + len(REFUSALS) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
