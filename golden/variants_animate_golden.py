#!/usr/bin/env python
"""Wan2.2-Animate-14B and Wan "Fun" fixtures for wanbake (issue #31), produced by the reference tools.

What this script writes (paths relative to the repository root):

- golden/variants/animate/models/animate/: a tiny f32 WanAnimateTransformer3DModel saved with
  diffusers' `save_pretrained`; models/animate_original.safetensors: the same weights under the
  ORIGINAL Wan2.2 names (wan/modules/animate), proved with the converter functions of diffusers'
  scripts/convert_wan_to_diffusers.py; models/animate_comfy.safetensors: the original names with
  the `model.diffusion_model.` prefix.
- golden/variants/animate/adapters/: one LoRA (rank 4, alpha 8) on Animate-only and main-block
  modules, written by PEFT's `save_pretrained` and, translated, in DiffSynth-Studio (`.default.`),
  original/ComfyUI and kohya spellings; golden/variants/animate/references/: PEFT
  merge_and_unload at strength 1 and 0.5, in diffusers and in original names.
- golden/variants/animate/shapes/animate_14b.json: every tensor of the real Wan2.2-Animate-14B
  config on torch's meta device, diffusers and original names.
- golden/variants/fun/shapes/<id>.json: the real structure of each released Wan Fun transformer.
- golden/variants/animate/manifest.json, golden/variants/fun/manifest.json: index and proofs.
- golden/variants/animate/nnx/ (subcommand `maxdiffusion SRC`, run in the MaxDiffusion venv):
  MaxDiffusion 7cfb8801's own NNX tree of the tiny model, unscanned and scanned.

Oracles: diffusers 0.42.1 / PEFT 0.21.2 (golden/requirements.txt), the converter functions of
huggingface/diffusers@58eb52c0:scripts/convert_wan_to_diffusers.py (imported from the git mirror,
not copied), and DiffSynth-Studio's checkpoint hashes (md5 over the sorted `key:shape` + `key`
strings of the released files, diffsynth/core/loader/file.py:hash_model_file), against which the
meta-device shape lists are checked. FACTS.md in each folder states the facts with sources.

Deterministic: fixed seeds, one CPU thread, canonical safetensors for files written here,
PYTHONHASHSEED=0 (the script re-executes itself). Run:

    /tmp/d42-venv/bin/python golden/variants_animate_golden.py
    /tmp/maxd-venv/bin/python golden/variants_animate_golden.py maxdiffusion SRC   # nnx/ only
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _reexec_with_fixed_hash_seed() -> None:
    """PEFT keeps target_modules in a set; its order in adapter_config.json follows str hashing."""
    if os.environ.get("PYTHONHASHSEED") == "0":
        return
    env = dict(os.environ, PYTHONHASHSEED="0")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    _reexec_with_fixed_hash_seed()

import diffusers  # noqa: E402
import torch  # noqa: E402
from diffusers import (  # noqa: E402
    FlowMatchEulerDiscreteScheduler,
    WanAnimatePipeline,
    WanAnimateTransformer3DModel,
    WanTransformer3DModel,
    WanVACETransformer3DModel,
)
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict  # noqa: E402

from wan_golden import (  # noqa: E402
    DIFFUSERS_TOOL,
    PEFT_TOOL,
    VERSIONS,
    Rng,
    _init_value,
    applied_state,
    canonicalize_tool_file,
    changed_tensors,
    check_against_applied,
    json_dump,
    lora_delta,
    lora_layers,
    randomize_lora,
    read_safetensors,
    rel,
    save_peft_adapter,
    to_original_key,
    write_safetensors,
)

VARIANTS = HERE / "variants"
ANIMATE = VARIANTS / "animate"
FUN = VARIANTS / "fun"
MODELS = ANIMATE / "models"
ADAPTERS = ANIMATE / "adapters"
REFS = ANIMATE / "references"
SIZE_BUDGET_BYTES = 2 * 1024 * 1024

# diffusers' conversion script is not in the wheel; it is read from the pinned commit of the
# huggingface/diffusers git mirror (override with DIFFUSERS_GIT_DIR).
DIFFUSERS_GIT_DIR = Path(os.environ.get("DIFFUSERS_GIT_DIR", "/work/.mirror/huggingface+diffusers/repo"))
DIFFUSERS_SCRIPT_COMMIT = "58eb52c0803ea9af3abec60841c2a093bdf1f951"
DIFFUSERS_SCRIPT_PATH = "scripts/convert_wan_to_diffusers.py"

log = logging.getLogger("variants_animate_golden")

# --------------------------------------------------------------------------------------------
# Tiny Animate configuration. motion_encoder_size stays 512 so the motion encoder has the real
# key structure (7 res blocks, conv_out at convs.8, which diffusers' converter hard-codes);
# motion_encoder_channel_sizes (a config key the constructor accepts) makes it tiny, with
# distinct channel counts so a transposed or misrouted tensor cannot pass.
# --------------------------------------------------------------------------------------------

TINY_CHANNELS = {"4": 5, "8": 4, "16": 6, "32": 5, "64": 4, "128": 6, "256": 5, "512": 4, "1024": 4}
ANIMATE_CONFIG = dict(
    patch_size=[1, 2, 2],
    num_attention_heads=2,
    attention_head_dim=8,
    in_channels=12,
    latent_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=16,
    ffn_dim=32,
    num_layers=4,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    image_dim=12,
    added_kv_proj_dim=16,
    rope_max_seq_len=32,
    motion_encoder_channel_sizes=TINY_CHANNELS,
    motion_encoder_size=512,
    motion_style_dim=6,
    motion_dim=3,
    motion_encoder_dim=7,
    face_encoder_hidden_dim=8,
    face_encoder_num_heads=2,
    inject_face_latents_blocks=2,
)
ANIMATE_SEED = 3101

BLUR_TAPS = (1.0, 3.0, 3.0, 1.0)  # wan/modules/animate/motion_encoder.py ConvLayer default blur_kernel


def blur_kernel() -> torch.Tensor:
    """W `make_kernel([1,3,3,1])`: outer(k, k) / sum, float32 (a persistent buffer in W and C)."""
    k = torch.tensor(BLUR_TAPS, dtype=torch.float32)
    k2 = k[None, :] * k[:, None]
    return k2 / k2.sum()


# --------------------------------------------------------------------------------------------
# diffusers names <-> original Wan2.2 Animate names.
# --------------------------------------------------------------------------------------------

_FACE_ADAPTER_LAYER = {"to_q": "linear1_q", "to_out": "linear2", "norm_q": "q_norm", "norm_k": "k_norm"}


def n_res_blocks(config: dict) -> int:
    return int(math.log2(config["motion_encoder_size"])) - 2


def animate_original_entries(key: str, shape: tuple, n_res: int) -> list:
    """Original (name, shape, how) entries for one diffusers Animate tensor.

    how: "same" (same values), "view4d" (bias viewed as (1,C,1,1)), "kv_k"/"kv_v" (the two row
    halves of linear1_kv), "blur" (the constant blur kernel the converter drops), "skip" (the
    value lives in another entry).
    """
    m = re.fullmatch(r"motion_encoder\.res_blocks\.(\d+)\.(conv1|conv2|conv_skip)\.(weight|act_fn\.bias)", key)
    if m:
        c, layer, param = int(m.group(1)) + 1, m.group(2), m.group(3)
        base = f"motion_encoder.enc.net_app.convs.{c}"
        if layer == "conv1":
            if param == "weight":
                return [(f"{base}.conv1.0.weight", shape, "same")]
            return [(f"{base}.conv1.1.bias", (1, shape[0], 1, 1), "view4d")]
        if layer == "conv2":
            if param == "weight":
                return [(f"{base}.conv2.1.weight", shape, "same"), (f"{base}.conv2.0.kernel", (4, 4), "blur")]
            return [(f"{base}.conv2.2.bias", (1, shape[0], 1, 1), "view4d")]
        return [(f"{base}.skip.1.weight", shape, "same"), (f"{base}.skip.0.kernel", (4, 4), "blur")]
    fixed = {
        "motion_encoder.motion_synthesis_weight": "motion_encoder.dec.direction.weight",
        "motion_encoder.conv_in.weight": "motion_encoder.enc.net_app.convs.0.0.weight",
        "motion_encoder.conv_out.weight": f"motion_encoder.enc.net_app.convs.{n_res + 1}.weight",
    }
    if key in fixed:
        return [(fixed[key], shape, "same")]
    if key == "motion_encoder.conv_in.act_fn.bias":
        return [("motion_encoder.enc.net_app.convs.0.1.bias", (1, shape[0], 1, 1), "view4d")]
    m = re.fullmatch(r"motion_encoder\.motion_network\.(\d+)\.(weight|bias)", key)
    if m:
        return [(f"motion_encoder.enc.fc.{m.group(1)}.{m.group(2)}", shape, "same")]
    m = re.fullmatch(r"face_encoder\.(conv1_local|conv2|conv3)\.(weight|bias)", key)
    if m:
        return [(f"face_encoder.{m.group(1)}.conv.{m.group(2)}", shape, "same")]
    if key.startswith("face_encoder.") or key.startswith("pose_patch_embedding."):
        return [(key, shape, "same")]
    m = re.fullmatch(r"face_adapter\.(\d+)\.(to_q|to_k|to_v|to_out|norm_q|norm_k)\.(weight|bias)", key)
    if m:
        n, layer, param = m.groups()
        if layer == "to_k":
            return [(f"face_adapter.fuser_blocks.{n}.linear1_kv.{param}", (2 * shape[0], *shape[1:]), "kv_k")]
        if layer == "to_v":
            return [(f"face_adapter.fuser_blocks.{n}.linear1_kv.{param}", None, "kv_v")]
        return [(f"face_adapter.fuser_blocks.{n}.{_FACE_ADAPTER_LAYER[layer]}.{param}", shape, "same")]
    if key.split(".")[0] in ("motion_encoder", "face_adapter"):
        raise KeyError(f"no original Animate name for diffusers key {key!r}")
    return [(to_original_key(key), shape, "same")]


def animate_original_shapes(diffusers_shapes: dict, n_res: int) -> dict:
    out = {}
    for key, shape in diffusers_shapes.items():
        for name, oshape, how in animate_original_entries(key, tuple(shape), n_res):
            if how != "kv_v":
                out[name] = tuple(oshape)
    return dict(sorted(out.items()))


def animate_original_state(sd: dict, n_res: int) -> dict:
    """The diffusers state dict under original names (values exact, blur kernels added)."""
    out = {}
    for key in sorted(sd):
        for name, _, how in animate_original_entries(key, tuple(sd[key].shape), n_res):
            if how == "same":
                out[name] = sd[key].detach().clone()
            elif how == "view4d":
                out[name] = sd[key].detach().reshape(1, -1, 1, 1).clone()
            elif how == "blur":
                out[name] = blur_kernel()
            elif how == "kv_k":
                v_key = key.replace(".to_k.", ".to_v.")
                out[name] = torch.cat([sd[key], sd[v_key]], dim=0).detach().clone()
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------------------------
# diffusers' conversion script (imported from the pinned commit, never copied).
# --------------------------------------------------------------------------------------------


def load_conversion_script():
    """Imports scripts/convert_wan_to_diffusers.py at DIFFUSERS_SCRIPT_COMMIT; returns (module, blob sha)."""
    git = ["git", "-C", str(DIFFUSERS_GIT_DIR)]
    spec_ref = f"{DIFFUSERS_SCRIPT_COMMIT}:{DIFFUSERS_SCRIPT_PATH}"
    source = subprocess.run([*git, "show", spec_ref], check=True, capture_output=True).stdout
    blob = subprocess.run([*git, "rev-parse", spec_ref], check=True, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "convert_wan_to_diffusers.py"
        path.write_bytes(source)
        spec = importlib.util.spec_from_file_location("convert_wan_to_diffusers", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module, blob


def script_convert_animate(cw, original: dict, final_conv_idx: int) -> dict:
    """The driver of the script's `convert_transformer` for Animate, with the script's own tables.

    Renames every key with ANIMATE_TRANSFORMER_KEYS_RENAME_DICT (in order, via the script's
    update_state_dict_), then calls each ANIMATE_TRANSFORMER_SPECIAL_KEYS_REMAP handler on the keys
    that contain its pattern. convert_transformer itself downloads the checkpoint, so its loop is
    restated here; the handlers and tables are the script's objects. `final_conv_idx` is passed to
    convert_animate_motion_encoder_weights (the script uses its default, 8).
    """
    sd = dict(original)
    config, rename, remap = cw.get_transformer_config("Wan2.2-Animate-14B")
    assert rename is cw.ANIMATE_TRANSFORMER_KEYS_RENAME_DICT and remap is cw.ANIMATE_TRANSFORMER_SPECIAL_KEYS_REMAP
    for key in list(sd):
        new_key = key
        for old, new in rename.items():
            new_key = new_key.replace(old, new)
        cw.update_state_dict_(sd, key, new_key)
    for key in list(sd):
        for pattern, handler in remap.items():
            if pattern not in key:
                continue
            if handler is cw.convert_animate_motion_encoder_weights:
                handler(key, sd, final_conv_idx=final_conv_idx)
            else:
                handler(key, sd)
    return sd


def ds_hash(shapes: dict) -> str:
    """DiffSynth-Studio hash_model_file over a {name: shape} list (diffsynth/core/loader/file.py)."""
    keys = []
    for name, shape in shapes.items():
        keys.append(name + ":" + "_".join(str(d) for d in shape))
        keys.append(name)
    keys.sort()
    return hashlib.md5(",".join(keys).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# Shape lists (meta device).
# --------------------------------------------------------------------------------------------


def meta_shapes(cls, config: dict) -> dict:
    with torch.device("meta"):
        model = cls(**config)
    return {k: tuple(v.shape) for k, v in sorted(model.state_dict().items())}


def write_shapes_json(path: Path, obj: dict) -> None:
    """JSON with one tensor per line (`tensors` maps are the bulk; keep them diffable and small)."""

    def render(value, indent):
        pad = " " * indent
        if isinstance(value, dict) and value and all(isinstance(v, (list, tuple)) for v in value.values()):
            rows = [f'{pad}  {json.dumps(k)}: {json.dumps(list(v))}' for k, v in sorted(value.items())]
            return "{\n" + ",\n".join(rows) + "\n" + pad + "}"
        if isinstance(value, dict):
            rows = [f"{pad}  {json.dumps(k)}: {render(v, indent + 2)}" for k, v in sorted(value.items())]
            return "{\n" + ",\n".join(rows) + "\n" + pad + "}" if rows else "{}"
        return json.dumps(value, sort_keys=True)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(obj, 0) + "\n")


def shape_summary(shapes: dict) -> dict:
    return {"count": len(shapes), "num_parameters": sum(math.prod(s) for s in shapes.values()), "tensors": shapes}


ANIMATE_ONLY_PREFIXES = ("pose_patch_embedding.", "motion_encoder.", "face_encoder.", "face_adapter.")
DIFFSYNTH_ANIMATE_HASH = "31fa352acb8a1b1d33cd8764273d80a2"


def animate_shapes(cw, manifest: dict) -> None:
    config = dict(cw.get_transformer_config("Wan2.2-Animate-14B")[0]["diffusers_config"])
    dshapes = meta_shapes(WanAnimateTransformer3DModel, config)
    n_res = n_res_blocks(config)
    oshapes = animate_original_shapes(dshapes, n_res)
    digest = ds_hash(oshapes)
    if digest != DIFFSYNTH_ANIMATE_HASH:
        raise AssertionError(f"original Animate shape list hashes to {digest}, DiffSynth records {DIFFSYNTH_ANIMATE_HASH}")
    # The script's converter must map the meta original list back onto the diffusers list.
    with torch.device("meta"):
        meta_orig = {k: torch.empty(s) for k, s in oshapes.items()}
    back = {k: tuple(v.shape) for k, v in script_convert_animate(cw, meta_orig, n_res + 1).items()}
    if back != dshapes:
        raise AssertionError(f"script converter disagrees on the 14B list: {sorted(set(back) ^ set(dshapes))[:8]}")
    path = ANIMATE / "shapes" / "animate_14b.json"
    write_shapes_json(
        path,
        {
            "model": "Wan-AI/Wan2.2-Animate-14B",
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.items()},
            "config_source": f"huggingface/diffusers@{DIFFUSERS_SCRIPT_COMMIT}:{DIFFUSERS_SCRIPT_PATH} get_transformer_config('Wan2.2-Animate-14B')",
            "diffusers": shape_summary(dshapes),
            "diffusers_animate_only": sorted(k for k in dshapes if k.startswith(ANIMATE_ONLY_PREFIXES)),
            "original": shape_summary(oshapes),
            "original_animate_only": sorted(k for k in oshapes if k.startswith(ANIMATE_ONLY_PREFIXES)),
            "original_diffsynth_hash": digest,
            "proof": (
                "diffusers list: WanAnimateTransformer3DModel(**config) on torch's meta device. original list: "
                "variants_animate_golden.animate_original_shapes; its DiffSynth-Studio hash_model_file md5 equals "
                f"{DIFFSYNTH_ANIMATE_HASH}, the hash modelscope/DiffSynth-Studio@fed7b18f:diffsynth/configs/model_configs.py "
                "records for Wan-AI/Wan2.2-Animate-14B diffusion_pytorch_model*.safetensors; the script's converter maps "
                "the original list (meta tensors) back onto the diffusers list name for name and shape for shape"
            ),
        },
    )
    manifest["shapes"] = {
        "file": rel(path),
        "diffusers_count": len(dshapes),
        "original_count": len(oshapes),
        "num_parameters": sum(math.prod(s) for s in dshapes.values()),
        "original_diffsynth_hash": digest,
    }


# Fun variants: (id, trunk, in_channels, clip branch, extras, DiffSynth hash or None, evidence)
DIM_13B = dict(num_attention_heads=12, ffn_dim=8960, num_layers=30)
DIM_14B = dict(num_attention_heads=40, ffn_dim=13824, num_layers=40)
VIDEOX = "aigc-apps/VideoX-Fun@804a4258:videox_fun/models/wan_transformer3d.py"
DIFFSYNTH_CONFIGS = "modelscope/DiffSynth-Studio@fed7b18f:diffsynth/configs/model_configs.py"
FUN_VARIANTS = [
    ("Wan2.1-Fun-1.3B-InP", DIM_13B, 36, True, (), "6d6ccde6845b95ad9114ab993d917893", None),
    ("Wan2.1-Fun-14B-InP", DIM_14B, 36, True, (), "6bfcfb3b342cb286ce886889d519a77e", None),
    ("Wan2.1-Fun-1.3B-Control", DIM_13B, 48, True, (), "349723183fc063b2bfc10bb2835cf677", None),
    ("Wan2.1-Fun-14B-Control", DIM_14B, 48, True, (), "efa44cddf936c70abd0ea28b6cbe946c", None),
    ("Wan2.1-Fun-V1.1-1.3B-InP", DIM_13B, 36, True, (), "6d6ccde6845b95ad9114ab993d917893",
     "no own DiffSynth entry; DiffSynth loads PAI/Wan2.1-Fun-V1.1-1.3B-InP (with the CLIP encoder) through the Wan2.1-Fun-1.3B-InP entry"),
    ("Wan2.1-Fun-V1.1-14B-InP", DIM_14B, 36, True, (), "6bfcfb3b342cb286ce886889d519a77e",
     "no own DiffSynth entry; DiffSynth loads PAI/Wan2.1-Fun-V1.1-14B-InP (with the CLIP encoder) through the Wan2.1-Fun-14B-InP entry"),
    ("Wan2.1-Fun-V1.1-1.3B-Control", DIM_13B, 48, True, ("ref_conv",), "70ddad9d3a133785da5ea371aae09504", None),
    ("Wan2.1-Fun-V1.1-14B-Control", DIM_14B, 48, True, ("ref_conv",), "26bde73488a92e64cc20b0a7485b9e5b", None),
    ("Wan2.1-Fun-V1.1-1.3B-Control-Camera", DIM_13B, 32, True, ("control_adapter",), "ac6a5aa74f4a0aab6f64eb9a72f19901", None),
    ("Wan2.1-Fun-V1.1-14B-Control-Camera", DIM_14B, 32, True, ("control_adapter",), "b61c605c2adbd23124d152ed28e049ae", None),
    ("Wan2.2-Fun-A14B-InP", DIM_14B, 36, False, (), "5b013604280dd715f8457c6ed6d6a626",
     "the hash is DiffSynth's Wan-AI/Wan2.2-I2V-A14B entry: DiffSynth has no own entry for PAI/Wan2.2-Fun-A14B-InP and "
     "loads it without a CLIP encoder, so its structure is inferred to be this one (per expert)"),
    ("Wan2.2-Fun-A14B-Control", DIM_14B, 52, False, ("ref_conv",), "2267d489f0ceb9f21836532952852ee5", None),
    ("Wan2.2-Fun-A14B-Control-Camera", DIM_14B, 36, False, ("control_adapter",), "47dbeab5e560db3180adf51dc0232fb1", None),
]
VACE_FUN_HASH = "7a513e1f257a861512b1afd387a8ecd9"


def wan_config(dims: dict, in_channels: int, clip: bool) -> dict:
    dim = dims["num_attention_heads"] * 128
    return dict(
        patch_size=[1, 2, 2], attention_head_dim=128, in_channels=in_channels, out_channels=16, text_dim=4096,
        freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
        image_dim=1280 if clip else None, added_kv_proj_dim=dim if clip else None, **dims,
    )


def fun_extras(extras, dim: int) -> dict:
    """Shapes of VideoX-Fun's extra modules (V: SimpleAdapter(24, dim, (2,2), (2,2), 8), Conv2d(16, dim, 2, 2))."""
    out = {}
    if "ref_conv" in extras:
        out.update({"ref_conv.weight": (dim, 16, 2, 2), "ref_conv.bias": (dim,)})
    if "control_adapter" in extras:
        out.update({
            "control_adapter.conv.weight": (dim, 24 * 8 * 8, 2, 2),
            "control_adapter.conv.bias": (dim,),
            "control_adapter.residual_blocks.0.conv1.weight": (dim, dim, 3, 3),
            "control_adapter.residual_blocks.0.conv1.bias": (dim,),
            "control_adapter.residual_blocks.0.conv2.weight": (dim, dim, 3, 3),
            "control_adapter.residual_blocks.0.conv2.bias": (dim,),
        })
    return out


