#!/bin/bash
# The device check of BENCHMARKS.md "Device run of 2026-11-27": the GPU tests, the golden merges
# on every route, and the SA3-small -xs merge through a shared SVD cache on cpu and cuda.
# Run from the repository root on the device, with $OUT a folder for the logs and
# target/devbin.tgz holding the stripped `wanbake` binary, the test executables of
# `cargo test --release --no-run --test gpu --test merge --test extract --lib` and the SA3 -xs
# adapter of the SVD cache section (sa3_xs.safetensors), built on the development machine.
set -u
R=$PWD
exec > >(tee -a "$OUT/run.log") 2>&1
date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; nproc
mkdir -p B && tar xzf target/devbin.tgz -C B
mkdir -p target/release && cp B/wanbake target/release/wanbake
# The test executables find golden/ and the binary under the build machine's checkout path
# (their CARGO_MANIFEST_DIR, /work/main here): link it to this checkout.
mkdir -p /work && ln -sfn "$R" /work/main && ls -la /work/main/target/release/wanbake
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d $d ] && export LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}; done
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ls $(echo $LD_LIBRARY_PATH | cut -d: -f1) | grep -E "^lib(cublas|cusolver|nvrtc)\.so" 
G=$(ls B/gpu-*); M=$(ls B/merge-*); L=$(ls B/wanbake-*); E=$(ls B/extract-*); W=target/release/wanbake
step() { local n=$1; shift; local s=$SECONDS; timeout 200 "$@" > "$OUT/$n.log" 2>&1; local rc=$?; echo "== $n rc=$rc $((SECONDS-s))s"; tail -3 "$OUT/$n.log"; }
step gpu-tests $G --nocapture
echo "skipping the CUDA variant: $(grep -c 'skipping the CUDA variant' $OUT/gpu-tests.log)"
step merge-tests $M --nocapture
grep "cuda vs cpu" $OUT/merge-tests.log | sort | uniq -c | head -30; echo "no CUDA route: $(grep -c 'no CUDA route' $OUT/merge-tests.log)"
# -xs end to end through a shared cache
X=/tmp/wb; mkdir -p $X/cache
TM=""; [ -x /usr/bin/time ] && TM="/usr/bin/time -f %e_s_%M_KiB"
$W -q synth --model sa3-small --out $X/sa3base; sha256sum $X/sa3base/model.safetensors
for run in "cpu none" "cuda none" "cuda fill" "cpu read" "cuda read"; do
  set -- $run; c=""; [ $2 != none ] && c="--svd-cache $X/cache"
  s=$SECONDS; $TM $W merge --base $X/sa3base --adapter B/sa3_xs.safetensors --dtype bf16 --out $X/xs-$1-$2 --overwrite --device $1 $c --json > $OUT/xs-$1-$2.json 2> $OUT/xs-$1-$2.err
  echo "== xs $1 $2 rc=$? $((SECONDS-s))s $(tail -1 $OUT/xs-$1-$2.err)"; grep -oE '"(hits|misses|computed|engine|used)": *[^,}]*' $OUT/xs-$1-$2.json | tr '\n' ' '; echo
done
sha256sum $X/xs-*/*.safetensors
step svd-bases env WANBAKE_GPU_SVD_SHAPES=1536x1536,5120x5120,13824x5120 WANBAKE_GPU_SVD_CPU_THREADS=16 $G --ignored --nocapture --test-threads 1 acceptance_svd_bases
cat $OUT/svd-bases.log | grep "^|"
step lib-tests $L --nocapture gpu:: merge::device
step extract-tests $E --nocapture
step extract-svd $G --ignored --nocapture --test-threads 1 acceptance_extract_svd
grep "^|" $OUT/extract-svd.log
date -u
