#!/usr/bin/env bash
# The README's two commands, run from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
# doc:begin demo
cargo xtask demo
# doc:end demo
# doc:begin test
cargo xtask test
# doc:end test
