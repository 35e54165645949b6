//! Native GPU workers end to end (`meshd spawn`): the C example (examples/native-cuda, built by the bundle's `run` with nvcc) and the Rust one (examples/native-rust, `mesh-native-rust`, built by cargo) each exchanging 100,000 sequence-checked messages with the resident echo_warp in each mode; a worker with a wrong MPS pipe directory refused; a worker that never says ready refused; the Rust worker run outside meshd refused with exit 1 (no GPU needed); a worker started again, with its command and bindings, by a meshd restarted after kill -9.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};

const COUNT: u64 = 100_000;

/// A worker binary: the path in `var`, else `name` beside this test binary (a bundle's bin/, or cargo's target/PROFILE/).
fn worker_binary(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors().skip(1).take(2).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The C example's binary: `MESH_NATIVE_CUDA`, else `native-cuda` beside this test binary (a bundle's bin/).
fn native_cuda() -> Option<PathBuf> {
    worker_binary("MESH_NATIVE_CUDA", "native-cuda")
}

/// The Rust example's binary: `MESH_NATIVE_RUST`, else `mesh-native-rust` beside this test binary.
fn native_rust() -> Option<PathBuf> {
    worker_binary("MESH_NATIVE_RUST", "mesh-native-rust")
}

fn rust_worker_or_skip(test: &str) -> Option<PathBuf> {
    let w = native_rust();
    if w.is_none() {
        eprintln!(
            "SKIPPED {test}: no mesh-native-rust binary (cargo build --release --workspace --bins puts it in the bundle; or set MESH_NATIVE_RUST)"
        );
    }
    w
}

fn worker_or_skip(test: &str) -> Option<PathBuf> {
    let w = native_cuda();
    if w.is_none() {
        eprintln!(
            "SKIPPED {test}: no native-cuda binary (the bundle's run builds it with nvcc; or set MESH_NATIVE_CUDA)"
        );
    }
    w
}

/// meshd with echo_warp between `to-echo` and `from-echo`.
fn mesh_with_echo(extra: &[&str]) -> Meshd {
    let m = Meshd::start(extra);
    m.ok(&["channel", "create", "to-echo", "--msg-size", "16", "--capacity", "1024"]);
    m.ok(&["channel", "create", "from-echo", "--msg-size", "16", "--capacity", "1024"]);
    let ptx = programs_dir().join("echo_warp.ptx").display().to_string();
    m.ok(&["load", "echo", &ptx, "--bind", "to-echo", "--bind", "from-echo"]);
    m
}

/// The `ps` line of native worker `name`, if listed.
fn ps_line(m: &Meshd, name: &str) -> Option<String> {
    m.ok(&["ps"])
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name) && l.contains(" native "))
        .map(str::to_string)
}

fn exchange(mode: &str, extra: &[&str]) {
    let Some(worker) = worker_or_skip(&format!("native_{mode}")) else { return };
    exchange_with(&worker, "native", mode, extra);
}

/// Spawns `worker` (a native worker taking `COUNT RESULT`) beside echo_warp in `mode` and checks that
/// all COUNT messages came back in order; prints `LABEL MODE: COUNT messages in MS ms`.
fn exchange_with(worker: &Path, label: &str, mode: &str, extra: &[&str]) {
    let m = mesh_with_echo(extra);
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result");
    let count = COUNT.to_string();
    let out = m.ok(&[
        "spawn",
        "nat",
        "--bind",
        "to-echo",
        "--bind",
        "from-echo",
        "--",
        worker.to_str().unwrap(),
        &count,
        result.to_str().unwrap(),
    ]);
    println!("{}", out.trim());
    assert!(out.contains(&format!("{mode} mode")), "{out}");
    if mode == "blink" {
        assert!(out.contains("time-slices"), "spawn says what blink mode means for the worker: {out}");
    }
    assert!(ps_line(&m, "nat").is_some(), "ps lists the worker");
    let ended = wait_until(Duration::from_secs(120), || ps_line(&m, "nat").is_some_and(|l| l.contains("exited(")));
    let line = ps_line(&m, "nat").unwrap_or_default();
    let text = std::fs::read_to_string(&result).unwrap_or_default();
    assert!(ended && line.contains("exited(0)"), "worker: {line}\nresult: {text}\nlog:\n{}", m.log_text());
    let field =
        |k: &str| text.split_whitespace().find_map(|w| w.strip_prefix(&format!("{k}="))).unwrap_or("?").to_string();
    assert_eq!((field("messages"), field("errors")), (count.clone(), "0".to_string()), "{text}");
    println!("{label} {mode}: {COUNT} messages in {} ms", field("ms"));
    m.ok(&["stop", "nat"]);
    assert!(ps_line(&m, "nat").is_none());
    assert_eq!(m.heartbeats().len(), 1, "echo still runs");
}

#[test]
fn native_blink() {
    require_gpu!("native_blink");
    exchange("blink", &[]);
}

#[test]
fn native_mps() {
    require_gpu!("native_mps");
    exchange("mps", &["--isolation", "mps", "--pool", "1"]);
}

fn exchange_rust(mode: &str, extra: &[&str]) {
    let Some(worker) = rust_worker_or_skip(&format!("native_rust_{mode}")) else { return };
    exchange_with(&worker, "native-rust", mode, extra);
}

#[test]
fn native_rust_blink() {
    require_gpu!("native_rust_blink");
    exchange_rust("blink", &[]);
}

#[test]
fn native_rust_mps() {
    require_gpu!("native_rust_mps");
    exchange_rust("mps", &["--isolation", "mps", "--pool", "1"]);
}

