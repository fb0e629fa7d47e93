# The pipeline rows of BENCHMARKS.md (issue 13): floor, merge, bake, restack, convert, peer, in
# one run, 1.3B-shaped (assets.sh: /tmp/wb/base, /tmp/wb/lora). $BEFORE is an older binary to
# compare with (optional).
source "$(dirname "$0")/common.sh"
cd /tmp/wb
warm() { cat base/*.safetensors lora/*.safetensors > /dev/null; sync; }
write_bake_recipe
nproc; uname -r
for round in 1 2; do
  echo "# round $round"
  warm; row "dd floor 2.85 GB" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
  warm; export $(fresh m$round); row "merge lora bf16 (hash cache cold)" $W -q merge --base base --adapter lora --out out-lora --dtype bf16 --device cpu --overwrite
  row "bake nnx-scanned (base hash cached)" $W -q bake bake.toml --device cpu
  sha256sum out-lora/*.safetensors; rm -rf bake-out out-lora
  if [ -n "$BEFORE" ]; then
    warm; export $(fresh b$round); row "merge lora bf16, before" $BEFORE -q merge --base base --adapter lora --out out-old --dtype bf16 --device cpu --overwrite
    rm -rf out-old
    warm; export $(fresh rb$round); row "restack nnx-scanned bf16, before" $BEFORE -q restack base --to nnx-scanned --dtype bf16 --out rs-old --overwrite
    sha256sum rs-old/*.safetensors; rm -rf rs-old
  fi
  warm; export $(fresh r$round); row "restack nnx-scanned bf16" $W -q restack base --to nnx-scanned --dtype bf16 --out rs --overwrite
  sha256sum rs/*.safetensors; rm -rf rs
  warm; export $(fresh c$round); row "convert bf16" $W -q convert base --dtype bf16 --out cv --overwrite
  rm -rf cv
done
warm; row "peer lora (diffusers+PEFT)" $P $B/peer.py base lora peer-lora
rm -rf peer-lora
echo PIPELINE-DONE
