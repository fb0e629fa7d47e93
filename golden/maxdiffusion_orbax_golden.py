#!/usr/bin/env python3
"""MaxDiffusion's own pretrained Orbax cache: the oracle of `wanbake ... --to orbax`.

MaxDiffusion's code does the work: its WanModel, its diffusers loader (`load_wan_transformer`
with `_final_param_dtype`), its `cast_with_exclusion`, and `WanCheckpointer`'s
`_pretrained_save_items` / `_save_pretrained_checkpoint` / `_restore_pretrained_checkpoint`
(the cache `pretrained_orbax_dir` names). What it imports but this does not run (TPU kernels,
text encoders, the video pipeline) is stubbed; the three pipeline functions used
(`_final_param_dtype`, `cast_with_exclusion`, `_is_cast_excluded`) are read from
pipelines/wan/wan_pipeline.py's own source rather than importing the whole pipeline.

Pinned: MaxDiffusion source AI-Hypercomputer/maxdiffusion@7cfb8801d41d1728f0232cd7ee59e900a151fecf
(its src/ folder is the SRC argument; `git archive 7cfb8801 src | tar -x`), python 3.11,
orbax-checkpoint==0.12.8, tensorstore==0.1.86, jax[cpu]==0.10.2, flax==0.12.8 (the last for
python 3.11), optax==0.2.8, chex==0.1.92, treescope==0.1.10, absl-py==2.5.1, toolz==1.2.0,
rich==15.0.0, numpy==2.4.6, ml_dtypes==0.6.0, torch==2.15.0 (CPU), safetensors==0.8.0,
transformers==5.23.0, diffusers==0.36.0, huggingface_hub==1.33.0, einops==0.8.2, pillow==13.0.0
(what MaxDiffusion's modules import; STUBBED lists what is not installed). Made in a venv
holding /tmp/orbax-venv's and /tmp/lyco-venv's packages (a .pth file) plus flax and the
rest with --no-deps. CI never runs this; its outputs are committed.

    python golden/maxdiffusion_orbax_golden.py save SRC [CASE...]
        MaxDiffusion's caches of golden/models/ under golden/orbax/maxdiffusion/<case>/ and
        each case's leaves (path, dtype, shape, sha256 of the C-order bytes) in
        golden/orbax/maxdiffusion/<case>.json
    python golden/maxdiffusion_orbax_golden.py restore SRC CASE DIR
        MaxDiffusion's _restore_pretrained_checkpoint on DIR (wanbake's output), every leaf
        compared with CASE's leaves, wan_config with CASE's, and WanModel(**wan_config) built
        as create_sharded_logical_transformer builds it, its parameter tree compared with the
        restored one.
    python golden/maxdiffusion_orbax_golden.py time SRC DIFFUSERS_DIR CACHE
        (benchmark, not an oracle) seconds to a ready transformer on CPU JAX: MaxDiffusion's
        load from the diffusers folder against its restore of CACHE.

Cases: t2v_scanned (golden/models/t2v, scan_layers True, weights_dtype bfloat16), t2v_f32
(scan_layers True, float32), t2v_unscanned (scan_layers False, bfloat16), a14b (golden/models/
a14b, Wan 2.2's two transformers, bfloat16, scanned), t2v_merged_diffusers_lora (t2v with
diffusers' fuse_lora result of golden/adapters/diffusers_lora in place: MaxDiffusion's cache
of the reference-merged weights, for `merge --to orbax`). MaxDiffusion's loader reads only sharded
diffusers folders (diffusion_pytorch_model.safetensors.index.json), so each model folder is
copied to a temporary folder with that index added (every key -> the one shard).
"""

import ast
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import types
from functools import partial

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "orbax", "maxdiffusion")

