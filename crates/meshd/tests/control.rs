//! The control plane against a stand-in backend: concurrency (a silent client or a slow load delays no `ps`), bounded requests, idle clients dropped, peer checks, shutdown.

mod common;

use std::io::{BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{ListBackend, PTX, ask, load_req, within};
use mesh_shm::Mailbox;
use meshd::protocol::{MAX_LINE, Request, read_response};
use meshd::server::{Limits, Server, StopHandle};
use meshd::start::bind_socket;
use meshd::state::StateStore;

/// Generous: only a deadline for things that should take milliseconds.
const DEADLINE: Duration = Duration::from_secs(20);

struct Running {
    socket: PathBuf,
    mailbox: Mailbox,
    stop: StopHandle,
    server: Option<JoinHandle<bool>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(make: impl FnOnce(&Mailbox) -> ListBackend + Send + 'static) -> Self {
        Self::start_with_state(make, None)
    }

    fn start_with_state(make: impl FnOnce(&Mailbox) -> ListBackend + Send + 'static, state: Option<&Path>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sock");
        let mailbox = common::small_mailbox(dir.path());
        let store = state.map(|s| StateStore::open(s).unwrap());
        let server = Server::start(mailbox.clone(), Limits::default(), store, move |mb| make(mb).opened()).unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket, mailbox, stop, server, _dir: dir }
    }

    /// Waits (with a deadline) for the server loop to end; its result.
    fn ended(&mut self) -> Option<bool> {
        let h = self.server.take().unwrap();
        within(DEADLINE, move || h.join().unwrap())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.server.is_some() {
            self.stop.stop();
        }
    }
}

fn connect_silent(socket: &Path) -> UnixStream {
    let c = UnixStream::connect(socket).unwrap();
    c.set_read_timeout(Some(DEADLINE)).unwrap();
    c
}

