#!/usr/bin/env python
"""WAN variants (issue #31): VACE and SkyReels-V2 golden fixtures, made by the reference tools.

What this module writes (relative to golden/variants/):

- vace/models/: a tiny seeded `WanVACETransformer3DModel` (diffusers `save_pretrained`), the same
  weights under original Wan names (proved by diffusers' own single-file converter and by the
  rename dict of scripts/convert_wan_to_diffusers.py), the ComfyUI single file, the Kijai-style
  "VACE module" file, and MaxDiffusion's NNX parameter tree of the model (`vace_nnx.*`).
- vace/adapters/, vace/references/: one LoRA in PEFT, DiffSynth-Studio, ComfyUI and kohya
  spelling; PEFT's `merge_and_unload` at strength 1 and 0.5 is the reference.
- vace/runner/: conditional forwards of the tiny model (full-length and short control latents).
- vace/shapes/: every parameter of the released VACE configs (torch meta device).
- skyreels/...: the same for a tiny `SkyReelsV2Transformer3DModel` with inject_sample_info.
- vace/manifest.json, skyreels/manifest.json: index of every file, case and probe.

Run from the repository root (PYTHONHASHSEED is fixed by re-executing, as generate.py does):

    /tmp/d42-venv/bin/python golden/variants_vace_golden.py

The NNX part runs MaxDiffusion in its own environment: `MAXD_PYTHON` (default
/tmp/maxd-venv/bin/python) executes `variants_vace_golden.py nnx-dump MODEL_DIR OUT`, with
MaxDiffusion's src/ at `MAXD_SRC` (default /tmp/maxd-src/src, `git archive 7cfb8801 src`).
The converter scripts are read from the diffusers git directory `DIFFUSERS_GIT` (default
/work/.mirror/huggingface+diffusers/repo) at commit DIFFUSERS_SCRIPTS_COMMIT.
Helpers (canonical safetensors writer, init rule, original-Wan rename table, PEFT helpers) come
from wan_golden.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
VARIANTS = GOLDEN / "variants"
VACE = VARIANTS / "vace"
SKY = VARIANTS / "skyreels"
DIFFUSERS_GIT = os.environ.get("DIFFUSERS_GIT", "/work/.mirror/huggingface+diffusers/repo")
DIFFUSERS_SCRIPTS_COMMIT = "58eb52c0803ea9af3abec60841c2a093bdf1f951"
MAXD_PYTHON = os.environ.get("MAXD_PYTHON", "/tmp/maxd-venv/bin/python")
MAXD_SRC = os.environ.get("MAXD_SRC", "/tmp/maxd-src/src")
MAXD_COMMIT = "7cfb8801d41d1728f0232cd7ee59e900a151fecf"
SIZE_BUDGET_BYTES = {"vace": int(2.4e6), "skyreels": int(1.4e6)}


# --------------------------------------------------------------------------------------------
# MaxDiffusion side (runs under MAXD_PYTHON; numpy / safetensors / jax / flax only).
# --------------------------------------------------------------------------------------------


def nnx_dump(model_dir: str, out_prefix: str) -> None:
    """MaxDiffusion's WanVACEModel tree, filled by its own loader from a diffusers folder.

    As pipelines/wan/wan_vace_pipeline_2_1.py create_sharded_logical_transformer does:
    WanVACEModel.load_config, scan_layers False, nnx.eval_shape, nnx.split(Param),
    load_wan_transformer(..., scan_layers=False, cast_dtype_fn=_final_param_dtype) and
    cast_with_exclusion, weights_dtype float32. Writes OUT.safetensors (numpy, dotted NNX paths)
    and OUT.json (the config the model was built from, every leaf's shape, the eval_shape tree).
    """
    import tempfile
    from functools import partial

    sys.path.insert(0, str(GOLDEN))
    import maxdiffusion_orbax_golden as mog

    sys.path.insert(0, MAXD_SRC)
    sys.meta_path.insert(0, mog._StubFinder([n for n in mog.STUBBED if not mog._installed(n)]))
    fns = mog._pipeline_functions(MAXD_SRC)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh
    from maxdiffusion.models.wan.transformers.transformer_wan_vace import WanVACEModel
    from maxdiffusion.models.wan.wan_utils import load_wan_transformer
    from safetensors.numpy import save_file

    dtype = jnp.float32
    wan_config = WanVACEModel.load_config(model_dir)
    recorded_config = {k: v for k, v in sorted(wan_config.items()) if not k.startswith("_")}
    wan_config["mesh"] = Mesh(jax.devices()[:1], ("data",))
    wan_config["weights_dtype"] = dtype
    wan_config["scan_layers"] = False
    scan_error = None
    try:
        nnx.eval_shape(lambda: WanVACEModel(**dict(wan_config, scan_layers=True), rngs=nnx.Rngs(0)))
    except NotImplementedError as err:
        scan_error = f"NotImplementedError: {err}"
    model = nnx.eval_shape(lambda: WanVACEModel(**wan_config, rngs=nnx.Rngs(0)))
    _, state, _ = nnx.split(model, nnx.Param, ...)
    shapes = {_dotted(p): list(v.shape) for p, v in jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]}
    with tempfile.TemporaryDirectory() as tmp:
        path = mog.sharded_copy(model_dir, tmp)
        params = load_wan_transformer(
            path, state.to_pure_dict(), "cpu", num_layers=wan_config["num_layers"], scan_layers=False,
            subfolder="", cast_dtype_fn=partial(fns["_final_param_dtype"], dtype_to_cast=dtype),
        )
    params = jax.tree_util.tree_map_with_path(lambda p, x: fns["cast_with_exclusion"](p, x, dtype_to_cast=dtype), params)
    leaves = {_dotted(p): np.ascontiguousarray(np.asarray(x)) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    save_file(leaves, out_prefix + ".safetensors")
    record = {
        "wan_config": recorded_config,
        "eval_shape_tree": shapes,
        "loaded_shapes": {k: list(v.shape) for k, v in sorted(leaves.items())},
        "loaded_dtypes": sorted({str(v.dtype) for v in leaves.values()}),
        "scan_layers_true": scan_error,
        "versions": {"jax": jax.__version__, "flax": _version("flax"), "maxdiffusion": MAXD_COMMIT},
    }
    Path(out_prefix + ".json").write_text(json.dumps(record, indent=1, sort_keys=True))


def _dotted(path) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


# --------------------------------------------------------------------------------------------
# diffusers / PEFT side (runs under the pinned venv of requirements.txt).
# --------------------------------------------------------------------------------------------

VACE_SEED = 3101
SKY_SEED = 3201
LORA_RANK, LORA_ALPHA = 4, 8
CONTROL_SCALE = [0.7, 1.3]

VACE_LORA_TARGETS = [
    "vace_patch_embedding",
    "vace_blocks.0.proj_in",
    "vace_blocks.0.proj_out",
    "vace_blocks.1.proj_out",
    "vace_blocks.0.attn1.to_q",
    "vace_blocks.1.attn1.to_q",
    "vace_blocks.0.attn2.to_v",
    "vace_blocks.0.ffn.net.0.proj",
    "vace_blocks.1.ffn.net.2",
    "blocks.0.attn1.to_q",
    "blocks.2.ffn.net.0.proj",
    "blocks.3.attn2.to_out.0",
]
SKY_LORA_TARGETS = [
    "fps_projection.net.0.proj",
    "fps_projection.net.2",
    "blocks.0.attn1.to_q",
    "blocks.1.ffn.net.0.proj",
    "blocks.2.attn2.to_out.0",
    "condition_embedder.time_proj",
]

wg = None  # wan_golden, imported by run()


def vace_config() -> dict:
    return dict(wg.T2V_CONFIG, num_layers=4, vace_layers=[0, 2], vace_in_channels=6)


def sky_config() -> dict:
    return dict(wg.T2V_CONFIG, num_layers=3, inject_sample_info=True)


def build_seeded(cls, config: dict, seed: int):
    """wan_golden's init rule (torch.randn per parameter, sorted-name order) on any WAN class."""
    import torch

    torch.manual_seed(seed)
    model = cls(**config)
    rng = wg.Rng(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            param.copy_(wg._init_value(name, param.shape, rng))
    return model.eval()


def load(cls, folder: Path):
    import torch

    return cls.from_pretrained(folder, torch_dtype=torch.float32).eval()


def state(cls, folder: Path) -> dict:
    return {k: v.detach().clone() for k, v in load(cls, folder).state_dict().items()}


def rel(path: Path) -> str:
    return wg.rel(path)


# ---- original names -------------------------------------------------------------------------

_VACE_ONLY = {"proj_in": "before_proj", "proj_out": "after_proj"}
_FPS = {"fps_projection.net.0.proj": "fps_projection.0", "fps_projection.net.2": "fps_projection.2"}


def original_key(key: str) -> str:
    """diffusers -> original Wan / SkyReels-V2 name (wan_golden's table + VACE + fps rules)."""
    import re

    m = re.fullmatch(r"vace_blocks\.(\d+)\.(.+)", key)
    if m:
        n, rest = m.groups()
        mod, _, leaf = rest.rpartition(".")
        if mod in _VACE_ONLY:
            return f"vace_blocks.{n}.{_VACE_ONLY[mod]}.{leaf}"
        return "vace_" + wg.to_original_key(f"blocks.{n}.{rest}")
    if key.startswith("vace_patch_embedding.") or key == "fps_embedding.weight":
        return key
    mod, _, leaf = key.rpartition(".")
    if mod in _FPS:
        return f"{_FPS[mod]}.{leaf}"
    return wg.to_original_key(key)


def original_module(module: str) -> str:
    return original_key(module + ".weight").removesuffix(".weight")


def script_rename_dict(script: str, name: str) -> dict:
    """A rename dict of a diffusers conversion script, read from the pinned commit."""
    import ast

    src = subprocess.check_output(["git", "-C", DIFFUSERS_GIT, "show", f"{DIFFUSERS_SCRIPTS_COMMIT}:{script}"], text=True)
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{name} not in {script}")


def script_transformer_configs(script: str) -> dict:
    """model_type -> get_transformer_config(model_type)'s config dict, from the script's source."""
    import ast
    import pathlib

    import torch

    src = subprocess.check_output(["git", "-C", DIFFUSERS_GIT, "show", f"{DIFFUSERS_SCRIPTS_COMMIT}:{script}"], text=True)
    tree = ast.parse(src)
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) or (
        isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets))]
    from typing import Any, Dict, Tuple

    ns = {"pathlib": pathlib, "torch": torch, "Dict": Dict, "Any": Any, "Tuple": Tuple}
    exec(compile(ast.Module(body=body, type_ignores=[]), script, "exec"), ns)
    fn = ns["get_transformer_config"]
    types = [c.value for n in ast.walk(tree) if isinstance(n, ast.Compare) and isinstance(n.left, ast.Name)
             and n.left.id == "model_type" and isinstance(n.ops[0], ast.Eq) for c in n.comparators if isinstance(c, ast.Constant)]
    out = {}
    for t in types:
        result = fn(t)
        out[t] = result[0] if isinstance(result, tuple) else result
    return out