CASES = {
    "t2v_scanned": ("t2v", True, "bfloat16"),
    "t2v_f32": ("t2v", True, "float32"),
    "t2v_unscanned": ("t2v", False, "bfloat16"),
    "a14b": ("a14b", True, "bfloat16"),
    # The reference-merged weights: t2v with diffusers' fuse_lora result of
    # adapters/diffusers_lora (golden/references/diffusers_lora.safetensors) in place.
    "t2v_merged_diffusers_lora": ("t2v+references/diffusers_lora.safetensors", True, "bfloat16"),
}

# Top-level modules MaxDiffusion imports that the save/restore path never runs.
STUBBED = ["tokamax", "qwix", "aqt", "tensorflow", "tensorboardX", "ftfy", "imageio", "cv2",
           "datasets", "grain", "librosa", "google.cloud", "tensorflow_datasets"]


class _Stub:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Stub()

    def __getattr__(self, name):
        return _Stub()

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def _pipeline_functions(src):
    """_CAST_EXCLUSION_KEYWORDS, _is_cast_excluded, _final_param_dtype and cast_with_exclusion,
    from MaxDiffusion's wan_pipeline.py source."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    path = os.path.join(src, "maxdiffusion", "pipelines", "wan", "wan_pipeline.py")
    tree = ast.parse(open(path).read())
    wanted = {"_CAST_EXCLUSION_KEYWORDS", "_is_cast_excluded", "_final_param_dtype", "cast_with_exclusion"}
    body = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in wanted for t in node.targets):
            body.append(node)
    ns = {"jax": jax, "jnp": jnp, "np": np}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    assert wanted <= set(ns), wanted - set(ns)
    return ns


def setup(src):
    sys.path.insert(0, src)
    sys.meta_path.insert(0, _StubFinder([n for n in STUBBED if not _installed(n)]))
    fns = _pipeline_functions(src)
    # wan_checkpointer imports WanPipeline only as a type bound.
    for name in ["maxdiffusion.pipelines", "maxdiffusion.pipelines.wan"]:
        m = types.ModuleType(name)
        m.__path__ = []
        sys.modules[name] = m
    wp = types.ModuleType("maxdiffusion.pipelines.wan.wan_pipeline")
    wp.WanPipeline = object
    sys.modules[wp.__name__] = wp
    from maxdiffusion.checkpointing.wan_checkpointer import WanCheckpointer
    from maxdiffusion.models.wan.transformers.transformer_wan import WanModel
    from maxdiffusion.models.wan.wan_utils import load_wan_transformer
    return fns, WanCheckpointer, WanModel, load_wan_transformer


def _installed(name):
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def sharded_copy(model_dir, tmp):
    """The folder with diffusion_pytorch_model.safetensors.index.json added to each
    transformer (MaxDiffusion's loader reads only sharded folders)."""
    from safetensors import safe_open

    dst = os.path.join(tmp, os.path.basename(model_dir))
    shutil.copytree(model_dir, dst)
    for root, _, files in os.walk(dst):
        if "diffusion_pytorch_model.safetensors" in files:
            with safe_open(os.path.join(root, "diffusion_pytorch_model.safetensors"), "np") as f:
                keys = list(f.keys())
            index = {"metadata": {}, "weight_map": {k: "diffusion_pytorch_model.safetensors" for k in keys}}
            with open(os.path.join(root, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
                json.dump(index, f)
    return dst


def model_folder(model, tmp):
    """`sharded_copy` of golden/models/<model>; for `<base>+<file>`, with the tensors of
    golden/<file> in place of the base's."""
    if "+" not in model:
        return sharded_copy(os.path.join(HERE, "models", model), tmp)
    from safetensors.numpy import load_file, save_file

    base, ref = model.split("+")
    path = sharded_copy(os.path.join(HERE, "models", base), tmp)
    st = os.path.join(path, "diffusion_pytorch_model.safetensors")
    weights, merged = load_file(st), load_file(os.path.join(HERE, ref))
    assert set(merged) <= set(weights), set(merged) - set(weights)
    weights.update(merged)
    save_file(weights, st)
    return path


def load_transformer(env, path, subfolder, scan, weights_dtype):
    """A WanModel with the diffusers weights, as create_sharded_logical_transformer makes it
    (its config fields that do not come from config.json keep WanModel's defaults; mesh,
    weights_dtype and scan_layers as the run sets them), on the host."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import Mesh

    fns, _, WanModel, load_wan_transformer = env
    dtype = jnp.dtype(weights_dtype)
    wan_config = WanModel.load_config(path, subfolder=subfolder)
    wan_config["mesh"] = Mesh(jax.devices()[:1], ("data",))
    wan_config["weights_dtype"] = dtype
    wan_config["scan_layers"] = scan
    model = nnx.eval_shape(lambda: WanModel(**wan_config, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    params = state.to_pure_dict()
    params = load_wan_transformer(
        path, params, "cpu", num_layers=wan_config["num_layers"], scan_layers=scan, subfolder=subfolder,
        cast_dtype_fn=partial(fns["_final_param_dtype"], dtype_to_cast=dtype),
    )
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: fns["cast_with_exclusion"](p, x, dtype_to_cast=dtype), params
    )
    params = jax.tree_util.tree_map(jnp.asarray, params)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state, rest)


def sources(model):
    if model == "a14b":
        return (
            (("low_noise_transformer_state", "low_noise_transformer"),
             ("high_noise_transformer_state", "high_noise_transformer")),
            "low_noise_transformer",
            {"low_noise_transformer": "transformer_2", "high_noise_transformer": "transformer"},
        )
    return ((("wan_state", "transformer"),), "transformer", {"transformer": ""})


def leaves(tree):
    import jax
    import numpy as np

    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
        a = np.asarray(x)
        out[".".join(keys)] = {
            "dtype": str(a.dtype),
            "shape": list(a.shape),
            "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(),
        }
    return out


def save(env, only):
    _, WanCheckpointer, _, _ = env
    os.makedirs(OUT, exist_ok=True)
    for case, (model, scan, wdtype) in CASES.items():
        if only and case not in only:
            continue
        state_sources, config_attr, subfolders = sources(model)
        with tempfile.TemporaryDirectory() as tmp:
            path = model_folder(model, tmp)
            pipeline = types.SimpleNamespace(**{
                attr: load_transformer(env, path, sub, scan, wdtype) for attr, sub in subfolders.items()
            })
        dest = os.path.join(OUT, case)
        shutil.rmtree(dest, ignore_errors=True)
        WanCheckpointer._save_pretrained_checkpoint(dest, pipeline, state_sources, config_attr)
        assert os.path.isdir(os.path.join(dest, "0")), f"{case}: MaxDiffusion saved nothing"
        restored = WanCheckpointer._restore_pretrained_checkpoint(dest, tuple(n for n, _ in state_sources))
        assert restored is not None, f"{case}: MaxDiffusion cannot restore its own cache"
        record = {n: leaves(restored[n]) for n, _ in state_sources}
        record["wan_config"] = dict(restored["wan_config"])
        with open(os.path.join(OUT, case + ".json"), "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        print(f"{case}: {sum(len(record[n]) for n, _ in state_sources)} leaves")


def restore(env, case, d):
    import jax
    from flax import nnx
    from jax.sharding import Mesh

    _, WanCheckpointer, WanModel, _ = env
    model, scan, _ = CASES[case]
    state_sources, _, _ = sources(model)
    names = tuple(n for n, _ in state_sources)
    expected = json.load(open(os.path.join(OUT, case + ".json")))
    d = os.path.abspath(d)
    restored = WanCheckpointer._restore_pretrained_checkpoint(d, names)
    assert restored is not None, f"MaxDiffusion could not restore {d}"
    bad = 0
    for n in names:
        got = leaves(restored[n])
        if got != expected[n]:
            for k in sorted(set(got) | set(expected[n])):
                if got.get(k) != expected[n].get(k):
                    print(f"  {n}: {k}: wanbake {got.get(k)} maxdiffusion {expected[n].get(k)}")
                    bad += 1
    if dict(restored["wan_config"]) != expected["wan_config"]:
        print(f"  wan_config: wanbake {dict(restored['wan_config'])}\n  maxdiffusion {expected['wan_config']}")
        bad += 1
    # create_sharded_logical_transformer: WanModel(**wan_config) with the run's fields set,
    # then its parameter tree must be the restored one.
    wan_config = dict(restored["wan_config"])
    wan_config["mesh"] = Mesh(jax.devices()[:1], ("data",))
    wan_config["scan_layers"] = scan
    shapes = nnx.eval_shape(lambda: WanModel(**wan_config, rngs=nnx.Rngs(0)))
    _, state, _ = nnx.split(shapes, nnx.Param, ...)
    want = {}
    for p, v in jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]:
        want[".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p)] = tuple(v.shape)
    for n in names:
        have = {k: tuple(v["shape"]) for k, v in leaves(restored[n]).items()}
        if have != want:
            print(f"  {n}: WanModel(**wan_config)'s tree differs from the restored one")
            bad += 1
    total = sum(len(expected[n]) for n in names)
    print(f"{case}: MaxDiffusion restored {d}: {total} leaves, {bad} differences")
    return bad == 0


def linked_sharded(model_dir, tmp):
    """`sharded_copy` with the weights linked, not copied (for large folders)."""
    from safetensors import safe_open

    dst = os.path.join(tmp, "model")
    os.makedirs(dst)
    for name in os.listdir(model_dir):
        os.symlink(os.path.join(os.path.abspath(model_dir), name), os.path.join(dst, name))
    with safe_open(os.path.join(dst, "diffusion_pytorch_model.safetensors"), "np") as f:
        keys = list(f.keys())
    index = {"metadata": {}, "weight_map": {k: "diffusion_pytorch_model.safetensors" for k in keys}}
    with open(os.path.join(dst, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    return dst


def timing(env, model_dir, cache):
    """Seconds to a ready transformer (parameters on the host, merged into WanModel) on CPU
    JAX: MaxDiffusion's load from the diffusers folder (its loader, bf16 with its f32 rule)
    against its restore of a cache (`_restore_pretrained_checkpoint`, then the same merge)."""
    import time

    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import Mesh

    _, WanCheckpointer, WanModel, _ = env
    with tempfile.TemporaryDirectory() as tmp:
        path = linked_sharded(model_dir, tmp)
        t0 = time.perf_counter()
        model = load_transformer(env, path, "", True, "bfloat16")
        jax.block_until_ready(nnx.state(model, nnx.Param))
        t_load = time.perf_counter() - t0
    del model
    t0 = time.perf_counter()
    restored = WanCheckpointer._restore_pretrained_checkpoint(os.path.abspath(cache), ("wan_state",))
    assert restored is not None
    wan_config = dict(restored["wan_config"])
    wan_config["mesh"] = Mesh(jax.devices()[:1], ("data",))
    wan_config["weights_dtype"] = jnp.bfloat16
    model = nnx.eval_shape(lambda: WanModel(**wan_config, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    nnx.replace_by_pure_dict(state, restored["wan_state"])
    model = nnx.merge(graphdef, state, rest)
    jax.block_until_ready(nnx.state(model, nnx.Param))
    t_restore = time.perf_counter() - t0
    print(f"load from diffusers {t_load:.1f} s; restore of the cache {t_restore:.1f} s")


def main():
    cmd, src = sys.argv[1], sys.argv[2]
    env = setup(src)
    if cmd == "save":
        save(env, sys.argv[3:])
    elif cmd == "time":
        timing(env, sys.argv[3], sys.argv[4])
    elif cmd == "restore":
        sys.exit(0 if restore(env, sys.argv[3], sys.argv[4]) else 1)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
