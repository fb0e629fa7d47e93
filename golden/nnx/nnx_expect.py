"""Expected MaxDiffusion NNX layout of a diffusers WanTransformer3DModel checkpoint (numpy only).

This is the independent oracle for wanbake's NNX restack. It re-implements, rule for rule, how
MaxDiffusion's `load_base_wan_transformer` (src/maxdiffusion/models/wan/wan_utils.py) turns a
diffusers WAN state dict into the flat NNX parameter tree, as described in spec wan.md §4.3
and checked against the maxdiffusion source (the 2026 wan_utils.py that carries
`rename_key`, `rename_key_and_reshape_tensor`, `_rename_common_wan_transformer_key`,
`rename_for_nnx` and the preallocated (L, ...) stacking of PR #438):

1. skip every key containing `norm_added_q`;
2. `rename_key`: each match of the regex `\\w+[.]\\d+` has its dot replaced by `_`;
3. `_rename_common_wan_transformer_key`: string replaces in source order (image-embedder
   branch first, then blocks_ -> blocks., .scale_shift_table -> .adaln_scale_shift_table,
   to_out_0 -> proj_attn, ffn.net_2 -> ffn.proj_out, ffn.net_0 -> ffn.act_fn, norm2 ->
   norm2.layer_norm);
4. split on dots; with scan_layers, a leading `blocks`, `<i>` pair becomes `blocks` and i is the
   row of the stacked (L, ...) array;
5. `rename_key_and_reshape_tensor` against the model's own parameter tree (the rules consult
   which paths exist, so the expected tree is built here from the config, spec wan.md §4.2);
6. `rename_for_nnx` (a `norm_q` / `norm_k` path element forces the leaf to `scale`), then
   numeric path elements become ints.

Unlike MaxDiffusion (which only logs), every produced key must exist in the expected tree with
the expected shape and every tree entry must be produced; anything else raises.

Run standalone to regenerate the JSON files from golden/models:

    python golden/nnx/nnx_expect.py
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
MODEL_NAMES = ("t2v", "i2v", "flf2v", "ti2v")

_NP_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16}


def read_safetensors(path: Path) -> dict:
    """Minimal safetensors reader (little-endian F16/F32/F64), numpy only."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    data = raw[8 + header_len :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = np.dtype(_NP_DTYPES[info["dtype"]]).newbyteorder("<")
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"]).copy()
    return out


# ---- the MaxDiffusion renaming rules -----------------------------------------------------------


def rename_key(key: str) -> str:
    for pat in re.findall(r"\w+[.]\d+", key):
        key = key.replace(pat, "_".join(pat.split(".")))
    return key


def rename_common_wan_transformer_key(key: str) -> str:
    if "condition_embedder" in key:  # only matters for original-named keys; no-op for diffusers keys
        key = key.replace("time_embedding_0", "time_embedder.linear_1")
        key = key.replace("time_embedding_2", "time_embedder.linear_2")
        key = key.replace("time_projection_1", "time_proj")
        key = key.replace("text_embedding_0", "text_embedder.linear_1")
        key = key.replace("text_embedding_2", "text_embedder.linear_2")
    if "image_embedder" in key:
        if "net.0.proj" in key:
            key = key.replace("net.0.proj", "net_0")
        elif "net_0.proj" in key:
            key = key.replace("net_0.proj", "net_0")
        if "net.2" in key:
            key = key.replace("net.2", "net_2")
        key = key.replace("norm1", "norm1.layer_norm")
        if "norm1" in key or "norm2" in key:
            key = key.replace("weight", "scale")
            key = key.replace("kernel", "scale")
    key = key.replace("blocks_", "blocks.")
    key = key.replace(".scale_shift_table", ".adaln_scale_shift_table")
    key = key.replace("to_out_0", "proj_attn")
    key = key.replace("ffn.net_2", "ffn.proj_out")
    key = key.replace("ffn.net_0", "ffn.act_fn")
    key = key.replace("norm2", "norm2.layer_norm")
    return key


