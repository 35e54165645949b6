#!/bin/bash
# Session 16's short call after the consumer-publication fix (mesh_chan_took): every program compiled
# with the new header, then the GPU tests that lean on it most: restart (kill -9 under traffic, both
# modes: the loss session 16 saw in blink), soak (with the driver's own retention beside it),
# the service test on its new default (32 shards, 4 blocks of 256), chaos and channels, restart again, g2g (its nodrain rows). CALL_SECS (default 570) bounds the steps.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s $(grep -c . $S) failures" >> $S
step test-restart 80 bin/test-restart --test-threads=1 --nocapture
step test-soak 70 bin/test-soak --test-threads=1 --nocapture
MESH_SERVICE_SECS=8 step test-service 80 bin/test-service --test-threads=1 --nocapture
step test-chaos 80 bin/test-chaos --test-threads=1 --nocapture
step test-channels 40 bin/test-channels --test-threads=1
step test-restart-again 80 bin/test-restart --test-threads=1 --nocapture
step g2g-blink 40 bin/mesh-gpu-bench g2g blink  # its nodrain rows: MESH_PUBLISH_ON_DRAIN=0 programs
# Session 17: issue 24 item 1's data on the current header (the kit last ran on layout 3), the turns of
# rt-ab with every turn printed, item 3's edge on this machine, issue 26's rows (G').
(cd ../.. && OUT=$L/kit KIT_BUDGET=75 step kit 90 bash tests/probes/run-kit.sh)
MESH_RT_AB_VARIANTS="echo_poll:4096:96" step rt-ab-blink 40 bin/mesh-gpu-bench rt-ab blink
MESH_RT_AB_VARIANTS="echo_poll:4096:96" step rt-ab-mps 40 bin/mesh-gpu-bench rt-ab mps
MESH_PARTS_VARIANT=_x_batch4 MESH_PARTS_BLOCKS="16 32" step parts-batch4 60 bin/mesh-gpu-bench parts blink
MESH_SERVICE_CLIENTS="1 8 64" step service-blink 60 bin/mesh-gpu-bench service blink
MESH_SERVICE_CLIENTS="1 8 64" step service-mps 60 bin/mesh-gpu-bench service mps
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep -hE "restart (blink|mps):|soak |panicked|lost|longest wait for" $L/test-*.txt | head -20
grep "^| blink" $L/g2g-blink.txt
grep -h "^| " $L/rt-ab-*.txt $L/parts-batch4.txt $L/service-*.txt | grep -v "^|--" | head -60
finish
