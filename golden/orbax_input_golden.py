#!/usr/bin/env python3
"""Orbax INPUT oracles: real Orbax saves of the tiny WAN's NNX trees and of Qwix LoRAs, next to
the safetensors files holding the same values (issue 29, the input half; tests/orbax_input.rs).

Pinned: orbax-checkpoint==0.12.8, tensorstore==0.1.86, jax[cpu]==0.10.2, numpy==2.4.6,
ml_dtypes==0.6.0 (a venv, e.g. /tmp/orbax-venv). CI never runs this script; its outputs are
committed under golden/orbax_input/.

    python golden/orbax_input_golden.py

The NNX trees come from golden/nnx/nnx_expect.py (the numpy re-implementation of MaxDiffusion's
diffusers -> NNX conversion) applied to golden/models/t2v (and a14b), cast as MaxDiffusion's
pretrained cache casts them (weights_dtype bf16, f32 where the path contains `norm`,
`condition_embedder` or `scale_shift_table`). The LoRA values are golden/qwix's.

Written under golden/orbax_input/:
  nnx_scanned.safetensors, nnx_unscanned.safetensors   the trees, as safetensors (sorted keys)
  a14b_nnx/transformer{,_2}/diffusion_pytorch_model.safetensors   the A14B pair, scanned
  base_ocdbt_zarr2/   item: StandardCheckpointer (Orbax's default: OCDBT + zarr v2, zstd), scanned
  base_zarr3_chunks/  item: OCDBT + zarr v3, chunk_byte_size 256 (many chunks per array), scanned
  base_plain/         item: use_ocdbt=False (zarr v2 keys as plain files), UNscanned (blocks/<i>)
  base_nnx_value/     item: an nnx.State-like tree (every leaf ends in `value`), scanned
  cache/              CheckpointManager root, step 0: wan_state (StandardSave) + wan_config
                      (JsonSave), as MaxDiffusion's pretrained cache; scanned
  a14b_cache/         CheckpointManager root, step 0: high_noise_transformer_state (transformer/)
                      + low_noise_transformer_state (transformer_2/) + wan_config
  lora_maxtext/       CheckpointManager root, steps 5 and 10, item `items`: {params: {params:
                      <qwix_stacked tree>}, step}, custom_metadata {"lora": {"lora_rank": 4,
                      "lora_alpha": 6.0, ...}} at the step (MaxText's config.lora.model_dump())
  lora_value_nometa/  item: qwix_per_layer's values as an nnx.State-like tree (`.value`), no
                      custom_metadata: wanbake must refuse it without --scale
  expected.json       versions, and every case's leaves: name, dtype, shape, sha256 of the bytes

Orbax output is not byte-reproducible (random uuids, data-file names, timestamps); re-running
changes the Orbax folders' bytes but not their values, nor the safetensors files.
"""

import hashlib
import json
import os
import shutil
import struct
import sys

import numpy as np
import ml_dtypes

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "orbax_input")
sys.path.insert(0, os.path.join(HERE, "nnx"))
import nnx_expect  # noqa: E402

F32_MARKERS = ("norm", "condition_embedder", "scale_shift_table")


def versions():
    import importlib.metadata as md

    return {
        p: md.version(p)
        for p in ("orbax-checkpoint", "tensorstore", "jax", "jaxlib", "numpy", "ml_dtypes")
    }


def nnx_arrays(model_dir, scan):
    """{nnx key: array} of a diffusers model folder, cast as MaxDiffusion's cache casts."""
    config = json.load(open(os.path.join(model_dir, "config.json")))
    tensors = nnx_expect.read_safetensors(
        nnx_expect.Path(model_dir) / "diffusion_pytorch_model.safetensors"
    )
    arrays = {}
    nnx_expect.convert(config, tensors, scan, arrays)
    out = {}
    for k, a in arrays.items():
        keep = any(m in k for m in F32_MARKERS)
        out[k] = np.ascontiguousarray(a.astype(np.float32 if keep else ml_dtypes.bfloat16))
    return out


ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float64": "F64", "float16": "F16"}


def write_safetensors(path, arrays, metadata=None):
    """A plain safetensors writer: keys sorted, data in key order, header padded to 8."""
    header, blobs, off = {}, [], 0
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        b = a.tobytes()
        header[k] = {"dtype": ST_DTYPES[str(a.dtype)], "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_f32_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (path, k)
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + b : 8 + n + e], "<f4").reshape(v["shape"]).copy()
    return out, header.get("__metadata__")


def tree_of(flat, value_suffix=False):
    """A nested dict from dotted keys (every component a string key, as MaxDiffusion's pure
    dict state has), optionally with an nnx.State-like `value` leaf under every parameter."""
    root = {}
    for k, a in flat.items():
        node = root
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = {"value": a} if value_suffix else a
    return root


