# A base/tuned pair of single Linear weights of one shape for per-matrix extraction costs:
# W random, tuned = W + planted rank-32 delta (s_i = 0.02/i) + 1e-6 noise, as make_tuned.py.
# Usage: make_pair.py OUT_DIR OUT_FEATURES IN_FEATURES
import os, sys
import numpy as np
from safetensors.numpy import save_file

out, o, i = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
rng, k = np.random.default_rng(5), 32
w = (rng.uniform(-1, 1, (o, i)) / np.sqrt(i)).astype(np.float32)
u, _ = np.linalg.qr(rng.standard_normal((o, k)))
v, _ = np.linalg.qr(rng.standard_normal((i, k)))
d = (u * (0.02 / np.arange(1, k + 1))) @ v.T + 1e-6 * rng.standard_normal((o, i))
name = "blocks.0.ffn.net.0.proj.weight"
save_file({name: w}, f"{out}/base.safetensors")
save_file({name: (w.astype(np.float64) + d).astype(np.float32)}, f"{out}/tuned.safetensors")
