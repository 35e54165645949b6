//! `cargo xtask bench [BENCH ARGS...]`: the GPU benchmarks here, their figures in one results file a run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::cmd::{cargo, run};

/// The gate the GPU test crate's binaries check before touching a GPU.
const GPU_GATE: &str = "MESH_GPU_TESTS";

/// Every run of the full suite: `mesh-gpu-bench` arguments, each in a process of its own (MPS mode
/// beside a plain context would share the GPU with the server).
const SUITE: &[&[&str]] = &[
    &[],
    &["mps"],
    &["rt", "blink"],
    &["rt", "mps"],
    &["rt-ab", "blink"],
    &["rt-ab", "mps"],
    // Over a client whose time between reply and request varies (0-1.5 µs, drawn for each request):
    // every path averaged over where its requests land between its polls.
    &["rt-ab", "blink", "--host-delay-ns", "0-1500"],
    &["rt-ab", "mps", "--host-delay-ns", "0-1500"],
    &["g2g", "blink"],
    &["g2g", "mps"],
    &["bulk", "blink"],
    &["bulk", "mps"],
    &["parts", "blink"],
    &["parts", "mps"],
    &["service", "blink"],
    &["service", "mps"],
];

/// The results file of a run started now on this machine's GPU: `target/bench-results/DATE-GPU.jsonl`.
pub fn results_path() -> PathBuf {
    let gpu = Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader", "-i", "0"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "unknown GPU".into());
    let tag: String =
        gpu.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H%M%S"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    PathBuf::from(format!("target/bench-results/{date}-{tag}.jsonl"))
}

/// The commit of the tree being built, with `-dirty` when it has uncommitted changes.
pub fn commit() -> String {
    let head = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".into(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}

/// `cargo xtask bench` (the suite) or `cargo xtask bench ARGS...` (one `mesh-gpu-bench` run, say
/// `rt-ab blink --host-delay-ns 0-1500`): every figure into one new results file, named at the end.
pub fn bench(args: &[&str], programs: &Path) -> Result<()> {
    // meshd, the MPS worker and the service's client processes run beside the benchmark binary.
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "meshd",
        "-p",
        "mesh-mps-worker",
        "-p",
        "mesh-gpu-tests",
        "--bins",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let exe = target.join("release/mesh-gpu-bench");
    let results = results_path();
    let commit = commit();
    let one: [&[&str]; 1] = [args];
    let runs: &[&[&str]] = if args.is_empty() { SUITE } else { &one };
    for bench_args in runs {
        run(Command::new(&exe)
            .args(["--results", &results.display().to_string(), "--commit", &commit])
            .args(*bench_args)
            .env(GPU_GATE, "1")
            .env("MESH_PROGRAMS", programs))?;
    }
    if args.is_empty() {
        // The control plane through the CLI (meshd beside the benchmark binary); its figures are printed.
        run(Command::new(target.join("release/mesh-cli-bench")).env(GPU_GATE, "1").env("MESH_PROGRAMS", programs))?;
    }
    say_results(&results);
    Ok(())
}

fn say_results(results: &Path) {
    if results.is_file() {
        eprintln!(
            "results: {} (`cargo xtask bench-report --compare OLD {0}` compares it with another run; copied into \
             bench/results/, `cargo xtask bench-report` puts it into BENCHMARKS.md)",
            results.display()
        );
    } else {
        eprintln!("results: none written ({} is missing: was the GPU skipped?)", results.display());
    }
}

/// After `gpu-test --bundle DIR`: the commit the bundle was built from, for its results file, and where
/// its `run` script writes that file.
pub fn stamp_bundle(dir: &Path) -> Result<()> {
    let file = dir.join("COMMIT");
    std::fs::write(&file, commit() + "\n").with_context(|| format!("writing {}", file.display()))?;
    eprintln!(
        "results: `./run bench` (or `./run all`) in {} writes the figures to $OUT/results.jsonl (OUT defaults to ./out)",
        dir.display()
    );
    Ok(())
}

/// After `gpu-test` here: the tests assert and write no figures; say where figures come from.
pub fn say_gpu_test_results() {
    eprintln!(
        "results: the GPU tests assert and write no figures; `cargo xtask bench` writes them to target/bench-results/"
    );
}