def apply_script_renames(original: dict, renames: dict) -> dict:
    """convert_transformer's loop: every rename applied in order as a substring replace."""
    out = {}
    for key, value in original.items():
        new = key
        for old, repl in renames.items():
            new = new.replace(old, repl)
        out[new] = value
    return out


def same_tensors(a: dict, b: dict) -> str | None:
    import torch

    if set(a) != set(b):
        return f"keys differ: {sorted(set(a) ^ set(b))[:8]}"
    bad = [k for k in a if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    return f"tensors differ: {bad[:8]}" if bad else None


# ---- adapters -------------------------------------------------------------------------------


def peft_adapter(model, targets: list, seed: int, adapter_dir: Path):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=list(targets), init_lora_weights=True)
    peft_model = get_peft_model(model, config)
    wg.randomize_lora(peft_model, seed)
    wg.save_peft_adapter(peft_model, adapter_dir)
    cfg_path = adapter_dir / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    raw = {k.removeprefix("base_model.model."): v.detach().clone() for k, v in peft_model.state_dict().items() if "lora_" in k}
    return raw


def peft_reference(cls, folder: Path, adapter_dir: Path, strength: float):
    from peft import PeftModel

    model = PeftModel.from_pretrained(load(cls, folder), str(adapter_dir))
    applied = wg.applied_state(model, f"{wg.PEFT_TOOL} PeftModel.from_pretrained")
    if strength != 1.0:
        for _, layer in wg.lora_layers(model):
            layer.scale_layer(strength)
    return model.merge_and_unload().state_dict(), applied


