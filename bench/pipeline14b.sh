# The 14B-shaped merge of BENCHMARKS.md ("At 14B scale"): a zero-filled sparse bf16 base
# (`synth --model wan2.1-t2v-14b --dtype bf16 --fill zero --skeleton --out /tmp/wb14/base`), a
# rank-16 PEFT LoRA on all 400 block Linears (`make_lora.py /tmp/wb14/lora 16 5120 13824 40`),
# bf16 out (28.6 GB), next to the durable-write floor. $BEFORE: an older binary (optional).
source "$(dirname "$0")/common.sh"
cd /tmp/wb14
fresh() { rm -rf /tmp/wb14/hcache-$1; echo "WANBAKE_CACHE_DIR=/tmp/wb14/hcache-$1"; }
sync; row "dd floor 28.6 GB" dd if=/dev/zero of=ddfloor bs=16M count=1704 conv=fsync; rm -f ddfloor
sync; export $(fresh now); row "merge 14B bf16 (hash cache cold)" $W -q merge --base base --adapter lora --out out --dtype bf16 --device cpu --overwrite
rm -rf out
if [ -n "$BEFORE" ]; then
  sync; export $(fresh old); row "merge 14B bf16, before" $BEFORE -q merge --base base --adapter lora --out out-old --dtype bf16 --device cpu --overwrite
  rm -rf out-old
fi
echo PIPELINE14B-DONE
