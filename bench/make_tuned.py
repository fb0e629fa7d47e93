# A "fine-tune" of the synthetic 1.3B base for `wanbake extract`: every block Linear gets a
# planted rank-32 delta U·diag(s)·Vᵀ (s_i = 0.02/i, seeded orthonormal U, V) plus 1e-6·N
# noise (so ΔW is full rank), and every block's norm_q/norm_k weight and ffn.net.2 bias a
# small full change. Usage: make_tuned.py BASE_DIR OUT_DIR
import json, os, shutil, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

base, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
rng, k = np.random.default_rng(3), 32
src = [f for f in os.listdir(base) if f.endswith(".safetensors")]
assert len(src) == 1, src
t = {}
with safe_open(os.path.join(base, src[0]), "np") as f:
    for name in f.keys():
        w = f.get_tensor(name)
        parts = name.split(".")
        if name.startswith("blocks.") and name.endswith(".weight") and w.ndim == 2 and (
                "attn" in name or "ffn" in name):
            o, i = w.shape
            u, _ = np.linalg.qr(rng.standard_normal((o, k)))
            v, _ = np.linalg.qr(rng.standard_normal((i, k)))
            d = (u * (0.02 / np.arange(1, k + 1))) @ v.T
            d += 1e-6 * rng.standard_normal((o, i))
            w = (w.astype(np.float64) + d).astype(np.float32)
        elif name.startswith("blocks.") and (name.endswith("norm_q.weight") or
                                             name.endswith("norm_k.weight") or
                                             name.endswith("ffn.net.2.bias")):
            w = (w + 1e-3 * rng.standard_normal(w.shape)).astype(np.float32)
        t[name] = w
save_file(t, os.path.join(out, src[0]))
for extra in os.listdir(base):
    if extra == "config.json":
        shutil.copy(os.path.join(base, extra), os.path.join(out, extra))