def convention_files(raw: dict, scaling: float) -> dict:
    """The PEFT adapter re-spelled: {convention: tensors}.

    raw: PEFT's module state dict (`<diffusers module>.lora_A.default.weight`). DiffSynth keeps
    PEFT's `.default.` spelling on original names without alpha (its LoraConfig has
    lora_alpha = r, scale 1), so PEFT's scaling alpha/r is folded into lora_B (x2, exact).
    ComfyUI and kohya carry `.alpha` = lora_alpha.
    """
    import torch

    out = {"diffsynth": {}, "comfy": {}, "kohya": {}}
    for key, value in sorted(raw.items()):
        module, _, rest = key.partition(".lora_")
        orig = original_module(module)
        is_a = rest.startswith("A.")
        out["diffsynth"][f"{orig}.lora_{'A' if is_a else 'B'}.default.weight"] = value if is_a else value * scaling
        spelled = "lora_down.weight" if is_a else "lora_up.weight"
        out["comfy"][f"diffusion_model.{orig}.{spelled}"] = value
        stem = "lora_unet_" + orig.replace(".", "_")
        out["kohya"][f"{stem}.{spelled}"] = value
        if is_a:
            alpha = torch.tensor(float(LORA_ALPHA), dtype=torch.float32)
            out["comfy"][f"diffusion_model.{orig}.alpha"] = alpha
            out["kohya"][f"{stem}.alpha"] = alpha.clone()
    return out


def parse_convention(tensors: dict, base: dict, convention: str) -> list:
    """Independent reader of the three spellings -> wan_golden Contributions (float64)."""
    orig_to_diff = {original_key(k): k for k in base}
    alias = {"lora_unet_" + o.removesuffix(".weight").replace(".", "_"): o.removesuffix(".weight")
             for o in orig_to_diff if o.endswith(".weight")}
    modules: dict = {}
    for key, value in tensors.items():
        if convention == "kohya":
            stem, _, suffix = key.partition(".")
            mod = alias[stem]
        else:
            name = key.removeprefix("diffusion_model.") if convention == "comfy" else key
            m = wg._ORIG_SUFFIX.match(name)
            mod, suffix = m.group("mod"), m.group("suf")
        parts = modules.setdefault(mod, {"lora_keys": []})
        parts["lora_keys"].append(key)
        if suffix in ("lora_down.weight", "lora_A.default.weight"):
            parts["down"] = value
        elif suffix in ("lora_up.weight", "lora_B.default.weight"):
            parts["up"] = value
        elif suffix == "alpha":
            parts["alpha"] = value
        else:
            raise KeyError(f"{key}: unexpected suffix {suffix!r}")
    return wg._contributions_from_modules(modules, base, orig_to_diff)


def write_ref(root: Path, stem: str, tensors: dict, strength: float, tool: str, kind: str = "reference") -> Path:
    path = root / "references" / f"{stem}{'' if strength == 1.0 else f'__s{strength:g}'}.safetensors"
    wg.write_safetensors(path, tensors, {"case": stem, "strength": f"{strength:g}", "tool": tool, "kind": kind, "dtype_note": "f32"})
    return path


