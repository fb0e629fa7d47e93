"""WAN golden fixtures for wanbake, produced by the reference implementations themselves.

What this module writes (paths relative to the repository root):

- golden/models/: tiny f32 WanTransformer3DModel checkpoints saved with diffusers'
  `save_pretrained`, the same weights under ORIGINAL Wan-AI names (proved against diffusers'
  own single-file converter), and an A14B-style pipeline folder with two experts.
- golden/adapters/<case>/: adapters written the way their producing tool writes them (PEFT
  `save_pretrained`, diffusers `save_lora_weights`), or per the documented key conventions
  (ComfyUI / original-Wan, kohya / musubi, Wan-Fun, diffusion-pipe).
- golden/references/: merged weights computed by the reference tool (PEFT `merge_and_unload`,
  diffusers `load_lora_weights` + `fuse_lora`), the PEFT-format dict the tool applied after its
  own conversion (`__applied`), and hand-derived float64 values for what the tool dropped.
- golden/runner/: forward passes and 4-step sampling loops run by diffusers (WanPipeline's
  own loop where the pipeline can run without a VAE / text encoder).
- golden/nnx/: the MaxDiffusion diffusers->NNX layout expectation, computed by nnx_expect.py.
- golden/manifest.json: one entry per adapter case, plus the model and runner inventories.

Everything is deterministic: fixed seeds, one CPU thread, canonical safetensors headers for the
files this module writes itself, PYTHONHASHSEED=0 (set by generate.py) for the JSON the tools
write. Run `golden/generate.py`, not this module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import logging
import math
import re
import shutil
import struct
from pathlib import Path

import diffusers
import numpy as np
import peft
import safetensors
import torch
import transformers
from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors import safe_open

GOLDEN = Path(__file__).resolve().parent
REPO = GOLDEN.parent
MODELS = GOLDEN / "models"
ADAPTERS = GOLDEN / "adapters"
REFS = GOLDEN / "references"
RUNNER = GOLDEN / "runner"
NNX = GOLDEN / "nnx"
MANIFEST = GOLDEN / "manifest.json"

SIZE_BUDGET_BYTES = 6 * 1024 * 1024

VERSIONS = {
    "torch": torch.__version__.split("+")[0],
    "diffusers": diffusers.__version__,
    "peft": peft.__version__,
    "transformers": transformers.__version__,
    "safetensors": safetensors.__version__,
    "numpy": np.__version__,
}
PEFT_TOOL = f"peft {VERSIONS['peft']}"
DIFFUSERS_TOOL = f"diffusers {VERSIONS['diffusers']} (peft {VERSIONS['peft']} backend)"

# --------------------------------------------------------------------------------------------
# Tiny model configurations (our own dimensions, not the spec's examples).
# --------------------------------------------------------------------------------------------

T2V_CONFIG = dict(
    patch_size=[1, 2, 2],
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    freq_dim=32,
    ffn_dim=80,
    num_layers=3,
    cross_attn_norm=True,
    eps=1e-6,
    rope_max_seq_len=32,
)
I2V_CONFIG = dict(T2V_CONFIG, in_channels=12, image_dim=20, added_kv_proj_dim=32)
FLF2V_CONFIG = dict(I2V_CONFIG, pos_embed_seq_len=514)
TI2V_CONFIG = dict(
    patch_size=[1, 2, 2],
    num_attention_heads=3,
    attention_head_dim=12,
    in_channels=6,
    out_channels=6,
    text_dim=24,
    freq_dim=32,
    ffn_dim=72,
    num_layers=2,
    cross_attn_norm=True,
    eps=1e-6,
    rope_max_seq_len=32,
)

# model folder (relative to golden/models) -> (config, seed)
MODEL_SPECS = {
    "t2v": (T2V_CONFIG, 1001),
    "i2v": (I2V_CONFIG, 1002),
    "flf2v": (FLF2V_CONFIG, 1003),
    "ti2v": (TI2V_CONFIG, 1004),
    "a14b/transformer": (T2V_CONFIG, 1005),
    "a14b/transformer_2": (T2V_CONFIG, 1006),
}

A14B_BOUNDARY_RATIO = 0.875

log = logging.getLogger("wan_golden")


# --------------------------------------------------------------------------------------------
# Small utilities: paths, RNG, canonical safetensors I/O.
# --------------------------------------------------------------------------------------------


def rel(path: Path) -> str:
    """Repository-relative POSIX path, as recorded in the manifest."""
    return path.resolve().relative_to(REPO).as_posix()


class Rng:
    """A seeded torch generator; every random tensor in the fixtures comes from one of these."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, shape, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        out = torch.randn(tuple(shape), generator=self.gen, dtype=torch.float32) * std
        return out + mean if mean else out


_ST_DTYPES = {
    torch.float64: ("F64", 8),
    torch.float32: ("F32", 4),
    torch.float16: ("F16", 2),
    torch.bfloat16: ("BF16", 2),
    torch.int64: ("I64", 8),
}


