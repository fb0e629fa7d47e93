# The fp8-scaled output before and after the branch-free encoder and the table decoder
# (issue 42; BENCHMARKS.md "fp8-scaled encoder"): the same 1.3B merge by two binaries in one
# run, the bf16 merge as the peer, each bracketed by the durable-write floor of its output.
# Usage: OLD=path NEW=path bench/fp8_encode.sh   (inputs: bench/assets.sh's /tmp/wb; input
# hashes cached, so the rows time the merge itself)
source "$(dirname "$0")/common.sh"
cd /tmp/wb
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-fp8
$NEW -q merge --base base --adapter lora --out o --dtype bf16 --device cpu --overwrite; rm -rf o
for round in 1 2; do
  sync; row "dd floor 1.43 GB" dd if=/dev/zero of=ddfloor bs=16M count=86 conv=fsync; rm -f ddfloor
  for bin in OLD NEW; do
    sync; row "$bin merge --to fp8-scaled" ${!bin} -q merge --base base --adapter lora --out o --to fp8-scaled --device cpu --overwrite
    rm -rf o
  done
  sync; row "NEW merge --dtype bf16 (peer)" $NEW -q merge --base base --adapter lora --out o --dtype bf16 --device cpu --overwrite
  rm -rf o
  sync; row "dd floor 1.43 GB (after)" dd if=/dev/zero of=ddfloor bs=16M count=86 conv=fsync; rm -f ddfloor
done
echo FP8-DONE
