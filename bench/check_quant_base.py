"""Checks wanbake's decoding of the 1.3B quantized bases of bench/quant_base.sh against the
references, every tensor bit for bit: gguf-py 0.19's `dequantize` (GGUF) and ComfyUI's
`q.to(float32) * scale_weight` in torch (scaled fp8). Inputs: /tmp/wb/q-q4km, /tmp/wb/q-fp8 and
their `wanbake convert ... --dtype f32` outputs in /tmp/wb/v-q4, /tmp/wb/v-fp8.
Run with a Python holding torch 2.15.0, gguf 0.19.0, safetensors, numpy."""
import sys, numpy as np, torch, gguf
from gguf.quants import dequantize
from safetensors import safe_open
from safetensors.torch import load_file
# GGUF: gguf-py's dequantize of every tensor vs wanbake's convert --dtype f32
r = gguf.GGUFReader('/tmp/wb/q-q4km/model-q4_k_m.gguf')
out = safe_open('/tmp/wb/v-q4/model-q4_k_m.safetensors', 'np')
n = bad = 0
for t in r.tensors:
    shape = tuple(int(x) for x in reversed(t.shape))
    want = np.ascontiguousarray(dequantize(t.data, t.tensor_type).reshape(shape), dtype=np.float32)
    got = out.get_tensor(t.name)
    n += 1
    if got.shape != want.shape or not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        bad += 1; print('GGUF MISMATCH', t.name, got.shape, want.shape)
print(f'gguf: {n} tensors, {bad} differ')
# fp8: ComfyUI's q.to(f32) * scale_weight vs wanbake's convert --dtype f32
sd = safe_open('/tmp/wb/q-fp8/model_fp8_scaled.safetensors', 'pt')
out = safe_open('/tmp/wb/v-fp8/model_fp8_scaled.safetensors', 'pt')
keys = set(sd.keys()); n = bad = 0
for k in sorted(keys):
    if k == 'scaled_fp8' or k.endswith('.scale_weight') or k.endswith('.scale_input'): continue
    v = sd.get_tensor(k)
    if v.dtype == torch.float8_e4m3fn:
        want = v.to(torch.float32) * sd.get_tensor(k[:-len('.weight')] + '.scale_weight')
    else:
        want = v.to(torch.float32)
    got = out.get_tensor(k)
    n += 1
    if got.shape != want.shape or not torch.equal(got.view(torch.int32), want.view(torch.int32)):
        bad += 1; print('FP8 MISMATCH', k)
print(f'fp8: {n} tensors, {bad} differ, output keys {len(list(out.keys()))}')