def vace_original_key(key: str) -> str:
    if key.startswith("vace_blocks."):
        inner = key.replace("vace_blocks.", "blocks.", 1)
        m = re.fullmatch(r"blocks\.(\d+)\.proj_(in|out)\.(weight|bias)", inner)
        if m:
            return f"vace_blocks.{m.group(1)}.{'before' if m.group(2) == 'in' else 'after'}_proj.{m.group(3)}"
        return "vace_" + to_original_key(inner)
    if key.startswith("vace_patch_embedding."):
        return key
    return to_original_key(key)


def fun_shapes(cw, manifest: dict) -> None:
    entries = {}
    for vid, dims, in_ch, clip, extras, want, evidence in FUN_VARIANTS:
        config = wan_config(dims, in_ch, clip)
        dshapes = meta_shapes(WanTransformer3DModel, config)
        extra = fun_extras(extras, dims["num_attention_heads"] * 128)
        oshapes = dict(sorted({**{to_original_key(k): s for k, s in dshapes.items()}, **extra}.items()))
        digest = ds_hash(oshapes)
        if digest != want:
            raise AssertionError(f"{vid}: shape list hashes to {digest}, DiffSynth records {want}")
        entries[vid] = write_fun_entry(vid, "WanTransformer3DModel", config, dshapes, extra, oshapes, digest, evidence,
                                       in_ch, clip, extras)
    vace_config = dict(cw.get_transformer_config("Wan2.2-VACE-Fun-14B")[0]["diffusers_config"])
    if vace_config != cw.get_transformer_config("Wan-VACE-14B")[0]["diffusers_config"]:
        raise AssertionError("diffusers' script no longer gives Wan2.2-VACE-Fun-14B the Wan-VACE-14B config")
    dshapes = meta_shapes(WanVACETransformer3DModel, vace_config)
    oshapes = dict(sorted({vace_original_key(k): s for k, s in dshapes.items()}.items()))
    digest = ds_hash(oshapes)
    if digest != VACE_FUN_HASH:
        raise AssertionError(f"VACE-Fun shape list hashes to {digest}, DiffSynth records {VACE_FUN_HASH}")
    entries["Wan2.2-VACE-Fun-A14B"] = write_fun_entry(
        "Wan2.2-VACE-Fun-A14B", "WanVACETransformer3DModel", vace_config, dshapes, {}, oshapes, digest,
        "config: diffusers' script gives Wan2.2-VACE-Fun-14B the Wan-VACE-14B config; the hash is DiffSynth's "
        "Wan-AI/Wan2.1-VACE-14B entry, and DiffSynth loads PAI/Wan2.2-VACE-Fun-A14B with no own entry (per expert)",
        16, False, ("vace",),
    )
    json_dump(FUN / "manifest.json", {
        "generator": generator_block(),
        "variants": entries,
        "hash_rule": "md5 of ','.join(sorted(['name:d0_d1_..', 'name'] for every tensor)) = DiffSynth-Studio hash_model_file",
        "sources": {"extras": VIDEOX, "hashes": DIFFSYNTH_CONFIGS},
    })
    manifest["fun_manifest"] = rel(FUN / "manifest.json")


