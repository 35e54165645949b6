#!/usr/bin/env bash
# The main job, end to end: start meshd, create two channels, load the echo program, send a message
# through the GPU and read the reply, list the programs, shut down. Usage: demo.sh [MESHD] [PROGRAMS_DIR]
# (`cargo xtask demo` builds meshd and runs this; a GPU bundle runs it with its own bin/ and programs/).
set -euo pipefail
MESHD=${1:-meshd}
PROGRAMS=${2:-$(dirname "$0")/../tests/programs}
WORK=$(mktemp -d /tmp/meshd-demo.XXXXXX)
export MESHD_SOCKET=$WORK/meshd.sock
trap '"$MESHD" shutdown >/dev/null 2>&1 || true; sleep 0.5; rm -rf "$WORK"' EXIT

"$MESHD" run --shm /dev/shm/meshd-demo.$$ 2>"$WORK/meshd.log" &
MESHD_PID=$!
for _ in $(seq 1 100); do "$MESHD" ps >/dev/null 2>&1 && break; kill -0 "$MESHD_PID" 2>/dev/null || break; sleep 0.1; done
if ! "$MESHD" ps >/dev/null 2>&1; then
  echo "meshd did not start:" >&2; cat "$WORK/meshd.log" >&2; exit 1
fi
"$MESHD" channel create to-gpu --msg-size 64 --capacity 16
"$MESHD" channel create from-gpu --msg-size 64 --capacity 16
"$MESHD" load echo "$PROGRAMS/echo.ptx" --bind to-gpu --bind from-gpu
"$MESHD" send to-gpu "hello from the host"
printf 'the GPU answered: '
"$MESHD" recv from-gpu --timeout-ms 5000
"$MESHD" ps
"$MESHD" shutdown
wait
echo "meshd's log:"; cat "$WORK/meshd.log"
