"""Quantized WAN checkpoints as a merge BASE: reference input files and what their runtimes decode
them to (golden/quant_base/, README.md there). Nothing here comes from wanbake.

Inputs, each made by the reference tool's own code (imported, not re-implemented):
- ComfyUI mixed precision (`comfy_*.safetensors`): comfy-kitchen 0.2.40's EAGER backend through
  ComfyUI's own layout classes (`comfy/quant_ops.py`, `QuantizedTensor.from_float`) and ComfyUI's
  own writer (`comfy/ops.py` `_quantized_weight_state_dict`, which emits `<L>.comfy_quant`);
- ComfyUI legacy scaled fp8 (`legacy_*.safetensors`): torch, `scale = amax / 448` (f32),
  `(W / scale).to(float8_e4m3fn)` (spec quant_formats.md 1.5);
- plain fp8 (`plain_*.safetensors`): torch's cast;
- LightX2V (`lightx2v_*.safetensors`): LightX2V's own `tools/convert/converter.py`, run on the CPU
  with only the package `__init__`s it does not need skipped (see `lightx2v_convert`);
- GGUF (`gguf_orig_shape.gguf`): gguf-py 0.19.0's GGUFWriter and `quants.quantize`.

The oracle: every input is decoded to f32 by its runtime's own code
- ComfyUI files: ComfyUI's `convert_old_quants` (comfy/utils.py) and `_load_quantized_module`
  (comfy/ops.py), run as they are (their source is read from a ComfyUI checkout at run time and
  executed with the real `comfy.quant_ops`), then `QuantizedTensor.dequantize()` with ComfyUI's
  compute dtype set to float32; every other tensor `.to(float32)`;
- LightX2V: `weight.to(f32) * weight_scale.to(f32)` (lightx2v/common/ops/mm/mm_weight.py);
- GGUF: gguf-py `quants.dequantize`, reshaped as city96/ComfyUI-GGUF's `loader.py` shapes it, and
  checked against ComfyUI-GGUF's own `dequantize_tensor(..., float32, "target")`.
Each decoding is ALSO recomputed by `rule_decode` below, a plain numpy transcription of the rules
written in golden/quant_base/README.md (what the Rust decoders implement), and must agree bit for
bit: the README's operation orders are checked, not just read off the source.

Sources (not vendored; see README "Regenerate"): $QB_SRC/ComfyUI (comfy/{quant_ops,ops,utils}.py),
$QB_SRC/LightX2V (tools/convert, lightx2v/utils, lightx2v_platform), $QB_SRC/ComfyUI-GGUF.

Two models (MODELS): `small` (dim 64) for every input but comfy_int8_convrot, which is made from
`convrot` (dim 256: ConvRot needs in_features % 256 == 0). The f32 sources are not committed;
`source DIR` writes them (bytes checked by index.json `source.<model>.sha256`).

Run: QB_SRC=/tmp/qb-src /tmp/qb-venv/bin/python golden/quant_base_golden.py [--full-expect DIR]
     [--source-dir DIR]
     /tmp/qb-venv/bin/python golden/quant_base_golden.py source DIR
     PYTHONPATH=<unpacked comfy-kitchen wheel> ... golden/quant_base_golden.py crosscheck
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from importlib.metadata import version
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "quant_base"
SRC = Path(os.environ.get("QB_SRC", "/tmp/qb-src"))
SEED = 20260829  # numpy.random.default_rng


@dataclass(frozen=True)
class Model:
    """A WAN 2.1 T2V DiT under the original Wan names. `heads` does not appear in any tensor
    shape (norm_q / norm_k are [dim]); it is recorded for the reader."""
    name: str
    dim: int
    heads: int
    ffn: int
    freq: int
    text: int
    cin: int
    cout: int
    layers: int


MODELS = {
    # every file except comfy_int8_convrot: block Linears in_features 64 (attention, ffn.0) and
    # 256 (ffn.2), all multiples of 32 (MXFP8 / Q8_0 block) and 16 (NVFP4 block)
    "small": Model("small", dim=64, heads=1, ffn=256, freq=16, text=16, cin=4, cout=4, layers=1),
    # comfy_int8_convrot: ConvRot needs in_features % 256 == 0 (attention 256, ffn.0 256, ffn.2 512)
    "convrot": Model("convrot", dim=256, heads=2, ffn=512, freq=16, text=16, cin=4, cout=4, layers=1),
}
GROUP = 256  # ConvRot group size
PREFIX = "model.diffusion_model."
BLOCK_LINEAR = re.compile(r"blocks\.\d+\.(?:(?:self|cross)_attn\.[qkvo]|ffn\.[02])\.weight")
SPECIAL = "blocks.0.ffn.2.weight"  # zero row, zero 32-block, an outlier, a tiny 16-block, e4m3 ties
# layers whose f32 values the expect files hold (every tensor has a digest in index.json)
SAMPLE = {"small": ("blocks.0.ffn.0.weight", SPECIAL),  # [256,64]: two 128-row scale tiles;
          #                                             [64,256]: padded scale rows, the specials
          "convrot": ("blocks.0.self_attn.q.weight",)}  # + its "|exact"
SAMPLE_GGUF = SAMPLE["small"] + ("patch_embedding.weight", "blocks.0.modulation")
# which model each input is made from
CONVROT_FILES = ("comfy_int8_convrot.safetensors",)


def model_of(fname: str) -> str:
    return "convrot" if fname in CONVROT_FILES else "small"


VERSIONS = {
    "ComfyUI": "Comfy-Org/ComfyUI master as mirrored by silveroxides/ComfyUI @ 4f874c5e "
               "(2026-07-29, 'Update comfy-kitchen to fix flux kv issue (#15144)')",
    "LightX2V": "ModelTC/LightX2V @ f8aee98b (2026-08-21)",
    "ComfyUI-GGUF": "city96/ComfyUI-GGUF @ 795e451 (2025-12-18)",
}


# ------------------------------------------------------------------------- the source model

def shapes(m: Model) -> dict[str, tuple[int, ...]]:
    """golden/kquant_wan_golden.py's tensor list (WAN 2.1 T2V, original names), sized by `m`."""
    D = m.dim
    s: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (D, m.cin, 1, 2, 2), "patch_embedding.bias": (D,),
        "text_embedding.0.weight": (D, m.text), "text_embedding.0.bias": (D,),
        "text_embedding.2.weight": (D, D), "text_embedding.2.bias": (D,),
        "time_embedding.0.weight": (D, m.freq), "time_embedding.0.bias": (D,),
        "time_embedding.2.weight": (D, D), "time_embedding.2.bias": (D,),
        "time_projection.1.weight": (6 * D, D), "time_projection.1.bias": (6 * D,),
        "head.head.weight": (m.cout * 4, D), "head.head.bias": (m.cout * 4,),
        "head.modulation": (1, 2, D),
    }
    for b in range(m.layers):
        p = f"blocks.{b}."
        for a in ("self_attn", "cross_attn"):
            for q in "qkvo":
                s[f"{p}{a}.{q}.weight"] = (D, D)
                s[f"{p}{a}.{q}.bias"] = (D,)
            s[f"{p}{a}.norm_q.weight"] = (D,)
            s[f"{p}{a}.norm_k.weight"] = (D,)
        s[f"{p}ffn.0.weight"] = (m.ffn, D)
        s[f"{p}ffn.0.bias"] = (m.ffn,)
        s[f"{p}ffn.2.weight"] = (D, m.ffn)
        s[f"{p}ffn.2.bias"] = (D,)
        s[f"{p}modulation"] = (1, 6, D)
        s[f"{p}norm3.weight"] = (D,)
        s[f"{p}norm3.bias"] = (D,)
    for k, v in s.items():  # the quantizers' block sizes (MXFP8 32; ConvRot 256)
        if BLOCK_LINEAR.fullmatch(k):
            assert v[1] % (GROUP if m.name == "convrot" else 32) == 0, (m.name, k, v)
    return s


