# The floor measured right before and right after each measured command, because this VM's
# disk speed drifts between runs (BENCHMARKS.md, Pipeline, "Floor bracketed"): three 1.3B
# rounds (merge with the hash cache cold, then bake with the base hash cached) and two 14B
# merges. Inputs: bench/assets.sh (/tmp/wb) and pipeline14b.sh's header (/tmp/wb14).
source "$(dirname "$0")/common.sh"
cd /tmp/wb; write_bake_recipe
warm() { cat base/*.safetensors lora/*.safetensors > /dev/null; sync; }
for round in 1 2 3; do
  echo "# 1.3B round $round"
  warm; row "dd floor 2.85 GB" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
  warm; export $(fresh m$round); row "merge (hash cache cold)" $W -q merge --base base --adapter lora --out out-lora --dtype bf16 --device cpu --overwrite
  row "bake nnx-scanned (base hash cached)" $W -q bake bake.toml --device cpu
  rm -rf out-lora bake-out; sync
  row "dd floor 2.85 GB (after)" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
done
cd /tmp/wb14
for round in 1 2; do
  echo "# 14B round $round"
  sync; row "dd floor 28.6 GB" dd if=/dev/zero of=ddfloor bs=16M count=1704 conv=fsync; rm -f ddfloor
  sync; rm -rf /tmp/wb14/hc-b$round; export WANBAKE_CACHE_DIR=/tmp/wb14/hc-b$round
  row "merge 14B (hash cache cold)" $W -q merge --base base --adapter lora --out out --dtype bf16 --device cpu --overwrite
  rm -rf out; sync
  row "dd floor 28.6 GB (after)" dd if=/dev/zero of=ddfloor bs=16M count=1704 conv=fsync; rm -f ddfloor
done
echo BRACKET-DONE
