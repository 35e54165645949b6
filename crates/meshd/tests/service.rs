//! Services over meshd's real control socket and mailbox, around the stand-in backend: a host program thread serving many clients (threads and processes), clients killed with -9 mid-stream, detach and reattach, refusals, the wire contract, and a restarted meshd that adopts a live client.
//!
//! The "program" is a host thread with the service's host ends (`FanInReceiver`, `GroupServer`),
//! playing what a GPU program binding `svc` and `svc.replies` does: it takes each request, checks
//! its sender's order, replies with the request's first word plus one, and acknowledges departures.
//! Client processes are this test binary run again as [`service_client_child`]. Every wait is a
//! deadline for something that takes milliseconds, never a measurement.
#![allow(clippy::cast_possible_truncation, reason = "test counts and ids")]

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{ListBackend, ask, group_entry, poke, wait_until, within};
use mesh_shm::fanin::{SendOp, Stage, Step};
use mesh_shm::{ClientId, CreateMode, FanInReceiver, FanInSender, GroupServer, Mailbox, MailboxConfig, Replied, Taken};
use meshd::ServiceClient;
use meshd::protocol::{Info, Request, Response, ServiceRow};
use meshd::server::{Limits, Server, StopHandle};
use meshd::start::bind_socket;
use serde_json::{Value, json};

/// Generous: a deadline for what takes milliseconds.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long meshd may take to depart a killed client (its pidfd says so at once).
const DEPARTED_WITHIN: Duration = Duration::from_secs(10);
/// Bytes per request and reply in these tests.
const MSG: usize = 16;

fn config() -> MailboxConfig {
    MailboxConfig { size: 4 << 20, slots: 8, channels: 16 }
}

/// meshd's control plane on a mailbox, as `meshd run` wires it (without a GPU).
struct Meshd {
    socket: PathBuf,
    stop: StopHandle,
    server: Option<JoinHandle<bool>>,
}

impl Meshd {
    /// Serves `mailbox` on `socket` (a stale socket there is replaced), with the default limits (no
    /// stall watcher).
    fn start(mailbox: Mailbox, socket: &Path) -> Self {
        Self::start_with(mailbox, socket, Limits::default())
    }

    /// [`Meshd::start`] with `limits` (the stall watcher's among them).
    fn start_with(mailbox: Mailbox, socket: &Path, limits: Limits) -> Self {
        // MESHD_LOG=info shows meshd's log lines (attach, departures, the start pass) on stderr.
        static LOG: std::sync::Once = std::sync::Once::new();
        LOG.call_once(|| {
            if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("MESHD_LOG") {
                let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
            }
        });
        let server = Server::start(mailbox, limits, None, |mb| ListBackend::new(mb).opened()).unwrap();
        let listener = bind_socket(socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket: socket.to_path_buf(), stop, server }
    }

    /// Stops it and waits for its end.
    fn stop(mut self) {
        self.stop.stop();
        let h = self.server.take().unwrap();
        assert!(within(DEADLINE, move || h.join().unwrap()).is_some(), "the server did not stop");
    }

    fn info(&self) -> Info {
        let r = ask(&self.socket, &Request::Info, &[]);
        assert!(r.ok, "{r:?}");
        r.info.unwrap()
    }

    fn service(&self, name: &str) -> ServiceRow {
        self.info().services.into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no service {name} in info"))
    }

    fn create(&self, name: &str, clients: u32, capacity: u32, reply_capacity: u32) {
        self.create_sharded(name, clients, capacity, reply_capacity, 1);
    }

    /// [`Meshd::create`] with its fan-in channel in `shards` shards.
    fn create_sharded(&self, name: &str, clients: u32, capacity: u32, reply_capacity: u32, shards: u32) {
        let mut req = create_req(name, clients, MSG as u32, capacity, reply_capacity);
        if let Request::ServiceCreate { shards: s, .. } = &mut req {
            *s = shards;
        }
        let r = ask(&self.socket, &req, &[]);
        assert!(r.ok, "{r:?}");
    }
}

impl Drop for Meshd {
    fn drop(&mut self) {
        if self.server.is_some() {
            self.stop.stop();
        }
    }
}

fn create_req(name: &str, clients: u32, msg_size: u32, capacity: u32, reply_capacity: u32) -> Request {
    Request::ServiceCreate {
        name: name.into(),
        clients,
        msg_size,
        capacity,
        reply_size: None,
        reply_capacity,
        shards: 1,
    }
}

/// A new mailbox at `dir/mb` and meshd serving it at `dir/sock`.
fn start(dir: &Path) -> Meshd {
    let mailbox = Mailbox::create(dir.join("mb"), &config(), CreateMode::Exclusive).unwrap();
    Meshd::start(mailbox, &dir.join("sock"))
}

/// Request `k` of client `id`: `k`, the id, and a check word.
fn request(k: u64, id: u32) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..8].copy_from_slice(&k.to_le_bytes());
    m[8..12].copy_from_slice(&id.to_le_bytes());
    m[12..].copy_from_slice(&(!id ^ k as u32).to_le_bytes());
    m
}

/// The reply the program sends to request `k` of `id`: the request with its first word plus one.
fn reply(k: u64, id: u32) -> [u8; MSG] {
    let mut m = request(k, id);
    m[..8].copy_from_slice(&(k + 1).to_le_bytes());
    m
}

fn word(m: &[u8]) -> u64 {
    u64::from_le_bytes(m[..8].try_into().unwrap())
}

/// One slot the program took, as it happened (for a test watching one sender while the others stream).
#[derive(Debug, Clone, Copy)]
struct Took {
    sender: u32,
    /// The request's number, `None` for a skip.
    k: Option<u64>,
    at: Instant,
}

/// What the program saw.
#[derive(Debug, Default)]
struct Served {
    /// Requests taken per sender (each sender's checked to come in order from 0).
    taken: HashMap<u32, u64>,
    /// Senders of the skips taken (a send cut off by its sender's death).
    skips: Vec<u32>,
    /// Departures acknowledged, in order.
    departed: Vec<u32>,
}

/// The host program serving service `name` (what a GPU program binding `name` and `name.replies` does).
struct Program {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Served>,
    /// Every slot taken, as it is taken.
    took: mpsc::Receiver<Took>,
}

impl Program {
    fn start(mailbox: &Mailbox, name: &str) -> Self {
        let mut rx = FanInReceiver::claim(mailbox, name).unwrap();
        let mut srv = GroupServer::claim(mailbox, &format!("{name}.replies")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let (took_tx, took) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            let mut served = Served::default();
            let mut buf = [0u8; MSG];
            let mut since_scan = 0u32;
            while !stopping.load(Ordering::Acquire) {
                let taken = rx.try_take(&mut buf).unwrap();
                since_scan += 1;
                if taken.is_none() || since_scan >= 64 {
                    since_scan = 0;
                    served.departed.extend(srv.departures().unwrap().iter().map(|d| d.0));
                }
                match taken {
                    Some(Taken::Message { sender }) => {
                        let (k, id) = (word(&buf), u32::from_le_bytes(buf[8..12].try_into().unwrap()));
                        assert_eq!(id, sender, "a request carries its sender's id");
                        // Whole: its check word, or zeros where the client sent only the first 12 bytes.
                        let full = request(k, id);
                        assert!(
                            buf == full || (buf[..12] == full[..12] && buf[12..] == [0; 4]),
                            "request {k} of {id:#x}"
                        );
                        let next = served.taken.entry(sender).or_default();
                        assert_eq!(k, *next, "client {sender:#x}: requests in order");
                        *next += 1;
                        let _ = took_tx.send(Took { sender, k: Some(k), at: Instant::now() });
                        loop {
                            match srv.reply(ClientId(sender), &reply(k, id)).unwrap() {
                                Replied::Sent | Replied::Gone => break,
                                // A slow or dead client's ring: its departure turns this into Gone.
                                Replied::Full => {
                                    served.departed.extend(srv.departures().unwrap().iter().map(|d| d.0));
                                    if stopping.load(Ordering::Acquire) {
                                        break;
                                    }
                                    std::thread::sleep(Duration::from_micros(50));
                                }
                            }
                        }
                    }
                    Some(Taken::Skipped { sender }) => {
                        served.skips.push(sender);
                        let _ = took_tx.send(Took { sender, k: None, at: Instant::now() });
                    }
                    None => std::thread::sleep(Duration::from_micros(50)),
                }
            }
            served
        });
        Self { stop, handle, took }
    }

    /// Waits for the first slot the program takes from `sender` (skipping the others'), noting the
    /// others' in `others`.
    fn first_from(&self, sender: u32, others: &mut Vec<Took>) -> Took {
        let end = Instant::now() + DEADLINE;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.took.recv_timeout(left) {
                Ok(t) if t.sender == sender => return t,
                Ok(t) => others.push(t),
                Err(_) => break,
            }
        }
        panic!("the program took nothing from {sender:#x} within {DEADLINE:?}");
    }

    /// What the program has taken since the last look.
    fn took_since(&self) -> Vec<Took> {
        self.took.try_iter().collect()
    }

    fn stop(self) -> Served {
        self.stop.store(true, Ordering::Release);
        self.handle.join().expect("the program thread failed")
    }
}

