#!/bin/bash
# Issue 26's device call (written in session 13, narrowed to the service in session 14, whose calls H
# and T take issue 24's rows and `./run tests`): service.cu over a grid in the service bench beside the
# one-block service (8 shards): 4 blocks over 32 shards (a shard a warp: 2 of 64 clients each) and 8
# blocks over 64 shards (a warp a client; session 14 lifted the shard limit to 64), the clients'
# receive yielding at once when several requests are in flight (PollPause::for_replies: the default
# rows' 64 streaming clients), the service GPU test on both grids (both modes), the 32-shard grid's
# MPS rows and service_x_poll1 on it.
# Every program's PTX comes back.
# From the repository root, after `cargo xtask gpu-test --bundle .gpu/next` (carry `.gpu`); CALL_SECS
# (default 570) is how long its steps may take in all.
source docs/gpu-runs/next/lib.sh
compile_programs
ptxas_usage service service_x_serial
echo "nvcc $(( $(date +%s) - T0 ))s" >> $S
MESH_SERVICE_SHARDS=32 MESH_SERVICE_GRID=4 MESH_SERVICE_CLIENTS="1 8 16 64" step bench-service-grid4-blink 75 bin/mesh-gpu-bench service blink
MESH_SERVICE_CLIENTS="1 64" step bench-service-blink 45 bin/mesh-gpu-bench service blink
MESH_SERVICE_SHARDS=64 MESH_SERVICE_GRID=8 MESH_SERVICE_CLIENTS="1 8 64" step bench-service-grid8-blink 60 bin/mesh-gpu-bench service blink
MESH_SERVICE_SHARDS=32 MESH_SERVICE_GRID=4 MESH_SERVICE_SECS=8 step test-service-grid4 70 bin/test-service --test-threads=1 --nocapture service_64
MESH_SERVICE_SHARDS=32 MESH_SERVICE_GRID=4 MESH_SERVICE_CLIENTS="1 8 64" step bench-service-grid4-mps 40 bin/mesh-gpu-bench service mps
MESH_SERVICE_SHARDS=32 MESH_SERVICE_GRID=4 MESH_SERVICE_PROGRAMS="service_x_poll1" MESH_SERVICE_CLIENTS="1 8 64" step bench-service-grid4-poll1-blink 40 bin/mesh-gpu-bench service blink
MESH_SERVICE_SHARDS=64 MESH_SERVICE_GRID=8 MESH_SERVICE_SECS=8 step test-service-grid8 70 bin/test-service --test-threads=1 --nocapture service_64
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep -hE "longest wait|panicked|test result" $L/test-service-grid*.txt 2>/dev/null | head -12
grep -h "^| blink\|^| mps" $L/bench-service-*.txt
finish