def write_fun_entry(vid, cls_name, config, dshapes, extra, oshapes, digest, evidence, in_ch, clip, extras) -> dict:
    path = FUN / "shapes" / f"{vid}.json"
    write_shapes_json(path, {
        "model": f"alibaba-pai/{vid}",
        "diffusers_class": cls_name,
        "diffusers_config": config,
        "diffusers": shape_summary(dshapes),
        "extras_without_diffusers_counterpart": {k: list(v) for k, v in extra.items()} if extra else {},
        "extras_source": VIDEOX if extra else None,
        "original": shape_summary(oshapes),
        "original_diffsynth_hash": digest,
        "evidence": evidence or f"hash equals the {DIFFSYNTH_CONFIGS} entry for this model",
    })
    return {
        "file": rel(path), "in_channels": in_ch, "clip_branch": clip, "extras": list(extras),
        "original_count": len(oshapes), "diffsynth_hash": digest, "inferred": evidence is not None,
    }


# --------------------------------------------------------------------------------------------
# Tiny model, original-name files and their proofs.
# --------------------------------------------------------------------------------------------


def build_animate() -> WanAnimateTransformer3DModel:
    torch.manual_seed(ANIMATE_SEED)
    model = WanAnimateTransformer3DModel(**ANIMATE_CONFIG)
    rng = Rng(ANIMATE_SEED)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            param.copy_(_init_value(name, param.shape, rng))
    return model.eval()