/// No GPU needed: outside meshd (no `MESH_MAILBOX`) the Rust worker says what is missing and exits 1.
#[test]
fn native_rust_without_a_mailbox_exits_1() {
    let Some(worker) = rust_worker_or_skip("native_rust_without_a_mailbox_exits_1") else { return };
    let mut cmd = std::process::Command::new(&worker);
    for v in ["MESH_MAILBOX", "MESH_CHANNELS", "MESH_READY_FD", "MESH_NATIVE_NAME", "MESH_ISOLATION"] {
        cmd.env_remove(v);
    }
    let out = cmd.arg("10").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("MESH_MAILBOX is not set") && err.contains("meshd spawn"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    println!("native-rust without a mailbox: {}", err.trim());
}

#[test]
fn native_worker_with_a_wrong_pipe_directory_is_refused() {
    require_gpu!("native_worker_with_a_wrong_pipe_directory_is_refused");
    let Some(worker) = worker_or_skip("native_worker_with_a_wrong_pipe_directory_is_refused") else { return };
    let m = mesh_with_echo(&["--isolation", "mps", "--pool", "1"]);
    let wrong = tempfile::tempdir().unwrap();
    let pipe = format!("CUDA_MPS_PIPE_DIRECTORY={}", wrong.path().display());
    let err = m.refused(&[
        "spawn",
        "stray",
        "--bind",
        "to-echo",
        "--bind",
        "from-echo",
        "--",
        "env",
        &pipe,
        worker.to_str().unwrap(),
        "10",
    ]);
    println!("native wrong pipe directory refused: {}", err.trim());
    assert!(err.contains("not a client of meshd's MPS server"), "{err}\nlog:\n{}", m.log_text());
    assert!(ps_line(&m, "stray").is_none(), "a refused worker is not listed");
    assert_eq!(m.heartbeats().len(), 1, "echo still runs");
}

#[test]
fn native_worker_that_never_says_ready_is_refused() {
    require_gpu!("native_worker_that_never_says_ready_is_refused");
    let m = Meshd::start(&[]);
    let err = m.refused(&["spawn", "mute", "--ready-timeout", "2", "--", "sleep", "600"]);
    println!("native never ready refused: {}", err.trim());
    assert!(err.contains("did not report ready within 2.0 s"), "{err}");
    assert!(ps_line(&m, "mute").is_none());
}

/// The native worker `name` as `ps --json` lists it: (pid, state, bindings, command). `ps --json` is
/// one array, the programs' rows then the native workers' marked `"native": true`.
fn native_row(m: &Meshd, name: &str) -> Option<(u64, String, Vec<String>, String)> {
    let v: serde_json::Value = serde_json::from_str(&m.ok(&["ps", "--json"])).ok()?;
    let row = v.as_array()?.iter().find(|n| n["native"] == true && n["name"] == name)?.clone();
    let binds = row["bind"].as_array()?.iter().filter_map(|b| b.as_str().map(str::to_string)).collect();
    Some((row["pid"].as_u64()?, row["state"].as_str()?.to_string(), binds, row["command"].as_str()?.to_string()))
}

/// A native worker spawned before meshd is killed with SIGKILL is started again by the restarted
/// meshd with the same command and bindings, as a new process, and can be stopped.
fn native_started_again_after_kill_9(mode: &str, extra: &[&str]) {
    let Some(worker) = worker_or_skip(&format!("native_started_again_after_kill_9_{mode}")) else { return };
    let mut m = mesh_with_echo(extra);
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result");
    // Enough messages that the worker is still exchanging when meshd dies.
    let count = "1000000000";
    let cmd = [worker.to_str().unwrap(), count, result.to_str().unwrap()];
    m.ok(&["spawn", "nat", "--bind", "to-echo", "--bind", "from-echo", "--"]
        .iter()
        .chain(&cmd)
        .copied()
        .collect::<Vec<_>>());
    let (pid, state, binds, command) = native_row(&m, "nat").expect("ps --json lists the worker");
    assert_eq!(state, "running");
    assert_eq!(binds, ["to-echo", "from-echo"]);
    m.kill9_and_restart();
    let back = wait_until(Duration::from_secs(60), || {
        native_row(&m, "nat").is_some_and(|(p, s, _, _)| p != pid && s == "running")
    });
    let row = native_row(&m, "nat");
    assert!(back, "{mode}: the worker is not running again after the restart: {row:?}\nlog:\n{}", m.log_text());
    let (new_pid, _, new_binds, new_command) = row.unwrap();
    println!("native {mode}: pid {pid} before the kill -9, {new_pid} after the restart; command {new_command:?}");
    assert_eq!((new_binds, new_command), (binds, command), "{mode}: started again with its command and bindings");
    assert!(m.log_text().contains("native worker started again from the desired state"), "{}", m.log_text());
    m.ok(&["stop", "nat"]);
    assert!(native_row(&m, "nat").is_none(), "{mode}: stopped after the restart");
    m.ok(&["shutdown"]);
}

#[test]
fn native_started_again_after_kill_9_blink() {
    require_gpu!("native_started_again_after_kill_9_blink");
    native_started_again_after_kill_9("blink", &[]);
}

#[test]
fn native_started_again_after_kill_9_mps() {
    require_gpu!("native_started_again_after_kill_9_mps");
    // Without an orphan grace: under one (the default) the worker runs on and is adopted instead.
    native_started_again_after_kill_9("mps", &["--isolation", "mps", "--pool", "1", "--orphan-grace-ms", "0"]);
}
