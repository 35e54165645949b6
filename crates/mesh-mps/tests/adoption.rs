//! A previous meshd's daemon and orphans adopted, against stand-ins (CI has no MPS): a control daemon as a shell script, orphans as `sleep` processes whose rendezvous a test thread answers.
//!
//! The daemon that still runs on the MPS directory is adopted rather than quit; an orphan running a
//! kernel as its server's client is greeted and handed to the backend, which adopts it with a new fd
//! socket riding on the `adopt` line; an orphan whose kernel is not running is retired, not adopted.
//! The GPU side (programs that never stop across a kill -9 of meshd) is tests/tests/mps_adopt.rs.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

mod common;

use common::{FAKE_CONTROL, script};
use mesh_mps::MpsControl;
use mesh_mps::orphans::OrphanPolicy;
use mesh_mps::process::Held;
use mesh_mps::worker::{NewsSender, Worker};
use mesh_mps_worker::fdpass::recv_line_with_fd;
use mesh_mps_worker::orphan::{PIPE_ENV, rendezvous};
use mesh_mps_worker::{FdTag, FileId, KernelState, Orphan, PROTOCOL, Ready, Reply, encode};

/// A stand-in orphan: a `sleep` of `pipe`'s environment for its pid, and a thread answering at its
/// rendezvous in `dir`: its hello with an orphan whose kernel is `kernel`; then `adopt` (its fd
/// taken) or `retire` (the sleep ended). The thread returns what it heard and the fds that came.
fn orphan(dir: &Path, pipe: &Path, kernel: KernelState) -> (Child, std::thread::JoinHandle<(Vec<String>, usize)>) {
    let child = Command::new("/bin/sleep").arg("30").env(PIPE_ENV, pipe).spawn().unwrap();
    let pid = child.id();
    let listener = UnixListener::bind(rendezvous(dir, pid)).unwrap();
    let t = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut heard = Vec::new();
        let mut hello = String::new();
        BufReader::new(&stream).read_line(&mut hello).unwrap();
        heard.push(hello.trim_end().to_string());
        let answer = |r: &Reply| writeln!(&stream, "{}", encode(r)).unwrap();
        answer(&Reply::Orphan(Orphan {
            protocol: PROTOCOL,
            pid,
            slot: Some(1),
            generation: Some(3),
            launches: 1,
            kernel,
            orphaned_ms: 25,
            grace_ms: 60_000,
            ready: Ready {
                protocol: PROTOCOL,
                pid,
                device: "stand-in".into(),
                mps_enabled: true,
                sms: 132,
                context_ms: 0,
                kernel_check_us: 5000,
            },
            asked_sms: None,
            mailbox: FileId { dev: 1, ino: 2 },
            loaded: None,
            mapped: Vec::new(),
        }));
        let (line, fds) = recv_line_with_fd(&stream, 4096).unwrap();
        heard.push(line.clone());
        if line.contains("retire") {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
        answer(&Reply::Done);
        let got = fds.len();
        let fd_socket = fds.into_iter().next().map(std::os::unix::net::UnixStream::from);
        // The protocol goes on over the socket: an export sends a descriptor (a pipe's write end
        // here, with the asked tag) on the new fd socket; a retire ends it.
        let mut reader = BufReader::new(&stream);
        loop {
            let mut rest = String::new();
            if reader.read_line(&mut rest).unwrap_or(0) == 0 {
                break;
            }
            heard.push(rest.trim_end().to_string());
            if let Ok(mesh_mps_worker::Command::Export { channel, bytes }) = serde_json::from_str(rest.trim_end()) {
                let (_, w) = std::io::pipe().unwrap();
                let socket = fd_socket.as_ref().expect("the fd socket came with the adopt");
                mesh_mps_worker::fdpass::send_fd(socket, std::os::fd::AsFd::as_fd(&w), FdTag { channel, bytes })
                    .unwrap();
                answer(&Reply::Done);
            }
            if rest.contains("retire") {
                let _ = Command::new("kill").arg(pid.to_string()).status();
                break;
            }
        }
        (heard, got)
    });
    (child, t)
}

