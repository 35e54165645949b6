#!/bin/bash
# Session 18's 4 KiB question, for the H200 (where the raw LL probe walking a ring is 3.6 us at 4 KiB
# against 5.0 at one pair of slots and the header's loop 5.75): rt-ab with the probe's 16-byte-load
# variant (raw_ll_x_v2, as the header loads) and with the host storing the request's first two words
# last (as mesh-shm's producer does), each at one pair of slots and over a ring.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) lines; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" >> $S
V="ll:raw_ll_x_v2 llring:raw_ll_x_v2 ll-headlast:raw_ll llring-headlast:raw_ll"
MESH_RT_AB_VARIANTS="$V" step rt-ab-blink 60 bin/mesh-gpu-bench rt-ab blink
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep "^| " $L/rt-ab-blink.txt | grep -v "^|--\|^| mode" | awk -F'|' '{printf "%s|%s|%s|%s|%s|%s\n",$3,$4,$5,$6,$8,$10}'
grep "^TURNS" $L/rt-ab-blink.txt | grep "|4096|"
finish
