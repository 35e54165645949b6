#!/bin/bash
# Session 18's call 4: test-soak with the driver's retention measured before and after the soak (call 3,
# an H100: blink 529 -> 541 MiB while the measurement after the soak read 0 MiB), then rt-ab on this
# machine: the default loop and the phase lock (echo_x_phase beside echo_x_nolock), client delays 0 /
# 700 / 3000 ns.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" >> $S
step test-soak 200 bin/test-soak --test-threads=1 --nocapture
V="echo_x_phase echo_x_nolock"
MESH_RT_AB_VARIANTS="$V" step rt-ab-blink 30 bin/mesh-gpu-bench rt-ab blink
for d in 700 3000; do
    MESH_RT_AB_HOST_DELAY_NS=$d MESH_RT_AB_VARIANTS="$V" step rt-ab-blink-d$d 30 bin/mesh-gpu-bench rt-ab blink
done
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep -E "^soak|panicked|GPU memory" $L/test-soak.txt
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| " $f | grep -v "^|--\|^| mode" | awk -F'|' '{printf "%s|%s|%s|%s|%s|%s\n",$3,$4,$5,$6,$8,$10}'; done
finish
