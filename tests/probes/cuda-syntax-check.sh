#!/usr/bin/env bash
# cuda-syntax-check.sh FILE.cu...: g++ -fsyntax-only over each program with cuda_syntax_stub.h's stand-ins
# for CUDA's built-ins (for a machine without nvcc). A syntax and type check only: nothing is compiled
# for a GPU, inline PTX is not assembled. Run nvcc (`cargo xtask ptx`) before trusting a program.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rc=0
for f in "$@"; do
  if g++ -std=c++17 -fsyntax-only -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas -include "$ROOT/tests/probes/cuda_syntax_stub.h" \
      -I "$ROOT/crates/mesh-shm/include" -I "$(dirname "$f")" ${CHECK_FLAGS:-} -x c++ "$f"; then
    echo "syntax ok: $f ${CHECK_FLAGS:-}"
  else
    echo "syntax FAILED: $f"; rc=1
  fi
done
exit $rc
