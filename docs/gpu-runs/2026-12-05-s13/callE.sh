#!/bin/bash
# The next session's device call (about 6 minutes with the start). Issue 24 item 3: the parts bench with
# and without mesh_block_try_send_n (two messages a barrier and a fence on the copy path:
# bulk_parts_*_x_send2), side by side. Issue 26: the service bench with its new raw baseline rows (raw_pingpong_many.cu: N client processes at once, each in its own mapped-word
# round trip with a GPU thread, waiting as the service clients wait), in both modes, so that the N-client
# latency rows stand beside the true limit for N processes on this machine's 16 CPUs. From the
# repository root, after `cargo xtask gpu-test --bundle .gpu/next` (carry `.gpu`).
set -u
R=${OUT:-/tmp/out}; L=/tmp/logs; rm -rf $L; mkdir -p $L $R
cd .gpu/next
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$PWD/programs PATH=$PWD/bin:$PATH
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
for p in raw_pingpong_many service service_x_serial echo_warp bulk_parts_source bulk_parts_sink bulk_parts_source_x_send2 bulk_parts_sink_x_send2 copy_blocks fill_blocks check_blocks; do
    timeout 60 $NVCC -ptx -arch=compute_80 -I programs -o programs/$p.ptx programs/$p.cu > $L/nvcc-$p.log 2>&1 || echo "nvcc FAILED $p" >> $L/summary.txt
done
timeout -k 5 90 bin/mesh-gpu-bench parts blink > $L/bench-parts.txt 2>&1
echo "parts rc=$?" >> $L/summary.txt; pkill -x meshd; sleep 1
MESH_PARTS_VARIANT=_x_send2 timeout -k 5 90 bin/mesh-gpu-bench parts blink > $L/bench-parts-send2.txt 2>&1
echo "parts send2 rc=$?" >> $L/summary.txt; pkill -x meshd; sleep 1
MESH_SERVICE_CLIENTS="1 8 16 32 64" timeout -k 5 150 bin/mesh-gpu-bench service blink > $L/bench-service-blink.txt 2>&1
echo "blink rc=$?" >> $L/summary.txt; pkill -x meshd; sleep 1
MESH_SERVICE_CLIENTS="1 8 16 64" MESH_SERVICE_PROGRAMS=service timeout -k 5 120 bin/mesh-gpu-bench service mps > $L/bench-service-mps.txt 2>&1
echo "mps rc=$?" >> $L/summary.txt; pkill -x meshd
cat $L/summary.txt; grep -h "^|" $L/bench-*.txt
cp programs/raw_pingpong_many.ptx $L/
tar -czf $R/logs.tgz -C /tmp logs
