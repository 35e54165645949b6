//! The replacement of the process after a sticky GPU fault, against a stand-in backend and a
//! stand-in exec: what the old image records, what the new image relaunches and shows, and a
//! culprit found by halves across images. One test: the replacement request is process-wide.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{ListBackend, PTX, ask, load_req, wait_until};
use mesh_backend::watch::{Replacement, Verdict};
use mesh_backend::{Backend, IsolationMode, ProgramSpec, ProgramStatus};
use mesh_shm::Mailbox;
use meshd::protocol::{ProgramRow, Request};
use meshd::server::{Limits, Server, StopHandle};
use meshd::start::bind_socket;
use meshd::state::StateStore;

const DEADLINE: Duration = Duration::from_secs(20);

/// What the stand-in's next watch reports: nothing, a named culprit (`bad`), or an unnamed one.
const QUIET: u8 = 0;
const NAMED: u8 = 1;
const UNNAMED: u8 = 2;

/// A backend whose watch asks for a replacement as the blink backend does after a sticky fault.
struct Sticky {
    inner: ListBackend,
    fault: Arc<AtomicU8>,
    replacement: Option<Replacement>,
}

impl Backend for Sticky {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
    }
    fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
        self.inner.load(spec)
    }
    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> mesh_backend::Result<ProgramStatus> {
        self.inner.upgrade(name, image)
    }
    fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
        self.inner.unload(name)
    }
    fn status(&self) -> Vec<ProgramStatus> {
        self.inner.status()
    }
    fn watch(&mut self) -> Vec<String> {
        let how = self.fault.swap(QUIET, Ordering::AcqRel);
        if how == QUIET {
            return Vec::new();
        }
        let programs: Vec<String> = self.inner.status().into_iter().map(|p| p.name).collect();
        let verdict = match how {
            NAMED => Verdict::Culprit {
                index: programs.iter().position(|p| p == "bad").unwrap(),
                why: "its image was loaded 40 ms before the fault".into(),
            },
            _ => Verdict::Search { suspects: (0..programs.len()).collect(), likely: None },
        };
        let linked = programs.iter().map(|p| (p.clone(), Arc::new(b"\x7fELF linked".to_vec()))).collect();
        self.replacement = Some(Replacement {
            error: "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered".into(),
            programs,
            verdict,
            noticed: Instant::now(),
            linked,
            arch: "sm_90".into(),
        });
        vec!["sticky fault".into()]
    }
    fn take_replacement(&mut self) -> Option<Replacement> {
        self.replacement.take()
    }
    fn shutdown(&mut self) -> mesh_backend::Result<()> {
        self.inner.shutdown()
    }
    fn host_atomics(&self) -> bool {
        false
    }
}

/// One image of meshd: a server on the shared mailbox and state directory.
struct Image {
    socket: PathBuf,
    stop: StopHandle,
    server: Option<JoinHandle<bool>>,
    fault: Arc<AtomicU8>,
    execs: mpsc::Receiver<()>,
}

impl Image {
    fn start(dir: &Path, mailbox: &Mailbox) -> Self {
        let socket = dir.join("sock");
        let store = StateStore::open(&dir.join("state")).unwrap();
        let fault = Arc::new(AtomicU8::new(QUIET));
        let (tx, execs) = mpsc::channel();
        let f = fault.clone();
        let server = Server::start_with(
            mailbox.clone(),
            Limits::default(),
            Some(store),
            Box::new(move |_| {
                let _ = tx.send(());
                std::io::Error::other("a test does not exec")
            }),
            move |mb| {
                Ok(meshd::server::Opened {
                    backend: Box::new(Sticky { inner: ListBackend::new(mb), fault: f, replacement: None }),
                    device: "test double".into(),
                    arch: Some("sm_90".into()),
                })
            },
        )
        .unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket, stop, server, fault, execs }
    }

    fn ps(&self) -> Vec<ProgramRow> {
        ask(&self.socket, &Request::Ps, &[]).programs.unwrap()
    }

    fn row(&self, name: &str) -> ProgramRow {
        self.ps().into_iter().find(|r| r.name == name).unwrap_or_else(|| panic!("{name} in {:?}", self.ps()))
    }

    /// A sticky fault; returns once the image "executed" (the stand-in was called).
    fn fault(&self, how: u8) {
        self.fault.store(how, Ordering::Release);
        self.execs.recv_timeout(DEADLINE).expect("the process is replaced");
    }

    fn stop(mut self) {
        self.stop.stop();
        self.server.take().unwrap().join().unwrap();
    }
}

