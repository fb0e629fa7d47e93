"""Golden fixtures for Flax NNX / Qwix LoRA files on the tiny WAN T2V (writes golden/qwix/).

Qwix (google/qwix `qwix/_src/providers/lora.py`) stores each adapter as two params next to the
intercepted weight, `<param>_lora_a` (in, r) and `<param>_lora_b` (r, out), for a Dense kernel
(in, out), and adds `x·a·b·(α/r)` in the forward pass. Flattening the NNX state and joining the
path with "." gives keys such as `blocks.0.attn1.query.kernel_lora_a`. The scanned
(`nnx.vmap`-stacked) form carries the layer axis first. `golden/qwix/probe_qwix.py` checks all
of this against real jax/flax/qwix.

The oracles for the references:
* plain float64 numpy: ΔW (out, in) = (α/r)·(a@b)ᵀ, keyed by the diffusers parameter name;
* the real PEFT library: the equivalent PEFT adapter (lora_A = aᵀ, lora_B = bᵀ) is loaded into
  a real diffusers WanTransformer3DModel of the same config and merged. The generator asserts
  that the result equals base + ΔW.

Seeded and deterministic. Called with no arguments by golden/generate.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

HERE = Path(__file__).resolve().parent
OUT = HERE / "qwix"

# Tiny WAN T2V (same config as the diffusers fixture built by golden/generate.py).
NUM_LAYERS = 3
D = 32  # 2 heads × 16
FFN = 80
TEXT_DIM = 24
FREQ_DIM = 32
OUT_CHANNELS = 4
PATCH = (1, 2, 2)
PROJ_OUT = OUT_CHANNELS * PATCH[0] * PATCH[1] * PATCH[2]

RANK = 4
ALPHA = 6.0
USER_SCALE_NOSCALE = 2.0  # the scale a user must pass for qwix_noscale (differs from 6/4 on purpose)

# NNX module (MaxDiffusion names, relative to the block) -> (diffusers module, kernel (in, out)).
BLOCK_MODULES = {
    "attn1.query": ("attn1.to_q", (D, D)),
    "attn1.key": ("attn1.to_k", (D, D)),
    "attn1.value": ("attn1.to_v", (D, D)),
    "attn1.proj_attn": ("attn1.to_out.0", (D, D)),
    "attn2.query": ("attn2.to_q", (D, D)),
    "attn2.key": ("attn2.to_k", (D, D)),
    "attn2.value": ("attn2.to_v", (D, D)),
    "attn2.proj_attn": ("attn2.to_out.0", (D, D)),
    "ffn.act_fn.proj": ("ffn.net.0.proj", (D, FFN)),
    "ffn.proj_out": ("ffn.net.2", (FFN, D)),
}
TOP_MODULES = {
    "proj_out": ("proj_out", (D, PROJ_OUT)),
    "condition_embedder.time_proj": ("condition_embedder.time_proj", (D, 6 * D)),
    "condition_embedder.text_embedder.linear_1": ("condition_embedder.text_embedder.linear_1", (TEXT_DIM, D)),
    "condition_embedder.time_embedder.linear_1": ("condition_embedder.time_embedder.linear_1", (FREQ_DIM, D)),
}

# Unscanned file: a different subset per block, so each block index matters.
PER_LAYER_BLOCK_TARGETS = {
    0: ["attn1.query", "attn1.value", "attn2.key", "ffn.act_fn.proj"],
    1: ["attn1.key", "attn1.proj_attn", "attn2.query", "ffn.proj_out"],
    2: ["attn2.value", "attn2.proj_attn", "ffn.act_fn.proj", "ffn.proj_out"],
}
PER_LAYER_TOP_TARGETS = ["proj_out", "condition_embedder.time_proj", "condition_embedder.text_embedder.linear_1"]

# Scanned file: a stacked param exists for every layer, so the module set is shared by all blocks.
STACKED_BLOCK_TARGETS = ["attn1.query", "attn1.proj_attn", "attn2.key", "attn2.value", "ffn.act_fn.proj", "ffn.proj_out"]
STACKED_TOP_TARGETS = ["proj_out", "condition_embedder.time_proj", "condition_embedder.time_embedder.linear_1"]


_DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64"}


def save_file(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file with a byte-stable header.

    safetensors 0.8.0 keeps `__metadata__` in a Rust HashMap, so a file with two or more metadata
    entries comes out in a different order from one process to the next. Here the header is
    `__metadata__` (keys sorted), then the tensors sorted by name, with data in the same order,
    compact JSON, space-padded to 8 bytes. That is a valid safetensors file, and the generator
    re-reads every file it writes with the official loader to make sure."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    chunks, offset = [], 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": _DTYPES[array.dtype.newbyteorder("<")],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(chunks))
    back = load_file(path)
    if set(back) != set(tensors) or any(not np.array_equal(back[k], tensors[k]) for k in tensors):
        raise AssertionError(f"{path} does not read back")


def lora_pair(rng: np.random.Generator, shape_in_out: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """a (in, r), b (r, out), f32 (Qwix uses the base param dtype). b is non-zero (trained)."""
    fan_in, fan_out = shape_in_out
    a = rng.uniform(-1.0, 1.0, (fan_in, RANK)) * np.sqrt(6.0 / fan_in)  # he_uniform range
    b = rng.standard_normal((RANK, fan_out)) * 0.1
    return a.astype(np.float32), b.astype(np.float32)


def diffusers_name(nnx_module: str) -> str:
    """`blocks.{i}.<nnx>` or a top-level NNX module -> diffusers module path."""
    if nnx_module.startswith("blocks."):
        _, index, rest = nnx_module.split(".", 2)
        return f"blocks.{index}.{BLOCK_MODULES[rest][0]}"
    return TOP_MODULES[nnx_module][0]


def build_per_layer(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{unscanned NNX module path: (a, b)}."""
    rng = np.random.default_rng(seed)
    pairs = {}
    for i, modules in PER_LAYER_BLOCK_TARGETS.items():
        for m in modules:
            pairs[f"blocks.{i}.{m}"] = lora_pair(rng, BLOCK_MODULES[m][1])
    for m in PER_LAYER_TOP_TARGETS:
        pairs[m] = lora_pair(rng, TOP_MODULES[m][1])
    return pairs


