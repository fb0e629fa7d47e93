# One benchmark run (BENCHMARKS.md): floors, wanbake, peers, in this order.
source "$(dirname "$0")/common.sh"
cd /tmp/wb
warm() { cat base/*.safetensors lora/*.safetensors lokr/*.safetensors > /dev/null; sync; }
write_bake_recipe
nproc; uname -r
warm; row "dd floor 2.85 GB" dd if=/dev/zero of=ddfloor bs=16M count=170 conv=fsync; rm -f ddfloor
warm; export $(fresh lora); row "merge lora bf16 (hash cache cold)" $W -q merge --base base --adapter lora --out out-lora --dtype bf16 --device cpu --overwrite
row "bake nnx-scanned (base hash cached)" $W -q bake bake.toml --device cpu
sha256sum out-lora/*.safetensors; rm -rf bake-out
warm; row "peer lora (diffusers+PEFT)" $P $B/peer.py base lora peer-lora
$P $B/compare_bf16.py out-lora peer-lora; rm -rf peer-lora out-lora
warm; export $(fresh lokr); row "merge lokr bf16 (hash cache cold)" $W -q merge --base base --adapter lokr --out out-lokr --dtype bf16 --device cpu --overwrite
warm; row "peer lokr (diffusers+PEFT)" $P $B/peer.py base lokr peer-lokr
$P $B/compare_bf16.py out-lokr peer-lokr; $W inspect out-lokr 2>&1 | head -5; rm -rf peer-lokr out-lokr
warm; row "dd floor 1.42 GB" dd if=/dev/zero of=ddfloor bs=16M count=85 conv=fsync; rm -f ddfloor
warm; export $(fresh fp8); row "merge --to fp8-scaled" $W -q merge --base base --adapter lora --out m_fp8 --to fp8-scaled --device cpu --overwrite
ls -l m_fp8; $P $B/quant_summary.py m_fp8/wanbake.manifest.json; rm -rf m_fp8
warm; row "dd floor 1.54 GB" dd if=/dev/zero of=ddfloor bs=16M count=92 conv=fsync; rm -f ddfloor
warm; export $(fresh q8); row "merge --to gguf:q8_0" $W -q merge --base base --adapter lora --out m_q8 --to gguf:q8_0 --device cpu --overwrite
ls -l m_q8; $P $B/quant_summary.py m_q8/wanbake.manifest.json; rm -rf m_q8
warm; export $(fresh cq8); row "convert --to gguf:q8_0" $W -q convert base --to gguf:q8_0 --out c_q8 --overwrite
ls -l c_q8; rm -rf c_q8
cat tuned/*.safetensors > /dev/null
export $(fresh ex); row "extract --rank 64" bash -c "$W -q extract --base base --tuned tuned --rank 64 --out ex_r64 --overwrite --json > ex_r64.json"
du -sh ex_r64; $P -c "import json; m=json.load(open('ex_r64.json'))['modules']; r=[x for x in m if x.get('rank')]; print(len(m), 'entries', len(r), 'ranked; worst rel_error', max(x['rel_error'] for x in r))"
row "extract --budget 100MB" $W -q extract --base base --tuned tuned --budget 100MB --out ex_b --overwrite
du -sh ex_b
row "extract --energy 0.99" timeout 1200 $W -q extract --base base --tuned tuned --energy 0.99 --out ex_e --overwrite
du -sh ex_e; rm -rf ex_r64 ex_b ex_e
echo RUN-DONE
