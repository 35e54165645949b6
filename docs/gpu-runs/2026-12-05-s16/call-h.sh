#!/bin/bash
# Session 14's device call for issue 24 (written without a device; run it after call G, in the same
# session if device time allows): every figure of the goals in one call, each beside its raw
# limit in the same run. The host round trip in turns (`rt-ab`: the header's loop, the raw mapped word
# and the one-warp LL probe as a resident program, raw_ll.cu, each measured in each of 5 turns, so that
# a drift within the call falls on all three; session 12's raw word moved 10% within one `rt`), the
# C++ LL probe beside it, the header's poll stream (echo_poll, 96 threads) and echo_x_stagger (one warp,
# two polls in flight 300 / 500 / 700 ns apart)
# beside them; one bulk channel over 1-32 blocks moving four messages a call at both ends
# (`_x_batch4`: mesh_block_try_send_n / reserve_n / publish_n, try_recv_n / peek_n / release_n), both
# sizes, both paths; GPU↔GPU round trips with the two-kernel probe; host bulk ends beside
# cuMemcpyAsync; the round trip in turns in MPS mode, as time allows.
# From the repository root, after `cargo xtask gpu-test --bundle .gpu/next` (carry `.gpu`); CALL_SECS
# (default 570) is how long its steps may take in all.
source docs/gpu-runs/next/lib.sh
compile_programs
for p in ll_roundtrip g2g; do
    timeout 90 $NVCC -O3 -arch=sm_90 -std=c++17 -o bin/$p probes/$p.cu > $L/nvcc/probe-$p.log 2>&1 || echo "nvcc FAILED probe $p" >> $S
done
echo "nvcc $(( $(date +%s) - T0 ))s" >> $S
step rt-probe 30 bin/ll_roundtrip
MESH_RT_AB_VARIANTS="echo_poll:4096:96 echo_x_stagger:1024 echo_x_stagger300:1024 echo_x_stagger700:1024" step rt-ab-blink 120 bin/mesh-gpu-bench rt-ab blink
MESH_PARTS_VARIANT=_x_batch4 step bench-parts-batch4 130 bin/mesh-gpu-bench parts blink
step g2g-probe 30 bin/g2g
step g2g-blink 60 bin/mesh-gpu-bench g2g blink
step bulk-blink 90 bin/mesh-gpu-bench bulk blink
MESH_RT_AB_VARIANTS="echo_poll:4096:96" step rt-ab-mps 100 bin/mesh-gpu-bench rt-ab mps
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep -h "^| blink\|^| mps\|median_us" $L/rt-probe.txt $L/rt-ab-*.txt 2>/dev/null
grep -h "^| 1048576\|^| 16777216" $L/bench-parts-batch4.txt 2>/dev/null
grep -h "^| blink" $L/g2g-blink.txt 2>/dev/null
head -12 $L/g2g-probe.txt
grep -h "^| [0-9]" $L/bulk-blink.txt 2>/dev/null | head -24
finish
