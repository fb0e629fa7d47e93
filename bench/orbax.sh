# Issue 29's rows: the 1.3B merge to MaxDiffusion's Orbax cache (--to orbax: nnx-scanned,
# bf16 with MaxDiffusion's f32 leaves, zstd chunks) against the bf16 nnx-scanned safetensors
# merge and a durable-write floor, in rounds (bench/assets.sh: /tmp/wb/base, /tmp/wb/lora).
source "$(dirname "$0")/common.sh"
q() { du -sb "$1" | cut -f1; find "$1" -type f | wc -l; rm -rf "$1"; sync; }
cd /tmp/wb
warm() { cat base/*.safetensors lora/*.safetensors > /dev/null; sync; }
for round in 1 2; do
  echo "# 1.3B round $round"
  warm; row "dd floor 2.85 GB" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
  warm; export $(fresh ob$round); row "merge --dtype bf16 --layout nnx-scanned" $W -q merge --base base --adapter lora --dtype bf16 --layout nnx-scanned --out o-bf16 --device cpu --overwrite; q o-bf16
  warm; export $(fresh oo$round); row "merge --to orbax" $W -q merge --base base --adapter lora --to orbax --out o-orbax --device cpu --overwrite; q o-orbax
done
echo ORBAX-DONE
