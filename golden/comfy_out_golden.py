#!/usr/bin/env python3
"""Reference digests for `--to comfy:* | lightx2v:*` on real WAN shapes (issue 41).

For two inputs with 1.3B shapes, 2 blocks (`wanbake synth --layers 2 --seed 41`:
wan2.1-t2v-1.3b (T2V) and skyreels-v2-i2v-1.3b (I2V, with cross_attn.k_img / v_img)), the
f32 weights under original Wan names (`wanbake restack --to wan --dtype f32`, a lossless
rename of the synth output) are quantized by the reference tools themselves, exactly as
golden/quant_base_golden.py does for its small model (the same pinned versions, the same
functions, imported from it):

- ComfyUI mixed precision: comfy-kitchen 0.2.40's eager quantizers through ComfyUI's
  `QuantizedTensor.from_float` and `_quantized_weight_state_dict` (fp8, nvfp4, mxfp8, int8
  per-row; MXFP8's E8M0 scales stored as U8 like golden/quant_base's comfy_mxfp8, where
  ComfyUI's own writer says F8_E8M0 for the same bytes), every other tensor rounded to BF16; block Linears = Comfy-Org's set
  (`blocks.N.{self,cross}_attn.{q,k,v,o}`, `cross_attn.{k_img,v_img}`, `ffn.{0,2}`).
- LightX2V: its own `tools/convert/converter.py --quantized --linear_type int8|fp8
  --model_type wan_dit --non_linear_dtype torch.bfloat16 --single_file` on the f32 file.

Only the digests are committed (`comfy_out/index.json`: per output, per stored tensor,
dtype, shape and sha256 of the bytes, plus the input's per-tensor f32 sha256), not the
~100 MB files. tests/comfy_out.rs synthesizes the same inputs, converts them with the real
binary and compares every tensor.

Usage (the venv and reference sources of golden/quant_base/README.md "Regenerate"):
  QB_SRC=/tmp/qb-src TORCH_EXTENSIONS_DIR=/tmp/qb-torch-ext \\
    /tmp/qb-venv/bin/python golden/comfy_out_golden.py target/release/wanbake
"""

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from fractions import Fraction

import numpy as np  # noqa: F401 (also through quant_base_golden)
import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_base_golden as qbg  # noqa: E402

OUT = Path(__file__).resolve().parent / "comfy_out"
MODELS = {"t2v": "wan2.1-t2v-1.3b", "i2v": "skyreels-v2-i2v-1.3b"}
SYNTH = ["--layers", "2", "--seed", "41"]
# Comfy-Org's block Linears, k_img / v_img included (quant_base's regex has no I2V model).
BLOCK_LINEAR = re.compile(
    r"blocks\.\d+\.(?:(?:self|cross)_attn\.(?:[qkvo]|[kv]_img)|ffn\.[02])\.weight")
COMFY_FORMATS = ("fp8", "nvfp4", "mxfp8", "int8")
GROUP = 256
LIGHTX2V_FORMATS = ("int8", "fp8")


def f32_source(wanbake: str, model: str, d: Path) -> Path:
    subprocess.run([wanbake, "synth", "--model", model, *SYNTH, "--out", str(d / "s"), "-q"],
                   check=True)
    subprocess.run([wanbake, "restack", str(d / "s"), "--to", "wan", "--dtype", "f32",
                    "--out", str(d / "w"), "-q"], check=True)
    return d / "w" / "diffusion_pytorch_model.safetensors"


def load(path: Path) -> dict:
    with safe_open(str(path), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# ------------------------------------------------------ ConvRot: the exact rule (issue 41)
# comfy-kitchen rotates with an f32 matmul whose last bits depend on the BLAS kernel, so its
# bytes are not reproducible; the oracle is the exact rotation: per group of 256 inputs
# W_rot = W @ H.T with H = kron^4(H4) / 16, computed in integers; row scale
# clamp(f32(max |W_rot|) / 127, 1e-30) (f32 rounding of the exact maximum, then torch's f32
# division); code = round_half_even(W_rot / scale) of the exact quotient, clamped.

CONVROT_ROWS = 8  # the first and the last 8 rows of every block Linear (rows are independent)
TWO = Fraction(2)


def fwht(a: list) -> None:
    """In place: the unnormalised kron^m(H4) product of one group (Python ints: exact)."""
    n, stride = len(a), 1
    while stride < n:
        for base in range(0, n, 4 * stride):
            for k in range(base, base + stride):
                p, q, r, t = a[k], a[k + stride], a[k + 2 * stride], a[k + 3 * stride]
                a[k], a[k + stride] = p + q + r - t, p + q - r + t
                a[k + 2 * stride], a[k + 3 * stride] = p - q + r + t, q + r + t - p
        stride *= 4


def rne(x: Fraction) -> int:
    f = x.numerator // x.denominator
    rest = x - f
    return f + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and f % 2) else 0)


