#!/bin/bash
# Session 17's item 1 call: the header's loop phase-locked to its client (echo_x_phase.cu, steps 100/10,
# 50/5, 200/20) and the raw word with the same lock (raw_pingpong_x_phase.cu, the technique's limit),
# beside echo_header, the raw word and raw_ll in rt-ab's turns, both modes, then blink with the client
# spinning 300, 700, 1500 and 3000 ns after each reply (a slower client: the lock must not lose there).
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines" >> $S
V="echo_x_phase echo_x_phase50 echo_x_phase200 word:raw_pingpong_x_phase"
MESH_RT_AB_VARIANTS="$V" step rt-ab-blink 60 bin/mesh-gpu-bench rt-ab blink
MESH_RT_AB_VARIANTS="$V" step rt-ab-mps 60 bin/mesh-gpu-bench rt-ab mps
for d in 300 700 1500 3000; do
    MESH_RT_AB_HOST_DELAY_NS=$d MESH_RT_AB_VARIANTS="echo_x_phase word:raw_pingpong_x_phase" step rt-ab-blink-d$d 60 bin/mesh-gpu-bench rt-ab blink
done
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| " $f | grep -v "^|--\|^| mode"; done
finish
