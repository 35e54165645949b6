# lib.sh: what every scripted device call of docs/gpu-runs/next shares (sourced from the repository
# root): logs under /tmp/logs (a summary line a step), the bundle's directory as the working one with
# its binaries and programs in the environment, `step` to run one step under the call's deadline, and
# `compile_programs` (every program of the bundle to PTX with nvcc, 16 at once), `ptxas_usage` (registers
# and memory of named programs). CALL_SECS (default
# 570) is how long the call's steps may take in all; a step that would start with less than 15 s left
# is skipped and says so.
set -u
R=${OUT:-/tmp/out}; L=/tmp/logs; rm -rf $L; mkdir -p $L/nvcc $R
cd .gpu/next
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$PWD/programs PATH=$PWD/bin:$PATH
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
S=$L/summary.txt
T0=$(date +%s)
step() {  # step NAME LIMIT CMD...: runs CMD under timeout, its output to $L/NAME.txt, a line in the summary
    local name=$1 limit=$2; shift 2
    local t=$(date +%s) left=$(( ${CALL_SECS:-570} - $(date +%s) + T0 ))
    if [ $left -lt 15 ]; then echo "$name skipped: no time left" >> $S; return; fi
    [ $limit -gt $left ] && limit=$left
    timeout -k 5 "$limit" "$@" > "$L/$name.txt" 2>&1
    local rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t ))s $(grep -E '^test result' "$L/$name.txt" | tail -1)" >> $S
    pkill -x meshd; sleep 1
}
compile_programs() {
    ls programs/*.cu | xargs -P 16 -I{} bash -c 'cu={}; n=$(basename ${cu%.cu}); timeout 120 '"$NVCC"' -ptx -arch=compute_80 -I programs -o ${cu%.cu}.ptx $cu > '"$L"'/nvcc/$n.log 2>&1 || echo "nvcc FAILED $n" >> '"$S"
}
ptxas_usage() {  # ptxas_usage PROGRAM...: each program's registers, stack and shared memory for sm_90, in the summary
    for p in "$@"; do
        echo "$p: $(timeout 60 $NVCC -cubin -arch=sm_90 -Xptxas -v -I programs -o /tmp/$p.cubin programs/$p.cu 2>&1 | grep -o 'Used.*')" >> $S
    done
}
finish() {  # every program's PTX and every log, packed into $OUT
    mkdir -p $L/ptx && cp programs/*.ptx $L/ptx/
    tar -czf $R/logs.tgz -C /tmp logs
}
