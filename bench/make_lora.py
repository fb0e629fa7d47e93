# Rank-64 PEFT LoRA on every block Linear of a Wan2.1-T2V-1.3B-shaped transformer (numpy, seeded).
# Usage: make_lora.py OUT_DIR [R D F L]   (BENCHMARKS.md, Merge and Pipeline sections;
# 14B: make_lora.py OUT_DIR 16 5120 13824 40)
import json, os, sys
import numpy as np
from safetensors.numpy import save_file

out, (r, D, F, L) = sys.argv[1], [int(x) for x in sys.argv[2:6]] or (64, 1536, 8960, 30)
os.makedirs(out, exist_ok=True)
mods = {f"attn{a}.{p}": (D, D) for a in (1, 2) for p in ("to_q", "to_k", "to_v", "to_out.0")}
mods.update({"ffn.net.0.proj": (F, D), "ffn.net.2": (D, F)})
rng, t = np.random.default_rng(0), {}
for b in range(L):
    for m, (o, i) in mods.items():
        k = f"base_model.model.blocks.{b}.{m}"
        t[k + ".lora_A.weight"] = (rng.uniform(-1, 1, (r, i)) / np.sqrt(i)).astype(np.float32)
        t[k + ".lora_B.weight"] = (rng.uniform(-1, 1, (o, r)) * 0.01).astype(np.float32)
save_file(t, f"{out}/adapter_model.safetensors", metadata={"format": "pt"})
json.dump({"peft_type": "LORA", "r": r, "lora_alpha": r, "target_modules": sorted(mods),
           "bias": "none", "use_dora": False, "use_rslora": False, "fan_in_fan_out": False,
           "lora_dropout": 0.0, "modules_to_save": None, "task_type": None,
           "base_model_name_or_path": None, "init_lora_weights": True},
          open(f"{out}/adapter_config.json", "w"), indent=1)
