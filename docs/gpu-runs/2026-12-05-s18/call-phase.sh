#!/bin/bash
# Session 17's item 1 call: mesh.cuh's phase lock in mesh_warp_try_recv (echo_x_phase: trials with and
# without the wait, the cheaper kept; echo_x_phasealways: always waiting) beside the loop without it
# (echo_x_nolock), the raw word, raw_ll (one slot and a ring), and the raw word with the lock always on
# (raw_pingpong_x_phase: the technique's limit),
# in rt-ab's turns, both modes; then blink with the client spinning 300, 700 and 3000 ns after
# each reply (a slower client: the lock must not lose there); g2g (default, then ping and echo both
# built with the lock on, device channels) and test-channels. Ordered so that what matters most comes first (a short budget).
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines" >> $S
V="echo_x_phase echo_x_nolock echo_x_phasealways word:raw_pingpong_x_phase"
MESH_RT_AB_VARIANTS="$V" step rt-ab-blink 30 bin/mesh-gpu-bench rt-ab blink
MESH_RT_AB_HOST_DELAY_NS=300 MESH_RT_AB_VARIANTS="$V" step rt-ab-blink-d300 30 bin/mesh-gpu-bench rt-ab blink
step g2g-blink 30 bin/mesh-gpu-bench g2g blink
MESH_RT_AB_VARIANTS="$V" step rt-ab-mps 30 bin/mesh-gpu-bench rt-ab mps
for d in 700 3000; do
    MESH_RT_AB_HOST_DELAY_NS=$d MESH_RT_AB_VARIANTS="$V" step rt-ab-blink-d$d 30 bin/mesh-gpu-bench rt-ab blink
done
step test-channels 30 bin/test-channels --test-threads=1
# Both ends of g2g with the lock on (the bench loads ping.ptx and echo_header.ptx): rebuilt last.
for p in ping echo_header; do timeout 60 $NVCC -ptx -arch=compute_80 -I programs -DMESH_PHASE_LOCK=1 -o programs/$p.ptx programs/$p.cu; done
step g2g-blink-lock 30 bin/mesh-gpu-bench g2g blink
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| " $f | grep -v "^|--\|^| mode"; done
grep "^| blink" $L/g2g-blink.txt $L/g2g-blink-lock.txt
grep -h "^PHASE|" $L/rt-ab-*.txt | head -40  # echo_x_phase: the learned wait, the last trials' clocks
finish
