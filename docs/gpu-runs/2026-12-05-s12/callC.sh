#!/bin/bash
# Session 12's second device call: the header's new service loop (service.cu: every warp of a block of
# 256 serving its part of 8 shards, mesh_fanin_open_part / mesh_group_open_part) in the service bench,
# then every GPU test on the final tree (./run tests: the service test now runs service.cu with 8 shards
# and a block of 256), then the MPS rows and the host round trip if time is left. From the repository
# root, after `cargo xtask gpu-test --bundle .gpu/next` (carry `.gpu`): `bash docs/gpu-runs/next/call-c.sh`.
set -u
R=${OUT:-/tmp/out}; L=/tmp/logs; rm -rf $L; mkdir -p $L/nvcc $R
cd .gpu/next
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$PWD/programs PATH=$PWD/bin:$PATH
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
S=$L/summary.txt
T0=$(date +%s)
step() {  # step NAME LIMIT CMD...: runs CMD under timeout, its output to $L/NAME.txt, a line in the summary
    local name=$1 limit=$2; shift 2
    local t=$(date +%s) left=$(( 560 - $(date +%s) + T0 ))
    if [ $left -lt 15 ]; then echo "$name skipped: no time left" >> $S; return; fi
    [ $limit -gt $left ] && limit=$left
    timeout -k 5 "$limit" "$@" > "$L/$name.txt" 2>&1
    local rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t ))s $(grep -E '^test result' "$L/$name.txt" | tail -1)" >> $S
    pkill -x meshd; sleep 1
}
ls programs/*.cu | xargs -P 16 -I{} bash -c 'cu={}; n=$(basename ${cu%.cu}); timeout 120 '"$NVCC"' -ptx -arch=compute_80 -I programs -o ${cu%.cu}.ptx $cu > '"$L"'/nvcc/$n.log 2>&1 || echo "nvcc FAILED $n" >> '"$S"
for p in service service_x_serial bulk_parts_source bulk_parts_sink; do
    echo "$p: $(timeout 60 $NVCC -cubin -arch=sm_90 -Xptxas -v -I programs -o /tmp/$p.cubin programs/$p.cu 2>&1 | grep -o 'Used.*')" >> $S
done
echo "nvcc $(( $(date +%s) - T0 ))s" >> $S
MESH_SERVICE_CLIENTS="1 8 16 64" step bench-service-blink 70 bin/mesh-gpu-bench service blink
OUT=$L/run-tests step run-tests 380 ./run tests
MESH_SERVICE_CLIENTS="1 8 16 64" MESH_SERVICE_PROGRAMS=service step bench-service-mps 60 bin/mesh-gpu-bench service mps
timeout 60 $NVCC -O3 -arch=sm_90 -std=c++17 -o bin/ll_roundtrip probes/ll_roundtrip.cu > $L/nvcc-probe.log 2>&1
step rt-probe 30 bin/ll_roundtrip
step rt-blink 60 bin/mesh-gpu-bench rt blink
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep -hE "^\| [0-9]|longest wait|panicked|FAILED|failed" $L/run-tests.txt | head -20
tail -25 $L/run-tests.txt
grep -h "^|" $L/bench-*.txt $L/rt-*.txt | head -60
mkdir -p $L/ptx && cp programs/*.ptx $L/ptx/
tar -czf $R/logs.tgz -C /tmp logs
