#!/usr/bin/env bash
# Adds the Python package to a GPU bundle made by `cargo xtask gpu-test --bundle DIR`: the abi3 wheel and
# its tests and benchmark under DIR/python/, the Rust peer as DIR/bin/peer. tests/gpu-run.sh (the bundle's
# `run`) then installs the wheel with pip --no-index into a scratch directory and runs the GPU pytest.
# Usage: crates/mesh-py/bundle.sh DIR   (needs maturin: python3 -m pip install maturin)
set -euo pipefail
DIR=${1:?usage: crates/mesh-py/bundle.sh DIR}
mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd) # absolute: maturin runs from the crate's directory
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
mkdir -p "$DIR/python" "$DIR/bin"
rm -f "$DIR"/python/meshd-*.whl
(cd "$HERE" && maturin build --release --quiet --out "$DIR/python")
(cd "$ROOT" && cargo build --release --quiet -p mesh-py --example peer)
cp "${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/peer" "$DIR/bin/peer"
rm -rf "$DIR/python/tests" "$DIR/python/bench"
cp -r "$HERE/tests" "$DIR/python/tests"
cp -r "$HERE/bench" "$DIR/python/bench"
rm -rf "$DIR/python/tests/__pycache__"
echo "added $(ls "$DIR"/python/meshd-*.whl), python/tests, python/bench and bin/peer to $DIR"