def rename_key_and_reshape_tensor(key: tuple, tensor: np.ndarray, tree: set) -> tuple:
    """Returns (new key, new tensor, transform name). `tree` holds string tuples."""
    if len(key) > 1:
        for rename_from, rename_to in (("to_out_0", "proj_attn"), ("to_k", "key"), ("to_v", "value"), ("to_q", "query")):
            if key[-2] == rename_from:
                leaf = "kernel" if key[-1] == "weight" else key[-1]
                renamed = key[:-2] + (rename_to, leaf)
                if renamed in tree:
                    return renamed, tensor.T, _transpose_name(tensor)
    if (
        any("norm" in part for part in key)
        and key[-1] == "bias"
        and key[:-1] + ("bias",) not in tree
        and key[:-1] + ("scale",) in tree
    ):
        return key[:-1] + ("scale",), tensor, "none"
    if key[-1] in ("weight", "gamma") and key[:-1] + ("scale",) in tree:
        return key[:-1] + ("scale",), tensor, "none"
    if key[-1] == "weight" and tensor.ndim == 4:
        return key[:-1] + ("kernel",), tensor.transpose(2, 3, 1, 0), "transpose(2,3,1,0)"
    if key[-1] == "weight" and tensor.ndim == 5:
        return key[:-1] + ("kernel",), tensor.transpose(2, 3, 4, 1, 0), "transpose(2,3,4,1,0)"
    if key[-1] == "weight":
        return key[:-1] + ("kernel",), tensor.T, _transpose_name(tensor)
    if key[-1] == "gamma":
        return key, tensor.flatten(), "flatten"
    if key[-1] == "beta":
        return key[:-1] + ("bias",), tensor, "none"
    return key, tensor, "none"


def _transpose_name(tensor: np.ndarray) -> str:
    return "transpose(1,0)" if tensor.ndim == 2 else "none"


def rename_for_nnx(key: tuple) -> tuple:
    if "norm_k" in key or "norm_q" in key:
        return key[:-1] + ("scale",)
    return key


def tuple_str_to_int(key: tuple) -> tuple:
    out = []
    for item in key:
        try:
            out.append(int(item))
        except ValueError:
            out.append(item)
    return tuple(out)


# ---- the NNX parameter tree a WanModel with this config has (spec wan.md §4.1-4.2) ------------


def expected_tree(config: dict, scan_layers: bool) -> dict:
    """Flat NNX paths (string tuples, block index as a string) -> shape."""
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    dim = heads * head_dim
    layers, ffn = config["num_layers"], config["ffn_dim"]
    pt, ph, pw = config["patch_size"]
    c_in = config["in_channels"]
    c_out = config.get("out_channels") or c_in
    tree = {
        ("patch_embedding", "kernel"): (pt, ph, pw, c_in, dim),
        ("patch_embedding", "bias"): (dim,),
        ("scale_shift_table",): (1, 2, dim),
        ("proj_out", "kernel"): (dim, c_out * pt * ph * pw),
        ("proj_out", "bias"): (c_out * pt * ph * pw,),
    }

    def linear(path, fan_in, fan_out):
        tree[path + ("kernel",)] = (fan_in, fan_out)
        tree[path + ("bias",)] = (fan_out,)

    ce = ("condition_embedder",)
    linear(ce + ("time_embedder", "linear_1"), config["freq_dim"], dim)
    linear(ce + ("time_embedder", "linear_2"), dim, dim)
    linear(ce + ("time_proj",), dim, 6 * dim)
    linear(ce + ("text_embedder", "linear_1"), config["text_dim"], dim)
    linear(ce + ("text_embedder", "linear_2"), dim, dim)
    image_dim = config.get("image_dim")
    if image_dim is not None:
        ie = ce + ("image_embedder",)
        tree[ie + ("norm1", "layer_norm", "scale")] = (image_dim,)
        tree[ie + ("norm1", "layer_norm", "bias")] = (image_dim,)
        linear(ie + ("ff", "net_0"), image_dim, image_dim)
        linear(ie + ("ff", "net_2"), image_dim, dim)
        tree[ie + ("norm2", "layer_norm", "scale")] = (dim,)
        tree[ie + ("norm2", "layer_norm", "bias")] = (dim,)
        if config.get("pos_embed_seq_len") is not None:
            tree[ie + ("pos_embed",)] = (1, config["pos_embed_seq_len"], image_dim)
    added_kv = config.get("added_kv_proj_dim")
    block = {("adaln_scale_shift_table",): (1, 6, dim)}
    for attn in ("attn1", "attn2"):
        for proj in ("query", "key", "value", "proj_attn"):
            block[(attn, proj, "kernel")] = (dim, dim)
            block[(attn, proj, "bias")] = (dim,)
        block[(attn, "norm_q", "scale")] = (dim,)
        block[(attn, "norm_k", "scale")] = (dim,)
    if added_kv is not None:
        for proj in ("add_k_proj", "add_v_proj"):
            block[("attn2", proj, "kernel")] = (added_kv, dim)
            block[("attn2", proj, "bias")] = (dim,)
        block[("attn2", "norm_added_k", "scale")] = (dim,)
    block[("norm2", "layer_norm", "scale")] = (dim,)
    block[("norm2", "layer_norm", "bias")] = (dim,)
    block[("ffn", "act_fn", "proj", "kernel")] = (dim, ffn)
    block[("ffn", "act_fn", "proj", "bias")] = (ffn,)
    block[("ffn", "proj_out", "kernel")] = (ffn, dim)
    block[("ffn", "proj_out", "bias")] = (dim,)
    for path, shape in block.items():
        if scan_layers:
            tree[("blocks",) + path] = (layers,) + shape
        else:
            for i in range(layers):
                tree[("blocks", str(i)) + path] = shape
    return tree


