//! The crash-safe start: a live meshd's lock refuses a second one naming its pid; after `kill -9` the next start takes the mailbox over with its queued messages; another layout version is refused naming `--fresh`.
//!
//! The meshd that dies is this test binary re-run as a child (`MESHD_TEST_CHILD`), serving the
//! mailbox with a stand-in backend, so that it really is killed with SIGKILL, lock held.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{ListBackend, PTX, ask, load_req, wait_until};
use mesh_shm::{Consumer, MailboxConfig, Producer};
use meshd::protocol::Request;
use meshd::server::{Limits, Server};
use meshd::start::{Origin, StartError, bind_socket, claim_mailbox};

const CHILD: &str = "MESHD_TEST_CHILD";

fn config() -> MailboxConfig {
    MailboxConfig { size: 1 << 20, slots: 4, channels: 4 }
}

/// `meshd run` on `mailbox` (plus `extra` options), which must be refused (exit 1) on this machine
/// without a GPU, or before any GPU work; its stderr.
fn refused_run(socket: &Path, mailbox: &Path, extra: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .arg("--socket")
        .arg(socket)
        .args(["run", "--shm"])
        .arg(mailbox)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

/// One test at a time in this binary: a test's child (`spawn_child`, `refused_run`) forked while
/// another test thread had a lock file open shares that open file, and so its flock, until its exec
/// closes it; the other test's next claim of its own mailbox was then refused naming this very
/// process (waiting only around `meshd run` missed the claims made in the test itself).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The child: claims the mailbox, serves it on `<mailbox>.sock`, says "ready", runs until killed.
#[test]
fn child_meshd() {
    let Some(path) = std::env::var_os(CHILD) else { return };
    let path = PathBuf::from(path);
    let claimed = claim_mailbox(&path, &config(), false).unwrap();
    let server =
        Server::start(claimed.mailbox.clone(), Limits::default(), None, |mb| ListBackend::new(mb).opened()).unwrap();
    let listener = bind_socket(&path.with_extension("sock")).unwrap();
    println!("ready");
    let _lock = claimed.lock;
    server.run(listener).unwrap();
}

/// Starts the child meshd on `mailbox` and waits for it to serve.
fn spawn_child(mailbox: &Path) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_meshd", "--nocapture", "--test-threads=1"])
        .env(CHILD, mailbox)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("ready") {
        line.clear();
    }
    assert!(line.contains("ready"), "the child meshd did not start");
    child
}

#[test]
fn a_held_mailbox_is_refused_with_the_holders_pid_and_taken_over_after_kill_9() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mailbox = dir.path().join("mb");
    let mut child = spawn_child(&mailbox);
    let socket = mailbox.with_extension("sock");
    assert!(
        ask(
            &socket,
            &Request::ChannelCreate {
                name: "q".into(),
                msg_size: 8,
                capacity: 8,
                placement: String::new(),
                protocol: String::new(),
                parts: 1,
            },
            &[]
        )
        .ok
    );
    assert!(ask(&socket, &load_req("p", &["q"]), PTX).ok);
    let m = mesh_shm::Mailbox::open(&mailbox).unwrap();
    assert_eq!(m.owner_pid(), Some(child.id()), "the serving meshd records its pid");
    {
        let mut tx = Producer::claim(&m, "q").unwrap();
        for i in 0..3u64 {
            tx.send(&i.to_le_bytes(), Duration::from_secs(1)).unwrap();
        }
    }
    // A second meshd on the same mailbox, even with --fresh, is refused naming the holder.
    for fresh in [false, true] {
        let err = claim_mailbox(&mailbox, &config(), fresh).unwrap_err();
        assert!(matches!(err, StartError::Held { .. }), "{err}");
        assert!(err.to_string().contains(&format!("pid {}", child.id())), "{err}");
    }
    let err = refused_run(&dir.path().join("other.sock"), &mailbox, &[]);
    assert!(err.contains(&format!("in use by meshd pid {}", child.id())) && err.contains("--shm"), "{err}");

    child.kill().unwrap(); // SIGKILL: no cleanup runs, the lock goes with the process.
    child.wait().unwrap();
    let claimed = claim_mailbox(&mailbox, &config(), false).expect("a mailbox nobody holds is taken over");
    match &claimed.origin {
        Origin::TakenOver { previous_pid, channels, released_slots, replay } => {
            assert_eq!((*previous_pid, *channels), (Some(child.id()), 1));
            assert_eq!(released_slots, &[0], "the dead meshd's program slot is released");
            // p bound q and no host holds q's consumer end: the 3 messages after position 0 may come again.
            assert_eq!(replay, &[meshd::start::Replay { channel: "q".into(), from: 0, at_most: 3 }]);
        }
        o => panic!("{o:?}"),
    }
    assert!(!claimed.mailbox.slot(0).unwrap().in_use());
    assert_eq!(claimed.mailbox.owner_pid(), Some(std::process::id()));
    let mut rx = Consumer::claim(&claimed.mailbox, "q").expect("the dead meshd's claims are reclaimable");
    let mut buf = [0u8; 8];
    for i in 0..3u64 {
        rx.recv(&mut buf, Duration::from_secs(1)).unwrap();
        assert_eq!(u64::from_le_bytes(buf), i, "the queued messages survived the crash");
    }
    // The stale socket of the dead meshd is replaced.
    assert!(socket.exists());
    drop(bind_socket(&socket).expect("a stale socket is replaced"));
}

