#!/bin/bash
# Session 19, issue 24 item 1 at 8 B: the header's one-thread calls (echo.cu: mesh_try_recv /
# mesh_try_send, one 16-byte load for an 8-byte message), which the header and README recommend for
# messages of up to 8 bytes, beside the warp loop and the raw word in rt-ab's turns, with an immediate
# client and over a client drawn from 0-1500 ns, both modes.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" >> $S
V="echo:8"
for mode in blink mps; do
    MESH_RT_AB_VARIANTS="$V" step rt-ab-$mode 40 bin/mesh-gpu-bench rt-ab $mode
    MESH_RT_AB_HOST_DELAY_NS=0-1500 MESH_RT_AB_VARIANTS="$V" step rt-ab-$mode-r1500 40 bin/mesh-gpu-bench rt-ab $mode
done
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| [a-z]* | 8 " $f | awk -F'|' '{printf "%s|%s|%s|%s|%s|%s\n",$3,$4,$5,$6,$7,$9}'; grep -h "^TURNS|[a-z]*|8|" $f; done
finish
