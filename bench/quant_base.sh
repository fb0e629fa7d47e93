# Quantized bases merged back to bf16 (BENCHMARKS.md, "Quantized bases"): the base converted
# to fp8-scaled and gguf:q4_k_m first (not timed), then `merge --base <quantized> --dtype bf16`
# with the LoRA, each row bracketed by the durable-write floor of its output size, and the
# same merge from the float base as the peer of the same run.
#
# Usage: bench/quant_base.sh DIR   DIR holds base/ and lora/ (bench/assets.sh's /tmp/wb, or a
# 14B-shaped skeleton: `synth --model wan2.1-t2v-14b --layers 10 --fill random --out DIR/base`
# and `make_lora.py DIR/lora 16 5120 13824 10`). $TMPDIR must hold the decoded f32 base.
source "$(dirname "$0")/common.sh"
cd "$1"
[ -d q-fp8 ] || $W -q convert base --to fp8-scaled --out q-fp8
[ -d q-q4km ] || $W -q convert base --to gguf:q4_k_m --out q-q4km
for b in base q-fp8/model_fp8_scaled.safetensors q-q4km/model-q4_k_m.gguf; do
  rm -rf o; sync; export $(fresh qb)
  t=$(T $W -q merge --base $b --adapter lora --dtype bf16 --device cpu --out o)
  bytes=$(du -sb --apparent-size o | cut -f1)
  echo "ROW merge --base $b --dtype bf16 | $t | $bytes | load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf o
  floor "$bytes"
done
echo QUANT-BASE-DONE
