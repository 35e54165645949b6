//! The control plane through the CLI on a GPU: `meshd ps` round trip and a cached load's request-to-running, beside the backend's own figure; prints a markdown table.
//!
//! Gated like the other GPU benchmarks (`MESH_GPU_TESTS=1`). Eight heartbeat programs run; `ps`
//! is timed 50 times, then `unload p7` + `load p7` (the image cached by the JIT) 20 times. Each
//! figure is a whole `meshd` client process: spawn, connect, request, answer, exit.

use std::time::Duration;

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{gpu_enabled, programs_dir};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// (median, p99) of `xs`, in ms.
fn median_p99(xs: &mut [f64]) -> (f64, f64) {
    xs.sort_by(f64::total_cmp);
    let at = |q: f64| xs[((xs.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}

/// The `(backend X ms)` figure meshd reports for a change, if any.
fn backend_ms(stdout: &str) -> Option<f64> {
    let rest = &stdout[stdout.find("(backend ")? + "(backend ".len()..];
    rest[..rest.find(" ms")?].parse().ok()
}

fn main() {
    if !gpu_enabled("mesh-cli-bench") {
        return;
    }
    let heartbeat = programs_dir().join("heartbeat.ptx").display().to_string();
    let d = Meshd::start(&[]);
    for i in 0..8 {
        d.ok(&["load", &format!("p{i}"), &heartbeat]);
    }
    // Warm the client path (page cache, the binary) before timing.
    for _ in 0..5 {
        d.ok(&["ps"]);
    }
    let mut ps: Vec<f64> = (0..50).map(|_| ms(d.timed_ok(&["ps"]).0)).collect();
    let (mut load, mut backend) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        d.ok(&["unload", "p7"]);
        let (took, out) = d.timed_ok(&["load", "p7", &heartbeat]);
        assert!(out.contains("loaded p7"), "{out}");
        load.push(ms(took));
        if let Some(b) = backend_ms(&out) {
            backend.push(b);
        }
    }
    let rows = d.heartbeats();
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|(_, _, state)| state == "running"), "{rows:?}");
    d.ok(&["shutdown"]);
    let (ps_med, ps_p99) = median_p99(&mut ps);
    let (load_med, load_p99) = median_p99(&mut load);
    println!("\n## meshd through the CLI (8 heartbeat programs, blink mode)\n");
    println!("| what | n | median ms | p99 ms |");
    println!("| --- | --- | --- | --- |");
    println!("| `meshd ps` round trip | {} | {ps_med:.3} | {ps_p99:.3} |", ps.len());
    println!("| `meshd load` (cached image) request to running | {} | {load_med:.3} | {load_p99:.3} |", load.len());
    if backend.is_empty() {
        println!("| backend's own time for that load | - | (not reported) | |");
    } else {
        let (b_med, b_p99) = median_p99(&mut backend);
        println!("| backend's own time for that load | {} | {b_med:.3} | {b_p99:.3} |", backend.len());
    }
}
