//! The worker binary without a GPU: its first line is a refusal naming what is missing, and bad
//! arguments are refused with the usage; never a panic.

use std::process::Command;

fn worker(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mesh-mps-worker")).args(args).output().unwrap()
}

#[test]
fn bad_arguments_are_refused_with_the_usage() {
    for args in [&[][..], &["--frobnicate"]] {
        let out = worker(args);
        let line = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {line}");
        let reply: mesh_mps_worker::Reply = serde_json::from_str(line.trim()).unwrap();
        assert!(!reply.ok && reply.error.unwrap().contains("usage: mesh-mps-worker --mailbox PATH"));
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
    let reply: mesh_mps_worker::Reply = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let err = reply.error.unwrap();
    assert!(!reply.ok && err.contains("libcuda"), "{err}");
    assert!(String::from_utf8_lossy(&out.stderr).is_empty(), "no panic message");
}
