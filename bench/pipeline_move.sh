# Issue 28's re-measure: the 1.3B merge and bake rows with the binary before the pipeline
# left merge/ ($BEFORE) and after ($WANBAKE), in the same rounds, each round between two
# durable-write floors of the output's size; then the diffusers + PEFT peer. $BAND4M (optional)
# is $BEFORE rebuilt with 4 MiB merge bands (BAND_ELEMS = 1 <<20), for the band-size row.
# Inputs: bench/assets.sh (/tmp/wb/base, /tmp/wb/lora).
source "$(dirname "$0")/common.sh"
cd /tmp/wb; write_bake_recipe
warm() { cat base/*.safetensors lora/*.safetensors > /dev/null; sync; }
merge() { warm; export $(fresh "$1"); row "merge $2 (hash cache cold)" "$3" -q merge --base base --adapter lora --out out-lora --dtype bf16 --device cpu --overwrite; sha256sum out-lora/*.safetensors; rm -rf out-lora; sync; }
bake() { row "bake nnx-scanned $1 (base hash cached)" "$2" -q bake bake.toml --device cpu; sha256sum bake-out/*.safetensors; rm -rf bake-out; sync; }
nproc; uname -r
for round in 1 2 3; do
  echo "# round $round"
  warm; row "dd floor 2.85 GB" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
  merge "b$round" before "$BEFORE"; bake before "$BEFORE"
  merge "a$round" after "$W"; bake after "$W"
  if [ -n "$BAND4M" ]; then merge "x$round" "4 MiB bands" "$BAND4M"; fi
  row "dd floor 2.85 GB (after)" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
done
warm; row "peer lora (diffusers+PEFT)" $P $B/peer.py base lora peer-lora
rm -rf peer-lora
echo MOVE-DONE