# ---- conversion ------------------------------------------------------------------------------


def convert(config: dict, tensors: dict, scan_layers: bool, arrays: dict | None = None) -> list:
    """Applies the rules to a diffusers state dict; returns the sorted JSON entries (and, when
    `arrays` is given, fills it with every NNX key's array: golden/orbax_input_golden.py)."""
    tree_shapes = expected_tree(config, scan_layers)
    tree = set(tree_shapes)
    layers = config["num_layers"]
    flat, stacks = {}, {}
    for pt_key in sorted(tensors):
        if "norm_added_q" in pt_key:
            continue
        tuple_key = tuple(rename_common_wan_transformer_key(rename_key(pt_key)).split("."))
        block_index = None
        if scan_layers and len(tuple_key) >= 2 and tuple_key[0] == "blocks":
            block_index = int(tuple_key[1])
            tuple_key = ("blocks",) + tuple_key[2:]
        flax_key, array, transform = rename_key_and_reshape_tensor(tuple_key, tensors[pt_key], tree)
        flax_key = tuple_str_to_int(rename_for_nnx(flax_key))
        name = ".".join(str(p) for p in flax_key)
        if block_index is None:
            if name in flat:
                raise KeyError(f"{pt_key}: NNX key {name} produced twice")
            flat[name] = {"array": np.ascontiguousarray(array), "source_keys": [pt_key], "transform": transform,
                          "tree_key": tuple(str(p) for p in flax_key)}
        else:
            slot = stacks.setdefault(name, {"rows": {}, "transform": transform, "tree_key": tuple(str(p) for p in flax_key)})
            if block_index in slot["rows"] or slot["transform"] != transform:
                raise KeyError(f"{pt_key}: inconsistent stacking for {name}")
            slot["rows"][block_index] = (pt_key, array)
    for name, slot in stacks.items():
        if sorted(slot["rows"]) != list(range(layers)):
            raise KeyError(f"{name}: stacked rows {sorted(slot['rows'])}, expected 0..{layers - 1}")
        rows = [slot["rows"][i] for i in range(layers)]
        flat[name] = {
            "array": np.ascontiguousarray(np.stack([a for _, a in rows], axis=0)),
            "source_keys": [k for k, _ in rows],
            "transform": f"{slot['transform']} per layer, then stack on a new leading axis (L={layers})",
            "tree_key": slot["tree_key"],
        }
    produced = {entry["tree_key"]: entry for entry in flat.values()}
    missing = sorted(set(tree_shapes) - set(produced))
    unexpected = sorted(set(produced) - set(tree_shapes))
    if missing or unexpected:
        raise KeyError(f"NNX tree mismatch: missing {missing[:6]}, unexpected {unexpected[:6]}")
    out = []
    for name in sorted(flat):
        entry = flat[name]
        array = entry["array"]
        if tuple(array.shape) != tuple(tree_shapes[entry["tree_key"]]):
            raise ValueError(f"{name}: shape {array.shape}, expected {tree_shapes[entry['tree_key']]}")
        if arrays is not None:
            arrays[name] = array
        out.append({
            "key": name,
            "shape": list(array.shape),
            "source_keys": entry["source_keys"],
            "transform": entry["transform"],
            "first8": [float(v) for v in array.reshape(-1)[:8]],
            "sum": float(np.sum(array, dtype=np.float64)),
        })
    return out


def write_expectations(model_dir: Path, name: str, out_dir: Path) -> list:
    config = json.loads((model_dir / "config.json").read_text())
    tensors = read_safetensors(model_dir / "diffusion_pytorch_model.safetensors")
    paths = []
    for scan in (True, False):
        entries = convert(config, tensors, scan)
        path = out_dir / f"{name}_{'scanned' if scan else 'unscanned'}.json"
        path.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
        paths.append(path)
    return paths


def main(models_dir: Path = MODELS, out_dir: Path = HERE) -> list:
    paths = []
    for name in MODEL_NAMES:
        paths.extend(write_expectations(models_dir / name, name, out_dir))
    return paths


if __name__ == "__main__":
    for p in main():
        print(p)
    sys.exit(0)
