#!/bin/bash
# Session 19, issue 24 item 1: every path of rt-ab over a client whose own time varies. A one-warp loop's
# round trip with an immediate client is a sawtooth of where the request lands between its polls (the
# kit's host-delay sweep): a whole poll (~1.2 us) decided by ~100 ns, so one client's median says which
# phase a loop fell into, not what it costs. With the client's delay drawn for each request from 0-1500
# ns (at least one poll period) every path is averaged over the phase: what is left between the header's
# loop and the raw paths is their poll periods and their work, not luck. Beside them the variants that
# shorten the loop's work (rarestop: no %globaltimer read per iteration; nodrain: no tail store per
# message), the phase lock (echo_x_phase) and the poll stream (echo_poll, three warps).
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" >> $S
V="echo_x_rarestop echo_x_nodrain echo_x_phase echo_poll:4096:96"
for mode in blink mps; do
    MESH_RT_AB_VARIANTS="$V" step rt-ab-$mode 60 bin/mesh-gpu-bench rt-ab $mode
    MESH_RT_AB_HOST_DELAY_NS=0-1500 MESH_RT_AB_VARIANTS="$V" step rt-ab-$mode-r1500 60 bin/mesh-gpu-bench rt-ab $mode
done
MESH_RT_AB_HOST_DELAY_NS=0-3000 MESH_RT_AB_VARIANTS="$V" step rt-ab-blink-r3000 60 bin/mesh-gpu-bench rt-ab blink
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| " $f | grep -v "^|--\|^| mode" | awk -F'|' '{printf "%s|%s|%s|%s|%s|%s\n",$3,$4,$5,$6,$8,$10}'; done
finish
