//! The cleanup registry under a real SIGTERM / SIGINT: a child process (this test binary, re-run) registers
//! actions, is signalled, and must have run them once each, newest first, before dying of the signal.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use mesh_backend::cleanup;

const ROLE: &str = "MESH_BACKEND_CLEANUP_CHILD";

fn child() -> bool {
    let Ok(out) = std::env::var(ROLE) else { return false };
    for tag in ["one", "two", "three"] {
        let out = out.clone();
        cleanup::register(tag, move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).create(true).open(&out).unwrap();
            writeln!(f, "{tag}").unwrap();
        });
    }
    cleanup::install_signal_handlers().unwrap();
    println!("ready");
    std::thread::sleep(Duration::from_secs(60));
    true
}

fn run_child_and_signal(test: &str, signal: rustix::process::Signal, raw: i32) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ran");
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, &out)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut reader = BufReader::new(c.stdout.take().unwrap());
    while !line.contains("ready") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "child ended before it was ready");
    }
    let pid = rustix::process::Pid::from_raw(c.id() as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
    let status = c.wait().unwrap();
    assert_eq!(status.signal(), Some(raw), "the child dies of the signal it got: {status}");
    let ran = std::fs::read_to_string(&out).expect("no cleanup action ran");
    assert_eq!(ran.lines().collect::<Vec<_>>(), ["three", "two", "one"]);
}

#[test]
fn sigterm_runs_every_action_once_newest_first() {
    if child() {
        return;
    }
    run_child_and_signal("sigterm_runs_every_action_once_newest_first", rustix::process::Signal::TERM, 15);
}

#[test]
fn sigint_runs_them_too() {
    if child() {
        return;
    }
    run_child_and_signal("sigint_runs_them_too", rustix::process::Signal::INT, 2);
}
