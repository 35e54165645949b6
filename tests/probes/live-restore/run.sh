#!/usr/bin/env bash
# run.sh: can resident GPU programs outlive the daemon that started them? Five questions, each measured on
# the GPU machine, from the repository root:
#   bash tests/probes/live-restore/run.sh OUTDIR        (or OUT=OUTDIR; default ./live-restore-out)
# Q1 an MPS client (and, as a control, a plain process) whose parent is killed -9: does its kernel go on?
# Q2 an MPS control daemon whose parent is killed -9: -f with its output piped into that parent (SIGPIPE
#    as inherited, and ignored from the start), and -d.
# Q3 a VMM allocation (POSIX fd) whose exporter is killed -9 while an importer maps it and a third imports it.
# Q4 the teardown of a killed context: heartbeat stop, reaping, next context, a bystander's gap (plain, MPS).
# Q5 a standby context beside a running kernel: the kernel's gaps while it is created, loads, registers.
# Builds lr_probe.cu (nvcc) and lr_parent.c (gcc), runs every step under `timeout` within RUN_BUDGET seconds
# (default 360), prints one RESULT line per answer and a table last (also OUTDIR/summary.txt). Full logs:
# OUTDIR/run.log and one file per process, flat. Every process it starts carries LR_PROBE_TAG (the private
# temporary directory) in its environment: the exit trap quits the MPS daemons and kills whatever carries it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-${OUT:-$PWD/live-restore-out}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/run.log
SUMMARY=$OUT/summary.txt
: >"$LOG"
: >"$SUMMARY"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
MPS_BIN=${MPS_BIN:-/usr/local/nvidia/bin}
CTL=$MPS_BIN/nvidia-cuda-mps-control
START=$(date +%s)
DEADLINE=$((START + ${RUN_BUDGET:-360}))
T=$(mktemp -d /dev/shm/lr.XXXXXX)
export LR_PROBE_TAG=$T
P=$T/lr_probe
MPS_NAMES=""
SERVERS=""

log() { echo "$*" | tee -a "$LOG"; }
result() { # result ID ANSWER DETAIL
  printf 'RESULT %-22s %-10s %s\n' "$1" "$2" "$3" | tee -a "$LOG"
  printf '| %-22s | %-10s | %s |\n' "$1" "$2" "$3" >>"$SUMMARY"
}
left() { echo $((DEADLINE - $(date +%s))); }
# enough SECS: false (and says so) when fewer than SECS seconds of the budget are left.
enough() {
  if [ "$(left)" -lt "$1" ]; then log "== out of budget: skipping $2"; result "$2" SKIPPED "out of time (RUN_BUDGET)"; return 1; fi
}
# run_to SECS CMD...: CMD under timeout, output appended to the log.
run_to() { local s=$1; shift; timeout -k 3 "$s" "$@" >>"$LOG" 2>&1; }

