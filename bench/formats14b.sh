# Every quantized output of `merge` at the 14B skeleton (BENCHMARKS.md, "Quantized outputs per
# band"): a WAN2.1-T2V-14B-shaped bf16 base of zeros (sparse: 28.6 GB on no disk) and a rank-16
# LoRA on all 400 block Linears, merged to each format with input hashes cached, each row
# followed by the durable-write floor of its output's size; the bf16 merge is the peer of the
# same run.
#
# Usage: bench/formats14b.sh DIR [FORMAT...]   (DIR is made if missing; default formats below)
source "$(dirname "$0")/common.sh"
mkdir -p "$1" && cd "$1" && shift
[ -d base ] || $W -q synth --model wan2.1-t2v-14b --dtype bf16 --fill zero --out base
[ -d lora ] || $P "$B/make_lora.py" lora 16 5120 13824 40
export WANBAKE_CACHE_DIR=$PWD/hcache
$W -q merge --base base --adapter lora --out o --dtype bf16 --device cpu --overwrite; rm -rf o
formats=${*:-bf16 fp8-scaled comfy:fp8 comfy:nvfp4 comfy:mxfp8 comfy:int8 lightx2v:int8 lightx2v:fp8}
for to in $formats; do
  case $to in bf16) args="--dtype bf16";; *) args="--to $to";; esac
  sync; t=$(T $W -q merge --base base --adapter lora --out o $args --device cpu --overwrite)
  bytes=$(du -sb --apparent-size o | cut -f1)
  echo "ROW merge $args | $t | $bytes | load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf o
  floor "$bytes"
done
echo FORMATS14B-DONE
