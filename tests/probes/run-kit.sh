#!/usr/bin/env bash
# run-kit.sh: issue 16 item 1's measurements in one command on the GPU machine, from the repository root:
#   bash tests/probes/run-kit.sh            (results under $OUT, default ./kit-out; about 2 minutes)
# Builds the LL probe and the kit (kit_ll.cu, kit_echo.cu) with the machine's nvcc, then measures:
#   1. the LL probe's kernels (raw word, one-warp LL at 8 B .. 4 KiB) over each kind of mapped host memory
#      (cudaHostAlloc as the probe; a registered /dev/shm file as meshd's mailbox; populate / THP /
#      huge-tmpfs / anonymous variants), at one fixed slot and walking a 64-slot ring;
#   2. the echo of mesh.cuh's comment (the committed PTX, the same source built here, and a copy timed
#      with clock64 inside), driven by a port of mesh-shm's client and by the probe's host loop;
#   3. a host-delay sweep, 0-1600 ns after each reply (a sawtooth in the round trip means the GPU's polls
#      quantize the wait), for the echo at 8 and 64 B and for the raw word and LL probe;
#   4. the host thread pinned to a CPU near the GPU (the last and the first of its PCI device's
#      local_cpulist), to one on another NUMA node if there is one, and unpinned, back to back.
# Every step runs under `timeout`, within an overall budget (KIT_BUDGET seconds, default 230). Prints
# the tables last (also $OUT/kit-table.md); the whole log is $OUT/kit.log, raw samples in $OUT/kit-raw-*.tar.gz.
# `bash tests/probes/run-kit.sh pollers` (issue 24 item 1, PENDING's call 3): only the poll-stream echo,
# tests/programs/echo_x_pollers.cu, built with nvcc -ptx for POLLERS x SPACING_NS (KIT_POLLERS, default
# "1:300 2:300 4:150 4:300 4:500 8:150 8:300"), each through the kit's ptx variant beside echo_header.ptx
# (built here too) and the raw word / LL probe of the same run, then the host-delay sweep for 4:300
# (KIT_POLLERS_SWEEP). Budget KIT_BUDGET (default 230 s). Tables: kit-table.sh, rows labelled pollers-kK-sS.
# Also mesh.cuh's poll-stream section as a user writes it, tests/programs/echo_poll.cu (defaults: 2 pollers,
# 300 ns), row echo-poll, --ptx-block 96, after echo_header and before the K:S rows.
# Knobs: KIT_ROUNDS (20000), KIT_SWEEP_ROUNDS (10000), NVCC, KIT_NVCC_FLAGS (e.g. -L for a pip toolchain). Written without a GPU: not yet run (2026-12-03).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/kit-out}
mkdir -p "$OUT"
LOG=$OUT/kit.log
: >"$LOG"
B=$(mktemp -d /tmp/kit-build.XXXXXX)
export KIT_RAW_DIR=$B/raw
mkdir -p "$KIT_RAW_DIR"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ROUNDS=${KIT_ROUNDS:-20000}
SWEEP_ROUNDS=${KIT_SWEEP_ROUNDS:-10000}
START=$(date +%s)
DEADLINE=$((START + ${KIT_BUDGET:-230}))
HUGE=$B/huge

cleanup() { umount "$HUGE" 2>/dev/null; rm -rf "$B"; }
trap cleanup EXIT

log() { echo "$*" | tee -a "$LOG"; }

# step NAME SECONDS CMD...: runs CMD under timeout, at most SECONDS and never past the budget (10 s are kept
# for the tables), its output appended to the log; a step that no longer fits is skipped and says so.
step() {
  local name=$1 secs=$2; shift 2
  local left=$((DEADLINE - $(date +%s) - 10))
  [ "$secs" -gt "$left" ] && secs=$left
  if [ "$secs" -lt 5 ]; then log "== $name: SKIPPED, out of time (KIT_BUDGET)"; return 1; fi
  log "== $name (timeout ${secs}s): $*"
  local t0; t0=$(date +%s%N)
  timeout -k 5 "$secs" "$@" >>"$LOG" 2>&1
  local rc=$?
  log "== $name: rc=$rc in $((($(date +%s%N) - t0) / 1000000)) ms"
  return $rc
}

