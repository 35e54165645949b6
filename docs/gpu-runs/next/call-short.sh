#!/bin/bash
# The shortest useful device call (session 15, with under 450 s of device time left after ten refused
# starts): the GPU test of session 14's bulk batch calls (test-parts, with `_x_batch4`), the service
# bench on both grids (1, 8, 64 clients), and the service test on the 64-shard grid.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s" >> $S
step test-parts 100 bin/test-parts --test-threads=1 --nocapture
MESH_SERVICE_SHARDS=64 MESH_SERVICE_GRID=8 MESH_SERVICE_CLIENTS="1 8 64" step bench-service-grid8-blink 60 bin/mesh-gpu-bench service blink
MESH_SERVICE_SHARDS=32 MESH_SERVICE_GRID=4 MESH_SERVICE_CLIENTS="1 8 64" step bench-service-grid4-blink 60 bin/mesh-gpu-bench service blink
MESH_SERVICE_SHARDS=64 MESH_SERVICE_GRID=8 MESH_SERVICE_SECS=6 step test-service-grid8 60 bin/test-service --test-threads=1 --nocapture service_64
cat $S
grep -h "^| blink\|^| mps" $L/bench-service-*.txt
grep -hE "longest wait|panicked|FAILED|failed|test result" $L/test-*.txt | head -20
finish
