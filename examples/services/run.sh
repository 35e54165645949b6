#!/usr/bin/env bash
# The services how-to from end to end: a service for 64 clients served by kv_server.cu over 4 blocks,
# then 64 Python clients at once, each checking its own replies.
set -euo pipefail
cd "$(dirname "$0")"
nvcc -ptx -arch=compute_80 -I "${MESH_INCLUDE:-../../crates/mesh-shm/include}" kv_server.cu -o kv_server.ptx

meshd run --fresh &
until meshd ps >/dev/null 2>&1; do sleep 0.1; done

# doc:begin serve
meshd service create kv --clients 64 --msg-size 64 --shards 32
meshd load kv-server kv_server.ptx --grid 4 --block 256 --bind kv --bind kv.replies
# doc:end serve
meshd service request kv --hex 29000000   # 2a000000…: the first word plus one
python3 clients.py 64 2000

meshd shutdown
wait