# --- MPS daemons: NAME -> $T/mps-NAME/{pipe,log}
mps_pipe() { echo "$T/mps-$1/pipe"; }
mps_envp() { ENVP=(env "CUDA_MPS_PIPE_DIRECTORY=$T/mps-$1/pipe" "CUDA_MPS_LOG_DIRECTORY=$T/mps-$1/log"); }
mps_dirs() { mkdir -p "$T/mps-$1/pipe" "$T/mps-$1/log"; MPS_NAMES="$MPS_NAMES $1"; }
mps_ctl() { # mps_ctl NAME COMMAND: the answer on stdout; rc 124 when it did not answer in 10 s
  echo "$2" | CUDA_MPS_PIPE_DIRECTORY="$T/mps-$1/pipe" CUDA_MPS_LOG_DIRECTORY="$T/mps-$1/log" timeout -k 2 10 "$CTL"
}
mps_ready() { # waits up to 15 s for the daemon to answer get_server_list
  local i
  for i in $(seq 60); do mps_ctl "$1" get_server_list >/dev/null 2>&1 && return 0; sleep 0.25; done
  return 1
}
mps_start_d() {
  mps_dirs "$1"
  CUDA_MPS_PIPE_DIRECTORY="$T/mps-$1/pipe" CUDA_MPS_LOG_DIRECTORY="$T/mps-$1/log" timeout 20 "$CTL" -d >>"$LOG" 2>&1
  mps_ready "$1"
}
# mps_servers NAME: the daemon's server pids, also kept in SERVERS for the cleanup (call it outside $(...)).
mps_servers() { local s; s=$(mps_ctl "$1" get_server_list 2>/dev/null); SERVERS="$SERVERS $s"; echo "$s"; }
mps_quit() {
  local name=$1
  mps_servers "$name" >/dev/null
  mps_ctl "$name" quit >>"$LOG" 2>&1
  local i
  for i in $(seq 40); do
    if [ -z "$(pids_of "$T/mps-$name/")" ]; then MPS_NAMES=$(echo " $MPS_NAMES " | sed "s/ $name / /"); return 0; fi
    sleep 0.25
  done
  log "MPS $name: still there after quit: $(pids_of "$T/mps-$name/")"
  return 1
}
# pids_of STRING: processes (not this shell) whose environment mentions STRING.
pids_of() {
  local p pid out=""
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    grep -qsF -- "$1" "$p/environ" 2>/dev/null && out="$out $pid"
  done
  echo $out
}
exe_of() { basename "$(readlink "/proc/$1/exe" 2>/dev/null)" 2>/dev/null; }
alive() { [ -d "/proc/$1" ] && ! grep -qs '^State:.*Z' "/proc/$1/status"; }
# wait_pid PID SECS: waits for this shell's child PID up to SECS, then kills it; its exit status (137 if killed).
wait_pid() {
  local i
  for i in $(seq $(($2 * 10))); do alive "$1" || break; sleep 0.1; done
  alive "$1" && kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" | tail -1; } # field NAME < line

cleanup() {
  trap - EXIT INT TERM
  export -n LR_PROBE_TAG
  local p pids
  log "== cleanup"
  # Clients first: an MPS quit waits for its clients.
  for p in $(pids_of "$T"); do
    case "$(exe_of "$p")" in nvidia-cuda-mps-control | nvidia-cuda-mps-server) ;; *) local e; e=$(exe_of "$p"); kill -9 "$p" 2>/dev/null && log "killed $p ($e)" ;; esac
  done
  sleep 1
  for p in $MPS_NAMES; do mps_quit "$p"; done
  pids=$(pids_of "$T")
  for p in $SERVERS; do case $p in *[!0-9]*) ;; *) alive "$p" && [ "$(exe_of "$p")" = nvidia-cuda-mps-server ] && pids="$pids $p" ;; esac; done
  for p in $pids; do local e; e=$(exe_of "$p"); kill -9 "$p" 2>/dev/null && log "killed leftover $p ($e)"; done
  sleep 2
  pids=$(pids_of "$T")
  log "leftover processes: ${pids:-none}"
  timeout 20 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >>"$LOG" 2>&1
  rm -rf "$T"
  {
    echo
    echo "## live-restore probes ($(date -u +%FT%TZ), $(( $(date +%s) - START )) s)"
    echo "| question | answer | detail |"
    echo "| --- | --- | --- |"
    cat "$SUMMARY"
    echo "leftover processes: ${pids:-none}"
  } | tee "$SUMMARY.tmp"
  mv "$SUMMARY.tmp" "$SUMMARY"
  cat "$SUMMARY" >>"$LOG"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the machine and the build
{
  echo "== machine $(date -u +%FT%TZ) $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null)"
  uname -r
  timeout 20 nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv
  ls -l "$CTL" "$MPS_BIN/nvidia-cuda-mps-server"
  "$NVCC" --version | tail -2
} >>"$LOG" 2>&1
log "== build"
gcc -O2 -Wall -o "$T/lr_parent" "$HERE/lr_parent.c" >>"$LOG" 2>&1 || { result build FAIL "gcc lr_parent.c (see run.log)"; exit 1; }
# -lcuda from the driver's libcuda.so, else from the toolkit's stub (same soname: the driver's loads at run time).
if ! run_to 200 "$NVCC" -O2 -arch=sm_90 -std=c++17 -o "$P" "$HERE/lr_probe.cu" -lcuda &&
  ! run_to 200 "$NVCC" -O2 -arch=sm_90 -std=c++17 -o "$P" "$HERE/lr_probe.cu" -L"$(dirname "$NVCC")/../lib64/stubs" -lcuda; then
  result build FAIL "nvcc lr_probe.cu (see run.log)"
  exit 1