/// A client's stream: requests in a window of `window`, every reply checked to answer its request
/// in order; runs until `done` says stop (checked between replies) and returns the replies received.
fn stream(client: &mut ServiceClient, window: u64, mut done: impl FnMut(u64) -> bool) -> u64 {
    let id = client.id();
    let (mut sent, mut got) = (0u64, 0u64);
    let mut buf = [0u8; MSG];
    let start = Instant::now();
    loop {
        if sent - got < window && client.try_send(&request(sent, id)).unwrap() {
            sent += 1;
        }
        if client.try_recv(&mut buf).unwrap() {
            assert_eq!(buf, reply(got, id), "client {id:#x}: reply {got} answers request {got}");
            got += 1;
            if done(got) {
                return got;
            }
        } else {
            std::thread::yield_now();
        }
        assert!(start.elapsed() < DEADLINE * 4, "client {id:#x} stuck at {sent} sent, {got} replies");
    }
}

// ---- client processes: this binary run again ----

const ROLE: &str = "MESHD_SERVICE_TEST_CLIENT";

/// In a client process (this binary run again with [`ROLE`] set): the client attached to the
/// service its environment names, having said `ATTACHED <id>`; `None` in a plain test run.
fn attached_as_child() -> Option<ServiceClient> {
    let socket = std::env::var(ROLE).ok()?;
    let service = std::env::var(format!("{ROLE}_SERVICE")).unwrap();
    let client = ServiceClient::connect(Path::new(&socket), &service).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "\nATTACHED {}", client.id()).unwrap();
    out.flush().unwrap();
    Some(client)
}

/// A client process: attaches to the service its environment names, says `ATTACHED <id>`, streams
/// (window 4) and says `STREAMING` after 100 replies and `REPLIES <n>` every 500, until killed.
/// Without its environment (a plain test run) it does nothing.
#[test]
fn service_client_child() {
    let Some(mut client) = attached_as_child() else { return };
    let mut out = std::io::stdout();
    stream(&mut client, 4, |got| {
        if got == 100 {
            writeln!(out, "\nSTREAMING").unwrap();
        }
        if got % 500 == 0 {
            writeln!(out, "\nREPLIES {got}").unwrap();
        }
        out.flush().unwrap();
        false
    });
}

/// Where the detaching client process looks for its signal to detach.
const GO: &str = "MESHD_SERVICE_TEST_GO";

/// A client process that streams until the file its environment names under [`GO`] exists, then
/// detaches and says `DETACHED ok` (or `DETACHED err: <why>`), and lives on until killed.
#[test]
fn service_client_detaching_child() {
    let Some(mut client) = attached_as_child() else { return };
    let go = PathBuf::from(std::env::var(GO).unwrap());
    let mut out = std::io::stdout();
    stream(&mut client, 4, |got| {
        if got == 100 {
            writeln!(out, "\nSTREAMING").unwrap();
            out.flush().unwrap();
        }
        got % 50 == 0 && go.exists()
    });
    match client.detach() {
        Ok(()) => writeln!(out, "\nDETACHED ok").unwrap(),
        Err(e) => writeln!(out, "\nDETACHED err: {e:#}").unwrap(),
    }
    out.flush().unwrap();
    std::thread::sleep(DEADLINE * 4);
}

/// A client process and the lines it prints.
struct ChildClient {
    child: Child,
    lines: mpsc::Receiver<String>,
    id: u32,
}

impl ChildClient {
    fn spawn(socket: &Path, service: &str) -> Self {
        Self::spawn_as("service_client_child", socket, service, &[])
    }

    /// This binary run again as the child test `test`, with `ROLE` (the socket), `ROLE_SERVICE` and
    /// `env` set.
    fn spawn_as(test: &str, socket: &Path, service: &str, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, socket)
            .env(format!("{ROLE}_SERVICE"), service)
            .envs(env.iter().map(|&(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut c = Self { child, lines, id: 0 };
        let attached = c.expect("ATTACHED ");
        c.id = attached.trim().parse().unwrap();
        c
    }

    /// Waits for a line starting with `prefix`; the rest of it.
    fn expect(&mut self, prefix: &str) -> String {
        let end = Instant::now() + DEADLINE;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.to_string();
                    }
                }
                Err(_) => break,
            }
        }
        let status = self.child.try_wait();
        panic!("client process never said {prefix:?} (status {status:?})");
    }

    /// Forgets the lines printed so far.
    fn drain(&mut self) {
        while self.lines.try_recv().is_ok() {}
    }

    fn slot(&self) -> u16 {
        ClientId(self.id).slot()
    }

    fn kill9(mut self) -> u32 {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.id
    }
}

impl Drop for ChildClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the program has acknowledged every departure from `service` (meshd waits for that
/// too, but only 500 ms: a loaded machine may hold the program thread longer).
fn acked(meshd: &Meshd, service: &str) {
    assert!(wait_until(DEADLINE, || meshd.service(service).awaiting_ack == 0), "departures never acknowledged");
}

/// Waits until meshd no longer lists client `id` of `service` (departed).
fn departed(meshd: &Meshd, service: &str, id: u32) {
    assert!(
        wait_until(DEPARTED_WITHIN, || meshd.service(service).clients.iter().all(|c| c.id != id)),
        "meshd never departed client {id:#x}: {:?}",
        meshd.service(service)
    );
}

// ---- the tests ----

#[test]
fn eight_client_threads_each_get_their_own_replies_in_order() {
    eight_client_threads(1);
}

#[test]
fn eight_client_threads_over_four_shards_each_get_their_own_replies_in_order() {
    eight_client_threads(4);
}

/// Eight client threads of a service of `shards` fan-in shards, each its requests answered in order.
fn eight_client_threads(shards: u32) {
    const CLIENTS: usize = 8;
    const REQUESTS: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    meshd.create_sharded("svc", CLIENTS as u32, 256, 16, shards);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let all_attached = Arc::new(Barrier::new(CLIENTS + 1));
    let listed = Arc::new(Barrier::new(CLIENTS + 1));
    let clients: Vec<JoinHandle<u32>> = (0..CLIENTS)
        .map(|_| {
            let (socket, all_attached, listed) = (meshd.socket.clone(), all_attached.clone(), listed.clone());
            std::thread::spawn(move || {
                let mut c = ServiceClient::connect(&socket, "svc").unwrap();
                assert_eq!((c.msg_size(), c.reply_size(), c.service()), (MSG, MSG, "svc"));
                all_attached.wait();
                listed.wait();
                let id = c.id();
                let mut out = [0u8; MSG];
                for k in 0..REQUESTS {
                    c.request(&request(k, id), &mut out, DEADLINE).unwrap();
                    assert_eq!(out, reply(k, id), "client {id:#x}: the reply to request {k}");
                }
                assert!(!c.try_recv(&mut out).unwrap(), "no reply nobody asked for");
                c.detach().unwrap();
                id
            })
        })
        .collect();
    all_attached.wait();
    let row = meshd.service("svc");
    assert_eq!((row.entries, row.bound, row.clients.len()), (CLIENTS as u32, CLIENTS as u32, CLIENTS));
    assert_eq!(row.shards, shards);
    assert!(row.clients.iter().all(|c| c.pid == std::process::id()), "each client's pid: {row:?}");
    listed.wait();
    let mut ids: Vec<u32> = clients.into_iter().map(|h| h.join().expect("a client thread failed")).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CLIENTS, "every client had an id of its own");
    assert_eq!(meshd.service("svc").bound, 0, "every client detached");
    assert!(wait_until(DEADLINE, || meshd.service("svc").awaiting_ack == 0), "the program acknowledged them all");
    let served = program.stop();
    assert!(served.skips.is_empty(), "nobody died: {:?}", served.skips);
    for id in &ids {
        assert_eq!(served.taken.get(id), Some(&REQUESTS), "client {id:#x}'s requests");
    }
    let mut departed = served.departed.clone();
    departed.sort_unstable();
    assert_eq!(departed, ids, "each departure acknowledged once");
    meshd.stop();
}