def lora_cases(root: Path, cls, folder: Path, targets: list, seed: int, prefix: str, diffusers_pipe=None) -> dict:
    """PEFT LoRA + its DiffSynth / ComfyUI / kohya spellings, PEFT merge as the reference."""
    import torch

    adapters = root / "adapters"
    peft_dir = adapters / f"{prefix}_peft"
    raw = peft_adapter(load(cls, folder), targets, seed, peft_dir)
    base = state(cls, folder)
    cases, refs = {}, {}
    for strength in (1.0, 0.5):
        merged, applied = peft_reference(cls, folder, peft_dir, strength)
        ref = wg.changed_tensors(merged, base)
        wg.check_against_applied(base, applied, ref, strength)
        tool = f"{wg.PEFT_TOOL} PeftModel.from_pretrained + " + ("" if strength == 1.0 else f"LoraLayer.scale_layer({strength:g}) + ") + "merge_and_unload"
        refs[f"{strength:g}"] = (ref, rel(write_ref(root, f"{prefix}_lora", ref, strength, tool)), tool)
        if strength == 1.0:
            path = root / "references" / f"{prefix}_lora__applied.safetensors"
            wg.write_safetensors(path, applied[0], applied[1])
            applied_path = rel(path)
            scalings = set(json.loads(applied[1]["scaling"]).values())
    assert scalings == {LORA_ALPHA / LORA_RANK}, scalings
    reference_block = {s: {"reference": p, "tool": t} for s, (_, p, t) in refs.items()}
    cases[f"{prefix}_peft"] = {
        "convention": "peft", "adapter": [rel(peft_dir / "adapter_config.json"), rel(peft_dir / "adapter_model.safetensors")],
        "strengths": reference_block, "applied": applied_path, "reference_tool": f"{wg.PEFT_TOOL} merge_and_unload",
    }
    files = convention_files(raw, LORA_ALPHA / LORA_RANK)
    names = {"diffsynth": f"{prefix}_diffsynth.safetensors", "comfy": f"{prefix}_comfy.safetensors", "kohya": f"{prefix}_kohya.safetensors"}
    for convention, tensors in files.items():
        path = adapters / names[convention]
        wg.write_safetensors(path, tensors)
        contributions = parse_convention(tensors, base, convention)
        for s, (ref, _, _) in refs.items():
            hand = wg.hand_merge(base, contributions, float(s))
            if set(hand) != set(ref):
                raise AssertionError(f"{convention}: targets {sorted(set(hand) ^ set(ref))}")
            for k in ref:
                tol = 4 * torch.finfo(torch.float32).eps * float(ref[k].abs().max())
                err = float((hand[k].double() - ref[k].double()).abs().max())
                if err > tol:
                    raise AssertionError(f"{convention} {k} s{s}: {err} > {tol}")
        entry = {"convention": convention, "adapter": [rel(path)], "strengths": reference_block,
                 "reference_tool": f"{wg.PEFT_TOOL} merge_and_unload of {prefix}_peft (the same LoRA)",
                 "checked": "float64 hand merge of this file's tensors (W + alpha/r*up@down) agrees with the reference within 4 eps_f32 max|ref| per tensor"}
        if diffusers_pipe is not None and convention in ("comfy", "kohya", "diffsynth"):
            entry["diffusers_probe"] = diffusers_pipe(path)
        cases[f"{prefix}_{convention}"] = entry
    return cases


# ---- runner ---------------------------------------------------------------------------------


def write_runner(root: Path, name: str, tensors: dict, meta: dict) -> str:
    path = root / "runner" / f"{name}.safetensors"
    wg.write_safetensors(path, tensors, {k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in meta.items()})
    return rel(path)


def vace_runner(folder: Path) -> dict:
    import torch
    from diffusers import WanVACETransformer3DModel

    config = vace_config()
    inputs = wg.runner_inputs("t2v", config, 4101)
    rng = wg.Rng(4102)
    f, h, w = wg.LATENT_FHW
    inputs["control_hidden_states"] = rng.normal((1, config["vace_in_channels"], f, h, w))
    inputs["control_hidden_states_scale"] = torch.tensor(CONTROL_SCALE, dtype=torch.float32)
    model = load(WanVACETransformer3DModel, folder)

    def fwd(inp):
        with torch.no_grad():
            return model(hidden_states=inp["hidden_states"], timestep=inp["timestep"], encoder_hidden_states=inp["encoder_hidden_states"],
                         control_hidden_states=inp["control_hidden_states"], control_hidden_states_scale=inp["control_hidden_states_scale"],
                         return_dict=False)[0]

    out = {}
    model_rel = rel(folder)
    out["inputs"] = write_runner(VACE, "vace__inputs", inputs, {"model": model_rel})
    out["forward"] = write_runner(VACE, "vace__forward", {"noise_pred": fwd(inputs)}, {
        "model": model_rel, "inputs": out["inputs"],
        "what": f"one conditional forward, timestep {wg.FORWARD_TIMESTEP}, float32, control_hidden_states_scale {CONTROL_SCALE}"})
    short = dict(inputs, control_hidden_states=inputs["control_hidden_states"][:, :, :2].contiguous())
    out["short_inputs"] = write_runner(VACE, "vace__short_control_inputs", short, {"model": model_rel, "note": "control latent has 2 of the video's 3 frames: 12 control tokens, 18 video tokens"})
    out["short_forward"] = write_runner(VACE, "vace__short_control_forward", {"noise_pred": fwd(short)}, {
        "model": model_rel, "inputs": out["short_inputs"],
        "what": "as vace__forward with a control latent of fewer tokens: diffusers appends zero tokens AFTER vace_patch_embedding (no bias on them)"})
    # a control latent with MORE tokens than the video is refused (recorded)
    longer = dict(inputs, control_hidden_states=torch.cat([inputs["control_hidden_states"]] * 2, dim=2))
    try:
        fwd(longer)
        out["longer_control"] = "accepted"
    except Exception as err:  # the refusal is the recorded fact
        out["longer_control"] = f"{type(err).__name__}: {str(err)[:200]}"
    unit = dict(inputs, control_hidden_states_scale=torch.ones(2))
    zero_ctrl = fwd(dict(unit, control_hidden_states_scale=torch.zeros(2)))
    from diffusers import WanTransformer3DModel

    plain = WanTransformer3DModel(**{k: v for k, v in vace_config().items() if not k.startswith("vace")})
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("vace")})
    plain.eval()
    with torch.no_grad():
        plain_out = plain(hidden_states=inputs["hidden_states"], timestep=inputs["timestep"],
                          encoder_hidden_states=inputs["encoder_hidden_states"], return_dict=False)[0]
    out["scale_zero_equals_plain_t2v_max_abs_diff"] = float((zero_ctrl - plain_out).abs().max())
    return out


