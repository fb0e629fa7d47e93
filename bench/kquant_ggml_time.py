"""ggml's side of tests/kquant.rs::kquant_speed_5120x13824: times `ggml_quantize_chunk`
(llama-cpp-python 0.3.36's libggml-base, the pinned build of golden/kquant_golden.py; one
thread) per K-quant type on the same (5120, 13824) matrix, CPU time of the calling thread in
ns per element, and prints the first 8 bytes of the output's sha256 (the Rust test prints its
own: equal digests, equal bytes).

    KQUANT_SPEED_DUMP=/tmp/m.f32 cargo test --release --test kquant -- --ignored --nocapture
    $KQUANT_VENV/bin/python bench/kquant_ggml_time.py /tmp/m.f32 [q2_k q3_k ...]
"""
import ctypes, hashlib, importlib.util, time, sys
from pathlib import Path
import numpy as np

spec = importlib.util.find_spec("llama_cpp")
lib = ctypes.CDLL(str(Path(spec.origin).parent / "lib" / "libggml-base.so"))
lib.ggml_quantize_chunk.restype = ctypes.c_size_t
lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
R, C = 5120, 13824
x = np.fromfile(sys.argv[1], dtype="<f4").reshape(R, C)
types = {"q2_k": (10, 84), "q3_k": (11, 110), "q4_k": (12, 144), "q5_k": (13, 176), "q6_k": (14, 210)}
for name in sys.argv[2:] or types:
    tid, size = types[name]
    out = np.zeros(R * C // 256 * size, dtype=np.uint8)
    t0 = time.thread_time()
    lib.ggml_quantize_chunk(tid, x.ctypes.data, out.ctypes.data, 0, R, C, None)
    cpu = time.thread_time() - t0
    print(f"{name}: {cpu:.2f} s CPU, {cpu * 1e9 / x.size:.1f} ns/element (ggml, one thread), "
          f"sha256 {hashlib.sha256(out.tobytes()).hexdigest()[:16]}", flush=True)
