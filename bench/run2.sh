# Second run (BENCHMARKS.md, Extract and LoKr rows) (after the extract fixes: pages released, budget in two passes).
source "$(dirname "$0")/common.sh"
cd /tmp/wb
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-run2
cat base/*.safetensors tuned/*.safetensors > /dev/null
row "extract --rank 64" bash -c "$W -q extract --base base --tuned tuned --rank 64 --out ex_r64 --overwrite --json > ex_r64.json"
du -sh ex_r64; $P -c "import json; m=json.load(open('ex_r64.json'))['modules']; r=[x for x in m if x.get('rank')]; print(len(m), 'entries', len(r), 'ranked; rel_error', min(x['rel_error'] for x in r), '-', max(x['rel_error'] for x in r))"
row "extract --energy 0.9" bash -c "$W -q extract --base base --tuned tuned --energy 0.9 --out ex_e --overwrite --json > ex_e.json"
du -sh ex_e; $P -c "import json; m=json.load(open('ex_e.json'))['modules']; r=[x['rank'] for x in m if x.get('rank')]; print('ranks', min(r), '-', max(r))"
row "extract --budget 100MB" bash -c "$W -q extract --base base --tuned tuned --budget 100MB --out ex_b --overwrite --json > ex_b.json"
du -sh ex_b; $P -c "import json; m=json.load(open('ex_b.json'))['modules']; r=[x['rank'] for x in m if x.get('rank')]; print('ranks', min(r), '-', max(r), 'sum', sum(r))"
rm -rf ex_r64 ex_e ex_b
export WANBAKE_CACHE_DIR=/tmp/wb/hcache-lokr2
cat base/*.safetensors lokr/*.safetensors > /dev/null
row "merge lokr bf16" $W -q merge --base base --adapter lokr --out out-lokr --dtype bf16 --device cpu --overwrite
row "peer lokr" $P $B/peer.py base lokr peer-lokr
$P $B/compare_bf16.py out-lokr peer-lokr
rm -rf out-lokr peer-lokr
echo RUN2-DONE
