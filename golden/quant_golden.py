"""Quantization goldens for wanbake's fp8-scaled and GGUF encoders (spec quant_formats.md).

Reference implementations, run as they are:
- torch's `Tensor.to(torch.float8_e4m3fn)` on the CPU, and ComfyUI's scale rule
  `scale = amax / 448` (f32), codes `(W / scale).to(float8_e4m3fn)`;
- gguf-py's `gguf.quants.quantize` (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, BF16, F16).

Writes golden/quant/:
- `cast.safetensors`: `x` (F32 values dense around every e4m3 code, midpoint and the special
  values) and `codes` (U8, torch's cast of `x`).
- `crafted.safetensors` and `t2v.safetensors`: for every input tensor `N` (F32, rows a whole
  number of 32-blocks), `N|<type>` = gguf-py's bytes (U8, one row of bytes per input row), and
  `N|fp8` (U8 codes) with `N|fp8_scale` (F32, 0-d). crafted: rounding ties, clips, argmax ties,
  zero and constant blocks, f16 scale underflow; t2v: every 2-D tensor of
  golden/models/t2v_original.safetensors whose rows are whole blocks.
- `expect_t2v_<fmt>[_city96].gguf`, `expect_t2v_fp8_scaled.safetensors`: what
  `wanbake convert golden/models/t2v --to gguf:<fmt>|fp8-scaled` must write, from
  `models/t2v_original.safetensors` (the same weights under original-Wan names), with the
  per-tensor rules of the spec re-implemented here and the bytes from gguf-py / torch.
- `expect_t2v_bf16src_q8_0.gguf`: the same from the weights stored as bf16 (convert.py keeps
  BF16 where an f32 source gets F16).
- `expect_i2v_q4_0.gguf`, `expect_i2v_fp8_scaled.safetensors`: the same for the tiny I2V
  (`models/i2v_original.safetensors`: k_img/v_img, img_emb).
- `merge_peft_plain_{q8_0,q4_0}.gguf`, `merge_peft_plain_fp8_scaled.safetensors`: the same for
  PEFT's merge of `adapters/peft_plain` (`references/peft_plain.safetensors`): the
  merge-then-quantize reference path.
- `t2v_{q8_0,q4_0,fp8_scaled}_dequant.safetensors`: the weights a loader sees in the expected
  files (gguf-py's `dequantize`; ComfyUI's `q.to(f32) * scale_weight`), f32, original names.
- `gguf_written.gguf`: a file written by gguf-py's GGUFWriter (arch "wan", Q8_0, F16, F32 and a
  3-D and a 5-D tensor) and `gguf_written.json`: what GGUFReader reads back from it.

- `variants/quant/quant_variants.json` (mode `variants`, see below): per-tensor digests of the
  fp8-scaled, Q8_0 and Q4_0 files of the tiny VACE and SkyReels-V2 goldens.
- `comfy_loader_{q8_0,q4_0}.{safetensors,json}` (mode `comfy-loader`, see below): what
  city96/ComfyUI-GGUF's own loader reads and dequantizes from wanbake's GGUF output.

Run with the versions in golden/README.md (torch 2.15.0, gguf 0.19.0, numpy 2.4.6):
`python golden/quant_golden.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import quantize
from safetensors.numpy import load_file, save_file

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "quant"
T = gguf.GGMLQuantizationType
TYPES = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1,
         "bf16": T.BF16, "f16": T.F16}


def e4m3_values() -> np.ndarray:
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    return codes.to(torch.float32).numpy()


def cast_inputs() -> np.ndarray:
    v = e4m3_values()
    mids = (v[:-1] + v[1:]) / 2
    pts = np.concatenate([v, mids, np.float32([449, 463.99, 464, 465, 479.9, 480, 500, 1e9,
                                                  3.4e38, 2.0**-10, 2.0**-12, 1e-30, 1e-45])])
    near = np.concatenate([np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    allp = np.concatenate([pts, near]).astype(np.float32)
    allp = np.concatenate([allp, -allp, np.float32([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0])])
    return allp.astype(np.float32)


def fp8_scaled(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = torch.from_numpy(w)
    scale = t.abs().amax() / 448.0
    codes = (t / scale).to(torch.float8_e4m3fn).view(torch.uint8)
    assert scale.dtype == torch.float32
    return codes.numpy(), np.array(scale.item(), dtype=np.float32).reshape(())


def crafted() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(16)
    b = {}
    zero = np.zeros(32, np.float32)
    # Q8_0: amax 127 gives d = 1 and id = 1, so x.5 values are exact ties (away from zero).
    q8 = np.float32([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.4999998, 3.5, 0]
                    + list(np.arange(20, dtype=np.float32) - 10.5))
    # Q4_0: max -8 gives d = 1; x + 8.5 truncates, so x = k - 0.5 sits on a boundary.
    q4 = np.float32([-8, -7.5, -0.5, 0.5, 6.5, 7.0, 7.49, 7.5, 7.99, -7.99]
                    + list(np.linspace(-8, 8, 22, dtype=np.float32)))
    # max +8 gives d = -1: -8 maps to 16.5 -> 16, clipped to 15.
    q4clip = q4.copy()
    q4clip[0] = 8
    q4clip[1] = -8
    # argmax ties: +3 first, then -3 (and the reverse).
    tie_a = np.float32([3, -3] + [0.25] * 30)
    tie_b = np.float32([-3, 3] + [0.25] * 30)
    q5 = np.float32([-16, -15.5, -0.5, 0.5, 15.5, 15.99, 16, -16] + list(np.linspace(-16, 16, 24)))
    const = np.full(32, 0.37, np.float32)
    tiny = (rng.standard_normal(32) * 1e-7).astype(np.float32)  # d underflows in f16
    big = (rng.standard_normal(32) * 3e3).astype(np.float32)
    rows = [zero, q8, q4, q4clip, tie_a, tie_b, q5, const, tiny, big]
    rows += [(rng.standard_normal(32) * s).astype(np.float32) for s in (0.02, 1.0, 0.3)]
    b["blocks"] = np.stack(rows)  # (13, 32): one block per row
    b["wide"] = (rng.standard_normal((4, 96)) * 0.05).astype(np.float32)
    # fp8 scaled: a weight whose scaled values hit e4m3 midpoints and subnormals.
    v = e4m3_values()
    mids = np.float32((v[:-1] + v[1:]) / 2)[:63]
    f = np.concatenate([np.float32([448.0]), mids, -mids[::-1].copy(), np.float32([-0.0])])
    b["fp8_mid"] = (f / np.float32(64)).reshape(4, 32).astype(np.float32)
    b["fp8_small"] = np.concatenate([np.float32([1.0]), np.float32(np.arange(1, 64) * 2.0**-10)])\
        .reshape(2, 32).astype(np.float32)
    return b


def expected(inputs: dict[str, np.ndarray], fp8_all: bool) -> dict[str, np.ndarray]:
    out = {}
    for name, w in inputs.items():
        out[name] = w
        for tname, t in TYPES.items():
            q = quantize(w, t)
            out[f"{name}|{tname}"] = np.ascontiguousarray(q).view(np.uint8).reshape(w.shape[0], -1)
        if fp8_all or name.startswith("fp8"):
            if np.abs(w).max() > 0:
                codes, scale = fp8_scaled(w)
                out[f"{name}|fp8"] = codes
                out[f"{name}|fp8_scale"] = scale
    return out


def model_tensors() -> dict[str, np.ndarray]:
    sd = load_file(str(ROOT / "models" / "t2v_original.safetensors"))
    return {k: v for k, v in sorted(sd.items()) if v.ndim == 2 and v.shape[1] % 32 == 0}


def write_gguf() -> None:
    rng = np.random.default_rng(7)
    path = OUT / "gguf_written.gguf"
    w = gguf.GGUFWriter(str(path), arch="wan")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tensors = {
        "blocks.0.self_attn.q.weight": (rng.standard_normal((64, 64)) * 0.05).astype(np.float32),
        "blocks.0.ffn.2.weight": (rng.standard_normal((64, 80)) * 0.05).astype(np.float32),
        "blocks.0.modulation": rng.standard_normal((1, 6, 64)).astype(np.float32),
        "patch_embedding.weight": rng.standard_normal((64, 4, 1, 2, 2)).astype(np.float32),
        "head.head.weight": (rng.standard_normal((16, 64)) * 0.1).astype(np.float32),
    }
    types = {"blocks.0.self_attn.q.weight": T.Q8_0, "blocks.0.ffn.2.weight": T.F16,
             "blocks.0.modulation": T.F32, "patch_embedding.weight": T.F32,
             "head.head.weight": T.BF16}
    for name, arr in tensors.items():
        t = types[name]
        data = quantize(arr, t)
        w.add_tensor(name, data, raw_shape=data.shape if t in (T.F32, T.F16) else None, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file({k: v for k, v in tensors.items()}, str(OUT / "gguf_written_source.safetensors"))
    r = gguf.GGUFReader(str(path))
    desc = {"kv": {}, "tensors": []}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        val = f.contents()
        desc["kv"][f.name] = {"type": [int(x) for x in f.types], "value": val}
    for t in r.tensors:
        raw = np.asarray(t.data).view(np.uint8).tobytes()
        import hashlib
        desc["tensors"].append({"name": t.name, "type": int(t.tensor_type), "ne": [int(x) for x in t.shape],
                                "offset": int(t.data_offset), "n_bytes": int(t.n_bytes),
                                "sha256": hashlib.sha256(raw).hexdigest()})
    (OUT / "gguf_written.json").write_text(json.dumps(desc, indent=1, sort_keys=True) + "\n")


# ---- whole-release expectations: what `wanbake convert golden/models/t2v --to ...` must write.
# The per-tensor rules are re-implemented here from spec quant_formats.md §1.8 / §2.4 (city96's
# convert.py, its llama-quantize patch and fix_5d_tensors.py), independently of the Rust code;
# the bytes come from gguf-py / torch themselves.
NEVER = ["modulation.", "patch_embedding.", "text_embedding.", "time_projection.", "time_embedding.",
         "img_emb.", "head."]
BUMP = {T.Q4_0: T.Q4_1, T.Q5_0: T.Q5_1}
FILE_TYPE = {"q8_0": 7, "q4_0": 2, "q5_0": 8, "bf16": 32, "f16": 1}


def city96_type(name: str, arr: np.ndarray, fmt: str, bf16_src: bool = False) -> tuple[int, int]:
    """(final type, step-1 type) of one tensor of an f32 (or, with bf16_src, bf16) source."""
    if arr.ndim > 4 or arr.ndim == 1 or arr.size <= 1024 or ".modulation" in name:
        step1 = T.F32
    else:
        step1 = T.BF16 if (fmt == "bf16" or bf16_src) else T.F16
    if fmt in ("bf16", "f16"):
        return step1, step1
    q = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q5_0": T.Q5_0}[fmt]
    if not (name.endswith("weight") and arr.ndim == 2 and not any(p in name for p in NEVER)):
        return step1, step1
    if arr.shape[-1] % 32 != 0:
        return step1, step1
    if ".ffn.2.weight" in name:
        q = BUMP.get(q, q)
    return q, step1


def original_state_dict(merged_case: str | None, model: str = "t2v") -> dict[str, np.ndarray]:
    """t2v under original names; with a case, PEFT's merged tensors (golden/references, diffusers
    names) replace the base ones. Names are matched through the base weights, which are
    distinct random tensors in both files."""
    orig = load_file(str(ROOT / "models" / f"{model}_original.safetensors"))
    if merged_case is None:
        return orig
    diff = load_file(str(ROOT / "models" / "t2v" / "diffusion_pytorch_model.safetensors"))
    by_bytes = {v.tobytes(): k for k, v in orig.items()}
    to_orig = {k: by_bytes[v.tobytes()] for k, v in diff.items() if v.tobytes() in by_bytes}
    merged = load_file(str(ROOT / "references" / f"{merged_case}.safetensors"))
    out = dict(orig)
    for k, v in merged.items():
        out[to_orig[k]] = v
    return out


def expect_gguf(fmt: str, city96_rounding: bool, merged_case: str | None = None,
                bf16_src: bool = False, model: str = "t2v") -> None:
    sd = original_state_dict(merged_case, model)
    if bf16_src:  # the source checkpoint stored in bf16 (RNE, as torch's cast)
        sd = {k: torch.from_numpy(v).to(torch.bfloat16).to(torch.float32).numpy() for k, v in sd.items()}
    suffix = "_city96" if city96_rounding else ""
    stem = f"merge_{merged_case}" if merged_case else (f"expect_{model}_bf16src" if bf16_src else f"expect_{model}")
    path = OUT / f"{stem}_{fmt}{suffix}.gguf"
    w = gguf.GGUFWriter(str(path), arch="wan")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(FILE_TYPE[fmt])
    for name in sorted(sd):
        arr = sd[name].astype(np.float32)
        t, step1 = city96_type(name, arr, fmt, bf16_src)
        src = arr
        if city96_rounding and t not in (T.F32, T.F16, T.BF16) and step1 == T.F16:
            src = arr.astype(np.float16).astype(np.float32)  # what llama-quantize reads
        data = quantize(src, t)
        w.add_tensor(name, data, raw_shape=data.shape if t in (T.F32, T.F16) else None, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


FP8_LINEAR_TOP = {"text_embedding.0.weight", "text_embedding.2.weight", "time_embedding.0.weight",
                  "time_embedding.2.weight", "time_projection.1.weight", "head.head.weight",
                  "img_emb.proj.1.weight", "img_emb.proj.3.weight"}


def is_fp8_linear(name: str, arr: np.ndarray) -> bool:
    if arr.ndim != 2:
        return False
    if name in FP8_LINEAR_TOP:
        return True
    parts = name.split(".")
    if len(parts) < 4 or parts[0] != "blocks" or not parts[1].isdigit():
        return False
    mod = ".".join(parts[2:])
    return mod in ("ffn.0.weight", "ffn.2.weight") or (
        parts[2] in ("self_attn", "cross_attn") and ".".join(parts[3:]) in
        ("q.weight", "k.weight", "v.weight", "o.weight", "k_img.weight", "v_img.weight"))


def expect_fp8(merged_case: str | None = None, model: str = "t2v") -> None:
    from safetensors.torch import save_file as save_torch
    sd = original_state_dict(merged_case, model)
    out = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
    for name in sorted(sd):
        arr = sd[name].astype(np.float32)
        if is_fp8_linear(name, arr):
            codes, scale = fp8_scaled(arr)
            out[name] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
            out[name[: -len(".weight")] + ".scale_weight"] = torch.from_numpy(scale)
        else:
            out[name] = torch.from_numpy(arr).to(torch.float16)
    stem = f"merge_{merged_case}" if merged_case else f"expect_{model}"
    save_torch(out, str(OUT / f"{stem}_fp8_scaled.safetensors"))


def dequantized(fmt: str) -> None:
    """What a loader computes from the expected file: gguf-py's `dequantize` per tensor (GGUF),
    or `codes.to(float32) * scale_weight` (ComfyUI's legacy fp8 ops in f32), under original
    names, as an f32 safetensors the runner can read as a plain checkpoint."""
    from gguf.quants import dequantize
    out = {}
    if fmt == "fp8_scaled":
        from safetensors.torch import load_file as load_torch
        sd = load_torch(str(OUT / "expect_t2v_fp8_scaled.safetensors"))
        for k, v in sd.items():
            if k == "scaled_fp8" or k.endswith(".scale_weight"):
                continue
            if v.dtype == torch.float8_e4m3fn:
                scale = sd[k[: -len(".weight")] + ".scale_weight"]
                out[k] = (v.to(torch.float32) * scale).numpy()
            else:
                out[k] = v.to(torch.float32).numpy()
    else:
        r = gguf.GGUFReader(str(OUT / f"expect_t2v_{fmt}.gguf"))
        for t in r.tensors:
            shape = tuple(int(x) for x in reversed(t.shape))
            out[t.name] = np.ascontiguousarray(dequantize(t.data, t.tensor_type).reshape(shape),
                                               dtype=np.float32)
    save_file(out, str(OUT / f"t2v_{fmt}_dequant.safetensors"))


# ---- ComfyUI-GGUF's own loader on wanbake's GGUF (`comfy-loader` mode) -------------------
#
# The files are wanbake's own output (`wanbake merge --to gguf:<fmt>` of the tiny T2V and the
# peft_plain LoRA: merged and untouched tensors, every rule of spec §2.4), loaded by
# city96/ComfyUI-GGUF's real `loader.gguf_sd_loader` and dequantized by its real
# `dequant.dequantize_tensor`, from a checkout of commit 795e451 (the spec's [G-load]) that is
# NOT part of this repository: pass its folder. Its `ops.py` imports ComfyUI (`comfy.ops`,
# `comfy.lora`, `comfy.model_management`) for the layer classes; only `GGMLTensor` is used
# here, so those three modules are STUBBED below with the few names `ops.py` touches at import
# time. Nothing else of ComfyUI-GGUF is replaced.
#
#   python golden/quant_golden.py comfy-loader target/release/wanbake /path/to/ComfyUI-GGUF
#
# (extra pins for this mode: tqdm 4.67.1 and packaging 25.0, imported by dequant.py / ops.py)
COMFY_FORMATS = ("q8_0", "q4_0")


def wanbake_merge_gguf(wanbake: str, fmt: str, out: Path) -> Path:
    import subprocess
    subprocess.run([wanbake, "-q", "merge", "--base", str(ROOT / "models/t2v"), "--adapter",
                    str(ROOT / "adapters/peft_plain"), "--to", f"gguf:{fmt}", "--out", str(out),
                    "--device", "cpu"], check=True)
    return out / f"model-{fmt}.gguf"


def import_comfy_gguf(checkout: Path):
    import sys
    import types

    class _Layer(torch.nn.Module):
        pass

    ops = types.ModuleType("comfy.ops")
    ops.manual_cast = type("manual_cast", (), {
        n: type(n, (_Layer,), {}) for n in ("Linear", "Conv2d", "Embedding", "LayerNorm", "GroupNorm")})
    ops.cast_to = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stub: not used here"))
    lora = types.ModuleType("comfy.lora")
    lora.calculate_weight = ops.cast_to
    mm = types.ModuleType("comfy.model_management")
    mm.device_supports_non_blocking = lambda device: False
    comfy = types.ModuleType("comfy")
    comfy.ops, comfy.lora, comfy.model_management = ops, lora, mm
    sys.modules.update({"comfy": comfy, "comfy.ops": ops, "comfy.lora": lora,
                        "comfy.model_management": mm})
    # the checkout as a package without running its __init__ (which registers ComfyUI nodes)
    pkg = types.ModuleType("comfy_gguf")
    pkg.__path__ = [str(checkout)]
    sys.modules["comfy_gguf"] = pkg
    import importlib
    return importlib.import_module("comfy_gguf.loader"), importlib.import_module("comfy_gguf.dequant")


def comfy_loader(wanbake: str, checkout: Path) -> None:
    import tempfile
    loader, dequant = import_comfy_gguf(checkout)
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in COMFY_FORMATS:
            path = wanbake_merge_gguf(wanbake, fmt, Path(tmp) / fmt)
            sd, arch = loader.gguf_sd_loader(str(path), return_arch=True)
            tensors, info = {}, {"arch": arch, "tensors": {}}
            for name, t in sd.items():
                info["tensors"][name] = {"type": t.tensor_type.name,
                                         "shape": [int(d) for d in t.tensor_shape]}
                if t.tensor_type.name == "F32":
                    continue  # a plain view of the stored f32 (names, types, shapes above)
                # what ComfyUI computes with: "target" at float32, and the node's default
                # (dequant_dtype None: the block types multiply d·q in float16)
                tensors[name] = (
                    dequant.dequantize_tensor(t, torch.float32, "target").contiguous().numpy())
                if dequant.is_quantized(t):
                    tensors[f"{name}|default"] = (
                        dequant.dequantize_tensor(t, torch.float32).contiguous().numpy())
            save_file(tensors, str(OUT / f"comfy_loader_{fmt}.safetensors"))
            (OUT / f"comfy_loader_{fmt}.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")


# ---- WAN variants (issue #31): the tiny VACE and SkyReels-V2 goldens (`variants` mode) -----
#
# What `wanbake convert golden/variants/<model>/models/<folder> --to fp8-scaled | gguf:<fmt>`
# must write, from the same weights under original names (`<model>_original.safetensors`),
# recorded per tensor (dtype or GGML type, shape, sha256 of the bytes) and, for GGUF, the whole
# file's sha256, in golden/variants/quant/quant_variants.json (tests/variants.rs). The GGUF
# rules and bytes are the ones above (`city96_type`, gguf-py). The fp8 set is NOT the hand list
# `is_fp8_linear`: it is every `nn.Linear` weight of the diffusers model itself
# (`named_modules()` of WanVACETransformer3DModel / SkyReelsV2Transformer3DModel, diffusers
# 0.42.1), mapped to original names by value (the golden's tensors are distinct random draws);
# on the plain tiny T2V the same derivation gives exactly `is_fp8_linear`'s set (checked).
# Needs diffusers (the golden/requirements.txt venv has torch, gguf 0.19.0 and diffusers):
#   /tmp/d42-venv/bin/python golden/quant_golden.py variants
VARIANTS = ROOT / "variants"
VARIANT_MODELS = {
    # name: (diffusers class, diffusers folder, original file)
    "vace": ("WanVACETransformer3DModel", "vace/models/vace", "vace/models/vace_original.safetensors"),
    "skyreels": ("SkyReelsV2Transformer3DModel", "skyreels/models/skyreels_df",
                 "skyreels/models/skyreels_df_original.safetensors"),
}
VARIANT_GGUF = ("q8_0", "q4_0")


def linear_weights(cls_name: str, folder: Path, original: Path) -> list[str]:
    """Original names of the weights of every nn.Linear of the diffusers model in `folder`."""
    import diffusers
    model = getattr(diffusers, cls_name).from_pretrained(folder, torch_dtype=torch.float32)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    orig = load_file(str(original))
    by_bytes = {v.tobytes(): k for k, v in orig.items()}
    assert len(by_bytes) == len(orig) == len(sd), "distinct tensors, one original per diffusers"
    return sorted(by_bytes[sd[n].tobytes()] for n in linear)


# Wan2.2-Animate (issue #31): the input is the ORIGINAL-named tiny model (ComfyUI's names;
# quantized outputs are read from the original layout, where `linear1_kv` is one tensor). Its
# fp8 set is derived twice and the two must agree:
# 1. the nn.Linear modules of diffusers' WanAnimateTransformer3DModel (0.42.1), mapped to
#    original names by value, `face_adapter.N.to_k`/`to_v` by the halves of `linear1_kv`
#    (MotionLinear is not an nn.Linear, FACTS.md §5);
# 2. ComfyUI's loader: fp8-scaled only applies to layers made with comfy ops, and
#    comfyanonymous/ComfyUI@4cdaa373:comfy/ldm/wan/model_animate.py builds with
#    `operations.Linear` exactly FaceEncoder.out_proj and FaceBlock.linear1_kv / linear1_q /
#    linear2 (plus the WanModel trunk's Linears); the motion encoder's EqualLinear /
#    EqualConv2d / Direction are plain torch.nn.Modules with their own Parameters, the face
#    encoder's convs are operations.Conv1d and pose_patch_embedding operations.Conv3d (not
#    Linear, kept high precision like the trunk's patch_embedding).
ANIMATE_COMFY_LINEAR = ("face_encoder.out_proj.weight",)
ANIMATE_COMFY_ADAPTER_LINEAR = ("linear1_kv.weight", "linear1_q.weight", "linear2.weight")


def animate_linear_weights(folder: Path, original: Path) -> list[str]:
    import diffusers
    model = diffusers.WanAnimateTransformer3DModel.from_pretrained(folder, torch_dtype=torch.float32)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    orig = load_file(str(original))
    by_bytes = {v.tobytes(): k for k, v in orig.items() if not k.endswith(".kernel")}
    out = set()
    for n in linear:
        if n in sd and sd[n].tobytes() in by_bytes:
            out.add(by_bytes[sd[n].tobytes()])
            continue
        parts = n.split(".")  # face_adapter.N.to_k.weight / to_v.weight: halves of linear1_kv
        assert parts[0] == "face_adapter" and parts[2] in ("to_k", "to_v"), n
        kv = f"face_adapter.fuser_blocks.{parts[1]}.linear1_kv.weight"
        half = np.split(orig[kv], 2, axis=0)[0 if parts[2] == "to_k" else 1]
        assert np.array_equal(half, sd[n]), n
        out.add(kv)
    comfy = {n for n, v in orig.items() if is_fp8_linear(n, v)} | set(ANIMATE_COMFY_LINEAR) | {
        n for n in orig if n.startswith("face_adapter.fuser_blocks.")
        and n.split(".", 3)[3] in ANIMATE_COMFY_ADAPTER_LINEAR}
    assert out == comfy, f"diffusers nn.Linear set vs ComfyUI ops set: {sorted(out ^ comfy)}"
    return sorted(out)


def gguf_digest(path: Path) -> dict:
    import hashlib
    r = gguf.GGUFReader(str(path))
    b = path.read_bytes()
    return {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest(), "tensors": {
        t.name: {"type": t.tensor_type.name, "ne": [int(x) for x in t.shape],
                 "sha256": hashlib.sha256(np.asarray(t.data).view(np.uint8).tobytes()).hexdigest()}
        for t in r.tensors}}


def variant_gguf(sd: dict, fmt: str, path: Path) -> dict:
    w = gguf.GGUFWriter(str(path), arch="wan")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(FILE_TYPE[fmt])
    for name in sorted(sd):
        arr = sd[name].astype(np.float32)
        t, _ = city96_type(name, arr, fmt)
        data = quantize(arr, t)
        w.add_tensor(name, data, raw_shape=data.shape if t in (T.F32, T.F16) else None, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf_digest(path)


def variant_fp8(sd: dict, linear: list[str]) -> dict:
    import hashlib
    out = {"scaled_fp8": {"dtype": "F8_E4M3", "shape": [0], "sha256": hashlib.sha256(b"").hexdigest()}}
    for name in sorted(sd):
        arr = sd[name].astype(np.float32)
        if name in linear:
            codes, scale = fp8_scaled(arr)
            out[name] = {"dtype": "F8_E4M3", "shape": list(arr.shape),
                         "sha256": hashlib.sha256(codes.tobytes()).hexdigest()}
            out[name[: -len(".weight")] + ".scale_weight"] = {
                "dtype": "F32", "shape": [], "sha256": hashlib.sha256(scale.tobytes()).hexdigest()}
        else:
            f16 = torch.from_numpy(arr).to(torch.float16).numpy()
            out[name] = {"dtype": "F16", "shape": list(arr.shape),
                         "sha256": hashlib.sha256(f16.tobytes()).hexdigest()}
    return out


def variants() -> None:
    import tempfile
    import diffusers
    # the derivation agrees with the hand list on the plain T2V
    t2v = linear_weights("WanTransformer3DModel", ROOT / "models" / "t2v",
                         ROOT / "models" / "t2v_original.safetensors")
    orig = load_file(str(ROOT / "models" / "t2v_original.safetensors"))
    assert t2v == sorted(n for n, v in orig.items() if is_fp8_linear(n, v)), "Linear set vs is_fp8_linear"
    models = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (cls_name, folder, original) in VARIANT_MODELS.items():
            sd = load_file(str(VARIANTS / original))
            linear = linear_weights(cls_name, VARIANTS / folder, VARIANTS / original)
            cases = {"fp8-scaled": {"tensors": variant_fp8(sd, linear)}}
            for fmt in VARIANT_GGUF:
                cases[f"gguf:{fmt}"] = variant_gguf(sd, fmt, Path(tmp) / f"{name}_{fmt}.gguf")
            models[name] = {"input": f"golden/variants/{folder}", "source": f"golden/variants/{original}",
                            "linear_weights": linear, "cases": cases}
        original = "animate/models/animate_original.safetensors"
        sd = load_file(str(VARIANTS / original))
        linear = animate_linear_weights(VARIANTS / "animate/models/animate", VARIANTS / original)
        cases = {"fp8-scaled": {"tensors": variant_fp8(sd, linear)}}
        for fmt in VARIANT_GGUF:
            cases[f"gguf:{fmt}"] = variant_gguf(sd, fmt, Path(tmp) / f"animate_{fmt}.gguf")
        models["animate"] = {"input": f"golden/variants/{original}", "source": f"golden/variants/{original}",
                             "linear_weights": linear, "cases": cases}
    meta = {"generator": "golden/quant_golden.py variants",
            "versions": {"torch": torch.__version__, "gguf": "0.19.0", "numpy": np.__version__,
                         "diffusers": diffusers.__version__},
            "fp8_rule": "every nn.Linear weight of the diffusers model (named_modules; for animate "
                        "also equal to ComfyUI's operations.Linear set) -> F8_E4M3 "
                        "codes of W / (amax/448) (torch cast) + F32 scale_weight; everything else F16; "
                        "plus the empty scaled_fp8 marker",
            "gguf_rule": "city96_type (convert.py + llama-quantize patch + fix_5d_tensors.py, spec "
                         "quant_formats.md), gguf-py quantize, GGUFWriter arch wan, sorted names",
            "models": models}
    out = VARIANTS / "quant"
    out.mkdir(exist_ok=True)
    (out / "quant_variants.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    for name, m in models.items():
        print(name, len(m["linear_weights"]), "Linear weights;",
              {k: v.get("sha256", "")[:12] for k, v in m["cases"].items()})


def main() -> None:
    import sys
    if sys.argv[1:] == ["variants"]:
        variants()
        return
    if len(sys.argv) == 4 and sys.argv[1] == "comfy-loader":
        comfy_loader(sys.argv[2], Path(sys.argv[3]))
        return
    OUT.mkdir(exist_ok=True)
    xs = cast_inputs()
    save_file({"x": xs, "codes": torch.from_numpy(xs).to(torch.float8_e4m3fn).view(torch.uint8).numpy()},
              str(OUT / "cast.safetensors"))
    save_file(expected(crafted(), fp8_all=False), str(OUT / "crafted.safetensors"))
    save_file(expected(model_tensors(), fp8_all=True), str(OUT / "t2v.safetensors"))
    write_gguf()
    for fmt in FILE_TYPE:
        expect_gguf(fmt, city96_rounding=False)
    expect_gguf("q8_0", city96_rounding=True)
    expect_gguf("q4_0", city96_rounding=True)
    expect_gguf("q8_0", city96_rounding=False, bf16_src=True)
    # I2V: k_img / v_img, img_emb.proj.{1,3} (fp8 Linear; never quantized in GGUF).
    expect_gguf("q4_0", city96_rounding=False, model="i2v")
    expect_fp8(model="i2v")
    expect_fp8()
    # merge-then-quantize reference: PEFT's f32 merge (golden/references), then the reference
    # quantizers; wanbake's own f32 merge may differ by ~1e-7 (spec §1.8 / §2.7 tolerances).
    for fmt in ("q8_0", "q4_0"):
        expect_gguf(fmt, city96_rounding=False, merged_case="peft_plain")
    expect_fp8(merged_case="peft_plain")
    for fmt in ("q8_0", "q4_0", "fp8_scaled"):
        dequantized(fmt)


if __name__ == "__main__":
    main()
