# Issue 45: the cost of checking every value an output is written with (bench/nonfinite.sh).
# OLD and NEW are two wanbake binaries (commit 7730816, before the checks, and one with them);
# the inputs are those of bench/assets.sh in $D: the 1.3B-shaped f32 base (synth --fill
# random --seed 7) and the rank-64 PEFT LoRA (make_lora.py), plus a bf16 synth of the same
# shapes for the byte-for-byte copy path. Rounds alternate the binaries; each run's input
# hash comes from a warm per-binary cache, so the CPU counted is the run's own (BENCHMARKS.md,
# "Checking what an output holds").
set -e
# MERGE=0: the copy rows only.
D=${D:-/tmp/wbnf}; OLD=${OLD:-$D/wanbake-old}; NEW=${NEW:-$D/wanbake-new}; ROUNDS=${ROUNDS:-3}
T() { /usr/bin/time -f "%e s wall, %U user, %S sys, %M KiB peak" "$@" 2>&1 >/dev/null | tail -1; }
[ -d $D/base16 ] || $NEW -q synth --model wan2.1-t2v-1.3b --dtype bf16 --out $D/base16 --fill random --seed 7
for b in old new; do  # warm the input hash caches
  bin=$OLD; [ $b = new ] && bin=$NEW
  WANBAKE_CACHE_DIR=$D/hc-$b $bin -q convert $D/base16 --dtype bf16 --out $D/o-$b >/dev/null; rm -rf $D/o-$b
  WANBAKE_CACHE_DIR=$D/hc-$b $bin -q merge --base $D/base --adapter $D/lora --out $D/o-$b --dtype bf16 --device cpu; rm -rf $D/o-$b
done
for r in $(seq $ROUNDS); do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    cat $D/base/*.safetensors $D/lora/*.safetensors > /dev/null
    [ "${MERGE:-1}" = 0 ] || echo "merge bf16 $b round $r | load $(cut -d' ' -f1-3 /proc/loadavg) | $(WANBAKE_CACHE_DIR=$D/hc-$b T $bin -q merge --base $D/base --adapter $D/lora --out $D/o-$b --dtype bf16 --device cpu)"
    rm -rf $D/o-$b
    cat $D/base16/*.safetensors > /dev/null
    echo "convert bf16->bf16 $b round $r | load $(cut -d' ' -f1-3 /proc/loadavg) | $(WANBAKE_CACHE_DIR=$D/hc-$b T $bin -q convert $D/base16 --dtype bf16 --out $D/o-$b)"
    rm -rf $D/o-$b
  done
done
