//! The raw GPU↔GPU limit beside `g2g`: tests/probes/g2g.cu (two plain kernels exchanging a flag and a
//! payload, on device memory and on mapped host memory), run as a process of its own in the same run.
//!
//! It is a CUDA runtime program, not a mesh program, so that nothing of meshd's (the mailbox, the
//! header's loop) is in the baseline. A bundle's `run` builds it into `bin/g2g` beside this binary;
//! `cargo xtask bench` leaves it to this module, which builds it with nvcc into a temporary directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where the memory the two kernels share lives, as the probe prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Memory {
    /// `cudaMalloc`: what device channels use.
    Device,
    /// `cudaHostAlloc(..., cudaHostAllocMapped)`: what host channels use.
    MappedHost,
}

/// The probe's round trips, in µs, by memory and message size in bytes.
pub type RawG2g = BTreeMap<(Memory, u32), f64>;

/// Reads the probe's `g2g device memory      8 B  rtt_ns=1105` lines; other lines (bandwidths) and
/// lines with an error after the figure are passed over.
pub fn parse(out: &str) -> RawG2g {
    let mut figures = RawG2g::new();
    for line in out.lines() {
        let Some(rest) = line.strip_prefix("g2g ") else { continue };
        let (memory, rest) = if let Some(r) = rest.strip_prefix("device memory") {
            (Memory::Device, r)
        } else if let Some(r) = rest.strip_prefix("mapped host") {
            (Memory::MappedHost, r)
        } else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let size = words.next().and_then(|s| s.parse::<u32>().ok());
        let unit = words.next();
        let ns = words.next().and_then(|w| w.strip_prefix("rtt_ns=")).and_then(|n| n.parse::<u64>().ok());
        if let (Some(size), Some("B"), Some(ns), None) = (size, unit, ns, words.next()) {
            figures.insert((memory, size), ns as f64 / 1e3);
        }
    }
    figures
}

/// The probe's source: the bundle's `probes/` beside `bin/`, else the source tree's.
fn source() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bundle = exe.parent()?.parent()?.join("probes/g2g.cu");
    let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/g2g.cu");
    [bundle, tree].into_iter().find(|p| p.is_file())
}

/// Runs the probe (built beside this binary, or built now with nvcc) and reads its figures; `Err`
/// says why there are none, and the benchmark then prints that beside its table.
pub fn raw_g2g() -> Result<RawG2g, String> {
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("g2g")));
    let built;
    let binary = match beside.filter(|b| b.is_file()) {
        Some(b) => b,
        None => {
            let src = source().ok_or("tests/probes/g2g.cu not found beside the binary or in the tree")?;
            let nvcc = std::env::var_os("NVCC").map_or_else(|| PathBuf::from("nvcc"), PathBuf::from);
            built = std::env::temp_dir().join(format!("mesh-g2g-probe-{}", std::process::id()));
            let out = Command::new(&nvcc)
                .args(["-O3", "-arch=sm_90", "-std=c++17", "-o"])
                .arg(&built)
                .arg(&src)
                .output()
                .map_err(|e| format!("{}: {e}", nvcc.display()))?;
            if !out.status.success() {
                return Err(format!("nvcc {}: {}", src.display(), String::from_utf8_lossy(&out.stderr).trim()));
            }
            built.clone()
        }
    };
    let out = run_bounded(&binary, Duration::from_secs(120))?;
    let figures = parse(&out);
    if figures.is_empty() { Err(format!("{} printed no round trip:\n{out}", binary.display())) } else { Ok(figures) }
}

/// `binary`'s stdout, or why not: it failed, or ran past `limit` (then it is killed).
fn run_bounded(binary: &Path, limit: Duration) -> Result<String, String> {
    let mut child = Command::new(binary)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    let start = std::time::Instant::now();
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(_) => break,
            None if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} ran past {limit:?}", binary.display()));
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{} failed: {}", binary.display(), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_round_trips_are_read_by_memory_and_size_and_nothing_else() {
        let out = "g2g device memory     8 B  rtt_ns=1105\n\
                   g2g mapped host      64 B  rtt_ns=2210\n\
                   g2g device memory  1024 B  rtt_ns=2008\n\
                   g2g device memory   256 B  rtt_ns=0an error string\n\
                   g2g device memory   512 B  rtt_ns=7 unspecified launch failure\n\
                   cudaMemcpy D2D 64 MiB: 1500.0 GB/s\n";
        let f = parse(out);
        assert_eq!(f.len(), 3, "{f:?}");
        assert_eq!(f[&(Memory::Device, 8)], 1.105);
        assert_eq!(f[&(Memory::MappedHost, 64)], 2.21);
        assert_eq!(f[&(Memory::Device, 1024)], 2.008);
    }
}
