# Every encoding and layout, merge and convert, on a real-shaped model, to completion and
# verified (BENCHMARKS.md, "Every encoding and layout at real size"). Each row is followed by
# the durable-write floor of its own output size, so every row sits between two floors (this
# VM's disk speed drifts): the floor before a row is the one after the row above it.
#
# Usage: bench/encodings.sh DIR [ROWS]   DIR holds base/ and lora/:
#   1.3B: bench/assets.sh's /tmp/wb (f32 base, rank-64 LoRA)
#   14B:  /tmp/wb14 of bench/pipeline14b.sh (sparse bf16 skeleton, rank-16 LoRA)
# ROWS: a regex of row names to run (default: all). Prints one line per row:
#   ROW name | wall user sys peak-KiB | output bytes | verify result | load average
# and one per floor: FLOOR bytes | wall.
source "$(dirname "$0")/common.sh"
cd "$1"
only=${2:-.}
run() {  # name out command...
  local name=$1 out=$2; shift 2
  [[ $name =~ $only ]] || return 0
  rm -rf "$out"; sync; export $(fresh enc)
  local t; t=$(T "$@")
  local bytes; bytes=$(du -sb --apparent-size "$out" | cut -f1)
  local v; v=$($W -q verify "$out" 2>&1 && echo verified || echo "VERIFY FAILED")
  echo "ROW $name | $t | $bytes | $(echo $v) | load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$out"
  floor "$bytes"
}
floor 1073741824
m() { echo "$W -q merge --base base --adapter lora --device cpu --out"; }
for d in bf16 f16 f32; do
  run "merge --dtype $d" o $(m) o --dtype $d
  run "convert --dtype $d" o $W -q convert base --dtype $d --out o
done
for l in diffusers wan nnx nnx-scanned; do
  run "merge --dtype bf16 --layout $l" o $(m) o --dtype bf16 --layout $l
  [ $l = diffusers ] || run "restack --to $l --dtype bf16" o $W -q restack base --to $l --dtype bf16 --out o
done
for q in fp8-scaled gguf:q8_0 gguf:q4_0 gguf:q5_0 gguf:bf16 gguf:f16; do
  run "merge --to $q" o $(m) o --to $q
  run "convert --to $q" o $W -q convert base --to $q --out o
done
echo ENCODINGS-DONE