def sky_runner(folder: Path) -> dict:
    import torch
    from diffusers import SkyReelsV2Transformer3DModel

    inputs = wg.runner_inputs("t2v", sky_config(), 4201)
    inputs["fps"] = torch.tensor([1], dtype=torch.int64)
    model = load(SkyReelsV2Transformer3DModel, folder)
    out = {"inputs": write_runner(SKY, "skyreels_df__inputs", inputs, {"model": rel(folder), "fps": "index into fps_embedding (diffusers' DF pipeline: 0 if fps == 16 else 1)"})}
    with torch.no_grad():
        pred = model(hidden_states=inputs["hidden_states"], timestep=inputs["timestep"], encoder_hidden_states=inputs["encoder_hidden_states"],
                     fps=inputs["fps"].tolist(), return_dict=False)[0]
    out["forward"] = write_runner(SKY, "skyreels_df__forward", {"noise_pred": pred}, {
        "model": rel(folder), "inputs": out["inputs"], "what": f"one conditional forward, timestep {wg.FORWARD_TIMESTEP}, fps index 1, enable_diffusion_forcing False, float32"})
    f = wg.LATENT_FHW[0]
    df_t = torch.tensor([[900.0, 500.0, 100.0][:f]], dtype=torch.float32)
    with torch.no_grad():
        pred_df = model(hidden_states=inputs["hidden_states"], timestep=df_t, encoder_hidden_states=inputs["encoder_hidden_states"],
                        fps=inputs["fps"].tolist(), enable_diffusion_forcing=True, return_dict=False)[0]
    out["forward_df"] = write_runner(SKY, "skyreels_df__forward_df", {"noise_pred": pred_df, "timestep": df_t}, {
        "model": rel(folder), "inputs": out["inputs"],
        "what": "diffusion forcing: per-latent-frame timesteps (1, F) = `timestep` here, enable_diffusion_forcing True, fps index 1; other inputs from skyreels_df__inputs"})
    return out


# ---- shapes ---------------------------------------------------------------------------------


def meta_shapes(cls, config: dict) -> dict:
    import math

    import torch

    with torch.device("meta"):
        model = cls(**config)
    params = {k: list(v.shape) for k, v in sorted(model.state_dict().items())}
    return {"num_tensors": len(params), "num_parameters": sum(math.prod(s) for s in params.values()), "parameters": params}


def write_shapes(root: Path, cls, script: str, wanted: dict) -> dict:
    configs = script_transformer_configs(script)
    out = {}
    for model_type, filename in wanted.items():
        cfg = configs[model_type]
        record = {"model_type": model_type, "model_id": cfg["model_id"], "class": cls.__name__,
                  "config": cfg["diffusers_config"], "source": f"huggingface/diffusers@{DIFFUSERS_SCRIPTS_COMMIT}:{script} get_transformer_config",
                  "naming": "diffusers", "built_on": "torch meta device"}
        record.update(meta_shapes(cls, cfg["diffusers_config"]))
        path = root / "shapes" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
        out[model_type] = {"file": rel(path), "num_tensors": record["num_tensors"], "num_parameters": record["num_parameters"]}
    return out


# ---- VACE -----------------------------------------------------------------------------------


def vace_models() -> dict:
    import torch
    from diffusers import WanVACETransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    folder = VACE / "models" / "vace"
    build_seeded(WanVACETransformer3DModel, vace_config(), VACE_SEED).save_pretrained(folder, safe_serialization=True)
    sd = state(WanVACETransformer3DModel, folder)
    orig = {original_key(k): v for k, v in sd.items()}
    proofs = {}
    for prefix in ("", "model.diffusion_model."):
        converted = convert_wan_transformer_to_diffusers({prefix + k: v for k, v in orig.items()})
        problem = same_tensors(converted, sd)
        if problem:
            raise AssertionError(f"single-file converter (prefix {prefix!r}): {problem}")
    proofs["single_file_converter"] = "diffusers.loaders.single_file_utils.convert_wan_transformer_to_diffusers maps vace_original (with and without model.diffusion_model.) to the diffusers state dict, key for key, bit for bit"
    renames = script_rename_dict("scripts/convert_wan_to_diffusers.py", "VACE_TRANSFORMER_KEYS_RENAME_DICT")
    problem = same_tensors(apply_script_renames(orig, renames), sd)
    if problem:
        raise AssertionError(f"VACE_TRANSFORMER_KEYS_RENAME_DICT: {problem}")
    proofs["converter_script"] = f"VACE_TRANSFORMER_KEYS_RENAME_DICT of huggingface/diffusers@{DIFFUSERS_SCRIPTS_COMMIT}:scripts/convert_wan_to_diffusers.py, applied as convert_transformer does, maps vace_original to the diffusers state dict bit for bit"
    paths = {
        "original": VACE / "models" / "vace_original.safetensors",
        "comfy": VACE / "models" / "vace_comfy.safetensors",
        "module": VACE / "models" / "vace_module.safetensors",
    }
    wg.write_safetensors(paths["original"], orig)
    wg.write_safetensors(paths["comfy"], {f"model.diffusion_model.{k}": v for k, v in orig.items()})
    module = {k: v for k, v in orig.items() if k.startswith(("vace_blocks.", "vace_patch_embedding."))}
    wg.write_safetensors(paths["module"], module)
    try:
        via_single = WanVACETransformer3DModel.from_single_file(str(paths["comfy"]), config=str(folder), torch_dtype=torch.float32)
        problem = same_tensors(via_single.state_dict(), sd)
        proofs["from_single_file"] = problem or "WanVACETransformer3DModel.from_single_file(vace_comfy.safetensors, config=models/vace) loads every tensor bit for bit"
    except Exception as err:  # recorded, not fatal: the converter proof above stands
        proofs["from_single_file"] = f"{type(err).__name__}: {str(err)[:300]}"
    return {
        "folder": rel(folder), "config": vace_config(), "seed": VACE_SEED,
        "num_parameters": sum(v.numel() for v in sd.values()),
        "vace_only_tensors": sorted(k for k in sd if k.startswith("vace")),
        "files": {k: rel(p) for k, p in paths.items()},
        "module_file_keys": "only vace_blocks.* and vace_patch_embedding.*, original names, no prefix (Kijai's Wan2_1-VACE_module_*.safetensors as kijai/ComfyUI-WanVideoWrapper@3317577:nodes_model_loading.py reads it)",
        "proofs": proofs,
        "init_rule": "wan_golden: torch.randn per parameter in sorted-name order; matrices N(0, 1/fan_in), 1-D 1 + 0.1 N, biases 0.05 N, scale_shift_table 0.1 N",
    }