def load_animate() -> WanAnimateTransformer3DModel:
    return WanAnimateTransformer3DModel.from_pretrained(MODELS / "animate", torch_dtype=torch.float32).eval()


def animate_base() -> dict:
    return {k: v.detach().clone() for k, v in load_animate().state_dict().items()}


def write_models(cw, manifest: dict) -> None:
    build_animate().save_pretrained(MODELS / "animate", safe_serialization=True)
    sd = animate_base()
    n_res = n_res_blocks(ANIMATE_CONFIG)
    orig = animate_original_state(sd, n_res)
    write_safetensors(MODELS / "animate_original.safetensors", orig)
    write_safetensors(MODELS / "animate_comfy.safetensors", {f"model.diffusion_model.{k}": v for k, v in orig.items()})
    file_orig, _ = read_safetensors(MODELS / "animate_original.safetensors")
    script_note = prove_with_script(cw, sd, file_orig, n_res)
    single = probe_single_file(sd, file_orig)
    manifest["models"] = {
        "animate": {
            "config": ANIMATE_CONFIG,
            "seed": ANIMATE_SEED,
            "num_parameters": sum(v.numel() for v in sd.values()),
            "num_tensors": len(sd),
            "files": [rel(MODELS / "animate" / "config.json"), rel(MODELS / "animate" / "diffusion_pytorch_model.safetensors")],
            "original_names_file": rel(MODELS / "animate_original.safetensors"),
            "original_num_tensors": len(orig),
            "comfy_prefixed_file": rel(MODELS / "animate_comfy.safetensors"),
        },
        "init_rule": (
            "wan_golden._init_value in sorted-name order with torch.Generator seed 3101: matrices / conv kernels "
            "N(0, 1/fan_in), 1-D weights 1 + 0.1 N, biases (incl. act_fn.bias) 0.05 N, scale_shift_table 0.1 N"
        ),
        "motion_encoder_note": (
            "motion_encoder_size 512 keeps the real key structure (7 res blocks, conv_out = original convs.8, which "
            "convert_animate_motion_encoder_weights hard-codes as final_conv_idx=8); motion_encoder_channel_sizes "
            f"{TINY_CHANNELS} shrinks it. The smallest size the constructor accepts is 4 (no res blocks, conv_out at "
            "convs.1), which the script's converter would misname without final_conv_idx=1."
        ),
        "original_names_proof": script_note,
        "single_file_converter": single,
    }


