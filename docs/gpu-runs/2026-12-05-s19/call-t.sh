#!/bin/bash
# Session 14's correctness call: every GPU test on the final tree (`./run tests`: the README's service,
# the parts test with four bulk messages a call at both ends, `_x_batch4`, the chaos test of both
# modes, pytest), after calls G and H. Every program's PTX comes back.
# From the repository root, after `cargo xtask gpu-test --bundle .gpu/next` (carry `.gpu`); CALL_SECS
# (default 570) is how long its steps may take in all.
source docs/gpu-runs/next/lib.sh
compile_programs
echo "nvcc $(( $(date +%s) - T0 ))s" >> $S
left=$(( ${CALL_SECS:-570} - $(date +%s) + T0 ))
OUT=$L/run-tests timeout -k 5 $left ./run tests > $L/run-tests.txt 2>&1
echo "run-tests rc=$? $(( $(date +%s) - T0 ))s" >> $S
pkill -x meshd
cat $S
grep -hE "longest wait|panicked|FAILED|failed" $L/run-tests.txt | head -20
tail -30 $L/run-tests.txt
finish
