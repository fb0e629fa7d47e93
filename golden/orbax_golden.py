#!/usr/bin/env python3
"""Orbax oracles for wanbake's Orbax container layer (src/io/orbax/).

Pinned: orbax-checkpoint==0.12.8, tensorstore==0.1.86, jax[cpu]==0.10.2, numpy==2.4.6,
ml_dtypes==0.6.0 (a venv, e.g. /tmp/orbax-venv; CI never runs this script: its outputs are
committed under golden/orbax/).

    python golden/orbax_golden.py save     # real Orbax saves + expected.json (every leaf's bytes)
    python golden/orbax_golden.py check    # restore golden/orbax/written/ (made by wanbake's
                                           # encoders, `cargo test --test orbax` with
                                           # WANBAKE_WRITE_ORBAX_GOLDEN=1) and record restored.json

`save` writes, under golden/orbax/:
  ocdbt_zarr2/   StandardCheckpointer default: OCDBT + zarr v2 (zstd)      -- basic tree
  ocdbt_zarr3/   PyTreeCheckpointHandler(use_zarr3=True), chunk_byte_size 64: many chunks
  plain_zarr2/   use_ocdbt=False: zarr v2 keys as plain files               -- basic tree
  plain_zarr3/   use_ocdbt=False, use_zarr3=True, chunk_byte_size 64
  jax_arrays/    jax.Array leaves (as MaxDiffusion saves): bf16 stacked, f32
  nnx_value/     an nnx.State-like tree: every leaf ends in 'value' (and a module named 'value')
  lora/          a Qwix-like LoRA pair (kernel_lora_a / kernel_lora_b), scanned (L, in, r),
                 custom_metadata {"lora": {"rank": 4, "alpha": 8.0}} on the item
  manager/       a CheckpointManager root with steps 1 and 3 (item 'items', MaxText's name),
                 custom_metadata at the step
  multigen/      a bare tensorstore OCDBT database, 20 generations (version-tree nodes)
  expected.json  per case: every leaf's path (key list), dtype, shape and C-order
                 little-endian bytes (hex), produced by numpy from the arrays that were saved.

Orbax output is not byte-reproducible (random uuids and data-file names, timestamps), so
re-running `save` changes the committed bytes but not expected.json.
"""

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import ml_dtypes

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "orbax")


def arrays(seed):
    """The basic tree: every dtype the reader decodes, a scalar, a stacked (L, in, out)
    array, and an f32 array whose chunk is over OCDBT's 1024-byte inline limit."""
    rng = np.random.default_rng(seed)
    return {
        "params": {
            "w_bf16": rng.standard_normal((8, 6)).astype(ml_dtypes.bfloat16),
            "w_f32": rng.standard_normal((3, 5)).astype(np.float32),
            "w_f16": rng.standard_normal((4, 4)).astype(np.float16),
            "w_f64": rng.standard_normal((2, 3)).astype(np.float64),
            "idx_i32": rng.integers(-1000, 1000, (7,)).astype(np.int32),
            "idx_i64": rng.integers(-(2**40), 2**40, (3,)).astype(np.int64),
            "bytes_u8": rng.integers(0, 256, (5,)).astype(np.uint8),
            "mask": rng.integers(0, 2, (6,)).astype(np.bool_),
            "scalar": np.float32(rng.standard_normal()),
            "stacked": rng.standard_normal((3, 4, 5)).astype(ml_dtypes.bfloat16),
            "big": rng.standard_normal((32, 16)).astype(np.float32),
            "zeros": np.zeros((4, 2), np.float32),
        },
        "step": np.int32(42),
    }


def nnx_value_tree(seed):
    rng = np.random.default_rng(seed)
    v = lambda shape: {"value": rng.standard_normal(shape).astype(ml_dtypes.bfloat16)}
    return {
        "blocks": {
            "attn1": {"query": {"kernel": v((2, 4, 4)), "bias": v((2, 4))}},
            # A module named `value`: only the LAST `value` is the nnx.State suffix.
            "value": {"kernel": v((2, 4, 4))},
        },
        "norm_out": {"scale": {"value": rng.standard_normal((4,)).astype(np.float32)}},
    }


