# The same job with diffusers + PEFT: load the f32 base, apply the PEFT adapter (LoRA or
# LoKr folder), merge, save bf16. No hashing, no fsync. Usage: peer.py BASE ADAPTER OUT
import sys, time
import torch
from diffusers import WanTransformer3DModel
from peft import PeftModel

base, adapter, out = sys.argv[1:4]
t0 = time.time()
model = WanTransformer3DModel.from_pretrained(base, torch_dtype=torch.float32)
model = PeftModel.from_pretrained(model, adapter)
model = model.merge_and_unload()
model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
print(f"peer done in {time.time() - t0:.1f} s", file=sys.stderr)