def vace_nnx(folder: Path) -> dict:
    """MaxDiffusion's loader in its own venv; the leaves are checked here against the diffusers
    weights with the layout rules (Wᵀ, Conv3d transpose(2,3,4,1,0)) and rewritten canonically."""
    import tempfile

    out = VACE / "models" / "vace_nnx.safetensors"
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "nnx")
        env = dict(os.environ, PYTHONHASHSEED="0", JAX_PLATFORMS="cpu")
        subprocess.run([MAXD_PYTHON, str(Path(__file__).resolve()), "nnx-dump", str(folder), prefix], check=True, env=env)
        tensors, _ = wg.read_safetensors(Path(prefix + ".safetensors"))
        record = json.loads(Path(prefix + ".json").read_text())
    if {k: list(v.shape) for k, v in tensors.items()} != record["eval_shape_tree"]:
        raise AssertionError("MaxDiffusion's loaded tree differs from WanVACEModel's eval_shape tree")
    checked = check_nnx_against_diffusers(tensors, state(_vace_cls(), folder))
    wg.write_safetensors(out, tensors, {"tool": f"AI-Hypercomputer/maxdiffusion@{MAXD_COMMIT} load_wan_transformer into WanVACEModel (scan_layers False)", "dtype_note": "f32", "naming": "NNX path joined with '.'"})
    config_path = VACE / "models" / "vace_nnx.json"
    wg.json_dump(config_path, {
        "wan_config": record["wan_config"], "paths": record["eval_shape_tree"], "scan_layers_true": record["scan_layers_true"],
        "versions": record["versions"], "source_model": rel(folder), "checked": checked,
        "how": "MaxDiffusion's WanVACEModel.load_config(models/vace) + scan_layers False + nnx.eval_shape + nnx.split(Param); "
               "load_wan_transformer(sharded copy of models/vace, scan_layers=False, cast_dtype_fn=_final_param_dtype(float32)); cast_with_exclusion; "
               "leaves flattened with jax.tree_util.tree_flatten_with_path, keys joined by '.' (as golden/maxdiffusion_orbax_golden.py)",
    })
    return {"file": rel(out), "config": rel(config_path), "num_leaves": len(tensors), "scan_layers_true": record["scan_layers_true"]}


def _vace_cls():
    from diffusers import WanVACETransformer3DModel

    return WanVACETransformer3DModel


NNX_LEAF = [
    (r"(.*)\.attn([12])\.to_q\.weight", r"\1.attn\2.query.kernel", "T"),
    (r"(.*)\.attn([12])\.to_k\.weight", r"\1.attn\2.key.kernel", "T"),
    (r"(.*)\.attn([12])\.to_v\.weight", r"\1.attn\2.value.kernel", "T"),
    (r"(.*)\.attn([12])\.to_out\.0\.weight", r"\1.attn\2.proj_attn.kernel", "T"),
    (r"(.*)\.attn([12])\.to_q\.bias", r"\1.attn\2.query.bias", ""),
    (r"(.*)\.attn([12])\.to_k\.bias", r"\1.attn\2.key.bias", ""),
    (r"(.*)\.attn([12])\.to_v\.bias", r"\1.attn\2.value.bias", ""),
    (r"(.*)\.attn([12])\.to_out\.0\.bias", r"\1.attn\2.proj_attn.bias", ""),
    (r"(.*)\.norm_(q|k)\.weight", r"\1.norm_\2.scale", ""),
    (r"(.*)\.norm2\.weight", r"\1.norm2.layer_norm.scale", ""),
    (r"(.*)\.norm2\.bias", r"\1.norm2.layer_norm.bias", ""),
    (r"(.*)\.ffn\.net\.0\.proj\.weight", r"\1.ffn.act_fn.proj.kernel", "T"),
    (r"(.*)\.ffn\.net\.0\.proj\.bias", r"\1.ffn.act_fn.proj.bias", ""),
    (r"(.*)\.ffn\.net\.2\.weight", r"\1.ffn.proj_out.kernel", "T"),
    (r"(.*)\.ffn\.net\.2\.bias", r"\1.ffn.proj_out.bias", ""),
    (r"((?:vace_)?blocks\.\d+)\.scale_shift_table", r"\1.adaln_scale_shift_table", ""),
    (r"(vace_)?patch_embedding\.weight", r"\1patch_embedding.kernel", "C"),
    (r"(.*)\.weight", r"\1.kernel", "T"),
    (r"(.*)", r"\1", ""),
]