# --- the machine ---
{
  echo "== machine, $(date -u +%FT%TZ), at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  uname -r
  grep -m1 'model name' /proc/cpuinfo
  echo "cpus online: $(cat /sys/devices/system/cpu/online 2>/dev/null), numa nodes: $(cat /sys/devices/system/node/online 2>/dev/null || echo none)"
  echo "cmdline: $(cat /proc/cmdline 2>/dev/null)"
  echo "iommu devices: $(ls /sys/class/iommu 2>/dev/null | tr '\n' ' ')"
  echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null); shmem: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null)"
  echo "/dev/shm: $(df -h /dev/shm 2>/dev/null | tail -1)"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,pci.bus_id,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem,pstate --format=csv 2>&1
  timeout 20 nvidia-smi topo -m 2>&1 | head -20
  echo "nvcc: $NVCC $("$NVCC" --version 2>/dev/null | tail -1)"
} >>"$LOG" 2>&1

# --- build, in parallel ---
mkdir -p "$B/bin"
log "== build ($NVCC)"
(timeout -k 5 170 "$NVCC" -O3 -arch=sm_90 -std=c++17 ${KIT_NVCC_FLAGS:-} -o "$B/bin/ll_roundtrip" tests/probes/ll_roundtrip.cu >"$B/b1.log" 2>&1) &
(timeout -k 5 170 "$NVCC" -O3 -arch=sm_90 -std=c++17 ${KIT_NVCC_FLAGS:-} -o "$B/bin/kit_ll" tests/probes/kit_ll.cu >"$B/b2.log" 2>&1) &
(timeout -k 5 170 "$NVCC" -O3 -arch=sm_90 -std=c++17 ${KIT_NVCC_FLAGS:-} -I crates/mesh-shm/include -o "$B/bin/kit_echo" tests/probes/kit_echo.cu >"$B/b3.log" 2>&1) &
wait
cat "$B"/b?.log >>"$LOG"
for p in ll_roundtrip kit_ll kit_echo; do [ -x "$B/bin/$p" ] || log "== build: $p FAILED (see the log)"; done
log "== build done at +$(($(date +%s) - START))s"
LL=$B/bin/kit_ll
ECHO=$B/bin/kit_echo
# The timed kernel's machine code, to check where the clock reads sit against the loads (in the archive).
CUOBJDUMP=$(dirname "$NVCC")/cuobjdump
[ -x "$CUOBJDUMP" ] || CUOBJDUMP=$(command -v cuobjdump || true)
[ -n "$CUOBJDUMP" ] && [ -x "$ECHO" ] && timeout 30 "$CUOBJDUMP" -sass "$ECHO" >"$KIT_RAW_DIR/sass-kit_echo.txt" 2>&1
[ -n "$CUOBJDUMP" ] && [ -x "$LL" ] && timeout 30 "$CUOBJDUMP" -sass "$LL" >"$KIT_RAW_DIR/sass-kit_ll.txt" 2>&1

# --- where the GPU is, which CPUs are near it ---
expand() { # a cpulist ("0-3,8") as words
  local IFS=,; for r in $1; do if [[ $r == *-* ]]; then seq "${r%-*}" "${r#*-}"; elif [ -n "$r" ]; then echo "$r"; fi; done
}
INFO=$(timeout 30 "$LL" --info 2>&1); echo "$INFO" >>"$LOG"
GPU_CPUS=$(echo "$INFO" | sed -n 's/^KIT_GPU_CPUS=//p')
ONLINE=$(echo "$INFO" | sed -n 's/^KIT_ONLINE_CPUS=//p')
[ -z "$ONLINE" ] && ONLINE=$(cat /sys/devices/system/cpu/online 2>/dev/null)
NEAR=$(expand "${GPU_CPUS:-$ONLINE}" | tail -1)                # the last CPU near the GPU (CPU 0 takes the most interrupts)
FIRST=$(expand "${GPU_CPUS:-$ONLINE}" | head -1)               # the first: often the one that takes the device's interrupts
FAR=$(comm -23 <(expand "$ONLINE" | sort) <(expand "${GPU_CPUS:-$ONLINE}" | sort) | sort -n | tail -1)
log "== GPU node $(echo "$INFO" | sed -n 's/^KIT_GPU_NODE=//p'), local CPUs [${GPU_CPUS}], online [${ONLINE}]: near CPU ${NEAR:-none}, first ${FIRST:-none}, far CPU ${FAR:-none (one node)}"