fi
PARENT=$T/lr_parent
log "== built in $(( $(date +%s) - START )) s"

# --- Q1: an MPS client whose parent died (and a plain process, the control)
q1() { # q1 LABEL [MPS-NAME]
  local p L=$1 shm=$T/q1-$1.shm pidf=$T/q1-$1.pid clog=$OUT/q1-$1-client.log
  ENVP=(env)
  [ -n "${2:-}" ] && mps_envp "$2"
  log "== Q1 $L"
  "${ENVP[@]}" "$PARENT" file "$clog" "$pidf" "$P" hb "$shm" 60 >>"$OUT/q1-$L-parent.log" 2>&1 &
  local ppid=$!
  if ! "$P" wait-adv "$shm" 30000 2>>"$LOG"; then
    result "Q1-$L-runs-on" FAIL "the client's kernel did not start (see q1-$L-client.log)"
    kill -9 "$ppid" "$(cat "$pidf" 2>/dev/null)" 2>/dev/null; wait "$ppid" 2>/dev/null; return
  fi
  local cpid; cpid=$(cat "$pidf")
  "$P" reset "$shm"
  local base; base=$("$P" adv "$shm" 500)
  "$P" reset "$shm"
  kill -9 "$ppid"; wait "$ppid" 2>/dev/null
  sleep 2
  local after; after=$("$P" adv "$shm" 500); local arc=$?
  local newppid; newppid=$(sed 's/.*) . \([0-9]*\).*/\1/' "/proc/$cpid/stat" 2>/dev/null)
  log "Q1 $L before: $base"
  log "Q1 $L 2 s after the parent's kill -9: $after (client pid $cpid, parent now $newppid)"
  if [ -n "${2:-}" ]; then
    mps_servers "$2" >"$T/servers"
    local srv listed=NO; srv=$(cat "$T/servers")
    for p in $srv; do mps_ctl "$2" "get_client_list $p" 2>/dev/null | grep -qx "$cpid" && listed=YES; done
    log "Q1 $L servers: $srv; the orphaned client $cpid in get_client_list: $listed"
    result "Q1-$L-client-listed" "$listed" "the orphaned client's pid is in its MPS server's get_client_list (servers: $srv)"
  fi
  "$P" stop "$shm"
  "$P" wait-done "$shm" 10000; local drc=$?
  local i; for i in $(seq 100); do alive "$cpid" || break; sleep 0.1; done
  local gone=yes; alive "$cpid" && gone=no
  "$P" show "$shm" >>"$LOG" 2>&1
  local mps; mps=$(grep -m1 -o 'mps_enabled=[-0-9]*' "$clog")
  if [ $arc -eq 0 ]; then
    result "Q1-$L-runs-on" YES "heartbeat advancing 2 s after the parent's kill -9; $mps; reparented to $newppid; max gap since just before the kill $(echo "$after" | field max_gap_us) us (500 ms before: $(echo "$base" | field max_gap_us) us)"
  else
    result "Q1-$L-runs-on" NO "heartbeat stopped after the parent's kill -9 ($after)"
  fi
  if [ $drc -eq 0 ] && [ $gone = yes ]; then
    result "Q1-$L-stop-word" YES "kernel left on the stop word, the stream ended cleanly and the process exited"
  else
    result "Q1-$L-stop-word" NO "wait-done rc=$drc, process gone=$gone (see q1-$L-client.log)"
    kill -9 "$cpid" 2>/dev/null
  fi
}

