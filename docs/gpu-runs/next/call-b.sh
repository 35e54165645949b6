#!/bin/bash
# The next session's second device call (PENDING.md rows 4-5, about 8 minutes): the host round trip of the
# header's loop (echo_header gained a size check and a heartbeat in session 10) beside the raw word and
# the LL probe, then every GPU test on the final tree. From the repository root, after the bundle's
# build (carry `.gpu`): `bash docs/gpu-runs/next/call-b.sh`.
set -u
R=${OUT:-/tmp/out}; L=/tmp/logs; rm -rf $L; mkdir -p $L $R
cd .gpu/next
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$PWD/programs PATH=$PWD/bin:$PATH
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
T0=$(date +%s)
ls programs/*.cu | xargs -P 16 -I{} bash -c 'cu={}; timeout 120 '"$NVCC"' -ptx -arch=compute_80 -I programs -o ${cu%.cu}.ptx $cu >/dev/null 2>&1 || echo "nvcc FAILED $cu"' > $L/summary.txt
timeout 180 $NVCC -O3 -arch=sm_90 -std=c++17 -o bin/ll_roundtrip probes/ll_roundtrip.cu > $L/nvcc-probe.log 2>&1
{ timeout -k 5 120 bin/ll_roundtrip; timeout -k 10 90 bin/mesh-gpu-bench rt blink; echo "rt blink rc=$?"; } > $L/rt-blink.txt 2>&1
pkill -x meshd; sleep 1
echo "rt $(( $(date +%s) - T0 ))s" >> $L/summary.txt
T=$(date +%s)
OUT=$L/run-tests timeout -k 10 $(( 570 - $(date +%s) + T0 )) ./run tests > $L/run-tests.txt 2>&1
echo "run tests rc=$? $(( $(date +%s) - T ))s" >> $L/summary.txt
pkill -x meshd
cat $L/summary.txt; grep -E "^\||median" $L/rt-blink.txt | head -20; tail -40 $L/run-tests.txt
# The PTX nvcc made here from the final sources, for the next session to commit beside them (the
# committed service.ptx, echo_header.ptx, ... predate session 10's header; the README loads them).
mkdir -p $L/ptx && cp programs/*.ptx $L/ptx/
tar -czf $R/logs.tgz -C /tmp logs