def write_safetensors(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes a safetensors file in the canonical layout wanbake's own writer uses.

    Data ordered by (alignment descending, name); header JSON compact with tensor names and
    metadata keys sorted, `__metadata__` first; header padded with spaces to 8 bytes. The
    output is a pure function of (tensors, metadata).
    """
    entries = []
    for name, tensor in tensors.items():
        t = tensor.detach().cpu().contiguous()
        code, size = _ST_DTYPES[t.dtype]
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        entries.append((name, code, size, list(t.shape), raw.numpy().tobytes()))
    entries.sort(key=lambda e: (-e[2], e[0]))
    offsets, cursor = {}, 0
    for name, _, _, _, data in entries:
        offsets[name] = (cursor, cursor + len(data))
        cursor += len(data)
    parts = []
    if metadata:
        meta = {str(k): str(v) for k, v in metadata.items()}
        parts.append('"__metadata__":' + json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    for name, code, _, shape, _ in sorted(entries, key=lambda e: e[0]):
        begin, end = offsets[name]
        shape_json = json.dumps(shape, separators=(",", ":"))
        parts.append(f'{json.dumps(name)}:{{"dtype":"{code}","shape":{shape_json},"data_offsets":[{begin},{end}]}}')
    body = ("{" + ",".join(parts) + "}").encode()
    body += b" " * ((-len(body)) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body)))
        f.write(body)
        for entry in entries:
            f.write(entry[4])


def read_safetensors(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def canonicalize_tool_file(path: Path) -> None:
    """Rewrites a tool-written file whose header metadata has several keys.

    safetensors (Rust) serialises `__metadata__` from a randomly seeded HashMap, so a file with
    two or more metadata keys changes byte order from run to run. Tensor names, dtypes, shapes,
    bytes and metadata values are kept exactly; only the header key order becomes canonical.
    """
    tensors, metadata = read_safetensors(path)
    if len(metadata) <= 1:
        return
    write_safetensors(path, tensors, metadata)
    again, meta_again = read_safetensors(path)
    assert meta_again == metadata and again.keys() == tensors.keys()
    assert all(torch.equal(again[k], tensors[k]) for k in tensors)


def json_dump(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def changed_tensors(merged: dict, base: dict) -> dict:
    """The tensors of `merged` that differ from `base` (keys must agree)."""
    if set(merged) != set(base):
        extra = sorted(set(merged) ^ set(base))
        raise AssertionError(f"merged state dict keys differ from the base: {extra[:8]}")
    return {k: merged[k].detach().clone().contiguous() for k in sorted(merged) if not torch.equal(merged[k], base[k])}


# --------------------------------------------------------------------------------------------
# Models.
# --------------------------------------------------------------------------------------------


def _init_value(name: str, shape, rng: Rng) -> torch.Tensor:
    """Seeded init rule: every parameter non-trivial, activations O(1)."""
    if name.endswith("scale_shift_table") or name.endswith("pos_embed"):
        return rng.normal(shape, 0.1)
    if name.endswith(".bias"):
        return rng.normal(shape, 0.05)
    if len(shape) == 1:  # every 1-D weight is a norm scale (RMSNorm / LayerNorm)
        return rng.normal(shape, 0.1, mean=1.0)
    fan_in = math.prod(shape[1:])
    return rng.normal(shape, 1.0 / math.sqrt(fan_in))


def build_model(config: dict, seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)  # the constructor's own init is overwritten below; seed it anyway
    model = WanTransformer3DModel(**config)
    rng = Rng(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            param.copy_(_init_value(name, param.shape, rng))
    return model.eval()


def load_model(name: str) -> WanTransformer3DModel:
    """A fresh copy of a golden model, loaded the way users load it."""
    return WanTransformer3DModel.from_pretrained(MODELS / name, torch_dtype=torch.float32).eval()


def base_state(name: str) -> dict:
    return {k: v.detach().clone() for k, v in load_model(name).state_dict().items()}


# Net diffusers -> original-Wan rename table (spec wan.md §1.4), one full-match rule per key.
_TO_ORIGINAL = [
    (r"patch_embedding\.(weight|bias)", r"patch_embedding.\1"),
    (r"condition_embedder\.time_embedder\.linear_1\.(weight|bias)", r"time_embedding.0.\1"),
    (r"condition_embedder\.time_embedder\.linear_2\.(weight|bias)", r"time_embedding.2.\1"),
    (r"condition_embedder\.text_embedder\.linear_1\.(weight|bias)", r"text_embedding.0.\1"),
    (r"condition_embedder\.text_embedder\.linear_2\.(weight|bias)", r"text_embedding.2.\1"),
    (r"condition_embedder\.time_proj\.(weight|bias)", r"time_projection.1.\1"),
    (r"condition_embedder\.image_embedder\.norm1\.(weight|bias)", r"img_emb.proj.0.\1"),
    (r"condition_embedder\.image_embedder\.ff\.net\.0\.proj\.(weight|bias)", r"img_emb.proj.1.\1"),
    (r"condition_embedder\.image_embedder\.ff\.net\.2\.(weight|bias)", r"img_emb.proj.3.\1"),
    (r"condition_embedder\.image_embedder\.norm2\.(weight|bias)", r"img_emb.proj.4.\1"),
    (r"condition_embedder\.image_embedder\.pos_embed", r"img_emb.emb_pos"),
    (r"blocks\.(\d+)\.attn1\.to_q\.(weight|bias)", r"blocks.\1.self_attn.q.\2"),
    (r"blocks\.(\d+)\.attn1\.to_k\.(weight|bias)", r"blocks.\1.self_attn.k.\2"),
    (r"blocks\.(\d+)\.attn1\.to_v\.(weight|bias)", r"blocks.\1.self_attn.v.\2"),
    (r"blocks\.(\d+)\.attn1\.to_out\.0\.(weight|bias)", r"blocks.\1.self_attn.o.\2"),
    (r"blocks\.(\d+)\.attn1\.norm_(q|k)\.weight", r"blocks.\1.self_attn.norm_\2.weight"),
    (r"blocks\.(\d+)\.attn2\.to_q\.(weight|bias)", r"blocks.\1.cross_attn.q.\2"),
    (r"blocks\.(\d+)\.attn2\.to_k\.(weight|bias)", r"blocks.\1.cross_attn.k.\2"),
    (r"blocks\.(\d+)\.attn2\.to_v\.(weight|bias)", r"blocks.\1.cross_attn.v.\2"),
    (r"blocks\.(\d+)\.attn2\.to_out\.0\.(weight|bias)", r"blocks.\1.cross_attn.o.\2"),
    (r"blocks\.(\d+)\.attn2\.norm_(q|k)\.weight", r"blocks.\1.cross_attn.norm_\2.weight"),
    (r"blocks\.(\d+)\.attn2\.add_k_proj\.(weight|bias)", r"blocks.\1.cross_attn.k_img.\2"),
    (r"blocks\.(\d+)\.attn2\.add_v_proj\.(weight|bias)", r"blocks.\1.cross_attn.v_img.\2"),
    (r"blocks\.(\d+)\.attn2\.norm_added_k\.weight", r"blocks.\1.cross_attn.norm_k_img.weight"),
    (r"blocks\.(\d+)\.norm2\.(weight|bias)", r"blocks.\1.norm3.\2"),
    (r"blocks\.(\d+)\.ffn\.net\.0\.proj\.(weight|bias)", r"blocks.\1.ffn.0.\2"),
    (r"blocks\.(\d+)\.ffn\.net\.2\.(weight|bias)", r"blocks.\1.ffn.2.\2"),
    (r"blocks\.(\d+)\.scale_shift_table", r"blocks.\1.modulation"),
    (r"proj_out\.(weight|bias)", r"head.head.\1"),
    (r"scale_shift_table", r"head.modulation"),
]


def to_original_key(key: str) -> str:
    hits = [re.fullmatch(p, key) and re.sub(f"^{p}$", r, key) for p, r in _TO_ORIGINAL]
    hits = [h for h in hits if h]
    if len(hits) != 1:
        raise KeyError(f"no unique original-Wan name for diffusers key {key!r}: {hits}")
    return hits[0]


def original_state(diffusers_sd: dict) -> dict:
    return {to_original_key(k): v for k, v in diffusers_sd.items()}


def prove_original_names(name: str, diffusers_sd: dict, original_sd: dict) -> None:
    """diffusers' own converter must map our original-named dict back exactly."""
    for prefix in ("", "model.diffusion_model."):
        converted = convert_wan_transformer_to_diffusers({prefix + k: v for k, v in original_sd.items()})
        if set(converted) != set(diffusers_sd):
            diff = sorted(set(converted) ^ set(diffusers_sd))
            raise AssertionError(f"{name}: diffusers converter disagrees on keys: {diff[:8]}")
        for k, v in diffusers_sd.items():
            if not torch.equal(converted[k], v):
                raise AssertionError(f"{name}: diffusers converter changed tensor {k}")


def write_models(manifest: dict) -> None:
    shapes = {}
    for name, (config, seed) in MODEL_SPECS.items():
        model = build_model(config, seed)
        model.save_pretrained(MODELS / name, safe_serialization=True)
        sd = base_state(name)
        shapes[name] = {
            "config": {k: v for k, v in sorted(config.items())},
            "seed": seed,
            "num_parameters": sum(v.numel() for v in sd.values()),
            "files": [rel(MODELS / name / "config.json"), rel(MODELS / name / "diffusion_pytorch_model.safetensors")],
        }
    for name in ("t2v", "i2v"):
        sd = base_state(name)
        orig = original_state(sd)
        prove_original_names(name, sd, orig)
        write_safetensors(MODELS / f"{name}_original.safetensors", orig)
        shapes[name]["original_names_file"] = rel(MODELS / f"{name}_original.safetensors")
    t2v_orig = original_state(base_state("t2v"))
    write_safetensors(MODELS / "t2v_comfy.safetensors", {f"model.diffusion_model.{k}": v for k, v in t2v_orig.items()})
    shapes["t2v"]["comfy_prefixed_file"] = rel(MODELS / "t2v_comfy.safetensors")
    flf_note = _check_flf2v_single_file_converter()
    json_dump(
        MODELS / "a14b" / "model_index.json",
        {
            "_class_name": "WanPipeline",
            "_diffusers_version": diffusers.__version__,
            "boundary_ratio": A14B_BOUNDARY_RATIO,
            "expand_timesteps": False,
            "scheduler": ["diffusers", "UniPCMultistepScheduler"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "transformer_2": ["diffusers", "WanTransformer3DModel"],
            "vae": ["diffusers", "AutoencoderKLWan"],
        },
    )
    manifest["models"] = {
        "entries": shapes,
        "a14b_model_index": rel(MODELS / "a14b" / "model_index.json"),
        "init_rule": (
            "seeded torch.randn per parameter in sorted-name order: matrices N(0, 1/fan_in), "
            "1-D weights (norm scales) 1 + 0.1 N, biases 0.05 N, scale_shift_table / pos_embed 0.1 N"
        ),
        "original_names_proof": (
            "t2v_original / i2v_original were built by inverting the spec wan.md §1.4 table and fed "
            "(with and without the model.diffusion_model. prefix) through diffusers."
            "loaders.single_file_utils.convert_wan_transformer_to_diffusers; the result equals the "
            "diffusers state dict key for key and bit for bit."
        ),
        "flf2v_single_file_note": flf_note,
    }


def _check_flf2v_single_file_converter() -> str:
    """Records what diffusers' single-file converter does with `img_emb.emb_pos`."""
    probe = convert_wan_transformer_to_diffusers({"img_emb.emb_pos": torch.zeros(1)})
    out = sorted(probe)
    return (
        f"diffusers {diffusers.__version__} convert_wan_transformer_to_diffusers maps "
        f"'img_emb.emb_pos' -> {out}; scripts/convert_wan_to_diffusers.py maps it to "
        "'condition_embedder.image_embedder.pos_embed'"
    )


# --------------------------------------------------------------------------------------------
# PEFT / diffusers helpers.
# --------------------------------------------------------------------------------------------


def _strip_peft_prefix(name: str) -> str:
    return name.removeprefix("base_model.model.")


def lora_layers(model) -> list:
    """(module path without PEFT's wrapper prefix, LoraLayer), sorted by path."""
    out = [(_strip_peft_prefix(n), m) for n, m in model.named_modules() if isinstance(m, LoraLayer) and len(m.lora_A)]
    return sorted(out, key=lambda x: x[0])


def randomize_lora(model, seed: int, *, bias: bool = False, dora: bool = False) -> None:
    """Overwrites PEFT's init (B = 0) with seeded, non-trivial factors (and perturbed magnitudes)."""
    rng = Rng(seed)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            for adapter in sorted(layer.lora_A):
                a = layer.lora_A[adapter].weight
                b = layer.lora_B[adapter].weight
                a.copy_(rng.normal(a.shape, 1.0 / math.sqrt(math.prod(a.shape[1:]))))
                b.copy_(rng.normal(b.shape, 0.2 / math.sqrt(b.shape[1])))
                if bias:
                    lb = layer.lora_B[adapter].bias
                    lb.copy_(rng.normal(lb.shape, 0.05))
                if dora:
                    mag = layer.lora_magnitude_vector[adapter].weight
                    mag.copy_(mag * rng.normal(mag.shape, 0.1, mean=1.0))


def applied_state(model, tool: str, note: str = "") -> tuple[dict, dict]:
    """The PEFT-format adapter a tool ended up holding in its LoRA layers, with the scalings.

    Keys are `<diffusers module path>.lora_A.weight`, `.lora_B.weight`, `.lora_B.bias`,
    `.lora_magnitude_vector`; metadata `scaling` maps module path -> PEFT `scaling` (the factor
    applied to B@A at strength 1), as JSON. Tensors the tool left on the meta device (diffusers
    loads adapters with low_cpu_mem_usage: a parameter absent from the file is never
    materialised and merging it changes nothing) are left out and listed in `meta_skipped`.
    """
    tensors, scaling, skipped = {}, {}, []

    def put(key, tensor):
        if tensor.device.type == "meta":
            skipped.append(key)
        else:
            tensors[key] = tensor.detach().clone()

    for name, layer in lora_layers(model):
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_A:
                continue
            put(f"{name}.lora_A.weight", layer.lora_A[adapter].weight)
            put(f"{name}.lora_B.weight", layer.lora_B[adapter].weight)
            if layer.lora_bias.get(adapter) and layer.lora_B[adapter].bias is not None:
                put(f"{name}.lora_B.bias", layer.lora_B[adapter].bias)
            if adapter in layer.lora_magnitude_vector:
                put(f"{name}.lora_magnitude_vector", layer.lora_magnitude_vector[adapter].weight)
            scaling[name] = float(layer.scaling[adapter])
    metadata = {
        "scaling": json.dumps(scaling, sort_keys=True),
        "tool": tool,
        "layout": "PEFT names on the diffusers module paths; merged W' = W + strength*scaling*B@A (DoRA: PEFT DoRA)",
    }
    if skipped:
        metadata["meta_skipped"] = json.dumps(sorted(skipped))
    if note:
        metadata["note"] = note
    return tensors, metadata


def make_pipe(transformer, transformer_2=None, boundary_ratio=None, shift: float = 3.0) -> WanPipeline:
    """A WanPipeline without VAE / tokenizer / text encoder: enough for LoRA loading and latents."""
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=None,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        transformer=transformer,
        transformer_2=transformer_2,
        boundary_ratio=boundary_ratio,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def peft_merge(base_name: str, adapter_dir: Path, strength: float):
    """PEFT reference: PeftModel.from_pretrained + (scale_layer) + merge_and_unload."""
    model = PeftModel.from_pretrained(load_model(base_name), str(adapter_dir))
    applied = applied_state(model, f"{PEFT_TOOL} PeftModel.from_pretrained")
    if strength != 1.0:
        for _, layer in lora_layers(model):
            layer.scale_layer(strength)
    merged = model.merge_and_unload()
    return merged.state_dict(), applied


def diffusers_fuse(base_names, lora_files, strength: float, *, boundary_ratio=None):
    """diffusers reference: WanPipeline.load_lora_weights (+ load_into_transformer_2) + fuse_lora.

    base_names: model folder per pipeline component ([transformer] or [transformer, transformer_2]);
    lora_files: path per component. Returns (merged state dict per component, applied per component).
    """
    models = [load_model(n) for n in base_names]
    pipe = make_pipe(models[0], models[1] if len(models) > 1 else None, boundary_ratio=boundary_ratio)
    components = ["transformer", "transformer_2"][: len(models)]
    for component, path in zip(components, lora_files):
        kwargs = {"weight_name": path.name}
        if component == "transformer_2":
            kwargs["load_into_transformer_2"] = True
        pipe.load_lora_weights(str(path.parent), **kwargs)
    applied = [applied_state(getattr(pipe, c), f"{DIFFUSERS_TOOL} WanPipeline.load_lora_weights") for c in components]
    pipe.fuse_lora(components=components, lora_scale=strength)
    pipe.unload_lora_weights()
    merged = [getattr(pipe, c).state_dict() for c in components]
    return merged, applied


def try_diffusers_load(base_name: str, path: Path) -> str | None:
    """None when diffusers loads the file; otherwise the exception it raised, as text."""
    pipe = make_pipe(load_model(base_name))
    try:
        pipe.load_lora_weights(str(path.parent), weight_name=path.name)
    except Exception as err:  # the refusal itself is the recorded fact
        return f"{type(err).__name__}: {str(err)[:400]}"
    return None


def save_peft_adapter(model, adapter_dir: Path) -> None:
    model.save_pretrained(str(adapter_dir))
    readme = adapter_dir / "README.md"
    if readme.exists():  # PEFT's boilerplate model card; not part of the adapter
        readme.unlink()


# --------------------------------------------------------------------------------------------
# Hand derivation (float64, ComfyUI semantics: every delta, diffs included, times strength).
# --------------------------------------------------------------------------------------------


class Contribution:
    """One additive delta on one base tensor, as an adapter file describes it."""

    def __init__(self, target: str, kind: str, keys: list, delta: torch.Tensor, scale: float = 1.0):
        self.target = target
        self.kind = kind
        self.keys = sorted(keys)
        self.delta = delta.double() * scale
        self.scale = scale


def lora_delta(down: torch.Tensor, up: torch.Tensor, shape) -> torch.Tensor:
    d = down.double().reshape(down.shape[0], -1)
    u = up.double().reshape(up.shape[0], -1)
    return (u @ d).reshape(shape)


def hand_merge(base: dict, contributions: list, strength: float, targets=None) -> dict:
    out = {}
    for target in sorted({c.target for c in contributions}):
        if targets is not None and target not in targets:
            continue
        total = base[target].double().clone()
        for c in contributions:
            if c.target == target:
                total = total + strength * c.delta
        out[target] = total.float()
    return out


_ORIG_SUFFIX = re.compile(
    r"^(?P<mod>.+?)\.(?P<suf>lora_down\.weight|lora_up\.weight|lora_A\.weight|lora_B\.weight|"
    r"lora_A\.default\.weight|lora_B\.default\.weight|alpha|diff|diff_b)$"
)


def _contributions_from_modules(modules: dict, base: dict, orig_to_diff: dict) -> list:
    """modules: original module name -> {down, up, alpha?, diff?, diff_b?, keys...}."""
    out = []
    for mod, parts in sorted(modules.items()):
        if mod.endswith(".modulation"):
            target = orig_to_diff[mod]
        else:
            target = orig_to_diff.get(f"{mod}.weight")
        if "down" in parts or "up" in parts:
            if not ("down" in parts and "up" in parts) or target is None:
                raise KeyError(f"incomplete LoRA or unknown module {mod}")
            down, up = parts["down"], parts["up"]
            alpha = parts.get("alpha")
            scale = float(alpha) / down.shape[0] if alpha is not None else 1.0
            out.append(Contribution(target, "lora", parts["lora_keys"], lora_delta(down, up, base[target].shape), scale))
        if "diff" in parts:
            if target is None:
                raise KeyError(f"diff on unknown module {mod}")
            diff = parts["diff"].double().reshape(base[target].shape)
            out.append(Contribution(target, "diff_m" if mod.endswith(".modulation") else "diff", [parts["diff_key"]], diff))
        if "diff_b" in parts:
            btarget = orig_to_diff[f"{mod}.bias"]
            out.append(Contribution(btarget, "diff_b", [parts["diff_b_key"]], parts["diff_b"].double()))
    return out


def parse_original_lora(tensors: dict, base: dict, prefix: str = "diffusion_model.") -> list:
    """Independent parser for original-Wan / ComfyUI / diffusion-pipe spelled LoRA files."""
    orig_to_diff = {to_original_key(k): k for k in base}
    modules: dict = {}
    for key, value in tensors.items():
        if not key.startswith(prefix):
            raise KeyError(f"{key}: missing prefix {prefix!r}")
        name = key[len(prefix):]
        m = re.fullmatch(r"(blocks\.\d+)\.diff_m", name)
        if m:
            parts = modules.setdefault(f"{m.group(1)}.modulation", {})
            parts["diff"], parts["diff_key"] = value, key
            continue
        m = _ORIG_SUFFIX.match(name)
        if not m:
            raise KeyError(f"{key}: not an original-Wan LoRA key")
        parts = modules.setdefault(m.group("mod"), {"lora_keys": []})
        parts.setdefault("lora_keys", [])
        suf = m.group("suf")
        if suf in ("lora_down.weight", "lora_A.weight", "lora_A.default.weight"):
            parts["down"] = value
            parts["lora_keys"].append(key)
        elif suf in ("lora_up.weight", "lora_B.weight", "lora_B.default.weight"):
            parts["up"] = value
            parts["lora_keys"].append(key)
        elif suf == "alpha":
            parts["alpha"] = value
            parts["lora_keys"].append(key)
        elif suf == "diff":
            parts["diff"], parts["diff_key"] = value, key
        else:
            parts["diff_b"], parts["diff_b_key"] = value, key
    return _contributions_from_modules(modules, base, orig_to_diff)


def parse_kohya_lora(tensors: dict, base: dict, prefix: str = "lora_unet_") -> list:
    """Independent kohya/musubi parser: aliases built from the base's own module names."""
    orig_to_diff = {to_original_key(k): k for k in base}
    alias = {}
    for orig in orig_to_diff:
        if orig.endswith(".weight"):
            mod = orig[: -len(".weight")]
            alias[prefix + mod.replace(".", "_")] = mod
    modules: dict = {}
    for key, value in tensors.items():
        stem, _, suffix = key.partition(".")
        if stem not in alias:
            raise KeyError(f"{key}: no base module for kohya name {stem!r}")
        parts = modules.setdefault(alias[stem], {"lora_keys": []})
        parts["lora_keys"].append(key)
        if suffix == "lora_down.weight":
            parts["down"] = value
        elif suffix == "lora_up.weight":
            parts["up"] = value
        elif suffix == "alpha":
            parts["alpha"] = value
        else:
            raise KeyError(f"{key}: unsupported kohya suffix {suffix!r}")
    return _contributions_from_modules(modules, base, orig_to_diff)


def find_dropped(base: dict, contributions: list, merged: dict, strength: float) -> list:
    """Which contributions the reference tool did not apply, found from its output.

    For every target, the largest subset of its contributions whose sum reproduces the tool's
    merged tensor (float64 hand sum vs tool, rtol 1e-5 / atol 1e-6) is taken as applied; the
    rest are dropped. A target the tool changed without any contribution is an error.
    """
    ref = changed_tensors(merged, base)
    targets = {c.target for c in contributions}
    stray = sorted(set(ref) - targets)
    if stray:
        raise AssertionError(f"reference changed tensors no adapter entry targets: {stray}")
    dropped = []
    for target in sorted(targets):
        cs = [c for c in contributions if c.target == target]
        observed = merged[target].double()
        found = None
        for size in range(len(cs), -1, -1):
            for subset in itertools.combinations(cs, size):
                pred = base[target].double() + strength * sum((c.delta for c in subset), torch.zeros_like(observed))
                if torch.allclose(pred, observed, rtol=1e-5, atol=1e-6):
                    found = subset
                    break
            if found is not None:
                break
        if found is None:
            raise AssertionError(f"{target}: the reference result matches no subset of the adapter's deltas")
        dropped.extend(c for c in cs if c not in found)
    return dropped


def dropped_entries(dropped: list) -> list:
    rows = [{"key": k, "kind": c.kind, "target": c.target} for c in dropped for k in c.keys]
    return sorted(rows, key=lambda r: r["key"])


# --------------------------------------------------------------------------------------------
# Writing references and manifest entries.
# --------------------------------------------------------------------------------------------


def _strength_tag(strength: float) -> str:
    return "" if strength == 1.0 else f"__s{strength:g}"


def write_reference(stem: str, tensors: dict, strength: float, tool: str, kind: str = "reference") -> Path:
    path = REFS / f"{stem}{_strength_tag(strength)}.safetensors"
    meta = {"case": stem, "strength": f"{strength:g}", "tool": tool, "kind": kind, "dtype_note": "f32"}
    write_safetensors(path, tensors, meta)
    return path


def write_applied(stem: str, applied: tuple) -> Path:
    path = REFS / f"{stem}__applied.safetensors"
    write_safetensors(path, applied[0], applied[1])
    return path


HAND_SEMANTICS = (
    "ComfyUI semantics (spec wan.md §5.4, conventions.md §5.3): W' = W + strength*(alpha/r*up@down + diff), "
    "b' = b + strength*diff_b, modulation' = modulation + strength*diff_m; alpha absent => scale 1; "
    "computed in float64 from the adapter file's tensors, rounded once to f32"
)


def write_handderived(stem: str, base: dict, contributions: list, strength: float, targets) -> Path:
    path = REFS / f"{stem}__handderived{_strength_tag(strength)}.safetensors"
    tensors = hand_merge(base, contributions, strength, targets)
    meta = {"case": stem, "strength": f"{strength:g}", "kind": "handderived", "semantics": HAND_SEMANTICS}
    write_safetensors(path, tensors, meta)
    return path


def check_against_applied(base: dict, applied: tuple, ref: dict, strength: float) -> None:
    """Recomputes the tool's merge from what it applied (float64) and compares with its output.

    Proves our reading of the tool: W' = W + strength*scaling*B@A (+ bias), DoRA with the
    strength inside the norm. A disagreement stops the generator.
    """
    tensors, meta = applied
    scaling = json.loads(meta["scaling"])
    expect = {}
    for mod, s in scaling.items():
        w = base[f"{mod}.weight"].double()
        a, b = tensors.get(f"{mod}.lora_A.weight"), tensors.get(f"{mod}.lora_B.weight")
        if a is not None and b is not None:
            merged = w + strength * s * lora_delta(a, b, w.shape)
            mag = tensors.get(f"{mod}.lora_magnitude_vector")
            if mag is not None:
                norm = merged.reshape(merged.shape[0], -1).norm(dim=1)
                merged = (mag.double().reshape(-1) / norm).reshape(-1, *([1] * (w.dim() - 1))) * merged
            expect[f"{mod}.weight"] = merged
        lb = tensors.get(f"{mod}.lora_B.bias")
        if lb is not None and lb.abs().max() > 0:
            expect[f"{mod}.bias"] = base[f"{mod}.bias"].double() + strength * s * lb.double()
    changed = {k for k, v in expect.items() if not torch.equal(v.float(), base[k])}
    if set(ref) != changed:
        raise AssertionError(f"tool changed {sorted(set(ref) ^ changed)[:6]} unlike its applied adapter")
    for k in ref:
        if not torch.allclose(ref[k].double(), expect[k], rtol=1e-5, atol=1e-6):
            err = (ref[k].double() - expect[k]).abs().max().item()
            raise AssertionError(f"{k}: tool merge differs from W + s*B@A by {err}")


def case_entry(manifest: dict, case: str, **fields) -> None:
    entry = {"case": case, "dropped_by_reference": [], "handderived": None, "notes": ""}
    entry.update(fields)
    manifest.setdefault("cases", {})[case] = entry


# --------------------------------------------------------------------------------------------
# PEFT-format cases (adapter written by PEFT's own save_pretrained).
# --------------------------------------------------------------------------------------------


def peft_case(manifest, case, base_name, config: LoraConfig, seed, strengths, *, bias=False, dora=False, notes=""):
    adapter_dir = ADAPTERS / case
    model = get_peft_model(load_model(base_name), config)
    randomize_lora(model, seed, bias=bias, dora=dora)
    save_peft_adapter(model, adapter_dir)
    base = base_state(base_name)
    per_strength = {}
    applied_path = None
    for strength in strengths:
        merged, applied = peft_merge(base_name, adapter_dir, strength)
        ref = changed_tensors(merged, base)
        check_against_applied(base, applied, ref, strength)
        tool = f"{PEFT_TOOL} PeftModel.from_pretrained + merge_and_unload"
        if strength != 1.0:
            tool = f"{PEFT_TOOL} PeftModel.from_pretrained + LoraLayer.scale_layer({strength:g}) + merge_and_unload"
        path = write_reference(case, ref, strength, tool)
        per_strength[f"{strength:g}"] = {"reference": rel(path), "handderived": None, "tool": tool}
        if strength == 1.0:
            applied_path = write_applied(case, applied)
    case_entry(
        manifest,
        case,
        convention="peft",
        base=rel(MODELS / base_name),
        adapter=[rel(adapter_dir / "adapter_config.json"), rel(adapter_dir / "adapter_model.safetensors")],
        strengths=per_strength,
        applied=rel(applied_path),
        reference_tool=f"{PEFT_TOOL} merge_and_unload",
        notes=notes,
    )


PEFT_PLAIN_TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "ffn.net.0.proj",
    "ffn.net.2",
    "proj_out",
    "condition_embedder.time_proj",
]


def peft_cases(manifest: dict) -> None:
    strength_note = (
        "strength 0.5 = PEFT LoraLayer.scale_layer(0.5) on every LoRA layer, then merge_and_unload; "
        "this is exactly what diffusers fuse_lora(lora_scale=0.5) does per layer (_fuse_lora_apply)"
    )
    peft_case(
        manifest,
        "peft_plain",
        "t2v",
        LoraConfig(r=4, lora_alpha=8, target_modules=PEFT_PLAIN_TARGETS),
        2001,
        [1.0, 0.5],
        notes="r=4, lora_alpha=8 (scaling 2) on attn1/attn2 q,k,v,out, ffn, proj_out, time_proj. " + strength_note,
    )
    peft_case(
        manifest,
        "peft_rslora_pattern",
        "t2v",
        LoraConfig(
            r=4,
            lora_alpha=6,
            use_rslora=True,
            target_modules=["to_q", "to_v", "ffn.net.0.proj", "ffn.net.2", "patch_embedding"],
            rank_pattern={"blocks.1.attn1.to_q": 8, "ffn.net.2": 2},
            alpha_pattern={"ffn.net.2": 4, "patch_embedding": 10},
        ),
        2002,
        [1.0],
        notes=(
            "use_rslora: scaling = alpha/sqrt(r). rank_pattern blocks.1.attn1.to_q -> r 8 (alpha 6), "
            "ffn.net.2 -> r 2 with alpha_pattern 4; patch_embedding is a Conv3d LoRA "
            "(lora_A (r, C_in, 1, 2, 2), lora_B (D, r, 1, 1, 1)) with alpha 10. Per-module ranks come "
            "from tensor shapes, per-module alphas only from adapter_config.json."
        ),
    )
    peft_case(
        manifest,
        "peft_dora",
        "t2v",
        LoraConfig(r=4, lora_alpha=8, use_dora=True, target_modules=["to_q", "to_v", "to_out.0", "ffn.net.0.proj", "proj_out"]),
        2003,
        [1.0, 0.5],
        dora=True,
        notes=(
            "DoRA (magnitudes perturbed by 1+0.1N after PEFT's init). PEFT merge: "
            "W' = m/||W + strength*s*B@A||_row * (W + strength*s*B@A) - the strength sits inside the "
            "norm (spec conventions.md §1.1, PEFT/diffusers row). " + strength_note
        ),
    )
    peft_case(
        manifest,
        "peft_bias",
        "t2v",
        LoraConfig(r=4, lora_alpha=4, lora_bias=True, target_modules=["to_k", "ffn.net.2", "proj_out", "condition_embedder.time_proj"]),
        2004,
        [1.0],
        bias=True,
        notes="lora_bias=True: adapter carries lora_B.bias; merge b' = b + scaling*lora_B.bias (scaling 1 here).",
    )
    peft_case(
        manifest,
        "peft_i2v",
        "i2v",
        LoraConfig(
            r=4,
            lora_alpha=4,
            target_modules=["to_q", "add_k_proj", "add_v_proj", "condition_embedder.image_embedder.ff.net.0.proj", "ffn.net.0.proj"],
        ),
        2011,
        [1.0],
        notes="I2V-only modules: attn2.add_k_proj / add_v_proj and the image embedder's ff.net.0.proj.",
    )


# --------------------------------------------------------------------------------------------
# diffusers-native LoRA (written by WanPipeline.save_lora_weights).
# --------------------------------------------------------------------------------------------


def diffusers_lora_cases(manifest: dict) -> None:
    model = load_model("t2v")
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj"])
    model.add_adapter(config)
    randomize_lora(model, 2005)
    layers = get_peft_model_state_dict(model)
    metadata = model.peft_config["default"].to_dict()
    base = base_state("t2v")
    for case, meta, strengths in (("diffusers_lora", metadata, [1.0]), ("diffusers_lora_nometa", None, [1.0])):
        adapter_dir = ADAPTERS / case
        WanPipeline.save_lora_weights(
            str(adapter_dir), transformer_lora_layers=dict(layers), transformer_lora_adapter_metadata=meta and dict(meta)
        )
        adapter = adapter_dir / "pytorch_lora_weights.safetensors"
        canonicalize_tool_file(adapter)
        per_strength, applied_path = {}, None
        for strength in strengths:
            merged, applied = diffusers_fuse(["t2v"], [adapter], strength)
            ref = changed_tensors(merged[0], base)
            check_against_applied(base, applied[0], ref, strength)
            expect_scale = 4.0 if meta else 1.0
            scales = set(json.loads(applied[0][1]["scaling"]).values())
            assert scales == {expect_scale}, (case, scales)
            tool = f"{DIFFUSERS_TOOL} load_lora_weights + fuse_lora(lora_scale={strength:g})"
            path = write_reference(case, ref, strength, tool)
            per_strength[f"{strength:g}"] = {"reference": rel(path), "handderived": None, "tool": tool}
            if strength == 1.0:
                applied_path = write_applied(case, applied[0])
        case_entry(
            manifest,
            case,
            convention="diffusers",
            base=rel(MODELS / "t2v"),
            adapter=[rel(adapter)],
            strengths=per_strength,
            applied=rel(applied_path),
            reference_tool=f"{DIFFUSERS_TOOL} WanPipeline.load_lora_weights + fuse_lora",
            notes=(
                "keys transformer.<diffusers path>.lora_A/B.weight, r=4, lora_alpha=16. "
                + (
                    "Header metadata lora_adapter_metadata (JSON of the PEFT LoraConfig, as "
                    "save_lora_weights writes it) carries alpha: diffusers applies scaling 16/4 = 4."
                    if meta
                    else "Same tensors with no lora_adapter_metadata: diffusers infers lora_alpha = r, so "
                    "scaling 1 (alpha treated as folded)."
                )
                + " The file was re-serialised with a sorted header (safetensors writes multi-key "
                "metadata in random order); tensors and metadata values are untouched."
            ),
        )


# --------------------------------------------------------------------------------------------
# Convention-written cases: ComfyUI / original-Wan, diffusion-pipe, kohya / musubi, Wan-Fun.
# --------------------------------------------------------------------------------------------

_SPELLINGS = {
    "updown": ("lora_down.weight", "lora_up.weight"),
    "AB": ("lora_A.weight", "lora_B.weight"),
    "AB.default": ("lora_A.default.weight", "lora_B.default.weight"),
}


def build_original_lora(orig_shapes: dict, spec: list, seed: int, prefix: str = "diffusion_model.") -> dict:
    """Seeded adapter tensors under original-Wan names, following `spec` entries:

    ("lora", module, rank, alpha or None, spelling), ("diff", module, std), ("diff_b", module),
    ("diff_m", block index). Linear factors: down (r, in) ~ N/sqrt(in), up (out, r) ~ 0.2 N/sqrt(r).
    """
    rng = Rng(seed)
    out = {}
    for entry in spec:
        kind, mod = entry[0], entry[1]
        if kind == "lora":
            _, _, rank, alpha, spelling = entry
            w_shape = orig_shapes[f"{mod}.weight"]
            fan_in = math.prod(w_shape[1:])
            down_name, up_name = _SPELLINGS[spelling]
            out[f"{prefix}{mod}.{down_name}"] = rng.normal((rank, *w_shape[1:]), 1.0 / math.sqrt(fan_in))
            out[f"{prefix}{mod}.{up_name}"] = rng.normal((w_shape[0], rank), 0.2 / math.sqrt(rank))
            if alpha is not None:
                out[f"{prefix}{mod}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
        elif kind == "diff":
            out[f"{prefix}{mod}.diff"] = rng.normal(orig_shapes[f"{mod}.weight"], entry[2])
        elif kind == "diff_b":
            out[f"{prefix}{mod}.diff_b"] = rng.normal(orig_shapes[f"{mod}.bias"], 0.05)
        elif kind == "diff_m":
            out[f"{prefix}blocks.{mod}.diff_m"] = rng.normal(orig_shapes[f"blocks.{mod}.modulation"], 0.05)
        else:
            raise ValueError(entry)
    return out


def original_shapes(base_name: str) -> dict:
    return {k: tuple(v.shape) for k, v in original_state(base_state(base_name)).items()}


def to_kohya(original_named: dict, prefix: str) -> dict:
    """Renames `<module>.<suffix>` (no prefix, lora_down/lora_up/alpha) to kohya spelling."""
    out = {}
    for key, value in original_named.items():
        m = re.fullmatch(r"(.+?)\.(lora_down\.weight|lora_up\.weight|alpha)", key)
        out[f"{prefix}{m.group(1).replace('.', '_')}.{m.group(2)}"] = value
    return out


def diffusers_reference_run(case, base_name, adapter, contributions, strengths, base):
    """Loads a convention-written file through diffusers at each strength; records drops."""
    per_strength, applied_path, drop_rows = {}, None, None
    for strength in strengths:
        merged, applied = diffusers_fuse([base_name], [adapter], strength)
        ref = changed_tensors(merged[0], base)
        check_against_applied(base, applied[0], ref, strength)
        dropped = find_dropped(base, contributions, merged[0], strength)
        rows = dropped_entries(dropped)
        if drop_rows is not None and rows != drop_rows:
            raise AssertionError(f"{case}: dropped entries depend on the strength")
        drop_rows = rows
        tool = f"{DIFFUSERS_TOOL} WanLoraLoaderMixin.lora_state_dict conversion + load_lora_weights + fuse_lora(lora_scale={strength:g})"
        path = write_reference(case, ref, strength, tool)
        hand = None
        if dropped:
            hand = rel(write_handderived(case, base, contributions, strength, {c.target for c in dropped}))
        per_strength[f"{strength:g}"] = {"reference": rel(path), "handderived": hand, "tool": tool}
        if strength == 1.0:
            applied_path = write_applied(case, applied[0])
    return per_strength, applied_path, drop_rows


def convention_case(manifest, case, base_name, tensors, strengths, *, convention, parser, notes, filename=None):
    adapter = ADAPTERS / case / (filename or f"{case}.safetensors")
    write_safetensors(adapter, tensors)
    file_tensors, _ = read_safetensors(adapter)
    base = base_state(base_name)
    contributions = parser(file_tensors, base)
    refusal = try_diffusers_load(base_name, adapter)
    entry = dict(convention=convention, base=rel(MODELS / base_name), adapter=[rel(adapter)], notes=notes)
    if refusal is None:
        per_strength, applied_path, rows = diffusers_reference_run(case, base_name, adapter, contributions, strengths, base)
        entry.update(
            strengths=per_strength,
            applied=rel(applied_path),
            reference_tool=f"{DIFFUSERS_TOOL} (WanLoraLoaderMixin conversion, fuse_lora)",
            dropped_by_reference=rows,
            handderived=per_strength["1"]["handderived"],
        )
        if rows:
            entry["handderived_rule"] = (
                "for every target listed in dropped_by_reference the __handderived file holds the full "
                "ComfyUI-semantics value (all of the file's deltas on that tensor); the diffusers "
                "reference holds what diffusers produced without the dropped entries"
            )
    else:
        per_strength = {}
        for strength in strengths:
            hand = write_handderived(case, base, contributions, strength, None)
            per_strength[f"{strength:g}"] = {"reference": None, "handderived": rel(hand), "tool": "hand-derived"}
        entry.update(
            strengths=per_strength,
            applied=None,
            reference_tool="hand-derived (float64); diffusers refused the file",
            reference_refusal=refusal,
            handderived=per_strength["1"]["handderived"],
        )
    case_entry(manifest, case, **entry)
    return base, contributions, refusal


COMFY_LORA_SPEC = [
    ("lora", "blocks.0.self_attn.q", 4, 2.0, "updown"),
    ("lora", "blocks.0.self_attn.k", 4, 8.0, "updown"),
    ("lora", "blocks.0.self_attn.v", 4, None, "updown"),
    ("lora", "blocks.0.self_attn.o", 4, 1.0, "updown"),
    ("lora", "blocks.1.self_attn.q", 4, None, "updown"),
    ("lora", "blocks.1.self_attn.k", 4, None, "updown"),
    ("lora", "blocks.0.cross_attn.q", 4, 2.0, "updown"),
    ("lora", "blocks.0.cross_attn.k", 4, None, "updown"),
    ("lora", "blocks.0.cross_attn.v", 4, None, "updown"),
    ("lora", "blocks.0.cross_attn.o", 4, 3.0, "updown"),
    ("lora", "blocks.2.cross_attn.k", 2, 6.0, "updown"),
    ("lora", "blocks.2.cross_attn.v", 4, None, "updown"),
    ("lora", "blocks.1.ffn.0", 4, 2.0, "updown"),
    ("lora", "blocks.1.ffn.2", 4, None, "updown"),
    ("lora", "blocks.2.ffn.0", 4, None, "updown"),
    ("lora", "blocks.2.ffn.2", 4, 4.0, "updown"),
    ("lora", "time_projection.1", 4, None, "updown"),
    ("lora", "text_embedding.0", 4, None, "updown"),
    ("lora", "head.head", 4, None, "updown"),
    ("diff_b", "blocks.0.self_attn.q"),
    ("diff_b", "blocks.1.ffn.2"),
    ("diff_b", "blocks.2.cross_attn.o"),
    ("diff_b", "time_projection.1"),
    ("diff_b", "text_embedding.0"),
    ("diff_b", "head.head"),
    ("diff", "head.head", 0.05),
    ("diff", "blocks.0.norm3", 0.1),
    ("diff_b", "blocks.0.norm3"),
    ("diff", "blocks.1.self_attn.norm_q", 0.1),
    ("diff_m", 2),
    ("diff", "patch_embedding", 0.05),
    ("diff_b", "patch_embedding"),
]

COMFY_AB_SPEC = [
    ("lora", "blocks.0.self_attn.q", 4, None, "AB"),
    ("lora", "blocks.0.ffn.2", 4, None, "AB"),
    ("lora", "blocks.1.cross_attn.v", 4, None, "AB"),
    ("lora", "blocks.1.self_attn.o", 4, None, "AB.default"),
    ("lora", "blocks.2.ffn.0", 8, None, "AB"),
]

KOHYA_MODULES = ["self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
                 "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2"]
KOHYA_ALPHAS = [1.0, 2.0, 4.0, 8.0, 3.0]
WANFUN_SUBSET = ["blocks.0.self_attn.q", "blocks.0.cross_attn.k", "blocks.1.ffn.0", "blocks.2.self_attn.o"]

COMFY_I2V_SPEC = [
    ("lora", "blocks.0.cross_attn.k_img", 4, 2.0, "updown"),
    ("lora", "blocks.0.cross_attn.v_img", 4, None, "updown"),
    ("diff_b", "blocks.0.cross_attn.v_img"),
    ("lora", "blocks.1.cross_attn.k_img", 4, None, "updown"),
    ("lora", "blocks.1.cross_attn.v_img", 4, 8.0, "updown"),
    ("lora", "blocks.0.self_attn.q", 4, None, "updown"),
    ("lora", "blocks.1.cross_attn.q", 4, 4.0, "updown"),
    ("lora", "img_emb.proj.1", 4, None, "updown"),
    ("diff_b", "img_emb.proj.1"),
    ("diff", "blocks.0.cross_attn.norm_k_img", 0.1),
    ("diff", "img_emb.proj.0", 0.1),
    ("diff_b", "blocks.1.ffn.0"),
]

A14B_HIGH_SPEC = [("lora", f"blocks.{i}.self_attn.{m}", 4, 2.0 if m in "qk" else None, "updown")
                  for i in range(3) for m in "qkvo"] + [("lora", "blocks.1.ffn.0", 4, None, "updown")]
A14B_LOW_SPEC = [("lora", f"blocks.{i}.cross_attn.{m}", 4, 4.0 if m == "v" else None, "updown")
                 for i in range(3) for m in "qkvo"] + [("lora", "blocks.2.ffn.2", 4, 4.0, "updown")]

MISMATCH_SPEC = [
    ("lora", "blocks.0.self_attn.q", 4, 4.0, "updown"),
    ("lora", "blocks.0.cross_attn.k", 4, 4.0, "updown"),
    ("lora", "blocks.1.ffn.0", 4, None, "updown"),
    ("diff_b", "blocks.0.self_attn.q"),
]


def diffusers_probes(manifest: dict) -> None:
    """Spec claims about diffusers' WAN converter that no fixture exercises; checked live, no files kept."""
    import tempfile

    shapes = original_shapes("t2v")
    q = ("lora", "blocks.0.self_attn.q", 4, None, "updown")
    probes = {
        "alpha_on_non_block_module (time_projection.1.alpha)": build_original_lora(shapes, [("lora", "time_projection.1", 4, 2.0, "updown"), q], 5001),
        "lora_on_patch_embedding": build_original_lora(shapes, [q], 5002),
        "head.head.diff_without_diff_b": build_original_lora(shapes, [("diff", "head.head", 0.05), q], 5003),
    }
    rng = Rng(5004)
    probes["lora_on_patch_embedding"]["diffusion_model.patch_embedding.lora_down.weight"] = rng.normal((4, 4, 1, 2, 2), 0.25)
    probes["lora_on_patch_embedding"]["diffusion_model.patch_embedding.lora_up.weight"] = rng.normal((32, 4, 1, 1, 1), 0.1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tensors in sorted(probes.items()):
            path = Path(tmp) / "probe.safetensors"
            write_safetensors(path, tensors)
            results[name] = try_diffusers_load("t2v", path) or "loaded"
    manifest["diffusers_probes"] = results


def comfy_cases(manifest: dict) -> None:
    t2v_shapes = original_shapes("t2v")
    comfy = build_original_lora(t2v_shapes, COMFY_LORA_SPEC, 3001)
    convention_case(
        manifest, "comfy_lora", "t2v", comfy, [1.0, 0.5], convention="comfy", parser=parse_original_lora,
        notes=(
            "ORIGINAL-Wan names with the diffusion_model. prefix; lora_down/lora_up with .alpha on some block "
            "modules only (diffusers' converter honours alpha only inside blocks and raises on others); "
            "diff_b on several biases, full diffs on norms (blocks.0.norm3, blocks.1.self_attn.norm_q), "
            "blocks.2.diff_m, head.head.diff (+ head.head LoRA and diff_b), patch_embedding.diff/.diff_b. "
            "blocks.2.cross_attn.o has only a diff_b: diffusers then makes a PEFT layer whose lora_A is "
            "PEFT's (seeded) random init and lora_B zero, so only the bias moves."
        ),
    )
    ab = build_original_lora(t2v_shapes, COMFY_AB_SPEC, 3002)
    _, contributions, refusal = convention_case(
        manifest, "comfy_lora_ab", "t2v", ab, [1.0], convention="diffusion-pipe", parser=parse_original_lora,
        notes=(
            "diffusion_model.<original>.lora_A/lora_B.weight (diffusion-pipe spelling, no alpha => scale 1) "
            "plus blocks.1.self_attn.o spelled lora_A.default.weight / lora_B.default.weight (DiffSynth/PEFT "
            "infix); blocks.2.ffn.0 has rank 8."
        ),
    )
    if refusal is not None:
        _normalized_crosscheck(manifest, "comfy_lora_ab", "t2v", ab, contributions)
    kohya_cases(manifest, t2v_shapes)
    i2v = build_original_lora(original_shapes("i2v"), COMFY_I2V_SPEC, 3005)
    convention_case(
        manifest, "comfy_i2v", "i2v", i2v, [1.0], convention="comfy", parser=parse_original_lora,
        notes=(
            "I2V original names: cross_attn.k_img / v_img LoRA (+ v_img.diff_b), img_emb.proj.1 LoRA + diff_b, "
            "cross_attn.norm_k_img.diff and img_emb.proj.0.diff (LayerNorm weight), blocks.1.ffn.0.diff_b "
            "without a LoRA."
        ),
    )
    a14b_case(manifest)
    mismatch_case(manifest)
    diffusers_probes(manifest)


def _normalized_crosscheck(manifest, case, base_name, tensors, contributions) -> None:
    """diffusers refused the file; load the same data with the `.default.` infix removed.

    The hand-derived values must equal what diffusers produces for that normalised copy, and the
    PEFT dict diffusers applied to it is written as `__applied` (with a note saying so).
    """
    import tempfile

    normalized = {k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v for k, v in tensors.items()}
    base = base_state(base_name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "normalized.safetensors"
        write_safetensors(path, normalized)
        merged, applied = diffusers_fuse([base_name], [path], 1.0)
    ref = changed_tensors(merged[0], base)
    hand = hand_merge(base, contributions, 1.0)
    assert set(ref) == set(hand), (case, sorted(set(ref) ^ set(hand)))
    for k in ref:
        assert torch.allclose(ref[k].double(), hand[k].double(), rtol=1e-5, atol=1e-6), (case, k)
    tensors_applied, meta = applied[0]
    meta = dict(meta, note="diffusers refused the file; this is what it applied after the .lora_X.default. infix was removed")
    path = write_applied(case, (tensors_applied, meta))
    entry = manifest["cases"][case]
    entry["applied"] = rel(path)
    entry["crosscheck"] = (
        "hand-derived values equal diffusers' fuse_lora result (rtol 1e-5) on a copy with the "
        ".default. infix removed"
    )


def kohya_cases(manifest: dict, t2v_shapes: dict) -> None:
    spec = [("lora", f"blocks.{i}.{m}", 4, KOHYA_ALPHAS[(i * len(KOHYA_MODULES) + j) % len(KOHYA_ALPHAS)], "updown")
            for i in range(3) for j, m in enumerate(KOHYA_MODULES)]
    plain = build_original_lora(t2v_shapes, spec, 3003, prefix="")
    kohya = to_kohya(plain, "lora_unet_")
    convention_case(
        manifest, "kohya_lora", "t2v", kohya, [1.0], convention="kohya",
        parser=lambda t, b: parse_kohya_lora(t, b, "lora_unet_"),
        notes=(
            "musubi-tuner spelling lora_unet_blocks_N_<module>.lora_down/lora_up/alpha for every block's "
            "self/cross q,k,v,o and ffn_0/ffn_2 (diffusers' musubi converter pops all of them and needs every "
            "alpha); alphas cycle 1,2,4,8,3 at r=4."
        ),
    )
    subset = {k: v for k, v in plain.items() if any(k.startswith(m + ".") for m in WANFUN_SUBSET)}
    wanfun = to_kohya(subset, "lora_unet__")
    base, contributions, refusal = convention_case(
        manifest, "kohya_wanfun", "t2v", wanfun, [1.0], convention="wanfun",
        parser=lambda t, b: parse_kohya_lora(t, b, "lora_unet__"),
        notes=(
            "Wan/VideoX-Fun spelling lora_unet__blocks_... (double underscore); the tensors are exactly "
            f"kohya_lora's for {', '.join(WANFUN_SUBSET)}."
        ),
    )
    if refusal is None:
        raise AssertionError("diffusers unexpectedly loaded the Wan-Fun file; revisit kohya_wanfun")
    kohya_ref, _ = read_safetensors(REFS / "kohya_lora.safetensors")
    hand = hand_merge(base, contributions, 1.0)
    for k, v in hand.items():
        assert torch.allclose(v.double(), kohya_ref[k].double(), rtol=1e-5, atol=1e-6), k
    applied, meta = read_safetensors(REFS / "kohya_lora__applied.safetensors")
    diff_mods = {to_diffusers_module(m) for m in WANFUN_SUBSET}
    sub = {k: v for k, v in applied.items() if k.rsplit(".lora_", 1)[0] in diff_mods}
    scaling = {m: s for m, s in json.loads(meta["scaling"]).items() if m in diff_mods}
    meta = dict(meta, scaling=json.dumps(scaling, sort_keys=True),
                note="diffusers refused this file; these are the entries it applied for the same modules when loading kohya_lora")
    path = write_applied("kohya_wanfun", (sub, meta))
    entry = manifest["cases"]["kohya_wanfun"]
    entry["applied"] = rel(path)
    entry["crosscheck"] = "hand-derived values equal references/kohya_lora.safetensors on these targets (rtol 1e-5)"


def to_diffusers_module(original_module: str) -> str:
    return {to_original_key(k): k for k in base_state("t2v")}[f"{original_module}.weight"].removesuffix(".weight")


def a14b_case(manifest: dict) -> None:
    case = "a14b_pair"
    shapes = original_shapes("a14b/transformer")
    files = {"high": ADAPTERS / case / "high.safetensors", "low": ADAPTERS / case / "low.safetensors"}
    write_safetensors(files["high"], build_original_lora(shapes, A14B_HIGH_SPEC, 3006))
    write_safetensors(files["low"], build_original_lora(shapes, A14B_LOW_SPEC, 3007))
    experts = ["a14b/transformer", "a14b/transformer_2"]
    bases = [base_state(e) for e in experts]
    merged, applied = diffusers_fuse(experts, [files["high"], files["low"]], 1.0, boundary_ratio=A14B_BOUNDARY_RATIO)
    per_expert = {}
    for expert, component, base, m, app, key in zip(experts, ["transformer", "transformer_2"], bases, merged, applied, ["high", "low"]):
        contributions = parse_original_lora(read_safetensors(files[key])[0], base)
        dropped = find_dropped(base, contributions, m, 1.0)
        assert not dropped, dropped
        ref = changed_tensors(m, base)
        check_against_applied(base, app, ref, 1.0)
        stem = f"{case}__{component}"
        path = write_reference(stem, ref, 1.0, f"{DIFFUSERS_TOOL} load_lora_weights(load_into_transformer_2={component == 'transformer_2'}) + fuse_lora")
        per_expert[component] = {
            "base": rel(MODELS / expert),
            "adapter": rel(files[key]),
            "reference": rel(path),
            "applied": rel(write_applied(stem, app)),
        }
    case_entry(
        manifest,
        case,
        convention="comfy",
        base=rel(MODELS / "a14b"),
        adapter=[rel(files["high"]), rel(files["low"])],
        strengths={"1": {"reference": [per_expert["transformer"]["reference"], per_expert["transformer_2"]["reference"]],
                         "handderived": None, "tool": f"{DIFFUSERS_TOOL} fuse_lora(components=[transformer, transformer_2])"}},
        experts=per_expert,
        applied=[per_expert["transformer"]["applied"], per_expert["transformer_2"]["applied"]],
        reference_tool=f"{DIFFUSERS_TOOL} WanPipeline(boundary_ratio=0.875).load_lora_weights(high) and load_lora_weights(low, load_into_transformer_2=True), fuse_lora on both components",
        notes=(
            "high.safetensors -> transformer (high-noise expert, t >= 875), low.safetensors -> transformer_2 "
            "(low-noise expert). load_into_transformer_2=True loads ONLY into transformer_2."
        ),
    )


def mismatch_case(manifest: dict) -> None:
    case = "mismatch_1p3b_like"
    other = dict(T2V_CONFIG, num_attention_heads=3, attention_head_dim=16, ffn_dim=96)
    shapes = {k: tuple(v.shape) for k, v in original_state(WanTransformer3DModel(**other).state_dict()).items()}
    path = ADAPTERS / case / f"{case}.safetensors"
    write_safetensors(path, build_original_lora(shapes, MISMATCH_SPEC, 3008))
    torch.manual_seed(0)
    refusal = try_diffusers_load("t2v", path)
    case_entry(
        manifest,
        case,
        convention="comfy",
        base=rel(MODELS / "t2v"),
        adapter=[rel(path)],
        strengths={},
        applied=None,
        reference_tool="none (refusal case)",
        reference_refusal=refusal,
        notes=(
            "ComfyUI-format LoRA whose shapes fit a D=48, F=96 base (3 heads x 16), not the D=32 t2v base: "
            "lora_down (4, 48), lora_up (48, 4) / (96, 4). wanbake must refuse it naming file, key, expected "
            "and found shapes. reference_refusal records what diffusers did with it."
        ),
    )


# --------------------------------------------------------------------------------------------
# Runner goldens: forwards and 4-step sampling loops.
# --------------------------------------------------------------------------------------------

LATENT_FHW = (3, 4, 6)  # latent frames, height, width (non-square); S = 3 * 2 * 3 = 18 tokens
SAMPLE_STEPS = 4
SAMPLE_SHIFT = 3.0
SAMPLE_GUIDANCE = 5.0
A14B_SHIFT = 5.0
A14B_GUIDANCE = 4.0
A14B_GUIDANCE_2 = 3.0
FORWARD_TIMESTEP = 500.0


def runner_inputs(name: str, config: dict, seed: int) -> dict:
    rng = Rng(seed)
    f, h, w = LATENT_FHW
    c_out = config["out_channels"]
    inputs = {}
    if name in ("i2v", "flf2v"):
        noise = rng.normal((1, c_out, f, h, w))
        mask = torch.zeros(1, 4, f, h, w)
        mask[:, :, 0] = 1.0
        if name == "flf2v":
            mask[:, :, -1] = 1.0
        image_latents = rng.normal((1, config["in_channels"] - c_out - 4, f, h, w))
        inputs["hidden_states"] = torch.cat([noise, mask, image_latents], dim=1)
        text = torch.zeros(1, 512, config["text_dim"])
        text[:, :40] = rng.normal((1, 40, config["text_dim"]))
        neg = torch.zeros(1, 512, config["text_dim"])
        neg[:, :16] = rng.normal((1, 16, config["text_dim"]))
        inputs["encoder_hidden_states"] = text
        inputs["negative_encoder_hidden_states"] = neg
        frames = 2 if name == "flf2v" else 1
        inputs["encoder_hidden_states_image"] = rng.normal((frames, 257, config["image_dim"]))
    else:
        inputs["hidden_states"] = rng.normal((1, config["in_channels"], f, h, w))
        inputs["encoder_hidden_states"] = rng.normal((1, 20, config["text_dim"]))
        inputs["negative_encoder_hidden_states"] = rng.normal((1, 20, config["text_dim"]))
    if name == "ti2v":
        tokens = f * (h // 2) * (w // 2)
        inputs["timestep"] = torch.linspace(40.0, 960.0, tokens, dtype=torch.float32).reshape(1, tokens)
    else:
        inputs["timestep"] = torch.tensor([FORWARD_TIMESTEP], dtype=torch.float32)
    return inputs


def forward(model, inputs: dict, *, negative: bool = False) -> torch.Tensor:
    context = inputs["negative_encoder_hidden_states" if negative else "encoder_hidden_states"]
    with torch.no_grad():
        return model(
            hidden_states=inputs["hidden_states"],
            timestep=inputs["timestep"],
            encoder_hidden_states=context,
            encoder_hidden_states_image=inputs.get("encoder_hidden_states_image"),
            return_dict=False,
        )[0]


def sample_loop(models, inputs, *, guidance, guidance_2=None, boundary_ratio=None, shift=SAMPLE_SHIFT):
    """WanPipeline's / WanImageToVideoPipeline's denoising loop, transcribed (diffusers 0.42.1).

    latents = hidden_states[:, :C_out]; for I2V the remaining channels (mask + image latents)
    are the fixed `condition` concatenated after the latents at every step. For T2V / A14B the
    result is asserted equal to WanPipeline.__call__ itself.
    """
    c_out = models[0].config.out_channels
    latents = inputs["hidden_states"][:, :c_out].clone()
    condition = inputs["hidden_states"][:, c_out:] if inputs["hidden_states"].shape[1] > c_out else None
    image = inputs.get("encoder_hidden_states_image")
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(SAMPLE_STEPS)
    scheduler.set_begin_index(0)
    boundary = boundary_ratio * scheduler.config.num_train_timesteps if boundary_ratio is not None else None
    steps, record = [], {}
    with torch.no_grad():
        for i, t in enumerate(scheduler.timesteps):
            high = boundary is None or t >= boundary
            model = models[0] if high else models[1]
            scale = guidance if high else guidance_2
            model_input = latents if condition is None else torch.cat([latents, condition], dim=1)
            timestep = t.expand(latents.shape[0])
            kwargs = dict(hidden_states=model_input, timestep=timestep, encoder_hidden_states_image=image, return_dict=False)
            cond = model(encoder_hidden_states=inputs["encoder_hidden_states"], **kwargs)[0]
            uncond = model(encoder_hidden_states=inputs["negative_encoder_hidden_states"], **kwargs)[0]
            noise_pred = uncond + scale * (cond - uncond)
            latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
            record[f"step{i}_noise_pred"] = noise_pred.clone()
            record[f"step{i}_latents"] = latents.clone()
            steps.append({"step": i, "timestep": float(t), "expert": "transformer" if high else "transformer_2", "guidance": scale})
    meta = {
        "scheduler": "FlowMatchEulerDiscreteScheduler",
        "num_train_timesteps": scheduler.config.num_train_timesteps,
        "steps": SAMPLE_STEPS,
        "shift": shift,
        "guidance": guidance,
        "timesteps": [float(t) for t in scheduler.timesteps],
        "sigmas": [float(s) for s in scheduler.sigmas],
        "per_step": steps,
        "cfg": "noise = uncond + g*(cond - uncond); uncond uses negative_encoder_hidden_states",
        "timestep_fed": "t.expand(B) (float32, not truncated)",
        "step": "latents = latents + (sigma[i+1] - sigma[i]) * noise (scheduler.step, float32)",
        "initial_latents": "hidden_states[:, :out_channels] of the inputs file",
    }
    if condition is not None:
        meta["condition"] = "hidden_states[:, out_channels:] (mask + image latents), concatenated after the latents each step"
    if boundary_ratio is not None:
        meta.update(boundary_ratio=boundary_ratio, boundary_timestep=boundary, guidance_2=guidance_2,
                    expert_rule="t >= boundary_timestep -> transformer (guidance), else transformer_2 (guidance_2)")
    record["latents"] = latents
    return record, meta


def pipeline_sample(pipe, inputs, **kwargs) -> torch.Tensor:
    f, h, w = inputs["hidden_states"].shape[2:]
    with torch.no_grad():
        return pipe(
            height=h * 8,
            width=w * 8,
            num_frames=(f - 1) * 4 + 1,
            num_inference_steps=SAMPLE_STEPS,
            latents=inputs["hidden_states"].clone(),
            prompt_embeds=inputs["encoder_hidden_states"],
            negative_prompt_embeds=inputs["negative_encoder_hidden_states"],
            output_type="latent",
            return_dict=False,
            **kwargs,
        )[0]


def write_runner(name: str, tensors: dict, meta: dict) -> Path:
    path = RUNNER / f"{name}.safetensors"
    write_safetensors(path, tensors, {k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in meta.items()})
    return path


@contextlib.contextmanager
def float64_upcasts_neutralised():
    """diffusers' WAN code calls `.float()` on activations (LayerNorms, modulation, residuals).

    In a float64 run those calls would drop precision to float32; inside this context
    `.float()` leaves float64 tensors alone, so the whole forward stays float64 (except the
    timestep frequencies, which get_timestep_embedding builds in float32 in every run).
    """
    original = torch.Tensor.float

    def keep_double(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

    torch.Tensor.float = keep_double
    try:
        yield
    finally:
        torch.Tensor.float = original


def runner_goldens(manifest: dict) -> None:
    entries = {}
    seeds = {"t2v": 4001, "i2v": 4002, "flf2v": 4003, "ti2v": 4004}
    all_inputs = {}
    for name, seed in seeds.items():
        config = MODEL_SPECS[name][0]
        inputs = runner_inputs(name, config, seed)
        all_inputs[name] = inputs
        in_path = write_runner(f"{name}__inputs", inputs, {"model": rel(MODELS / name)})
        model = load_model(name)
        noise_pred = forward(model, inputs)
        ts = "per-token (B,S) timesteps from the inputs file" if name == "ti2v" else f"timestep {FORWARD_TIMESTEP}"
        fwd = write_runner(f"{name}__forward", {"noise_pred": noise_pred},
                           {"model": rel(MODELS / name), "inputs": rel(in_path), "what": f"one conditional forward, {ts}, float32"})
        entries[name] = {"inputs": rel(in_path), "forward": rel(fwd)}
    # float64 forwards of the base t2v
    model64 = load_model("t2v").double()
    inputs64 = {k: v.double() for k, v in all_inputs["t2v"].items()}
    plain64 = forward(model64, inputs64)
    with float64_upcasts_neutralised():
        all64 = forward(model64, inputs64)
    out32 = read_safetensors(RUNNER / "t2v__forward.safetensors")[0]["noise_pred"].double()
    f64 = write_runner("t2v__forward_f64", {"noise_pred": plain64, "noise_pred_all_f64": all64}, {
        "model": rel(MODELS / "t2v"), "inputs": rel(RUNNER / "t2v__inputs.safetensors"),
        "noise_pred": "model.double() and float64 inputs, diffusers code as is: its hard-coded .float() calls keep "
                      "the timestep sinusoid (t*omega), the LayerNorms and the modulation arithmetic in float32, "
                      "so this isolates the rounding of the matmuls / attention / activations",
        "noise_pred_all_f64": "same, with Tensor.float() made a no-op on float64 tensors: every op in float64 "
                              "except omega itself (built in float32 by get_timestep_embedding); the distance to "
                              "the f32 forward includes the float32 rounding of t*omega at t=500",
        "max_abs_diff_noise_pred_vs_f32_forward": float((plain64 - out32).abs().max()),
        "max_abs_diff_noise_pred_all_f64_vs_f32_forward": float((all64 - out32).abs().max()),
        "max_abs_noise_pred": float(plain64.abs().max()),
    })
    entries["t2v"]["forward_f64"] = rel(f64)
    # 4-step samplers
    for name in ("t2v", "i2v"):
        model = load_model(name)
        record, meta = sample_loop([model], all_inputs[name], guidance=SAMPLE_GUIDANCE)
        if name == "t2v":
            via_pipe = pipeline_sample(make_pipe(load_model("t2v")), all_inputs[name], guidance_scale=SAMPLE_GUIDANCE)
            assert torch.equal(via_pipe, record["latents"]), "manual loop differs from WanPipeline"
            meta["produced_by"] = "WanPipeline.__call__ (output_type='latent'); the transcribed loop matches it bit for bit"
        else:
            meta["produced_by"] = "WanImageToVideoPipeline's loop transcribed (the pipeline itself needs a VAE and image encoder)"
        meta["model"] = rel(MODELS / name)
        meta["inputs"] = rel(RUNNER / f"{name}__inputs.safetensors")
        entries[name]["sample4"] = rel(write_runner(f"{name}__sample4", record, meta))
    a14b_sampler(entries, all_inputs["t2v"])
    adapter_runtime_goldens(entries, all_inputs)
    manifest["runner"] = entries


def a14b_sampler(entries: dict, inputs: dict) -> None:
    experts = [load_model("a14b/transformer"), load_model("a14b/transformer_2")]
    record, meta = sample_loop(experts, inputs, guidance=A14B_GUIDANCE, guidance_2=A14B_GUIDANCE_2,
                               boundary_ratio=A14B_BOUNDARY_RATIO, shift=A14B_SHIFT)
    used = {s["expert"] for s in meta["per_step"]}
    assert used == {"transformer", "transformer_2"}, meta["per_step"]
    pipe = make_pipe(load_model("a14b/transformer"), load_model("a14b/transformer_2"), A14B_BOUNDARY_RATIO, shift=A14B_SHIFT)
    via_pipe = pipeline_sample(pipe, inputs, guidance_scale=A14B_GUIDANCE, guidance_scale_2=A14B_GUIDANCE_2)
    assert torch.equal(via_pipe, record["latents"]), "manual A14B loop differs from WanPipeline"
    meta.update(model=rel(MODELS / "a14b"), inputs=rel(RUNNER / "t2v__inputs.safetensors"),
                produced_by="WanPipeline.__call__ with transformer_2 and boundary_ratio; transcribed loop matches bit for bit",
                shift_choice=f"shift {A14B_SHIFT} so that 4 steps use both experts (see per_step)")
    entries["a14b"] = {"inputs": rel(RUNNER / "t2v__inputs.safetensors"), "sample4": rel(write_runner("a14b__sample4", record, meta))}


def adapter_runtime_goldens(entries: dict, all_inputs: dict) -> None:
    """Adapter active at runtime (PEFT layers in the forward) vs fused into the weights."""
    for model_name, case in (("t2v", "peft_plain"), ("i2v", "peft_i2v")):
        inputs = all_inputs[model_name]
        torch.manual_seed(0)
        peft_model = PeftModel.from_pretrained(load_model(model_name), str(ADAPTERS / case))
        inner = peft_model.get_base_model()
        runtime = forward(inner, inputs)
        record, meta = sample_loop([inner], inputs, guidance=SAMPLE_GUIDANCE)
        fused = forward(peft_model.merge_and_unload(), inputs)
        _write_adapter_runner(entries, model_name, case, runtime, fused, record, meta,
                              runtime_how=f"{PEFT_TOOL} PeftModel.from_pretrained (LoRA layers active)",
                              fused_how=f"{PEFT_TOOL} merge_and_unload (PEFT's fuse)")
    inputs = all_inputs["t2v"]
    adapter = ADAPTERS / "comfy_lora" / "comfy_lora.safetensors"
    torch.manual_seed(0)
    pipe = make_pipe(load_model("t2v"))
    pipe.load_lora_weights(str(adapter.parent), weight_name=adapter.name)
    try:
        forward(pipe.transformer, inputs)
        default_failure = None
    except RuntimeError as err:  # recorded: diffusers' default load cannot run this adapter unfused
        default_failure = f"{type(err).__name__}: {err}"
    torch.manual_seed(0)
    pipe = make_pipe(load_model("t2v"))
    pipe.load_lora_weights(str(adapter.parent), weight_name=adapter.name, low_cpu_mem_usage=False)
    runtime = forward(pipe.transformer, inputs)
    record, meta = sample_loop([pipe.transformer], inputs, guidance=SAMPLE_GUIDANCE)
    via_pipe = pipeline_sample(pipe, inputs, guidance_scale=SAMPLE_GUIDANCE)
    assert torch.equal(via_pipe, record["latents"])
    pipe.fuse_lora(lora_scale=1.0)
    fused = forward(pipe.transformer, inputs)
    _write_adapter_runner(entries, "t2v", "comfy_lora", runtime, fused, record, meta,
                          runtime_how=f"{DIFFUSERS_TOOL} WanPipeline.load_lora_weights (LoRA layers active)",
                          fused_how=f"{DIFFUSERS_TOOL} fuse_lora(lora_scale=1)",
                          note="diffusers applies only what it keeps (see manifest cases.comfy_lora.dropped_by_reference): "
                               "these outputs correspond to base + references/comfy_lora.safetensors, not to the hand-derived values. "
                               "Loaded with low_cpu_mem_usage=False: with the default (True) the LoRA parameters absent from the "
                               "file (lora_B.bias of modules without diff_b, lora_A/B of a module with only diff_b) stay on the meta "
                               f"device and the unfused forward fails ({default_failure}); fuse_lora skips them silently.")


def _write_adapter_runner(entries, model_name, case, runtime, fused, record, meta, *, runtime_how, fused_how, note=""):
    common = {"model": rel(MODELS / model_name), "inputs": rel(RUNNER / f"{model_name}__inputs.safetensors"),
              "adapter_case": case, "strength": "1"}
    if note:
        common["note"] = note
    stem = f"{model_name}__{case}"
    rt = write_runner(f"{stem}__runtime_forward", {"noise_pred": runtime}, dict(common, what=runtime_how))
    fu = write_runner(f"{stem}__fused_forward", {"noise_pred": fused},
                      dict(common, what=fused_how, max_abs_diff_vs_runtime=float((fused - runtime).abs().max())))
    meta = dict(meta, **common, what=runtime_how)
    rs = write_runner(f"{stem}__runtime_sample4", record, meta)
    entries.setdefault("adapters", {})[stem] = {"runtime_forward": rel(rt), "fused_forward": rel(fu), "runtime_sample4": rel(rs)}


# --------------------------------------------------------------------------------------------
# NNX expectations, manifest, entry point.
# --------------------------------------------------------------------------------------------


def nnx_goldens(manifest: dict) -> None:
    spec = importlib.util.spec_from_file_location("nnx_expect", NNX / "nnx_expect.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = module.main(MODELS, NNX)
    manifest["nnx"] = {
        "oracle": rel(NNX / "nnx_expect.py"),
        "files": [rel(p) for p in paths],
        "entry_fields": "key (NNX path, '.'-joined), shape, source_keys (diffusers keys, block order), transform, "
                        "first8 (first 8 values, row-major, f32 as float), sum (float64 sum of all values)",
    }


def clean_outputs() -> None:
    for d in (MODELS, ADAPTERS, REFS, RUNNER):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    for p in NNX.glob("*.json"):
        p.unlink()


def tree_size(paths) -> int:
    return sum(p.stat().st_size for d in paths for p in Path(d).rglob("*") if p.is_file())


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    logging.getLogger("peft").setLevel(logging.ERROR)
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    clean_outputs()
    manifest = {
        "generator": {
            "script": rel(GOLDEN / "generate.py"),
            "module": rel(GOLDEN / "wan_golden.py"),
            "versions": VERSIONS,
            "determinism": "fixed seeds, torch.set_num_threads(1), PYTHONHASHSEED=0, canonical safetensors headers",
        }
    }
    steps = [
        ("models", write_models),
        ("peft cases", peft_cases),
        ("diffusers cases", diffusers_lora_cases),
        ("convention cases", comfy_cases),
        ("runner", runner_goldens),
        ("nnx", nnx_goldens),
    ]
    for label, step in steps:
        print(f"[wan_golden] {label}")
        torch.manual_seed(0)
        step(manifest)
    json_dump(MANIFEST, manifest)
    size = tree_size([MODELS, ADAPTERS, REFS, RUNNER, NNX]) + MANIFEST.stat().st_size
    print(f"[wan_golden] WAN golden tree: {size / 1e6:.2f} MB")
    if size > SIZE_BUDGET_BYTES:
        raise SystemExit(f"WAN golden tree is {size} bytes, over the {SIZE_BUDGET_BYTES}-byte budget")


if __name__ == "__main__":
    raise SystemExit("run golden/generate.py (it fixes PYTHONHASHSEED first)")
