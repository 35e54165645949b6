//! The worker binary without a GPU: its first line is a refusal naming what is missing, and bad
//! arguments are refused with the usage; never a panic; stray stdout output lands on stderr, not in the protocol.

use std::process::Command;

use mesh_mps_worker::{RefusalKind, Reply};

fn worker(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mesh-mps-worker")).args(args).output().unwrap()
}

#[test]
fn bad_arguments_are_refused_with_the_usage() {
    for args in [&[][..], &["--frobnicate"]] {
        let out = worker(args);
        let line = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {line}");
        let Reply::Refused(refusal) = serde_json::from_str(line.trim()).unwrap() else { panic!("{line}") };
        assert_eq!(refusal.kind, RefusalKind::Usage, "{line}");
        let usage = &refusal.message;
        assert!(usage.contains("Usage: mesh-mps-worker") && usage.contains("--mailbox <PATH>"), "{usage}");
    }
}

#[test]
fn without_a_driver_the_first_line_says_what_is_missing() {
    if mesh_cuda::Device::get(0).is_ok() {
        eprintln!("SKIPPED without_a_driver_the_first_line_says_what_is_missing: this machine has a GPU");
        return;
    }
    let out = worker(&["--mailbox", "/nonexistent/mailbox"]);
    let line = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{line}");
    let Reply::Refused(refusal) = serde_json::from_str(line.lines().next().unwrap()).unwrap() else { panic!("{line}") };
    assert_eq!(refusal.kind, RefusalKind::Start, "{line}");
    assert!(refusal.message.contains("libcuda"), "{}", refusal.message);
    assert!(String::from_utf8_lossy(&out.stderr).is_empty(), "no panic message");
}

#[test]
fn a_bad_fd_socket_is_refused_before_the_driver_is_touched() {
    for (n, why) in [("1", "descriptors 0 to 2 are the command pipes"), ("77", "Bad file descriptor")] {
        let out = worker(&["--mailbox", "/nonexistent/mailbox", "--fd-socket", n]);
        let line = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{line}");
        let Reply::Refused(refusal) = serde_json::from_str(line.lines().next().unwrap()).unwrap() else {
            panic!("{line}")
        };
        assert_eq!(refusal.kind, RefusalKind::Start, "{line}");
        assert!(refusal.message.contains(&format!("--fd-socket {n}: {why}")), "{}", refusal.message);
    }
}

#[test]
fn what_else_writes_to_stdout_goes_to_stderr_and_leaves_the_protocol_alone() {
    // clap prints --help to descriptor 1, as a kernel's printf (flushed by the driver) or a library
    // would: meshd reads protocol lines there, so the worker points descriptor 1 at stderr first.
    let out = worker(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty(), "the protocol pipe got: {}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage: mesh-mps-worker"));
}

/// `--keep ROOT` started as meshd starts it, stdin a pipe from the test standing in for meshd.
fn keeper(root: &std::path::Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_mesh-mps-worker"))
        .arg("--keep")
        .arg(root)
        .arg("--pipe-dir")
        .arg(root.join("pipe"))
        .args(["--mps-control", "/nonexistent/nvidia-cuda-mps-control", "--remove-root"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn exits_within(child: &mut std::process::Child, within: std::time::Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    None
}

#[test]
fn the_keeper_touches_nothing_on_exit_and_clears_the_directory_when_meshd_dies() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    std::fs::create_dir_all(root.join("pipe")).unwrap();
    // An orderly stop: meshd says exit, and quits the daemons itself.
    let mut k = keeper(&root);
    writeln!(k.stdin.take().unwrap(), "exit").unwrap();
    let status = exits_within(&mut k, std::time::Duration::from_secs(5)).expect("the keeper left at exit");
    assert!(status.success() && root.exists(), "released: the directory stays");
    // meshd dies (its end of the pipe closes) with no worker left: the directory goes.
    let mut k = keeper(&root);
    drop(k.stdin.take());
    let status = exits_within(&mut k, std::time::Duration::from_secs(5)).expect("the keeper ended after meshd");
    assert!(status.success(), "{status}");
    assert!(!root.exists(), "the MPS directory meshd made is removed");
}
