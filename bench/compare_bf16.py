# Compares two bf16 diffusers checkpoints tensor by tensor (wanbake's merge against the
# diffusers + PEFT peer's): the largest distance in bf16 ulps and how many elements differ.
# Usage: compare_bf16.py DIR_A DIR_B
import glob, sys

import torch
from safetensors import safe_open

def tensors(d):
    out = {}
    for p in sorted(glob.glob(f"{d}/*.safetensors")):
        with safe_open(p, "pt") as h:
            for k in h.keys():
                out[k] = p
    return out

a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert set(a) == set(b), sorted(set(a) ^ set(b))[:10]
worst, differ, total, kept, over1, rel, rel1 = 0, 0, 0, [], 0, 0.0, 0.0
for k in sorted(a):
    with safe_open(a[k], "pt") as h:
        x = h.get_tensor(k)
    with safe_open(b[k], "pt") as h:
        y = h.get_tensor(k)
    if x.dtype != y.dtype:
        # wanbake's keep-f32 policy keeps some tensors f32; the peer casts every one.
        kept.append(k)
        x, y = x.to(torch.bfloat16), y.to(torch.bfloat16)
    if x.dtype != torch.bfloat16:
        d = (x.float() - y.float()).abs().max().item() if x.numel() else 0.0
        if d != 0.0:
            print(f"{k}: {x.dtype} differs by {d}")
        continue
    xi = x.view(torch.int16).to(torch.int32)
    yi = y.view(torch.int16).to(torch.int32)
    # sign-magnitude to a monotone integer line
    xi = torch.where(xi < 0, -(xi & 0x7FFF), xi)
    yi = torch.where(yi < 0, -(yi & 0x7FFF), yi)
    u = (xi - yi).abs()
    worst = max(worst, int(u.max().item()) if u.numel() else 0)
    differ += int((u != 0).sum().item())
    over1 += int((u > 1).sum().item())
    if (u > 1).any():
        # elements more than one ulp apart: how far, against the tensor's largest magnitude
        m = u > 1
        d1 = (x.float()[m] - y.float()[m]).abs().max().item()
        rel1 = max(rel1, d1 / max(x.float().abs().max().item(), 1e-30))
    total += u.numel()
    if u.numel() and u.max() > 0:
        # the largest difference against the tensor's largest magnitude: near-zero sums
        # that cancel are many ulps apart but tiny against the weights
        d = (x.float() - y.float()).abs().max().item()
        rel = max(rel, d / max(x.float().abs().max().item(), 1e-30))
print(f"bf16 elements: {total}, differing: {differ} ({over1} by more than 1 ulp), largest "
      f"distance: {worst} ulp, largest |a - b| / max|a| of a tensor: {rel:.2e} (over the "
      f"elements more than 1 ulp apart: {rel1:.2e}); "
      f"{len(kept)} tensors compared after rounding the f32 one to bf16")