def prove_with_script(cw, sd: dict, original: dict, n_res: int) -> str:
    """The script's converter, applied to our original dict, must give the diffusers dict bit for bit."""
    converted = script_convert_animate(cw, original, n_res + 1)
    if set(converted) != set(sd):
        raise AssertionError(f"script converter keys differ: {sorted(set(converted) ^ set(sd))[:8]}")
    for k, v in sd.items():
        if converted[k].shape != v.shape or not torch.equal(converted[k], v):
            raise AssertionError(f"script converter changed {k}")
    fresh = WanAnimateTransformer3DModel(**ANIMATE_CONFIG)
    fresh.load_state_dict(converted, strict=True)
    dropped = sorted(k for k in original if k.endswith(".kernel"))
    for k in dropped:
        if not torch.equal(original[k], blur_kernel()):
            raise AssertionError(f"{k} is not the constant blur kernel")
    return (
        "animate_original.safetensors was written by variants_animate_golden.animate_original_state and fed through "
        f"huggingface/diffusers@{DIFFUSERS_SCRIPT_COMMIT}:{DIFFUSERS_SCRIPT_PATH} (ANIMATE_TRANSFORMER_KEYS_RENAME_DICT, "
        "update_state_dict_, convert_animate_motion_encoder_weights with final_conv_idx=8, "
        "convert_animate_face_adapter_weights): the result equals the diffusers state dict key for key and bit for bit "
        "and loads with load_state_dict(strict=True). Not invertible from the diffusers dict alone: the "
        f"{len(dropped)} blur-kernel buffers ({dropped[0]}, ...) are dropped by the converter (diffusers rebuilds "
        "them as non-persistent buffers); their value is the constant outer([1,3,3,1])^2/64, written here. The "
        "(1,C,1,1) FusedLeakyReLU biases are squeezed to (C), and linear1_kv is split into to_k (first half of "
        "the rows) and to_v (second half): both exact and inverted here."
    )


def probe_single_file(sd: dict, original: dict) -> dict:
    """What diffusers' single-file converter (from_single_file's mapping) makes of the original dict."""
    out = {}
    for label, prefix in (("plain", ""), ("comfy_prefix", "model.diffusion_model.")):
        converted = convert_wan_transformer_to_diffusers({prefix + k: v.clone() for k, v in original.items()})
        unknown = sorted(set(converted) - set(sd))
        missing = sorted(set(sd) - set(converted))
        differ = sorted(k for k in set(converted) & set(sd) if not torch.equal(converted[k], sd[k]))
        out[label] = {"left_unconverted": unknown, "missing": missing, "values_differ": differ}
    out["function"] = f"diffusers {diffusers.__version__} loaders.single_file_utils.convert_wan_transformer_to_diffusers"
    return out


# --------------------------------------------------------------------------------------------
# The LoRA: PEFT is the writer and the merge oracle; the other spellings are translations of
# exactly its factors, checked by an independent float64 merge on the original-named weights.
# --------------------------------------------------------------------------------------------

LORA_RANK, LORA_ALPHA, LORA_SEED = 4, 8, 3201
LORA_TARGETS = [
    "pose_patch_embedding",
    "face_encoder.conv1_local",
    "face_encoder.out_proj",
    "face_adapter.0.to_q",
    "face_adapter.0.to_k",
    "face_adapter.0.to_v",
    "face_adapter.0.to_out",
    "face_adapter.1.to_k",
    "face_adapter.1.to_v",
    "blocks.0.attn1.to_q",
    "blocks.1.attn2.add_k_proj",
    "blocks.2.ffn.net.0.proj",
    "blocks.3.attn2.to_out.0",
]
PEFT_REFUSED_PROBES = ["motion_encoder.motion_network.0", "motion_encoder.conv_in"]


def peft_refusals() -> dict:
    out = {}
    for target in PEFT_REFUSED_PROBES:
        try:
            get_peft_model(load_animate(), LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=[target]))
        except ValueError as err:
            out[target] = f"{type(err).__name__}: {str(err).split('. Currently')[0]}"
        else:
            raise AssertionError(f"PEFT unexpectedly accepted {target}")
    return out


def lora_factors(adapter_dir: Path) -> dict:
    """{diffusers module: (A, B)} as PEFT saved them (keys base_model.model.<mod>.lora_A.weight)."""
    tensors, _ = read_safetensors(adapter_dir / "adapter_model.safetensors")
    out = {}
    for key, value in tensors.items():
        m = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.weight", key)
        if not m:
            raise KeyError(f"unexpected PEFT adapter key {key}")
        out.setdefault(m.group(1), {})[m.group(2)] = value
    return {mod: (ab["A"], ab["B"]) for mod, ab in sorted(out.items())}


def original_module(diffusers_module: str) -> str:
    """Original module name of a LoRA-targetable diffusers module (to_k/to_v -> the fused linear1_kv)."""
    m = re.fullmatch(r"face_adapter\.(\d+)\.(to_q|to_k|to_v|to_out)", diffusers_module)
    if m:
        layer = {"to_q": "linear1_q", "to_k": "linear1_kv", "to_v": "linear1_kv", "to_out": "linear2"}[m.group(2)]
        return f"face_adapter.fuser_blocks.{m.group(1)}.{layer}"
    m = re.fullmatch(r"face_encoder\.(conv1_local|conv2|conv3)", diffusers_module)
    if m:
        return f"face_encoder.{m.group(1)}.conv"
    if diffusers_module.startswith(("face_encoder.", "pose_patch_embedding")):
        return diffusers_module
    return to_original_key(f"{diffusers_module}.weight").removesuffix(".weight")


