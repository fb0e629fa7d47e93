#!/usr/bin/env python3
"""Golden fixtures for `wanbake extract` and `wanbake resize` (issue 15).

The oracle is numpy's float64 SVD (LAPACK gesdd), independent of wanbake's faer code. Run with
the pinned environment (numpy==2.4.6, safetensors==0.8.0):

    python3 -m venv /work/venvs/extract
    /work/venvs/extract/bin/pip install numpy==2.4.6 safetensors==0.8.0
    /work/venvs/extract/bin/python golden/extract_golden.py

Inputs: golden/models/t2v_original.safetensors (the tiny WAN 2.1 T2V model under original
Wan names, f32). Outputs, all in golden/extract/ (about 300 KB):

- tuned.safetensors: the base with planted low-rank deltas of known spectra on seven Linear
  weights (ΔW = U·diag(σ)·Vᵀ, U and V random orthonormal) and full changes of biases, norms,
  the two modulation tables and the Conv3d patch embedding; computed in float64, rounded once
  to f32. Every other tensor is the base's, bit for bit.
- expect.json: for every tensor that differs (reference ΔW = f64(tuned) − f64(base)): the
  singular values, and for each rank R in RANKS the retained energy Σ_{i<R} σ_i² / ‖ΔW‖_F² and
  rel_error = ‖ΔW − ΔW_R‖_F / ‖ΔW‖_F; for each F in ENERGIES the smallest rank whose energy is
  ≥ F. The script checks every pick sits at least 1e-4 away from its threshold. `budgets`: the
  ranks `--budget B` must give for each B in BUDGETS (greedy by σ², see budget_ranks).
- expect_trunc.safetensors: `r{R}.<name>` = the truncated product ΔW_R (f32) for R in
  TRUNC_RANKS.
- resize_lora.safetensors: a ComfyUI-convention LoRA (`diffusion_model.` prefix) with modules
  of rank 6/6/5 (σ = 0.5, 2, 1 through .alpha or its absence), one of rank 2, a diff_b and a
  norm diff.
- expect_resize.safetensors: `trunc.<module>` = the best rank-RESIZE_RANK approximation of σ·B·A
  (f32), and `s{S}.<param>` = base + S·(resized delta) for S in STRENGTHS, i.e. what merging the
  resized adapter at strength S must give (diffs unchanged, modules of rank ≤ RESIZE_RANK
  unchanged); plus expect_resize.json with the per-module ranks and energies, and the ranks
  `--energy RESIZE_ENERGY` picks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

HERE = Path(__file__).resolve().parent
OUT = HERE / "extract"
BASE = HERE / "models" / "t2v_original.safetensors"

RANKS = [1, 2, 4, 8]
TRUNC_RANKS = [2, 4]
ENERGIES = [0.9, 0.99, 0.999]
RESIZE_RANK = 3
RESIZE_ENERGY = 0.95
STRENGTHS = ["1", "0.5"]
# `--budget` cases (bytes of tensor data): ranks by largest σ², each rank of an (out, in)
# module costing (out + in)·4 bytes, plus 4 for its .alpha with the first rank; the full
# differences (f32) are paid first.
BUDGETS = [6000, 12000]

# Planted Linear deltas: original-Wan weight name → singular values.
PLANTED = {
    "blocks.0.self_attn.q.weight": [0.8, 0.4, 0.2, 0.1],
    "blocks.0.ffn.2.weight": [1.0, 0.15, 0.04, 0.01, 0.002],
    "blocks.1.ffn.0.weight": [0.5 * 0.6**i for i in range(6)],
    "blocks.2.cross_attn.o.weight": [0.3, 0.29, 0.05],
    "head.head.weight": [0.2, 0.1],
    "time_projection.1.weight": list(np.linspace(0.4, 0.05, 8)),
    "text_embedding.0.weight": [0.25],
}
# Full changes of non-Linear tensors: name → scale of the added N(0, 1) noise.
CHANGED = {
    "blocks.0.self_attn.q.bias": 0.01,
    "time_projection.1.bias": 0.02,
    "blocks.1.norm3.weight": 0.05,
    "blocks.1.norm3.bias": 0.05,
    "blocks.0.self_attn.norm_q.weight": 0.03,
    "blocks.2.modulation": 0.04,
    "head.modulation": 0.04,
    "patch_embedding.weight": 0.02,
}


def orthonormal(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, k)))
    return q * np.sign(np.diag(r))


def make_tuned(base: dict, rng: np.random.Generator) -> dict:
    tuned = dict(base)
    for name in sorted(PLANTED):
        s = np.array(PLANTED[name], dtype=np.float64)
        w = base[name].astype(np.float64)
        u = orthonormal(rng, w.shape[0], len(s))
        v = orthonormal(rng, w.shape[1], len(s))
        tuned[name] = (w + (u * s) @ v.T).astype(np.float32)
    for name in sorted(CHANGED):
        w = base[name].astype(np.float64)
        tuned[name] = (w + CHANGED[name] * rng.standard_normal(w.shape)).astype(np.float32)
    return tuned


def spectrum_report(d: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """Singular values, energies and rel_errors of ΔW, and the energy rank picks."""
    u, s, vt = np.linalg.svd(d, full_matrices=False)
    total = float(np.sum(d * d))
    cum = np.cumsum(s * s)
    ranks = {}
    for r in RANKS:
        k = min(r, len(s))
        energy = float(cum[k - 1] / total)
        tail = float(np.sum(s[k:] ** 2))
        ranks[str(r)] = {"rank": k, "energy": energy, "rel_error": float(np.sqrt(tail / total))}
    picks = {}
    for f in ENERGIES:
        frac = cum / total
        k = int(np.argmax(frac >= f)) + 1
        margin = min(abs(frac[k - 1] - f), abs(frac[k - 2] - f) if k >= 2 else 1.0)
        assert margin > 1e-4, f"energy pick at F={f} is ambiguous (margin {margin}, {frac[:k+1]})"
        picks[str(f)] = k
    rep = {"singular_values": [float(x) for x in s], "ranks": ranks, "energy_rank": picks,
           "norm": float(np.sqrt(total)), "shape": list(d.shape)}
    return rep, u, s, vt


def extract_expectations(base: dict, tuned: dict) -> tuple[dict, dict]:
    modules, diffs, trunc = {}, {}, {}
    for name in sorted(base):
        d = tuned[name].astype(np.float64) - base[name].astype(np.float64)
        if not np.any(d):
            continue
        if d.ndim == 2 and name.endswith(".weight"):
            rep, u, s, vt = spectrum_report(d)
            modules[name[: -len(".weight")]] = rep
            for r in TRUNC_RANKS:
                k = min(r, len(s))
                trunc[f"r{r}.{name}"] = ((u[:, :k] * s[:k]) @ vt[:k]).astype(np.float32)
        else:
            diffs[name] = {"shape": list(d.shape), "norm": float(np.sqrt(np.sum(d * d)))}
    fixed = sum(4 * int(np.prod(d["shape"])) for d in diffs.values())
    budgets = {str(b): budget_ranks(modules, b - fixed) for b in BUDGETS}
    return {"ranks": RANKS, "energies": ENERGIES, "modules": modules, "diffs": diffs,
            "budgets": budgets, "fixed_bytes": fixed}, trunc


def budget_ranks(modules: dict, budget: int) -> dict:
    """Greedy allocation written out plainly: at each step, over all modules whose next rank
    still fits, the largest next σ² (ties: the module first in name order)."""
    names = sorted(modules)
    ranks = {n: 0 for n in names}
    stopped = set()
    while True:
        best = None
        for n in names:
            s = modules[n]["singular_values"]
            r = ranks[n]
            if n in stopped or r >= len(s):
                continue
            if best is None or s[r] ** 2 > best[0]:
                best = (s[r] ** 2, n)
        if best is None:
            return ranks
        n = best[1]
        out, inp = modules[n]["shape"]
        cost = (out + inp) * 4 + (4 if ranks[n] == 0 else 0)
        if cost > budget:
            stopped.add(n)
            continue
        budget -= cost
        ranks[n] += 1


RESIZE_MODULES = {
    # module: (rank, alpha or None)
    "blocks.0.self_attn.k": (6, 3.0),
    "blocks.1.ffn.2": (6, 12.0),
    "blocks.0.ffn.0": (5, None),
    "blocks.2.cross_attn.q": (2, 2.0),
}


def resize_fixtures(base: dict, rng: np.random.Generator) -> tuple[dict, dict, dict]:
    lora, expect, report = {}, {}, {"rank": RESIZE_RANK, "energy": RESIZE_ENERGY, "modules": {}}
    deltas = {}
    for mod in sorted(RESIZE_MODULES):
        r, alpha = RESIZE_MODULES[mod]
        out, inp = base[f"{mod}.weight"].shape
        down = (rng.standard_normal((r, inp)) / np.sqrt(inp)).astype(np.float32)
        up = (0.3 * rng.standard_normal((out, r)) / np.sqrt(r)).astype(np.float32)
        lora[f"diffusion_model.{mod}.lora_down.weight"] = down
        lora[f"diffusion_model.{mod}.lora_up.weight"] = up
        sigma = 1.0 if alpha is None else alpha / r
        if alpha is not None:
            lora[f"diffusion_model.{mod}.alpha"] = np.array(alpha, dtype=np.float32)
        p = sigma * (up.astype(np.float64) @ down.astype(np.float64))
        u, s, vt = np.linalg.svd(p, full_matrices=False)
        k = min(RESIZE_RANK, r)
        pr = (u[:, :k] * s[:k]) @ vt[:k] if r > RESIZE_RANK else p
        total = float(np.sum(p * p))
        cum = np.cumsum(s * s) / total
        pick = int(np.argmax(cum >= RESIZE_ENERGY)) + 1
        assert abs(cum[pick - 1] - RESIZE_ENERGY) > 1e-4
        report["modules"][mod] = {
            "rank_in": r, "rank": k, "energy": float(cum[k - 1]),
            "rel_error": float(np.sqrt(max(total - float(np.sum(s[:k] ** 2)), 0.0) / total)),
            "energy_rank": min(pick, r), "singular_values": [float(x) for x in s[:r]],
        }
        expect[f"trunc.{mod}"] = pr.astype(np.float32)
        deltas[f"{mod}.weight"] = pr
    diff_b = (0.02 * rng.standard_normal(32)).astype(np.float32)
    lora["diffusion_model.blocks.1.self_attn.o.diff_b"] = diff_b
    deltas["blocks.1.self_attn.o.bias"] = diff_b.astype(np.float64)
    norm_diff = (0.05 * rng.standard_normal(32)).astype(np.float32)
    lora["diffusion_model.blocks.0.norm3.diff"] = norm_diff
    deltas["blocks.0.norm3.weight"] = norm_diff.astype(np.float64)
    for s in STRENGTHS:
        for name in sorted(deltas):
            merged = base[name].astype(np.float64) + float(s) * deltas[name]
            expect[f"s{s}.{name}"] = merged.astype(np.float32)
    return lora, expect, report


def main() -> None:
    OUT.mkdir(exist_ok=True)
    base = load_file(str(BASE))
    rng = np.random.default_rng(15015)
    tuned = make_tuned(base, rng)
    save_file({k: tuned[k] for k in sorted(tuned)}, str(OUT / "tuned.safetensors"))
    expect, trunc = extract_expectations(base, tuned)
    (OUT / "expect.json").write_text(json.dumps(expect, indent=1, sort_keys=True) + "\n")
    save_file(dict(sorted(trunc.items())), str(OUT / "expect_trunc.safetensors"))
    lora, rexpect, rreport = resize_fixtures(base, rng)
    save_file(dict(sorted(lora.items())), str(OUT / "resize_lora.safetensors"))
    save_file(dict(sorted(rexpect.items())), str(OUT / "expect_resize.safetensors"))
    (OUT / "expect_resize.json").write_text(json.dumps(rreport, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    assert total < 1 << 20, f"golden/extract is {total} bytes"
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
