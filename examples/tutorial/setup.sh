#!/usr/bin/env bash
# The tutorial's first step: build meshd and install the Python package, from the repository root.
set -euo pipefail
cd "$(dirname "$0")/../.."
# doc:begin setup
cargo build --release -p meshd -p mesh-mps-worker
export PATH=$PWD/target/release:$PATH
pip install ./crates/mesh-py
cd examples/tutorial
# doc:end setup
