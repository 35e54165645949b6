#!/bin/bash
# Issue 24 item 1, the load width (session 18's lead): the header's loop with its short path loading
# 8-byte words (echo_x_ld8) beside the default 16-byte pairs (echo_header), and the raw LL probe with
# 16-byte loads (raw_ll_x_v2) and with the host's head-last store order, in rt-ab's turns, both modes,
# then blink with a 700 ns client; registers of the programs concerned; g2g with both ends built so. Session 18 (an H100): the probe
# with 16-byte loads 0.2-1.5 us slower at 8 B-1 KiB than with 8-byte ones, and 27 us at 4 KiB (see
# its ptxas line: serialized loads or a spill?).
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" >> $S
ptxas_usage echo_header echo_x_ld8 raw_ll raw_ll_x_v2
V="echo_x_ld8 ll:raw_ll_x_v2 llring:raw_ll_x_v2 ll-headlast:raw_ll llring-headlast:raw_ll"
MESH_RT_AB_VARIANTS="$V" step rt-ab-blink 60 bin/mesh-gpu-bench rt-ab blink
MESH_RT_AB_VARIANTS="$V" step rt-ab-mps 60 bin/mesh-gpu-bench rt-ab mps
MESH_RT_AB_HOST_DELAY_NS=700 MESH_RT_AB_VARIANTS="echo_x_ld8" step rt-ab-blink-d700 60 bin/mesh-gpu-bench rt-ab blink
# Device channels with both ends loading 8-byte words (g2g loads ping.ptx and echo_header.ptx): the
# default first, then rebuilt with MESH_LEAN_LOAD_BYTES=8, then restored.
step g2g-blink 30 bin/mesh-gpu-bench g2g blink
for p in ping echo_header; do timeout 60 $NVCC -ptx -arch=compute_80 -I programs -DMESH_LEAN_LOAD_BYTES=8 -o programs/$p.ptx programs/$p.cu; done
step g2g-blink-ld8 30 bin/mesh-gpu-bench g2g blink
for p in ping echo_header; do timeout 60 $NVCC -ptx -arch=compute_80 -I programs -o programs/$p.ptx programs/$p.cu; done
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/rt-ab-*.txt; do echo "== $(basename $f)"; grep "^| " $f | grep -v "^|--\|^| mode" | awk -F'|' '{printf "%s|%s|%s|%s|%s|%s\n",$3,$4,$5,$6,$8,$10}'; done
grep -hE "^(TURNS|MEANS)" $L/rt-ab-blink.txt | grep "echo_\|raw_ll"
grep "^| blink" $L/g2g-blink.txt $L/g2g-blink-ld8.txt
finish
