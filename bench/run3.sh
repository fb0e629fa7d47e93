# Per-matrix extraction cost at 1.3B and 14B shapes (one Linear weight per pair).
source "$(dirname "$0")/common.sh"
cd /tmp/wb
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-run3
for s in "1536 1536" "8960 1536" "1536 8960" "5120 5120" "13824 5120" "5120 13824"; do
  set -- $s; d=pair_$1x$2; $P $B/make_pair.py $d $1 $2
  for t in 1 2; do
    row "extract --rank 64 $1x$2 --threads $t" $W -q --threads $t extract --base $d/base.safetensors --tuned $d/tuned.safetensors --rank 64 --out $d/o$t --overwrite
  done
  rm -rf $d
done
echo RUN3-DONE
