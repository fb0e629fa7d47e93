"""K-quant GGUF files of a small WAN, as city96's pipeline makes them, from ggml itself: what
`wanbake convert MODEL --to gguf:<k-mix>` must write (tests/kquant.rs,
`convert_to_k_mixes_is_byte_identical_to_ggml_and_city96s_rules`).

The model: a WAN 2.1 T2V transformer under original-Wan names (dim 256 = 2 heads x 128, ffn
512, freq 256, text 256, in/out 4, 3 blocks; every Linear row a whole number of 256-blocks),
its f32 values drawn from SplitMix64 (seed 0x5EED_0030, one stream over the tensors in sorted
name order, `(next >> 40) / 2^23 - 1`, times 1/8) exactly as wanbake's `rng::SplitMix64::
signed_f32` draws them, so the Rust test rebuilds the same file without it being committed.

The oracle, re-implemented here from its sources and not from wanbake's code:
- the per-tensor types: city96/ComfyUI-GGUF `tools/convert.py` (step 1: F16, F32 for 1-D,
  <= 1024 elements and `.modulation`; 5-D set aside and re-added as F32 by
  `fix_5d_tensors.py`) and `tools/lcpp.patch`'s `img_tensor_get_type` (the never-quantized Wan
  names, 2-D weights only, the v / fused-qkv / ffn-down rules of each ftype with "the first N"
  v projections counted in byte-wise name order, K types on rows that are not whole 256-blocks
  -> F16), spec quant_formats.md K.2;
- the block bytes: `ggml_quantize_chunk` (no imatrix) of llama-cpp-python 0.3.36's
  libggml-base, through golden/kquant_golden.py's `Ggml` (same venv and pins);
- the container: gguf-py 0.19's GGUFWriter (arch "wan", quantization version 2,
  general.file_type = llama.cpp's ftype), tensors in sorted name order, as
  golden/quant_golden.py writes the Q8_0/Q4_0 goldens.

Variants: every K mix from the f32 weights; q4_k_m and q3_k_m also with `--city96-rounding`
(the F16 rounding of each F16 step-1 weight is what is quantized) and with `--dtype f32`
(convert.py's step 1 at F32, as city96's published Wan 2.1 files hold their unquantized 2-D
tensors: their sizes say so). The files are not committed (a few MB each): golden/quant/
kquant_wan.json records each one's sha256 and size and every tensor's type and data sha256.

Run: python3 golden/kquant_wan_golden.py, after golden/kquant_golden.py has built its venv
($KQUANT_VENV, default /tmp/wanbake-kquant-venv).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kquant_golden as kq  # noqa: E402  (the venv, the pins and the ggml oracle)

OUT = kq.OUT
SEED = 0x5EED_0030
DIM, FFN, FREQ, TEXT, CIN, COUT, LAYERS = 256, 512, 256, 256, 4, 4, 3
MASK = (1 << 64) - 1


def splitmix64(seed: int):
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def shapes() -> dict[str, tuple[int, ...]]:
    s: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (DIM, CIN, 1, 2, 2), "patch_embedding.bias": (DIM,),
        "text_embedding.0.weight": (DIM, TEXT), "text_embedding.0.bias": (DIM,),
        "text_embedding.2.weight": (DIM, DIM), "text_embedding.2.bias": (DIM,),
        "time_embedding.0.weight": (DIM, FREQ), "time_embedding.0.bias": (DIM,),
        "time_embedding.2.weight": (DIM, DIM), "time_embedding.2.bias": (DIM,),
        "time_projection.1.weight": (6 * DIM, DIM), "time_projection.1.bias": (6 * DIM,),
        "head.head.weight": (COUT * 4, DIM), "head.head.bias": (COUT * 4,),
        "head.modulation": (1, 2, DIM),
    }
    for b in range(LAYERS):
        p = f"blocks.{b}."
        for a in ("self_attn", "cross_attn"):
            for m in "qkvo":
                s[f"{p}{a}.{m}.weight"] = (DIM, DIM)
                s[f"{p}{a}.{m}.bias"] = (DIM,)
            s[f"{p}{a}.norm_q.weight"] = (DIM,)
            s[f"{p}{a}.norm_k.weight"] = (DIM,)
        s[f"{p}ffn.0.weight"] = (FFN, DIM)
        s[f"{p}ffn.0.bias"] = (FFN,)
        s[f"{p}ffn.2.weight"] = (DIM, FFN)
        s[f"{p}ffn.2.bias"] = (DIM,)
        s[f"{p}modulation"] = (1, 6, DIM)
        s[f"{p}norm3.weight"] = (DIM,)
        s[f"{p}norm3.bias"] = (DIM,)
    return s


def model() -> dict[str, "np.ndarray"]:
    rng = splitmix64(SEED)
    out = {}
    for name, shape in sorted(shapes().items()):
        n = int(np.prod(shape))
        u = np.fromiter((next(rng) >> 40 for _ in range(n)), dtype=np.uint64, count=n)
        x = (u.astype(np.float32) / np.float32(1 << 23) - np.float32(1.0)) * np.float32(0.125)
        out[name] = x.reshape(shape)
    return out


# ------------------------------------------------------------------ city96's rules (spec K.2)

NEVER = ["modulation.", "patch_embedding.", "text_embedding.", "time_projection.",
         "time_embedding.", "img_emb.", "head."]
V = ["attn_v.weight", ".to_v.weight", ".v.weight", ".attn.w1v.weight", ".attn.w2v.weight",
     "_attn.v_proj.weight"]
QKV = ["attn_qkv.weight", "attn.qkv.weight", "attention.qkv.weight"]
FFN_DOWN = ["ffn_down", ".ffn.2.weight", ".ff.net.2.weight", ".mlp.layer2.weight",
            ".adaln_modulation_mlp.2.weight", ".feed_forward.w2.weight"]
FTYPE = {"q2_k": 10, "q3_k_s": 11, "q3_k_m": 12, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16,
         "q5_k_m": 17, "q6_k": 18}
DEFAULT = {"q2_k": "q2_k", "q3_k_s": "q3_k", "q3_k_m": "q3_k", "q4_k_s": "q4_k",
           "q4_k_m": "q4_k", "q5_k_s": "q5_k", "q5_k_m": "q5_k", "q6_k": "q6_k"}


class Mix:
    """llama-quantize's `img_tensor_get_type` with its `qs.i_attention_wv` counter."""

    def __init__(self, fmt: str) -> None:
        self.fmt, self.i_attention_wv = fmt, 0

    def type_of(self, name: str) -> str:
        f, t = self.fmt, DEFAULT[self.fmt]
        if any(p in name for p in V):
            if f == "q2_k":
                t = "q3_k"
            elif f == "q3_k_m":
                t = "q5_k" if self.i_attention_wv < 2 else "q4_k"
            elif f in ("q4_k_m", "q5_k_m"):
                t = "q6_k"
            elif f == "q4_k_s" and self.i_attention_wv < 4:
                t = "q5_k"
            self.i_attention_wv += 1
        elif any(p in name for p in QKV):
            t = {"q3_k_m": "q4_k", "q4_k_m": "q5_k", "q5_k_m": "q6_k"}.get(f, t)
        elif any(p in name for p in FFN_DOWN) or ("experts." in name and ".w2.weight" in name):
            t = {"q3_k_m": "q4_k", "q4_k_s": "q5_k", "q4_k_m": "q6_k", "q5_k_m": "q6_k"}.get(f, t)
        return t