#[test]
fn client_processes_killed_mid_stream_are_departed_and_the_others_get_every_reply() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    // Two steady client threads, two victims; the replacement must reuse a victim's slot.
    meshd.create("svc", 4, 64, 8);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let stop = Arc::new(AtomicBool::new(false));
    let steady: Vec<JoinHandle<u64>> = (0..2)
        .map(|_| {
            let (socket, stop) = (meshd.socket.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c = ServiceClient::connect(&socket, "svc").unwrap();
                // Until told to stop, and at least 1000 replies: every one checked, in order.
                let got = stream(&mut c, 4, |got| got >= 1000 && stop.load(Ordering::Acquire));
                c.detach().unwrap();
                got
            })
        })
        .collect();
    let mut victims = vec![ChildClient::spawn(&meshd.socket, "svc"), ChildClient::spawn(&meshd.socket, "svc")];
    let pids: Vec<u32> = victims.iter().map(|v| v.child.id()).collect();
    let listed = meshd.service("svc").clients;
    for (v, pid) in victims.iter().zip(&pids) {
        assert!(listed.iter().any(|c| c.id == v.id && c.pid == *pid), "victim {:#x} (pid {pid}) in {listed:?}", v.id);
    }
    let victim_slots: Vec<u16> = victims.iter().map(ChildClient::slot).collect();
    let mut victim_ids = Vec::new();
    for mut v in victims.drain(..) {
        v.expect("STREAMING");
        // Wherever it is: perhaps between the begin and the commit of a send.
        let id = v.kill9();
        departed(&meshd, "svc", id);
        victim_ids.push(id);
    }
    // A new client takes a victim's slot once the program has acknowledged.
    acked(&meshd, "svc");
    let mut next = ChildClient::spawn(&meshd.socket, "svc");
    assert!(victim_slots.contains(&next.slot()), "slot {} reused from {victim_slots:?}", next.slot());
    next.expect("STREAMING");
    let id = next.kill9();
    departed(&meshd, "svc", id);
    victim_ids.push(id);
    stop.store(true, Ordering::Release);
    let got: Vec<u64> = steady.into_iter().map(|h| h.join().expect("a steady client failed")).collect();
    assert!(got.iter().all(|&g| g >= 1000), "{got:?}");
    assert!(wait_until(DEADLINE, || meshd.service("svc").awaiting_ack == 0), "departures acknowledged");
    let row = meshd.service("svc");
    assert_eq!((row.bound, row.clients.len()), (0, 0), "{row:?}");
    let served = program.stop();
    // info's events: five attached (two steady, three victims), three died, two detached, and as
    // many skips as the program took.
    let e = row.events;
    assert_eq!((e.attached, e.died, e.detached, e.stall_killed), (5, 3, 2, 0), "{row:?}");
    assert_eq!(e.skipped, served.skips.len() as u64, "{row:?}");
    assert!(served.skips.len() <= victim_ids.len(), "at most one skip per kill: {:?}", served.skips);
    assert!(served.skips.iter().all(|s| victim_ids.contains(s)), "skips only for the killed: {:?}", served.skips);
    for v in &victim_ids {
        assert!(served.departed.contains(v), "victim {v:#x}'s departure acknowledged: {:?}", served.departed);
    }
    meshd.stop();
}

/// The window: a client keeps at most its reply ring's capacity of requests unanswered. Past it
/// `try_send` says false and `send` fails at once naming the reason, with nothing sent (the program
/// takes exactly the requests the window let out); each reply received opens it by one; it can be
/// narrowed, or lifted for a program that does not answer every request, and a window wider than
/// the ring is refused.
#[test]
fn a_client_keeps_at_most_its_reply_rings_capacity_unanswered() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    meshd.create("svc", 2, 64, 4);
    let mut c = ServiceClient::connect(&meshd.socket, "svc").unwrap();
    let id = c.id();
    assert_eq!((c.window(), c.unanswered()), (Some(4), 0));
    for k in 0..4 {
        assert!(c.try_send(&request(k, id)).unwrap(), "request {k} within the window");
    }
    assert_eq!(c.unanswered(), 4);
    assert!(!c.try_send(&request(4, id)).unwrap(), "the window is full");
    let err = format!("{:#}", c.send(&request(4, id), DEADLINE).unwrap_err());
    assert!(err.contains("4 requests unanswered") && err.contains("receive replies"), "{err}");
    assert!(c.set_window(Some(5)).is_err(), "wider than the reply ring");
    assert!(c.set_window(Some(0)).is_err(), "no request at all");

    // The program answers; each reply received lets one more request out.
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let mut out = [0u8; MSG];
    c.recv(&mut out, DEADLINE).unwrap();
    assert_eq!(out, reply(0, id));
    assert_eq!(c.unanswered(), 3);
    c.send(&request(4, id), DEADLINE).unwrap();
    for k in 1..5 {
        c.recv(&mut out, DEADLINE).unwrap();
        assert_eq!(out, reply(k, id), "reply {k}");
    }
    assert_eq!(c.unanswered(), 0);

    // Narrowed to 1: one request at a time; lifted: six out before any reply is read (the program
    // waits at the fifth reply for room in the ring, and goes on as this client reads).
    c.set_window(Some(1)).unwrap();
    c.send(&request(5, id), DEADLINE).unwrap();
    assert!(!c.try_send(&request(6, id)).unwrap(), "a window of one");
    c.recv(&mut out, DEADLINE).unwrap();
    assert_eq!(out, reply(5, id));
    c.set_window(None).unwrap();
    for k in 6..12 {
        c.send(&request(k, id), DEADLINE).unwrap();
    }
    assert_eq!(c.unanswered(), 6);
    for k in 6..12 {
        c.recv(&mut out, DEADLINE).unwrap();
        assert_eq!(out, reply(k, id), "reply {k}");
    }
    c.detach().unwrap();
    let served = program.stop();
    assert_eq!(served.taken.get(&id), Some(&12), "exactly the requests the window let out, each once");
    meshd.stop();
}

#[test]
fn a_client_detaches_and_attaches_again_and_a_dropped_one_leaves_too() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    // One slot: every attach after the first reuses it.
    meshd.create("svc", 1, 16, 4);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let mut out = [0u8; 32];
    let mut first = ServiceClient::connect(&meshd.socket, "svc").unwrap();
    let id1 = first.id();
    // A short request is zero-padded (the program sees zeros past it); a longer buffer takes the
    // reply in its start.
    first.request(&request(0, id1)[..12], &mut out, DEADLINE).unwrap();
    assert_eq!((out[..MSG].to_vec(), &out[MSG..]), (reply(0, id1).to_vec(), &[0u8; 16][..]));
    assert!(first.recv(&mut [0u8; 8], DEADLINE).unwrap_err().to_string().contains("cannot hold a reply"));
    assert!(first.try_send(&[0u8; MSG + 8]).is_err(), "a request longer than msg_size is refused");
    first.detach().unwrap();
    assert_eq!(meshd.service("svc").bound, 0);
    acked(&meshd, "svc");
    let mut second = ServiceClient::connect(&meshd.socket, "svc").unwrap();
    let id2 = second.id();
    assert_eq!(ClientId(id2).slot(), ClientId(id1).slot(), "the one slot, reused");
    assert_eq!(ClientId(id2).epoch16(), ClientId(id1).epoch16() + 1, "at the next epoch");
    for k in 0..10 {
        second.request(&request(k, id2), &mut out, DEADLINE).unwrap();
        assert_eq!(out[..MSG], reply(k, id2));
    }
    drop(second);
    assert_eq!(meshd.service("svc").bound, 0, "dropping a client detaches it");
    acked(&meshd, "svc");
    let mut third = ServiceClient::connect(&meshd.socket, "svc").unwrap();
    third.request(&request(0, third.id()), &mut out, DEADLINE).unwrap();
    // A client that closes its lease without a detach (alive) is detached by meshd.
    let lease = raw_attach(&meshd.socket, "svc");
    assert!(lease.is_err(), "the one slot is bound");
    drop(third);
    acked(&meshd, "svc");
    let (lease, id) = raw_attach(&meshd.socket, "svc").unwrap();
    assert_eq!(meshd.service("svc").clients[0].id, id);
    lease.shutdown(std::net::Shutdown::Both).unwrap();
    departed(&meshd, "svc", id);
    let served = program.stop();
    assert_eq!(served.taken.len(), 3, "three clients sent: {:?}", served.taken);
    assert!(served.skips.is_empty());
    meshd.stop();
}

/// A `service_attach` written by hand; the lease and the client's id, or meshd's refusal.
fn raw_attach(socket: &Path, service: &str) -> Result<(UnixStream, u32), String> {
    let conn = UnixStream::connect(socket).unwrap();
    conn.set_read_timeout(Some(DEADLINE)).unwrap();
    (&conn).write_all(format!("{{\"op\":\"service_attach\",\"service\":\"{service}\"}}\n").as_bytes()).unwrap();
    let answer = read_line(&conn);
    let v: Value = serde_json::from_str(&answer).unwrap();
    if v["ok"] != json!(true) {
        return Err(v["error"].as_str().unwrap_or_default().to_string());
    }
    Ok((conn, v["client"]["id"].as_u64().unwrap() as u32))
}

