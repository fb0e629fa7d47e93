# The forward error of every output format (README, "Which format to ship"): `bake` of the 1.3B
# bench (f32 base, rank-64 LoRA) to each format with one `[[check]]` against `expected =
# "unmerged"` (the same LoRA merged in f32, never rounded), on one small input (latent
# [1,16,1,16,16], 32 text tokens). Inputs: bench/assets.sh's /tmp/wb; /tmp/fe/inputs.safetensors
# from numpy default_rng(3) (see BENCHMARKS.md). Run from /tmp/fe with bench/forward_error.toml
# copied there as r.toml.
for to in bf16 fp8-scaled gguf:q8_0 gguf:q4_k_m comfy:fp8 comfy:nvfp4 comfy:mxfp8 comfy:int8 comfy:int8-convrot lightx2v:int8 lightx2v:fp8; do
  if [ $to = bf16 ]; then sed 's/^to = "TO"/dtype = "bf16"/' r.toml > t.toml; else sed "s/TO/$to/" r.toml > t.toml; fi
  out=$(WANBAKE_CACHE_DIR=/tmp/wb/hcache-41 /tmp/wb/wanbake-41 bake t.toml --device cpu 2>/dev/null | grep -E "check vs|wrote")
  echo "FE $to | $out" | tr '\n' ' '; echo
  rm -rf /tmp/fe/out
done
echo FE-DONE