SHAPES = {name: shapes(m) for name, m in MODELS.items()}


def source_model(model: str) -> dict[str, np.ndarray]:
    """One numpy PCG64 stream (default_rng(SEED)) per model, tensors in sorted name order, float32
    draws (`standard_normal(dtype=float32)`): matrices / conv N(0, 1/fan_in) (fan_in =
    prod(shape[1:])), 1-D norm weights 1 + 0.1 N, biases 0.05 N, modulations 0.1 N. Then, in
    blocks.0.ffn.2.weight ([dim, ffn]): row 7 zero, row 3 cols 32..63 zero (one MXFP8 / Q8_0 block
    = two NVFP4 blocks), [5, 100] = 2.5 (an outlier: ~10x the max), row 9 cols 0..15 times 1e-4 (a
    block whose NVFP4 block scale is an e4m3 subnormal), row 11: [11, 0] = 0.4375 (the row's max,
    so a per-row fp8 scale 0.4375/448 = 2^-10 makes W/scale = W * 1024 exact) and [11, 1..4] =
    +-1.0625 * 2^-10, +-2^-10 (W/scale = +-1.0625, +-0.0009765625 = +-2^-10: e4m3 ties, normal and
    subnormal; LightX2V's fp8 (qtorch) rounds them away from zero, torch's cast to even)."""
    shp = SHAPES[model]
    rng = np.random.default_rng(SEED)
    out = {}
    for name in sorted(shp):
        shape = shp[name]
        z = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith(".bias"):
            x = z * np.float32(0.05)
        elif "modulation" in name:
            x = z * np.float32(0.1)
        elif len(shape) == 1:
            x = np.float32(1.0) + z * np.float32(0.1)
        else:
            x = z * np.float32(1.0 / np.sqrt(np.prod(shape[1:])))
        out[name] = x.astype(np.float32)
    w = out[SPECIAL]
    w[7, :] = 0
    w[3, 32:64] = 0
    w[5, 100] = np.float32(2.5)
    w[9, 0:16] *= np.float32(1e-4)
    w[11, 0] = np.float32(0.4375)
    w[11, 1:5] = np.float32(2.0 ** -10) * np.array([1.0625, -1.0625, 2.0 ** -10, -2.0 ** -10],
                                                   np.float32)
    assert np.abs(w[11]).max() == np.float32(0.4375)
    return out


def bf16(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x).to(torch.bfloat16)


# ----------------------------------------------------------------- ComfyUI, from its own source

def eager_only() -> None:
    import comfy_kitchen as ck
    for b in ("cuda", "triton", "hip", "ascend"):
        ck.registry.disable(b)
    avail = [k for k, v in ck.list_backends().items() if v["available"] and not v["disabled"]]
    assert avail == ["eager"], avail


def comfy() -> types.SimpleNamespace:
    """Real comfy/quant_ops.py (with comfy.cli_args / comfy.float stubbed: only the Triton switch
    and stochastic rounding read them) plus ComfyUI's `_load_quantized_module`,
    `_quantized_weight_state_dict` (comfy/ops.py) and `convert_old_quants` (comfy/utils.py),
    executed from the checkout's source (their modules import the whole of ComfyUI)."""
    cdir = SRC / "ComfyUI" / "comfy"
    pkg = types.ModuleType("comfy")
    pkg.__path__ = [str(cdir)]
    cli = types.ModuleType("comfy.cli_args")
    cli.args = types.SimpleNamespace(enable_triton_backend=False, disable_triton_backend=False)
    flt = types.ModuleType("comfy.float")

    def _no_sr(*a, **k):
        raise RuntimeError("stub: stochastic rounding is not used here")
    flt.stochastic_rounding = _no_sr
    sys.modules.update({"comfy": pkg, "comfy.cli_args": cli, "comfy.float": flt})
    spec = importlib.util.spec_from_file_location("comfy.quant_ops", cdir / "quant_ops.py")
    qo = importlib.util.module_from_spec(spec)
    sys.modules["comfy.quant_ops"] = qo
    spec.loader.exec_module(qo)
    eager_only()
    ns = {"torch": torch, "json": json, "logging": logging, "QuantizedTensor": qo.QuantizedTensor,
          "QUANT_ALGOS": qo.QUANT_ALGOS, "get_layout_class": qo.get_layout_class}
    for fname, wanted in (("ops.py", {"_load_quantized_module", "_quantized_weight_state_dict"}),
                          ("utils.py", {"convert_old_quants"})):
        src = (cdir / fname).read_text()
        found = set()
        for node in ast.parse(src).body:
            if isinstance(node, ast.FunctionDef) and node.name in wanted:
                exec(compile(ast.get_source_segment(src, node), f"comfy/{fname}", "exec"), ns)
                found.add(node.name)
        assert found == wanted, (fname, found)
    return types.SimpleNamespace(qo=qo, **{k: ns[k] for k in (
        "_load_quantized_module", "_quantized_weight_state_dict", "convert_old_quants")})


# format key -> (comfy_quant format, ComfyUI layout, quantize kwargs)
COMFY = {
    "fp8": ("float8_e4m3fn", "TensorCoreFP8E4M3Layout", {"scale": "recalculate"}),
    "fp8_e5m2": ("float8_e5m2", "TensorCoreFP8E5M2Layout", {"scale": "recalculate"}),
    "nvfp4": ("nvfp4", "TensorCoreNVFP4Layout", {}),
    "mxfp8": ("mxfp8", "TensorCoreMXFP8Layout", {}),
    "int8": ("int8_tensorwise", "TensorWiseINT8Layout", {"is_weight": True, "per_channel": True}),
    "int8_scalar": ("int8_tensorwise", "TensorWiseINT8Layout",
                    {"is_weight": True, "per_channel": False}),
    "int8_convrot": ("int8_tensorwise", "TensorWiseINT8Layout",
                     {"is_weight": True, "per_channel": True, "convrot": True,
                      "convrot_groupsize": GROUP}),
}


