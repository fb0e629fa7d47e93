# `convert --to` of every ComfyUI mixed-precision and LightX2V format at 14B shapes (BENCHMARKS.md,
# "convert --to at 14B shapes", issue 41): a WAN2.1-T2V-14B-shaped bf16 base of seeded random
# values with 8 of the 40 blocks (every tensor at its 14B size; random, since NVFP4 and comfy fp8
# refuse an all-zero weight as comfy-kitchen does; 8 blocks, as the f32 scratch of a 40-block
# random base does not fit this disk next to its outputs), each row followed by the
# durable-write floor of its output's size; the peer is `merge --dtype bf16` of the same base
# with a rank-16 LoRA on its 80 block Linears, in the same run.
#
# Usage: bench/convert14b.sh DIR [FORMAT...]   (DIR is made if missing)
source "$(dirname "$0")/common.sh"
mkdir -p "$1" && cd "$1" && shift
[ -d base ] || $W -q synth --model wan2.1-t2v-14b --layers 8 --dtype bf16 --seed 7 --out base
[ -d lora ] || $P "$B/make_lora.py" lora 16 5120 13824 8
export WANBAKE_CACHE_DIR=$PWD/hcache
$W -q merge --base base --adapter lora --out o --dtype bf16 --device cpu --overwrite; rm -rf o
sync; t=$(T $W -q merge --base base --adapter lora --out o --dtype bf16 --device cpu --overwrite)
echo "ROW merge --dtype bf16 (peer) | $t | $(du -sb --apparent-size o | cut -f1)"; rm -rf o
formats=${*:-comfy:fp8 comfy:nvfp4 comfy:mxfp8 comfy:int8 comfy:int8-convrot lightx2v:int8 lightx2v:fp8}
for to in $formats; do
  sync; t=$(T $W -q convert base --to $to --out o --overwrite)
  bytes=$(du -sb --apparent-size o | cut -f1)
  echo "ROW convert --to $to | $t | $bytes"
  rm -rf o
  floor "$bytes"
done
echo CONVERT14B-DONE
