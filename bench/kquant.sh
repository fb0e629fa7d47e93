# Issue 30's rows: the 1.3B merge to a K-quant mix against the bf16 merge and the floor, in
# rounds between two durable-write floors (bench/assets.sh: /tmp/wb/base, /tmp/wb/lora).
# With WB14=1 also the 14B skeleton (pipeline14b.sh's header: /tmp/wb14/base, /tmp/wb14/lora).
source "$(dirname "$0")/common.sh"
q() { sha256sum "$1"/*.gguf "$1"/*.safetensors 2>/dev/null | cut -c1-16; du -b "$1" | cut -f1; rm -rf "$1"; sync; }
cd /tmp/wb
warm() { cat base/*.safetensors lora/*.safetensors > /dev/null; sync; }
for round in 1 2; do
  echo "# 1.3B round $round"
  warm; row "dd floor 2.85 GB" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
  warm; export $(fresh kb$round); row "merge --dtype bf16" $W -q merge --base base --adapter lora --dtype bf16 --out o-bf16 --device cpu --overwrite; q o-bf16
  warm; export $(fresh kq$round); row "merge --to gguf:q4_k_m" $W -q merge --base base --adapter lora --to gguf:q4_k_m --out o-q4km --device cpu --overwrite; q o-q4km
  warm; export $(fresh kc$round); row "merge --to gguf:q8_0" $W -q merge --base base --adapter lora --to gguf:q8_0 --out o-q8 --device cpu --overwrite; q o-q8
  warm; export $(fresh ks$round); row "merge --to gguf:q3_k_s" $W -q merge --base base --adapter lora --to gguf:q3_k_s --out o-q3ks --device cpu --overwrite; q o-q3ks
  row "dd floor 0.98 GB (q4_k_m's size)" dd if=/dev/zero of=ddfloor bs=16M count=59 conv=fsync; rm -f ddfloor
done
if [ -n "$WB14" ]; then
  cd /tmp/wb14
  sync; row "dd floor 28.6 GB" dd if=/dev/zero of=ddfloor bs=16M count=1704 conv=fsync; rm -f ddfloor
  export $(fresh k14b); row "14B merge --dtype bf16" $W -q merge --base base --adapter lora --dtype bf16 --out o-bf16 --device cpu --overwrite; q o-bf16
  export $(fresh k14q); row "14B merge --to gguf:q4_k_m" $W -q merge --base base --adapter lora --to gguf:q4_k_m --out o-q4km --device cpu --overwrite; q o-q4km
  sync; row "dd floor 10.1 GB (q4_k_m's size)" dd if=/dev/zero of=ddfloor bs=16M count=602 conv=fsync; rm -f ddfloor
fi
echo KQUANT-DONE
