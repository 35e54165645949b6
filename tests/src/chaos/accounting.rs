//! What a run ends with: the processes left over, a process's descriptors and threads, and the GPU memory in use.

use std::process::Command;
use std::time::Duration;

use crate::wait_until;

/// Pids of live processes whose command name starts with `prefix` (zombies left out).
pub fn processes(prefix: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim().starts_with(prefix) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// meshd, its MPS workers and MPS daemons still running (comm is cut to 15 characters:
/// "nvidia-cuda-mps" covers the control daemon and the server).
pub fn leftovers() -> Vec<(String, u32)> {
    ["meshd", "mesh-mps-worker", "nvidia-cuda-mps"]
        .iter()
        .flat_map(|p| processes(p).into_iter().map(|pid| ((*p).to_string(), pid)))
        .collect()
}

/// (descriptors, threads) of `pid` once they have stayed the same for 200 ms (connection threads
/// end after their request).
pub fn settled_counts(pid: u32) -> (usize, usize) {
    let now = || {
        let n = |d: String| std::fs::read_dir(d).map(|d| d.count()).unwrap_or(0);
        (n(format!("/proc/{pid}/fd")), n(format!("/proc/{pid}/task")))
    };
    let mut last = now();
    let mut same = 0;
    wait_until(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(10));
        let n = now();
        same = if n == last { same + 1 } else { 0 };
        last = n;
        same >= 20
    });
    last
}

/// The GPU's memory in use, MiB, as nvidia-smi reports it (the test process holds no context of its
/// own to ask cuMemGetInfo with: one would be another MPS client, or time-slice with meshd's).
pub fn gpu_memory_mib() -> Option<u64> {
    let out =
        Command::new("nvidia-smi").args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().next()?.trim().parse().ok()
}

/// Slack on top of the 1% that the GPU's memory in use may grow by over a run without counting as a
/// leak (nvidia-smi's figure moves by a few MiB with the driver's own allocations).
pub const MEMORY_SLACK_MIB: u64 = 16;

/// Whether the GPU's memory in use grew from `before` to `after` (MiB) by more than 1% plus
/// [`MEMORY_SLACK_MIB`]: a leak. Less memory in use at the end is never one.
pub fn memory_leaked(before: u64, after: u64) -> bool {
    after > before + before / 100 + MEMORY_SLACK_MIB
}

/// The GPU's memory in use (MiB) once it is back within [`memory_leaked`]'s bound of `before`, or
/// the last reading when `limit` passes first (the driver frees an ended process's context a moment
/// after it exits). `None` when nvidia-smi does not answer.
pub fn memory_settled(before: u64, limit: Duration) -> Option<u64> {
    let mut last = gpu_memory_mib();
    wait_until(limit, || {
        last = gpu_memory_mib();
        last.is_some_and(|now| !memory_leaked(before, now))
    });
    last
}
