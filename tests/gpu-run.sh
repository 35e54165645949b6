#!/usr/bin/env bash
# The `run` script of a GPU bundle (`cargo xtask gpu-test --bundle DIR`), for a GPU machine without cargo.
# Compiles the test programs to PTX with nvcc (none is committed: without nvcc the GPU tests fail),
# in parallel, then runs every GPU test binary and the GPU benchmarks under timeouts, and prints a table last; exits 1, naming them,
# when any of them failed (a row with a non-zero rc).
# Usage: ./run [tests|bench|all|chan|lean|service|examples|chaos [blink|mps]|only NAME[:FILTER][@SECS]...]   (default all). Logs go to $OUT (default ./out);
# the benchmarks' figures to $OUT/results.jsonl, one JSON line each (bench/README.md), stamped with the commit in
# ./COMMIT (written by `cargo xtask gpu-test --bundle`); `cargo xtask bench-report --compare OLD NEW` compares two.
# lean: the g2g probe, then `mesh-gpu-bench g2g-lean blink`
#   (ping_x_lean <-> echo_x_lean beside ping <-> echo_header, device channels, capacity 4/16/64/256).
# only: the named test binaries alone, in order (NAME is bin/test-NAME, or bin/NAME; FILTER a test name
#   filter as cargo's test binaries take it; SECS each one's limit, default 300): ./run only mps_adopt chaos:chaos_mps@560.
#   Environment such as MESH_CHAOS_SECS passes through; test-images and test-native get their nvcc builds.
# chan: the channel work alone: the raw probes, the round-trip benchmarks of both modes, test-channels.
# service: the service alone: bin/test-service (both modes, MESH_SERVICE_SECS per mode, default 24),
#   `mesh-gpu-bench service blink|mps` and `fanin-host`.
# chaos: the chaos test alone, MESH_CHAOS_SECS (default 240) per mode: one mode at a time fits in 10
# minutes (./run chaos blink; ./run chaos mps); MESH_CHAOS_SEED=N replays a schedule;
# MPS mode runs under meshd's default orphan grace (a kill -9 then adopts); MESH_CHAOS_ORPHAN_GRACE_MS=N sets it (0: relaunches).
# In ./run tests (and all) the chaos test runs 20 s per mode unless MESH_CHAOS_SECS says otherwise, and
# the service test (32 shards over 4 blocks of 256, the README's 64-client recipe) runs a second time with
# one warp serving 8 shards, the README's smaller service in a block of 32 (MESH_SERVICE_SECS, default 12, a mode).
set -u
cd "$(dirname "$0")"
HERE=$PWD
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
WHAT=${1:-all}
RESULTS=$OUT/results.jsonl
rm -f "$RESULTS"  # one results file a run
# Every benchmark run appends its figures to the one results file of this run.
BENCH=(bin/mesh-gpu-bench --results "$RESULTS" --commit "$(cat COMMIT 2>/dev/null || echo unknown)")
export MESH_GPU_TESTS=1 MESH_PROGRAMS=$HERE/programs PATH=$HERE/bin:$PATH RUST_BACKTRACE=1
declare -a ROWS

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
# Every run (chaos and chan too) compiles every program, in parallel, one nvcc per core; a PTX left
# from an earlier run is removed first, so a program nvcc refuses has none and its tests say so.
if [ -x "$NVCC" ]; then
  rm -f programs/*.ptx
  rm -rf "$OUT/nvcc" && mkdir -p "$OUT/nvcc"
  export NVCC OUT
  ls programs/*.cu | xargs -P "$(nproc)" -I{} bash -c '
    cu={}; name=$(basename "${cu%.cu}")
    if timeout 120 "$NVCC" -ptx -arch=compute_80 -I programs -o "${cu%.cu}.ptx" "$cu" >"$OUT/nvcc/$name.log" 2>&1; then
      touch "$OUT/nvcc/$name.ok"
    fi'
  total=$(ls programs/*.cu | wc -l)
  ok=$(ls "$OUT"/nvcc/*.ok 2>/dev/null | wc -l)
  failed=$(for cu in programs/*.cu; do n=$(basename "${cu%.cu}"); [ -e "$OUT/nvcc/$n.ok" ] || printf '%s ' "$n"; done)
  for l in "$OUT"/nvcc/*.log; do echo "== $(basename "${l%.log}")"; cat "$l"; done >"$OUT/nvcc.log" 2>/dev/null
  ROWS+=("nvcc -ptx|$ok/$total programs${failed:+ rc=1 (FAILED: ${failed% }; nvcc.log)}")
else
  ROWS+=("nvcc -ptx|rc=1 no nvcc (not on PATH, not at /usr/local/cuda/bin/nvcc; set NVCC): the programs have no PTX")
fi

# --- image kinds (tests/tests/images.rs): every form nvcc makes, from heartbeat.cu, into programs/images/ ---
# `only` builds what its binaries need: the image kinds for test-images, native-cuda for test-native.
ONLY_ARGS=" ${*:2} "
needs() { [ "$WHAT" != only ] || [[ "$ONLY_ARGS" == *" $1"[:@\ ]* || "$ONLY_ARGS" == *" test-$1"[:@\ ]* ]]; }
if [ -x "$NVCC" ] && [ "$WHAT" != chan ] && [ "$WHAT" != chaos ] && [ "$WHAT" != lean ] && [ "$WHAT" != service ] && needs images; then
  IMG=programs/images; mkdir -p "$IMG"; img_ok=0; img_total=0
  img() { # img FILE NVCC-ARGS...: one form; a failed build leaves no file, so the test skips that form
    local file=$1; shift; img_total=$((img_total + 1))
    echo "== nvcc $* -o $IMG/$file" >>"$OUT/nvcc-images.log"
    if timeout 120 "$NVCC" -I programs "$@" -o "$IMG/$file" programs/heartbeat.cu >>"$OUT/nvcc-images.log" 2>&1; then
      img_ok=$((img_ok + 1))
    else
      rm -f "$IMG/$file"
    fi
  }
  img heartbeat.sm_90.cubin -cubin -arch=sm_90
  img heartbeat.sm_80.cubin -cubin -arch=sm_80
  img heartbeat.dc.sm_90.cubin -cubin -dc -arch=sm_90
  img heartbeat.sm_90.fatbin -fatbin -gencode arch=compute_90,code=sm_90
  img heartbeat.compute_90.fatbin -fatbin -gencode arch=compute_90,code=compute_90
  # code=lto_90 alone asks for LTO-IR: CUDA 13's nvcc refuses -dlto beside -gencode ("'-dlto' conflicts with '-gencode'")
  img heartbeat.lto_90.fatbin -fatbin -gencode arch=compute_90,code=lto_90
  if [ ! -s "$IMG/heartbeat.lto_90.fatbin" ]; then # older nvcc wants relocatable device code for LTO-IR
    img_total=$((img_total - 1)); img heartbeat.lto_90.fatbin -fatbin -rdc=true -gencode arch=compute_90,code=lto_90
  fi
  # compressed SASS (zstd): relocatable SASS is compressed by default (CUDA 12.8+), executable SASS with -compress-mode=size
  img heartbeat.dc.sm_90.fatbin -fatbin -dc -gencode arch=compute_90,code=sm_90
  img heartbeat.sm_90.size.fatbin -fatbin -compress-mode=size -gencode arch=compute_90,code=sm_90
  img heartbeat.host.o -dc -arch=sm_90
  img_total=$((img_total + 1))
  if [ -s "$IMG/heartbeat.sm_90.cubin" ]; then
    half=$(( $(stat -c %s "$IMG/heartbeat.sm_90.cubin") / 2 ))
    head -c "$half" "$IMG/heartbeat.sm_90.cubin" >"$IMG/heartbeat.sm_90.truncated.cubin" && img_ok=$((img_ok + 1))
  fi
  (cd "$IMG" && for f in *; do printf '%s %s bytes: %s\n' "$f" "$(stat -c %s "$f")" "$(od -An -tx1 -N64 "$f" | tr -s ' \n' ' ')"; done) >>"$OUT/nvcc-images.log" 2>&1
  ROWS+=("nvcc image kinds|$img_ok/$img_total forms (log: nvcc-images.log)")
fi
# --- end image kinds ---

# --- native-cuda (examples/native-cuda, run by bin/test-native): nvcc against mesh-shm-c's static library ---
if [ -x "$NVCC" ] && [ -f native/libmesh_shm_c.a ] && [ "$WHAT" != chan ] && [ "$WHAT" != chaos ] && [ "$WHAT" != lean ] && [ "$WHAT" != service ] && needs native; then
  if timeout 300 "$NVCC" -O2 -arch=sm_90 -I programs -I native -o bin/native-cuda native/native_echo.cu \
      native/libmesh_shm_c.a -lpthread -ldl -lm >"$OUT/nvcc-native.log" 2>&1; then
    ROWS+=("nvcc native-cuda|built bin/native-cuda")
  else
    ROWS+=("nvcc native-cuda|FAILED (log: nvcc-native.log): test-native skips the exchange")
  fi
fi
# --- end native-cuda ---

# --- raw probes (tests/probes): the limits the channel benchmarks stand beside, in the same run ---
probes() {
  [ -x "$NVCC" ] || { echo "probes: no nvcc"; return; }
  for p in ll_roundtrip g2g; do
    timeout 180 "$NVCC" -O3 -arch=sm_90 -std=c++17 -o "bin/$p" "probes/$p.cu" >>"$OUT/nvcc-probes.log" 2>&1 || echo "probe $p: nvcc failed"
  done
  echo "== LL probe ($1)"; [ -x bin/ll_roundtrip ] && timeout -k 5 120 bin/ll_roundtrip
  echo "== g2g probe ($1)"; [ -x bin/g2g ] && timeout -k 5 120 bin/g2g
}
if [ "$WHAT" = chan ]; then
  {
    probes "plain context"
    timeout -k 10 90 "${BENCH[@]}" rt blink; echo "rt blink rc=$?"
    timeout -k 10 90 "${BENCH[@]}" g2g blink; echo "g2g blink rc=$?"
    timeout -k 10 90 "${BENCH[@]}" rt mps; echo "rt mps rc=$?"
    timeout -k 10 90 "${BENCH[@]}" g2g mps; echo "g2g mps rc=$?"
    [ -x bin/ll_roundtrip ] && { echo "== LL probe, raw word again (drift)"; timeout -k 5 60 bin/ll_roundtrip | head -1; }
  } 2>&1 | tee "$OUT/chan-bench.log"
  ROWS+=("chan bench|$(grep -c 'rc=0' "$OUT/chan-bench.log")/4 rc=0 (log: chan-bench.log)")
  for t in ${CHAN_TESTS:-bin/test-channels bin/test-[a-bd-z]* bin/test-c[a-gi-z]*}; do
    name=$(basename "$t")
    timeout -k 10 150 "$t" --test-threads=1 --nocapture ${CHAN_FILTER:-} >"$OUT/$name.log" 2>&1
    rc=$?
    ROWS+=("$name|rc=$rc $(grep -E '^test result:' "$OUT/$name.log" | tail -1)")
    grep -E '^test .* (FAILED|ok)$|^channel-' "$OUT/$name.log" | sed "s/^/  [$name] /"
  done
fi

if [ "$WHAT" = lean ]; then
  {
    probes "plain context"
    for v in echo_x_lean ping_x_lean; do [ -e "$OUT/nvcc/$v.ok" ] || echo "$v: not compiled (nvcc.log)"; done
    timeout -k 10 400 "${BENCH[@]}" g2g-lean "${LEAN_MODE:-blink}"; echo "g2g-lean rc=$?"
  } 2>&1 | tee "$OUT/lean-bench.log"
  ROWS+=("g2g-lean bench|$(grep -c 'rc=0' "$OUT/lean-bench.log")/1 rc=0 (log: lean-bench.log)")
fi

if [ "$WHAT" = service ]; then
  timeout -k 10 400 bin/test-service --test-threads=1 --nocapture >"$OUT/test-service.log" 2>&1
  rc=$?
  ROWS+=("test-service|rc=$rc $(grep -E '^test result:' "$OUT/test-service.log" | tail -1) (log: test-service.log)")
  grep -E '^test .* (FAILED|ok)$|^service |^\||^longest wait' "$OUT/test-service.log"
  grep -E 'panicked' -A5 "$OUT/test-service.log" | head -30
  for mode in blink mps; do
    timeout -k 10 300 "${BENCH[@]}" service $mode >"$OUT/bench-service-$mode.log" 2>&1
    ROWS+=("mesh-gpu-bench service $mode|rc=$? (log: bench-service-$mode.log)")
    cat "$OUT/bench-service-$mode.log"
  done
  # The fan-in ring's host side alone (no GPU): what the senders' protocol allows on this host's CPUs.
  timeout -k 5 60 "${BENCH[@]}" fanin-host >"$OUT/bench-fanin-host.log" 2>&1
  ROWS+=("mesh-gpu-bench fanin-host|rc=$? (log: bench-fanin-host.log)")
  cat "$OUT/bench-fanin-host.log"
fi

if [ "$WHAT" = chaos ]; then
  for mode in ${2:-blink mps}; do
    timeout -k 10 560 bin/test-chaos --exact "chaos_$mode" --test-threads=1 --nocapture >"$OUT/chaos-$mode.log" 2>&1
    rc=$?
    ROWS+=("chaos $mode|rc=$rc $(grep -E '^test result:' "$OUT/chaos-$mode.log" | tail -1) (log: chaos-$mode.log)")
    grep -E '^chaos |^\||^max recovery|^meshd \(' "$OUT/chaos-$mode.log"
    grep -E 'panicked' -A3 "$OUT/chaos-$mode.log" | head -20
  done
fi

if [ "$WHAT" = only ]; then
  for spec in "${@:2}"; do
    secs=300
    [[ "$spec" == *@* ]] && { secs=${spec##*@}; spec=${spec%@*}; }
    name=${spec%%:*}; filter=""
    [[ "$spec" == *:* ]] && filter=${spec#*:}
    t=bin/test-$name; [ -x "$t" ] || t=bin/$name
    if [ ! -x "$t" ]; then
      ROWS+=("$name|rc=1 no bin/test-$name nor bin/$name in this bundle")
      continue
    fi
    log="$OUT/$(basename "$t")${filter:+-$filter}.log"
    start=$(date +%s)
    timeout -k 10 "$secs" "$t" ${filter:+"$filter"} --test-threads=1 --nocapture >"$log" 2>&1
    rc=$?
    summary=$(grep -E '^test result:' "$log" | tail -1)
    ROWS+=("$(basename "$t")${filter:+ $filter}|rc=$rc $(( $(date +%s) - start ))s ${summary:-no result line} (log: $(basename "$log"))")
    grep -E '^test .* (FAILED|ok)$' "$log" | sed "s/^/  [$(basename "$t")] /"
    grep -E 'panicked' -A6 "$log" | head -30
  done
fi

if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  for t in bin/test-*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    start=$(date +%s)
    MESH_CHAOS_SECS=${MESH_CHAOS_SECS:-20} timeout -k 10 300 "$t" --test-threads=1 --nocapture >"$OUT/$name.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    summary=$(grep -E '^test result:' "$OUT/$name.log" | tail -1)
    skipped=$(grep -c '^SKIPPED' "$OUT/$name.log")
    ROWS+=("$name|rc=$rc ${secs}s ${summary:-no result line} skipped=$skipped")
    grep -E '^test .* (FAILED|ok)$' "$OUT/$name.log" | sed "s/^/  [$name] /"
  done
  # The service once more with one warp serving all 8 shards (a block of 32: the sharded peek and take,
  # what a program loaded without --block runs), shorter.
  if [ -x bin/test-service ]; then
    start=$(date +%s)
    MESH_SERVICE_SHARDS=8 MESH_SERVICE_GRID=1 MESH_SERVICE_BLOCK=32 MESH_SERVICE_SECS=${MESH_SERVICE_SECS:-12} timeout -k 10 200 bin/test-service --test-threads=1 \
      --nocapture >"$OUT/test-service-one-warp.log" 2>&1
    rc=$?
    summary=$(grep -E '^test result:' "$OUT/test-service-one-warp.log" | tail -1)
    ROWS+=("test-service, one warp|rc=$rc $(( $(date +%s) - start ))s ${summary:-no result line}")
  fi
fi

if [ "$WHAT" = all ] || [ "$WHAT" = demo ]; then
  timeout -k 5 120 ./demo bin/meshd programs >"$OUT/demo.log" 2>&1
  ROWS+=("demo (README main job)|rc=$? $(grep -m1 'the GPU answered' "$OUT/demo.log")")
fi

# --- Python package (crates/mesh-py, added by crates/mesh-py/bundle.sh): the wheel installed without an
# index into a scratch directory, its GPU pytest (echo driven from Python), and its host <-> GPU benchmark ---
if ! ls python/meshd-*.whl >/dev/null 2>&1; then
  # Said in the table, not left out of it: a bundle built without maturin has no wheel.
  { [ "$WHAT" = all ] || [ "$WHAT" = tests ]; } && ROWS+=("pytest (Python package)|SKIPPED: no wheel in this bundle (built without maturin)")
elif command -v python3 >/dev/null; then
  PYSITE=$(mktemp -d /tmp/meshd-site.XXXXXX)
  if python3 -m pip install --no-index --no-deps --target "$PYSITE" python/meshd-*.whl >"$OUT/pytest-gpu.log" 2>&1; then
    if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
      (cd python && PYTHONPATH=$PYSITE MESHD_BIN=$HERE/bin/meshd MESH_PY_PEER=$HERE/bin/peer timeout -k 10 300 python3 -m pytest -rs -v \
        -p no:cacheprovider tests >>"$OUT/pytest-gpu.log" 2>&1)
      ROWS+=("pytest (Python package)|rc=$? $(grep -E '(passed|failed)' "$OUT/pytest-gpu.log" | tail -1)")
    fi
    if { [ "$WHAT" = all ] || [ "$WHAT" = bench ]; } && [ -x bin/peer ]; then
      PYTHONPATH=$PYSITE timeout -k 10 300 python3 python/bench/bench.py --gpu --meshd bin/meshd \
        --echo programs/echo.ptx --peer bin/peer >"$OUT/bench-python-gpu.md" 2>&1
      ROWS+=("Python bench host<->GPU|rc=$? (bench-python-gpu.md)")
      PYTHONPATH=$PYSITE timeout -k 10 300 python3 python/bench/bench.py --peer bin/peer >"$OUT/bench-python-host.md" 2>&1
      ROWS+=("Python bench host<->host|rc=$? (bench-python-host.md)")
    fi
  else
    ROWS+=("pytest (Python package)|pip could not install the wheel (pytest-gpu.log)")
  fi
  rm -rf "$PYSITE"
fi
# --- end Python package ---

# --- the docs' examples (examples/*/run.sh): each builds its program with nvcc, starts a meshd of its own
# and talks to the program from the shell and from Python (`./run examples` alone) ---
if { [ "$WHAT" = all ] || [ "$WHAT" = examples ]; } && [ -d examples ] && [ ! -x "$NVCC" ]; then
  ROWS+=("examples|SKIPPED: no nvcc to build them")