# --- issue 24 item 1: the poll-stream echo only (`run-kit.sh pollers`) ---
if [ "${1:-}" = pollers ]; then
  R=(--rounds "$ROUNDS"); SR=(--rounds "$SWEEP_ROUNDS")
  PT=$B/ptx
  mkdir -p "$PT"
  "$NVCC" -ptx -arch=compute_80 -I crates/mesh-shm/include -o "$PT/echo_header.ptx" tests/programs/echo_header.cu >>"$LOG" 2>&1 ||
    log "== nvcc echo_header FAILED"
  "$NVCC" -ptx -arch=compute_80 -I crates/mesh-shm/include -I tests/programs -o "$PT/echo_poll.ptx" tests/programs/echo_poll.cu >>"$LOG" 2>&1 ||
    log "== nvcc echo_poll FAILED"
  for ks in ${KIT_POLLERS:-1:300 2:300 4:150 4:300 4:500 8:150 8:300}; do
    k=${ks%:*}; s=${ks#*:}
    "$NVCC" -ptx -arch=compute_80 -I crates/mesh-shm/include -DPOLLERS="$k" -DSPACING_NS="$s" \
      -o "$PT/pollers-k$k-s$s.ptx" tests/programs/echo_x_pollers.cu >>"$LOG" 2>&1 || log "== nvcc echo_x_pollers K=$k S=$s FAILED"
  done
  cp "$PT"/*.ptx "$OUT/" 2>/dev/null
  step "p0 raw and LL" 40 "$LL" "${R[@]}" --kinds hostalloc,shm --sizes raw,8,64,256,1024 --layouts fixed
  step "p1 echo_header" 40 "$ECHO" "${R[@]}" --label header --kinds shm --variants ptx --hostloops mesh \
    --sizes 8,64,256,1024 --ptx "$PT/echo_header.ptx"
  [ -f "$PT/echo_poll.ptx" ] && step "p1 echo_poll" 30 "$ECHO" "${R[@]}" --label echo-poll --kinds shm --variants ptx --hostloops mesh \
    --sizes 8,64,256,1024 --ptx "$PT/echo_poll.ptx" --ptx-block 96
  for ks in ${KIT_POLLERS:-1:300 2:300 4:150 4:300 4:500 8:150 8:300}; do
    k=${ks%:*}; s=${ks#*:}
    [ -f "$PT/pollers-k$k-s$s.ptx" ] || continue
    step "p2 pollers K=$k S=$s" 30 "$ECHO" "${R[@]}" --label "pollers-k$k-s$s" --kinds shm --variants ptx --hostloops mesh \
      --sizes 8,64,256,1024 --ptx "$PT/pollers-k$k-s$s.ptx" --ptx-block $((32 * (k + 1)))
  done
  ks=${KIT_POLLERS_SWEEP:-4:300}; k=${ks%:*}; s=${ks#*:}
  [ -f "$PT/pollers-k$k-s$s.ptx" ] && step "p3 sweep pollers K=$k S=$s" 50 "$ECHO" "${SR[@]}" --label "sweep-pollers-k$k-s$s" \
    --kinds shm --variants ptx --hostloops mesh --sizes 8,64,256 --delays 0:1600:100 --ptx "$PT/pollers-k$k-s$s.ptx" \
    --ptx-block $((32 * (k + 1)))
  step "p4 drift raw word" 20 "$LL" "${R[@]}" --label drift --kinds shm --sizes raw --layouts fixed
  log "== total +$(($(date +%s) - START))s"
  bash "$ROOT/tests/probes/kit-table.sh" "$LOG" | tee "$OUT/kit-table.md"
  exit 0
fi

# --- a tmpfs with huge pages, for the tmpfs-huge kind (the mailbox's recipe on 2 MiB pages) ---
mkdir -p "$HUGE"
if mount -t tmpfs -o huge=always,size=512m,mode=0700 kit-huge "$HUGE" 2>>"$LOG"; then
  export KIT_HUGE_DIR=$HUGE
else
  log "== tmpfs huge=always: mount refused; the tmpfs-huge rows are skipped"
fi

KINDS=hostalloc,shm,shm-populate,shm-thp,tmpfs-huge,anon,anon-thp,hugetlb
R=(--rounds "$ROUNDS")
SR=(--rounds "$SWEEP_ROUNDS")

# 0. the LL probe as committed (the reference the kit's hostalloc/fixed rows must reproduce)
step "probe ll_roundtrip (as committed)" 60 "$B/bin/ll_roundtrip"
# 1. the LL probe's kernels over each kind of memory
step "1 ll x memory" 100 "$LL" "${R[@]}" --kinds "$KINDS" --sizes raw,8,64,256,1024,4096 --layouts fixed,ring
# 2. the echo: as meshd runs it (ptx), built here (kit), both host loops; then the timeline
step "2a echo x memory x host loop" 100 "$ECHO" "${R[@]}" --kinds hostalloc,shm,tmpfs-huge --variants ptx,kit --hostloops mesh,probe
step "2b echo timeline" 60 "$ECHO" "${R[@]}" --kinds hostalloc,shm --variants timed --hostloops mesh,probe
# 3. host-delay sweep
step "3a sweep echo" 60 "$ECHO" "${SR[@]}" --kinds shm --variants kit --hostloops mesh --sizes 8,64 --delays 0:1600:100 --label sweep
step "3b sweep echo timed 8 B" 40 "$ECHO" "${SR[@]}" --kinds shm --variants timed --hostloops mesh --sizes 8 --delays 0:1600:100 --hist 0 --csv 0 --label sweep
step "3c sweep raw and LL" 60 "$LL" "${SR[@]}" --kinds shm --sizes raw,8,64 --layouts fixed,ring --delays 0:1600:100 --label sweep
# 4. pinned near the GPU, far from it, unpinned: back to back, same cases
for where in unpinned near first far; do
  case $where in unpinned) cpu=-1 ;; near) cpu=${NEAR:-} ;; first) cpu=${FIRST:-} ;; far) cpu=${FAR:-} ;; esac
  [ "$where" = first ] && [ "${FIRST:-}" = "${NEAR:-}" ] && continue
  if [ -z "$cpu" ]; then log "== 4 $where: no such CPU on this machine"; continue; fi
  step "4 ll $where" 30 "$LL" "${R[@]}" --cpu "$cpu" --label "pin-$where" --kinds hostalloc,shm --sizes raw,64,1024 --layouts fixed
  step "4 echo $where" 30 "$ECHO" "${R[@]}" --cpu "$cpu" --label "pin-$where" --kinds shm --variants kit --hostloops mesh --sizes 8,64,1024
done
# drift: the raw word again at the end
step "drift raw word" 20 "$LL" "${R[@]}" --label drift --kinds hostalloc,shm --sizes raw --layouts fixed

# --- raw data back: three archives (the device tool brings back at most 8 files of 16 MiB each) ---
pack() { # pack NAME PATTERN...: the raw files matching the patterns into $OUT/NAME.tar.gz, if under 15 MiB
  local name=$1; shift
  local files; files=$(cd "$KIT_RAW_DIR" && for p in "$@"; do ls $p 2>/dev/null; done)
  [ -z "$files" ] && return
  (cd "$KIT_RAW_DIR" && tar -czf "$OUT/$name.tar.gz" $files) 2>>"$LOG"
  local size; size=$(stat -c %s "$OUT/$name.tar.gz" 2>/dev/null || echo 0)
  if [ "$size" -gt $((15 << 20)) ]; then
    rm -f "$OUT/$name.tar.gz"; log "== $name: $size bytes, over 15 MiB: not kept"
  else
    log "== $name.tar.gz: $(echo "$files" | wc -l) files, $size bytes"
  fi
}
pack kit-raw-timeline 'timeline-*' 'sass-*'
pack kit-raw-rtt 'll-unpinned-*' 'echo-unpinned-*' 'll-drift-*'
pack kit-raw-sweep-pin '*-sweep-*' '*-pin-*'
log "== total +$(($(date +%s) - START))s"

# --- the tables ---
bash "$ROOT/tests/probes/kit-table.sh" "$LOG" | tee "$OUT/kit-table.md"