def f32_of(x: Fraction) -> np.float32:
    """x rounded once to f32 (nearest even; the normal range, asserted)."""
    if x == 0:
        return np.float32(0.0)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    e += 1 if x >= TWO ** (e + 1) else (-1 if x < TWO ** e else 0)
    assert -126 <= e <= 127, e
    return np.float32(rne(x / TWO ** (e - 23)) * 2.0 ** (e - 23))


def convrot_row(row: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """The exact rule on one row of f32 weights: codes and scale."""
    a = [int(Fraction(float(v)) * 2 ** 149) for v in row]  # every f32 is a multiple of 2^-149
    for g in range(0, len(a), GROUP):
        part = a[g:g + GROUP]
        fwht(part)
        a[g:g + GROUP] = part
    unit = TWO ** -(149 + 4)  # H = kron^4(H4) / sqrt(256)
    amax = f32_of(max(abs(x) for x in a) * unit)
    s = max(np.float32(amax / np.float32(127.0)), np.float32(1e-30))
    fs = Fraction(float(s))
    codes = np.array([max(-128, min(127, rne(x * unit / fs))) for x in a], dtype=np.int8)
    return codes, s


def convrot_rows(src: dict, c) -> dict:
    """Per block Linear: sha256 of the exact rule's codes (I8 bytes) and scales (F32 bytes) on
    the first and the last CONVROT_ROWS rows, and how comfy-kitchen's own bytes on those rows
    compare (codes that differ: by how much, and how far the exact quotient is from a tie)."""
    ck = qbg.comfy_state_dict(c, src, "int8_convrot")
    out = {}
    for name in sorted(n for n in src if BLOCK_LINEAR.fullmatch(n)):
        w = src[name]
        rows = list(range(CONVROT_ROWS)) + list(range(w.shape[0] - CONVROT_ROWS, w.shape[0]))
        res = [convrot_row(w[r]) for r in rows]
        codes = np.stack([q for q, _ in res])
        scales = np.array([s for _, s in res], dtype=np.float32)
        layer = name[:-len(".weight")]
        ck_q = ck[name].numpy()[rows]
        ck_s = ck[f"{layer}.weight_scale"].numpy()[rows, 0]
        diff = np.argwhere(ck_q != codes)
        out[name] = {
            "rows": rows,
            "codes_sha256": qbg.sha(codes.tobytes()),
            "scales_sha256": qbg.sha(scales.astype("<f4").tobytes()),
            "comfy_kitchen_codes_differ": int(len(diff)),
            "comfy_kitchen_max_code_diff": int(np.abs(ck_q.astype(int) - codes).max()),
            "comfy_kitchen_scales_differ": int((ck_s != scales).sum()),
        }
    return out


def main(wanbake: str) -> None:
    qbg.BLOCK_LINEAR = BLOCK_LINEAR  # comfy_state_dict reads the module global
    torch.set_num_threads(1)
    c = qbg.comfy()
    index = {"versions": qbg.VERSIONS, "synth": SYNTH, "block_linear": BLOCK_LINEAR.pattern,
             "models": {}}
    for key, model in MODELS.items():
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            path = f32_source(wanbake, model, d)
            src = load(path)
            entry = {"model": model, "source": {n: qbg.f32_sha(v) for n, v in sorted(src.items())},
                     "outputs": {}}
            n_quant = sum(bool(BLOCK_LINEAR.fullmatch(n)) for n in src)
            entry["block_linears"] = n_quant
            for fmt in COMFY_FORMATS:
                sd = qbg.comfy_state_dict(c, src, fmt)
                if fmt == "mxfp8":  # uint8 scales (the issue; comfy-quants' writer): same bytes
                    sd = {k: (v.view(torch.uint8) if k.endswith(".weight_scale") else v)
                          for k, v in sd.items()}
                out = d / f"comfy_{fmt}.safetensors"
                qbg.save_st(sd, out)
                entry["outputs"][f"comfy:{fmt}"] = qbg.stored_info(out)["tensors"]
                print(key, fmt, len(sd), flush=True)
            entry["convrot"] = convrot_rows(src, c)
            print(key, "convrot", flush=True)
            for fmt in LIGHTX2V_FORMATS:
                out = d / f"lightx2v_{fmt}.safetensors"
                qbg.lightx2v_file(fmt, path, out)
                entry["outputs"][f"lightx2v:{fmt}"] = qbg.stored_info(out)["tensors"]
                print(key, "lightx2v", fmt, flush=True)
            index["models"][key] = entry
    OUT.mkdir(exist_ok=True)
    (OUT / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    print("wrote", OUT / "index.json",
          hashlib.sha256((OUT / "index.json").read_bytes()).hexdigest())


if __name__ == "__main__":
    main(sys.argv[1])
