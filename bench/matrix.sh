# One read, many releases (BENCHMARKS.md, "Release matrix"): the six-output matrix of issue 43
# (diffusers bf16, fp8-scaled, gguf:q8_0, gguf:q4_k_m, comfy:nvfp4, orbax) baked by one recipe
# of six [[output]] tables, against the same six outputs baked one recipe each, in the same
# run, input hashes cached; each row with its wall, CPU and peak RSS, and the durable-write
# floor of the matrix's bytes bracketed before and after.
#
# Usage: bench/matrix.sh DIR BASE ADAPTER   (DIR is made if missing; BASE a diffusers folder)
source "$(dirname "$0")/common.sh"
mkdir -p "$1" && cd "$1"
base=$(realpath "$2"); lora=$(realpath "$3")
export WANBAKE_CACHE_DIR=$PWD/hcache
outputs=("bf16|dtype = \"bf16\"" "fp8|to = \"fp8-scaled\"" "q8_0|to = \"gguf:q8_0\""
         "q4_k_m|to = \"gguf:q4_k_m\"" "nvfp4|to = \"comfy:nvfp4\"" "orbax|to = \"orbax\"")
head="[base]
path = \"$base\"
[[adapter]]
path = \"$lora\""
matrix="$head"
for o in "${outputs[@]}"; do
  name=${o%%|*}; body=${o#*|}
  printf '%s\n[output]\ndir = "out/%s"\n%s\noverwrite = true\n' "$head" "$name" "$body" > "alone_$name.toml"
  matrix+=$'\n'"[[output]]"$'\n'"dir = \"out/$name\""$'\n'"$body"$'\n'"overwrite = true"
done
echo "$matrix" > matrix.toml
$W -q bake alone_bf16.toml; rm -rf out   # hashes cached, page cache warm for every row alike
planned=$($W bake matrix.toml --dry-run --json | $P -c 'import json,sys; print(sum(o["bytes"] for o in json.load(sys.stdin)["plan"]["outputs"]))')
floor "$planned"
for o in "${outputs[@]}"; do
  name=${o%%|*}
  sync; echo "ROW alone $name | $(T $W -q bake alone_$name.toml --device cpu) | $(du -sb --apparent-size out/$name | cut -f1)"
  rm -rf out
done
sync; echo "ROW matrix | $(T $W -q bake matrix.toml --device cpu) | $(du -sb --apparent-size out | cut -f1)"
bytes=$(du -sb --apparent-size out | cut -f1); rm -rf out
floor "$bytes"
echo MATRIX-DONE
