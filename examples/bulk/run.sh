#!/usr/bin/env bash
# The bulk how-to from end to end: two bulk channels of 16 MiB messages, bulk_echo.cu between them, and
# arrays.py sending NumPy arrays through it.
set -euo pipefail
cd "$(dirname "$0")"
nvcc -ptx -arch=compute_80 -I "${MESH_INCLUDE:-../../crates/mesh-shm/include}" bulk_echo.cu -o bulk_echo.ptx

# doc:begin start
meshd run --fresh --shm-size 256M &      # two rings of 2 x 16 MiB do not fit the default 64 MiB
until meshd ps >/dev/null 2>&1; do sleep 0.1; done
meshd channel create to-gpu --msg-size 16777216 --capacity 2 --protocol bulk
meshd channel create from-gpu --msg-size 16777216 --capacity 2 --protocol bulk
meshd load bulk-echo bulk_echo.ptx --block 1024 --bind to-gpu --bind from-gpu
# doc:end start
python3 arrays.py

meshd shutdown
wait