def jax_tree(seed):
    rng = np.random.default_rng(seed)
    return {
        "blocks": {
            "attn1": {
                "query": {
                    "kernel": rng.standard_normal((2, 4, 6)).astype(ml_dtypes.bfloat16),
                    "bias": rng.standard_normal((2, 6)).astype(ml_dtypes.bfloat16),
                }
            }
        },
        "norm_out": {"scale": rng.standard_normal((4,)).astype(np.float32)},
        "scale_shift_table": rng.standard_normal((1, 2, 4)).astype(np.float32),
    }


def lora_tree(seed):
    rng = np.random.default_rng(seed)
    L, i, r, o = 2, 6, 4, 5
    return {
        "params": {
            "params": {
                "blocks": {
                    "attn1": {
                        "query": {
                            "kernel_lora_a": rng.standard_normal((L, i, r)).astype(
                                ml_dtypes.bfloat16
                            ),
                            "kernel_lora_b": rng.standard_normal((L, r, o)).astype(
                                ml_dtypes.bfloat16
                            ),
                        }
                    }
                }
            }
        },
        "step": np.int32(100),
    }


def flatten(tree, prefix=()):
    if isinstance(tree, dict):
        out = []
        for k in sorted(tree):
            out += flatten(tree[k], prefix + (k,))
        return out
    return [(prefix, np.asarray(tree))]


def describe(tree):
    leaves = []
    for path, a in flatten(tree):
        a = np.asarray(a, order="C")
        le = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
        leaves.append(
            {
                "path": list(path),
                "dtype": str(a.dtype),
                "shape": list(a.shape),
                "hex": le.tobytes().hex(),
            }
        )
    return leaves


def save_item(path, tree, *, use_ocdbt=True, use_zarr3=False, chunk=None, custom=None):
    import jax
    import orbax.checkpoint as ocp

    shutil.rmtree(path, ignore_errors=True)
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
    save_args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=chunk), tree)
    with ocp.Checkpointer(handler) as ck:
        ck.save(path, args=ocp.args.PyTreeSave(tree, save_args=save_args), custom_metadata=custom)


def save():
    import jax
    import orbax.checkpoint as ocp

    os.makedirs(OUT, exist_ok=True)
    expected = {}

    basic = arrays(1)
    expected["basic"] = describe(basic)
    # The default path: StandardCheckpointer (OCDBT + zarr v2), as MaxDiffusion saves.
    p = os.path.join(OUT, "ocdbt_zarr2")
    shutil.rmtree(p, ignore_errors=True)
    with ocp.StandardCheckpointer() as ck:
        ck.save(p, basic)
    save_item(os.path.join(OUT, "ocdbt_zarr3"), basic, use_zarr3=True, chunk=64)
    save_item(os.path.join(OUT, "plain_zarr2"), basic, use_ocdbt=False)
    save_item(os.path.join(OUT, "plain_zarr3"), basic, use_ocdbt=False, use_zarr3=True, chunk=64)

    # jax.Array leaves, as MaxDiffusion saves them: the _METADATA encoder is compared to this
    # file (value_type "jax.Array" with write_shape; numpy leaves above have neither).
    import jax.numpy as jnp

    jx = jax_tree(6)
    expected["jax_arrays"] = describe(jx)
    p = os.path.join(OUT, "jax_arrays")
    shutil.rmtree(p, ignore_errors=True)
    with ocp.StandardCheckpointer() as ck:
        ck.save(p, jax.tree.map(jnp.asarray, jx))

    nnx = nnx_value_tree(2)
    expected["nnx_value"] = describe(nnx)
    p = os.path.join(OUT, "nnx_value")
    shutil.rmtree(p, ignore_errors=True)
    with ocp.StandardCheckpointer() as ck:
        ck.save(p, nnx)

    lora = lora_tree(3)
    expected["lora"] = describe(lora)
    save_item(
        os.path.join(OUT, "lora"), lora, custom={"lora": {"rank": 4, "alpha": 8.0}}
    )

    # A CheckpointManager root, two steps; the latest (3) holds arrays(5).
    root = os.path.join(OUT, "manager")
    shutil.rmtree(root, ignore_errors=True)
    expected["manager_step1"] = describe(arrays(4))
    expected["manager_step3"] = describe(arrays(5))
    with ocp.CheckpointManager(
        root,
        item_names=("items",),
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False),
    ) as mngr:
        for step, seed in ((1, 4), (3, 5)):
            mngr.save(
                step,
                args=ocp.args.Composite(items=ocp.args.StandardSave(arrays(seed))),
                custom_metadata={"lora": {"rank": 8, "alpha": 16}},
            )
        mngr.wait_until_finished()

    expected_kv = multigen(os.path.join(OUT, "multigen"))

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(
            {
                "versions": versions(),
                "cases": expected,
                "multigen": expected_kv,
            },
            f,
            indent=1,
            sort_keys=True,
        )
        f.write("\n")


