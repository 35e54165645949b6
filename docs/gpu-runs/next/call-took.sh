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
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
grep -hE "restart (blink|mps):|soak |panicked|lost|longest wait for" $L/test-*.txt | head -20
grep "^| blink" $L/g2g-blink.txt
finish
