# Compares two f32 adapters (or checkpoints) tensor by tensor, e.g. `extract --device cpu`
# against `extract --device cuda`: how many elements differ, the largest distance in f32
# ulps, and the largest |a - b| relative to the tensor's largest |b|.
# Usage: compare_f32.py DIR_A DIR_B
import glob, sys

import numpy as np
from safetensors.numpy import load_file

def tensors(d):
    out = {}
    for p in sorted(glob.glob(f"{d}/*.safetensors")):
        out.update(load_file(p))
    return out

a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert set(a) == set(b), sorted(set(a) ^ set(b))[:10]
total = differ = worst_ulps = 0
worst_rel = 0.0
for k in sorted(a):
    x, y = a[k], b[k]
    assert x.shape == y.shape and x.dtype == y.dtype == np.float32, (k, x.shape, y.shape, x.dtype)
    xi, yi = x.view(np.int32).astype(np.int64), y.view(np.int32).astype(np.int64)
    # sign-magnitude to a monotone integer line
    xi = np.where(xi < 0, -(xi & 0x7FFFFFFF), xi)
    yi = np.where(yi < 0, -(yi & 0x7FFFFFFF), yi)
    u = np.abs(xi - yi)
    total += x.size
    differ += int(np.count_nonzero(u))
    worst_ulps = max(worst_ulps, int(u.max()) if u.size else 0)
    scale = float(np.abs(y).max()) if y.size else 0.0
    if scale > 0:
        worst_rel = max(worst_rel, float(np.abs(x - y).max()) / scale)
print(f"{differ} of {total} f32 elements differ; largest distance {worst_ulps} ulps, "
      f"{worst_rel:.2e} of the tensor's largest value")
