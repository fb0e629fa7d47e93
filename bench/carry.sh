#!/bin/bash
# Carry step of a pipeline folder: a 2 GB random "text encoder" beside the golden tiny pipeline.
set -e
W=/work/main/target/release/wanbake; B=/tmp/wb/carry; rm -rf $B; mkdir -p $B
cp -r /work/main/golden/pipeline/wan_t2v $B/pipe
head -c 2000000000 /dev/urandom > $B/pipe/text_encoder/model.safetensors.big
floor() { dd if=/dev/zero of=$B/ddfloor bs=16M count=120 conv=fsync 2>&1 | tail -1; rm -f $B/ddfloor; }
echo "floor before: $(floor)"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
/usr/bin/time -f "link cold: %e s %M KiB" $W -q convert $B/pipe --dtype bf16 --out $B/o1
/usr/bin/time -f "link warm (hash cache): %e s %M KiB" $W -q convert $B/pipe --dtype bf16 --out $B/o2
mkdir -p /dev/shm/wbcarry; rm -rf /dev/shm/wbcarry/*
/usr/bin/time -f "copy (output on /dev/shm, another file system): %e s %M KiB" $W -q convert $B/pipe --dtype bf16 --out /dev/shm/wbcarry/o3 || true
rm -rf /dev/shm/wbcarry
/usr/bin/time -f "peer cp+sync: %e s %M KiB" sh -c "cp $B/pipe/text_encoder/model.safetensors.big $B/peer && sync"
/usr/bin/time -f "peer sha256sum: %e s %M KiB" sha256sum $B/pipe/text_encoder/model.safetensors.big >/dev/null
echo "floor after: $(floor)"
stat -c '%h links %n' $B/o1/text_encoder/model.safetensors.big
rm -rf $B
