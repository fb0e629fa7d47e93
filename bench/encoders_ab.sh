# Every quantized output of `merge --to` on the 1.3B bench, before and after a change to the
# encoders (issue 42), the two binaries run back to back per format so that both see the same
# minute of this shared VM; the bf16 merge as the peer, each format's rows followed by the
# durable-write floor of its output. Outputs of the two binaries are compared with `cmp`
# (every file but the manifest, whose report's rms digits may move). Inputs: bench/assets.sh's
# /tmp/wb. Usage: BEFORE=/tmp/wb/wanbake-old WANBAKE=target/release/wanbake bash bench/encoders_ab.sh [formats]
source "$(dirname "$0")/common.sh"
A=${BEFORE:?set BEFORE to the binary before the change}
cd /tmp/wb
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-41
$W -q merge --base base --adapter lora --out o --dtype bf16 --device cpu --overwrite; rm -rf o
formats=${*:-bf16 fp8-scaled comfy:fp8 comfy:nvfp4 comfy:mxfp8 comfy:int8 lightx2v:int8 lightx2v:fp8 gguf:q8_0 gguf:q4_0 gguf:q5_0 gguf:q4_k_m}
for to in $formats; do
  case $to in bf16) args="--dtype bf16";; *) args="--to $to";; esac
  for who in before after; do
    bin=$W; [ $who = before ] && bin=$A
    sync; t=$(T $bin -q merge --base base --adapter lora --out o-$who $args --device cpu --overwrite)
    echo "ROW $to $who | $t | $(du -sb --apparent-size o-$who | cut -f1) | load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
  for f in $(cd o-after && ls | grep -v manifest); do cmp -s o-before/$f o-after/$f && echo "SAME $to $f" || echo "DIFF $to $f"; done
  bytes=$(du -sb --apparent-size o-after | cut -f1)
  rm -rf o-before o-after
  floor "$bytes"
done
echo ENCODERS-AB-DONE
