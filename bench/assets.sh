# Makes the benchmark inputs in /tmp/wb (about 11.4 GB): the 1.3B-shaped f32 base, the LoRA,
# the LoKr folder and the fine-tune for extract. Run from the repository root after
# `cargo build --release && mkdir -p /tmp/wb && cp target/release/wanbake /tmp/wb/`.
set -e
B=$(cd "$(dirname "$0")" && pwd)
cd /tmp/wb
P=${PYTHON:-python3}  # with torch 2.15.0, diffusers 0.36.0, peft 0.21.2, numpy, safetensors
/tmp/wb/wanbake synth --model wan2.1-t2v-1.3b --out /tmp/wb/base --fill random --seed 7
$P $B/make_lora.py /tmp/wb/lora
$P $B/make_lokr.py /tmp/wb/lokr
$P $B/make_tuned.py /tmp/wb/base /tmp/wb/tuned
ls -la base lora lokr tuned
echo ASSETS-DONE
