#!/usr/bin/env bash
# kit-table.sh LOG: the tables of run-kit.sh's log (issue 16 item 1), as markdown. Reads the programs'
# ROW|, MEM|, TL| lines (formats in kit_ll.cu and kit_echo.cu); every figure is a median / p99 in µs of
# host CLOCK_MONOTONIC round trips unless the column says otherwise.
set -u
LOG=${1:?usage: kit-table.sh LOG}
awk -F'|' '
function cell(m, p) { return sprintf("%.2f / %.2f", m, p) }
function ratio(x, base) { return base > 0 ? sprintf(" (%.2f×%s)", x / base, rbase) : "" }
/^KIT_GPU_|^KIT_THP|^KIT_PCIE|^== GPU node|^== build|^== tmpfs|SKIPPED|: rc=|^== kit-raw|^== total/ { info[++ni] = $0 }
/^raw relaxed word|^LL 4\+4, one warp/ { probe[++np] = $0 }
$1 == "MEM" { mem[$2 "|" $3 "|" $4] = $5; if (!(($2 "|" $4) in memseen)) { memseen[$2 "|" $4] = 1; memorder[++nm] = $2 "|" $4 } }
$1 == "ROW" && $2 == "ll" {
  label = $3; kind = $4; layout = $5; size = $6; d = $7
  if ($8 ~ /^SKIP/) { skip["ll|" kind] = $8; next }
  key = label "|" kind "|" layout
  v[key "|" size "|" d] = cell($8, $9); med[key "|" size "|" d] = $8
  if (!(key in llseen)) { llseen[key] = 1; llorder[++nl] = key }
  if ($11 != "") cpus[key] = $11
  next
}
$1 == "ROW" && $2 == "echo" {
  label = $3; kind = $4; variant = $5; hl = $6; size = $7; d = $8
  if ($9 ~ /^(SKIP|ERROR)/) { skip["echo|" kind "|" variant "|" hl "|" size] = $9; next }
  key = label "|" kind "|" variant "|" hl
  ev[key "|" size "|" d] = cell($9, $10); emed[key "|" size "|" d] = $9
  if (!(key in eseen)) { eseen[key] = 1; eorder[++ne] = key }
  if ($12 != "") ecpus[key] = $12
  next
}
$1 == "TL" {
  # TL|label|kind|size|hostloop|dD|mean_empties|last_empty|period|poll_ok|send|idle|host_load|partial
  key = $2 "|" $3 "|" $4 "|" $5 "|" $6; tl[key] = $0; tlorder[++nt] = key
  sub(/^d/, "", $6); tlemp[$2 "|" $3 "|" $4 "|" $6] = $7; tlidle[$2 "|" $3 "|" $4 "|" $6] = $12
}
END {
  print "## Issue 16 item 1: measurement kit (tests/probes/run-kit.sh)"
  print ""
  for (i = 1; i <= ni; i++) print "    " info[i]
  print ""
  print "The LL probe as committed (tests/probes/ll_roundtrip.cu, cudaHostAlloc), same run:"
  print ""
  for (i = 1; i <= np; i++) print "    " probe[i]
  print ""
  n = split("raw 8 64 256 1024 4096", S, " ")
  print "### 1. The LL probe'"'"'s kernels by memory kind, unpinned (median / p99 µs; ×: against hostalloc, fixed, same size)"
  print ""
  print "| memory | layout | raw word | 8 B | 64 B | 256 B | 1 KiB | 4 KiB | CPUs |"
  print "|---|---|---:|---:|---:|---:|---:|---:|---|"
  rbase = ""
  for (i = 1; i <= nl; i++) {
    split(llorder[i], K, "|"); if (K[1] != "unpinned") continue
    line = "| " K[2] " | " K[3] " |"
    for (j = 1; j <= n; j++) {
      x = llorder[i] "|" S[j] "|0"
      line = line " " ((x in v) ? v[x] ratio(med[x], med["unpinned|hostalloc|fixed|" S[j] "|0"]) : "") " |"
    }
    print line " " cpus[llorder[i]] " |"
  }
  for (s in skip) if (s ~ /^ll\|/) print "| " substr(s, 4) " | skipped: " skip[s] " | | | | | | | |"
  print ""
  print "Where the pages are (MEM: NUMA node of two pages, smaps of the mapping):"
  print ""
  for (i = 1; i <= nm; i++) { split(memorder[i], K, "|"); if (K[1] == "ll") print "    " K[2] ": " mem["ll|unpinned|" K[2]] }
  print ""
  print "### 2. The echo (echo_header'"'"'s loop) by memory, GPU build and host loop, unpinned (median / p99 µs; ×: against the raw word (≤ 256 B) or the one-warp LL probe (1, 4 KiB) over the same memory at a fixed slot)"
  print ""
  print "| memory | GPU side | host loop | 8 B | 64 B | 256 B | 1 KiB | 4 KiB |"
  print "|---|---|---|---:|---:|---:|---:|---:|"
  for (i = 1; i <= ne; i++) {
    split(eorder[i], K, "|"); if (K[1] != "unpinned") continue
    line = "| " K[2] " | " K[3] " | " K[4] " |"
    for (j = 2; j <= n; j++) {
      x = eorder[i] "|" S[j] "|0"
      if (S[j] + 0 <= 256) { rbase = " raw"; b = med["unpinned|" K[2] "|fixed|raw|0"] } else { rbase = " LL"; b = med["unpinned|" K[2] "|fixed|" S[j] "|0"] }
      line = line " " ((x in ev) ? ev[x] ratio(emed[x], b) : "") " |"
    }
    print line
  }
  for (s in skip) if (s ~ /^echo\|/) print "| " substr(s, 6) " | skipped: " skip[s] " | | | | | | |"
  print ""
  print "### 2b. Timeline inside the echo (variant timed; medians, ns from clock64 scaled by %globaltimer; histograms in kit.log, HIST lines; per-message CSV in kit-raw-timeline.tar.gz)"
  print ""
  print "| memory | size | host loop | mean empty polls / msg | last empty poll | poll period | successful poll | send | idle (reply → next poll) | chained host load | partial polls |"
  print "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (i = 1; i <= nt; i++) {
    split(tl[tlorder[i]], T, "|"); if (T[2] != "unpinned") continue
    print "| " T[3] " | " T[4] " | " T[5] " | " T[7] " | " T[8] " | " T[9] " | " T[10] " | " T[11] " | " T[12] " | " T[13] " | " T[14] " |"
  }
  print ""
  print "### 3. Host-delay sweep (median round trip µs, the delay not included; shm = the mailbox'"'"'s memory kind). A sawtooth with the poll period means quantization."
  print ""
  print "| delay ns | echo 8 B | echo 64 B | timed echo 8 B | its empty polls | its idle ns | raw fixed | raw ring | LL 8 B fixed | LL 8 B ring | LL 64 B fixed | LL 64 B ring |"
  print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (d = 0; d <= 1600; d += 100) {
    k = "|" d
    line = "| " d " | " emed["sweep|shm|kit|mesh|8" k] " | " emed["sweep|shm|kit|mesh|64" k] " | " emed["sweep|shm|timed|mesh|8" k]
    line = line " | " tlemp["sweep|shm|8|" d] " | " tlidle["sweep|shm|8|" d]
    line = line " | " med["sweep|shm|fixed|raw" k] " | " med["sweep|shm|ring|raw" k] " | " med["sweep|shm|fixed|8" k] " | " med["sweep|shm|ring|8" k]
    line = line " | " med["sweep|shm|fixed|64" k] " | " med["sweep|shm|ring|64" k] " |"
    print line
  }
  print ""
  print "### 4. Host thread pinned near the GPU, far from it, unpinned (back to back; median / p99 µs; CPUs the thread was seen on)"
  print ""
  print "| where | test | memory | raw / 8 B | 64 B | 1 KiB | CPUs |"
  print "|---|---|---|---:|---:|---:|---|"
  for (i = 1; i <= nl; i++) {
    split(llorder[i], K, "|"); if (K[1] !~ /^pin-/) continue
    print "| " substr(K[1], 5) " | ll " K[3] " | " K[2] " | " v[llorder[i] "|raw|0"] " | " v[llorder[i] "|64|0"] " | " v[llorder[i] "|1024|0"] " | " cpus[llorder[i]] " |"
  }
  for (i = 1; i <= ne; i++) {
    split(eorder[i], K, "|"); if (K[1] !~ /^pin-/) continue
    print "| " substr(K[1], 5) " | echo " K[3] " | " K[2] " | " ev[eorder[i] "|8|0"] " | " ev[eorder[i] "|64|0"] " | " ev[eorder[i] "|1024|0"] " | " ecpus[eorder[i]] " |"
  }
  print ""
  printf "Drift, raw word at the end (fixed slot): hostalloc %s, shm %s\n", v["drift|hostalloc|fixed|raw|0"], v["drift|shm|fixed|raw|0"]
}' "$LOG"