elif { [ "$WHAT" = all ] || [ "$WHAT" = examples ]; } && [ -d examples ]; then
  EXSITE=$(mktemp -d /tmp/meshd-site.XXXXXX)
  ls python/meshd-*.whl >/dev/null 2>&1 && python3 -m pip install --no-index --no-deps --target "$EXSITE" python/meshd-*.whl >/dev/null 2>&1
  for s in examples/*/run.sh; do
    n=$(basename "$(dirname "$s")")
    PATH=$(dirname "$NVCC"):$PATH PYTHONPATH=$EXSITE MESH_INCLUDE=$HERE/include timeout -k 5 240 bash "$s" >"$OUT/example-$n.log" 2>&1
    ROWS+=("example $n|rc=$? (example-$n.log)")
  done
  rm -rf "$EXSITE"
fi

if { [ "$WHAT" = all ] || [ "$WHAT" = bench ]; } && [ -x bin/mesh-gpu-bench ]; then
  timeout -k 10 300 "${BENCH[@]}" >"$OUT/bench.log" 2>&1
  ROWS+=("mesh-gpu-bench|rc=$?")
  timeout -k 10 200 "${BENCH[@]}" mps >>"$OUT/bench.log" 2>&1
  ROWS+=("mesh-gpu-bench mps|rc=$?")
  probes "plain context" >>"$OUT/bench.log" 2>&1
  for a in "rt blink" "rt-ab blink" "g2g blink" "rt mps" "rt-ab mps" "g2g mps"; do
    timeout -k 10 240 "${BENCH[@]}" $a >>"$OUT/bench.log" 2>&1
    ROWS+=("mesh-gpu-bench $a|rc=$?")
  done
  # The host round trip over a client whose time between reply and request varies (0-1.5 us, drawn for
  # each request): every path averaged over where its requests land between the GPU's polls.
  for m in blink mps; do
    timeout -k 10 240 "${BENCH[@]}" rt-ab $m --host-delay-ns 0-1500 >>"$OUT/bench.log" 2>&1
    ROWS+=("mesh-gpu-bench rt-ab $m, client 0-1.5 us|rc=$?")
  done
  # Bulk channels (large messages) beside back-to-back cudaMemcpyAsync.
  for a in "bulk blink" "bulk mps"; do
    timeout -k 10 400 "${BENCH[@]}" $a >>"$OUT/bench.log" 2>&1
    ROWS+=("mesh-gpu-bench $a|rc=$?")
  done
  # One bulk channel of P parts served by B = P blocks each end, beside copy_blocks.
  for a in "parts blink" "parts mps"; do
    timeout -k 10 300 "${BENCH[@]}" $a >>"$OUT/bench.log" 2>&1
    ROWS+=("mesh-gpu-bench $a|rc=$?")
  done
  # A service of many clients: 1, 8, 64 client processes beside the SPSC round trip through
  # echo_warp, one meshd per mode.
  for a in "service blink" "service mps"; do
    timeout -k 10 300 "${BENCH[@]}" $a >>"$OUT/bench.log" 2>&1
    ROWS+=("mesh-gpu-bench $a|rc=$?")
  done
  # A bystander's round trips while channels and services are created and deleted beside it.
  for a in "churn blink" "churn mps"; do
    timeout -k 10 120 "${BENCH[@]}" $a >>"$OUT/bench.log" 2>&1
    ROWS+=("mesh-gpu-bench $a|rc=$?")
  done
  # (MPS device channels are on by default: "g2g mps" above measures them.)
  [ -x bin/mesh-cli-bench ] && { timeout -k 10 200 bin/mesh-cli-bench >>"$OUT/bench.log" 2>&1; ROWS+=("mesh-cli-bench|rc=$?"); }
  cat "$OUT/bench.log"
fi

if [ -s "$RESULTS" ]; then
  ROWS+=("results|$(wc -l <"$RESULTS") figures in $RESULTS")
fi
echo
echo "================ meshd GPU run: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) ================"
for r in "${ROWS[@]}"; do printf '%-28s %s\n' "${r%%|*}" "${r#*|}"; done
# The exit status says whether everything passed: 1, naming the rows, when any of them failed.
failed=$(for r in "${ROWS[@]}"; do [[ "${r#*|}" =~ rc=[1-9] ]] && printf '%s, ' "${r%%|*}"; done)
if [ -n "$failed" ]; then
  echo "FAILED: ${failed%, }"
  exit 1
fi
