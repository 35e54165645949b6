#!/bin/bash
# Session 12's third device call: service.cu on the paths a user gets without the README's flags (one
# shard with a block of 256: one warp serves, seven idle; 8 shards with the default block of 32: one warp
# serves every shard), then where the 64-client rows stop scaling (16-64 clients on the machine's 16
# CPUs; the clients spinning 0 and 5 µs before they yield (MESH_SPIN_US) instead of 20; the fan-in's host
# side alone, no GPU, with as many senders).
set -u
R=${OUT:-/tmp/out}; L=/tmp/logs; rm -rf $L; mkdir -p $L $R
cd .gpu/next
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$PWD/programs PATH=$PWD/bin:$PATH
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
S=$L/summary.txt
T0=$(date +%s)
step() {
    local name=$1 limit=$2; shift 2
    local t=$(date +%s) left=$(( 400 - $(date +%s) + T0 ))
    if [ $left -lt 15 ]; then echo "$name skipped: no time left" >> $S; return; fi
    [ $limit -gt $left ] && limit=$left
    timeout -k 5 "$limit" "$@" > "$L/$name.txt" 2>&1
    local rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t ))s $(grep -E '^test result' "$L/$name.txt" | tail -1)" >> $S
    pkill -x meshd; sleep 1
}
for p in service service_x_serial; do timeout 60 $NVCC -ptx -arch=compute_80 -I programs -o programs/$p.ptx programs/$p.cu; done
nproc >> $S
MESH_SERVICE_SHARDS=1 MESH_SERVICE_SECS=8 step test-service-1shard-b256 60 bin/test-service --test-threads=1 --nocapture service_64
MESH_SERVICE_BLOCK=32 MESH_SERVICE_SECS=8 step test-service-8shards-b32 60 bin/test-service --test-threads=1 --nocapture service_64
MESH_SERVICE_CLIENTS="8 16 24 32 48 64" step bench-service-sweep 90 bin/mesh-gpu-bench service blink
MESH_SPIN_US=0 MESH_SERVICE_CLIENTS="1 16 64" MESH_SERVICE_PROGRAMS="service service_x_serial" step bench-service-spin0 60 bin/mesh-gpu-bench service blink
MESH_SPIN_US=5 MESH_SERVICE_CLIENTS="1 16 64" MESH_SERVICE_PROGRAMS="service service_x_serial" step bench-service-spin5 60 bin/mesh-gpu-bench service blink
MESH_FANIN_SENDERS="8 16 32 64" step fanin-host 45 bin/mesh-gpu-bench fanin-host
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/test-service-*.txt; do grep -hE "^\| [0-9]|longest wait|panicked|test result" "$f" | head -8; done
grep -h "^|" $L/bench-*.txt $L/fanin-host.txt | head -60
tar -czf $R/logs.tgz -C /tmp logs
