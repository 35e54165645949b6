#!/bin/bash
# Session 18's call 6: the Python package's GPU pytest (call 3's `./run tests` ran without it: that
# bundle was built where maturin was missing), as gpu-run.sh runs it.
source docs/gpu-runs/next/lib.sh
compile_programs
PYSITE=$(mktemp -d /tmp/meshd-site.XXXXXX)
python3 -m pip install --no-index --no-deps --target "$PYSITE" python/meshd-*.whl > $L/pytest-gpu.txt 2>&1
(cd python && PYTHONPATH=$PYSITE MESHD_BIN=$PWD/../bin/meshd MESH_PY_PEER=$PWD/../bin/peer timeout -k 10 200 python3 -m pytest -rs -v \
    -p no:cacheprovider tests >> $L/pytest-gpu.txt 2>&1)
echo "pytest rc=$? $(grep -E '(passed|failed)' $L/pytest-gpu.txt | tail -1) $(( $(date +%s) - T0 ))s" >> $S
pkill -x meshd
cat $S
grep -E "FAILED|SKIPPED|Error" $L/pytest-gpu.txt | head -20
finish