def build_stacked(seed: int) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Scanned file tensors, plus the same values unstacked as {blocks.{i}.<m>: (a, b)}."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for m in STACKED_BLOCK_TARGETS:
        per_layer = [lora_pair(rng, BLOCK_MODULES[m][1]) for _ in range(NUM_LAYERS)]
        tensors[f"blocks.{m}.kernel_lora_a"] = np.stack([a for a, _ in per_layer])  # (L, in, r)
        tensors[f"blocks.{m}.kernel_lora_b"] = np.stack([b for _, b in per_layer])  # (L, r, out)
        for i, pair in enumerate(per_layer):
            pairs[f"blocks.{i}.{m}"] = pair
    for m in STACKED_TOP_TARGETS:
        a, b = lora_pair(rng, TOP_MODULES[m][1])
        tensors[f"{m}.kernel_lora_a"], tensors[f"{m}.kernel_lora_b"] = a, b
        pairs[m] = (a, b)
    return tensors, pairs


def flat_tensors(pairs: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {}
    for module, (a, b) in pairs.items():
        out[f"{module}.kernel_lora_a"] = a
        out[f"{module}.kernel_lora_b"] = b
    return out


def delta_reference(pairs: dict, scale: float) -> dict[str, np.ndarray]:
    """ΔW (out, in) = scale·(a@b)ᵀ in float64, keyed by the diffusers weight name."""
    return {
        diffusers_name(m) + ".weight": np.ascontiguousarray(scale * (a.astype(np.float64) @ b.astype(np.float64)).T)
        for m, (a, b) in pairs.items()
    }


def peft_reference(pairs: dict, scale: float) -> tuple[dict[str, np.ndarray], dict]:
    """The same adapter in PEFT layout: lora_A = aᵀ (r, in), lora_B = bᵀ (out, r), f32."""
    tensors = {}
    for m, (a, b) in pairs.items():
        key = "base_model.model." + diffusers_name(m)
        tensors[key + ".lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[key + ".lora_B.weight"] = np.ascontiguousarray(b.T)
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "r": RANK,
        "lora_alpha": scale * RANK,
        "target_modules": sorted(diffusers_name(m) for m in pairs),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    return tensors, config


def check_with_peft(delta: dict[str, np.ndarray], peft_tensors: dict[str, np.ndarray], config: dict) -> None:
    """Oracle cross-check: load the PEFT form into a real diffusers WanTransformer3DModel of the
    tiny config, merge with real PEFT in float64, and require merged − base == ΔW."""
    import torch
    from diffusers import WanTransformer3DModel
    from diffusers.utils import logging as diffusers_logging

    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # silence the "keep in float32" notice for .to(float64)
    try:
        _check_with_peft(torch, WanTransformer3DModel, delta, peft_tensors, config)
    finally:
        diffusers_logging.set_verbosity(verbosity)


def _check_with_peft(torch, WanTransformer3DModel, delta, peft_tensors, config) -> None:
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=PATCH,
        num_attention_heads=2,
        attention_head_dim=D // 2,
        in_channels=4,
        out_channels=OUT_CHANNELS,
        text_dim=TEXT_DIM,
        freq_dim=FREQ_DIM,
        ffn_dim=FFN,
        num_layers=NUM_LAYERS,
    ).to(torch.float64)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora_config = LoraConfig(
        r=config["r"], lora_alpha=config["lora_alpha"], target_modules=config["target_modules"]
    )
    peft_model = get_peft_model(model, lora_config)
    state = {k: torch.from_numpy(v) for k, v in peft_tensors.items()}
    result = set_peft_model_state_dict(peft_model, state)
    if result.unexpected_keys:
        raise AssertionError(f"PEFT did not accept {result.unexpected_keys}")
    wrapped = {n for n, mod in peft_model.base_model.model.named_modules() if hasattr(mod, "lora_A")}
    if wrapped != set(config["target_modules"]):
        raise AssertionError(f"PEFT wrapped {sorted(wrapped ^ set(config['target_modules']))} unexpectedly")
    merged = peft_model.to(torch.float64).merge_and_unload().state_dict()
    for key, base_w in base.items():
        want = base_w.numpy() + delta[key] if key in delta else base_w.numpy()
        diff = np.abs(merged[key].numpy() - want).max()
        if diff > 1e-12:
            raise AssertionError(f"PEFT merge of {key} differs from base + ΔW by {diff:.3e}")


def write_case(name: str, file_tensors: dict, pairs: dict, scale: float, metadata: dict | None) -> dict:
    save_file(file_tensors, OUT / f"{name}.safetensors", metadata=metadata)
    delta = delta_reference(pairs, scale)
    save_file(delta, OUT / "references" / f"{name}__delta.safetensors")
    peft_tensors, config = peft_reference(pairs, scale)
    check_with_peft(delta, peft_tensors, config)
    save_file(
        peft_tensors,
        OUT / "references" / f"{name}__peft.safetensors",
        metadata={"format": "pt", "adapter_config": json.dumps(config, sort_keys=True)},
    )
    return {
        "file": f"{name}.safetensors",
        "metadata": metadata,
        "scale": scale,
        "scale_source": "metadata lora_alpha / lora_rank" if metadata else f"user-supplied scale {scale}",
        "nnx_to_diffusers": {m: diffusers_name(m) for m in sorted(pairs)},
        "delta_reference": f"references/{name}__delta.safetensors",
        "peft_reference": f"references/{name}__peft.safetensors",
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if (OUT / "references").exists():
        shutil.rmtree(OUT / "references")
    (OUT / "references").mkdir()
    metadata = {"lora_alpha": repr(ALPHA), "lora_rank": str(RANK)}
    scale = ALPHA / RANK

    cases = {}
    per_layer = build_per_layer(seed=20260311)
    cases["qwix_per_layer"] = write_case("qwix_per_layer", flat_tensors(per_layer), per_layer, scale, metadata)

    stacked_tensors, stacked_pairs = build_stacked(seed=20260312)
    cases["qwix_stacked"] = write_case("qwix_stacked", stacked_tensors, stacked_pairs, scale, metadata)
    cases["qwix_stacked"]["layout"] = "scanned: layer axis first, a (L, in, r), b (L, r, out)"
    cases["qwix_stacked"]["stacked_to_diffusers"] = {
        f"blocks.{m}": f"blocks.{{i}}.{BLOCK_MODULES[m][0]}" for m in STACKED_BLOCK_TARGETS
    } | {m: TOP_MODULES[m][0] for m in STACKED_TOP_TARGETS}

    noscale = build_per_layer(seed=20260313)
    cases["qwix_noscale"] = write_case("qwix_noscale", flat_tensors(noscale), noscale, USER_SCALE_NOSCALE, None)
    cases["qwix_noscale"]["expect"] = "refuse without a user scale; with scale 2.0 the delta reference applies"

    manifest = {
        "generator": "golden/qwix_golden.py",
        "model": {
            "num_layers": NUM_LAYERS,
            "dim": D,
            "ffn_dim": FFN,
            "text_dim": TEXT_DIM,
            "freq_dim": FREQ_DIM,
            "out_channels": OUT_CHANNELS,
            "patch_size": list(PATCH),
        },
        "rank": RANK,
        "alpha": ALPHA,
        "reference_dtype": "F64 (delta), F32 (peft)",
        "cases": cases,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
