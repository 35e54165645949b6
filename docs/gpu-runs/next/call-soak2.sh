#!/bin/bash
# Session 18's call 5: test-soak with the driver's retention measured three ways (plain loads before
# and after the soak, and loads each launched and stopped, as meshd's cycle does), on the H100 where
# meshd grew 12 MiB in 1,000 cycles while plain loads kept 0 (call 4).
source docs/gpu-runs/next/lib.sh
echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" >> $S
step test-soak 200 bin/test-soak --test-threads=1 --nocapture
cat $S
grep -E "^soak|panicked|GPU memory|^test " $L/test-soak.txt
finish
