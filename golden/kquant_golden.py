"""K-quant goldens (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) from ggml itself, for wanbake's port of
ggml's reference quantizers (src/io/quant/kquant.rs; spec quant_formats.md K.3/K.4).

The oracle is the `libggml-base` of llama-cpp-python 0.3.36 (ggml 0.25.3, llama.cpp b11312,
commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f), built from its PyPI source distribution on
the CPU. `libggml-base` holds `ggml-quants.c` and is compiled `-O3 -std=gnu11` with no `-march`
(the GGML_* CPU flags below only concern `libggml-cpu`), so its float arithmetic is uncontracted.
Through ctypes this script calls:
- `ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, imatrix = NULL)`, which for
  Q2_K..Q6_K without an imatrix runs `quantize_row_qN_K_ref` over the rows (ggml.c
  `ggml_quantize_chunk` → ggml-quants.c `quantize_qN_K`); the script checks that its bytes equal
  `ggml_get_type_traits(type)->from_float_ref` (the `_ref` row quantizer itself) on every input;
- `ggml_get_type_traits(type)->to_float` (`dequantize_row_qN_K`) on those bytes.
As a second check, gguf-py 0.19's `gguf.quants.dequantize` (which can decode but not encode
K-quants) decodes the same bytes; the script requires it to agree with ggml bit for bit.

Writes golden/quant/kquant.safetensors:
- inputs, F32, every row a whole number of 256-blocks:
  `crafted` (one super-block per row: zeros, constants, one outlier, values near 1e-8 and
  below GROUP_MAX_EPS, all positive, all negative, exact rounding ties of each type's first
  scale, argmax ties, values near the f16 maximum, blocks whose f16 scales overflow, blocks
  that send `nearest_int` past ±4194303, sparse and mixed-scale blocks, random blocks);
  `crafted_f16` (the rows of `crafted` whose f16 rounding is finite, rounded to f16 and back);
  `diverse` (512 seeded random super-blocks of varied shapes and magnitudes, 1e-8 … 1e4);
  `matrix` (seeded random (512, 1024), since no 2-D tensor of golden/models/t2v_original.safetensors
  has rows of whole 256-blocks; the script stops if one ever has). The f16 roundings of
  `diverse` and `matrix` are not stored: they are `.astype(float16).astype(float32)` (round to
  nearest even), which the tests recompute;
- `N|<type>` (U8, ggml's bytes, one row of bytes per input row) for N in crafted, crafted_f16,
  diverse, diverse_f16, matrix, matrix_f16 and type in q2_k, q3_k, q4_k, q5_k, q6_k;
- `N|<type>|deq` (F32, ggml's dequantization of those bytes) for the crafted inputs;

and golden/quant/kquant.json: `N|<type>|deq_sha256` for every input (sha256 of ggml's
dequantized values, f32 little endian, row-major), and `oracle` / `gguf_py_dequant` / `matrix`
saying what made them (a JSON file with sorted keys, because safetensors 0.8 writes a
multi-key `__metadata__` in random order).

Run (about 20 minutes on two cores, most of it the source build):
    python3 golden/kquant_golden.py
It creates (or reuses) a virtual environment at $KQUANT_VENV (default
/tmp/wanbake-kquant-venv) with the pinned versions below, builds llama-cpp-python there from
source with CMAKE_ARGS, then re-runs itself inside it. Two runs give identical files.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "quant"
VENV = Path(os.environ.get("KQUANT_VENV", "/tmp/wanbake-kquant-venv"))

# Pinned versions (installed into VENV; the build tools are used without build isolation).
PINS = [
    "numpy==2.4.6",
    "safetensors==0.8.0",
    "gguf==0.19.0",
    "cmake==4.4.5",
    "ninja==1.13.2",
    "scikit-build-core==0.11.6",
]
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF "
              "-DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF "
              "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF")

QK_K = 256
# name -> (ggml_type id, bytes per block)
TYPES = {"q2_k": (10, 84), "q3_k": (11, 110), "q4_k": (12, 144), "q5_k": (13, 176),
         "q6_k": (14, 210)}


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def setup_and_reexec() -> None:
    py = VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    have = subprocess.run([str(py), "-c", "import importlib.metadata as m; "
                           "print(m.version('llama_cpp_python'))"],
                          capture_output=True, text=True)
    if have.returncode != 0 or have.stdout.strip() != LLAMA_CPP_PYTHON.split("==")[1]:
        subprocess.run([str(py), "-m", "pip", "install", *PINS], check=True)
        env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                        "--no-binary", "llama-cpp-python", LLAMA_CPP_PYTHON], check=True, env=env)
    os.execv(str(py), [str(py), __file__, *sys.argv[1:]])


# ---------------------------------------------------------------------------- the oracle

class TypeTraits(ctypes.Structure):
    # ggml.h `struct ggml_type_traits` (ggml 0.25.3)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class Ggml:
    def __init__(self) -> None:
        spec = importlib.util.find_spec("llama_cpp")
        assert spec is not None and spec.origin is not None, "llama_cpp is not installed"
        self.path = Path(spec.origin).parent / "lib" / "libggml-base.so"
        lib = ctypes.CDLL(str(self.path))
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p]
        lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        self.lib = lib

    def traits(self, tid: int) -> TypeTraits:
        t = self.lib.ggml_get_type_traits(tid).contents
        assert t.blck_size == QK_K and t.is_quantized
        return t

    def quantize(self, tname: str, x: "np.ndarray") -> "np.ndarray":
        tid, size = TYPES[tname]
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, n = x.shape
        assert n % QK_K == 0 and np.isfinite(x).all()
        assert not self.lib.ggml_quantize_requires_imatrix(tid)
        t = self.traits(tid)
        assert t.type_size == size
        out = np.zeros((rows, n // QK_K * size), np.uint8)
        got = self.lib.ggml_quantize_chunk(tid, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
        assert got == out.size
        # the chunk path is the `_ref` row quantizer (no imatrix): same bytes
        ref = np.zeros_like(out)
        FROM_FLOAT(t.from_float_ref)(x.ctypes.data, ref.ctypes.data, x.size)
        assert np.array_equal(out, ref), f"{tname}: ggml_quantize_chunk != from_float_ref"
        return out

    def dequantize(self, tname: str, q: "np.ndarray", n: int) -> "np.ndarray":
        tid, _ = TYPES[tname]
        q = np.ascontiguousarray(q)
        y = np.zeros((q.shape[0], n), np.float32)
        TO_FLOAT(self.traits(tid).to_float)(q.ctypes.data, y.ctypes.data, y.size)
        return y


# ---------------------------------------------------------------------------- the inputs

def crafted() -> "np.ndarray":
    rng = np.random.default_rng(30)
    n = QK_K
    rows: list[np.ndarray] = []

    def add(v) -> None:
        v = np.asarray(v, dtype=np.float32).reshape(-1)
        assert v.size == n and np.isfinite(v).all()
        rows.append(v)

    add(np.zeros(n))                                       # 0 all zero
    add(np.full(n, 0.37))                                  # 1 constant
    add(np.full(n, -1.25))                                 # 2 negative constant
    v = rng.standard_normal(n) * 0.02                      # 3 one outlier
    v[77] = 5.0
    add(v)
    v = rng.standard_normal(n) * 0.02                      # 4 one negative outlier
    v[200] = -3.0
    add(v)
    add(rng.standard_normal(n) * 1e-8)                     # 5 near 1e-8: f16 scales underflow
    add(rng.standard_normal(n) * 3e-6)                     # 6 f16 subnormal scales
    v = rng.standard_normal(n) * 1e-16                     # 7 below GROUP_MAX_EPS except one
    v[16:32] = rng.standard_normal(16) * 1e-3              #   sub-block of 16
    add(v)
    add(rng.uniform(0.1, 1.0, n))                          # 8 all positive
    add(-rng.uniform(0.1, 1.0, n))                         # 9 all negative
    add(rng.uniform(5.0, 5.5, n))                          # 10 positive offset, small spread
    # 11-13 exact ties. Q4_K: a 32-sub-block spanning [0, 15] has iscale = 1, so k + 0.5 is a
    # tie of nearest_int; Q5_K the same over [0, 31]; Q3_K/Q6_K: max -4 (-32) gives iscale 1.
    t = np.concatenate([[0.0, 15.0], np.arange(30) % 15 + 0.5])
    add(np.tile(t, 8))
    t = np.concatenate([[0.0, 31.0], np.arange(30) + 0.5])
    add(np.tile(t, 8))
    t = np.concatenate([[-4.0], np.arange(15) % 8 - 3.5])
    add(np.tile(t, 16))
    t = np.concatenate([[-32.0], np.arange(15) * 4 - 29.5])
    add(np.tile(t, 16))                                    # 14
    add(np.tile([3.0, -3.0] + [0.25] * 14, 16))            # 15 argmax ties, + first
    add(np.tile([-3.0, 3.0] + [0.25] * 14, 16))            # 16 argmax ties, - first
    v = np.clip(rng.standard_normal(n) * 2e4, -65504, 65504)  # 17 near the f16 maximum
    v[:4] = [65504.0, -65504.0, 65500.0, -60000.0]
    add(v)
    add(rng.standard_normal(n) * 1e8)                      # 18 f16 scales overflow to inf
    # 19-21 nearest_int past ±4194303 (Q2_K, Q4_K, Q5_K): one sub-block far below zero makes
    # dmin large, so the rounding error of dmin·m, divided by the tiny step of a narrow
    # sub-block, is huge. (f16-rounded inputs cannot get there: within a sub-block their
    # spread is at least 2^-11 of its offset.)
    for o, noise in ((1000.0, 1e-4), (100.0, 1e-5)):
        v = -o * (1 + 0.1 * np.repeat(np.arange(8), 32)) + rng.uniform(-noise, noise, n)
        v[:32] -= 99 * o
        add(v)
    v = rng.uniform(-1e-5, 1e-5, n)
    for j in range(n // 32):
        v[32 * j:32 * j + 32] += -10.0 ** (j % 4) * (1 + 0.1 * j)
    add(v)
    v = np.zeros(n)                                        # 22 sparse
    idx = rng.choice(n, 12, replace=False)
    v[idx] = rng.standard_normal(12)
    add(v)
    v = rng.standard_normal(n)                             # 23 mixed scales per sub-block
    v *= np.repeat(10.0 ** rng.uniform(-4, 0, n // 16), 16)
    add(v)
    add(np.float32(2.0 ** -24) * rng.integers(-40, 40, n))  # 24 f16 subnormal grid
    add((np.arange(n) - 127.5) / 64)                       # 25 ramp
    for s in (0.02, 1.0, 0.3):                             # 26-28 random normal
        add(rng.standard_normal(n) * s)
    add(rng.standard_t(2, n) * 0.05)                       # 29 heavy tails
    return np.stack(rows)


def diverse() -> "np.ndarray":
    """512 random super-blocks of varied shapes and magnitudes (1e-8 … 1e4): normal, uniform,
    offset, sparse, heavy-tailed, per-sub-block scales, negative or positive extremes."""
    rng = np.random.default_rng(3030)
    rows = []
    for i in range(512):
        kind = i % 8
        mag = 10.0 ** rng.uniform(-8, 4)
        if kind == 0:
            v = rng.standard_normal(QK_K)
        elif kind == 1:
            v = rng.uniform(-1, 1, QK_K)
        elif kind == 2:
            v = rng.uniform(0, 1, QK_K) + rng.uniform(-3, 3)
        elif kind == 3:
            v = np.where(rng.uniform(size=QK_K) < 0.1, rng.standard_normal(QK_K), 0.0)
        elif kind == 4:
            v = rng.standard_t(1.5, QK_K)
        elif kind == 5:
            v = rng.standard_normal(QK_K) * np.repeat(10.0 ** rng.uniform(-3, 0, 16), 16)
        elif kind == 6:
            v = -np.abs(rng.standard_normal(QK_K))
            v[rng.integers(QK_K)] *= 10
        else:
            v = rng.standard_normal(QK_K) + np.repeat(rng.uniform(-5, 5, 8), 32)
        rows.append(np.clip(v * mag, -6e4, 6e4))
    return np.stack(rows).astype(np.float32)


def model_or_random() -> tuple["np.ndarray", str]:
    from safetensors.numpy import load_file
    sd = load_file(str(ROOT / "models" / "t2v_original.safetensors"))
    whole = {k: v for k, v in sorted(sd.items()) if v.ndim == 2 and v.shape[1] % QK_K == 0}
    if whole:
        raise SystemExit(f"t2v now has whole-block rows ({sorted(whole)}): use them")
    rng = np.random.default_rng(1030)
    m = rng.standard_normal((512, 1024)) * 0.02
    m *= 10.0 ** rng.uniform(-1, 1, (512, 1))              # per-row scales, as trained weights
    m[rng.integers(0, 512, 64), rng.integers(0, 1024, 64)] *= 20  # a few outliers
    return m.astype(np.float32), "seeded random (512, 1024): no t2v tensor has whole 256-blocks"


def f16_round(x: "np.ndarray") -> "np.ndarray":
    return x.astype(np.float16).astype(np.float32)


def main() -> None:
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize as gguf_dequantize
    from safetensors.numpy import save_file

    g = Ggml()
    gtype = {"q2_k": T.Q2_K, "q3_k": T.Q3_K, "q4_k": T.Q4_K, "q5_k": T.Q5_K, "q6_k": T.Q6_K}
    c = crafted()
    finite = np.isfinite(f16_round(c)).all(axis=1)
    m, m_why = model_or_random()
    d = diverse()
    inputs = {"crafted": c, "crafted_f16": f16_round(c[finite]), "diverse": d,
              "diverse_f16": f16_round(d), "matrix": m, "matrix_f16": f16_round(m)}
    stored = {"crafted", "crafted_f16", "diverse", "matrix"}
    out: dict[str, np.ndarray] = {k: inputs[k] for k in sorted(stored)}
    meta = {
        "oracle": f"libggml-base of {LLAMA_CPP_PYTHON} (ggml 0.25.3, llama.cpp b11312 "
                  "0c1e57098bba43ac29e6e3b677cdceebdd22334f), source build, CMAKE_ARGS "
                  f"{CMAKE_ARGS}; ggml_quantize_chunk(imatrix=NULL) == from_float_ref",
        "gguf_py_dequant": "gguf 0.19.0 gguf.quants.dequantize equals ggml's to_float bit for "
                           "bit on every input and type",
        "matrix": m_why,
        "matrix_f16": "matrix.astype(float16).astype(float32), not stored",
        "diverse_f16": "diverse.astype(float16).astype(float32), not stored",
    }
    for name, x in inputs.items():
        for tname in TYPES:
            q = g.quantize(tname, x)
            y = g.dequantize(tname, q, x.shape[1])
            yg = np.asarray(gguf_dequantize(q, gtype[tname]), np.float32).reshape(y.shape)
            assert np.array_equal(y.view(np.uint32), yg.view(np.uint32)), \
                f"{name}|{tname}: gguf-py dequantizes differently from ggml"
            out[f"{name}|{tname}"] = q
            if name.startswith("crafted"):
                out[f"{name}|{tname}|deq"] = y
            meta[f"{name}|{tname}|deq_sha256"] = hashlib.sha256(
                np.ascontiguousarray(y).astype("<f4").tobytes()).hexdigest()
            print(f"{name}|{tname}: {q.nbytes} bytes, max |x - deq| "
                  f"{np.nanmax(np.abs(x - y)):.3g}")
    path = OUT / "kquant.safetensors"
    save_file(out, str(path))
    (OUT / "kquant.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes) and kquant.json")


if __name__ == "__main__":
    if not in_venv():
        setup_and_reexec()
    import numpy as np
    main()