def original_lora(factors: dict, scaling: float) -> tuple[dict, dict]:
    """Per original module: (down, up, alpha). to_k/to_v pairs become one block-diagonal rank-2r pair.

    linear1_kv = [to_k; to_v], so (B_k A_k ; B_v A_v) = blockdiag(B_k, B_v) @ [A_k; A_v] exactly;
    alpha is chosen so alpha/rank equals PEFT's scaling for either rank.
    """
    out, notes = {}, {}
    for mod, (a, b) in factors.items():
        omod = original_module(mod)
        if omod.endswith(".linear1_kv"):
            if mod.endswith(".to_v"):
                continue
            a_v, b_v = factors[mod.replace(".to_k", ".to_v")]
            down = torch.cat([a, a_v], dim=0)
            up = torch.zeros(b.shape[0] + b_v.shape[0], a.shape[0] + a_v.shape[0])
            up[: b.shape[0], : a.shape[0]] = b
            up[b.shape[0]:, a.shape[0]:] = b_v
            out[omod] = (down, up, scaling * down.shape[0])
            notes[omod] = f"block-diagonal fusion of {mod} and {mod.replace('.to_k', '.to_v')} (rank {down.shape[0]})"
        else:
            out[omod] = (a, b, scaling * a.shape[0])
    if any(m.endswith(".to_v") and m.replace(".to_v", ".to_k") not in factors for m in factors):
        raise AssertionError("a to_v LoRA without its to_k partner cannot be fused here")
    return dict(sorted(out.items())), notes


