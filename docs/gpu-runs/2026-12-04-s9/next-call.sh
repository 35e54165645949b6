#!/bin/bash
# Session 9 call 5 (last device seconds): the sharded peek with one scan and a shard's slots capped at max: 8 shards, test-service (short), bench 1 and 64 clients.
set -u
R=$OUT; L=/tmp/logs; mkdir -p $L/nvcc
cd .gpu/next
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$PWD/programs PATH=$PWD/bin:$PATH
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
START=$(date +%s)
ls programs/service*.cu programs/echo_warp.cu | xargs -P 16 -I{} bash -c 'cu={}; n=$(basename ${cu%.cu}); timeout 120 '"$NVCC"' -ptx -arch=compute_80 -I programs -o ${cu%.cu}.ptx $cu > '"$L"'/nvcc/$n.log 2>&1 || echo "FAILED $n" >> '"$L"'/summary.txt'
echo "nvcc $(( $(date +%s)-START ))s" >> $L/summary.txt
T=$(date +%s)
MESH_SERVICE_SHARDS=8 MESH_SERVICE_SECS=8 timeout -k 5 50 bin/test-service --test-threads=1 --nocapture > $L/test-service-8.log 2>&1; echo "test-service shards 8 rc=$? $(( $(date +%s)-T ))s $(grep '^test result' $L/test-service-8.log | tail -1)" >> $L/summary.txt
pkill -x meshd; sleep 1; T=$(date +%s)
MESH_SERVICE_SHARDS=8 MESH_SERVICE_CLIENTS="1 64" timeout -k 5 60 bin/mesh-gpu-bench service blink > $L/bench-service-8-blink.txt 2>&1; echo "bench rc=$? $(( $(date +%s)-T ))s" >> $L/summary.txt
pkill -x meshd
cat $L/summary.txt; grep -hE "^\| [0-9]|longest wait" $L/test-service-8.log | head -4; grep "^|" $L/bench-service-8-blink.txt
tar -czf $R/logs.tgz -C /tmp logs