#[test]
fn a_sticky_fault_replaces_the_process_and_the_new_image_relaunches_all_but_the_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let mailbox = common::small_mailbox(dir.path());
    let state = dir.path().join("state");

    // The first image: three programs, then a fault whose culprit is named.
    let first = Image::start(dir.path(), &mailbox);
    for name in ["a", "b", "bad"] {
        assert!(ask(&first.socket, &load_req(name, &[]), PTX).ok);
    }
    first.fault(NAMED);
    first.stop();
    let recorded = StateStore::open(&state).unwrap().recorded().clone();
    let bad = &recorded.carried["bad"];
    assert!(bad.held.as_ref().is_some_and(|h| h.culprit && h.why.contains("caused a GPU fault: left stopped")));
    assert!(recorded.carried["a"].last_fault.as_deref().is_some_and(|f| f.contains("caused by bad")), "{recorded:?}");
    let pending = recorded.recovery.pending.as_ref().expect("a replacement under way");
    assert_eq!((pending.from_pid, pending.culprit.as_deref()), (std::process::id(), Some("bad")));
    assert!(pending.exec_mono_ns >= pending.noticed_mono_ns);
    assert_eq!(recorded.recovery.reexecs_unix_ms.len(), 1);
    // The three share one image: one linked image, by its hash and the GPU architecture.
    assert_eq!(std::fs::read_dir(state.join("linked")).unwrap().count(), 1, "the linked image stored");

    // The new image: a and b relaunched (from the linked images), bad left stopped and named.
    let second = Image::start(dir.path(), &mailbox);
    let bad = second.row("bad");
    assert!(bad.state.starts_with("faulted") && bad.state.contains("left stopped"), "{bad:?}");
    assert!(bad.stopped_why.as_deref().is_some_and(|w| w.contains("caused a GPU fault")), "{bad:?}");
    assert!(bad.last_fault.is_some() && bad.last_fault_unix_ms.is_some(), "{bad:?}");
    assert_eq!(bad.slot, meshd::server::HELD_SLOT);
    for name in ["a", "b"] {
        let r = second.row(name);
        assert_eq!((r.state.as_str(), r.restarts, r.kind.as_str()), ("running", 1, "ptx"), "{r:?}");
        assert!(r.last_fault.as_deref().is_some_and(|f| f.contains("caused by bad")), "{r:?}");
    }
    assert!(StateStore::open(&state).unwrap().recorded().recovery.pending.is_none(), "reported once");
    // An upgrade revives the culprit and clears its mark.
    let up = ask(&second.socket, &Request::Upgrade { name: "bad".into(), image_len: PTX.len() }, PTX);
    assert!(up.ok, "{up:?}");
    assert!(second.ps().iter().all(|r| r.state == "running"), "{:?}", second.ps());
    assert!(StateStore::open(&state).unwrap().recorded().carried["bad"].held.is_none());

    // A fault nothing names: the next image asks the first half, holding the rest back.
    second.fault(UNNAMED);
    second.stop();
    let third = Image::start(dir.path(), &mailbox);
    let held: Vec<ProgramRow> = third.ps().into_iter().filter(|r| r.state != "running").collect();
    assert_eq!(held.len(), 1, "one suspect held back: {:?}", third.ps());
    assert!(held[0].stopped_why.as_deref().is_some_and(|w| w.contains("searched")), "{held:?}");
    let refused = ask(&third.socket, &load_req("late", &[]), PTX);
    assert!(refused.error.as_deref().is_some_and(|e| e.contains("searching the culprit")), "{refused:?}");
    // The half runs clean: the one held back is the culprit, and everything else runs.
    assert!(
        wait_until(DEADLINE, || third.ps().iter().any(|r| r.state.starts_with("faulted"))),
        "the search ends: {:?}",
        third.ps()
    );
    let culprit = third.ps().into_iter().find(|r| r.state.starts_with("faulted")).unwrap();
    assert_eq!(culprit.name, held[0].name);
    assert!(culprit.stopped_why.as_deref().is_some_and(|w| w.contains("found by halves")), "{culprit:?}");
    for r in third.ps().into_iter().filter(|r| r.name != culprit.name) {
        assert_eq!(r.state, "running", "{r:?}");
        assert!(r.restarts >= 2, "{r:?}");
        let f = r.last_fault.unwrap_or_default();
        assert!(f.contains(&format!("caused by {}", culprit.name)), "{f}");
    }
    assert!(StateStore::open(&state).unwrap().recorded().recovery.search.is_none());
    assert!(ask(&third.socket, &load_req("late", &[]), PTX).ok, "changes are taken again");
    // Unloading the culprit forgets it.
    assert!(ask(&third.socket, &Request::Unload { name: culprit.name.clone() }, &[]).ok);
    assert!(third.ps().iter().all(|r| r.name != culprit.name));
    third.stop();
}