# --- Q2: an MPS control daemon whose parent (the reader of its output pipe) died
q2() { # q2 VARIANT FLAG PARENT-MODE: f -f pipe | fn -f pipe-nosigpipe (SIGPIPE ignored from the start) | d -d pipe
  local V=$1 name=q2$1 pidf=$T/q2-$1.pid dlog=$OUT/q2-$1-daemon-output.log
  log "== Q2 $V: $2, parent $3"
  mps_dirs "$name"
  mps_envp "$name"
  "${ENVP[@]}" "$PARENT" "$3" "$dlog" "$pidf" "$CTL" "$2" >>"$LOG" 2>&1 &
  local ppid=$!
  if ! mps_ready "$name"; then result "Q2-$V-daemon" FAIL "the daemon did not answer at start (see q2-$V-daemon-output.log)"; return; fi
  local dpid="" p
  if [ "$2" = -f ]; then dpid=$(cat "$pidf"); else
    for p in $(pids_of "$T/mps-$name/pipe"); do [ "$(exe_of "$p")" = nvidia-cuda-mps-control ] && dpid=$p; done
  fi
  local sigign; sigign=$(sed -n 's/^SigIgn:\t*//p' "/proc/$dpid/status" 2>/dev/null)
  local pipeign=no; [ -n "$sigign" ] && [ $(( 0x$sigign & 0x1000 )) -ne 0 ] && pipeign=yes
  log "Q2 $V daemon pid $dpid, parent $ppid alive: $(alive "$ppid" && echo yes || echo no); fd1 -> $(readlink "/proc/$dpid/fd/1" 2>/dev/null); SigIgn=$sigign (SIGPIPE ignored: $pipeign)"
  local shm=$T/q2-$V-c1.shm
  "${ENVP[@]}" "$P" hb "$shm" 60 >"$OUT/q2-$V-client1.log" 2>&1 &
  local c1=$!
  if ! "$P" wait-adv "$shm" 30000; then result "Q2-$V-daemon" FAIL "client 1 did not start (see q2-$V-client1.log)"; kill -9 "$c1"; return; fi
  mps_servers "$name" >"$T/servers"
  log "Q2 $V servers: $(cat "$T/servers")"
  "$P" reset "$shm"
  local parent_was=no; alive "$ppid" && parent_was=yes
  kill -9 "$ppid" 2>/dev/null; wait "$ppid" 2>/dev/null
  sleep 0.5
  local ans; ans=$(mps_ctl "$name" get_server_list 2>&1); local arc=$?
  local d1=no; alive "$dpid" && d1=yes
  # A new client makes the daemon write to its (now readerless) output.
  run_to 60 "${ENVP[@]}" "$P" launch "$T/q2-$V.res"; local lrc=$?
  local nmps; nmps=$(awk '{print $5}' "$T/q2-$V.res" 2>/dev/null)
  sleep 0.5
  local d2=no; alive "$dpid" && d2=yes
  local ans2; ans2=$(mps_ctl "$name" get_server_list 2>&1); local arc2=$?
  local c1adv; c1adv=$("$P" adv "$shm" 500); local crc=$?
  "$P" stop "$shm"; "$P" wait-done "$shm" 10000; local drc=$?
  wait_pid "$c1" 15; local c1rc=$?
  log "Q2 $V after the parent's kill -9: daemon alive $d1, get_server_list rc=$arc '$ans'; new client rc=$lrc mps_enabled=$nmps; daemon alive after it $d2; get_server_list rc=$arc2 '$ans2'; client 1: $c1adv, stop wait rc=$drc exit $c1rc"
  local what="parent holding the output pipe was alive at the kill: $parent_was; daemon SIGPIPE ignored: $pipeign"
  if [ $d1 = yes ] && [ $d2 = yes ] && [ $arc -eq 0 ] && [ $arc2 -eq 0 ]; then
    result "Q2-$V-daemon-survives" YES "alive and answering get_server_list after the kill and after a new client; $what"
  else
    result "Q2-$V-daemon-survives" NO "alive right after: $d1 (answer rc=$arc), after a new client: $d2 (answer rc=$arc2); $what"
  fi
  if [ $lrc -eq 0 ] && [ "$nmps" = 1 ]; then result "Q2-$V-new-client" YES "a new MPS client (mps_enabled=1) ran a kernel after the kill"
  else result "Q2-$V-new-client" NO "launch rc=$lrc mps_enabled=${nmps:-?} (see run.log)"; fi
  if [ $crc -eq 0 ] && [ $drc -eq 0 ]; then result "Q2-$V-running-client" YES "client 1 kept running, max gap since the kill $(echo "$c1adv" | field max_gap_us) us; stopped cleanly"
  else result "Q2-$V-running-client" NO "client 1: $c1adv; stop rc=$drc"; fi
  mps_quit "$name" || result "Q2-$V-quit" NO "the daemon did not quit (killed in cleanup)"
}