#[test]
fn fresh_starts_empty_and_another_layout_version_is_refused_naming_fresh() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mailbox = dir.path().join("mb");
    {
        let c = claim_mailbox(&mailbox, &config(), false).unwrap();
        assert_eq!(c.origin, Origin::Created);
        c.mailbox.create_channel("q", 8, 8).unwrap();
    }
    let c = claim_mailbox(&mailbox, &config(), true).unwrap();
    assert_eq!(c.origin, Origin::Created);
    assert!(c.mailbox.channels().unwrap().is_empty(), "--fresh starts empty");
    drop(c);
    // Version 1 in the header.
    let at = core::mem::offset_of!(mesh_shm::layout::Header, version) as u64;
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&mailbox).unwrap(),
        &1u32.to_le_bytes(),
        at,
    )
    .unwrap();
    let err = claim_mailbox(&mailbox, &config(), false).unwrap_err();
    assert!(matches!(err, StartError::OtherVersion { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("layout version 1") && msg.contains("--fresh"), "{msg}");
    // Through the CLI, before any GPU work: the same refusal, exit 1.
    let err = refused_run(&dir.path().join("sock"), &mailbox, &[]);
    assert!(err.contains("layout version 1") && err.contains("--fresh"), "{err}");
    assert!(mailbox.exists(), "a refused start leaves the file as it was");
    assert!(claim_mailbox(&mailbox, &config(), true).is_ok(), "--fresh replaces it");
}

#[test]
fn a_file_that_is_no_mailbox_is_refused_saying_why_once() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mailbox = dir.path().join("mb");
    for (bytes, why) in [(vec![0u8; 1 << 20], "invalid magic"), (Vec::new(), "invalid file size")] {
        std::fs::write(&mailbox, &bytes).unwrap();
        let err = claim_mailbox(&mailbox, &config(), false).unwrap_err();
        assert!(matches!(err, StartError::Invalid { .. }), "{err}");
        // As `meshd run` prints it: the whole chain.
        let msg = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(msg.matches(why).count(), 1, "the reason once: {msg}");
        assert!(msg.contains("--fresh") && msg.contains(&mailbox.display().to_string()), "{msg}");
        assert_eq!(std::fs::read(&mailbox).unwrap(), bytes, "the file left as it was");
    }
}

#[test]
fn without_a_gpu_a_taken_over_mailbox_is_kept_with_its_messages() {
    let _serial = serial();
    if mesh_cuda::Device::get(0).is_ok() {
        eprintln!("SKIPPED without_a_gpu_a_taken_over_mailbox_is_kept_with_its_messages: this machine has a GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mailbox = dir.path().join("mb");
    {
        let c = claim_mailbox(&mailbox, &config(), false).unwrap();
        c.mailbox.create_channel("q", 8, 8).unwrap();
        Producer::claim(&c.mailbox, "q").unwrap().send(&7u64.to_le_bytes(), Duration::from_secs(1)).unwrap();
        // Dropped without cleanup, as a killed meshd leaves it.
    }
    let state = dir.path().join("state");
    let err = refused_run(&dir.path().join("sock"), &mailbox, &["--state-dir".as_ref(), state.as_os_str()]);
    assert!(err.contains("taken over") && err.contains("1 channels"), "the takeover happens before the GPU: {err}");
    assert!(err.contains("libcuda") || err.contains("no usable GPU"), "{err}");
    let m = mesh_shm::Mailbox::open(&mailbox).expect("the taken-over mailbox is kept after the failed start");
    let mut buf = [0u8; 8];
    Consumer::claim(&m, "q").unwrap().recv(&mut buf, Duration::from_secs(1)).unwrap();
    assert_eq!(u64::from_le_bytes(buf), 7);
    assert!(wait_until(Duration::from_secs(1), || !dir.path().join("mb.lock").exists()), "the lock file is removed");
}
