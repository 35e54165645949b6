#!/usr/bin/env bash
# The main job, end to end: build the echo program with nvcc, start meshd, create two channels, load
# the program, send a message through the GPU and read the reply, list the programs, shut down.
# Usage: demo.sh [MESHD] [PROGRAMS_DIR] (the directory holding echo.cu; `cargo xtask demo` builds meshd
# and runs this; a GPU bundle runs it with its own bin/ and programs/).
set -euo pipefail
MESHD=${1:-meshd}
PROGRAMS=${2:-$(dirname "$0")/../tests/programs}
# mesh.cuh: beside the program in a bundle, else the repository's.
INCLUDE=$PROGRAMS
[ -e "$INCLUDE/mesh.cuh" ] || INCLUDE=$(dirname "$0")/../crates/mesh-shm/include
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
  echo "demo: nvcc not found (not on PATH, not at /usr/local/cuda/bin/nvcc; set NVCC): it builds the echo" \
    "program from $PROGRAMS/echo.cu. Install the CUDA toolkit (docs/prerequisites.md)." >&2
  exit 1
fi
WORK=$(mktemp -d /tmp/meshd-demo.XXXXXX)
export MESHD_SOCKET=$WORK/meshd.sock
trap '"$MESHD" shutdown >/dev/null 2>&1 || true; sleep 0.5; rm -rf "$WORK"' EXIT
"$NVCC" -ptx -arch=compute_80 -I "$INCLUDE" -o "$WORK/echo.ptx" "$PROGRAMS/echo.cu"

"$MESHD" run --shm /dev/shm/meshd-demo.$$ 2>"$WORK/meshd.log" &
MESHD_PID=$!
for _ in $(seq 1 100); do "$MESHD" ps >/dev/null 2>&1 && break; kill -0 "$MESHD_PID" 2>/dev/null || break; sleep 0.1; done
if ! "$MESHD" ps >/dev/null 2>&1; then
  echo "meshd did not start:" >&2; cat "$WORK/meshd.log" >&2; exit 1
fi
"$MESHD" channel create to-gpu --msg-size 64 --capacity 16
"$MESHD" channel create from-gpu --msg-size 64 --capacity 16
"$MESHD" load echo "$WORK/echo.ptx" --bind to-gpu --bind from-gpu
"$MESHD" send to-gpu "hello from the host"
printf 'the GPU answered: '
"$MESHD" recv from-gpu --timeout-ms 5000
"$MESHD" ps
"$MESHD" shutdown
wait
echo "meshd's log:"; cat "$WORK/meshd.log"