/// One line from `conn`, read a byte at a time (so that nothing after it is taken).
fn read_line(mut conn: &UnixStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while conn.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

#[test]
fn the_wire_contract_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    let raw = |line: &str| {
        let conn = UnixStream::connect(&meshd.socket).unwrap();
        conn.set_read_timeout(Some(DEADLINE)).unwrap();
        (&conn).write_all(line.as_bytes()).unwrap();
        serde_json::from_str::<Value>(&read_line(&conn)).unwrap()
    };
    // capacity, reply_size and reply_capacity left out: 256, msg_size, 16.
    let made = raw("{\"op\":\"service_create\",\"name\":\"svc\",\"clients\":2,\"msg_size\":16}\n");
    assert_eq!(made, json!({"ok": true, "backend_us": made["backend_us"]}));
    let info = meshd.info();
    let row = |name: &str| info.channels.iter().find(|c| c.name == name).unwrap().clone();
    let (svc, replies) = (row("svc"), row("svc.replies"));
    assert_eq!((svc.protocol.as_str(), svc.msg_size, svc.capacity), ("fanin", 16, 256));
    assert_eq!((replies.protocol.as_str(), replies.msg_size, replies.capacity, replies.parts), ("group", 16, 16, 2));
    let all = "{\"op\":\"service_create\",\"name\":\"kv\",\"clients\":3,\"msg_size\":64,\"capacity\":32,\
               \"reply_size\":128,\"reply_capacity\":4}\n";
    assert_eq!(raw(all)["ok"], json!(true));
    let info = meshd.info();
    let kv = info.channels.iter().find(|c| c.name == "kv.replies").unwrap();
    assert_eq!((kv.msg_size, kv.capacity, kv.parts), (128, 4, 3));
    // The attach's answer, exactly; the connection stays open as the lease.
    let lease = UnixStream::connect(&meshd.socket).unwrap();
    lease.set_read_timeout(Some(DEADLINE)).unwrap();
    // A detach written with the attach would be taken too: here the lease is tested line by line.
    (&lease).write_all(b"{\"op\":\"service_attach\",\"service\":\"svc\"}\n").unwrap();
    let answer: Value = serde_json::from_str(&read_line(&lease)).unwrap();
    let id = answer["client"]["id"].as_u64().unwrap();
    assert_eq!(answer, json!({"ok": true, "client": {"id": id, "requests": "svc", "replies": "svc.replies"}}));
    assert_eq!(ClientId(id as u32).epoch16(), 1, "slot | epoch << 16, the first epoch 1");
    let services = serde_json::to_value(meshd.info()).unwrap()["services"].clone();
    assert_eq!(
        services,
        json!([
            {"name": "svc", "entries": 2, "bound": 1, "awaiting_ack": 0,
             "clients": [{"id": id, "pid": std::process::id()}],
             "events": {"attached": 1, "detached": 0, "died": 0, "skipped": 0, "stall_revoked": 0, "stall_killed": 0}},
            {"name": "kv", "entries": 3, "bound": 0, "awaiting_ack": 0, "clients": []},
        ])
    );
    // Anything but a detach on the lease is refused, and the lease kept.
    (&lease).write_all(b"{\"op\":\"ps\"}\nnot json\n").unwrap();
    let refused: Value = serde_json::from_str(&read_line(&lease)).unwrap();
    assert_eq!(refused["ok"], json!(false));
    assert!(refused["error"].as_str().unwrap().contains("only {\"op\":\"detach\"}"), "{refused}");
    let malformed: Value = serde_json::from_str(&read_line(&lease)).unwrap();
    assert!(malformed["error"].as_str().unwrap().contains("malformed request"), "{malformed}");
    assert_eq!(meshd.service("svc").bound, 1);
    // A detach on another connection is refused; on the lease it is answered, then the lease closed.
    let stray = raw("{\"op\":\"detach\"}\n");
    assert!(stray["error"].as_str().unwrap().contains("attached no client"), "{stray}");
    (&lease).write_all(b"{\"op\":\"detach\"}\n").unwrap();
    assert_eq!(read_line(&lease), "{\"ok\":true}");
    assert_eq!((&lease).read(&mut [0u8; 1]).unwrap(), 0, "closed after the detach");
    assert_eq!(meshd.service("svc").bound, 0);
    // A detach written together with the attach is the lease's first line.
    let both = UnixStream::connect(&meshd.socket).unwrap();
    both.set_read_timeout(Some(DEADLINE)).unwrap();
    (&both).write_all(b"{\"op\":\"service_attach\",\"service\":\"svc\"}\n{\"op\":\"detach\"}\n").unwrap();
    let answer: Value = serde_json::from_str(&read_line(&both)).unwrap();
    assert_eq!(answer["client"]["replies"], json!("svc.replies"), "{answer}");
    assert_eq!(read_line(&both), "{\"ok\":true}");
    assert_eq!((&both).read(&mut [0u8; 1]).unwrap(), 0);
    assert_eq!(meshd.service("svc").bound, 0);
    // The Rust request type writes the same.
    let ours = serde_json::to_value(create_req("a", 1, 8, 256, 16)).unwrap();
    assert_eq!(
        ours,
        json!({"op": "service_create", "name": "a", "clients": 1, "msg_size": 8, "capacity": 256, "reply_capacity": 16})
    );
    assert_eq!(serde_json::to_string(&Request::Detach).unwrap(), "{\"op\":\"detach\"}");
    assert_eq!(
        serde_json::to_string(&Request::ServiceAttach { service: "svc".into() }).unwrap(),
        "{\"op\":\"service_attach\",\"service\":\"svc\"}"
    );
    meshd.stop();
}

#[test]
fn refusals_say_why_and_leave_the_mailbox_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    meshd.create("svc", 1, 16, 4);
    assert!(ask(&meshd.socket, &plain_channel("plain"), &[]).ok);
    let err = |r: Response| r.error.clone().unwrap_or_else(|| panic!("not refused: {r:?}"));
    // Unknown service, and a plain channel that is none.
    let e = ServiceClient::connect(&meshd.socket, "nope").unwrap_err().to_string();
    assert!(e.contains("service \"nope\": no such service"), "{e}");
    let e = ServiceClient::connect(&meshd.socket, "plain").unwrap_err().to_string();
    assert!(e.contains("no such service") && e.contains("protocol ll"), "{e}");
    // Every slot bound.
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let holder = ServiceClient::connect(&meshd.socket, "svc").unwrap();
    let e = ServiceClient::connect(&meshd.socket, "svc").unwrap_err().to_string();
    assert!(e.contains("cannot attach: all 1 client slot(s) are bound to clients"), "{e}");
    drop(holder);
    // Bad creations: each names the field and the rule; none leaves a channel behind.
    let channels = meshd.info().channels.len();
    let long = "x".repeat(41);
    let cases: Vec<(Request, &str)> = vec![
        (create_req("bad", 1, 12, 16, 16), "request size (msg_size) 12: must be a multiple of 8"),
        (
            create_req("bad", 1, 16, 100, 16),
            "capacity (requests in flight over all clients) 100: must be a power of two",
        ),
        (
            create_req("bad", 1, 16, 16, 3),
            "reply_capacity (replies each client's ring holds) 3: must be a power of two",
        ),
        (create_req("bad", 0, 16, 16, 16), "0 clients: a service has 1 to 65536 client slots"),
        (create_req("bad", 70_000, 16, 16, 16), "70000 clients"),
        (create_req(&long, 1, 16, 16, 16), "a service name is 1 to 40 bytes"),
        (create_req("", 1, 16, 16, 16), "a service name is 1 to 40 bytes"),
        (
            Request::ServiceCreate {
                name: "bad".into(),
                clients: 1,
                msg_size: 16,
                capacity: 16,
                reply_size: Some(65_544),
                reply_capacity: 16,
                shards: 1,
            },
            "reply size (reply_size) 65544",
        ),
        (create_req("svc", 1, 16, 16, 16), "service \"svc\": already exists"),
        (create_req("plain", 1, 16, 16, 16), "channel \"plain\" already exists (protocol ll)"),
        // 4096 clients of 64 KiB replies: far more than the 4 MiB mailbox.
        (
            Request::ServiceCreate {
                name: "huge".into(),
                clients: 4096,
                msg_size: 64,
                capacity: 16,
                reply_size: Some(65_536),
                reply_capacity: 16,
                shards: 1,
            },
            "service \"huge\": mailbox full: its channels need",
        ),
    ];
    for (req, why) in cases {
        let e = err(ask(&meshd.socket, &req, &[]));
        assert!(e.contains(why), "{req:?}: {e}");
    }
    // A name whose group's name is taken.
    assert!(ask(&meshd.socket, &plain_channel("g.replies"), &[]).ok);
    let e = err(ask(&meshd.socket, &create_req("g", 1, 16, 16, 16), &[]));
    assert!(e.contains("channel \"g.replies\" already exists"), "{e}");
    assert_eq!(meshd.info().channels.len(), channels + 1, "no refusal made a channel (g.replies is the test's)");
    // The descriptor table full: 16 descriptors, one left.
    let info = meshd.info();
    for i in info.channels.len()..15 {
        assert!(ask(&meshd.socket, &plain_channel(&format!("fill{i}")), &[]).ok);
    }
    let e = err(ask(&meshd.socket, &create_req("last", 1, 16, 16, 16), &[]));
    assert!(e.contains("mailbox full: it needs 2 channel descriptor(s) and 1 of the 16 are free"), "{e}");
    assert_eq!(meshd.info().channels.len(), 15);
    program.stop();
    meshd.stop();
}

