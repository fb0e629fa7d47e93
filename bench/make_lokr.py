# A PEFT LOKR folder on every block Linear of a Wan2.1-T2V-1.3B-shaped transformer (numpy,
# seeded): decompose_factor 8, w1 full (8, 8), w2 = w2_a @ w2_b at r = 16, alpha = 16, as
# PEFT's LoKrModel lays it out (peft 0.21.2: factorization(dim, 8) -> (8, dim/8)).
# wanbake reads the folder as LoKr (scale alpha/r = 1, PEFT's rule); PEFT loads the same
# folder for the peer. Usage: make_lokr.py OUT_DIR
import json, os, sys
import numpy as np
from safetensors.numpy import save_file

out, r, f, D, F, L = sys.argv[1], 16, 8, 1536, 8960, 30
os.makedirs(out, exist_ok=True)
mods = {f"attn{a}.{p}": (D, D) for a in (1, 2) for p in ("to_q", "to_k", "to_v", "to_out.0")}
mods.update({"ffn.net.0.proj": (F, D), "ffn.net.2": (D, F)})
rng, t = np.random.default_rng(1), {}
for b in range(L):
    for m, (o, i) in mods.items():
        k = f"base_model.model.blocks.{b}.{m}"
        t[k + ".lokr_w1"] = rng.uniform(-1, 1, (f, f)).astype(np.float32)
        t[k + ".lokr_w2_a"] = (rng.uniform(-1, 1, (o // f, r)) * 0.01).astype(np.float32)
        t[k + ".lokr_w2_b"] = (rng.uniform(-1, 1, (r, i // f)) / np.sqrt(i)).astype(np.float32)
save_file(t, f"{out}/adapter_model.safetensors", metadata={"format": "pt"})
json.dump({"peft_type": "LOKR", "r": r, "alpha": r, "target_modules": sorted(mods),
           "decompose_both": False, "decompose_factor": f, "rank_pattern": {},
           "alpha_pattern": {}, "rank_dropout": 0.0, "module_dropout": 0.0,
           "use_effective_conv2d": False, "init_weights": True, "modules_to_save": None,
           "layers_pattern": None, "layers_to_transform": None, "exclude_modules": None,
           "rank_dropout_scale": False, "task_type": None, "base_model_name_or_path": None,
           "inference_mode": True},
          open(f"{out}/adapter_config.json", "w"), indent=1)
