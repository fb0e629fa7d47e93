# The quality table of README ("A release matrix"): every format wanbake writes baked as one
# matrix of the 1.3B bench (f32 base, rank-64 LoRA; bench/assets.sh's /tmp/wb) with one check
# against the unrounded f32 merge (bench/forward_error.sh's input: latent [1,16,1,16,16], 32
# text tokens, t = 500). Prints the table `bake` prints.
set -e
W=${WANBAKE:-/tmp/wb/wanbake}
B=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/fe && cd /tmp/fe
[ -f inputs.safetensors ] || { echo "run bench/forward_error.sh once for its input"; exit 1; }
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-fe
{
  printf '[base]\npath = "/tmp/wb/base"\n[[adapter]]\npath = "/tmp/wb/lora"\n'
  for o in 'bf16|dtype = "bf16"' 'fp8-scaled|to = "fp8-scaled"' 'q8_0|to = "gguf:q8_0"' \
      'q5_0|to = "gguf:q5_0"' 'q4_0|to = "gguf:q4_0"' 'q6_k|to = "gguf:q6_k"' \
      'q5_k_m|to = "gguf:q5_k_m"' 'q4_k_m|to = "gguf:q4_k_m"' 'q3_k_m|to = "gguf:q3_k_m"' \
      'comfy-fp8|to = "comfy:fp8"' 'comfy-nvfp4|to = "comfy:nvfp4"' 'comfy-mxfp8|to = "comfy:mxfp8"' \
      'comfy-int8|to = "comfy:int8"' 'comfy-int8-convrot|to = "comfy:int8-convrot"' \
      'lightx2v-int8|to = "lightx2v:int8"' 'lightx2v-fp8|to = "lightx2v:fp8"' 'orbax|to = "orbax"'; do
    printf '[[output]]\ndir = "/tmp/fe/m/%s"\n%s\noverwrite = true\n' "${o%%|*}" "${o#*|}"
  done
  printf '[[check]]\nname = "vs-f32-merge"\ninputs = "/tmp/fe/inputs.safetensors"\nexpected = "unmerged"\ntolerance = 1e6\n'
} > matrix.toml
/usr/bin/time -f "matrix: %e s wall, %U user, %S sys, %M KiB peak" $W bake matrix.toml --device cpu 2>&1 | grep -A40 "quality:\|matrix:"
rm -rf /tmp/fe/m
echo QUALITY-DONE
