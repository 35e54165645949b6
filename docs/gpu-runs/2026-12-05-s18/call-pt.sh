#!/bin/bash
# Session 18's last call: the phase lock's trials scored by capped sums with a running mean (rt-ab,
# blink with client delays 0 / 700 / 3000 ns, MPS 700: echo_x_phase beside echo_x_nolock), then
# `./run tests` on the tree (the lock off by default) with every program's PTX.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines" >> $S
V="echo_x_phase echo_x_nolock"
MESH_RT_AB_VARIANTS="$V" step rt-ab-blink 30 bin/mesh-gpu-bench rt-ab blink
for d in 700 3000; do
    MESH_RT_AB_HOST_DELAY_NS=$d MESH_RT_AB_VARIANTS="$V" step rt-ab-blink-d$d 30 bin/mesh-gpu-bench rt-ab blink
done
MESH_RT_AB_HOST_DELAY_NS=700 MESH_RT_AB_VARIANTS="$V" step rt-ab-mps-d700 30 bin/mesh-gpu-bench rt-ab mps
echo "rt-ab done $(( $(date +%s) - T0 ))s" >> $S
left=$(( ${CALL_SECS:-570} - $(date +%s) + T0 ))
OUT=$L/run-tests timeout -k 5 $left ./run tests > $L/run-tests.txt 2>&1
echo "run-tests rc=$? $(( $(date +%s) - T0 ))s" >> $S
pkill -x meshd
cat $S
grep -hE "longest wait|panicked|FAILED|failed" $L/run-tests.txt | head -20
tail -12 $L/run-tests.txt
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| " $f | grep -v "^|--\|^| mode" | awk -F'|' '{printf "%s|%s|%s|%s|%s|%s\n",$3,$4,$5,$6,$8,$10}'; done
grep -h "^PHASE|" $L/rt-ab-*.txt | grep -v "|4096|" | head -24
finish