#[test]
fn requests_and_refusals_are_served_until_shutdown() {
    let mut d = Running::start(ListBackend::new);
    assert_eq!(std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(bind_socket(&d.socket).unwrap_err().to_string().contains("another meshd"));
    let r = ask(&d.socket, &load_req("a", &[]), PTX);
    assert!(r.ok, "{r:?}");
    assert_eq!(r.programs.unwrap()[0].grid, [2, 1, 1]);
    assert!(r.backend_us.is_some(), "a change says how long the backend took");
    let r = ask(&d.socket, &load_req("a", &[]), PTX);
    assert!(!r.ok && r.error.unwrap().contains("already loaded"));
    let mut junk = load_req("b", &[]);
    if let Request::Load { image_len, .. } = &mut junk {
        *image_len = 4;
    }
    let r = ask(&d.socket, &junk, b"junk");
    assert!(!r.ok && r.error.unwrap().contains("neither PTX"));
    assert!(
        ask(
            &d.socket,
            &Request::ChannelCreate {
                name: "c".into(),
                msg_size: 16,
                capacity: 8,
                placement: String::new(),
                protocol: String::new(),
                parts: 1,
            },
            &[]
        )
        .ok
    );
    let r = ask(
        &d.socket,
        &Request::ChannelCreate {
            name: "d".into(),
            msg_size: 12,
            capacity: 8,
            placement: String::new(),
            protocol: String::new(),
            parts: 1,
        },
        &[],
    );
    assert!(!r.ok && r.error.unwrap().contains("multiple of 8"));
    let info = ask(&d.socket, &Request::Info, &[]).info.unwrap();
    assert_eq!((info.mode.as_str(), info.channels.len(), info.channels[0].name.as_str()), ("blink", 1, "c"));
    assert_eq!(info.device, "test double");
    let r = ask(&d.socket, &Request::Upgrade { name: "a".into(), image_len: PTX.len() }, PTX);
    assert_eq!(r.programs.unwrap()[0].generation, 2);
    let ps = ask(&d.socket, &Request::Ps, &[]).programs.unwrap();
    assert_eq!((ps.len(), ps[0].generation), (1, 2), "ps shows the snapshot published after the upgrade");
    assert!(!ask(&d.socket, &Request::Unload { name: "zzz".into() }, &[]).ok);
    let mut raw = UnixStream::connect(&d.socket).unwrap();
    raw.write_all(b"not json\n").unwrap();
    let r = read_response(&mut BufReader::new(raw)).unwrap();
    assert!(!r.ok && r.error.unwrap().contains("malformed request"));
    assert!(ask(&d.socket, &Request::Unload { name: "a".into() }, &[]).ok);
    assert!(ask(&d.socket, &Request::Ps, &[]).programs.unwrap().is_empty());
    assert!(ask(&d.socket, &Request::Shutdown, &[]).ok);
    assert_eq!(d.ended(), Some(true), "a clean shutdown ends the server");
}

#[test]
fn heartbeats_in_ps_are_read_fresh_from_the_slots() {
    let d = Running::start(ListBackend::new);
    assert!(ask(&d.socket, &load_req("a", &[]), PTX).ok);
    // Nothing asks the backend again: only the slot changes (as a kernel would change it).
    let slot = d.mailbox.slot(0).unwrap();
    assert!(slot.in_use());
    let words = d.mailbox.as_raw_parts().0;
    let heartbeat_at = usize::try_from(slot.offset()).unwrap()
        + core::mem::offset_of!(mesh_shm::layout::Slot, status)
        + core::mem::offset_of!(mesh_shm::layout::SlotStatus, heartbeat);
    // SAFETY: the heartbeat word of slot 0 lies inside the mapping and is 8-aligned; nothing else writes it here.
    unsafe { std::sync::atomic::AtomicU64::from_ptr(words.add(heartbeat_at).cast()) }
        .store(4242, std::sync::atomic::Ordering::Release);
    assert_eq!(ask(&d.socket, &Request::Ps, &[]).programs.unwrap()[0].heartbeat, 4242);
}

#[test]
fn a_silent_client_delays_no_other_and_is_dropped_after_its_idle_limit() {
    let d = Running::start(ListBackend::new);
    let mut silent = connect_silent(&d.socket);
    let socket = d.socket.clone();
    let ps = within(DEADLINE, move || ask(&socket, &Request::Ps, &[]));
    assert!(ps.is_some_and(|r| r.ok), "ps answered while a silent client is connected");
    // The silent one is told why, then closed (the default idle limit is 2 s; the deadline is generous).
    let mut got = String::new();
    silent.read_to_string(&mut got).expect("the daemon closes the silent connection before the deadline");
    assert!(got.contains("no data from the client") && got.contains("\"ok\":false"), "{got}");
}

#[test]
fn a_slow_load_delays_neither_ps_nor_info_and_changes_apply_in_order() {
    let (open_gate, gate) = mpsc::channel();
    let (log_tx, log) = mpsc::channel();
    let d = Running::start(move |mb| ListBackend::new(mb).with_gate(gate).with_log(log_tx));
    let socket = d.socket.clone();
    let slow = std::thread::spawn(move || ask(&socket, &load_req("slow", &[]), PTX));
    assert_eq!(log.recv_timeout(DEADLINE).unwrap(), "waiting:slow", "the slow load is on the backend thread");
    let socket = d.socket.clone();
    let queued = std::thread::spawn(move || ask(&socket, &load_req("after", &[]), PTX));
    let socket = d.socket.clone();
    let (ps, info) = within(DEADLINE, move || (ask(&socket, &Request::Ps, &[]), ask(&socket, &Request::Info, &[])))
        .expect("ps and info answer while the backend is busy");
    assert!(ps.ok && info.ok);
    assert!(!slow.is_finished(), "the slow load is still held");
    open_gate.send(()).unwrap();
    assert!(slow.join().unwrap().ok);
    assert!(queued.join().unwrap().ok);
    let order: Vec<String> = log.try_iter().collect();
    assert_eq!(order, ["slow", "after"], "changes apply one at a time, in arrival order");
}

#[test]
fn an_oversized_request_line_is_refused_and_the_connection_closed() {
    let d = Running::start(ListBackend::new);
    let mut c = connect_silent(&d.socket);
    let mut writer = c.try_clone().unwrap();
    // More than the limit without a newline; the daemon stops reading after the limit.
    let sender = std::thread::spawn(move || {
        let chunk = vec![b'a'; 16 << 10];
        for _ in 0..((4 * MAX_LINE) / chunk.len()) {
            if writer.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let r = read_response(&mut BufReader::new(&mut c)).unwrap();
    assert!(!r.ok && r.error.as_deref().unwrap().contains(&format!("longer than {MAX_LINE} bytes")), "{r:?}");
    let mut rest = Vec::new();
    assert_eq!(c.read_to_end(&mut rest).unwrap_or(0), 0, "closed after the refusal");
    sender.join().unwrap();
    // A line of exactly the limit is read (and refused only as malformed).
    let mut c = connect_silent(&d.socket);
    let mut line = vec![b' '; MAX_LINE];
    line.push(b'\n');
    c.write_all(&line).unwrap();
    let r = read_response(&mut BufReader::new(c)).unwrap();
    assert!(r.error.unwrap().contains("malformed request"));
}

#[test]
fn many_clients_at_once_all_get_answers() {
    let d = Running::start(ListBackend::new);
    let _silent: Vec<UnixStream> = (0..4).map(|_| connect_silent(&d.socket)).collect();
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let socket = d.socket.clone();
            std::thread::spawn(move || {
                let mut ok = 0;
                for k in 0..5 {
                    let req = match k {
                        0 => Request::ChannelCreate {
                            name: format!("c{i}"),
                            msg_size: 8,
                            capacity: 2,
                            placement: String::new(),
                            protocol: String::new(),
                            parts: 1,
                        },
                        1 => load_req(&format!("p{i}"), &[]),
                        _ => Request::Ps,
                    };
                    let image: &[u8] = if k == 1 { PTX } else { &[] };
                    ok += usize::from(ask(&socket, &req, image).ok);
                }
                ok
            })
        })
        .collect();
    let total: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    // 8 slots and 8 channel descriptors: 8 of each succeed, the rest are refusals; every ps succeeds.
    assert_eq!(total, 16 * 3 + 8 + 8);
    assert_eq!(ask(&d.socket, &Request::Ps, &[]).programs.unwrap().len(), 8);
}

#[test]
fn shutdown_while_clients_are_connected_ends_the_daemon() {
    let mut d = Running::start(ListBackend::new);
    assert!(ask(&d.socket, &load_req("a", &[]), PTX).ok);
    let silent: Vec<UnixStream> = (0..3).map(|_| connect_silent(&d.socket)).collect();
    assert!(ask(&d.socket, &Request::Shutdown, &[]).ok);
    assert_eq!(d.ended(), Some(true), "the daemon ends with silent clients connected");
    assert!(!d.mailbox.slot(0).unwrap().in_use(), "the backend stopped its programs");
    drop(silent);
}

#[test]
fn a_stop_from_a_signal_ends_the_daemon_and_refuses_what_is_queued() {
    let (open_gate, gate) = mpsc::channel();
    let (log_tx, log) = mpsc::channel();
    let mut d = Running::start(move |mb| ListBackend::new(mb).with_gate(gate).with_log(log_tx));
    let socket = d.socket.clone();
    let slow = std::thread::spawn(move || ask(&socket, &load_req("slow", &[]), PTX));
    assert_eq!(log.recv_timeout(DEADLINE).unwrap(), "waiting:slow");
    let socket = d.socket.clone();
    let queued = std::thread::spawn(move || ask(&socket, &load_req("queued", &[]), PTX));
    // Give the queued request time to reach the queue; if it comes after the stop it is refused all the same.
    std::thread::sleep(Duration::from_millis(100));
    d.stop.stop();
    open_gate.send(()).unwrap();
    assert!(slow.join().unwrap().ok, "the change in progress completes");
    let q = queued.join().unwrap();
    assert!(!q.ok && q.error.unwrap().contains("shutting down"), "a queued change is refused");
    assert_eq!(d.ended(), Some(true));
}

#[test]
fn a_refusal_says_refused_once() {
    let d = Running::start(ListBackend::new);
    let r = ask(&d.socket, &load_req("degraded", &[]), PTX);
    let err = r.error.unwrap();
    assert!(!r.ok && err.contains("degraded") && !err.starts_with("refused:"), "{err}");
}

#[test]
fn programs_are_recorded_and_relaunched_by_the_next_server() {
    let state = tempfile::tempdir().unwrap();
    let mut d = Running::start_with_state(ListBackend::new, Some(state.path()));
    assert!(
        ask(
            &d.socket,
            &Request::ChannelCreate {
                name: "in".into(),
                msg_size: 8,
                capacity: 4,
                placement: String::new(),
                protocol: String::new(),
                parts: 1,
            },
            &[]
        )
        .ok
    );
    assert!(ask(&d.socket, &load_req("a", &["in"]), PTX).ok);
    assert!(ask(&d.socket, &load_req("b", &[]), PTX).ok);
    assert!(ask(&d.socket, &Request::Unload { name: "b".into() }, &[]).ok);
    let recorded = StateStore::open(state.path()).unwrap();
    assert_eq!(recorded.recorded().channels.len(), 1);
    assert_eq!(recorded.recorded().programs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a"]);
    assert!(ask(&d.socket, &Request::Shutdown, &[]).ok);
    assert_eq!(d.ended(), Some(true));
    // A new server (a new mailbox: the channel is recreated from the record first) relaunches "a".
    let dir = tempfile::tempdir().unwrap();
    let mailbox = common::small_mailbox(dir.path());
    let mut store = StateStore::open(state.path()).unwrap();
    assert_eq!(store.restore_channels(&mailbox).unwrap(), 1);
    let server =
        Server::start(mailbox.clone(), Limits::default(), Some(store), |mb| ListBackend::new(mb).opened()).unwrap();
    assert_eq!(server.relaunched, (1, 0));
    assert!(mailbox.slot(0).unwrap().in_use());
    assert_eq!(mailbox.slot(0).unwrap().bindings(), [mailbox.channel("in").unwrap().index]);
    let stop = server.stop_handle();
    let socket = dir.path().join("sock");
    let listener = bind_socket(&socket).unwrap();
    let h = std::thread::spawn(move || server.run(listener).unwrap());
    stop.stop();
    assert_eq!(within(DEADLINE, move || h.join().unwrap()), Some(true));
}

#[test]
fn a_peer_of_another_user_is_refused() {
    if !rustix::process::getuid().is_root() {
        eprintln!("SKIPPED a_peer_of_another_user_is_refused: needs root to connect as another uid");
        return;
    }
    let d = Running::start(ListBackend::new);
    // Open the socket to everyone, so that only the peer check stands between uid 65534 and meshd.
    std::fs::set_permissions(d.socket.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("ps")
        .env_remove("MESHD_LOG")
        .uid(65534)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED a_peer_of_another_user_is_refused: cannot run as uid 65534 ({e})");
            return;
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Permission denied") {
        eprintln!("SKIPPED a_peer_of_another_user_is_refused: uid 65534 cannot reach the binary or socket: {err}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("uid 65534 may not control this meshd"), "{err}");
    assert!(ask(&d.socket, &Request::Ps, &[]).ok, "our own uid still may");
}

use std::os::unix::process::CommandExt;

/// A backend double with a watchdog: `watch` counts its calls, and once the test raises `fault`
/// (as a kernel fault would, with no request) it "recovers": `b` left stopped and named, the others
/// relaunched with a restart counted. With `hold`, the recovery waits for the test (a slow search).
struct Watched {
    inner: ListBackend,
    fault: std::sync::Arc<std::sync::atomic::AtomicBool>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    hold: Option<mpsc::Receiver<()>>,
    entered: Option<mpsc::Sender<()>>,
}

impl mesh_backend::Backend for Watched {
    fn mode(&self) -> mesh_backend::IsolationMode {
        self.inner.mode()
    }
    fn load(&mut self, spec: mesh_backend::ProgramSpec) -> mesh_backend::Result<mesh_backend::ProgramStatus> {
        self.inner.load(spec)
    }
    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> mesh_backend::Result<mesh_backend::ProgramStatus> {
        self.inner.upgrade(name, image)
    }
    fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
        self.inner.unload(name)
    }
    fn status(&self) -> Vec<mesh_backend::ProgramStatus> {
        self.inner.status()
    }
    fn shutdown(&mut self) -> mesh_backend::Result<()> {
        self.inner.shutdown()
    }
    fn host_atomics(&self) -> bool {
        false
    }
    fn watch(&mut self) -> Vec<String> {
        use std::sync::atomic::Ordering;
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !self.fault.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        if let Some(entered) = &self.entered {
            let _ = entered.send(());
        }
        if let Some(hold) = &self.hold {
            let _ = hold.recv();
        }
        self.inner.watch_recovered("b", "illegal address")
    }
}

impl ListBackend {
    /// What a recovery leaves: `culprit` faulted and named, every other program relaunched once.
    fn watch_recovered(&mut self, culprit: &str, error: &str) -> Vec<String> {
        self.set_all(|p| {
            p.last_fault = Some(format!("GPU fault: {error}"));
            p.last_fault_unix_ms = Some(1);
            if p.name == culprit {
                p.state = mesh_backend::ProgramState::Faulted("left stopped: it caused a GPU fault".into());
                p.stopped_why = Some("left stopped: it caused a GPU fault".into());
            } else {
                p.restarts += 1;
                p.generation += 1;
            }
        });
        vec![format!("recovered; culprit {culprit}")]
    }
}

fn watched(
    hold: Option<mpsc::Receiver<()>>,
    entered: Option<mpsc::Sender<()>>,
) -> (Running, std::sync::Arc<std::sync::atomic::AtomicBool>, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let fault = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (f, c) = (fault.clone(), calls.clone());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let mailbox = common::small_mailbox(dir.path());
    let server = Server::start(mailbox.clone(), Limits::default(), None, move |mb| {
        Ok(meshd::server::Opened {
            backend: Box::new(Watched { inner: ListBackend::new(mb), fault: f, calls: c, hold, entered }),
            device: "test double".into(),
            arch: None,
        })
    })
    .unwrap();
    let listener = bind_socket(&socket).unwrap();
    let stop = server.stop_handle();
    let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
    (Running { socket, mailbox, stop, server, _dir: dir }, fault, calls)
}

#[test]
fn the_watchdog_ticks_with_no_request_and_ps_shows_what_it_recovered() {
    use std::sync::atomic::Ordering;
    assert!(Limits::default().watch <= Duration::from_millis(50), "the tick is at most 50 ms");
    let (d, fault, calls) = watched(None, None);
    for name in ["a", "b", "c"] {
        assert!(ask(&d.socket, &load_req(name, &[]), PTX).ok);
    }
    let before = calls.load(Ordering::Relaxed);
    assert!(
        common::wait_until(DEADLINE, || calls.load(Ordering::Relaxed) >= before + 3),
        "the backend thread calls watch by itself"
    );
    // A fault, and no request but ps (which the backend never sees).
    fault.store(true, Ordering::Release);
    let mut rows = Vec::new();
    let recovered = common::wait_until(DEADLINE, || {
        rows = ask(&d.socket, &Request::Ps, &[]).programs.unwrap();
        rows.iter().any(|r| r.state.starts_with("faulted"))
    });
    assert!(recovered, "the recovery was published with no request: {rows:?}");
    let b = rows.iter().find(|r| r.name == "b").unwrap();
    assert!(b.stopped_why.as_deref().unwrap().contains("left stopped"), "{b:?}");
    assert_eq!(b.last_fault.as_deref(), Some("GPU fault: illegal address"));
    assert_eq!(b.restarts, 0);
    for r in rows.iter().filter(|r| r.name != "b") {
        assert_eq!((r.state.as_str(), r.restarts, r.generation), ("running", 1, 2), "{r:?}");
        assert!(r.last_fault.is_some() && r.last_fault_unix_ms.is_some() && r.stopped_why.is_none(), "{r:?}");
    }
    // The new fields travel as JSON, and an old client's row (without them) still reads.
    let json = serde_json::to_string(b).unwrap();
    assert!(json.contains("\"restarts\":0") && json.contains("stopped_why"), "{json}");
    let old: meshd::protocol::ProgramRow = serde_json::from_str(
        r#"{"name":"x","slot":0,"state":"running","generation":1,"heartbeat":0,"worker_pid":null,"sms":null,"kind":"ptx","grid":[1,1,1],"block":[32,1,1]}"#,
    )
    .unwrap();
    assert_eq!((old.restarts, old.last_fault), (0, None));
}

#[test]
fn ps_answers_while_a_recovery_runs() {
    use std::sync::atomic::Ordering;
    let (hold_tx, hold) = mpsc::channel();
    let (entered_tx, entered) = mpsc::channel();
    let (d, fault, _) = watched(Some(hold), Some(entered_tx));
    for name in ["a", "b"] {
        assert!(ask(&d.socket, &load_req(name, &[]), PTX).ok);
    }
    fault.store(true, Ordering::Release);
    entered.recv_timeout(DEADLINE).expect("the watchdog started its recovery");
    let socket = d.socket.clone();
    let ps = within(DEADLINE, move || ask(&socket, &Request::Ps, &[]));
    assert!(ps.is_some_and(|r| r.ok && r.programs.unwrap().len() == 2), "ps answered from the snapshot");
    hold_tx.send(()).unwrap();
    let socket = d.socket.clone();
    assert!(
        common::wait_until(DEADLINE, || ask(&socket, &Request::Ps, &[]).programs.unwrap()[1]
            .state
            .starts_with("faulted")),
        "the recovery's result is published once it ends"
    );
}

#[test]
fn bulk_channels_are_made_by_size_or_by_name_and_hostile_sizes_are_refused() {
    let d = Running::start(ListBackend::new);
    let create = |name: &str, msg_size: u32, capacity: u32, protocol: &str| {
        let req = Request::ChannelCreate {
            name: name.into(),
            msg_size,
            capacity,
            placement: String::new(),
            protocol: protocol.into(),
            parts: 1,
        };
        ask(&d.socket, &req, &[])
    };
    assert!(create("c", 64, 8, "").ok);
    assert!(create("frames", 128 << 10, 2, "").ok, "above 64 KiB: bulk by default");
    assert!(create("tiles", 4096, 4, "bulk").ok, "bulk by name at any multiple of 16");
    for (name, size, capacity, protocol, says) in [
        ("a", 128 << 10, 2, "ll", "for protocol ll"),
        ("b", 24, 4, "bulk", "multiple of 16"),
        ("z", 0, 4, "bulk", "multiple of 16"),
        ("h", 32 << 20, 2, "", "16 MiB"),
        ("o", 16 << 20, 1 << 24, "", "mailbox full"),
        ("p", 64 << 10, 3, "bulk", "power of two"),
        ("q", 4096, 4, "simple", "ll, bulk or index"),
    ] {
        let r = create(name, size, capacity, protocol);
        let e = r.error.unwrap_or_default();
        assert!(!r.ok && e.contains(says), "{name} ({size} B x {capacity}, {protocol:?}): {e}");
    }
    let info = ask(&d.socket, &Request::Info, &[]).info.unwrap();
    let shown: Vec<(&str, &str)> = info.channels.iter().map(|c| (c.name.as_str(), c.protocol.as_str())).collect();
    assert_eq!(shown, [("c", "ll"), ("frames", "bulk"), ("tiles", "bulk")]);
    // The host ends: the bulk ones work, the LL ones refuse naming the protocol.
    let e = mesh_shm::Producer::claim(&d.mailbox, "tiles").unwrap_err().to_string();
    assert!(e.contains("bulk format") && e.contains("BulkProducer"), "{e}");
    let e = mesh_shm::BulkConsumer::claim(&d.mailbox, "c").unwrap_err().to_string();
    assert!(e.contains("ll format"), "{e}");
    let mut tx = mesh_shm::BulkProducer::claim(&d.mailbox, "tiles").unwrap();
    let mut rx = mesh_shm::BulkConsumer::claim(&d.mailbox, "tiles").unwrap();
    tx.send(b"a large message, shortened", DEADLINE).unwrap();
    let mut out = vec![0xffu8; 4096];
    rx.recv(&mut out, DEADLINE).unwrap();
    assert_eq!(&out[..26], b"a large message, shortened");
    assert!(out[26..].iter().all(|&b| b == 0), "a short message is zero-padded");
}

#[test]
fn index_channels_carry_host_messages_through_the_cli_and_no_program_may_bind_one() {
    let d = Running::start(ListBackend::new);
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
            .arg("--socket")
            .arg(&d.socket)
            .args(args)
            .env_remove("MESHD_LOG")
            .output()
            .unwrap()
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let out = cli(&["channel", "create", "hh", "--msg-size", "16", "--capacity", "4", "--protocol", "index"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("protocol index"), "{}", text(&out.stdout));
    // Sizes and placements it does not take: refused (exit 1), naming the value and the rule.
    for (args, says) in [
        (&["--msg-size", "12"][..], "message size 12: must be a multiple of 8 from 8 to 65536 for protocol index"),
        (&["--msg-size", "131072"], "message size 131072: must be a multiple of 8 from 8 to 65536 for protocol index"),
        (&["--capacity", "3"], "capacity 3: must be a power of two"),
        (&["--placement", "device"], "protocol index is for two host processes"),
    ] {
        let out = cli(&[&["channel", "create", "bad", "--protocol", "index"][..], args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
    }
    let info = ask(&d.socket, &Request::Info, &[]).info.unwrap();
    let shown: Vec<(&str, &str)> = info.channels.iter().map(|c| (c.name.as_str(), c.protocol.as_str())).collect();
    assert_eq!(shown, [("hh", "index")], "the refused ones were not made");
    // The CLI's send and recv, which claim Producer/Consumer as for an LL channel.
    let out = cli(&["send", "hh", "one", "two", "three"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = cli(&["recv", "hh", "--count", "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\ntwo\nthree\n");
    let c = d.mailbox.channel("hh").unwrap();
    assert_eq!((c.head, c.tail, c.producer_pid, c.consumer_pid), (3, 3, None, None), "ends released");
    // A program binding it is refused at load, naming the channel and why; nothing changes.
    let slot = |mb: &Mailbox| {
        let s = mb.slot(0).unwrap();
        (s.in_use(), s.generation(), s.bindings())
    };
    let before = slot(&d.mailbox);
    let r = ask(&d.socket, &load_req("p", &["hh"]), PTX);
    let e = r.error.unwrap_or_default();
    assert!(!r.ok && e.contains("channel \"hh\"") && e.contains("protocol index") && e.contains("cannot bind"), "{e}");
    assert!(ask(&d.socket, &Request::Ps, &[]).programs.unwrap().is_empty(), "no program after the refusal");
    assert_eq!(slot(&d.mailbox), before, "the slot a load would take is untouched");
    // The same load bound to an LL channel goes through.
    assert!(cli(&["channel", "create", "ll", "--msg-size", "16", "--capacity", "4"]).status.success());
    assert!(ask(&d.socket, &load_req("p", &["ll"]), PTX).ok);
}
