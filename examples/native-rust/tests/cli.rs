//! The worker's refusals before it touches the GPU: each says what is wrong on stderr and exits 1 (no panic).

use std::process::{Command, Output};

const EXE: &str = env!("CARGO_BIN_EXE_mesh-native-rust");

fn run(env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(EXE);
    for v in ["MESH_MAILBOX", "MESH_CHANNELS", "MESH_READY_FD", "MESH_NATIVE_NAME", "MESH_ISOLATION"] {
        c.env_remove(v);
    }
    c.envs(env.iter().copied()).arg("10").output().expect("runs")
}

fn refused(env: &[(&str, &str)], says: &str) -> String {
    let out = run(env);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "exit 1: {err}");
    assert!(err.starts_with("mesh-native-rust: "), "{err}");
    assert!(err.contains(says), "says {says:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "no result line: {}", String::from_utf8_lossy(&out.stdout));
    err
}

#[test]
fn without_mesh_mailbox_it_says_so_and_exits_1() {
    let err = refused(&[], "MESH_MAILBOX is not set");
    assert!(err.contains("meshd spawn"), "{err}");
}

#[test]
fn with_one_channel_it_says_it_needs_two() {
    refused(&[("MESH_MAILBOX", "/nonexistent"), ("MESH_CHANNELS", "to-echo")], "needs two channels");
}

#[test]
fn a_missing_mailbox_file_is_an_error() {
    let env = [("MESH_MAILBOX", "/nonexistent/mailbox"), ("MESH_CHANNELS", "a,b"), ("MESH_READY_FD", "1")];
    refused(&env, "/nonexistent/mailbox");
}

#[test]
fn a_file_that_is_not_a_mailbox_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus");
    std::fs::write(&bogus, vec![0x5a; 8192]).unwrap();
    let env = [("MESH_MAILBOX", bogus.to_str().unwrap()), ("MESH_CHANNELS", "a,b"), ("MESH_READY_FD", "1")];
    refused(&env, "invalid");
}

#[test]
fn an_unknown_channel_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb =
        mesh_shm::Mailbox::create(&path, &mesh_shm::MailboxConfig::default(), mesh_shm::CreateMode::Replace).unwrap();
    mb.create_channel("to-echo", 16, 64).unwrap();
    let env = [("MESH_MAILBOX", path.to_str().unwrap()), ("MESH_CHANNELS", "to-echo,nope"), ("MESH_READY_FD", "1")];
    refused(&env, "no such channel");
}

#[test]
fn without_the_cuda_driver_it_says_so_and_exits_1() {
    // SAFETY: only tries to load libcuda, as the worker itself does first.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("SKIPPED without_the_cuda_driver_it_says_so_and_exits_1: this machine has libcuda");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb =
        mesh_shm::Mailbox::create(&path, &mesh_shm::MailboxConfig::default(), mesh_shm::CreateMode::Replace).unwrap();
    mb.create_channel("to-echo", 16, 64).unwrap();
    mb.create_channel("from-echo", 16, 64).unwrap();
    let env =
        [("MESH_MAILBOX", path.to_str().unwrap()), ("MESH_CHANNELS", "to-echo,from-echo"), ("MESH_READY_FD", "1")];
    refused(&env, "(libcuda.so) was not found");
    let ch = mb.channel("to-echo").unwrap();
    assert_eq!(ch.producer_pid, None, "the claim went with the process");
}
