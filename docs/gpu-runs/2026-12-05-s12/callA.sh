#!/bin/bash
# The next session's first device call (PENDING.md rows 1-3b in one call, about 7 minutes): every program
# compiled; the service test with 8 shards on the capped peek (service_x_capped) and on the warps' loop
# (service_x_warps, 8 warps); the service bench with 8 shards over five loops side by side (the header's
# two, their capped forms, the warps' loop), the warps' loop with 2 warps, reply rings of 64, 2 and 4
# shards, the loops without the reply credit's reads; the bulk parts bench with and without the
# publisher warp. From the repository root, after
# `cargo xtask gpu-test --bundle .gpu/next` (carry `.gpu`): `bash docs/gpu-runs/next/call-a.sh`.
set -u
R=${OUT:-/tmp/out}; L=/tmp/logs; rm -rf $L; mkdir -p $L/nvcc $R
cd .gpu/next
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$PWD/programs PATH=$PWD/bin:$PATH
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
S=$L/summary.txt
T0=$(date +%s)
step() {  # step NAME LIMIT CMD...: runs CMD under timeout, its output to $L/NAME.txt, a line in the summary
    local name=$1 limit=$2; shift 2
    local t=$(date +%s) left=$(( 560 - $(date +%s) + T0 ))  # the call's 600 s, the tarball kept
    if [ $left -lt 15 ]; then echo "$name skipped: no time left" >> $S; return; fi
    [ $limit -gt $left ] && limit=$left
    timeout -k 5 "$limit" "$@" > "$L/$name.txt" 2>&1
    local rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t ))s $(grep -E '^test result' "$L/$name.txt" | tail -1)" >> $S
    pkill -x meshd; sleep 1
}
ls programs/*.cu | xargs -P 16 -I{} bash -c 'cu={}; n=$(basename ${cu%.cu}); timeout 120 '"$NVCC"' -ptx -arch=compute_80 -I programs -o ${cu%.cu}.ptx $cu > '"$L"'/nvcc/$n.log 2>&1 || echo "nvcc FAILED $n" >> '"$S"
for p in service service_x_capped service_x_warps bulk_parts_source bulk_parts_source_x_pubwarp bulk_parts_sink bulk_echo; do
    echo "$p: $(timeout 60 $NVCC -cubin -arch=sm_90 -Xptxas -v -I programs -o /tmp/$p.cubin programs/$p.cu 2>&1 | grep -o 'Used.*')" >> $S
done
echo "nvcc $(( $(date +%s) - T0 ))s" >> $S
# Correctness first: a variant is measured only where its test is green.
MESH_SERVICE_SHARDS=8 MESH_SERVICE_SECS=8 MESH_SERVICE_PROGRAM=service_x_capped \
    step test-service-capped 60 bin/test-service --test-threads=1 --nocapture
MESH_SERVICE_SHARDS=8 MESH_SERVICE_SECS=8 MESH_SERVICE_PROGRAM=service_x_warps MESH_SERVICE_TEST_BLOCK=256 \
    step test-service-warps 60 bin/test-service --test-threads=1 --nocapture
MESH_SERVICE_SHARDS=8 MESH_SERVICE_BLOCK=256 MESH_SERVICE_CLIENTS="1 8 16 64" \
    MESH_SERVICE_PROGRAMS="service service_x_warps service_x_capped service_x_serial service_x_serial_capped" \
    step bench-service-8-blink 130 bin/mesh-gpu-bench service blink
# Issue 24 item 3 before the rest of the service rows (the deadline guard cuts the last steps first).
step bench-parts-blink 65 bin/mesh-gpu-bench parts blink
MESH_PARTS_VARIANT=_x_pubwarp step bench-parts-pubwarp-blink 65 bin/mesh-gpu-bench parts blink
MESH_SERVICE_SHARDS=8 MESH_SERVICE_BLOCK=64 MESH_SERVICE_CLIENTS="1 8 16 64" MESH_SERVICE_PROGRAMS="service_x_warps" \
    step bench-service-8-warps2-blink 45 bin/mesh-gpu-bench service blink
# The reply credit (many-clients.md, "the reply ring's credit"): the loops that never read a reply ring's
# tail (MESH_REPLY_TRUST_WINDOW 1; the bench's clients keep their window), beside the rows above; then
# reply rings of 64, where the program reads a client's tail 4x more rarely.
MESH_SERVICE_SHARDS=8 MESH_SERVICE_BLOCK=256 MESH_SERVICE_CLIENTS="1 8 64" \
    MESH_SERVICE_PROGRAMS="service_x_window service_x_warps_window" \
    step bench-service-8-window-blink 60 bin/mesh-gpu-bench service blink
MESH_SERVICE_SHARDS=8 MESH_SERVICE_BLOCK=256 MESH_SERVICE_REPLY_CAPACITY=64 MESH_SERVICE_CLIENTS="1 64" \
    MESH_SERVICE_PROGRAMS="service service_x_warps" step bench-service-8-reply64-blink 45 bin/mesh-gpu-bench service blink
for P in 2 4; do  # a warp a shard: service_x_warps refuses more warps than shards
    MESH_SERVICE_SHARDS=$P MESH_SERVICE_BLOCK=$(( 32 * P )) MESH_SERVICE_CLIENTS="1 8 16 64" \
        MESH_SERVICE_PROGRAMS="service service_x_capped service_x_warps" \
        step bench-service-$P-blink 80 bin/mesh-gpu-bench service blink
done
echo "total $(( $(date +%s) - T0 ))s" >> $S
cat $S
for f in $L/test-service-*.txt; do grep -hE "^\| [0-9]|longest wait|panicked" "$f" | head -6; done
grep -h "^|" $L/bench-*.txt
tar -czf $R/logs.tgz -C /tmp logs