def step1_type(name: str, arr: "np.ndarray", hp: str) -> str:
    """convert.py's type (fix_5d_tensors.py's F32 for the 5-D one); `hp` is the type of the
    other 2-D tensors (f16, or f32 for city96's published files)."""
    if arr.ndim > 4 or arr.ndim == 1 or arr.size <= 1024 or ".modulation" in name:
        return "f32"
    return hp


def expect(g: "kq.Ggml", sd: dict, fmt: str, city96_rounding: bool, hp: str) -> dict:
    import gguf
    from gguf import GGMLQuantizationType as T
    ggml_t = {"f32": T.F32, "f16": T.F16, "q2_k": T.Q2_K, "q3_k": T.Q3_K, "q4_k": T.Q4_K,
              "q5_k": T.Q5_K, "q6_k": T.Q6_K}
    mix = Mix(fmt)
    tensors = {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "expect.gguf"
        w = gguf.GGUFWriter(str(path), arch="wan")
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_file_type(FTYPE[fmt])
        for name in sorted(sd):  # byte-wise order: llama-quantize's visiting order too
            arr = sd[name]
            s1 = step1_type(name, arr, hp)
            t = s1
            quantizable = (name.endswith("weight") and arr.ndim == 2
                           and not any(p in name for p in NEVER))
            if quantizable:
                t = mix.type_of(name)
                if arr.shape[-1] % kq.QK_K != 0:
                    t = "f16"
            if t in ("f32", "f16"):
                data = arr.astype(np.float32 if t == "f32" else np.float16)
            else:
                src = arr
                if city96_rounding and s1 == "f16":
                    src = arr.astype(np.float16).astype(np.float32)  # what llama-quantize reads
                data = g.quantize(t, src.reshape(arr.shape[0], -1))
            w.add_tensor(name, data, raw_shape=data.shape if t in ("f32", "f16") else None,
                         raw_dtype=ggml_t[t])
            tensors[name] = {"type": t.upper(), "sha256": hashlib.sha256(data.tobytes()).hexdigest()}
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        b = path.read_bytes()
        # The second check: gguf-py reads the file back and dequantizes every tensor.
        for name, f32 in gguf_py_dequantized(path).items():
            tensors[name]["f32_sha256"] = sha256_f32(f32)
    return {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest(), "tensors": tensors}


def sha256_f32(x: "np.ndarray") -> str:
    """sha256 of the values as little-endian f32, C order."""
    return hashlib.sha256(np.ascontiguousarray(x, dtype="<f4").tobytes()).hexdigest()


def gguf_py_dequantized(path: Path) -> dict:
    """Every tensor of a GGUF file as gguf-py 0.19's `GGUFReader` + `quants.dequantize` give it."""
    import gguf
    from gguf.quants import dequantize
    return {t.name: dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(str(path)).tensors}


def main() -> None:
    g = kq.Ggml()
    sd = model()
    cases = {}
    for fmt in FTYPE:
        cases[f"gguf:{fmt}"] = expect(g, sd, fmt, False, "f16")
    for fmt in ("q4_k_m", "q3_k_m"):
        cases[f"gguf:{fmt} --city96-rounding"] = expect(g, sd, fmt, True, "f16")
        cases[f"gguf:{fmt} --dtype f32"] = expect(g, sd, fmt, False, "f32")
    first = {k: v for k, v in sorted(sd.items())[:1]}
    meta = {
        "model": {"dim": DIM, "ffn": FFN, "freq": FREQ, "text": TEXT, "in": CIN, "out": COUT,
                  "layers": LAYERS, "seed": SEED, "scale": 0.125,
                  "first_tensor": {k: [float(x) for x in v.ravel()[:4]] for k, v in first.items()}},
        "oracle": "types: convert.py + lcpp.patch re-implemented here; bytes: "
                  f"ggml_quantize_chunk of {kq.LLAMA_CPP_PYTHON}'s libggml-base; "
                  "container: gguf 0.19.0 GGUFWriter",
        "cases": cases,
    }
    path = OUT / "kquant_wan.json"
    path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    for k, v in cases.items():
        print(f"{k}: {v['bytes']} bytes {v['sha256'][:12]}")
    print(f"wrote {path}")


# ---- WAN variants (issue #31): small VACE and SkyReels-V2 models (`variants` mode) --------
#
#   python3 golden/kquant_wan_golden.py variants
#
# The small WAN above (dim 256, ffn 512, every Linear row whole 256-blocks) with the parameters
# only VACE or SkyReels-V2 have, under original names (golden/variants/vace/FACTS.md §1.1, §2):
# - `vace`: 4 main blocks and 2 VACE blocks (`vace_blocks.{0,1}`: a main block's tensors plus
#   `after_proj` (D,D) + bias, and `before_proj` on block 0), `vace_patch_embedding`
#   (D, 8, 1, 2, 2) + bias (5-D: F32 by fix_5d_tensors.py);
# - `skyreels`: 3 main blocks and `fps_embedding.weight` (2, D), `fps_projection.0` (D, D),
#   `fps_projection.2` (6D, D), each + bias.
# Values: SplitMix64 from SEED in sorted name order, as `model()` draws them. The same rules
# and oracle as `expect()` (city96's types, ggml's bytes, gguf-py's container); the VACE
# blocks' `self_attn.v` / `cross_attn.v` count among llama-quantize's v projections and their
# `ffn.2` is an ffn-down, by the same name rules as the main blocks'. The output,
# golden/variants/quant/kquant_variants.json, records each model's tensor list (so
# tests/variants.rs rebuilds it) and per case the file's sha256 and every tensor's type and
# data sha256.
VARIANT_MIXES = ("q2_k", "q3_k_m", "q4_k_m")
VARIANT_MODELS = ("vace", "skyreels", "fun-control", "fun-camera", "animate")


def variant_shapes(model: str) -> dict[str, tuple[int, ...]]:
    global LAYERS
    saved = LAYERS
    LAYERS = {"vace": 4, "animate": 5}.get(model, 3)
    try:
        s = shapes()
    finally:
        LAYERS = saved
    if model == "vace":
        main = {k: v for k, v in s.items() if k.startswith("blocks.0.")}
        for n in range(2):
            for k, v in main.items():
                s["vace_" + k.replace("blocks.0.", f"blocks.{n}.", 1)] = v
            s[f"vace_blocks.{n}.after_proj.weight"] = (DIM, DIM)
            s[f"vace_blocks.{n}.after_proj.bias"] = (DIM,)
        s["vace_blocks.0.before_proj.weight"] = (DIM, DIM)
        s["vace_blocks.0.before_proj.bias"] = (DIM,)
        s["vace_patch_embedding.weight"] = (DIM, 8, 1, 2, 2)
        s["vace_patch_embedding.bias"] = (DIM,)
    elif model == "fun-control":
        # Wan Fun V1.1 / 2.2 Control's reference-image conv: nn.Conv2d(in_dim_ref_conv=16, dim,
        # kernel 2, stride 2) (golden/variants/fun/FACTS.md, VideoX-Fun wan_transformer3d.py).
        s["ref_conv.weight"] = (DIM, 16, 2, 2)
        s["ref_conv.bias"] = (DIM,)
    elif model == "fun-camera":
        # Wan Fun Control-Camera's SimpleAdapter: conv (dim, 24*64, 2, 2) after an 8x pixel
        # unshuffle of the 24-channel camera embedding, one ResidualBlock of 3x3 convs (FACTS.md).
        s["control_adapter.conv.weight"] = (DIM, 24 * 64, 2, 2)
        s["control_adapter.conv.bias"] = (DIM,)
        for c in ("conv1", "conv2"):
            s[f"control_adapter.residual_blocks.0.{c}.weight"] = (DIM, DIM, 3, 3)
            s[f"control_adapter.residual_blocks.0.{c}.bias"] = (DIM,)
    elif model == "animate":
        animate_shapes(s)
    else:
        s["fps_embedding.weight"] = (2, DIM)
        s["fps_projection.0.weight"] = (DIM, DIM)
        s["fps_projection.0.bias"] = (DIM,)
        s["fps_projection.2.weight"] = (6 * DIM, DIM)
        s["fps_projection.2.bias"] = (6 * DIM,)
    return s


def animate_shapes(s: dict) -> None:
    """Wan2.2-Animate-14B in ComfyUI's (= the original) names at small size
    (golden/variants/animate/FACTS.md §2, §3, §6): the I2V trunk (CLIP branch, in_channels
    2*4+4), `pose_patch_embedding` (5-D), one face adapter (5 layers // 5) of 2 heads of 128
    with the fused `linear1_kv` (2D, D), a face encoder of hidden 256 x 2 heads (Conv1d, 3-D)
    whose `out_proj` is (D, 256), and the motion encoder of the animate fixture
    (models/animate_original.safetensors: channels 4 -> 5, 6, 4, ..., style 6, motion_dim 3,
    `dec.direction.weight` (7, 3)) with its 14 (4, 4) blur-kernel buffers."""
    s["patch_embedding.weight"] = (DIM, 12, 1, 2, 2)
    s["pose_patch_embedding.weight"] = (DIM, 4, 1, 2, 2)
    s["pose_patch_embedding.bias"] = (DIM,)
    s["img_emb.proj.0.weight"] = s["img_emb.proj.0.bias"] = (DIM,)
    s["img_emb.proj.1.weight"], s["img_emb.proj.1.bias"] = (DIM, DIM), (DIM,)
    s["img_emb.proj.3.weight"], s["img_emb.proj.3.bias"] = (DIM, DIM), (DIM,)
    s["img_emb.proj.4.weight"] = s["img_emb.proj.4.bias"] = (DIM,)
    for b in range(LAYERS):
        p = f"blocks.{b}.cross_attn."
        for m in ("k_img", "v_img"):
            s[f"{p}{m}.weight"], s[f"{p}{m}.bias"] = (DIM, DIM), (DIM,)
        s[f"{p}norm_k_img.weight"] = (DIM,)
    f = "face_adapter.fuser_blocks.0."
    s[f + "linear1_kv.weight"], s[f + "linear1_kv.bias"] = (2 * DIM, DIM), (2 * DIM,)
    for m in ("linear1_q", "linear2"):
        s[f"{f}{m}.weight"], s[f"{f}{m}.bias"] = (DIM, DIM), (DIM,)
    s[f + "q_norm.weight"] = s[f + "k_norm.weight"] = (128,)
    hidden, motion_enc = 256, 7
    for c, cout, cin in (("conv1_local", 2 * hidden, motion_enc), ("conv2", hidden, hidden),
                         ("conv3", hidden, hidden)):
        s[f"face_encoder.{c}.conv.weight"], s[f"face_encoder.{c}.conv.bias"] = (cout, cin, 3), (cout,)
    s["face_encoder.out_proj.weight"], s["face_encoder.out_proj.bias"] = (DIM, hidden), (DIM,)
    s["face_encoder.padding_tokens"] = (1, 1, 1, DIM)
    m = "motion_encoder."
    s[m + "dec.direction.weight"] = (motion_enc, 3)
    for j in range(5):
        s[f"{m}enc.fc.{j}.weight"] = (3 if j == 4 else 6, 6)
        s[f"{m}enc.fc.{j}.bias"] = (3 if j == 4 else 6,)
    c = m + "enc.net_app.convs."
    s[c + "0.0.weight"], s[c + "0.1.bias"] = (4, 3, 1, 1), (1, 4, 1, 1)
    sizes = [4, 5, 6, 4, 5, 6, 4, 5]
    for r in range(1, 8):
        i, o = sizes[r - 1], sizes[r]
        s[f"{c}{r}.conv1.0.weight"], s[f"{c}{r}.conv1.1.bias"] = (i, i, 3, 3), (1, i, 1, 1)
        s[f"{c}{r}.conv2.1.weight"], s[f"{c}{r}.conv2.2.bias"] = (o, i, 3, 3), (1, o, 1, 1)
        s[f"{c}{r}.skip.1.weight"] = (o, i, 1, 1)
        s[f"{c}{r}.conv2.0.kernel"] = s[f"{c}{r}.skip.0.kernel"] = (4, 4)
    s[c + "8.weight"] = (6, 5, 4, 4)


def variant_model(model: str) -> dict:
    rng = splitmix64(SEED)
    out = {}
    for name, shape in sorted(variant_shapes(model).items()):
        n = int(np.prod(shape))
        u = np.fromiter((next(rng) >> 40 for _ in range(n)), dtype=np.uint64, count=n)
        x = (u.astype(np.float32) / np.float32(1 << 23) - np.float32(1.0)) * np.float32(0.125)
        out[name] = x.reshape(shape)
    return out


def variants() -> None:
    g = kq.Ggml()
    models = {}
    for model in VARIANT_MODELS:
        sd = variant_model(model)
        cases = {f"gguf:{fmt}": expect(g, sd, fmt, False, "f16") for fmt in VARIANT_MIXES}
        first = sorted(sd.items())[0]
        models[model] = {
            "shapes": [[k, list(v.shape)] for k, v in sorted(sd.items())],
            "seed": SEED, "scale": 0.125,
            "first_tensor": {first[0]: [float(x) for x in first[1].ravel()[:4]]},
            "cases": cases}
        for k, v in cases.items():
            print(f"{model} {k}: {v['bytes']} bytes {v['sha256'][:12]}")
    meta = {"generator": "golden/kquant_wan_golden.py variants",
            "oracle": "types: convert.py + lcpp.patch re-implemented here; bytes: "
                      f"ggml_quantize_chunk of {kq.LLAMA_CPP_PYTHON}'s libggml-base; "
                      "container: gguf 0.19.0 GGUFWriter",
            "models": models}
    path = kq.ROOT / "variants" / "quant" / "kquant_variants.json"
    path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")


# ---- ComfyUI-GGUF's own loader on wanbake's K-quant files (`comfy-loader` mode) -----------
#
#   python golden/kquant_wan_golden.py comfy-loader target/release/wanbake /path/to/ComfyUI-GGUF
#
# Runs in a Python with torch, gguf 0.19.0 and safetensors (golden/quant_golden.py's
# comfy-loader environment; the checkout is city96/ComfyUI-GGUF @ 795e451, its ComfyUI imports
# stubbed by quant_golden.import_comfy_gguf). For one mix per K type it writes the small WAN,
# runs `wanbake convert --to gguf:<mix>`, loads the file with `loader.gguf_sd_loader` and
# dequantizes every tensor with `dequant.dequantize_tensor(t, float32, "target")` (what ComfyUI
# computes with at float32), and records each tensor's type, shape and f32 sha256, and whether
# gguf-py's dequantization of the same tensor has the same bits, in
# golden/quant/kquant_comfy_loader.json (tests/kquant.rs holds wanbake's dequantizer to it).
COMFY_MIXES = ("q2_k", "q3_k_s", "q4_k_s", "q5_k_s", "q6_k")  # Q2_K, Q3_K, Q4_K, Q5_K, Q6_K


def loaded_by_comfy(loader, dequant, path: Path, label: str) -> dict:
    """ComfyUI-GGUF's loader on one of wanbake's files: the file's sha256 and, per tensor, the
    loader's type and shape, the f32 sha256 of `dequantize_tensor(t, float32, "target")` and
    whether gguf-py's dequantization has the same bits."""
    import torch

    ref = gguf_py_dequantized(path)
    sd, arch = loader.gguf_sd_loader(str(path), return_arch=True)
    info = {"arch": arch, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tensors": {}}
    for name, t in sd.items():
        y = dequant.dequantize_tensor(t, torch.float32, "target").contiguous().numpy()
        want = np.ascontiguousarray(ref[name], dtype="<f4").reshape(y.shape)
        info["tensors"][name] = {
            "type": t.tensor_type.name, "shape": [int(d) for d in t.tensor_shape],
            "f32_sha256": sha256_f32(y), "same_as_gguf_py": bool(
                np.array_equal(y.view(np.uint32), want.view(np.uint32)))}
    kinds = sorted({v["type"] for v in info["tensors"].values()})
    same = all(v["same_as_gguf_py"] for v in info["tensors"].values())
    print(f"{label}: {len(sd)} tensors {kinds}, bit-equal to gguf-py: {same}")
    return info


def comfy_loader(wanbake: str, checkout: Path) -> None:
    import subprocess

    import torch
    from safetensors.numpy import save_file

    import quant_golden as qg  # its stubbed import of the checkout
    loader, dequant = qg.import_comfy_gguf(checkout)
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "small_wan.safetensors"
        save_file(model(), str(src))
        for mix in COMFY_MIXES:
            out = Path(tmp) / mix
            subprocess.run([wanbake, "-q", "convert", str(src), "--to", f"gguf:{mix}", "--out",
                            str(out)], check=True)
            files[f"gguf:{mix}"] = loaded_by_comfy(loader, dequant, out / f"model-{mix}.gguf", mix)
    meta = {"oracle": "city96/ComfyUI-GGUF @ 795e451 loader.gguf_sd_loader + "
                      "dequant.dequantize_tensor(float32, 'target'), torch "
                      f"{torch.__version__}; gguf 0.19.0 quants.dequantize",
            "files": files}
    path = OUT / "kquant_comfy_loader.json"
    path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")



# `comfy-loader-variants` mode: ComfyUI-GGUF's loader on wanbake's files of the small VACE,
# SkyReels-V2 and Fun (Control's ref_conv, Control-Camera's control_adapter) models above (`variant_model`), as `comfy_loader` does for the small WAN:
#
#   python golden/kquant_wan_golden.py comfy-loader-variants target/release/wanbake /path/to/ComfyUI-GGUF
#
# (same environment as `comfy-loader`). Writes golden/variants/quant/comfy_loader_variants.json.
COMFY_VARIANT_FORMATS = ("q8_0", "q4_k_m")


def comfy_loader_variants(wanbake: str, checkout: Path) -> None:
    import subprocess

    import torch
    from safetensors.numpy import save_file

    import quant_golden as qg
    loader, dequant = qg.import_comfy_gguf(checkout)
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in VARIANT_MODELS:
            src = Path(tmp) / f"{model}.safetensors"
            save_file(variant_model(model), str(src))
            for fmt in COMFY_VARIANT_FORMATS:
                out = Path(tmp) / f"{model}-{fmt}"
                subprocess.run([wanbake, "-q", "convert", str(src), "--to", f"gguf:{fmt}", "--out",
                                str(out)], check=True)
                files[f"{model} gguf:{fmt}"] = loaded_by_comfy(
                    loader, dequant, out / f"model-{fmt}.gguf", f"{model} {fmt}")
    meta = {"oracle": "city96/ComfyUI-GGUF @ 795e451 loader.gguf_sd_loader + "
                      "dequant.dequantize_tensor(float32, 'target'), torch "
                      f"{torch.__version__}; gguf 0.19.0 quants.dequantize",
            "inputs": "variant_model('vace' | 'skyreels' | 'fun-control' | 'fun-camera' | 'animate') of "
                      "golden/kquant_wan_golden.py "
                      "(golden/variants/quant/kquant_variants.json lists their tensors)",
            "files": files}
    path = kq.ROOT / "variants" / "quant" / "comfy_loader_variants.json"
    path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__" and sys.argv[1:2] == ["comfy-loader"]:
    import numpy as np
    comfy_loader(sys.argv[2], Path(sys.argv[3]))
elif __name__ == "__main__" and sys.argv[1:2] == ["comfy-loader-variants"]:
    import numpy as np
    comfy_loader_variants(sys.argv[2], Path(sys.argv[3]))
elif __name__ == "__main__":
    if not kq.in_venv():
        py = kq.VENV / "bin" / "python"
        if not py.exists():
            sys.exit(f"{py} is missing: run golden/kquant_golden.py first (it builds the venv)")
        import os
        os.execv(str(py), [str(py), __file__, *sys.argv[1:]])
    import numpy as np
    kq.np = np  # kquant_golden imports numpy inside its venv's main block
    if sys.argv[1:] == ["variants"]:
        variants()
    else:
        main()