def comfy_state_dict(c, src: dict, key: str) -> dict[str, torch.Tensor]:
    fmt, layout, kw = COMFY[key]
    sd: dict[str, torch.Tensor] = {}
    for name in sorted(src):
        if BLOCK_LINEAR.fullmatch(name):
            qt = c.qo.QuantizedTensor.from_float(torch.from_numpy(src[name].copy()), layout, **kw)
            mod = types.SimpleNamespace(weight=qt, bias=None, quant_format=fmt,
                                        _full_precision_mm_config=False)
            c._quantized_weight_state_dict(mod, sd, name[:-len("weight")],
                                           extra_quant_params=("input_scale", "pre_quant_scale"))
        else:
            sd[name] = bf16(src[name])
    return sd


# ------------------------------------------------------------------ legacy / plain (torch)

def legacy_state_dict(src: dict, variant: str) -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {}
    for name in sorted(src):
        w = torch.from_numpy(src[name].copy())
        if not BLOCK_LINEAR.fullmatch(name):
            sd[name] = w.to(torch.bfloat16)
            continue
        layer = name[:-len(".weight")]
        scale = w.abs().amax() / 448.0  # f32, 0-d
        if variant == "bf16_scale":
            stored = scale.to(torch.bfloat16).reshape(1)
            sd[name] = (w / stored.float()).to(torch.float8_e4m3fn)  # divided by the stored scale
        else:
            stored = scale
            sd[name] = (w / scale).to(torch.float8_e4m3fn)
            sd[f"{layer}.scale_input"] = torch.tensor(1.0, dtype=torch.float32)
        sd[f"{layer}.scale_weight"] = stored
    sd["scaled_fp8"] = (torch.zeros(2, dtype=torch.float8_e4m3fn) if variant == "2elem"
                        else torch.empty(0, dtype=torch.float8_e4m3fn))
    if variant == "prefixed":
        sd = {PREFIX + k: v for k, v in sd.items()}
    return sd


