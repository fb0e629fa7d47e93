# The forward error of every output format (README, "Which format to ship"): `bake` of the 1.3B
# bench (f32 base, rank-64 LoRA; bench/assets.sh's /tmp/wb) to each format with one `[[check]]`
# against `expected = "unmerged"` (the same LoRA merged in f32, never rounded), on one small
# input (latent [1,16,1,16,16], 32 text tokens, t = 500). Prints one line per format with the
# check's max and mean |diff|.
set -e
W=${WANBAKE:-/tmp/wb/wanbake}
P=${PYTHON:-python3}  # numpy, safetensors
B=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/fe && cd /tmp/fe
$P - <<'PY'
import numpy as np
from safetensors.numpy import save_file
r = np.random.default_rng(3)
save_file({"hidden_states": r.standard_normal((1, 16, 1, 16, 16)).astype(np.float32),
           "timestep": np.array([500.0], dtype=np.float32),
           "encoder_hidden_states": (r.standard_normal((1, 32, 4096)) * 0.1).astype(np.float32)},
          "inputs.safetensors")
PY
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-fe
for to in bf16 fp8-scaled gguf:q8_0 gguf:q4_k_m comfy:fp8 comfy:nvfp4 comfy:mxfp8 comfy:int8 comfy:int8-convrot lightx2v:int8 lightx2v:fp8; do
  if [ $to = bf16 ]; then sed 's/^to = "TO"/dtype = "bf16"/' $B/forward_error.toml > t.toml
  else sed "s/TO/$to/" $B/forward_error.toml > t.toml; fi
  out=$($W bake t.toml --device cpu 2>/dev/null | grep -E "check vs|wrote")
  echo "FE $to | $out" | tr '\n' ' '; echo
  rm -rf /tmp/fe/out
done
echo FE-DONE
