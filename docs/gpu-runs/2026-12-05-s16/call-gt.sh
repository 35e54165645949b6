#!/bin/bash
# Calls G and T packed into one device call (session 15: starts were refused for an hour and device
# time ran short, so one start has to carry the most): issue 26's deciding rows (the service over a
# grid of 32 shards / 4 blocks and 64 shards / 8 blocks beside the one-block service, 1, 8 and 64
# clients), then every GPU test on the tree (`./run tests`), then the service GPU test on the 64-shard
# grid with what time is left. Every program's PTX comes back.
# From the repository root, after `cargo xtask gpu-test --bundle .gpu/next` (carry `.gpu`); CALL_SECS
# (default 570) is how long its steps may take in all.
source docs/gpu-runs/next/lib.sh
compile_programs
ptxas_usage service service_x_serial
echo "nvcc $(( $(date +%s) - T0 ))s" >> $S
MESH_SERVICE_SHARDS=32 MESH_SERVICE_GRID=4 MESH_SERVICE_CLIENTS="1 8 64" step bench-service-grid4-blink 60 bin/mesh-gpu-bench service blink
MESH_SERVICE_SHARDS=64 MESH_SERVICE_GRID=8 MESH_SERVICE_CLIENTS="1 8 64" step bench-service-grid8-blink 60 bin/mesh-gpu-bench service blink
MESH_SERVICE_CLIENTS="1 64" step bench-service-blink 45 bin/mesh-gpu-bench service blink
left=$(( ${CALL_SECS:-570} - $(date +%s) + T0 - 45 ))
t=$(date +%s); OUT=$L/run-tests timeout -k 5 $left ./run tests > $L/run-tests.txt 2>&1
echo "run-tests rc=$? $(( $(date +%s) - t ))s (limit ${left}s)" >> $S
pkill -x meshd; sleep 1
MESH_SERVICE_SHARDS=64 MESH_SERVICE_GRID=8 MESH_SERVICE_SECS=6 step test-service-grid8 60 bin/test-service --test-threads=1 --nocapture service_64
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep -h "^| blink\|^| mps" $L/bench-service-*.txt
grep -hE "longest wait|panicked|FAILED|failed" $L/run-tests.txt $L/test-service-grid8.txt | head -20
tail -32 $L/run-tests.txt
finish
