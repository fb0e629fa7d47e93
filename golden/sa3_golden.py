"""Golden fixtures for Stable Audio 3 (SA3) LoRA-family adapters (writes golden/sa3/).

Oracles used here (none of them is wanbake):

* The SA3 effective-weight formulas of spec/sa3_lora.md §1.4 and the SVD bases of §1.5,
  re-implemented below in plain float64 PyTorch, checked first against the printed reference
  vectors of spec §7.3 (`reference_vectors.json`); the formulas were also re-read in
  Stability-AI/stable-audio-3 `stable_audio_3/models/lora/model.py` (stored version 058e5675).
* The real PEFT library (LoraConfig / get_peft_model / save_pretrained / merge_and_unload) for
  the PEFT-format SA3 adapters.

Everything is seeded; running `main()` twice produces byte-identical files.
Called with no arguments by golden/generate.py; can also be run directly.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
OUT = HERE / "sa3"

EPS = 1e-12  # added to every norm, as in SA3 model.py (never clamped)

# Tiny SA3-like architecture.
E = 24  # embed dim
HEADS = 2
HEAD_DIM = E // HEADS
FF_INNER = 48  # GLU: ff.ff.0.proj is (2*FF_INNER, E)
DEPTH = 2
IO = 8  # io_channels
COND = 12  # cond_token_dim = global_cond_dim
SECONDS_FEATURES = 16  # input width of the seconds_total Linear
TIMESTEP_FEATURES = 16
LOCAL_COND = 9  # local_add_cond_dim (257 in the real model)
MEMORY_TOKENS = 4
PRE_K = 3  # preprocess_conv kernel size (the real model has k=1; k=3 exercises the 2-D view)

DIT = "model.model."
COND_PREFIX = "conditioner."

NATIVE_TYPES = [
    "lora",
    "dora-rows",
    "dora-cols",
    "bora",
    "lora-xs",
    "dora-rows-xs",
    "dora-cols-xs",
    "bora-xs",
]

# Adapter layer names (relative to DiTWrapper / MultiConditioner, spec §3.1) -> base key.
ADAPTER_TARGETS = {
    "model.transformer.layers.0.self_attn.to_qkv": DIT + "transformer.layers.0.self_attn.to_qkv.weight",
    "model.transformer.layers.1.self_attn.to_out": DIT + "transformer.layers.1.self_attn.to_out.weight",
    "model.transformer.layers.1.cross_attn.to_kv": DIT + "transformer.layers.1.cross_attn.to_kv.weight",
    "model.transformer.layers.0.ff.ff.2": DIT + "transformer.layers.0.ff.ff.2.weight",
    "model.preprocess_conv": DIT + "preprocess_conv.weight",
    "conditioners.seconds_total.embedder.embedding.1": COND_PREFIX
    + "conditioners.seconds_total.embedder.embedding.1.weight",
}

PEFT_TARGET_MODULES = ["to_qkv", "to_out", "to_q", "to_kv", "ff.ff.0.proj", "ff.ff.2"]


# ----------------------------------------------------------------------------------------------
# Reference math (float64), spec §1.4 / §1.5
# ----------------------------------------------------------------------------------------------


def row_norm(X: torch.Tensor) -> torch.Tensor:
    """Row norms, shape (out, 1)."""
    return X.norm(dim=1, keepdim=True)


def col_norm(X: torch.Tensor) -> torch.Tensor:
    """Column norms, shape (1, in')."""
    return X.norm(dim=0, keepdim=True)


def svd_bases(W2d: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Thin SVD, §1.5 sign canonicalisation, truncation to r. Returns U (out,r), V (in',r)."""
    U_full, _S, Vh_full = torch.linalg.svd(W2d.double(), full_matrices=False)
    idx = U_full.abs().argmax(dim=0)  # first maximum on ties
    signs = U_full[idx, torch.arange(U_full.shape[1])].sign()
    signs[signs == 0] = 1
    U_full = U_full * signs.unsqueeze(0)
    Vh_full = Vh_full * signs.unsqueeze(1)
    return U_full[:, :r], Vh_full[:r, :].T


def low_rank_delta(W2d: torch.Tensor, kind: str, p: dict, r: int) -> torch.Tensor:
    """Unscaled update: B·A, or U·M·Vᵀ for the -xs types (bases recomputed from W2d)."""
    if kind.endswith("-xs"):
        U, V = svd_bases(W2d, r)
        return U @ p["M_xs"] @ V.T
    return p["lora_B"] @ p["lora_A"]


def effective_weight(
    W2d: torch.Tensor,
    kind: str,
    p: dict,
    r: int,
    alpha: float,
    strength: float = 1.0,
    blend_magnitude: bool = False,
) -> torch.Tensor:
    """f(W) of spec §1.4 in float64. `strength` is SA3's live `lora_strength` knob;
    `blend_magnitude` selects the S1b `_blend_magnitude` variant (only matters when s != 1)."""
    W = W2d.double()
    sigma = alpha / r
    D = low_rank_delta(W, kind, p, r)
    if kind in ("lora", "lora-xs"):
        return W + sigma * strength * D
    if strength == 0:
        return W
    V = W + sigma * strength * D

    def blend(m: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        if not blend_magnitude or strength == 1.0:
            return m
        return base + strength * (m - base)

    if kind in ("dora-rows", "dora-rows-xs"):
        m = blend(p["magnitude"].reshape(-1, 1), row_norm(W))
        return m * V / (row_norm(V) + EPS)
    if kind in ("dora-cols", "dora-cols-xs"):
        m = blend(p["magnitude"].reshape(1, -1), col_norm(W))
        return m * V / (col_norm(V) + EPS)
    if kind in ("bora", "bora-xs"):
        m_r = blend(p["magnitude_r"].reshape(-1, 1), row_norm(W))
        m_c = blend(p["magnitude_c"].reshape(1, -1), col_norm(W))
        H = m_r * V / (row_norm(V) + EPS)
        return m_c * H / (col_norm(H) + EPS)
    raise ValueError(f"unknown adapter type {kind}")


def merged(W2d: torch.Tensor, contributions: list[tuple[float, torch.Tensor]]) -> torch.Tensor:
    """Spec §2.1: W0 + Σ a_i·(f_i(W0) − W0), every f_i evaluated on the same W0."""
    W = W2d.double()
    out = W.clone()
    for a, f in contributions:
        out = out + a * (f - W)
    return out


def params_f64(p: dict) -> dict:
    """Widen stored (fp16/f32) adapter tensors exactly to float64."""
    return {k: v.double() for k, v in p.items()}


# ----------------------------------------------------------------------------------------------
# §7.3 reference vectors
# ----------------------------------------------------------------------------------------------

SPEC_73 = {
    "svd": {
        "singular_values": [2.90722222, 1.81605589],
        "U1": [-0.61541221, 0.78820544],
        "V1": [-0.34724381, 0.83004751, 0.43639759],
    },
    "full_strength": {
        "lora": [[1.125, -2.25, 1.0], [-0.5625, 1.625, 1.75]],
        "dora-rows": [[1.24674416, -2.49348832, 1.10821703], [-0.45853362, 1.32465269, 1.42654905]],
        "dora-cols": [[1.34164079, -2.02669807, 1.73648628], [-0.67082039, 1.46372638, 3.03885100]],
        "bora": [[1.40780499, -2.20779406, 2.14719690], [-0.51776936, 1.17287910, 2.76397277]],
        "lora-xs": [[1.10684904, -2.25541069, 0.36571780], [-0.63684973, 1.82712398, 2.17198548]],
        "dora-rows-xs": [[1.30789596, -2.66508117, 0.43214640], [-0.43786858, 1.25624641, 1.49335731]],
        "dora-cols-xs": [[1.30015051, -1.94255803, 0.58114753], [-0.74806995, 1.57367986, 3.45141530]],
        "bora-xs": [[1.42240276, -2.26136287, 0.97290987], [-0.47620415, 1.06594464, 3.36205984]],
    },
    "dora-rows_strength_0.5": {
        "application_weight": [[1.12337208, -2.24674416, 0.80410852], [-0.47926681, 1.41232634, 1.71327452]],
        "lora_strength_head": [[1.27940554, -2.55881108, 0.90310979], [-0.42536571, 1.25107561, 1.50129073]],
        "lora_strength_blend_s1b": [[1.12828383, -2.25656766, 0.79643565], [-0.48380136, 1.42294517, 1.70753420]],
    },
    "two_adapter": [[1.16958459, -2.54818909, 0.82480474], [-0.56648906, 1.31121114, 1.55539317]],
    "row_norms": [2.29128785, 2.54950976],
    "col_norms": [1.11803399, 2.5, 2.06155281],
}

# The spec prints 8 decimals, so agreement is checked to half a unit in the 8th place
# (plus float64 slack): that is the "1e-8" the numbers can support.
SPEC_TOL = 0.5e-8 + 1e-12


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def reference_vectors() -> dict:
    """Recompute spec §7.3 from the S10 inputs and compare with the printed numbers."""
    W = _t([[1, -2, 0.5], [-0.5, 1.5, 2]])
    A = _t([[0.25, -0.5, 1]])
    B = _t([[0.5], [-0.25]])
    M = _t([[0.5]])
    mags = {
        "dora-rows": {"magnitude": _t([3, 2])},
        "dora-cols": {"magnitude": _t([1.5, 2.5, 3.5])},
        "bora": {"magnitude_r": _t([3, 2]), "magnitude_c": _t([1.5, 2.5, 3.5])},
    }
    r, alpha = 1, 1.0

    def params(kind: str) -> dict:
        base = kind.removesuffix("-xs")
        p = dict(mags.get(base, {}))
        if kind.endswith("-xs"):
            p["M_xs"] = M
        else:
            p["lora_A"], p["lora_B"] = A, B
        return p

    got: dict = {"full_strength": {}}
    for kind in NATIVE_TYPES:
        got["full_strength"][kind] = effective_weight(W, kind, params(kind), r, alpha)
    f_dr = got["full_strength"]["dora-rows"]
    got["dora-rows_strength_0.5"] = {
        "application_weight": merged(W, [(0.5, f_dr)]),
        "lora_strength_head": effective_weight(W, "dora-rows", params("dora-rows"), r, alpha, 0.5),
        "lora_strength_blend_s1b": effective_weight(
            W, "dora-rows", params("dora-rows"), r, alpha, 0.5, blend_magnitude=True
        ),
    }
    second = {"lora_A": _t([[-0.75, 0.5, 0.25]]), "lora_B": _t([[0.2], [0.4]]), "magnitude": _t([3, 2])}
    f_second = effective_weight(W, "dora-rows", second, r, alpha)
    got["two_adapter"] = merged(W, [(0.25, got["full_strength"]["lora"]), (0.75, f_second)])
    got["row_norms"] = row_norm(W).flatten()
    got["col_norms"] = col_norm(W).flatten()
    U_full, S, Vh_full = torch.linalg.svd(W, full_matrices=False)
    U1, V1 = svd_bases(W, 1)
    got["svd"] = {"singular_values": S, "U1": U1[:, 0], "V1": V1[:, 0]}

    report = {"max_abs_diff": {}, "computed": {}, "spec": SPEC_73}

    def compare(path: str, spec_value, value: torch.Tensor) -> None:
        diff = (value - _t(spec_value)).abs().max().item()
        report["max_abs_diff"][path] = diff
        report["computed"][path] = value.tolist()
        if diff > SPEC_TOL:
            raise AssertionError(f"spec §7.3 {path}: computed {value.tolist()} vs spec {spec_value} (diff {diff:.3e})")

    for group, spec_group in SPEC_73.items():
        if isinstance(spec_group, dict):
            for name, spec_value in spec_group.items():
                compare(f"{group}/{name}", spec_value, got[group][name])
        else:
            compare(group, spec_group, got[group])
    report["inputs"] = {
        "W": W.tolist(),
        "rank": r,
        "alpha": alpha,
        "lora_A": A.tolist(),
        "lora_B": B.tolist(),
        "M_xs": M.tolist(),
        "magnitudes": {k: {n: t.tolist() for n, t in v.items()} for k, v in mags.items()},
        "second_adapter_dora_rows": {k: v.tolist() for k, v in second.items()},
        "two_adapter_weights": {"lora": 0.25, "dora-rows(second)": 0.75},
    }
    report["tolerance"] = SPEC_TOL
    report["note"] = (
        "Computed in float64 by golden/sa3_golden.py from the spec §1.4/§1.5 formulas "
        "(eps=1e-12 added to norms); 'spec' holds the numbers printed in spec/sa3_lora.md §7.3; "
        "the generator asserts every entry agrees within 'tolerance'."
    )
    return report


# ----------------------------------------------------------------------------------------------
# Tiny base checkpoint
# ----------------------------------------------------------------------------------------------


def base_shapes() -> dict[str, tuple[int, ...]]:
    """Key -> shape of the tiny SA3-like base (names as in a real SA3 model.safetensors)."""
    s: dict[str, tuple[int, ...]] = {
        COND_PREFIX + "conditioners.prompt.padding_embedding": (COND,),
        COND_PREFIX + "conditioners.seconds_total.embedder.embedding.1.weight": (COND, SECONDS_FEATURES),
        COND_PREFIX + "conditioners.seconds_total.embedder.embedding.1.bias": (COND,),
        DIT + "preprocess_conv.weight": (IO, IO, PRE_K),
        DIT + "postprocess_conv.weight": (IO, IO, 1),
        DIT + "to_cond_embed.0.weight": (E, COND),
        DIT + "to_cond_embed.2.weight": (E, E),
        DIT + "to_global_embed.0.weight": (E, COND),
        DIT + "to_global_embed.2.weight": (E, E),
        DIT + "to_timestep_embed.0.weight": (E, TIMESTEP_FEATURES),
        DIT + "to_timestep_embed.0.bias": (E,),
        DIT + "to_timestep_embed.2.weight": (E, E),
        DIT + "to_timestep_embed.2.bias": (E,),
        DIT + "transformer.global_cond_embedder.0.weight": (E, E),
        DIT + "transformer.global_cond_embedder.0.bias": (E,),
        DIT + "transformer.global_cond_embedder.2.weight": (6 * E, E),
        DIT + "transformer.global_cond_embedder.2.bias": (6 * E,),
        DIT + "transformer.memory_tokens": (MEMORY_TOKENS, E),
        DIT + "transformer.project_in.weight": (E, IO),
        DIT + "transformer.project_out.weight": (IO, E),
    }
    for n in range(DEPTH):
        L = f"{DIT}transformer.layers.{n}."
        s.update(
            {
                L + "pre_norm.gamma": (E,),
                L + "self_attn.to_qkv.weight": (3 * E, E),
                L + "self_attn.q_norm.gamma": (HEAD_DIM,),
                L + "self_attn.k_norm.gamma": (HEAD_DIM,),
                L + "self_attn.to_out.weight": (E, E),
                L + "cross_attend_norm.gamma": (E,),
                L + "cross_attn.to_q.weight": (E, E),
                L + "cross_attn.to_kv.weight": (2 * E, E),
                L + "cross_attn.q_norm.gamma": (HEAD_DIM,),
                L + "cross_attn.k_norm.gamma": (HEAD_DIM,),
                L + "cross_attn.to_out.weight": (E, E),
                L + "to_local_embed.0.weight": (E, LOCAL_COND),
                L + "to_local_embed.0.bias": (E,),
                L + "to_local_embed.2.weight": (E, E),
                L + "to_local_embed.2.bias": (E,),
                L + "to_scale_shift_gate": (6 * E,),
                L + "ff_norm.gamma": (E,),
                L + "ff.ff.0.proj.weight": (2 * FF_INNER, E),
                L + "ff.ff.0.proj.bias": (2 * FF_INNER,),
                L + "ff.ff.2.weight": (E, FF_INNER),
                L + "ff.ff.2.bias": (E,),
            }
        )
    return s


def spectral_matrix(rng: np.random.Generator, out_dim: int, in_dim: int) -> np.ndarray:
    """Random orthogonal factors around singular values 2·0.9^k: every consecutive pair is 10 %
    apart, so the -xs SVD bases are well conditioned (an f32 SVD agrees with the f64 reference to
    ~1e-6) instead of hinging on a near-degenerate pair, as plain Gaussian matrices can."""
    k = min(out_dim, in_dim)
    Q1, _ = np.linalg.qr(rng.standard_normal((out_dim, k)))
    Q2, _ = np.linalg.qr(rng.standard_normal((in_dim, k)))
    S = 2.0 * 0.9 ** np.arange(k)
    return (Q1 * S) @ Q2.T


def make_base(rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """Random non-trivial f32 values: weight matrices from `spectral_matrix` (conv weights on
    their (out, in·k) view), gammas ~ 1 + N(0, 0.1²), other tensors ~ N(0, 0.5²)."""
    base = {}
    for key in sorted(base_shapes()):
        shape = base_shapes()[key]
        if key.endswith(".gamma"):
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) >= 2 and key.endswith(".weight"):
            x = spectral_matrix(rng, shape[0], int(np.prod(shape[1:]))).reshape(shape)
        else:
            x = 0.5 * rng.standard_normal(shape)
        base[key] = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return base


def as_2d(W: torch.Tensor) -> torch.Tensor:
    """(out, in, k) -> row-major (out, in·k); Linear weights unchanged."""
    return W.reshape(W.shape[0], -1)


# ----------------------------------------------------------------------------------------------
# SA3-native adapters (spec §3)
# ----------------------------------------------------------------------------------------------


def signed_magnitude(rng: np.random.Generator, norms: np.ndarray) -> np.ndarray:
    """Around the base norms, scaled by U(0.7, 1.3); about 1 in 4 entries negative, at least one."""
    m = norms * rng.uniform(0.7, 1.3, size=norms.shape)
    neg = rng.uniform(size=norms.shape) < 0.25
    neg[rng.integers(norms.shape[0])] = True
    m[neg] *= -1.0
    return m


def make_native_params(rng: np.random.Generator, kind: str, W2d: np.ndarray, r: int, sigma: float) -> dict:
    """Random fp16 parameters for one layer. Sizes chosen so σ·Δ is ~30 % of W."""
    out_dim, in_dim = W2d.shape
    p: dict[str, np.ndarray] = {}
    if kind.endswith("-xs"):
        p["M_xs"] = rng.standard_normal((r, r)) * 0.3 * math.sqrt(out_dim / r) / sigma
    else:
        p["lora_A"] = rng.standard_normal((r, in_dim)) / math.sqrt(in_dim)
        p["lora_B"] = rng.standard_normal((out_dim, r)) * 0.3 / math.sqrt(r) / sigma
    base = kind.removesuffix("-xs")
    rows = np.linalg.norm(W2d, axis=1)
    cols = np.linalg.norm(W2d, axis=0)
    if base == "dora-rows":
        p["magnitude"] = signed_magnitude(rng, rows)
    elif base == "dora-cols":
        p["magnitude"] = signed_magnitude(rng, cols)
    elif base == "bora":
        p["magnitude_r"] = signed_magnitude(rng, rows)
        p["magnitude_c"] = signed_magnitude(rng, cols)
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(torch.float16) for k, v in p.items()}


# name -> (adapter_type written in the file, resolved type, legacy magnitude layout)
NATIVE_CASES = {t: (t, t, None) for t in NATIVE_TYPES}
NATIVE_CASES["dora-legacy-rows"] = ("dora", "dora-rows", "rows-2d")  # magnitude (out, 1)
NATIVE_CASES["dora-legacy-cols"] = ("dora", "dora-cols", "cols-2d")  # magnitude (1, in')
NATIVE_CASES["dora-legacy-1d"] = ("dora", "dora-rows", "1d")  # magnitude (out,)


def rank_alpha(resolved: str) -> tuple[int, float | int]:
    """Non-xs: r=3, α=4.5 (σ=1.5). -xs: r=2, α=5 written as an int (σ=2.5)."""
    return (2, 5) if resolved.endswith("-xs") else (3, 4.5)


def magnitude_layout(resolved: str, legacy: str | None) -> str | None:
    """How the magnitude tensors are stored: None (no magnitude), "1d", "rows-2d", "cols-2d"."""
    if resolved in ("lora", "lora-xs"):
        return None
    return legacy or "1d"


def write_native_adapters(base: dict[str, torch.Tensor], seed: int) -> tuple[dict, dict]:
    """Writes golden/sa3/adapters/*.safetensors; returns {name: per-layer f16 params} and cases."""
    (OUT / "adapters").mkdir(parents=True, exist_ok=True)
    all_params: dict[str, dict] = {}
    cases: dict[str, dict] = {}
    for i, (name, (written, resolved, legacy)) in enumerate(NATIVE_CASES.items()):
        rng = np.random.default_rng([seed, i])
        r, alpha = rank_alpha(resolved)
        sigma = alpha / r
        tensors: dict[str, torch.Tensor] = {}
        layers: dict[str, dict] = {}
        for layer, base_key in ADAPTER_TARGETS.items():
            W2d = as_2d(base[base_key]).double().numpy()
            p = make_native_params(rng, resolved, W2d, r, sigma)
            layers[layer] = p
            for param, t in p.items():
                stored = t
                if param == "magnitude" and legacy == "rows-2d":
                    stored = t.reshape(-1, 1)
                elif param == "magnitude" and legacy == "cols-2d":
                    stored = t.reshape(1, -1)
                tensors[f"{layer}.parametrizations.weight.0.{param}"] = stored.contiguous()
        config = {
            "rank": r,
            "alpha": alpha,
            "adapter_type": written,
            "dropout": 0.0,
            "include": None,
            "exclude": None,
        }
        save_file(tensors, OUT / "adapters" / f"{name}.safetensors", metadata={"lora_config": json.dumps(config)})
        all_params[name] = layers
        cases[name] = {
            "adapter": f"adapters/{name}.safetensors",
            "format": "sa3-native",
            "adapter_type_written": written,
            "adapter_type_resolved": resolved,
            "magnitude_layout": magnitude_layout(resolved, legacy),
            "rank": r,
            "alpha": alpha,
            "scaling": sigma,
            "targets": {layer: ADAPTER_TARGETS[layer] for layer in ADAPTER_TARGETS},
        }
    return all_params, cases


def native_reference(base: dict, layers: dict, resolved: str, weight: float) -> dict[str, torch.Tensor]:
    """Merged targeted weights (float64, original shapes) for one adapter at application weight."""
    r, alpha = rank_alpha(resolved)
    out = {}
    for layer, p in layers.items():
        key = ADAPTER_TARGETS[layer]
        W0 = base[key]
        W2d = as_2d(W0).double()
        f = effective_weight(W2d, resolved, params_f64(p), r, float(alpha))
        out[key] = merged(W2d, [(weight, f)]).reshape(W0.shape).contiguous()
    return out


def write_native_references(base: dict, all_params: dict, cases: dict) -> None:
    ref_dir = OUT / "references"
    ref_dir.mkdir(parents=True, exist_ok=True)
    for name, case in cases.items():
        ref = native_reference(base, all_params[name], case["adapter_type_resolved"], 1.0)
        save_file(ref, ref_dir / f"{name}.safetensors")
        case["reference"] = f"references/{name}.safetensors"
        case["application_weights"] = [1.0]

    ref = native_reference(base, all_params["dora-rows"], "dora-rows", 0.5)
    save_file(ref, ref_dir / "strength0.5_dora-rows.safetensors")

    two = {}
    for layer, key in ADAPTER_TARGETS.items():
        W0 = base[key]
        W2d = as_2d(W0).double()
        contributions = []
        for name, a in (("lora", 0.25), ("dora-rows", 0.75)):
            r, alpha = rank_alpha(name)
            f = effective_weight(W2d, name, params_f64(all_params[name][layer]), r, float(alpha))
            contributions.append((a, f))
        two[key] = merged(W2d, contributions).reshape(W0.shape).contiguous()
    save_file(two, ref_dir / "two_adapter.safetensors")

    cases["strength0.5_dora-rows"] = {
        **{k: v for k, v in cases["dora-rows"].items() if k not in ("reference", "application_weights")},
        "reference": "references/strength0.5_dora-rows.safetensors",
        "application_weights": [0.5],
        "note": "merge knob: W0 + 0.5·(f(W0) − W0), f at lora_strength 1",
    }
    cases["two_adapter"] = {
        "format": "sa3-native",
        "adapters": ["adapters/lora.safetensors", "adapters/dora-rows.safetensors"],
        "adapter_types_resolved": ["lora", "dora-rows"],
        "application_weights": [0.25, 0.75],
        "targets": dict(ADAPTER_TARGETS),
        "reference": "references/two_adapter.safetensors",
        "note": "summed merge of spec §2.1: W0 + Σ a_i·(f_i(W0) − W0), each adapter with its own rank/alpha/type",
    }


# ----------------------------------------------------------------------------------------------
# PEFT adapters made by the real PEFT
# ----------------------------------------------------------------------------------------------


class _Attention(torch.nn.Module):
    def __init__(self, cross: bool):
        super().__init__()
        if cross:
            self.to_q = torch.nn.Linear(E, E, bias=False)
            self.to_kv = torch.nn.Linear(E, 2 * E, bias=False)
        else:
            self.to_qkv = torch.nn.Linear(E, 3 * E, bias=False)
        self.to_out = torch.nn.Linear(E, E, bias=False)


class _GLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(E, 2 * FF_INNER)


class _FeedForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = torch.nn.Sequential(_GLU(), torch.nn.Identity(), torch.nn.Linear(FF_INNER, E))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = _Attention(cross=False)
        self.cross_attn = _Attention(cross=True)
        self.ff = _FeedForward()
        self.to_local_embed = torch.nn.Sequential(
            torch.nn.Linear(LOCAL_COND, E), torch.nn.SiLU(), torch.nn.Linear(E, E)
        )


class _ContinuousTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.project_in = torch.nn.Linear(IO, E, bias=False)
        self.project_out = torch.nn.Linear(E, IO, bias=False)
        self.global_cond_embedder = torch.nn.Sequential(
            torch.nn.Linear(E, E), torch.nn.SiLU(), torch.nn.Linear(E, 6 * E)
        )
        self.layers = torch.nn.ModuleList([_Block() for _ in range(DEPTH)])


class TinyDiffusionTransformer(torch.nn.Module):
    """Module names of SA3's DiffusionTransformer (Linear/Conv1d layers only): a module at path X
    holds the base tensor `model.model.X.weight`."""

    def __init__(self):
        super().__init__()
        self.to_timestep_embed = torch.nn.Sequential(
            torch.nn.Linear(TIMESTEP_FEATURES, E), torch.nn.SiLU(), torch.nn.Linear(E, E)
        )
        self.to_cond_embed = torch.nn.Sequential(
            torch.nn.Linear(COND, E, bias=False), torch.nn.SiLU(), torch.nn.Linear(E, E, bias=False)
        )
        self.to_global_embed = torch.nn.Sequential(
            torch.nn.Linear(COND, E, bias=False), torch.nn.SiLU(), torch.nn.Linear(E, E, bias=False)
        )
        self.transformer = _ContinuousTransformer()
        self.preprocess_conv = torch.nn.Conv1d(IO, IO, PRE_K, padding=PRE_K // 2, bias=False)
        self.postprocess_conv = torch.nn.Conv1d(IO, IO, 1, bias=False)


# PEFT records the model class's module in adapter_config.json ("auto_mapping"); pin it so the
# file is the same whether this script is run directly or imported by golden/generate.py.
for _cls in (_Attention, _GLU, _FeedForward, _Block, _ContinuousTransformer, TinyDiffusionTransformer):
    _cls.__module__ = "sa3_golden"


def tiny_dit_from_base(base: dict[str, torch.Tensor]) -> TinyDiffusionTransformer:
    model = TinyDiffusionTransformer()
    state = {k: base[DIT + k].clone() for k in model.state_dict()}
    model.load_state_dict(state, strict=True)
    return model


def make_peft_adapter(base: dict, use_dora: bool, seed: int, name: str) -> dict:
    """Build, randomise, save (real PEFT), then merge_and_unload in float64 for the reference."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    r, alpha = 4, 8
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=PEFT_TARGET_MODULES, use_dora=use_dora)
    peft_model = get_peft_model(tiny_dit_from_base(base), config)
    sigma = alpha / r
    targets = {}
    with torch.no_grad():
        for mod_name, module in peft_model.base_model.model.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            W0 = module.base_layer.weight
            out_dim, in_dim = W0.shape
            A = module.lora_A["default"].weight
            B = module.lora_B["default"].weight
            A.copy_(torch.randn(A.shape, generator=gen) / math.sqrt(in_dim))
            B.copy_(torch.randn(B.shape, generator=gen) * 0.3 / math.sqrt(r) / sigma)
            if use_dora:
                m = module.lora_magnitude_vector["default"].weight
                Vn = (W0.double() + sigma * B.double() @ A.double()).norm(dim=1)
                m.copy_((Vn * (0.7 + 0.6 * torch.rand(Vn.shape, generator=gen, dtype=torch.float64))).float())
            targets[mod_name] = DIT + mod_name + ".weight"

    directory = OUT / name
    if directory.exists():
        shutil.rmtree(directory)
    peft_model.save_pretrained(directory)
    readme = directory / "README.md"  # PEFT's model-card boilerplate; not needed
    if readme.exists():
        readme.unlink()
    normalise_target_modules(directory / "adapter_config.json")

    merged_model = peft_model.to(torch.float64).merge_and_unload()
    merged_state = merged_model.state_dict()
    ref = {base_key: merged_state[mod + ".weight"].contiguous() for mod, base_key in targets.items()}
    self_check_peft(base, directory, ref, use_dora, sigma)
    save_file(ref, OUT / "references" / f"{name}.safetensors")
    return {
        "adapter": f"{name}/adapter_model.safetensors",
        "adapter_config": f"{name}/adapter_config.json",
        "format": "peft",
        "adapter_type_written": "lora (use_dora=true)" if use_dora else "lora",
        "adapter_type_resolved": "dora-rows" if use_dora else "lora",
        "rank": r,
        "alpha": alpha,
        "scaling": sigma,
        "targets": dict(sorted(targets.items())),
        "reference": f"references/{name}.safetensors",
        "application_weights": [1.0],
        "note": "reference = PEFT merge_and_unload() of the saved adapter, model cast to float64"
        + ("; PEFT DoRA divides by the row norm with no eps" if use_dora else ""),
    }


def normalise_target_modules(config_path: Path) -> None:
    """PEFT stores target_modules as a set and writes it in hash order, which changes from one
    Python process to the next. Sort it (same set, same JSON layout as PEFT: indent 2, sorted keys)
    so the fixture is byte-stable."""
    config = json.loads(config_path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))


def self_check_peft(base: dict, directory: Path, ref: dict, use_dora: bool, sigma: float) -> None:
    """Reload the saved directory with PEFT into a fresh model and merge again (must reproduce the
    reference exactly), then cross-check against the spec formulas applied to the saved tensors."""
    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(tiny_dit_from_base(base), directory)
    again = reloaded.to(torch.float64).merge_and_unload().state_dict()
    for key, merged_w in ref.items():
        if not torch.equal(again[key.removeprefix(DIT)], merged_w):
            raise AssertionError(f"PEFT reload of {directory.name} does not reproduce {key}")
    saved = load_file(directory / "adapter_model.safetensors")
    for key, merged_w in ref.items():
        mod = key.removeprefix(DIT).removesuffix(".weight")
        pre = f"base_model.model.{mod}."
        p = {"lora_A": saved[pre + "lora_A.weight"].double(), "lora_B": saved[pre + "lora_B.weight"].double()}
        kind = "lora"
        if use_dora:
            p["magnitude"] = saved[pre + "lora_magnitude_vector"].double()
            kind = "dora-rows"
        r = p["lora_A"].shape[0]
        f = effective_weight(base[key].double(), kind, p, r, sigma * r)
        diff = (f - merged_w).abs().max().item()
        if diff > 1e-9:
            raise AssertionError(f"PEFT merge of {key} disagrees with the spec formula by {diff:.3e}")


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def main() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: same reduction order on every run
    try:
        _generate()
    finally:
        torch.set_num_threads(threads)


def _generate() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for sub in ("adapters", "references"):
        if (OUT / sub).exists():
            shutil.rmtree(OUT / sub)

    write_json(OUT / "reference_vectors.json", reference_vectors())

    base = make_base(np.random.default_rng(20260301))
    (OUT / "base").mkdir(parents=True, exist_ok=True)
    save_file(base, OUT / "base" / "model.safetensors")

    all_params, cases = write_native_adapters(base, seed=20260302)
    write_native_references(base, all_params, cases)
    cases["peft_lora"] = make_peft_adapter(base, use_dora=False, seed=20260303, name="peft_lora")
    cases["peft_dora"] = make_peft_adapter(base, use_dora=True, seed=20260304, name="peft_dora")

    manifest = {
        "base": "base/model.safetensors",
        "generator": "golden/sa3_golden.py",
        "versions": {
            "torch": torch.__version__.split("+")[0],
            "peft": __import__("peft").__version__,
            "numpy": np.__version__,
            "safetensors": __import__("safetensors").__version__,
        },
        "reference_dtype": "F64",
        "eps": EPS,
        "cases": cases,
    }
    write_json(OUT / "manifest.json", manifest)


if __name__ == "__main__":
    main()