def describe(name, flat):
    return {
        k: {"dtype": str(a.dtype), "shape": list(a.shape),
            "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}
        for k, a in sorted(flat.items())
    } | {"_case": name}


def save_item(path, tree, *, use_ocdbt=True, use_zarr3=False, chunk=None, custom=None):
    import jax
    import orbax.checkpoint as ocp

    shutil.rmtree(path, ignore_errors=True)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
    save_args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=chunk), tree)
    with ocp.Checkpointer(handler) as ck:
        ck.save(path, args=ocp.args.PyTreeSave(tree, save_args=save_args), custom_metadata=custom)


def save_standard(path, tree):
    import orbax.checkpoint as ocp

    shutil.rmtree(path, ignore_errors=True)
    with ocp.StandardCheckpointer() as ck:
        ck.save(path, tree)


def save_manager(root, steps):
    """steps: [(step, {item: args}, custom_metadata)]."""
    import orbax.checkpoint as ocp

    shutil.rmtree(root, ignore_errors=True)
    names = tuple(steps[0][1])
    with ocp.CheckpointManager(
        root, item_names=names,
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False),
    ) as mngr:
        for step, items, custom in steps:
            mngr.save(step, args=ocp.args.Composite(**items), custom_metadata=custom)
        mngr.wait_until_finished()


def wan_config(model_dir):
    """What MaxDiffusion's cache records: the transformer's config JSON (diffusers fields plus
    runtime fields; wanbake reads none of it, it is only hashed with the input)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    cfg.update({"scan_layers": True, "weights_dtype": "bfloat16", "dtype": "bfloat16"})
    return cfg


def main():
    import orbax.checkpoint as ocp

    os.makedirs(OUT, exist_ok=True)
    t2v = os.path.join(HERE, "models", "t2v")
    scanned = nnx_arrays(t2v, True)
    unscanned = nnx_arrays(t2v, False)
    write_safetensors(os.path.join(OUT, "nnx_scanned.safetensors"), scanned)
    write_safetensors(os.path.join(OUT, "nnx_unscanned.safetensors"), unscanned)
    cases = {}

    save_standard(os.path.join(OUT, "base_ocdbt_zarr2"), tree_of(scanned))
    cases["base_ocdbt_zarr2"] = describe("scanned", scanned)
    save_item(os.path.join(OUT, "base_zarr3_chunks"), tree_of(scanned), use_zarr3=True, chunk=256)
    cases["base_zarr3_chunks"] = describe("scanned", scanned)
    save_item(os.path.join(OUT, "base_plain"), tree_of(unscanned), use_ocdbt=False)
    cases["base_plain"] = describe("unscanned", unscanned)
    save_standard(os.path.join(OUT, "base_nnx_value"), tree_of(scanned, value_suffix=True))
    cases["base_nnx_value"] = describe("scanned", scanned)

    save_manager(os.path.join(OUT, "cache"), [(0, {
        "wan_state": ocp.args.StandardSave(tree_of(scanned)),
        "wan_config": ocp.args.JsonSave(wan_config(t2v)),
    }, None)])
    cases["cache"] = describe("scanned", scanned)

    a14b = os.path.join(HERE, "models", "a14b")
    high = nnx_arrays(os.path.join(a14b, "transformer"), True)
    low = nnx_arrays(os.path.join(a14b, "transformer_2"), True)
    for comp, arrays in (("transformer", high), ("transformer_2", low)):
        write_safetensors(
            os.path.join(OUT, "a14b_nnx", comp, "diffusion_pytorch_model.safetensors"), arrays)
    save_manager(os.path.join(OUT, "a14b_cache"), [(0, {
        "high_noise_transformer_state": ocp.args.StandardSave(tree_of(high)),
        "low_noise_transformer_state": ocp.args.StandardSave(tree_of(low)),
        "wan_config": ocp.args.JsonSave(wan_config(os.path.join(a14b, "transformer_2"))),
    }, None)])
    cases["a14b_cache/high"] = describe("transformer", high)
    cases["a14b_cache/low"] = describe("transformer_2", low)

    stacked, _ = read_f32_safetensors(os.path.join(HERE, "qwix", "qwix_stacked.safetensors"))
    lora_cfg = {"lora_rank": 4, "lora_alpha": 6.0, "lora_module_path": ".*"}
    steps = []
    for step in (5, 10):
        # Step 5 holds other values (a reader taking the first step fails the merge test).
        vals = stacked if step == 10 else {k: v * 0.5 for k, v in stacked.items()}
        steps.append((step, {"items": ocp.args.StandardSave(
            {"params": {"params": tree_of(vals)}, "step": np.int32(step)})},
            {"lora": lora_cfg, "scan_layers": True}))
    save_manager(os.path.join(OUT, "lora_maxtext"), steps)
    cases["lora_maxtext"] = describe("qwix_stacked", stacked)

    per_layer, _ = read_f32_safetensors(os.path.join(HERE, "qwix", "qwix_per_layer.safetensors"))
    save_standard(os.path.join(OUT, "lora_value_nometa"), tree_of(per_layer, value_suffix=True))
    cases["lora_value_nometa"] = describe("qwix_per_layer", per_layer)

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"versions": versions(), "cases": cases}, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