def check_nnx_against_diffusers(nnx: dict, sd: dict) -> str:
    """Our reading of MaxDiffusion's layout, checked leaf for leaf against what its loader made."""
    import re

    import torch

    seen = set()
    for key, value in sd.items():
        for pattern, repl, how in NNX_LEAF:
            if re.fullmatch(pattern, key):
                leaf = re.sub(f"^{pattern}$", repl, key)
                break
        expect = value.permute(2, 3, 4, 1, 0) if how == "C" else (value.t() if how == "T" else value)
        if leaf not in nnx:
            raise KeyError(f"{key}: expected NNX leaf {leaf} missing")
        if not torch.equal(nnx[leaf], expect.contiguous()):
            raise AssertionError(f"{key} -> {leaf}: values differ")
        seen.add(leaf)
    if seen != set(nnx):
        raise AssertionError(f"NNX leaves without a diffusers source: {sorted(set(nnx) - seen)}")
    return (f"every one of the {len(nnx)} leaves equals its diffusers tensor under the rules: Linear kernel = weight.T, "
            "Conv3d kernel = weight.permute(2,3,4,1,0), RMSNorm weight -> scale, norm2 -> norm2.layer_norm.{scale,bias}, "
            "scale_shift_table of a block -> adaln_scale_shift_table, to_q/k/v/out.0 -> query/key/value/proj_attn, "
            "ffn.net.0.proj -> ffn.act_fn.proj, ffn.net.2 -> ffn.proj_out")


def vace_diffusers_probe(folder: Path):
    """What diffusers' WanVACEPipeline.load_lora_weights does with a file (recorded, not an oracle)."""
    import logging

    import diffusers
    import torch
    from diffusers import WanVACEPipeline, WanVACETransformer3DModel

    def probe(path: Path) -> str:
        model = load(WanVACETransformer3DModel, folder)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        pipe = WanVACEPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=model)
        records = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())
        diffusers_logger = logging.getLogger("diffusers")
        diffusers_logger.addHandler(handler)
        diffusers.utils.logging.set_verbosity_warning()
        try:
            pipe.load_lora_weights(str(path.parent), weight_name=path.name)
            pipe.fuse_lora(lora_scale=1.0)
            pipe.unload_lora_weights()
        except Exception as err:  # the refusal is the recorded fact
            return f"{type(err).__name__}: {str(err)[:300]}"
        finally:
            diffusers.utils.logging.set_verbosity_error()
            diffusers_logger.removeHandler(handler)
        after = pipe.transformer.state_dict()
        changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
        if not changed:
            logged = [r[:120] for r in records if "LoRA" in r]
            return f"accepted without error, nothing changed; diffusers logged: {logged}"
        return f"loaded and fused; changed {len(changed)} tensors: {changed}"

    return probe


def vace_part(manifest: dict) -> None:
    from diffusers import WanVACETransformer3DModel

    print("[variants] vace models")
    models = vace_models()
    folder = VACE / "models" / "vace"
    print("[variants] vace nnx (MaxDiffusion)")
    models["nnx"] = vace_nnx(folder)
    manifest["models"] = models
    print("[variants] vace adapters")
    manifest["cases"] = lora_cases(VACE, WanVACETransformer3DModel, folder, VACE_LORA_TARGETS, 3301, "vace", vace_diffusers_probe(folder))
    print("[variants] vace runner")
    manifest["runner"] = vace_runner(folder)
    print("[variants] vace shapes")
    manifest["shapes"] = write_shapes(VACE, WanVACETransformer3DModel, "scripts/convert_wan_to_diffusers.py",
                                      {"Wan-VACE-1.3B": "vace_1.3b.json", "Wan-VACE-14B": "vace_14b.json"})


# ---- SkyReels-V2 ----------------------------------------------------------------------------


def sky_models() -> dict:
    import torch
    from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    folder = SKY / "models" / "skyreels_df"
    build_seeded(SkyReelsV2Transformer3DModel, sky_config(), SKY_SEED).save_pretrained(folder, safe_serialization=True)
    sd = state(SkyReelsV2Transformer3DModel, folder)
    orig = {original_key(k): v for k, v in sd.items()}
    renames = script_rename_dict("scripts/convert_skyreelsv2_to_diffusers.py", "TRANSFORMER_KEYS_RENAME_DICT")
    problem = same_tensors(apply_script_renames(orig, renames), sd)
    if problem:
        raise AssertionError(f"SkyReels TRANSFORMER_KEYS_RENAME_DICT: {problem}")
    path = SKY / "models" / "skyreels_df_original.safetensors"
    wg.write_safetensors(path, orig)
    single = convert_wan_transformer_to_diffusers(dict(orig))
    left = sorted(set(single) - set(sd))
    comfy_tmp = SKY / "models" / "_probe_comfy.safetensors"
    wg.write_safetensors(comfy_tmp, {f"model.diffusion_model.{k}": v for k, v in orig.items()})
    try:
        via_single = SkyReelsV2Transformer3DModel.from_single_file(str(comfy_tmp), config=str(folder), torch_dtype=torch.float32)
        from_single = same_tensors(via_single.state_dict(), sd) or "loads every tensor bit for bit"
    except Exception as err:  # the refusal is the recorded fact
        from_single = f"{type(err).__name__}: {str(err)[:300]}"
    finally:
        comfy_tmp.unlink()
    wan_cfg = dict(WanTransformer3DModel(**{k: v for k, v in sky_config().items() if k != "inject_sample_info"}).config)
    sky_cfg = json.loads((folder / "config.json").read_text())
    differing = {k: sky_cfg.get(k) for k in sorted(set(sky_cfg) | set(wan_cfg))
                 if not k.startswith("_") and (k not in wan_cfg or k not in sky_cfg or wan_cfg[k] != sky_cfg[k])}
    return {
        "folder": rel(folder), "config": sky_config(), "seed": SKY_SEED, "num_parameters": sum(v.numel() for v in sd.values()),
        "skyreels_only_tensors": sorted(k for k in sd if k.startswith("fps_")),
        "files": {"original": rel(path)},
        "proofs": {
            "converter_script": f"TRANSFORMER_KEYS_RENAME_DICT of huggingface/diffusers@{DIFFUSERS_SCRIPTS_COMMIT}:scripts/convert_skyreelsv2_to_diffusers.py maps skyreels_df_original to the diffusers state dict bit for bit",
            "single_file_converter_probe": f"convert_wan_transformer_to_diffusers (also SkyReelsV2Transformer3DModel's single-file mapping) leaves {left} unmapped: it has no fps_projection rule",
            "from_single_file_probe": f"SkyReelsV2Transformer3DModel.from_single_file(original names with model.diffusion_model., config=models/skyreels_df): {from_single}",
        },
        "config_keys_not_in_WanTransformer3DModel": differing,
        "class_name": sky_cfg["_class_name"],
    }


