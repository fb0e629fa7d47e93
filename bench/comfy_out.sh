# The comfy:* and lightx2v:* outputs on the 1.3B bench (BENCHMARKS.md "ComfyUI mixed precision
# and LightX2V outputs"): `merge --to <format>` of the f32 base and the rank-64 LoRA, input
# hashes cached, each row followed by the durable-write floor of its output's size; the bf16
# merge as the peer of the same run; then comfy-kitchen's own quantizer on the same f32 weights
# (bench/comfy_out_peer.py). Inputs: bench/assets.sh's /tmp/wb.
source "$(dirname "$0")/common.sh"
cd /tmp/wb
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-41
$W -q merge --base base --adapter lora --out o --dtype bf16 --device cpu --overwrite; rm -rf o
for to in bf16 comfy:fp8 comfy:nvfp4 comfy:mxfp8 comfy:int8 comfy:int8-convrot lightx2v:int8 lightx2v:fp8; do
  case $to in bf16) args="--dtype bf16";; *) args="--to $to";; esac
  sync; t=$(T $W -q merge --base base --adapter lora --out o $args --device cpu --overwrite)
  bytes=$(du -sb --apparent-size o | cut -f1)
  echo "ROW merge $args | $t | $bytes | load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf o
  floor "$bytes"
done
for f in nvfp4 int8; do
  sync; echo "PEER comfy-kitchen $f | $(T $P $B/comfy_out_peer.py base/diffusion_pytorch_model.safetensors $f peer.safetensors) | $(du -sb peer.safetensors | cut -f1)"
  rm -f peer.safetensors
done
echo COMFY-OUT-DONE
