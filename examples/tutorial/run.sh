#!/usr/bin/env bash
# The tutorial from end to end: build both versions of scale.cu, start meshd, load version 1, talk to it
# from Python, then upgrade it to version 2 while a Python script streams requests through it.
set -euo pipefail
cd "$(dirname "$0")"
INCLUDE=${MESH_INCLUDE:-../../crates/mesh-shm/include}
# doc:begin build
nvcc -ptx -arch=compute_80 -I "$INCLUDE" scale.cu -o scale.ptx
# doc:end build
nvcc -ptx -arch=compute_80 -I "$INCLUDE" scale_v2.cu -o scale_v2.ptx

meshd run --fresh &
until meshd ps >/dev/null 2>&1; do sleep 0.1; done

# doc:begin load
meshd channel create requests --msg-size 64 --capacity 16
meshd channel create replies --msg-size 64 --capacity 16
meshd load scale scale.ptx --bind requests --bind replies
meshd ps
# doc:end load

python3 client.py

# doc:begin upgrade
python3 stream.py 200000 &       # streams requests, checking every reply
sleep 1
meshd upgrade scale scale_v2.ptx # a new image, the same slot and channels
wait $!                          # stream.py's verdict
# doc:end upgrade

meshd shutdown
wait
