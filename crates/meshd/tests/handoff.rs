//! `meshd handoff` against a stand-in backend and a stand-in exec: a binary that is no meshd, one
//! from before handoff and one that reads another state format are refused with nothing changed;
//! a compatible one gets the programs handed over (stopped in order, the blink path) and is
//! executed with its path, and a new image on the same mailbox and state relaunches every program.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{ListBackend, PTX, ask, load_req};
use mesh_shm::Mailbox;
use meshd::handoff::THIS_BUILD;
use meshd::protocol::{ProgramRow, Request, Response};
use meshd::server::{Limits, Server, StopHandle};
use meshd::start::bind_socket;
use meshd::state::StateStore;

const DEADLINE: Duration = Duration::from_secs(20);

/// One image of meshd on the shared mailbox and state directory; its exec is a stand-in that
/// reports the binary it was asked to execute (`None`: this image again) and fails.
struct Image {
    socket: PathBuf,
    stop: StopHandle,
    server: Option<JoinHandle<bool>>,
    execs: mpsc::Receiver<Option<PathBuf>>,
}

impl Image {
    fn start(dir: &Path, mailbox: &Mailbox) -> Self {
        let socket = dir.join("sock");
        let _ = std::fs::remove_file(&socket);
        let store = StateStore::open(&dir.join("state")).unwrap();
        let (tx, execs) = mpsc::channel();
        let server = Server::start_with(
            mailbox.clone(),
            Limits::default(),
            Some(store),
            Box::new(move |binary| {
                let _ = tx.send(binary.map(Path::to_path_buf));
                std::io::Error::other("a test does not exec")
            }),
            |mb| ListBackend::new(mb).opened(),
        )
        .unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket, stop, server, execs }
    }

    fn ps(&self) -> Vec<ProgramRow> {
        ask(&self.socket, &Request::Ps, &[]).programs.unwrap()
    }

    fn handoff(&self, binary: &Path) -> Response {
        ask(&self.socket, &Request::Handoff { binary: Some(binary.display().to_string()) }, &[])
    }

    fn stop(mut self) {
        self.stop.stop();
        self.server.take().unwrap().join().unwrap();
    }
}

/// An executable script in `dir` that prints `line` for `--version`.
fn fake_meshd(dir: &Path, name: &str, line: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\necho '{line}'\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_refused_binary_changes_nothing_and_a_compatible_one_gets_the_programs_and_is_executed() {
    let dir = tempfile::tempdir().unwrap();
    let mailbox = common::small_mailbox(dir.path());
    let first = Image::start(dir.path(), &mailbox);
    for name in ["a", "b"] {
        assert!(ask(&first.socket, &load_req(name, &[]), PTX).ok);
    }
    let before = first.ps();
    let v = THIS_BUILD;
    let refused = [
        (fake_meshd(dir.path(), "not-meshd", "something else 1.0"), "not a build of meshd"),
        (fake_meshd(dir.path(), "old-meshd", "meshd 0.0.9"), "from before handoff"),
        (
            fake_meshd(
                dir.path(),
                "new-state",
                &format!(
                    "meshd 9.0.0 (state {}, mailbox layout {}, worker protocol {})",
                    v.state + 1,
                    v.layout,
                    v.worker
                ),
            ),
            "state directory format",
        ),
        (
            fake_meshd(
                dir.path(),
                "new-layout",
                &format!(
                    "meshd 9.0.0 (state {}, mailbox layout {}, worker protocol {})",
                    v.state,
                    v.layout + 1,
                    v.worker
                ),
            ),
            "mailbox layout",
        ),
        (dir.path().join("missing"), "No such file"),
    ];
    for (binary, why) in &refused {
        let r = first.handoff(binary);
        let err = r.error.unwrap_or_default();
        assert!(!r.ok && err.contains("nothing changed") && err.contains(why), "{}: {err}", binary.display());
        assert!(err.contains(&binary.display().to_string()), "the refusal names the file: {err}");
    }
    let relative = ask(&first.socket, &Request::Handoff { binary: Some("meshd".into()) }, &[]);
    assert!(relative.error.as_deref().is_some_and(|e| e.contains("absolute path")), "{relative:?}");
    assert_eq!(first.ps(), before, "every refusal left the programs as they were");
    assert!(first.execs.try_recv().is_err(), "nothing was executed");

    // Another worker protocol is no matter in blink mode: no worker runs on.
    let line =
        format!("meshd 9.0.0 (state {}, mailbox layout {}, worker protocol {})", v.state, v.layout, v.worker + 1);
    let new = fake_meshd(dir.path(), "meshd-9", &line);
    let r = first.handoff(&new);
    assert!(r.ok, "{r:?}");
    let h = r.handoff.expect("the answer says what is handed over");
    assert_eq!((h.binary.as_str(), h.version.as_str()), (new.to_str().unwrap(), line.as_str()));
    assert_eq!((h.running_on, h.stopped, h.late.len()), (0, 2, 0), "{h:?}");
    assert_eq!(first.execs.recv_timeout(DEADLINE).unwrap(), Some(new), "the new binary executed");
    assert_eq!(first.execs.recv_timeout(DEADLINE).unwrap(), None, "its failure: this image again");
    let after = ask(&first.socket, &load_req("c", &[]), PTX);
    assert!(!after.ok, "a handed-over backend takes no change: {after:?}");
    first.stop();

    // The new image (on the same mailbox and state) relaunches both, each at its next generation.
    let recorded = StateStore::open(&dir.path().join("state")).unwrap().recorded().clone();
    assert_eq!(recorded.programs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a", "b"], "kept");
    let second = Image::start(dir.path(), &mailbox);
    let rows = second.ps();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r.state, "running", "{r:?}");
    }
    second.stop();
}