def multigen(path):
    """A bare OCDBT database written by tensorstore in 20 transactions: older generations
    move into version-tree nodes (arity 16), values above 100 bytes (tensorstore's default
    inline limit) go out of line, nodes are zstd-compressed. Returns the latest key/values."""
    import tensorstore as ts

    shutil.rmtree(path, ignore_errors=True)
    kv = ts.KvStore.open({"driver": "ocdbt", "base": "file://" + path}).result()
    latest = {}
    for g in range(20):
        key = f"k{g % 7:02d}"
        value = (f"gen{g}:" * (1 + 40 * (g % 3))).encode()
        kv.write(key, value).result()
        latest[key] = value
    return {k: v.hex() for k, v in sorted(latest.items())}


def versions():
    from importlib.metadata import version

    names = ("orbax-checkpoint", "tensorstore", "jax", "jaxlib", "numpy", "ml_dtypes")
    return {n: version(n) for n in names}


def check():
    """Restores golden/orbax/written/ (wanbake's encoder output) with Orbax and tensorstore
    and records what came back: path, dtype, shape, sha256 of the C-order bytes."""
    import orbax.checkpoint as ocp

    src = os.path.join(OUT, "written")
    # Restore from a copy: orbax must not be able to touch the committed bytes.
    tmp = os.path.join("/tmp", "wanbake_orbax_check")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    result = {"versions": versions(), "items": {}}
    for item in sorted(os.listdir(tmp)):
        ipath = os.path.join(tmp, item)
        if not os.path.isdir(ipath):
            continue
        with ocp.StandardCheckpointer() as ck:
            meta = ck.metadata(ipath)
            tree = ck.restore(ipath)
        leaves = []
        for path, a in flatten(tree):
            a = np.asarray(np.asarray(a), order="C")
            leaves.append(
                {
                    "path": list(path),
                    "dtype": str(a.dtype),
                    "shape": list(a.shape),
                    "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
                }
            )
        result["items"][item] = leaves
        # tensorstore itself lists the database's keys (every node reached, crc checked).
        import tensorstore as ts

        kv = ts.KvStore.open({"driver": "ocdbt", "base": "file://" + ipath}).result()
        result.setdefault("ocdbt_keys", {})[item] = sorted(
            k.decode() for k in kv.list().result()
        )
    # The files that were checked, so the Rust test can hold its encoder to these bytes.
    files = {}
    for dirpath, _, names in os.walk(src):
        for n in names:
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, src)
            with open(full, "rb") as f:
                files[rel] = hashlib.sha256(f.read()).hexdigest()
    result["files"] = dict(sorted(files.items()))
    with open(os.path.join(OUT, "restored.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    cmd = sys.argv[1] if len(sys.argv) > 1 else "save"
    {"save": save, "check": check}[cmd]()
