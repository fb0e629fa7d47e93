#!/usr/bin/env python3
"""The runtimes' own loaders reading wanbake's `--to comfy:*` / `--to lightx2v:*` files (issue 41).

wanbake converts golden/quant_base/source_f32_small.safetensors to every format; each file is
then loaded as its runtime loads it (golden/quant_base_golden.py's `comfy_load`: ComfyUI's
`convert_old_quants` and MixedPrecisionOps' `_load_quantized_module` + `dequantize()` on
comfy-kitchen 0.2.40's eager layouts; `lightx2v_load`: LightX2V's `weight * weight_scale`), and
every tensor's f32 values must equal, bit for bit, what the same loader gives for the file the
reference tool itself made (golden/quant_base/index.json). ConvRot: wanbake rotates exactly, so
its loaded values are held to wanbake's own exact decoding (`convert --dtype f32`) within the
BLAS-dependent last bits of ComfyUI's f32 un-rotation (2.4e-7 on the golden model).

The result, per format (the sha256 of wanbake's file and the tensors checked), is
golden/comfy_out/loaded.json. Exits 1 on any difference.

Usage (the venv and sources of golden/quant_base/README.md "Regenerate"):
  QB_SRC=/tmp/qb-src TORCH_EXTENSIONS_DIR=/tmp/qb-torch-ext \\
    /tmp/qb-venv/bin/python golden/comfy_out_load.py target/release/wanbake
"""

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_base_golden as qbg  # noqa: E402

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "quant_base" / "source_f32_small.safetensors"
CASES = {  # --to value: (reference file in golden/quant_base, loader)
    "comfy:fp8": ("comfy_fp8.safetensors", "comfy"),
    "comfy:nvfp4": ("comfy_nvfp4.safetensors", "comfy"),
    "comfy:mxfp8": ("comfy_mxfp8.safetensors", "comfy"),
    "comfy:int8": ("comfy_int8.safetensors", "comfy"),
    "comfy:int8-convrot": (None, "comfy"),
    "lightx2v:int8": ("lightx2v_int8.safetensors", "lightx2v"),
    "lightx2v:fp8": ("lightx2v_fp8.safetensors", "lightx2v"),
}


def convert(wanbake: str, src: Path, args: list[str], out: Path) -> Path:
    subprocess.run([wanbake, "-q", "convert", str(src), *args, "--out", str(out)], check=True)
    (f,) = [p for p in out.iterdir() if p.suffix == ".safetensors"]
    return f


def main(wanbake: str) -> int:
    index = json.loads((HERE / "quant_base" / "index.json").read_text())["files"]
    c = qbg.comfy()
    result, bad = {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        for to, (ref, loader) in CASES.items():
            model = "convrot" if ref is None else "small"
            src = SOURCE if ref is not None else Path(tmp) / "convrot_source.safetensors"
            if ref is None:
                qbg.save_st({k: torch.from_numpy(v) for k, v in qbg.source_model("convrot").items()}, src)
            shp = qbg.SHAPES[model]
            # The reference LightX2V files were converted with `--non_linear_dtype bfloat16`.
            extra = ["--dtype", "bf16"] if loader == "lightx2v" else []
            out = convert(wanbake, src, ["--to", to, *extra], Path(tmp) / to.replace(":", "_"))
            loaded = qbg.comfy_load(c, out, shp) if loader == "comfy" else qbg.lightx2v_load(out, shp)
            if ref is not None:
                want = index[ref]["expect"]["tensors"]
                diff = [k for k, v in loaded.items() if qbg.f32_sha(v) != want[k]["f32_sha256"]]
                check = "bit-equal to the loader's values for the reference tool's file"
            else:
                exact, _ = qbg.read_st(convert(wanbake, out, ["--dtype", "f32"], Path(tmp) / "exact"))
                diff = [k for k, v in loaded.items()
                        if (v - exact[k].float()).abs().max().item() > 2.4e-7]
                check = "within 2.4e-7 of wanbake's exact decoding"
            bad += len(diff)
            result[to] = {"file_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
                          "tensors": len(loaded), "check": check, "differ": diff}
            print(to, len(loaded), "tensors,", "OK" if not diff else f"DIFFER {diff}")
    (HERE / "comfy_out" / "loaded.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
