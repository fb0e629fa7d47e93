# Shared by the benchmark scripts (sourced): binaries, the timer, row labels, a fresh hash
# cache per row, and the bake recipe of the Pipeline and Bake sections.
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=${WANBAKE:-/tmp/wb/wanbake}
P=${PYTHON:-python3}  # with torch 2.15.0, diffusers 0.36.0, peft 0.21.2, numpy, safetensors
T() { /usr/bin/time -f "%e s wall, %U user, %S sys, %M KiB peak" "$@" 2>&1 >/dev/null | tail -1; }
row() { echo "## $1 | load $(cut -d' ' -f1-3 /proc/loadavg)"; shift; T "$@"; }
fresh() { rm -rf /tmp/wb/hcache-$1; echo "WANBAKE_CACHE_DIR=/tmp/wb/hcache-$1"; }
write_bake_recipe() {
cat > /tmp/wb/bake.toml <<'TOML'
[base]
path = "/tmp/wb/base"
[[adapter]]
path = "/tmp/wb/lora"
strength = 1.0
[output]
dir = "/tmp/wb/bake-out"
dtype = "bf16"
layout = "nnx-scanned"
overwrite = true
TOML
}
# The durable-write floor of $1 bytes (rounded up to 16 MiB blocks), in the current folder.
floor() {
  local n=$(( ($1 + 16777215) / 16777216 ))
  sync; echo "FLOOR $(( n * 16777216 )) | $(T dd if=/dev/zero of=ddfloor bs=16M count=$n conv=fsync)"
  rm -f ddfloor
}