def sky_part(manifest: dict) -> None:
    from diffusers import SkyReelsV2Transformer3DModel

    print("[variants] skyreels models")
    manifest["models"] = sky_models()
    folder = SKY / "models" / "skyreels_df"
    print("[variants] skyreels adapters")
    manifest["cases"] = lora_cases(SKY, SkyReelsV2Transformer3DModel, folder, SKY_LORA_TARGETS, 3302, "skyreels_df")
    print("[variants] skyreels runner")
    manifest["runner"] = sky_runner(folder)
    print("[variants] skyreels shapes")
    configs = script_transformer_configs("scripts/convert_skyreelsv2_to_diffusers.py")
    manifest["shapes"] = write_shapes(SKY, SkyReelsV2Transformer3DModel, "scripts/convert_skyreelsv2_to_diffusers.py",
                                      {t: f"{t}.json" for t in configs})
    manifest["i2v_vs_wan21"] = i2v_comparison()


def i2v_comparison() -> dict:
    from diffusers import SkyReelsV2Transformer3DModel, WanTransformer3DModel

    wan = script_transformer_configs("scripts/convert_wan_to_diffusers.py")
    sky = script_transformer_configs("scripts/convert_skyreelsv2_to_diffusers.py")
    out = {}
    for s, w in (("SkyReels-V2-I2V-14B-540P", "Wan-I2V-14B-480p"), ("SkyReels-V2-I2V-14B-720P", "Wan-I2V-14B-720p"),
                 ("SkyReels-V2-I2V-1.3B-540P", None)):
        a = meta_shapes(SkyReelsV2Transformer3DModel, sky[s]["diffusers_config"])["parameters"]
        if w is None:
            out[s] = "no Wan 2.1 I2V-1.3B config in convert_wan_to_diffusers.py to compare with"
            continue
        b = meta_shapes(WanTransformer3DModel, wan[w]["diffusers_config"])["parameters"]
        out[s] = {"compared_with": w, "same_names_and_shapes": a == b, "only_skyreels": sorted(set(a) - set(b)), "only_wan": sorted(set(b) - set(a))}
    same_config = {}
    for t, cfg in sorted(sky.items()):
        c = cfg["diffusers_config"]
        a = meta_shapes(SkyReelsV2Transformer3DModel, c)["parameters"]
        b = meta_shapes(WanTransformer3DModel, {k: v for k, v in c.items() if k != "inject_sample_info"})["parameters"]
        same_shapes = all(a[k] == b[k] for k in set(a) & set(b))
        same_config[t] = {"only_skyreels": sorted(set(a) - set(b)), "only_wan": sorted(set(b) - set(a)), "shared_shapes_equal": same_shapes}
    out["vs_WanTransformer3DModel_same_config"] = same_config
    return out


# ---- driver ---------------------------------------------------------------------------------


def run(only: list) -> None:
    global wg
    import shutil

    import torch

    sys.path.insert(0, str(GOLDEN))
    import diffusers
    import wan_golden

    wg = wan_golden
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    parts = {"vace": (VACE, vace_part), "skyreels": (SKY, sky_part)}
    for name, (root, part) in parts.items():
        if only and name not in only:
            continue
        for sub in ("models", "adapters", "references", "runner", "shapes"):
            shutil.rmtree(root / sub, ignore_errors=True)
        manifest = {"generator": {"script": rel(Path(__file__)), "versions": wg.VERSIONS,
                                  "diffusers_scripts": f"huggingface/diffusers@{DIFFUSERS_SCRIPTS_COMMIT}",
                                  "determinism": "fixed seeds, torch.set_num_threads(1), PYTHONHASHSEED=0, canonical safetensors headers"}}
        torch.manual_seed(0)
        part(manifest)
        wg.json_dump(root / "manifest.json", manifest)
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        print(f"[variants] {name}: {size / 1e6:.2f} MB")
        if size > SIZE_BUDGET_BYTES[name]:
            raise SystemExit(f"{name} fixtures are {size} bytes, over {SIZE_BUDGET_BYTES[name]}")


# --------------------------------------------------------------------------------------------
# Entry point.
# --------------------------------------------------------------------------------------------


def _reexec_with_fixed_hash_seed() -> None:
    if os.environ.get("PYTHONHASHSEED") == "0":
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, PYTHONHASHSEED="0"))


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "nnx-dump":
        nnx_dump(sys.argv[2], sys.argv[3])
        return
    _reexec_with_fixed_hash_seed()
    run(sys.argv[1:])


if __name__ == "__main__":
    main()
