#!/bin/bash
# Session 18's item 1 call: mesh.cuh's phase lock with its trials scored by the median gap between
# messages (call 1 of this session, summed gaps: 0.2 us lost at 64-256 B for clients of 300 ns-3 us),
# and the short path in two copies (call 1: a device channel 0.1-0.36 us slower when both ends were
# built with the lock, unused). rt-ab as call-phase.sh (both modes, client delays 300 / 700 / 3000
# ns), then g2g with the default build and with ping and echo_header built with the lock, and each
# build's registers.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines" >> $S
for p in echo_header ping; do
    for lock in 0 1; do
        echo "$p lock=$lock: $(timeout 60 $NVCC -cubin -arch=sm_90 -Xptxas -v -I programs -DMESH_PHASE_LOCK=$lock -o /tmp/$p.cubin programs/$p.cu 2>&1 | grep -o 'Used.*')" >> $S
    done
done
V="echo_x_phase echo_x_nolock echo_x_phasealways word:raw_pingpong_x_phase"
MESH_RT_AB_VARIANTS="$V" step rt-ab-blink 30 bin/mesh-gpu-bench rt-ab blink
for d in 300 700 3000; do
    MESH_RT_AB_HOST_DELAY_NS=$d MESH_RT_AB_VARIANTS="$V" step rt-ab-blink-d$d 30 bin/mesh-gpu-bench rt-ab blink
done
MESH_RT_AB_VARIANTS="$V" step rt-ab-mps 30 bin/mesh-gpu-bench rt-ab mps
MESH_RT_AB_HOST_DELAY_NS=700 MESH_RT_AB_VARIANTS="$V" step rt-ab-mps-d700 30 bin/mesh-gpu-bench rt-ab mps
step g2g-blink 30 bin/mesh-gpu-bench g2g blink
for p in ping echo_header; do timeout 60 $NVCC -ptx -arch=compute_80 -I programs -DMESH_PHASE_LOCK=1 -o programs/$p.ptx programs/$p.cu; done
step g2g-blink-lock 30 bin/mesh-gpu-bench g2g blink
for p in ping echo_header; do timeout 60 $NVCC -ptx -arch=compute_80 -I programs -o programs/$p.ptx programs/$p.cu; done
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| " $f | grep -v "^|--\|^| mode" | awk -F'|' '{printf "%s|%s|%s|%s|%s|%s\n",$3,$4,$5,$6,$8,$10}'; done
grep "^| blink" $L/g2g-blink.txt $L/g2g-blink-lock.txt
grep -h "^PHASE|" $L/rt-ab-*.txt | grep -v "phasealways\||4096|"
finish