# --- Q3: a VMM allocation whose exporter died while an importer maps it
q3() { # q3 LABEL [MPS-NAME]
  local L=$1 es=$T/q3-$1-e.sock is=$T/q3-$1-i.sock shm=$T/q3-$1-I.shm
  ENVP=(env)
  [ -n "${2:-}" ] && mps_envp "$2"
  log "== Q3 $L"
  "${ENVP[@]}" "$P" vmm-export "$es" 120 >"$OUT/q3-$L-exporter.log" 2>&1 &
  local epid=$!
  local i; for i in $(seq 120); do grep -q '^exported' "$OUT/q3-$L-exporter.log" && break; alive "$epid" || break; sleep 0.25; done
  if ! grep -q '^exported' "$OUT/q3-$L-exporter.log"; then result "Q3-$L-importer-runs-on" FAIL "the exporter did not export (see q3-$L-exporter.log)"; kill -9 "$epid" 2>/dev/null; return; fi
  "${ENVP[@]}" "$P" vmm-import "$es" "$shm" 60 "$is" >"$OUT/q3-$L-importer.log" 2>&1 &
  local ipid=$!
  if ! "$P" wait-adv "$shm" 30000; then result "Q3-$L-importer-runs-on" FAIL "the importer's kernel did not start (see q3-$L-importer.log)"; kill -9 "$epid" "$ipid" 2>/dev/null; return; fi
  local before; before=$("$P" adv "$shm" 300)
  "$P" reset "$shm"
  kill -9 "$epid"; wait "$epid" 2>/dev/null
  sleep 2
  local after; after=$("$P" adv "$shm" 500); local arc=$?
  run_to 60 "${ENVP[@]}" "$P" vmm-third "$is"; local nrc=$?
  local third; third=$(grep '^third' "$LOG" | tail -1)
  local after2; after2=$("$P" adv "$shm" 300); local arc2=$?
  "$P" stop "$shm"
  wait_pid "$ipid" 15; local irc=$?
  local fin; fin=$(grep '^import final' "$OUT/q3-$L-importer.log")
  log "Q3 $L before the kill: $before; 2 s after: $after; after the third process: $after2; $fin"
  local bad; bad=$(echo "$after2" | field bad)
  if [ $arc -eq 0 ] && [ "${bad:-1}" = 0 ]; then
    result "Q3-$L-importer-runs-on" YES "the importer's kernel reads/writes the allocation 2 s after the exporter's kill -9, 0 mismatches; max gap $(echo "$after" | field max_gap_us) us"
  else
    result "Q3-$L-importer-runs-on" NO "after the exporter's kill -9: $after; bad=${bad:-?}"
  fi
  if [ $nrc -eq 0 ]; then result "Q3-$L-third-imports" YES "a third process imported the importer's fd after the exporter died: $third"
  else result "Q3-$L-third-imports" NO "vmm-third rc=$nrc (see run.log)"; fi
  if [ $irc -eq 0 ]; then result "Q3-$L-final-data" YES "$fin"
  else result "Q3-$L-final-data" NO "importer exit $irc: ${fin:-no final line} (see q3-$L-importer.log)"; fi
}