/// The stand-in control binary, named by `MESH_MPS_CONTROL` for every test of this binary.
fn fake_control() -> std::path::PathBuf {
    static CONTROL: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> = std::sync::OnceLock::new();
    CONTROL
        .get_or_init(|| {
            let bin = tempfile::tempdir().unwrap();
            let control = script(bin.path(), "nvidia-cuda-mps-control", FAKE_CONTROL);
            // SAFETY: set once, inside the OnceLock's initialisation, before any test of this
            // binary reads the environment (each first waits here for the path).
            unsafe { std::env::set_var("MESH_MPS_CONTROL", &control) };
            (bin, control)
        })
        .1
        .clone()
}

/// The orphan policy of a test on MPS directory `orphans`' parent.
fn policy(orphans: &Path, control: &Path) -> OrphanPolicy {
    OrphanPolicy {
        grace: Duration::from_secs(60),
        stop_deadline: Duration::from_millis(500),
        rendezvous_dir: orphans.to_path_buf(),
        control: control.to_path_buf(),
    }
}

#[test]
fn a_running_daemon_is_adopted_with_its_busy_orphans_and_an_idle_orphan_is_retired() {
    let control = fake_control();
    let root = tempfile::tempdir_in("/tmp").unwrap();
    let root = root.path().to_path_buf();
    let pipe = root.join("pipe");
    let orphans = root.join("orphans");
    std::fs::create_dir_all(&pipe).unwrap();
    std::fs::create_dir_all(&orphans).unwrap();
    // The previous meshd's daemon, still running.
    let mut daemon = Command::new(&control).arg("-f").env(PIPE_ENV, &pipe).spawn().unwrap();
    let (mut busy, busy_thread) = orphan(&orphans, &pipe, KernelState::Busy);
    let (mut idle, idle_thread) = orphan(&orphans, &pipe, KernelState::Idle);
    std::fs::write(pipe.join("clients"), format!("{}\n{}\n", busy.id(), idle.id())).unwrap();
    let c = MpsControl::start_in(root.clone(), false, Some(policy(&orphans, &control))).unwrap();
    assert!(c.adopted(), "the running daemon is adopted, not quit");
    assert_eq!(c.pid(), Some(daemon.id()));
    assert!(!pipe.join("quit").exists(), "nobody told it to quit");

    // The idle orphan was retired (its sleep ended), the busy one greeted.
    let (heard, _) = idle_thread.join().unwrap();
    assert_eq!(heard[1], r#"{"op":"retire"}"#, "{heard:?}");
    // Gone: reaped by the test, or already through the pidfd that held it (it is our child here).
    let reaped = idle.wait().is_ok();
    assert!(reaped || !mesh_mps_worker::orphan::process_alive(idle.id()), "the retired orphan is gone");
    let greeted = c.take_greeted();
    assert_eq!(greeted.len(), 1);
    let g = greeted.into_iter().next().unwrap();
    assert_eq!((g.orphan.pid, g.server, g.orphan.slot), (busy.id(), 4242, Some(1)));
    assert!(matches!(g.held, Held::Adopted { pid, .. } if pid == busy.id()));

    // The backend's part: the adopt line, with a new fd socket, answered `done`.
    let (news, _rx) = NewsSender::channel();
    let mut w = Worker::adopt(g.stream, g.held, &g.orphan, g.server, &news).unwrap();
    assert!(w.adopted() && w.alive());
    // A device ring it maps, handed over on the fd socket that came with the adopt.
    let ring = w.export_ring(3, 2 << 20).unwrap();
    let mode = rustix::fs::fstat(&ring).unwrap().st_mode;
    assert_eq!(rustix::fs::FileType::from_raw_mode(mode), rustix::fs::FileType::Fifo, "the descriptor it sent");
    assert_eq!((w.pid(), w.kernel(), w.ready.sms), (busy.id(), KernelState::Busy, 132));
    // Ended as the backend's teardown ends an adoptee no program claimed: asked to retire.
    assert!(
        w.retire(Duration::from_secs(10)),
        "it left when asked (SIGTERM, by the stand-in), not killed at the bound"
    );
    let (heard, fds) = busy_thread.join().unwrap();
    let hello = format!(r#"{{"op":"hello","protocol":{PROTOCOL}}}"#);
    let export = r#"{"op":"export","channel":3,"bytes":2097152}"#;
    assert_eq!(heard, [hello.as_str(), r#"{"op":"adopt"}"#, export, r#"{"op":"retire"}"#]);
    assert_eq!(fds, 1, "the new fd socket rode on the adopt line");
    // Its status went to the pidfd's watch, which reaps an adopted worker that is our child.
    assert!(busy.wait().is_err(), "already reaped through its pidfd");

    assert!(c.quit(), "the adopted daemon quits when asked, not killed at the bound");
    assert!(daemon.wait().is_err(), "already reaped through its pidfd");
}

#[test]
fn after_a_fault_moved_the_programs_to_the_standby_its_daemon_is_adopted_and_the_new_standby_made_in_the_other() {
    let control = fake_control();
    let root = tempfile::tempdir_in("/tmp").unwrap();
    let root = root.path().to_path_buf();
    let [nested, first] = mesh_mps::orphans::pipe_dirs(&root);
    let orphans = root.join("orphans");
    for d in [&nested, &first, &orphans] {
        std::fs::create_dir_all(d).unwrap();
    }
    // The previous meshd's two daemons: the faulted one in the MPS directory, which runs nothing
    // now, and the standby's, which took the programs over at the fault.
    let mut faulted = Command::new(&control).arg("-f").env(PIPE_ENV, &first).spawn().unwrap();
    let mut active = Command::new(&control).arg("-f").env(PIPE_ENV, &nested).spawn().unwrap();
    let (mut busy, busy_thread) = orphan(&orphans, &nested, KernelState::Busy);
    std::fs::write(nested.join("clients"), format!("{}\n", busy.id())).unwrap();
    let c = MpsControl::start_in(root.clone(), true, Some(policy(&orphans, &control))).unwrap();
    assert!(c.adopted(), "the daemon the programs run on is adopted");
    assert_eq!(c.pid(), Some(active.id()));
    assert_eq!(c.root(), nested.parent().unwrap(), "the adopted daemon's own directory");
    assert_eq!(c.mps_dir(), root);
    assert!(!nested.join("quit").exists(), "nobody told the adopted daemon to quit");
    // Told on a thread of its own, which the start does not wait for.
    let by = std::time::Instant::now() + Duration::from_secs(10);
    while !first.join("quit").exists() && std::time::Instant::now() < by {
        std::thread::sleep(Duration::from_millis(10));
    }
    let told = first.join("quit").exists();
    assert!(told, "the faulted server's daemon was told to quit");
    let _ = faulted.wait();
    let greeted = c.take_greeted();
    assert_eq!(greeted.iter().map(|g| (g.orphan.pid, g.server)).collect::<Vec<_>>(), [(busy.id(), 4242)]);

    // The new standby: a daemon of its own in the MPS directory, under the same claim.
    std::fs::remove_file(first.join("quit")).unwrap();
    let standby = MpsControl::start_standby(&c).unwrap();
    assert_eq!(standby.root(), root);
    assert_eq!(standby.pipe_dir(), first);
    assert!(standby.pid().is_some_and(|p| p != faulted.id() && p != active.id()), "a new daemon");
    let again = MpsControl::start_in(root.clone(), false, None).unwrap_err().to_string();
    assert!(again.contains("in use by the meshd with pid"), "{again}");

    // Ended as an adoptee no program claims; then both daemons quit, the nested one first, and
    // the MPS directory (made by "meshd" here) removed by the one that runs in it.
    let line = greeted.into_iter().next().unwrap().retire(
        &control,
        &mesh_mps::orphans::pipe_dirs(&root),
        Duration::from_millis(500),
        "the test ends",
    );
    assert!(line.ends_with("retired"), "{line}");
    let (heard, _) = busy_thread.join().unwrap();
    assert_eq!(heard[1], r#"{"op":"retire"}"#, "{heard:?}");
    let _ = busy.wait();
    assert!(c.quit());
    assert!(root.exists(), "the nested daemon leaves the MPS directory to the other");
    assert!(standby.quit());
    assert!(!root.exists(), "removed by the daemon that runs in it");
    assert!(active.wait().is_err(), "already reaped through its pidfd");
}