fn plain_channel(name: &str) -> Request {
    Request::ChannelCreate {
        name: name.into(),
        msg_size: 8,
        capacity: 2,
        placement: String::new(),
        protocol: String::new(),
        parts: 1,
    }
}

#[test]
fn a_restarted_meshd_watches_a_live_client_and_departs_it_when_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (path, socket) = (dir.path().join("mb"), dir.path().join("sock"));
    let first = start(dir.path());
    first.create("svc", 1, 16, 4);
    // The program outlives every meshd here, as a GPU program outlives a meshd restart.
    let program = Program::start(&Mailbox::open(&path).unwrap(), "svc");
    let mut client = ChildClient::spawn(&socket, "svc");
    client.expect("STREAMING");
    first.stop();
    // Its lease died with that meshd; the client goes on through the mailbox.
    client.drain();
    client.expect("REPLIES ");
    let second = Meshd::start(Mailbox::open(&path).unwrap(), &socket);
    let row = second.service("svc");
    assert_eq!(row.clients.len(), 1, "the live client is still bound: {row:?}");
    assert_eq!((row.clients[0].id, row.clients[0].pid), (client.id, client.child.id()));
    client.drain();
    client.expect("REPLIES ");
    let (slot, id) = (client.slot(), client.kill9());
    departed(&second, "svc", id);
    acked(&second, "svc");
    // Its slot is free again, for a client of this meshd.
    let mut next = ServiceClient::connect(&socket, "svc").unwrap();
    assert_eq!(ClientId(next.id()).slot(), slot);
    let mut out = [0u8; MSG];
    next.request(&request(0, next.id()), &mut out, DEADLINE).unwrap();
    assert_eq!(out, reply(0, next.id()));
    next.detach().unwrap();
    acked(&second, "svc");
    // A client that dies while no meshd runs is departed by the next one's start.
    let mut orphan = ChildClient::spawn(&socket, "svc");
    orphan.expect("STREAMING");
    second.stop();
    let orphan_id = orphan.kill9();
    let third = Meshd::start(Mailbox::open(&path).unwrap(), &socket);
    departed(&third, "svc", orphan_id);
    assert!(wait_until(DEADLINE, || third.service("svc").awaiting_ack == 0), "the program acknowledged");
    let served = program.stop();
    assert!(served.skips.iter().all(|s| [id, orphan_id].contains(s)), "{:?}", served.skips);
    assert!(served.departed.contains(&id) && served.departed.contains(&orphan_id), "{:?}", served.departed);
    third.stop();
}

/// A `service_resume` written by hand; meshd's answer line.
fn raw_resume(socket: &Path, service: &str, id: u32) -> Value {
    let conn = UnixStream::connect(socket).unwrap();
    conn.set_read_timeout(Some(DEADLINE)).unwrap();
    let line = format!("{{\"op\":\"service_resume\",\"service\":\"{service}\",\"client\":{id}}}\n");
    (&conn).write_all(line.as_bytes()).unwrap();
    serde_json::from_str(&read_line(&conn)).unwrap()
}

/// A client whose lease ended with a restart of meshd detaches all the same: it takes its lease
/// back from the new meshd (`service_resume`), which departs it as a detach, not a death, while the
/// process lives on; only that process may take it back, and only once.
#[test]
fn a_client_detaches_after_a_restart_by_taking_its_lease_back() {
    let dir = tempfile::tempdir().unwrap();
    let (path, socket, go) = (dir.path().join("mb"), dir.path().join("sock"), dir.path().join("go"));
    let first = start(dir.path());
    first.create("svc", 1, 16, 4);
    let program = Program::start(&Mailbox::open(&path).unwrap(), "svc");
    let go_env = go.display().to_string();
    let mut client = ChildClient::spawn_as("service_client_detaching_child", &socket, "svc", &[(GO, &go_env)]);
    client.expect("STREAMING");
    // This meshd's own lease holds the client: no resume of it.
    let held = raw_resume(&socket, "svc", client.id);
    assert_eq!(held["ok"], json!(false), "{held}");
    first.stop();
    let second = Meshd::start(Mailbox::open(&path).unwrap(), &socket);
    assert_eq!(second.service("svc").clients.len(), 1, "still bound after the restart");
    // Another process (this test's) may not take it.
    let stranger = raw_resume(&socket, "svc", client.id);
    let why = stranger["error"].as_str().unwrap_or_default();
    assert!(why.contains("not to this process"), "{stranger}");
    let unknown = raw_resume(&socket, "svc", client.id ^ 0x10000);
    assert!(unknown["error"].as_str().unwrap_or_default().contains("no such client is bound"), "{unknown}");
    std::fs::write(&go, b"").unwrap();
    assert_eq!(client.expect("DETACHED "), "ok");
    departed(&second, "svc", client.id);
    assert!(client.child.try_wait().unwrap().is_none(), "the client lives on: a detach, not a death");
    let events = second.service("svc").events;
    assert_eq!((events.detached, events.died), (1, 0), "{events:?}");
    acked(&second, "svc");
    // Its slot is free for the next client.
    let mut next = ServiceClient::connect(&socket, "svc").unwrap();
    let mut out = [0u8; MSG];
    next.request(&request(0, next.id()), &mut out, DEADLINE).unwrap();
    assert_eq!(out, reply(0, next.id()));
    next.detach().unwrap();
    let served = program.stop();
    assert!(served.departed.contains(&client.id), "the program saw the departure: {:?}", served.departed);
    second.stop();
}

/// An entry damaged while no meshd ran (its binding word in no state meshd writes) hides no other
/// client: the next meshd names it in `info`'s error, lists the live client, watches it, and departs
/// it when it is killed.
#[test]
fn a_damaged_entry_hides_no_other_client_from_a_restarted_meshd() {
    let dir = tempfile::tempdir().unwrap();
    let (path, socket) = (dir.path().join("mb"), dir.path().join("sock"));
    let first = start(dir.path());
    first.create("svc", 2, 16, 4);
    let program = Program::start(&Mailbox::open(&path).unwrap(), "svc");
    let mut client = ChildClient::spawn(&socket, "svc");
    client.expect("STREAMING");
    first.stop();
    let mb = Mailbox::open(&path).unwrap();
    let group = mb.channel("svc.replies").unwrap();
    let other = 1 - u64::from(client.slot());
    // Entry `other`'s binding word: state 7, which meshd never writes.
    poke(&mb, group_entry(&group, other), 7 << 32 | 1);
    let second = Meshd::start(Mailbox::open(&path).unwrap(), &socket);
    let row = second.service("svc");
    assert_eq!(row.clients.len(), 1, "the live client is still listed: {row:?}");
    assert_eq!((row.clients[0].id, row.clients[0].pid), (client.id, client.child.id()));
    assert!(row.error.as_deref().is_some_and(|e| e.contains(&format!("entry {other}"))), "{row:?}");
    let id = client.kill9();
    departed(&second, "svc", id);
    let served = program.stop();
    assert!(served.skips.iter().all(|&s| s == id), "{:?}", served.skips);
    second.stop();
}