def comfy_file(orig_lora: dict) -> dict:
    out = {}
    for mod, (down, up, alpha) in orig_lora.items():
        out[f"diffusion_model.{mod}.lora_down.weight"] = down
        out[f"diffusion_model.{mod}.lora_up.weight"] = up
        out[f"diffusion_model.{mod}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
    return out


def kohya_file(orig_lora: dict) -> dict:
    out = {}
    for mod, (down, up, alpha) in orig_lora.items():
        stem = "lora_unet_" + mod.replace(".", "_")
        out[f"{stem}.lora_down.weight"] = down
        out[f"{stem}.lora_up.weight"] = up
        out[f"{stem}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
    return out


def diffsynth_file(orig_lora: dict) -> dict:
    """DiffSynth-Studio's saver: PEFT parameter names `<module>.lora_{A,B}.default.weight`, no prefix,
    no alpha (its GeneralLoRALoader fuses W += B@A); PEFT's scaling is folded into lora_B."""
    out = {}
    for mod, (down, up, alpha) in orig_lora.items():
        out[f"{mod}.lora_A.default.weight"] = down
        out[f"{mod}.lora_B.default.weight"] = up * (alpha / down.shape[0])
    return out


def parse_lora_file(tensors: dict, spelling: str) -> dict:
    """Independent parser: {original module: (down, up, scale)} from a translated file."""
    groups: dict = {}
    for key, value in tensors.items():
        if spelling == "kohya":
            stem, _, suffix = key.partition(".")
            mod = ("kohya", stem)
        else:
            m = re.fullmatch(r"(?:diffusion_model\.)?(.+?)\.(lora_down\.weight|lora_up\.weight|alpha|lora_A\.default\.weight|lora_B\.default\.weight)", key)
            if not m:
                raise KeyError(key)
            mod, suffix = m.group(1), m.group(2)
        part = {"lora_down.weight": "down", "lora_A.default.weight": "down", "lora_up.weight": "up",
                "lora_B.default.weight": "up", "alpha": "alpha"}[suffix]
        groups.setdefault(mod, {})[part] = value
    out = {}
    for mod, parts in groups.items():
        scale = float(parts["alpha"]) / parts["down"].shape[0] if "alpha" in parts else 1.0
        out[mod] = (parts["down"], parts["up"], scale)
    return out


def hand_merge_original(base_orig: dict, parsed: dict, strength: float, kohya_alias=None) -> dict:
    out = {}
    for mod, (down, up, scale) in parsed.items():
        target = kohya_alias[mod[1]] if kohya_alias else mod
        w = base_orig[f"{target}.weight"]
        out[f"{target}.weight"] = (w.double() + strength * scale * lora_delta(down, up, w.shape)).float()
    return out


def lora_cases(manifest: dict) -> None:
    refusals = peft_refusals()
    model = get_peft_model(load_animate(), LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=LORA_TARGETS))
    randomize_lora(model, LORA_SEED)
    found = sorted(name for name, _ in lora_layers(model))
    if found != sorted(LORA_TARGETS):
        raise AssertionError(f"PEFT wrapped {found}, expected {sorted(LORA_TARGETS)}")
    peft_dir = ADAPTERS / "peft_animate"
    save_peft_adapter(model, peft_dir)

    base = animate_base()
    n_res = n_res_blocks(ANIMATE_CONFIG)
    base_orig = animate_original_state(base, n_res)
    factors = lora_factors(peft_dir)
    scaling = LORA_ALPHA / LORA_RANK
    orig_lora, fusion_notes = original_lora(factors, scaling)
    files = {
        "comfy": (ADAPTERS / "comfy_animate" / "comfy_animate.safetensors", comfy_file(orig_lora)),
        "kohya": (ADAPTERS / "kohya_animate" / "kohya_animate.safetensors", kohya_file(orig_lora)),
        "diffsynth": (ADAPTERS / "diffsynth_animate" / "diffsynth_animate.safetensors", diffsynth_file(orig_lora)),
    }
    for path, tensors in files.values():
        write_safetensors(path, tensors)
    kohya_alias = {"lora_unet_" + k.removesuffix(".weight").replace(".", "_"): k.removesuffix(".weight")
                   for k in base_orig if k.endswith(".weight")}

    per_strength = {}
    for strength in (1.0, 0.5):
        peft_model = PeftModel.from_pretrained(load_animate(), str(peft_dir))
        applied = applied_state(peft_model, f"{PEFT_TOOL} PeftModel.from_pretrained")
        if strength != 1.0:
            for _, layer in lora_layers(peft_model):
                layer.scale_layer(strength)
        merged = peft_model.merge_and_unload().state_dict()
        ref = changed_tensors(merged, base)
        check_against_applied(base, applied, ref, strength)
        merged_orig = animate_original_state(merged, n_res)
        ref_orig = {k: v for k, v in merged_orig.items() if not torch.equal(v, base_orig[k])}
        tag = "" if strength == 1.0 else f"__s{strength:g}"
        tool = f"{PEFT_TOOL} PeftModel.from_pretrained" + ("" if strength == 1.0 else f" + LoraLayer.scale_layer({strength:g})") + " + merge_and_unload"
        meta = {"case": "peft_animate", "strength": f"{strength:g}", "tool": tool, "kind": "reference", "dtype_note": "f32"}
        ref_path = REFS / f"peft_animate{tag}.safetensors"
        orig_path = REFS / f"peft_animate__original{tag}.safetensors"
        write_safetensors(ref_path, ref, meta)
        write_safetensors(orig_path, ref_orig, dict(meta, names="original Wan2.2 Animate names (diffusers merge renamed; to_k/to_v concatenated into linear1_kv)"))
        if strength == 1.0:
            write_safetensors(REFS / "peft_animate__applied.safetensors", applied[0], applied[1])
        crosscheck = {}
        for spelling, (path, _) in files.items():
            parsed = parse_lora_file(read_safetensors(path)[0], spelling)
            hand = hand_merge_original(base_orig, parsed, strength, kohya_alias if spelling == "kohya" else None)
            if set(hand) != set(ref_orig):
                raise AssertionError(f"{spelling}: targets {sorted(set(hand) ^ set(ref_orig))}")
            worst = max((hand[k].double() - ref_orig[k].double()).abs().max().item() for k in hand)
            for k in hand:
                if not torch.allclose(hand[k].double(), ref_orig[k].double(), rtol=1e-5, atol=1e-6):
                    raise AssertionError(f"{spelling} at {strength}: {k} differs from the PEFT merge")
            crosscheck[spelling] = f"float64 hand merge of the file on animate_original equals the PEFT reference (max abs diff {worst:.2e})"
        per_strength[f"{strength:g}"] = {"reference": rel(ref_path), "reference_original_names": rel(orig_path),
                                         "tool": tool, "crosscheck": crosscheck}

    manifest["lora"] = {
        "case": "peft_animate",
        "base": rel(MODELS / "animate"),
        "base_original": rel(MODELS / "animate_original.safetensors"),
        "rank": LORA_RANK, "alpha": LORA_ALPHA, "seed": LORA_SEED, "peft_scaling": scaling,
        "targets_diffusers": LORA_TARGETS,
        "targets_original": sorted(orig_lora),
        "fused_pairs": fusion_notes,
        "peft_refuses": refusals,
        "files": {
            "peft": [rel(peft_dir / "adapter_config.json"), rel(peft_dir / "adapter_model.safetensors")],
            **{k: [rel(p)] for k, (p, _) in files.items()},
        },
        "spellings": {
            "peft": "PEFT save_pretrained: base_model.model.<diffusers module>.lora_{A,B}.weight; scaling alpha/r = 2 from adapter_config.json",
            "comfy": "diffusion_model.<original module>.lora_down.weight / lora_up.weight / alpha (alpha = 2 * rank)",
            "kohya": "lora_unet_<original module, dots -> underscores>.lora_down.weight / lora_up.weight / alpha",
            "diffsynth": "<original module>.lora_A.default.weight / lora_B.default.weight, no prefix, no alpha (DiffSynth's GeneralLoRALoader fuses W += B@A; modelscope/DiffSynth-Studio@fed7b18f:diffsynth/utils/lora/general.py, diffusion/training_module.py mapping_lora_state_dict); PEFT's scaling 2 is folded into lora_B",
        },
        "strengths": per_strength,
        "applied": rel(REFS / "peft_animate__applied.safetensors"),
        "reference_semantics": "W' = W + strength * scaling * B@A (conv: B.flatten(1) @ A.flatten(1) reshaped to W), computed by PEFT merge_and_unload; keys = only the tensors that changed",
    }


# --------------------------------------------------------------------------------------------
# diffusers: the same LoRA written by WanAnimatePipeline.save_lora_weights and merged by diffusers;
# and what diffusers' loader does with the translated spellings.
# --------------------------------------------------------------------------------------------


def animate_pipe(transformer) -> WanAnimatePipeline:
    """A WanAnimatePipeline with only the transformer: enough for LoRA loading and fusing."""
    pipe = WanAnimatePipeline(
        tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
        image_processor=None, image_encoder=None, transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def diffusers_fuse_animate(path: Path, strength: float):
    pipe = animate_pipe(load_animate())
    pipe.load_lora_weights(str(path.parent), weight_name=path.name)
    applied = applied_state(pipe.transformer, f"{DIFFUSERS_TOOL} WanAnimatePipeline.load_lora_weights")
    pipe.fuse_lora(components=["transformer"], lora_scale=strength)
    pipe.unload_lora_weights()
    return pipe.transformer.state_dict(), applied


def diffusers_probe(path: Path) -> str:
    """What WanAnimatePipeline.load_lora_weights does with a file: refusal text or applied modules."""
    pipe = animate_pipe(load_animate())
    try:
        pipe.load_lora_weights(str(path.parent), weight_name=path.name)
    except Exception as err:  # the refusal itself is the recorded fact
        return f"refused: {type(err).__name__}: {str(err)[:400]}"
    scaling = json.loads(applied_state(pipe.transformer, "probe")[1]["scaling"])
    return f"loaded; LoRA layers created on: {sorted(scaling) or 'none (nothing matched)'}"


def diffusers_case(manifest: dict) -> None:
    peft_dir = ADAPTERS / "peft_animate"
    peft_model = PeftModel.from_pretrained(load_animate(), str(peft_dir))
    layers = {k.removeprefix("base_model.model."): v for k, v in get_peft_model_state_dict(peft_model).items()}
    metadata = peft_model.peft_config["default"].to_dict()
    adapter_dir = ADAPTERS / "diffusers_animate"
    WanAnimatePipeline.save_lora_weights(
        str(adapter_dir), transformer_lora_layers=layers, transformer_lora_adapter_metadata=metadata
    )
    adapter = adapter_dir / "pytorch_lora_weights.safetensors"
    canonicalize_tool_file(adapter)
    base = animate_base()
    per_strength = {}
    for strength in (1.0, 0.5):
        merged, applied = diffusers_fuse_animate(adapter, strength)
        ref = changed_tensors(merged, base)
        check_against_applied(base, applied, ref, strength)
        scales = set(json.loads(applied[1]["scaling"]).values())
        if scales != {LORA_ALPHA / LORA_RANK}:
            raise AssertionError(f"diffusers applied scalings {scales}")
        tag = "" if strength == 1.0 else f"__s{strength:g}"
        peft_ref, _ = read_safetensors(REFS / f"peft_animate{tag}.safetensors")
        if set(peft_ref) != set(ref):
            raise AssertionError(f"diffusers changed {sorted(set(ref) ^ set(peft_ref))} unlike PEFT")
        worst = max((ref[k].double() - peft_ref[k].double()).abs().max().item() for k in ref)
        if worst > 1e-5:
            raise AssertionError(f"diffusers merge differs from PEFT's by {worst}")
        tool = f"{DIFFUSERS_TOOL} WanAnimatePipeline.load_lora_weights + fuse_lora(lora_scale={strength:g})"
        path = REFS / f"diffusers_animate{tag}.safetensors"
        write_safetensors(path, ref, {"case": "diffusers_animate", "strength": f"{strength:g}", "tool": tool,
                                      "kind": "reference", "dtype_note": "f32"})
        per_strength[f"{strength:g}"] = {"reference": rel(path), "tool": tool,
                                         "crosscheck": f"equals the PEFT reference on the same targets (max abs diff {worst:.2e})"}
        if strength == 1.0:
            write_safetensors(REFS / "diffusers_animate__applied.safetensors", applied[0], applied[1])
    probes = {
        name: diffusers_probe(ADAPTERS / f"{name}_animate" / f"{name}_animate.safetensors")
        for name in ("comfy", "kohya", "diffsynth")
    }
    manifest["lora_diffusers"] = {
        "case": "diffusers_animate",
        "adapter": [rel(adapter)],
        "notes": (
            "the PEFT LoRA's factors re-saved by WanAnimatePipeline.save_lora_weights (keys transformer.<diffusers "
            "module>.lora_A/B.weight, header lora_adapter_metadata = the PEFT LoraConfig, so alpha 8 / r 4 = scaling 2); "
            "the file was re-serialised with a sorted header (safetensors writes multi-key metadata in random order)"
        ),
        "strengths": per_strength,
        "applied": rel(REFS / "diffusers_animate__applied.safetensors"),
        "diffusers_load_of_translated_files": probes,
    }


# --------------------------------------------------------------------------------------------
# MaxDiffusion (separate venv): its WanAnimateTransformer3DModel + load_wan_animate_transformer
# on the tiny diffusers model. Run: /tmp/maxd-venv/bin/python golden/variants_animate_golden.py
# maxdiffusion SRC (SRC = `git archive 7cfb8801 src | tar -x`'s src/).
# --------------------------------------------------------------------------------------------

MAXDIFFUSION_COMMIT = "7cfb8801d41d1728f0232cd7ee59e900a151fecf"
NNX = ANIMATE / "nnx"


def _leaf_source(leaf, sd: dict, stacked: int | None):
    """(diffusers key, axes permutation) whose tensor, permuted, equals `leaf` bit for bit.

    Found by value (every tensor with the same element count, every permutation), so the mapping
    is MaxDiffusion's, not ours. For a scanned leaf the first slice is matched and every slice i
    must then equal the same name with `blocks.i.`.
    """
    import itertools

    import numpy as np

    target = np.asarray(leaf if stacked is None else leaf[0])
    hits = []
    for key, value in sd.items():
        v = value.numpy()
        if v.size != target.size or (stacked is not None and not key.startswith("blocks.0.")):
            continue
        for perm in itertools.permutations(range(v.ndim)):
            t = np.transpose(v, perm)
            if t.shape == target.shape and np.array_equal(t, target):
                hits.append((key, list(perm)))
                break  # permutations that only move size-1 axes are the same layout; keep the first
    if len(hits) != 1:
        raise AssertionError(f"leaf matches {len(hits)} diffusers tensors: {hits[:4]}")
    key, perm = hits[0]
    if stacked is None:
        return key, perm
    for i in range(stacked):
        ki = key.replace("blocks.0.", f"blocks.{i}.", 1)
        if not np.array_equal(np.transpose(sd[ki].numpy(), perm), np.asarray(leaf[i])):
            raise AssertionError(f"scanned slice {i} is not {ki}")
    return key.replace("blocks.0.", "blocks.{i}.", 1), perm


def maxdiffusion_goldens(src: str) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh

    import maxdiffusion_orbax_golden as mog

    sys.path.insert(0, src)
    sys.meta_path.insert(0, mog._StubFinder([n for n in mog.STUBBED if not mog._installed(n)]))
    from maxdiffusion.models.wan.transformers.transformer_wan_animate import WanAnimateTransformer3DModel as MaxAnimate
    from maxdiffusion.models.wan.wan_utils import load_wan_animate_transformer

    sd = {k: v.detach() for k, v in read_safetensors(MODELS / "animate" / "diffusion_pytorch_model.safetensors")[0].items()}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(MODELS / "animate", repo / "transformer")
        index = {"metadata": {}, "weight_map": {k: "diffusion_pytorch_model.safetensors" for k in sorted(sd)}}
        (repo / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
        for scan in (False, True):
            config = MaxAnimate.load_config(str(repo), subfolder="transformer")
            config.update(mesh=Mesh(jax.devices()[:1], ("data",)), weights_dtype=jnp.float32, dtype=jnp.float32, scan_layers=scan)
            model = nnx.eval_shape(lambda: MaxAnimate(**config, rngs=nnx.Rngs(0)))
            _, state, _ = nnx.split(model, nnx.Param, ...)
            params = load_wan_animate_transformer(str(repo), state.to_pure_dict(), "cpu", num_layers=config["num_layers"],
                                                  scan_layers=scan, subfolder="transformer")
            leaves = {}
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
                name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
                arr = np.ascontiguousarray(np.asarray(leaf))
                stacked = config["num_layers"] if scan and name.startswith("blocks/") else None
                source, perm = _leaf_source(arr, sd, stacked)
                leaves[name] = {"shape": list(arr.shape), "dtype": str(arr.dtype),
                                "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
                                "from": source, "transpose": perm, **({"stacked_blocks": stacked} if stacked else {})}
            used = {v["from"].replace("{i}", str(i)) for v in leaves.values()
                    for i in range(v.get("stacked_blocks", 1))}
            missing = sorted(set(sd) - used)
            json_dump(NNX / f"maxdiffusion_animate_{'scanned' if scan else 'unscanned'}.json", {
                "tool": f"AI-Hypercomputer/maxdiffusion@{MAXDIFFUSION_COMMIT} WanAnimateTransformer3DModel (nnx.eval_shape, "
                        "weights_dtype float32, mesh of 1 CPU device) + models/wan/wan_utils.load_wan_animate_transformer",
                "input": rel(MODELS / "animate"),
                "scan_layers": scan,
                "leaf_count": len(leaves),
                "diffusers_tensors_not_in_tree": missing,
                "leaves": leaves,
                "rule": "leaf = transpose(diffusers[from], transpose) bit for bit (found by value); scanned leaves stack blocks.0..L-1 on axis 0",
            })
            print(f"[variants_animate_golden] maxdiffusion scan_layers={scan}: {len(leaves)} leaves, unused {missing}")


def generator_block() -> dict:
    return {
        "script": rel(Path(__file__)),
        "versions": VERSIONS,
        "diffusers_conversion_script": f"huggingface/diffusers@{DIFFUSERS_SCRIPT_COMMIT}:{DIFFUSERS_SCRIPT_PATH}",
        "determinism": "fixed seeds, torch.set_num_threads(1), PYTHONHASHSEED=0, canonical safetensors for files written here",
    }


def clean_outputs() -> None:
    for d in (MODELS, ADAPTERS, REFS, ANIMATE / "shapes", FUN / "shapes"):
        if d.exists():
            shutil.rmtree(d)
    for p in (ANIMATE / "manifest.json", FUN / "manifest.json"):
        if p.exists():
            p.unlink()


def tree_size(paths) -> int:
    return sum(p.stat().st_size for d in paths for p in Path(d).rglob("*") if p.is_file())


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    logging.getLogger("peft").setLevel(logging.ERROR)
    diffusers.utils.logging.set_verbosity_error()
    clean_outputs()
    cw, blob = load_conversion_script()
    manifest = {"generator": dict(generator_block(), diffusers_conversion_script_blob=blob)}
    for label, step in (("shapes", lambda m: (animate_shapes(cw, m), fun_shapes(cw, m))),
                        ("models", lambda m: write_models(cw, m)),
                        ("lora", lora_cases),
                        ("diffusers lora", diffusers_case)):
        print(f"[variants_animate_golden] {label}")
        torch.manual_seed(0)
        step(manifest)
    json_dump(ANIMATE / "manifest.json", manifest)
    size = tree_size([MODELS, ADAPTERS, REFS, ANIMATE / "shapes", NNX]) + (ANIMATE / "manifest.json").stat().st_size
    fun_size = tree_size([FUN / "shapes"]) + (FUN / "manifest.json").stat().st_size
    print(f"[variants_animate_golden] animate tree {size / 1e6:.2f} MB, fun tree {fun_size / 1e6:.2f} MB")
    if size > SIZE_BUDGET_BYTES or fun_size > SIZE_BUDGET_BYTES:
        raise SystemExit(f"fixture tree over the {SIZE_BUDGET_BYTES}-byte budget")


if __name__ == "__main__":
    if sys.argv[1:2] == ["maxdiffusion"]:
        maxdiffusion_goldens(sys.argv[2])
    else:
        main()