# --- Q4: the teardown of a killed context
q4() { # q4 LABEL [MPS-NAME]
  local L=$1
  ENVP=(env)
  [ -n "${2:-}" ] && mps_envp "$2"
  log "== Q4 $L"
  local t; t=$(left); [ "$t" -gt 150 ] && t=150
  run_to "$t" "${ENVP[@]}" "$P" killtest "$T" "$OUT" "$L" "${Q4_ITERS:-5}"; local rc=$?
  local line
  while IFS= read -r line; do
    case $line in
    *"heartbeat stopped"*) result "Q4-$L-hb-stop-ms" "$(echo "$line" | field median)" "n=${line##* n=}" ;;
    *"own clock ran on"*) result "Q4-$L-kernel-ran-on-ms" "$(echo "$line" | field median)" "K's %globaltimer from the last read before the kill to its last heartbeat: n=${line##* n=}" ;;
    *"reaped by waitpid"*) result "Q4-$L-reaped-ms" "$(echo "$line" | field median)" "n=${line##* n=}" ;;
    *"after-teardown N kernel done"*) result "Q4-$L-next-kernel-ms" "$(echo "$line" | field median)" "kill to a fresh process's first kernel, that process started once K was reaped and quiet 300 ms: n=${line##* n=}" ;;
    *"at-kill N kernel done"*) result "Q4-$L-atkill-kernel-ms" "$(echo "$line" | field median)" "kill to the first kernel of a process spawned at the kill: n=${line##* n=}" ;;
    *"at-kill N own ctx"*) result "Q4-$L-atkill-ctx-ms" "$(echo "$line" | field median)" "that process's own context creation (compare the baseline's ctx_ms): n=${line##* n=}" ;;
    *"beside a live K"*) result "Q4-$L-beside-live-K-us" "$(echo "$line" | field median)" "bystander S's gap while K runs (300 ms before the kill): n=${line##* n=}" ;;
    *"across K death"*) result "Q4-$L-bystander-gap-us" "$(echo "$line" | field median)" "n=${line##* n=}" ;;
    *"during N start"*) result "Q4-$L-newctx-gap-us" "$(echo "$line" | field median)" "bystander's gap while the fresh process starts: n=${line##* n=}" ;;
    *"S failed in"*) result "Q4-$L-bystander-fails" "$(echo "$line" | sed 's/.*S failed in \([0-9]*\) of \([0-9]*\).*/\1\/\2/')" "${line#Q4 $L }" ;;
    esac
  done < <(sed -n "/^Q4 $L summary/,\$p" "$LOG" | grep "^Q4 $L ")
  [ $rc -ne 0 ] && log "Q4 $L: killtest rc=$rc"
  grep -q "^Q4 $L baseline" "$LOG" && result "Q4-$L-baseline" info "$(grep "^Q4 $L baseline" "$LOG" | tail -1 | sed 's/^Q4 [a-z]* baseline: //')"
}

# --- Q5: a standby context beside a running kernel (plain, as blink's standby would be)
q5() {
  local shm=$T/q5-A.shm i
  log "== Q5"
  "$P" hb "$shm" 90 >"$OUT/q5-running.log" 2>&1 &
  local apid=$!
  if ! "$P" wait-adv "$shm" 30000; then result Q5-standby FAIL "the running kernel did not start"; return; fi
  for i in 1 2 3; do
    log "Q5 standby run $i"
    [ "$(left)" -lt 30 ] && break
    run_to 60 "$P" standby "$shm"
    sleep 0.1
    log "standby step=context-destroy-at-exit $("$P" adv "$shm" 100 | sed 's/.*max_gap_us=\([^ ]*\).*/running_kernel_max_gap_us=\1/')"
  done
  "$P" stop "$shm"; wait_pid "$apid" 15
  local step
  for step in idle-200ms context-create module-load-ptx get-function host-register-shm idle-context-500ms host-unregister-shm module-unload context-destroy-at-exit; do
    local v; v=$(grep "^standby step=$step " "$LOG" | sed 's/.*running_kernel_max_gap_us=\([0-9.]*\).*/\1/' | sort -n | tr '\n' ' ')
    local ms; ms=$(grep "^standby step=$step " "$LOG" | sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' | sort -n | tr '\n' ' ')
    result "Q5-$step" "$(echo "$v" | awk '{print $NF}')us" "running kernel's max gap (us, sorted): ${v:-none}; step took (ms): ${ms:-n/a}"
  done
}

enough 60 Q1-plain && q1 plain
if enough 60 Q1-mps && mps_start_d m1; then
  q1 mps m1
  enough 40 Q3-plain && q3 plain
  enough 40 Q3-mps && q3 mps m1
  mps_quit m1
else
  result Q1-mps FAIL "the MPS daemon (-d) did not start"
fi
enough 40 Q2-f && q2 f -f pipe
enough 40 Q2-fn && q2 fn -f pipe-nosigpipe
enough 40 Q2-d && q2 d -d pipe
enough 60 Q4-plain && q4 plain
if enough 60 Q4-mps && mps_start_d m4; then
  q4 mps m4
  mps_quit m4
fi
enough 35 Q5 && q5
log "== done in $(( $(date +%s) - START )) s"
