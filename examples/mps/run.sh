#!/usr/bin/env bash
# MPS mode: meshd with a pool for two programs plus an upgrade, the tutorial's program loaded twice,
# one of them upgraded while the other keeps running.
set -euo pipefail
cd "$(dirname "$0")/../tutorial"
nvcc -ptx -arch=compute_80 -I "${MESH_INCLUDE:-../../crates/mesh-shm/include}" scale.cu -o scale.ptx

# doc:begin start
meshd run --fresh --isolation mps --pool 3 --standby 3 &   # 2 programs + 1 for upgrades
until meshd ps >/dev/null 2>&1; do sleep 0.1; done
meshd info                                               # the pool: idle and in-use workers, the client limit
# doc:end start

for n in 1 2; do
  meshd channel create "req$n" --msg-size 64 --capacity 16
  meshd channel create "rep$n" --msg-size 64 --capacity 16
  meshd load "scale$n" scale.ptx --bind "req$n" --bind "rep$n"
done
meshd upgrade scale1 scale.ptx                           # scale2 does not pause
meshd ps

meshd shutdown
wait
