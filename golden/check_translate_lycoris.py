"""Check `wanbake translate --to peft` of LyCORIS LoHa/LoKr modules with real PEFT.

Run by hand after `cargo build --release` (torch 2.15.0, diffusers 0.36.0, peft 0.21.2):

    python golden/check_translate_lycoris.py

For each Linear LoHa/LoKr golden of `golden/adapters/lycoris` (LyCORIS's own naming and its
kohya naming, both written by lycoris-lora 4.1.3) and each PEFT LOHA/LOKR golden folder sent
through LyCORIS's naming and back, this runs `target/release/wanbake translate ... --to peft`,
loads the folder with `peft.PeftModel.from_pretrained` on the tiny diffusers
`WanTransformer3DModel` of `golden/models/t2v` (PEFT builds each layer from the config's r,
alpha, decompose_factor and decompose_both and refuses tensors of any other shape), runs
`merge_and_unload()`, and compares every parameter with the reference of the original file
(`golden/references/lycoris/<case>.safetensors`: lycoris-lora's training forward, or PEFT's
merge of the original folder): targets within 4·eps_f32·max|ref|, everything else
bit-identical. The conv LoKr must be refused with nothing written. Writes a summary and exits
non-zero on any failure. The result is recorded in golden/TRANSLATE_CHECK.md.
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
LYCORIS = GOLDEN / "adapters" / "lycoris"

# (name, [translate steps: (source or None for the previous output, target convention)], reference)
CASES = []
for case in ["loha", "lokr_w2ab", "lokr_both_dec", "lokr_full"]:
    for naming in ["", "__kohya"]:
        CASES.append((f"{case}{naming}", [(LYCORIS / f"{case}{naming}.safetensors", "peft")], case))
for case in ["peft_loha", "peft_lokr", "peft_lokr_both_dec"]:
    CASES.append((f"{case} via lycoris", [(LYCORIS / case, "lycoris"), (None, "peft")], case))
CASES.append(("peft_lokr_full", [(LYCORIS / "peft_lokr_full", "peft")], "peft_lokr_full"))


def translate(src: Path, to: str, out: Path) -> Path:
    p = subprocess.run([str(BIN), "--quiet", "translate", str(src), "--to", to, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"translate --to {to} failed: {p.stderr.strip()}")
    return out


def weights_of(folder: Path) -> Path:
    return next(folder.glob("*.safetensors"))


def run_case(name: str, steps, ref: str, tmp: Path) -> tuple[bool, str]:
    src = None
    for k, (source, to) in enumerate(steps):
        source = source if source is not None else weights_of(src)
        src = translate(source, to, tmp / f"{name.replace(' ', '_')}_{k}")
    base_model = WanTransformer3DModel.from_pretrained(GOLDEN / "models" / "t2v", torch_dtype=torch.float32).eval()
    base = {k: v.detach().clone() for k, v in base_model.state_dict().items()}
    model = PeftModel.from_pretrained(base_model, str(src))
    merged = {k: v.detach() for k, v in model.merge_and_unload().state_dict().items()}
    want = load_file(GOLDEN / "references" / "lycoris" / f"{ref}.safetensors")
    worst = 0.0
    for k, v in merged.items():
        if k in want:
            r = want[k].to(v.dtype)
            err = (v - r).abs().max().item()
            tol = 4 * EPS32 * max(r.abs().max().item(), 1e-30)
            worst = max(worst, err / tol)
            if err > tol:
                return False, f"{k}: max |peft - ref| = {err:.3e} > {tol:.3e}"
        elif not torch.equal(v, base[k]):
            return False, f"{k}: changed, but the reference leaves it untouched"
    cfg = json.loads((src / "adapter_config.json").read_text())
    return True, (f"{len(want)} tensors match (worst {worst:.2f} of the bound), {cfg['peft_type']} "
                  f"r={cfg['r']} alpha={cfg['alpha']} decompose_factor={cfg.get('decompose_factor')} "
                  f"decompose_both={cfg.get('decompose_both')} patterns={len(cfg['rank_pattern'])}/"
                  f"{len(cfg['alpha_pattern'])}")


def run_refusal(tmp: Path) -> tuple[bool, str]:
    out = tmp / "refused_conv_lokr"
    p = subprocess.run([str(BIN), "translate", str(LYCORIS / "conv_lokr.safetensors"), "--to", "peft",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    ok = p.returncode == 1 and not out.exists() and "Conv3d" in p.stderr
    return ok, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "(no message)"


def main() -> int:
    if not BIN.is_file():
        print(f"build first: {BIN} is missing (cargo build --release)", file=sys.stderr)
        return 2
    failures = 0
    with tempfile.TemporaryDirectory(prefix="wanbake-check-lycoris-peft-") as d:
        tmp = Path(d)
        for case in CASES:
            try:
                ok, msg = run_case(*case, tmp)
            except Exception as e:  # a refused translate or a PEFT load error is a failure
                ok, msg = False, str(e)
            failures += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {case[0]}: {msg}")
        ok, msg = run_refusal(tmp)
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'}  refuse conv_lokr: {msg}")
    print(f"{len(CASES) + 1 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
