#!/usr/bin/env bash
# Build hello.cu, start meshd, load the program, send it a message and read the answer, then stop.
set -euo pipefail
cd "$(dirname "$0")"
nvcc -ptx -arch=compute_80 -I "${MESH_INCLUDE:-../../crates/mesh-shm/include}" hello.cu -o hello.ptx

meshd run --fresh &                                  # blink mode, socket /tmp/meshd.sock
until meshd ps >/dev/null 2>&1; do sleep 0.1; done  # until it answers

meshd channel create to-gpu --msg-size 64 --capacity 16
meshd channel create from-gpu --msg-size 64 --capacity 16
meshd load hello hello.ptx --bind to-gpu --bind from-gpu
meshd send to-gpu "hello, gpu"
meshd recv from-gpu --timeout-ms 5000                # HELLO, GPU
meshd ps                                             # hello is running, its heartbeat moving

meshd shutdown
wait