def plain_state_dict(src: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {n: (torch.from_numpy(src[n].copy()).to(dtype) if BLOCK_LINEAR.fullmatch(n)
                else bf16(src[n])) for n in sorted(src)}


# ---------------------------------------------------------------------------------- LightX2V

def lightx2v_convert(argv: list[str]) -> None:
    """Run LightX2V's tools/convert/converter.py as `__main__` with `argv`. Only the package
    `__init__`s are skipped: lightx2v/__init__.py imports the whole inference pipeline and
    lightx2v_platform/__init__.py probes the accelerator. The modules the converter uses
    (lightx2v.utils.registry_factory, lightx2v.utils.lora_loader, lightx2v_platform.
    registry_factory, tools/convert/quant) are the real files."""
    lx = SRC / "LightX2V"
    for name, sub in (("lightx2v", "lightx2v"), ("lightx2v.utils", "lightx2v/utils"),
                      ("lightx2v_platform", "lightx2v_platform")):
        m = types.ModuleType(name)
        m.__path__ = [str(lx / sub)]
        sys.modules[name] = m
    import runpy
    sys.argv = [str(lx / "tools/convert/converter.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")


def lightx2v_file(linear_type: str, source: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                   TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", "/tmp/qb-torch-ext"),
                   MAX_JOBS="1")
        subprocess.run([sys.executable, __file__, "lightx2v-convert", "-s", str(source), "-o", d,
                        "-o_n", out.stem, "--quantized", "--linear_type", linear_type,
                        "--model_type", "wan_dit", "--non_linear_dtype", "torch.bfloat16",
                        "--device", "cpu", "--single_file"], check=True, env=env)
        shutil.copyfile(Path(d) / f"{out.stem}.safetensors", out)


# -------------------------------------------------------------------------------------- GGUF

def gguf_file(src: dict, path: Path) -> None:
    """city96's per-tensor types (spec quant_formats.md 2.4, f32 source): F32 for 1-D, <= 1024
    elements and `.modulation` (3-D ne kept); Q8_0 for the block Linears; F16 for the other 2-D
    tensors (the names llama-quantize never quantizes). patch_embedding.weight (5-D) is stored
    reshaped as convert.py's `shape_fix` does, `(n // 256, 256)` (small model: (4, 256)) and
    stored F16 whatever its size (the threshold rule would say F32 for <= 1024 elements; forced
    here so that one F16 tensor carries an orig_shape), with
    `comfy.gguf.orig_shape.patch_embedding.weight` = its 5-D shape (INT32 array)."""
    import gguf
    from gguf.quants import quantize
    T = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(str(path), arch="wan")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for name in sorted(src):
        arr = src[name]
        if name == "patch_embedding.weight":
            w.add_array(f"comfy.gguf.orig_shape.{name}", [int(d) for d in arr.shape])
            data = arr.reshape(arr.size // 256, 256).astype(np.float16)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=T.F16)
        elif arr.ndim == 1 or arr.size <= 1024 or ".modulation" in name:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=T.F32)
        elif BLOCK_LINEAR.fullmatch(name):
            w.add_tensor(name, quantize(arr, T.Q8_0), raw_dtype=T.Q8_0)
        else:
            data = arr.astype(np.float16)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=T.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ------------------------------------------------------------------------- the runtimes' decode

def read_st(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})


class FakeLinear(types.SimpleNamespace):
    """What `_load_quantized_module` reads from MixedPrecisionOps.Linear, compute dtype f32."""

    def __init__(self, orig_shape):
        super().__init__(factory_kwargs={"device": torch.device("cpu"), "dtype": torch.float32},
                         _disabled_formats=[], _full_precision_mm=False, _orig_shape=orig_shape,
                         extra={})

    def register_parameter(self, name, p):  # input_scale / pre_quant_scale: not weights
        self.extra[name] = p


def comfy_load(c, path: Path, shp: dict, prefixed: bool = False) -> dict[str, torch.Tensor]:
    """ComfyUI's loading of a diffusion-model file (comfy/sd.py load_diffusion_model_state_dict:
    convert_old_quants(sd, ""), strip the unet prefix, convert_old_quants(sd, "") again), then
    every Linear with a comfy_quant through `_load_quantized_module` + `dequantize()`."""
    sd, meta = read_st(path)
    sd, meta = c.convert_old_quants(sd, "", metadata=meta)
    if prefixed:
        sd = {k[len(PREFIX):]: v for k, v in sd.items() if k.startswith(PREFIX)}
        sd, meta = c.convert_old_quants(sd, "", metadata=meta)
    out = {}
    for layer in sorted(k[:-len(".comfy_quant")] for k in list(sd) if k.endswith(".comfy_quant")):
        m = FakeLinear(shp[f"{layer}.weight"])
        missing: list[str] = []
        c._load_quantized_module(m, lambda *a: None, sd, f"{layer}.", {}, True, missing, [], [],
                                 load_extra_params=True)
        d = m.weight.dequantize()
        assert d.dtype == torch.float32 and tuple(d.shape) == shp[f"{layer}.weight"]
        out[f"{layer}.weight"] = d.contiguous()
    for k, v in sd.items():  # what is left: plain tensors (biases, norms, modulation, conv, ...)
        assert k in shp, f"{path.name}: unconsumed side tensor {k}"
        out[k] = v.to(torch.float32)
    assert set(out) == set(shp), set(shp) ^ set(out)
    return out


def lightx2v_load(path: Path, shp: dict) -> dict[str, torch.Tensor]:
    """LightX2V: MMWeightQuantTemplate reads `<L>.weight_scale` (mm_weight.py:439) and widens it
    to f32 (:484); its pure-torch path computes `weight.to(dtype) * weight_scale.to(dtype)`
    (fp8-intel-xpu, :2692), the int8/fp8 GEMM kernels apply the same [N,1] scale per output
    channel (`scale_b=weight_scale.t()`, :1988, :2043). Here dtype = f32."""
    sd, _ = read_st(path)
    out = {}
    for k, v in sd.items():
        if k.endswith(".weight_scale"):
            assert k[:-len("_scale")] in sd
            continue
        s = sd.get(f"{k}_scale")
        out[k] = v.to(torch.float32) * s.to(torch.float32) if s is not None else v.to(torch.float32)
    assert set(out) == set(shp), set(shp) ^ set(out)
    return out


def gguf_load(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """gguf-py's reader + dequantize, shaped as ComfyUI-GGUF's loader.py shapes it
    (`get_orig_shape`, else reversed ne)."""
    import gguf
    from gguf.quants import dequantize
    r = gguf.GGUFReader(str(path))
    out, info = {}, {}
    for t in r.tensors:
        f = r.get_field(f"comfy.gguf.orig_shape.{t.name}")
        shape = (tuple(int(f.parts[i][0]) for i in f.data) if f is not None
                 else tuple(int(v) for v in reversed(t.shape)))
        if f is not None:
            assert [gguf.GGUFValueType(x) for x in f.types] == [gguf.GGUFValueType.ARRAY,
                                                                 gguf.GGUFValueType.INT32]
        out[t.name] = np.ascontiguousarray(
            dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
        info[t.name] = {"type": t.tensor_type.name, "ne": [int(v) for v in t.shape],
                        "n_bytes": int(t.n_bytes), "loaded_shape": list(shape),
                        "orig_shape_metadata": f is not None}
    info["__kv__"] = {f.name: f.contents() for f in r.fields.values()
                      if not f.name.startswith("GGUF.")}
    return out, info


def comfy_gguf_check(path: Path, expect: dict[str, np.ndarray]) -> dict:
    """ComfyUI-GGUF's own loader + dequantize_tensor(..., float32, "target") must equal gguf-py."""
    sys.path.insert(0, str(ROOT))
    import quant_golden  # golden/quant_golden.py: the stubbed import of a ComfyUI-GGUF checkout
    loader, dequant = quant_golden.import_comfy_gguf(SRC / "ComfyUI-GGUF")
    sd, arch = loader.gguf_sd_loader(str(path), return_arch=True)
    for name, t in sd.items():
        got = dequant.dequantize_tensor(t, torch.float32, "target").contiguous().numpy()
        assert got.shape == expect[name].shape and np.array_equal(got, expect[name]), name
    for k in [k for k in sys.modules if k == "comfy" or k.startswith(("comfy.", "comfy_gguf"))]:
        del sys.modules[k]  # quant_golden's comfy stub must not leak into the ComfyUI imports
    return {"arch": arch, "tensors": len(sd)}


# --------------------------------------------- the README's rules, transcribed (must agree)

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def unswizzle(b: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of cuBLAS `to_blocked`: entry (r, c) of the logical [rows, cols] scale matrix is
    at flat index (r//128 * n_cb + c//4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4
    of the stored (128*ceil(rows/128), 4*ceil(cols/4)) array, n_cb = ceil(cols/4)."""
    n_cb = -(-cols // 4)
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    idx = (r // 128 * n_cb + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4
    return b.reshape(-1)[idx]


def f8(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float32).numpy()


def rule_decode(fmt: str, sd: dict[str, torch.Tensor], layer: str, shape: tuple[int, int],
                conf: dict | None = None):
    """One Linear of a ComfyUI / LightX2V file decoded with the README's rules, in numpy f32."""
    w = sd[f"{layer}.weight"]
    n, k = shape
    f32 = np.float32
    if fmt in ("float8_e4m3fn", "float8_e5m2", "legacy"):
        s = sd[f"{layer}.weight_scale" if fmt != "legacy" else f"{layer}.scale_weight"]
        return f8(w.view(torch.float8_e4m3fn if fmt != "float8_e5m2" else torch.float8_e5m2)) * \
            f32(s.to(torch.float32).reshape(()).item())
    if fmt == "int8_tensorwise" or fmt == "lightx2v":
        s = sd[f"{layer}.weight_scale"].to(torch.float32).numpy()
        x = f8(w) * (s.reshape(-1, 1) if s.size > 1 else f32(s.reshape(())))
        if conf and conf.get("convrot"):
            return None  # machine-dependent f32 matmul: see `exact_convrot`
        return x
    if fmt == "plain":
        return f8(w)
    if fmt == "nvfp4":
        q = w.numpy()
        codes = np.stack([q >> 4, q & 15], axis=-1).reshape(n, k)  # even index = high nibble
        bs = unswizzle(f8(sd[f"{layer}.weight_scale"].view(torch.float8_e4m3fn)), n, k // 16)
        s2 = f32(sd[f"{layer}.weight_scale_2"].to(torch.float32).reshape(()).item())
        total = (s2 * bs).astype(f32)  # per-tensor x block scale first, in f32
        return (E2M1[codes].reshape(n, k // 16, 16) * total[:, :, None]).reshape(n, k)
    if fmt == "mxfp8":
        e = unswizzle(sd[f"{layer}.weight_scale"].view(torch.uint8).numpy(), n, k // 32)
        scale = np.where(e == 0, f32(0), (e.astype(np.uint32) << 23).view(f32))
        return (f8(w.view(torch.float8_e4m3fn)).reshape(n, k // 32, 32) * scale[:, :, None]) \
            .reshape(n, k)
    raise ValueError(fmt)


def exact_convrot(q: torch.Tensor, s: torch.Tensor) -> np.ndarray:
    """The weight ComfyUI's int8 ConvRot forward effectively uses, un-rotated exactly:
    W[r, g*256 + j] = s[r] * sum_i q[r, g*256 + i] * H[j, i], H = the Kronecker power of
    H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]] over 16 (H symmetric and orthogonal, so
    H^T = H = H^-1); exact in f64 (integer sums / 16 times one f32), rounded once to f32."""
    h4 = np.array([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], np.float64)
    h = h4
    while h.shape[0] < GROUP:
        h = np.kron(h, h4)
    h /= np.sqrt(GROUP)
    assert np.array_equal(h, h.T) and np.array_equal(h @ h, np.eye(GROUP))
    qn = q.numpy().astype(np.float64)
    n, k = qn.shape
    rot = (qn.reshape(n, k // GROUP, GROUP) @ h.T).reshape(n, k)
    return (rot * s.to(torch.float32).numpy().astype(np.float64).reshape(-1, 1)).astype(np.float32)


# ------------------------------------------------------------------------------- bookkeeping

def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def f32_sha(x) -> str:
    x = x.numpy() if isinstance(x, torch.Tensor) else x
    return sha(np.ascontiguousarray(x, dtype="<f4").tobytes())


def st_header(path: Path) -> dict:
    b = path.read_bytes()
    n = int.from_bytes(b[:8], "little")
    return json.loads(b[8:8 + n])


def stored_info(path: Path) -> dict:
    h = st_header(path)
    meta = h.pop("__metadata__", None)
    b = path.read_bytes()
    base = 8 + int.from_bytes(b[:8], "little")
    t = {k: {"dtype": v["dtype"], "shape": v["shape"],
             "sha256": sha(b[base + v["data_offsets"][0]:base + v["data_offsets"][1]])}
         for k, v in sorted(h.items())}
    return {"metadata": meta, "tensors": t}


def save_st(sd: dict, path: Path, metadata: dict | None = None) -> None:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=metadata)


# -------------------------------------------------------------------------------------- main

def write_sources(d: Path) -> dict[str, Path]:
    """source_f32_<model>.safetensors (not committed: deterministic, index.json has their sha256)."""
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for m in MODELS:
        out[m] = d / f"source_f32_{m}.safetensors"
        save_st({k: torch.from_numpy(v) for k, v in source_model(m).items()}, out[m])
    return out


def logical_stored(fname: str, info: dict, shp: dict) -> dict[str, dict]:
    """For every tensor of the logical state dict: where and how the file stores it."""
    out = {}
    if fname.endswith(".gguf"):
        for name in shp:
            t = info[name]
            out[name] = {"key": name, "dtype": t["type"], "shape": t["ne"], "shape_is": "ne (reversed)",
                         "with": ([f"comfy.gguf.orig_shape.{name}"] if t["orig_shape_metadata"] else [])}
        return out
    st = info["tensors"]
    pre = PREFIX if fname == "legacy_prefixed.safetensors" else ""
    for name in shp:
        key = pre + name
        with_ = []
        if name.endswith(".weight"):
            lp = key[:-len("weight")]
            with_ = sorted(k for k in st if k.startswith(lp) and k not in (key, lp + "bias"))
            if BLOCK_LINEAR.fullmatch(name) and info["metadata"] and "_quantization_metadata" in info["metadata"]:
                with_.append("__metadata__._quantization_metadata")
        out[name] = {"key": key, "dtype": st[key]["dtype"], "shape": st[key]["shape"], "with": with_}
    return out


def neg_zeros(x: np.ndarray) -> int:
    return int((np.signbit(x) & (x == 0)).sum())


def main(full_expect: Path | None, source_dir: Path | None) -> None:
    import safetensors
    torch.set_num_threads(1)
    OUT.mkdir(exist_ok=True)
    (OUT / "bad").mkdir(exist_ok=True)
    for stale in OUT.glob("source_f32*.safetensors"):
        stale.unlink()
    c = comfy()
    srcs = {m: source_model(m) for m in MODELS}
    tmp = tempfile.TemporaryDirectory()
    src_files = write_sources(source_dir or Path(tmp.name))
    ck_ver = f"comfy-kitchen {version('comfy-kitchen')} eager backend"
    tv = f"torch {torch.__version__}"
    files: dict[str, dict] = {}

    # ---- ComfyUI mixed precision
    comfy_sd = {}
    for key in COMFY:
        comfy_sd[key] = comfy_state_dict(c, srcs[model_of(f"comfy_{key}.safetensors")], key)
    for key, sd in comfy_sd.items():
        fmt = COMFY[key][0]
        if key == "mxfp8":  # the brief's uint8 scales (comfy-quants' writer) ...
            u8 = {k: (v.view(torch.uint8) if k.endswith(".weight_scale") else v) for k, v in sd.items()}
            save_st(u8, OUT / "comfy_mxfp8.safetensors")
            files["comfy_mxfp8.safetensors"] = {"format": "comfy mixed mxfp8 (E8M0 scales stored U8)"}
            save_st(sd, OUT / "comfy_mxfp8_e8m0.safetensors")  # ... and ComfyUI's own F8_E8M0
            files["comfy_mxfp8_e8m0.safetensors"] = {"format": "comfy mixed mxfp8 (E8M0 scales stored F8_E8M0, as ComfyUI's writer)"}
            continue
        save_st(sd, OUT / f"comfy_{key}.safetensors")
        files[f"comfy_{key}.safetensors"] = {"format": f"comfy mixed {fmt}" + (" + convrot g256" if key == "int8_convrot" else "")}
    hdr = {k: v for k, v in comfy_sd["fp8"].items() if not k.endswith(".comfy_quant")}
    layers = {k[:-len(".weight")]: {"format": "float8_e4m3fn"} for k in sorted(srcs["small"]) if BLOCK_LINEAR.fullmatch(k)}
    save_st(hdr, OUT / "comfy_fp8_header.safetensors",
            {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})})
    files["comfy_fp8_header.safetensors"] = {"format": "comfy mixed float8_e4m3fn, _quantization_metadata header, no comfy_quant tensors"}
    for f in [f for f in files if f.startswith("comfy_")]:
        files[f]["tool"] = f"{ck_ver} via ComfyUI comfy/quant_ops.py + ops._quantized_weight_state_dict ({VERSIONS['ComfyUI']}); {tv}; safetensors {safetensors.__version__}"

    # ---- legacy, plain
    src = srcs["small"]
    for v, name in (("bf16_scale", "legacy_bf16_scale"), ("2elem", "legacy_fp8_2elem"),
                    ("prefixed", "legacy_prefixed")):
        save_st(legacy_state_dict(src, v), OUT / f"{name}.safetensors")
        files[f"{name}.safetensors"] = {"format": f"comfy legacy scaled fp8 ({v})",
                                        "tool": f"{tv}: scale = amax/448, (W/scale).to(float8_e4m3fn)"}
    for dt, name in ((torch.float8_e4m3fn, "plain_e4m3fn"), (torch.float8_e5m2, "plain_e5m2")):
        save_st(plain_state_dict(src, dt), OUT / f"{name}.safetensors")
        files[f"{name}.safetensors"] = {"format": f"plain {dt} (no scales)", "tool": f"{tv}: W.to({dt})"}

    # ---- LightX2V
    for lt in ("int8", "fp8"):
        lightx2v_file(lt, src_files["small"], OUT / f"lightx2v_{lt}.safetensors")
        files[f"lightx2v_{lt}.safetensors"] = {
            "format": f"LightX2V {lt} per-channel (w8a8 native, --model_type wan_dit)",
            "tool": f"{VERSIONS['LightX2V']} tools/convert/converter.py --quantized --linear_type {lt} "
                    f"--model_type wan_dit --non_linear_dtype torch.bfloat16 --device cpu --single_file "
                    f"(-s source_f32_small.safetensors); {tv}; qtorch {version('qtorch')}"}

    # ---- GGUF
    gguf_file(src, OUT / "gguf_orig_shape.gguf")
    files["gguf_orig_shape.gguf"] = {"format": "GGUF arch wan, Q8_0 block Linears, F16/F32 others, "
                                               "patch_embedding.weight reshaped + comfy.gguf.orig_shape",
                                     "tool": "gguf-py 0.19.0 GGUFWriter + quants.quantize"}

    # ---- decode every file with its runtime, and with the README's rules
    negz: dict[str, int] = {}
    for fname in sorted(files):
        path = OUT / fname
        info = files[fname]
        model = model_of(fname)
        shp = SHAPES[model]
        info["model"] = model
        info["bytes"] = path.stat().st_size
        info["sha256"] = sha(path.read_bytes())
        extra: dict[str, torch.Tensor] = {}
        conv: dict[str, dict] = {}
        if fname.endswith(".gguf"):
            dec, ginfo = gguf_load(path)
            info["stored"] = ginfo
            info["comfy_gguf_loader"] = comfy_gguf_check(path, dec)
            dec = {k: torch.from_numpy(v) for k, v in dec.items()}
            info["decoder"] = "gguf-py 0.19.0 quants.dequantize, reshaped to comfy.gguf.orig_shape / reversed ne; equal to ComfyUI-GGUF dequantize_tensor(float32, 'target')"
            sample = SAMPLE_GGUF
        else:
            info["stored"] = stored_info(path)
            sd, _ = read_st(path)
            if fname.startswith("lightx2v_"):
                dec = lightx2v_load(path, shp)
                info["decoder"] = "LightX2V: weight.to(f32) * weight_scale.to(f32) ([N,1] per row)"
                for layer in {k[:-len(".weight")] for k in dec if BLOCK_LINEAR.fullmatch(k)}:
                    ref = rule_decode("lightx2v", sd, layer, shp[f"{layer}.weight"])
                    assert np.array_equal(ref, dec[f"{layer}.weight"].numpy()), (fname, layer)
            else:
                prefixed = fname == "legacy_prefixed.safetensors"
                dec = comfy_load(c, path, shp, prefixed)
                info["decoder"] = ("ComfyUI convert_old_quants + _load_quantized_module + "
                                   "QuantizedTensor.dequantize() (compute dtype float32)")
                plain = {k[len(PREFIX):] if prefixed else k: v for k, v in sd.items()}
                conf_of = {}
                for k, v in plain.items():
                    if k.endswith(".comfy_quant"):
                        conf_of[k[:-len(".comfy_quant")]] = json.loads(bytes(v.tolist()))
                if fname == "comfy_fp8_header.safetensors":
                    conf_of = layers
                for name in sorted(shp):
                    if not BLOCK_LINEAR.fullmatch(name):
                        assert torch.equal(dec[name], plain[name].to(torch.float32)), name
                        continue
                    layer = name[:-len(".weight")]
                    if fname.startswith("plain_"):
                        fmt = "plain"
                    elif fname.startswith("legacy_"):
                        fmt = "legacy"
                    else:
                        fmt = conf_of[layer]["format"]
                    ref = rule_decode(fmt, plain, layer, shp[name], conf_of.get(layer))
                    if ref is None:  # convrot
                        ex = exact_convrot(plain[name], plain[f"{layer}.weight_scale"])
                        got = dec[name].numpy()
                        extra[f"{name}|exact"] = torch.from_numpy(ex)
                        d = np.abs(got.astype(np.float64) - ex)
                        srow = plain[f"{layer}.weight_scale"].numpy().astype(np.float64)
                        conv[name] = {
                            "exact_f32_sha256": f32_sha(ex),
                            "max_abs_diff_vs_exact": float(d.max()),
                            "max_diff_over_row_scale": float((d / srow).max()),
                            "n_differ_vs_exact": int((got != ex).sum()),
                            "max_abs_err_exact_vs_source": float(np.abs(ex - srcs[model][name]).max())}
                        continue
                    assert np.array_equal(ref, dec[name].numpy()), (fname, name)
            sample = SAMPLE[model]
        negz[fname] = sum(neg_zeros(v.numpy()) for k, v in dec.items() if BLOCK_LINEAR.fullmatch(k))
        where = logical_stored(fname, info["stored"], shp)
        exp = {"tensors": {}}
        for k, v in sorted(dec.items()):
            e = {"shape": list(v.shape), "f32_sha256": f32_sha(v), "stored": where[k]}
            e.update(conv.get(k, {}))
            exp["tensors"][k] = e
        keep = {k: dec[k] for k in sample}
        keep.update({k: extra[k] for k in extra if k.split("|")[0] in sample})
        save_st(keep, OUT / f"{fname}.expect.safetensors")
        exp["file"] = f"{fname}.expect.safetensors"
        exp["values_in_file"] = sorted(keep)
        info["expect"] = exp
        if full_expect is not None:
            full_expect.mkdir(parents=True, exist_ok=True)
            save_st({**dec, **extra}, full_expect / f"{fname}.expect.safetensors")
    # same decoded values: the files that share an oracle
    groups: dict[str, list[str]] = {}
    for fname, info in files.items():
        key = sha(json.dumps({k: v["f32_sha256"] for k, v in info["expect"]["tensors"].items()},
                             sort_keys=True).encode())
        groups.setdefault(key, []).append(fname)
    for fname, info in files.items():
        for g in groups.values():
            if fname in g and len(g) > 1:
                info["expect"]["same_decoding_as"] = sorted(x for x in g if x != fname)

    # ---- facts checked on these files (README "Observed")
    facts = observed_facts(srcs, comfy_sd)
    facts["negative_zeros_in_decoded_block_linears"] = negz
    cv = files["comfy_int8_convrot.safetensors"]["expect"]["tensors"]
    cvl = [v for v in cv.values() if "exact_f32_sha256" in v]
    facts["convrot_dequantize_vs_exact"] = {
        "layers": len(cvl), "values": sum(int(np.prod(v["shape"])) for v in cvl),
        "values_differing": sum(v["n_differ_vs_exact"] for v in cvl),
        "max_abs_diff": max(v["max_abs_diff_vs_exact"] for v in cvl),
        "max_diff_over_row_scale": max(v["max_diff_over_row_scale"] for v in cvl),
        "max_abs_err_exact_vs_source": max(v["max_abs_err_exact_vs_source"] for v in cvl)}

    # ---- malformed inputs
    bad = bad_files(c, srcs["small"])

    index = {
        "generator": "golden/quant_base_golden.py",
        "versions": {"torch": torch.__version__, "numpy": np.__version__,
                     "safetensors": safetensors.__version__,
                     **{p: version(p) for p in ("comfy-kitchen", "gguf", "qtorch", "loguru")},
                     **VERSIONS},
        "seed": SEED,
        "models": {m: {**{k: v for k, v in vars(MODELS[m]).items() if k != "name"},
                       "patch": [1, 2, 2], "files": sorted(f for f in files if model_of(f) == m)}
                   for m in MODELS},
        "source": {m: {"file": src_files[m].name, "committed": False,
                       "regenerate": "golden/quant_base_golden.py source DIR",
                       "bytes": src_files[m].stat().st_size, "sha256": sha(src_files[m].read_bytes()),
                       "tensors": {k: {"shape": list(v.shape), "f32_sha256": f32_sha(v)}
                                   for k, v in sorted(srcs[m].items())}}
                   for m in MODELS},
        "digest": "f32_sha256 / exact_f32_sha256: sha256 of the tensor's values as little-endian f32, C order",
        "files": files,
        "bad": bad,
        "observed": facts,
    }
    (OUT / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    tmp.cleanup()


def observed_facts(srcs: dict, comfy_sd: dict) -> dict:
    """Checks behind the README's statements (recorded, not asserted where the answer is data)."""
    src = srcs["small"]
    f: dict = {}
    fp8 = comfy_sd["fp8"]
    n_diff = 0
    n_tot = 0
    scale_diff = 0
    bf16_low = bf16_sat = 0
    for name in src:
        if not BLOCK_LINEAR.fullmatch(name):
            continue
        w = torch.from_numpy(src[name].copy())
        s = w.abs().amax() / 448.0
        div = (w / s).to(torch.float8_e4m3fn).view(torch.uint8)
        ck_codes = fp8[name].view(torch.uint8)
        n_diff += int((div != ck_codes).sum())
        n_tot += div.numel()
        scale_diff += int(fp8[name[:-len("weight")] + "weight_scale"].item() != s.item())
        sb = s.to(torch.bfloat16).float()
        if sb.item() < s.item():
            bf16_low += 1
            bf16_sat += int(((w / sb).to(torch.float8_e4m3fn).float().abs() == 448).sum())
    f["fp8_reciprocal_multiply_vs_division"] = {"codes_differing": n_diff, "codes": n_tot,
                                                "scales_differing": scale_diff}
    f["legacy_bf16_scale_below_amax_over_448"] = {"layers": bf16_low, "saturated_codes_in_them": bf16_sat,
                                                  "layers_total": sum(1 for k in src if BLOCK_LINEAR.fullmatch(k))}
    n, k = src[SPECIAL].shape
    lp = SPECIAL[:-len("weight")]
    nv = comfy_sd["nvfp4"][lp + "weight_scale"]
    bs = unswizzle(nv.view(torch.float8_e4m3fn).to(torch.float32).numpy(), n, k // 16)
    f["nvfp4_special_layer_block_scales"] = {
        "row9_block0 (tiny block)": float(bs[9, 0]), "row7 (zero row)": [float(x) for x in bs[7, :4]],
        "row3_blocks2_3 (zero block)": [float(bs[3, 2]), float(bs[3, 3])],
        "stored_scale_shape": list(nv.shape)}
    raw = nv.view(torch.uint8).numpy().reshape(-1)
    used = np.zeros(raw.size, bool)
    used[unswizzle(np.arange(raw.size), n, k // 16).reshape(-1)] = True
    f["nvfp4_special_layer_block_scales"]["padding_all_zero"] = bool((raw[~used] == 0).all())
    f["nvfp4_special_layer_block_scales"]["padding_bytes"] = int((~used).sum())
    mx = comfy_sd["mxfp8"][lp + "weight_scale"].view(torch.uint8).numpy()
    e = unswizzle(mx, n, k // 32)
    used = np.zeros(mx.size, bool)
    used[unswizzle(np.arange(mx.size), n, k // 32).reshape(-1)] = True
    f["mxfp8_special_layer_scale_bytes"] = {"row7 (zero row)": [int(x) for x in e[7, :4]],
                                            "row3_block1 (zero block)": int(e[3, 1]),
                                            "stored_scale_shape": list(mx.shape),
                                            "padding_bytes": int((~used).sum()),
                                            "padding_all_zero": bool((mx.reshape(-1)[~used] == 0).all())}
    # the swizzled scale arrays' padding (rows to 128, block columns to 4), every layer
    pad = {}
    for key, blk in (("nvfp4", 16), ("mxfp8", 32)):
        nbytes, allzero = 0, True
        for name in sorted(src):
            if BLOCK_LINEAR.fullmatch(name):
                raw = comfy_sd[key][name[:-len("weight")] + "weight_scale"].view(torch.uint8).numpy().reshape(-1)
                used = np.zeros(raw.size, bool)
                used[unswizzle(np.arange(raw.size), *src[name].shape[:1], src[name].shape[1] // blk).reshape(-1)] = True
                nbytes += int((~used).sum())
                allzero &= bool((raw[~used] == 0).all())
        pad[key] = {"padding_bytes_all_layers": nbytes, "padding_all_zero": allzero}
    f["swizzled_scale_padding"] = pad
    i8 = comfy_sd["int8"][lp + "weight_scale"]
    f["int8_zero_row_scale"] = {"comfy-kitchen": float(i8[7, 0])}
    lx, _ = read_st(OUT / "lightx2v_int8.safetensors")
    f["int8_zero_row_scale"]["lightx2v"] = float(lx[SPECIAL + "_scale"][7, 0])
    ci8 = comfy_sd["int8"]
    f["int8_comfy_vs_lightx2v"] = {
        "codes_differing": sum(int((ci8[k] != lx[k]).sum()) for k in lx if BLOCK_LINEAR.fullmatch(k)),
        "scales_differing": sum(int((ci8[k + "_scale"] != lx[k + "_scale"]).sum())
                                for k in lx if BLOCK_LINEAR.fullmatch(k))}
    # LightX2V fp8: qtorch float_quantize(..., 4, 3, "nearest") then .to(e4m3fn), against
    # torch's RNE cast of the same clipped quotient
    lf, _ = read_st(OUT / "lightx2v_fp8.safetensors")
    diff = tot = 0
    where = []
    for k in sorted(lf):
        if BLOCK_LINEAR.fullmatch(k):
            w = torch.from_numpy(src[k].copy())
            s = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-5) / 448.0
            assert torch.equal(s, lf[k + "_scale"])
            quo = torch.clip(w / s, -448, 448)
            rne = quo.to(torch.float8_e4m3fn).view(torch.uint8)
            got = lf[k].view(torch.uint8)
            diff += int((rne != got).sum())
            tot += rne.numel()
            for r, col in (rne != got).nonzero().tolist():
                where.append({"tensor": k, "row": r, "col": col, "w_over_scale": float(quo[r, col]),
                              "torch_rne": float(rne.view(torch.float8_e4m3fn)[r, col].float()),
                              "lightx2v_qtorch": float(got.view(torch.float8_e4m3fn)[r, col].float())})
    f["lightx2v_fp8_qtorch_vs_torch_rne"] = {"codes_differing": diff, "codes": tot, "where": where}
    return f


def bad_files(c, src: dict) -> dict:
    """Tiny malformed ComfyUI files and what ComfyUI itself says about them (small model)."""
    L = "blocks.0.self_attn.q"
    w = torch.from_numpy(src[f"{L}.weight"].copy())
    n, k = w.shape
    b = bf16(src[f"{L}.bias"])
    qo = c.qo

    def conf(d):
        return torch.tensor(list(json.dumps(d).encode("utf-8")), dtype=torch.uint8)

    def qsd(layout, fmt, **kw):
        qt = qo.QuantizedTensor.from_float(w.clone(), layout, **kw)
        sd = {f"{L}.bias": b}
        c._quantized_weight_state_dict(types.SimpleNamespace(weight=qt, bias=None, quant_format=fmt,
                                                             _full_precision_mm_config=False),
                                       sd, f"{L}.", extra_quant_params=())
        return sd

    cases = {}
    sd = qsd("TensorCoreFP8E4M3Layout", "float8_e4m3fn", scale="recalculate")
    sd[f"{L}.comfy_quant"] = conf({"format": "float4_foo"})
    cases["unknown_format.safetensors"] = (sd, "comfy_quant format 'float4_foo' is not a known format")
    sd = qsd("TensorCoreNVFP4Layout", "nvfp4")
    del sd[f"{L}.weight_scale_2"]
    cases["missing_scale.safetensors"] = (sd, "nvfp4 layer without weight_scale_2 (per-tensor scale)")
    sd = qsd("TensorWiseINT8Layout", "int8_tensorwise", is_weight=True, per_channel=True)
    sd[f"{L}.weight_scale"] = torch.cat([sd[f"{L}.weight_scale"], torch.ones(1, 1)])
    cases["wrong_scale_shape.safetensors"] = (sd, f"int8_tensorwise scale of shape [{n + 1},1] for a [{n},{k}] weight "
                                                  "(must be a scalar, [1] or [N,1])")
    sd = qsd("TensorCoreNVFP4Layout", "nvfp4")
    sd[f"{L}.weight"] = sd[f"{L}.weight"][:, :-1].contiguous()
    cases["packed_wrong_size.safetensors"] = (sd, f"nvfp4 packed weight [{n},{k // 2 - 1}] where [{n},{k // 2}] (= [N, K/2]) is needed")
    out = {}
    for fname, (sd, why) in cases.items():
        path = OUT / "bad" / fname
        save_st(sd, path)
        rec = {"problem": why, "model": "small", "bytes": path.stat().st_size,
               "sha256": sha(path.read_bytes()), "stored": stored_info(path)}
        try:
            d = comfy_load_partial(c, path)
            rec["comfyui"] = f"loads and dequantizes without error to shape {list(d.shape)}"
        except Exception as e:  # noqa: BLE001 - the record is the point
            rec["comfyui"] = f"{type(e).__name__}: {e}"
        out[fname] = rec
    return out


def comfy_load_partial(c, path: Path) -> torch.Tensor:
    sd, meta = read_st(path)
    sd, meta = c.convert_old_quants(sd, "", metadata=meta)
    layer = "blocks.0.self_attn.q"
    m = FakeLinear(SHAPES["small"][f"{layer}.weight"])
    c._load_quantized_module(m, lambda *a: None, sd, f"{layer}.", {}, True, [], [], [],
                             load_extra_params=True)
    return m.weight.dequantize()


def crosscheck() -> None:
    """Re-quantize and re-decode with whatever comfy-kitchen is importable (e.g. PYTHONPATH=an
    unpacked older wheel) and compare with the committed comfy_* files and their digests."""
    torch.set_num_threads(1)
    import comfy_kitchen
    c = comfy()
    index = json.loads((OUT / "index.json").read_text())
    report = {}
    for key in COMFY:
        fname = "comfy_mxfp8_e8m0.safetensors" if key == "mxfp8" else f"comfy_{key}.safetensors"
        model = model_of(f"comfy_{key}.safetensors")
        sd = comfy_state_dict(c, source_model(model), key)
        ref, _ = read_st(OUT / fname)

        def raw(t):
            return t.view(torch.uint8) if t.is_floating_point() and t.element_size() == 1 else t
        bad = sorted(k for k in ref if not torch.equal(raw(ref[k]), raw(sd[k])))
        dec = comfy_load(c, OUT / fname, SHAPES[model])
        exp = index["files"][fname]["expect"]["tensors"]
        dbad = sorted(k for k, v in dec.items() if f32_sha(v) != exp[k]["f32_sha256"])
        report[fname] = {"stored_tensors_differing": bad, "decoded_tensors_differing": dbad}
    print(json.dumps({"comfy_kitchen": str(Path(comfy_kitchen.__file__).parent), "report": report}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "crosscheck":
        crosscheck()
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "lightx2v-convert":
        lightx2v_convert(sys.argv[2:])
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "source":
        # the uncommitted f32 sources: `golden/quant_base_golden.py source DIR` (numpy, torch,
        # safetensors only); index.json `source.<model>.sha256` checks them
        for m, p in write_sources(Path(sys.argv[2])).items():
            print(p, sha(p.read_bytes()))
        sys.exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("--full-expect", type=Path, default=None,
                    help="also write complete expect files (every tensor, f32) into this folder")
    ap.add_argument("--source-dir", type=Path, default=None,
                    help="keep the f32 sources (source_f32_<model>.safetensors) in this folder")
    a = ap.parse_args()
    main(a.full_expect, a.source_dir)