#[test]
fn the_command_line_creates_a_service_and_shows_its_clients() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    let cli = |args: &[&str]| {
        let out =
            Command::new(env!("CARGO_BIN_EXE_meshd")).env("MESHD_SOCKET", &meshd.socket).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) =
        cli(&["service", "create", "kv", "--clients", "2", "--msg-size", "32", "--reply-size", "64"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("created service kv for up to 2 clients"), "{out}");
    assert!(out.contains("fan-in channel kv (256 requests of 32 bytes"), "{out}");
    assert!(out.contains("group kv.replies (one ring of 16 replies of 64 bytes per client)"), "{out}");
    assert!(out.contains("--bind kv --bind kv.replies"), "{out}");
    let client = ServiceClient::connect(&meshd.socket, "kv").unwrap();
    assert_eq!((client.msg_size(), client.reply_size()), (32, 64));
    let (code, out, err) = cli(&["ps"]);
    assert_eq!(code, Some(0), "{err}");
    let line = format!("service kv: 1 of 2 client slot(s) bound ({:#x} pid {})", client.id(), std::process::id());
    assert!(out.contains(&line), "{out}");
    let (_, out, _) = cli(&["info"]);
    let info: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["services"][0]["clients"][0]["id"], json!(client.id()));
    // Refused: exit 1 with meshd's reason; bad usage: exit 2.
    let (code, _, err) = cli(&["service", "create", "kv", "--clients", "2", "--msg-size", "32"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("service \"kv\": already exists"), "{err}");
    let (code, _, err) = cli(&["service", "create", "other", "--msg-size", "32"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--clients"), "{err}");
    let (code, _, err) = cli(&["service", "create", "two words", "--clients", "2", "--msg-size", "32"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("control characters, spaces or commas"), "{err}");
    // A service's channels are not for `meshd send` / `recv`: the refusal names the client to use.
    for args in [&["send", "kv", "hi"][..], &["recv", "kv.replies"]] {
        let (code, _, err) = cli(args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("one of a service's channels") && err.contains("ServiceClient"), "{args:?}: {err}");
    }
    let (_, help, _) = cli(&["service", "create", "--help"]);
    assert!(help.contains("NAME.replies") && help.contains("--reply-capacity"), "{help}");
    assert!(help.contains("--shards") && help.contains("own cursor") && help.contains("refuses the binding"), "{help}");
    // Shards: made, shown in info (the channel's parts, the service's shards) and ps.
    let (code, out, err) = cli(&["service", "create", "wide", "--clients", "8", "--msg-size", "32", "--shards", "4"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("fan-in channel wide of 4 shards (256 requests of 32 bytes in flight in each"), "{out}");
    let info = meshd.info();
    let wide = info.channels.iter().find(|c| c.name == "wide").unwrap();
    assert_eq!((wide.protocol.as_str(), wide.capacity, wide.parts), ("fanin", 256, 4));
    assert_eq!(meshd.service("wide").shards, 4);
    assert_eq!(meshd.service("kv").shards, 1);
    let (_, out, _) = cli(&["ps"]);
    assert!(out.contains("service wide (4 fan-in shards): 0 of 8 client slot(s) bound"), "{out}");
    let (_, out, _) = cli(&["info"]);
    let json: Value = serde_json::from_str(&out).unwrap();
    let svc = json["services"].as_array().unwrap().iter().find(|s| s["name"] == "wide").unwrap().clone();
    assert_eq!(svc["shards"], json!(4));
    let kv = json["services"].as_array().unwrap().iter().find(|s| s["name"] == "kv").unwrap().clone();
    assert_eq!(kv.get("shards"), None, "one shard: the field left out, as before shards");
    // A bad shard count: refused naming the value and the rule, nothing made.
    for bad in ["3", "128", "0"] {
        let (code, out, err) =
            cli(&["service", "create", "bad", "--clients", "2", "--msg-size", "32", "--shards", bad]);
        assert_eq!(code, Some(1), "--shards {bad}: {err} {out}");
        let says = format!("service \"bad\": {bad} shards: the fan-in channel has a power of two from 1 to 64 shards");
        assert!(err.contains(&says), "{err}");
    }
    assert!(meshd.info().channels.iter().all(|c| c.name != "bad"));
    // The wire: `shards` absent reads as 1 (above); present, as given; the Rust type leaves a 1 out.
    let mut req = create_req("w2", 2, 16, 16, 4);
    assert!(!serde_json::to_string(&req).unwrap().contains("shards"));
    if let Request::ServiceCreate { shards, .. } = &mut req {
        *shards = 2;
    }
    assert!(serde_json::to_string(&req).unwrap().contains("\"shards\":2"));
    assert!(ask(&meshd.socket, &req, &[]).ok);
    assert_eq!(meshd.service("w2").shards, 2);
    client.detach().unwrap();
    meshd.stop();
}

/// `meshd service request`: a client from the shell, each request's reply on a line (text or hex);
/// a request longer than the service's size refused before anything is sent, no reply in time exit
/// 4, no such service 1, no meshd 3.
#[test]
fn the_command_line_sends_requests_to_a_service_and_prints_the_replies() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = start(dir.path());
    meshd.create("echo", 2, 16, 4);
    let cli = |socket: &Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_meshd")).env("MESHD_SOCKET", socket).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The program: each request's bytes upper-cased, to its sender; departures acknowledged.
    let mailbox = Mailbox::open(dir.path().join("mb")).unwrap();
    let mut rx = FanInReceiver::claim(&mailbox, "echo").unwrap();
    let mut srv = GroupServer::claim(&mailbox, "echo.replies").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let program = std::thread::spawn(move || {
        let mut buf = [0u8; MSG];
        let mut answered = 0u32;
        while !stopping.load(Ordering::Acquire) {
            srv.departures().unwrap();
            match rx.try_take(&mut buf).unwrap() {
                Some(Taken::Message { sender }) => {
                    buf.make_ascii_uppercase();
                    assert_eq!(srv.reply(ClientId(sender), &buf).unwrap(), Replied::Sent);
                    answered += 1;
                }
                Some(Taken::Skipped { .. }) => {}
                None => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        answered
    });
    let socket = meshd.socket.clone();
    let (code, out, err) = cli(&socket, &["service", "request", "echo", "hello", "world"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "HELLO\nWORLD\n");
    let (code, out, err) = cli(&socket, &["service", "request", "echo", "--hex", "6869"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, format!("4849{}\n", "0".repeat(2 * MSG - 4)), "the whole reply, in hex");
    // Refused before anything is sent: too long, bad hex (usage, 2), no such service.
    let (code, _, err) = cli(&socket, &["service", "request", "echo", "short", "seventeen bytes!!"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("request 2 is 17 bytes, more than the service's request size (16 bytes)"), "{err}");
    let (code, _, err) = cli(&socket, &["service", "request", "echo", "--hex", "zz"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = cli(&socket, &["service", "request", "nope", "x"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("nope"), "{err}");
    let (code, _, err) = cli(&dir.path().join("no-such.sock"), &["service", "request", "echo", "x"]);
    assert_eq!(code, Some(3), "{err}");
    stop.store(true, Ordering::Release);
    assert_eq!(program.join().unwrap(), 3, "exactly the three requests that were sent");
    // Nobody serving: exit 4, saying so.
    let (code, _, err) = cli(&socket, &["service", "request", "echo", "x", "--timeout-ms", "200"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("no reply (is a program serving it?)"), "{err}");
    // Every client detached (the one left unanswered too).
    assert!(wait_until(DEADLINE, || meshd.service("echo").bound == 0), "{:?}", meshd.service("echo"));
    meshd.stop();
}

// ---- the stall watcher: clients stopped in the middle of a send ----

/// Where a stalling child stops its first send: `reserved` (a slot reserved, nothing stored) or
/// `writing` (begun, half its body stored, not committed).
const STALL_AT: &str = "MESHD_SERVICE_TEST_STALL_AT";
/// The stalling child's mailbox.
const STALL_MAILBOX: &str = "MESHD_SERVICE_TEST_STALL_MAILBOX";
/// Requests a stalling child sends in all (the stopped one first).
const STALL_REQUESTS: u64 = 50;

/// A client process that stops itself (SIGSTOP) in the middle of its first send, at the point its
/// environment names, saying `STOPPING <seq>` first. Continued (SIGCONT), it finishes that send,
/// saying `RESUMED <revoked>` (whether its reservation was revoked meanwhile and the request sent
/// anew), takes its reply, sends the rest of its requests checking every reply, says `DONE` and
/// detaches. Without its environment (a plain test run) it does nothing.
#[test]
fn stalling_client_child() {
    let Ok(at) = std::env::var(STALL_AT) else { return };
    let mut client = attached_as_child().expect("a client process's environment");
    let service = std::env::var(format!("{ROLE}_SERVICE")).unwrap();
    let mailbox = Mailbox::open(std::env::var(STALL_MAILBOX).unwrap()).unwrap();
    let id = client.id();
    let mut out = std::io::stdout();
    // The same id's request end, driven one step at a time (the client's own is idle meanwhile: one
    // send at a time, as ever).
    let mut tx = FanInSender::open(&mailbox, &service, ClientId(id)).unwrap();
    let stop_at = match at.as_str() {
        "reserved" => Stage::Reserved,
        "writing" => Stage::HalfBody,
        other => panic!("{STALL_AT}={other}: reserved or writing"),
    };
    let first = request(0, id);
    let mut op = SendOp::default();
    while op.stage != stop_at {
        match tx.step(&mut op, &first).unwrap() {
            Step::Progress => {}
            Step::NoRoom => std::thread::sleep(Duration::from_millis(1)),
            other => panic!("{other:?} before the stop"),
        }
    }
    writeln!(out, "\nSTOPPING {}", op.seq).unwrap();
    out.flush().unwrap();
    // To this thread (raise is tgkill in a threaded process): it takes the stop on its way back from
    // the call, before another instruction of the send. A SIGSTOP to the process could be taken by
    // another thread (the test harness's), and this one would run on for the microseconds until the
    // group stop reaches it: long enough to finish the send.
    // SAFETY: raise has no memory preconditions; SIGSTOP stops the process until a SIGCONT.
    assert_eq!(unsafe { libc::raise(libc::SIGSTOP) }, 0, "raise(SIGSTOP)");
    // Continued.
    let mut revoked = false;
    loop {
        match tx.step(&mut op, &first).unwrap() {
            Step::Sent => break,
            Step::Revoked => revoked = true,
            Step::Progress => {}
            Step::NoRoom => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    writeln!(out, "\nRESUMED {revoked}").unwrap();
    out.flush().unwrap();
    let mut buf = [0u8; MSG];
    client.recv(&mut buf, DEADLINE).unwrap();
    assert_eq!(buf, reply(0, id), "the reply to the request the stop cut");
    for k in 1..STALL_REQUESTS {
        client.request(&request(k, id), &mut buf, DEADLINE).unwrap();
        assert_eq!(buf, reply(k, id), "client {id:#x}: the reply to request {k}");
    }
    writeln!(out, "\nDONE").unwrap();
    out.flush().unwrap();
    client.detach().unwrap();
}

/// The state letter of process `pid` in `/proc` (`T`: stopped), `None` once it is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_ascii_whitespace().next()?.chars().next()
}

/// A stalling child of `service` stopped at `at` (`reserved` or `writing`): the child, once stopped,
/// the sequence number of its stopped send, and when it said it stops. Waits until `/proc` says it
/// is stopped.
fn stalled_child(meshd: &Meshd, dir: &Path, service: &str, at: &str) -> (ChildClient, u64, Instant) {
    let mb = dir.join("mb");
    let env = [(STALL_AT, at), (STALL_MAILBOX, mb.to_str().unwrap())];
    let mut child = ChildClient::spawn_as("stalling_client_child", &meshd.socket, service, &env);
    let seq = child.expect("STOPPING ").trim().parse().unwrap();
    let stopping = Instant::now();
    let pid = child.child.id();
    assert!(wait_until(DEADLINE, || proc_state(pid) == Some('T')), "the child never stopped: {:?}", proc_state(pid));
    (child, seq, stopping)
}

/// Continues a stopped child (SIGCONT).
fn cont(child: &ChildClient) {
    let pid = rustix::process::Pid::from_raw(child.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
}

/// Client threads streaming into `service` until `stop` (and at least `min` replies each): each
/// thread's reply count, shared as it goes, and its handle.
fn steady_clients(
    socket: &Path,
    service: &str,
    n: usize,
    min: u64,
    stop: &Arc<AtomicBool>,
) -> Vec<(Arc<std::sync::atomic::AtomicU64>, JoinHandle<u64>)> {
    (0..n)
        .map(|_| {
            let (socket, service, stop) = (socket.to_path_buf(), service.to_string(), stop.clone());
            let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let counted = count.clone();
            let h = std::thread::spawn(move || {
                let mut c = ServiceClient::connect(&socket, &service).unwrap();
                let got = stream(&mut c, 4, |got| {
                    counted.store(got, Ordering::Release);
                    got >= min && stop.load(Ordering::Acquire)
                });
                c.detach().unwrap();
                got
            });
            (count, h)
        })
        .collect()
}

/// Limits with the stall watcher at `stall_ms` (and the kill delay, where given).
fn stall_limits(stall_ms: u64, kill_ms: Option<u64>) -> Limits {
    Limits {
        client_stall: Some(Duration::from_millis(stall_ms)),
        client_stall_kill: kill_ms.map(Duration::from_millis),
        ..Limits::default()
    }
}

#[test]
fn a_client_stopped_after_reserving_is_revoked_and_sends_again_when_continued() {
    stopped_after_reserving(1);
}

#[test]
fn in_a_service_of_four_shards_a_client_stopped_after_reserving_is_revoked_in_its_shard() {
    // The two steady clients (slots 0 and 1) send into shards 0 and 1, the stopped one (slot 2) into
    // shard 2: the watcher finds it there, and the other shards flow meanwhile.
    stopped_after_reserving(4);
}

/// A client stopped after reserving its slot, in a service of `shards` fan-in shards: revoked by the
/// stall watcher while stopped, the other clients going on; continued, it sends that request again.
fn stopped_after_reserving(shards: u32) {
    let dir = tempfile::tempdir().unwrap();
    let mailbox = Mailbox::create(dir.path().join("mb"), &config(), CreateMode::Exclusive).unwrap();
    let meshd = Meshd::start_with(mailbox, &dir.path().join("sock"), stall_limits(50, None));
    meshd.create_sharded("svc", 4, 16, 8, shards);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let stop = Arc::new(AtomicBool::new(false));
    let steady = steady_clients(&meshd.socket, "svc", 2, 200, &stop);
    let (child, seq, stopped_at) = stalled_child(&meshd, dir.path(), "svc", "reserved");
    // Revoked: the program's first slot from it is a skip, with its id, while it is still stopped.
    let mut others = Vec::new();
    let first = program.first_from(child.id, &mut others);
    assert_eq!(first.k, None, "the stopped reservation comes to the program as a skip: {first:?}");
    let took = first.at.saturating_duration_since(stopped_at);
    eprintln!("the reservation at seq {seq} of client {:#x} was revoked {took:?} after it said it stops", child.id);
    assert!(took < Duration::from_secs(5), "revoked within 5 s, not {took:?}");
    assert_eq!(proc_state(child.child.id()), Some('T'), "revoked while it is still stopped");
    // The others go on while it stays stopped.
    let counts: Vec<u64> = steady.iter().map(|(c, _)| c.load(Ordering::Acquire)).collect();
    assert!(
        wait_until(DEADLINE, || steady.iter().zip(&counts).all(|((c, _), &at)| c.load(Ordering::Acquire) >= at + 100)),
        "the other clients stalled behind the stopped one"
    );
    assert_eq!(proc_state(child.child.id()), Some('T'));
    let row = meshd.service("svc");
    assert_eq!(row.held_by, None, "a revoked reservation holds nothing: {row:?}");
    assert!(row.clients.iter().any(|c| c.id == child.id), "still bound: revoked, not departed: {row:?}");
    // Continued: its begin fails, it sends the request anew, and every request of its arrives once.
    let mut child = child;
    cont(&child);
    assert_eq!(child.expect("RESUMED ").trim(), "true", "its reservation was revoked under it");
    child.expect("DONE");
    stop.store(true, Ordering::Release);
    let got: Vec<u64> = steady.into_iter().map(|(_, h)| h.join().expect("a steady client failed")).collect();
    assert!(got.iter().all(|&g| g >= 200), "{got:?}");
    assert!(wait_until(DEADLINE, || child.child.try_wait().unwrap().is_some_and(|s| s.success())), "the child failed");
    let served = program.stop();
    // In order, once each (the program asserts the order as it takes them).
    assert_eq!(served.taken.get(&child.id), Some(&STALL_REQUESTS), "{:?}", served.taken);
    let from_child = served.skips.iter().filter(|&&s| s == child.id).count();
    assert!(from_child >= 1, "{:?}", served.skips);
    // A live client descheduled for 50 ms on a loaded machine is revoked too (and sends again): any
    // other skip is a steady client's, whose every reply `stream` checked in order.
    eprintln!("skips: {:?} (the stopped client {:#x}: {from_child})", served.skips, child.id);
    let e = meshd.service("svc").events;
    assert!(e.stall_revoked >= from_child as u64, "every revocation counted: {e:?}");
    assert_eq!(e.died, 0, "nobody died: {e:?}");
    meshd.stop();
}

#[test]
fn a_client_stopped_while_writing_is_shown_holding_the_ring_and_goes_on_when_continued() {
    let dir = tempfile::tempdir().unwrap();
    let mailbox = Mailbox::create(dir.path().join("mb"), &config(), CreateMode::Exclusive).unwrap();
    let meshd = Meshd::start_with(mailbox, &dir.path().join("sock"), stall_limits(50, None));
    meshd.create("svc", 2, 16, 8);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let (mut child, seq, _) = stalled_child(&meshd, dir.path(), "svc", "writing");
    let pid = child.child.id();
    // Not revocable while it lives: shown held, in info and ps.
    let mut row = meshd.service("svc");
    assert!(
        wait_until(DEADLINE, || {
            row = meshd.service("svc");
            row.held_by.is_some()
        }),
        "never shown held: {row:?}"
    );
    let held = row.held_by.clone().unwrap();
    assert_eq!((held.client, held.pid, held.seq, held.stopped), (child.id, pid, seq, true), "{row:?}");
    assert!(held.since_ms >= 50, "shown once held for T_stall: {held:?}");
    let ps = Command::new(env!("CARGO_BIN_EXE_meshd")).env("MESHD_SOCKET", &meshd.socket).arg("ps").output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    let line = format!("fan-in svc held at seq {seq} by {:#x} pid {pid} (stopped)", child.id);
    assert!(ps.contains(&line), "ps says {ps}");
    let info = ask(&meshd.socket, &Request::Info, &[]);
    let json = serde_json::to_value(info.info.unwrap()).unwrap();
    assert_eq!(json["services"][0]["held_by"]["pid"], json!(pid));
    assert_eq!(json["services"][0]["held_by"]["seq"], json!(seq));
    // Still held a while later: nothing was completed under it.
    std::thread::sleep(Duration::from_millis(200));
    assert!(program.took_since().iter().all(|t| t.sender != child.id), "the program took nothing from it");
    assert!(meshd.service("svc").held_by.is_some_and(|h| h.since_ms >= held.since_ms));
    // Continued: it commits its request itself (no revocation, no skip), and the hold is gone.
    cont(&child);
    assert_eq!(child.expect("RESUMED ").trim(), "false", "nothing was revoked under it");
    child.expect("DONE");
    assert!(wait_until(DEADLINE, || meshd.service("svc").held_by.is_none()), "still shown held");
    assert!(wait_until(DEADLINE, || child.child.try_wait().unwrap().is_some_and(|s| s.success())), "the child failed");
    let served = program.stop();
    assert_eq!(served.taken.get(&child.id), Some(&STALL_REQUESTS), "{:?}", served.taken);
    assert!(served.skips.is_empty(), "no skip: {:?}", served.skips);
    meshd.stop();
}

#[test]
fn two_shards_held_at_once_are_each_shown_and_go_on_when_continued() {
    // Each shard is a ring of its own, held apart: clients in slots 0 and 1 send into shards 0 and 1,
    // both stopped in the middle of writing. `info` lists both holds by shard (`holds`), `held_by`
    // stays the first for the clients that read only that, and `ps` says both.
    let dir = tempfile::tempdir().unwrap();
    let mailbox = Mailbox::create(dir.path().join("mb"), &config(), CreateMode::Exclusive).unwrap();
    let meshd = Meshd::start_with(mailbox, &dir.path().join("sock"), stall_limits(50, None));
    meshd.create_sharded("svc", 4, 16, 8, 2);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let (first, seq0, _) = stalled_child(&meshd, dir.path(), "svc", "writing");
    let (second, seq1, _) = stalled_child(&meshd, dir.path(), "svc", "writing");
    let mut children = [first, second];
    assert_eq!(children.iter().map(ChildClient::slot).collect::<Vec<_>>(), [0, 1], "one client a shard");
    let mut row = meshd.service("svc");
    assert!(
        wait_until(DEADLINE, || {
            row = meshd.service("svc");
            row.holds.len() == 2
        }),
        "never shown held in both shards: {row:?}"
    );
    let seen: Vec<_> = row.holds.iter().map(|h| (h.shard, h.client, h.pid, h.seq, h.stopped)).collect();
    let want: Vec<_> = children
        .iter()
        .zip([seq0, seq1])
        .enumerate()
        .map(|(shard, (c, seq))| (shard as u32, c.id, c.child.id(), seq, true))
        .collect();
    assert_eq!(seen, want, "{row:?}");
    assert_eq!(row.held_by.as_ref(), row.holds.first(), "held_by is the first shard's hold");
    let info = ask(&meshd.socket, &Request::Info, &[]);
    let json = serde_json::to_value(info.info.unwrap()).unwrap();
    assert_eq!(json["services"][0]["holds"][1]["shard"], json!(1));
    assert_eq!(json["services"][0]["holds"][0].get("shard"), None, "shard 0: the field left out, as before shards");
    let ps = Command::new(env!("CARGO_BIN_EXE_meshd")).env("MESHD_SOCKET", &meshd.socket).arg("ps").output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    for (shard, (c, seq)) in children.iter().zip([seq0, seq1]).enumerate() {
        let line = format!("fan-in svc shard {shard} held at seq {seq} by {:#x} pid {} (stopped)", c.id, c.child.id());
        assert!(ps.contains(&line), "ps says {ps}");
    }
    // Continued: each commits its request itself, and the holds are gone.
    for c in &mut children {
        cont(c);
        assert_eq!(c.expect("RESUMED ").trim(), "false", "nothing was revoked under it");
        c.expect("DONE");
    }
    assert!(wait_until(DEADLINE, || meshd.service("svc").holds.is_empty()), "still shown held");
    assert_eq!(meshd.service("svc").held_by, None);
    for c in &mut children {
        assert!(wait_until(DEADLINE, || c.child.try_wait().unwrap().is_some_and(|s| s.success())), "a child failed");
    }
    let served = program.stop();
    for c in &children {
        assert_eq!(served.taken.get(&c.id), Some(&STALL_REQUESTS), "{:?}", served.taken);
    }
    assert!(served.skips.is_empty(), "no skip: {:?}", served.skips);
    meshd.stop();
}

#[test]
fn with_the_kill_delay_a_client_stopped_while_writing_is_killed_and_its_request_skipped() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mailbox = Mailbox::create(dir.path().join("mb"), &config(), CreateMode::Exclusive).unwrap();
    let meshd = Meshd::start_with(mailbox, &dir.path().join("sock"), stall_limits(50, Some(200)));
    meshd.create("svc", 4, 16, 8);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let stop = Arc::new(AtomicBool::new(false));
    let steady = steady_clients(&meshd.socket, "svc", 1, 200, &stop);
    let (mut child, seq, stopped_at) = stalled_child(&meshd, dir.path(), "svc", "writing");
    let id = child.id;
    let mut status = None;
    assert!(
        wait_until(DEADLINE, || {
            status = child.child.try_wait().unwrap();
            status.is_some()
        }),
        "never killed"
    );
    let killed = stopped_at.elapsed();
    assert_eq!(status.unwrap().signal(), Some(9), "killed with SIGKILL: {status:?}");
    // Its death completes the slot: the program takes a skip from it, and it is departed.
    let first = program.first_from(id, &mut Vec::new());
    assert_eq!(first.k, None, "{first:?}");
    eprintln!(
        "the client {id:#x} stopped writing seq {seq} was killed {killed:?} and its slot skipped {:?} after it \
         said it stops",
        first.at.saturating_duration_since(stopped_at)
    );
    departed(&meshd, "svc", id);
    assert!(wait_until(DEADLINE, || meshd.service("svc").held_by.is_none()), "still shown held");
    // The others go on.
    let at = steady[0].0.load(Ordering::Acquire);
    assert!(wait_until(DEADLINE, || steady[0].0.load(Ordering::Acquire) >= at + 100), "the others stalled");
    stop.store(true, Ordering::Release);
    for (_, h) in steady {
        assert!(h.join().expect("a steady client failed") >= 200);
    }
    let served = program.stop();
    assert_eq!(served.taken.get(&id), None, "the killed client's request never came whole: {:?}", served.taken);
    assert_eq!(served.skips.iter().filter(|&&s| s == id).count(), 1, "{:?}", served.skips);
    let e = meshd.service("svc").events;
    assert_eq!(e.stall_killed, 1, "{e:?}");
    assert!(e.died >= 1 && e.skipped >= 1, "the killed client died with a request cut off: {e:?}");
    meshd.stop();
}

#[test]
fn with_the_watcher_off_a_stopped_client_is_never_revoked() {
    let dir = tempfile::tempdir().unwrap();
    // `start`: the default limits, no stall watcher.
    let meshd = start(dir.path());
    meshd.create("svc", 2, 16, 8);
    let program = Program::start(&Mailbox::open(dir.path().join("mb")).unwrap(), "svc");
    let (mut child, _, _) = stalled_child(&meshd, dir.path(), "svc", "reserved");
    // Well past any T_stall: the program still waits at its slot, and nothing is shown.
    std::thread::sleep(Duration::from_secs(1));
    let took = program.took_since();
    assert!(took.iter().all(|t| t.sender != child.id), "nothing taken from it: {took:?}, child {:#x}", child.id);
    assert_eq!(meshd.service("svc").held_by, None);
    cont(&child);
    assert_eq!(child.expect("RESUMED ").trim(), "false", "its reservation was never revoked");
    child.expect("DONE");
    assert!(wait_until(DEADLINE, || child.child.try_wait().unwrap().is_some_and(|s| s.success())), "the child failed");
    let served = program.stop();
    assert_eq!(served.taken.get(&child.id), Some(&STALL_REQUESTS), "{:?}", served.taken);
    assert!(served.skips.is_empty(), "{:?}", served.skips);
    meshd.stop();
}
