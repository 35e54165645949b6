//! The service client's C calls (`mesh_service_*`) against meshd's own control plane (over a stand-in backend, in this process) and a host server thread: round trips through the extern "C" functions, every refusal as its code, and a C program compiled against `mesh_shm.h` (two streaming to the end, one killed with -9 mid-stream and taken back by meshd).

mod common;
use common::last_error;

use std::ffi::{CStr, CString, c_char};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mesh_shm::{ClientId, CreateMode, FanInReceiver, GroupServer, Mailbox, MailboxConfig, Replied, Taken};
use mesh_shm_c::*;
use serde_json::Value;

/// A deadline for what takes milliseconds (never a measurement).
const PATIENCE: Duration = Duration::from_secs(30);

/// meshd's control plane over a stand-in backend, on a socket in `dir`, served by a thread of this process.
struct Meshd {
    socket: PathBuf,
    socket_c: CString,
    mailbox: PathBuf,
    thread: Option<JoinHandle<()>>,
}

impl Meshd {
    fn start(dir: &Path) -> Self {
        let config = MailboxConfig { size: 16 << 20, slots: 8, channels: 16 };
        let mb = Mailbox::create(dir.join("mailbox"), &config, CreateMode::Exclusive).expect("mailbox");
        Self::serve(dir, mb)
    }

    /// A meshd started again on the mailbox a previous one in `dir` left (its clients still bound).
    fn start_again(dir: &Path) -> Self {
        Self::serve(dir, Mailbox::open(dir.join("mailbox")).expect("the mailbox left"))
    }

    fn serve(dir: &Path, mb: Mailbox) -> Self {
        let (socket, mailbox) = (dir.join("sock"), dir.join("mailbox"));
        let server = meshd::server::Server::start(mb, meshd::server::Limits::default(), None, |mb| {
            Ok(meshd::server::Opened {
                backend: Box::new(meshd::stand_in::StandInBackend::new(mb)),
                device: "stand-in (no GPU)".into(),
                arch: None,
            })
        })
        .expect("meshd's control plane");
        let listener = meshd::start::bind_socket(&socket).expect("the control socket");
        let thread = std::thread::spawn(move || {
            server.run(listener).expect("meshd's control plane ran");
        });
        let socket_c = CString::new(socket.to_str().expect("a UTF-8 path")).expect("no NUL");
        Self { socket, socket_c, mailbox, thread: Some(thread) }
    }

    /// One request line and meshd's answer.
    fn call(&self, request: Value) -> Value {
        let conn = UnixStream::connect(&self.socket).expect("meshd answers");
        conn.set_read_timeout(Some(PATIENCE)).expect("timeout");
        (&conn).write_all(format!("{request}\n").as_bytes()).expect("request written");
        let mut line = String::new();
        BufReader::new(&conn).read_line(&mut line).expect("answer read");
        serde_json::from_str(&line).expect("a JSON answer")
    }

    fn service_create(&self, name: &str, clients: u32, msg_size: u32, reply_size: u32) {
        let answer = self.call(serde_json::json!({
            "op": "service_create", "name": name, "clients": clients, "msg_size": msg_size,
            "capacity": 64, "reply_size": reply_size, "reply_capacity": 16,
        }));
        assert_eq!(answer["ok"], true, "{answer}");
    }

    /// The service's row in `info`: its bound clients, and the departures not yet acknowledged.
    fn service_row(&self, name: &str) -> Value {
        let info = self.call(serde_json::json!({"op": "info"}));
        let rows = info["info"]["services"].as_array().cloned().unwrap_or_default();
        rows.into_iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no service {name} in {info}"))
    }

    fn bound_ids(&self, name: &str) -> Vec<u64> {
        let row = self.service_row(name);
        row["clients"].as_array().map(|c| c.iter().filter_map(|c| c["id"].as_u64()).collect()).unwrap_or_default()
    }

    /// Waits until no client is bound and the server acknowledged every departure.
    fn settle(&self, name: &str) {
        wait_until("every departure acknowledged", || {
            let row = self.service_row(name);
            row["bound"] == 0 && row["awaiting_ack"] == 0
        });
    }
}

impl Drop for Meshd {
    fn drop(&mut self) {
        let _ = self.call(serde_json::json!({"op": "shutdown"}));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < end, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A host server of a service: every reply is its request with the first u32 word plus one.
struct Server {
    stop: Arc<AtomicBool>,
    skipped: Arc<AtomicU64>,
    thread: Option<JoinHandle<(u64, u64)>>,
}

impl Server {
    fn start(mailbox: &Path, name: &str) -> Self {
        let mb = Mailbox::open(mailbox).expect("mailbox");
        let mut rx = FanInReceiver::claim(&mb, name).expect("the fan-in's consumer end");
        let mut srv = GroupServer::claim(&mb, &format!("{name}.replies")).expect("the group's server end");
        let (stop, skipped) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (stop2, skipped2) = (stop.clone(), skipped.clone());
        let thread = std::thread::spawn(move || {
            let mut req = vec![0u8; rx.info().msg_size as usize];
            let mut out = vec![0u8; srv.info().msg_size as usize];
            let (mut replied, mut departed) = (0u64, 0u64);
            while !stop2.load(Ordering::Acquire) {
                departed += srv.departures().expect("departures").len() as u64;
                match rx.try_take(&mut req).expect("take") {
                    Some(Taken::Message { sender }) => {
                        out.fill(0);
                        out[..req.len()].copy_from_slice(&req);
                        let word = u32::from_le_bytes(out[..4].try_into().expect("4 bytes")).wrapping_add(1);
                        out[..4].copy_from_slice(&word.to_le_bytes());
                        // One request in flight per client here: a full ring cannot happen, a gone client can.
                        while srv.reply(ClientId(sender), &out).expect("reply") == Replied::Full {
                            std::thread::yield_now();
                        }
                        replied += 1;
                    }
                    Some(Taken::Skipped { .. }) => {
                        skipped2.fetch_add(1, Ordering::Relaxed);
                    }
                    None => std::thread::sleep(Duration::from_micros(20)),
                }
            }
            (replied, departed)
        });
        Self { stop, skipped, thread: Some(thread) }
    }

    /// Stops it: (replies sent, departures acknowledged, skips taken).
    fn stop(mut self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Release);
        let (replied, departed) = self.thread.take().expect("running").join().expect("the server thread");
        (replied, departed, self.skipped.load(Ordering::Relaxed))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn connect(meshd: &Meshd, service: &CStr) -> *mut MeshService {
    let mut svc = null_mut();
    // SAFETY: NUL-terminated strings and a writable out pointer.
    let st = unsafe { mesh_service_connect(meshd.socket_c.as_ptr(), service.as_ptr(), &mut svc) };
    assert_eq!(st, MESH_OK, "{}", last_error());
    assert!(!svc.is_null());
    svc
}

#[test]
fn round_trips_through_the_c_calls_and_a_detach() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = Meshd::start(dir.path());
    meshd.service_create("kv", 4, 32, 40);
    let server = Server::start(&meshd.mailbox, "kv");
    let svc = connect(&meshd, c"kv");
    let mut info = MeshServiceInfo::default();
    let mut id = 0u32;
    // SAFETY: a live client, buffers of the lengths given; the client is closed once, at the end.
    unsafe {
        assert_eq!(mesh_service_info(svc, &mut info), MESH_OK);
        assert_eq!(mesh_service_id(svc, &mut id), MESH_OK);
        assert_eq!((info.id, info.msg_size, info.capacity, info.reply_size, info.reply_capacity), (id, 32, 64, 40, 16));
        assert_eq!(meshd.bound_ids("kv"), [u64::from(id)]);
        let mut out = [0u8; 40];
        assert_eq!(mesh_service_try_recv(svc, out.as_mut_ptr().cast(), 40), MESH_EMPTY);
        assert_eq!(mesh_service_recv(svc, out.as_mut_ptr().cast(), 40, 1), MESH_TIMEOUT);
        for k in 0u32..200 {
            let msg: Vec<u8> = [k.to_le_bytes(), id.to_le_bytes()]
                .concat()
                .into_iter()
                .chain((8..32).map(|i| i ^ k.to_le_bytes()[0]))
                .collect();
            let st = match k % 3 {
                0 => mesh_service_request(svc, msg.as_ptr().cast(), 32, out.as_mut_ptr().cast(), 40, 5000),
                1 => {
                    assert_eq!(mesh_service_send(svc, msg.as_ptr().cast(), 32, 5000), MESH_OK);
                    mesh_service_recv(svc, out.as_mut_ptr().cast(), 40, 5000)
                }
                _ => {
                    assert_eq!(mesh_service_try_send(svc, msg.as_ptr().cast(), 32), MESH_OK);
                    mesh_service_recv(svc, out.as_mut_ptr().cast(), 40, 5000)
                }
            };
            assert_eq!(st, MESH_OK, "{}", last_error());
            assert_eq!(u32::from_le_bytes(out[..4].try_into().unwrap()), k + 1);
            assert_eq!(out[4..32], msg[4..], "reply {k}");
            assert_eq!(out[32..], [0; 8], "a reply longer than its request is zero-padded");
        }
        // A short request is zero-padded; wrong buffers are refused, naming the channel.
        assert_eq!(mesh_service_request(svc, c"\x07".as_ptr().cast(), 1, out.as_mut_ptr().cast(), 40, 5000), MESH_OK);
        assert_eq!(out[..5], [8, 0, 0, 0, 0]);
        assert_eq!(mesh_service_try_send(svc, [0u8; 33].as_ptr().cast(), 33), MESH_ERR_MSG_SIZE);
        assert!(last_error().contains("\"kv\""), "{}", last_error());
        assert_eq!(mesh_service_try_recv(svc, out.as_mut_ptr().cast(), 32), MESH_ERR_MSG_SIZE);
        assert!(last_error().contains("kv.replies"), "{}", last_error());
        assert_eq!(
            mesh_service_request(svc, out.as_ptr().cast(), 8, out.as_mut_ptr().cast(), 32, 5000),
            MESH_ERR_MSG_SIZE
        );
        assert_eq!(mesh_service_recv(svc, out.as_mut_ptr().cast(), 40, 1), MESH_TIMEOUT, "nothing was sent");
        assert_eq!(mesh_service_close(svc), MESH_OK, "{}", last_error());
    }
    assert!(meshd.bound_ids("kv").is_empty());
    meshd.settle("kv");
    let (replied, departed, skipped) = server.stop();
    assert_eq!((replied, departed, skipped), (201, 1, 0));
}

/// The window: at most the reply ring's capacity (16) unanswered. Past it `try_send` is MESH_FULL and
/// `send` / `request` MESH_ERR_WINDOW at once, saying why, with nothing sent; each reply received
/// opens it by one; `mesh_service_set_window` narrows it, 0 lifts it, and a window wider than the ring
/// is MESH_ERR_ARG.
#[test]
fn the_window_keeps_at_most_the_reply_rings_capacity_unanswered() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = Meshd::start(dir.path());
    meshd.service_create("kv", 2, 32, 32);
    let svc = connect(&meshd, c"kv");
    let msg = [0u8; 32];
    let mut out = [0u8; 32];
    let mut unanswered = 0u64;
    let mut window = 0u32;
    // SAFETY: a live client, buffers of the lengths given; the client is closed once, at the end.
    unsafe {
        assert_eq!(mesh_service_window(svc, &mut window), MESH_OK);
        assert_eq!(window, 16, "the reply ring's capacity");
        for k in 0..16 {
            assert_eq!(mesh_service_try_send(svc, msg.as_ptr().cast(), 32), MESH_OK, "request {k}");
        }
        assert_eq!(mesh_service_unanswered(svc, &mut unanswered), MESH_OK);
        assert_eq!(unanswered, 16);
        assert_eq!(mesh_service_try_send(svc, msg.as_ptr().cast(), 32), MESH_FULL, "the window is full");
        assert_eq!(mesh_service_send(svc, msg.as_ptr().cast(), 32, 5000), MESH_ERR_WINDOW);
        assert!(last_error().contains("16 requests unanswered"), "{}", last_error());
        let at = Instant::now();
        assert_eq!(
            mesh_service_request(svc, msg.as_ptr().cast(), 32, out.as_mut_ptr().cast(), 32, 5000),
            MESH_ERR_WINDOW
        );
        assert!(at.elapsed() < Duration::from_secs(4), "refused at once, not after the timeout");
        assert_eq!(mesh_service_set_window(svc, 17), MESH_ERR_ARG);
        assert!(last_error().contains("1 to the reply ring's capacity, 16"), "{}", last_error());
        // The server answers all 16; each reply received lets one more out.
        let server = Server::start(&meshd.mailbox, "kv");
        assert_eq!(mesh_service_recv(svc, out.as_mut_ptr().cast(), 32, 5000), MESH_OK, "{}", last_error());
        assert_eq!(mesh_service_send(svc, msg.as_ptr().cast(), 32, 5000), MESH_OK, "{}", last_error());
        for _ in 0..16 {
            assert_eq!(mesh_service_recv(svc, out.as_mut_ptr().cast(), 32, 5000), MESH_OK, "{}", last_error());
        }
        assert_eq!(mesh_service_unanswered(svc, &mut unanswered), MESH_OK);
        assert_eq!(unanswered, 0);
        // Narrowed to one, then lifted.
        assert_eq!(mesh_service_set_window(svc, 1), MESH_OK);
        assert_eq!(mesh_service_try_send(svc, msg.as_ptr().cast(), 32), MESH_OK);
        assert_eq!(mesh_service_try_send(svc, msg.as_ptr().cast(), 32), MESH_FULL);
        assert_eq!(mesh_service_recv(svc, out.as_mut_ptr().cast(), 32, 5000), MESH_OK);
        assert_eq!(mesh_service_set_window(svc, 0), MESH_OK);
        assert_eq!(mesh_service_window(svc, &mut window), MESH_OK);
        assert_eq!(window, 0, "no limit");
        for _ in 0..20 {
            assert_eq!(mesh_service_send(svc, msg.as_ptr().cast(), 32, 5000), MESH_OK, "{}", last_error());
        }
        for _ in 0..20 {
            assert_eq!(mesh_service_recv(svc, out.as_mut_ptr().cast(), 32, 5000), MESH_OK, "{}", last_error());
        }
        assert_eq!(mesh_service_unanswered(null(), &mut unanswered), MESH_ERR_NULL);
        assert_eq!(mesh_service_close(svc), MESH_OK, "{}", last_error());
        meshd.settle("kv");
        let (replied, _, _) = server.stop();
        assert_eq!(replied, 16 + 1 + 1 + 20, "exactly the requests the window let out");
    }
}

#[test]
fn refusals_are_status_codes_with_meshds_reason() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = Meshd::start(dir.path());
    meshd.service_create("duo", 2, 16, 16);
    let mut svc = null_mut();
    let bad_utf8 = [0xffu8 as c_char, 0];
    // SAFETY: every pointer is NULL, live, or NUL-terminated as each call's contract allows.
    unsafe {
        assert_eq!(mesh_service_connect(meshd.socket_c.as_ptr(), c"nope".as_ptr(), &mut svc), MESH_ERR_REFUSED);
        assert!(last_error().contains("\"nope\"") && last_error().contains("no such service"), "{}", last_error());
        assert!(svc.is_null(), "nothing is written on failure");
        assert_eq!(
            mesh_service_connect(c"/nonexistent/sock".as_ptr(), c"duo".as_ptr(), &mut svc),
            MESH_ERR_UNREACHABLE
        );
        assert!(last_error().contains("/nonexistent/sock"), "{}", last_error());
        assert_eq!(mesh_service_connect(meshd.socket_c.as_ptr(), null(), &mut svc), MESH_ERR_NULL);
        assert_eq!(mesh_service_connect(meshd.socket_c.as_ptr(), c"duo".as_ptr(), null_mut()), MESH_ERR_NULL);
        assert_eq!(mesh_service_connect(meshd.socket_c.as_ptr(), bad_utf8.as_ptr(), &mut svc), MESH_ERR_ARG);
        // Two slots: the third client is refused until one leaves (no server here to acknowledge it, so
        // the freed slot waits, and meshd says so).
        let (a, b) = (connect(&meshd, c"duo"), connect(&meshd, c"duo"));
        assert_eq!(mesh_service_connect(meshd.socket_c.as_ptr(), c"duo".as_ptr(), &mut svc), MESH_ERR_REFUSED);
        assert!(last_error().contains("all 2 client slot"), "{}", last_error());
        assert_eq!(mesh_service_close(a), MESH_OK);
        assert_eq!(mesh_service_connect(meshd.socket_c.as_ptr(), c"duo".as_ptr(), &mut svc), MESH_ERR_REFUSED);
        assert!(last_error().contains("acknowledged"), "{}", last_error());
        assert_eq!(mesh_service_close(b), MESH_OK);
        // NULL handles.
        let mut info = MeshServiceInfo::default();
        assert_eq!(mesh_service_info(null(), &mut info), MESH_ERR_NULL);
        assert_eq!(mesh_service_try_send(null_mut(), [0u8; 8].as_ptr().cast(), 8), MESH_ERR_NULL);
        assert_eq!(mesh_service_recv(null_mut(), null_mut(), 8, 1), MESH_ERR_NULL);
        assert_eq!(mesh_service_request(null_mut(), null(), 0, null_mut(), 0, 1), MESH_ERR_NULL);
        assert_eq!(mesh_service_close(null_mut()), MESH_OK);
    }
    for code in [MESH_ERR_REFUSED, MESH_ERR_UNREACHABLE, MESH_ERR_PROTOCOL] {
        // SAFETY: mesh_shm_strerror returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(mesh_shm_strerror(code)) }.to_string_lossy().into_owned();
        assert!(text.contains("meshd"), "{code}: {text}");
    }
}

/// A control socket that answers `info` with `mailbox` and everything else with `answer`.
fn fake_meshd(socket: &Path, mailbox: &Path, answer: &'static str) -> JoinHandle<()> {
    let listener = UnixListener::bind(socket).unwrap();
    let info = format!("{}\n", serde_json::json!({"ok": true, "info": {"mailbox": mailbox}}));
    std::thread::spawn(move || {
        for conn in listener.incoming().take(2) {
            let conn = conn.unwrap();
            let mut line = String::new();
            BufReader::new(&conn).read_line(&mut line).unwrap();
            let reply = if line.contains("\"info\"") { info.clone() } else { answer.to_string() };
            if reply.is_empty() {
                continue; // closed without answering
            }
            let _ = (&conn).write_all(reply.as_bytes());
            // Hold a lease until the client closes it.
            let _ = BufReader::new(&conn).read_line(&mut line);
        }
    })
}

#[test]
fn answers_meshd_never_gives_are_protocol_errors_and_leave_nothing_open() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = Meshd::start(dir.path());
    meshd.service_create("kv", 2, 16, 16);
    let cases: [(&str, MeshStatus, &str); 5] = [
        ("not json\n", MESH_ERR_PROTOCOL, "malformed answer"),
        ("{\"ok\":true}\n", MESH_ERR_PROTOCOL, "malformed client"),
        (
            "{\"ok\":true,\"client\":{\"id\":4294967296,\"requests\":\"kv\",\"replies\":\"kv.replies\"}}\n",
            MESH_ERR_PROTOCOL,
            "malformed client",
        ),
        ("", MESH_ERR_PROTOCOL, "without answering"),
        // Channels that are no service's: the ends refuse, and the lease is given back.
        (
            "{\"ok\":true,\"client\":{\"id\":1,\"requests\":\"kv.replies\",\"replies\":\"kv\"}}\n",
            MESH_ERR_ARG,
            "format",
        ),
    ];
    for (i, (answer, code, text)) in cases.into_iter().enumerate() {
        let socket = dir.path().join(format!("fake{i}.sock"));
        let fake = fake_meshd(&socket, &meshd.mailbox, answer);
        let socket_c = CString::new(socket.to_str().unwrap()).unwrap();
        let mut svc = null_mut();
        // SAFETY: NUL-terminated strings, a writable out pointer.
        let st = unsafe { mesh_service_connect(socket_c.as_ptr(), c"kv".as_ptr(), &mut svc) };
        assert_eq!((st, svc.is_null()), (code, true), "{answer:?}: {}", last_error());
        assert!(last_error().contains(text), "{answer:?}: {}", last_error());
        fake.join().unwrap();
    }
}

/// A client whose lease ended with a restart of meshd (it stayed bound) closes all the same: the
/// close takes its lease back from the new meshd and detaches there.
#[test]
fn close_after_a_restart_of_meshd_takes_the_lease_back_and_detaches() {
    let dir = tempfile::tempdir().unwrap();
    let first = Meshd::start(dir.path());
    first.service_create("kv", 2, 16, 16);
    let svc = connect(&first, c"kv");
    let mut id = 0u32;
    // SAFETY: a live client and a writable out pointer.
    assert_eq!(unsafe { mesh_service_id(svc, &mut id) }, MESH_OK);
    drop(first);
    let second = Meshd::start_again(dir.path());
    assert_eq!(second.bound_ids("kv"), [u64::from(id)], "still bound after the restart");
    // SAFETY: a live client, closed once.
    assert_eq!(unsafe { mesh_service_close(svc) }, MESH_OK, "{}", last_error());
    assert!(second.bound_ids("kv").is_empty(), "detached on the lease taken back");
    assert_eq!(second.service_row("kv")["events"]["detached"], 1, "{}", second.service_row("kv"));
}

#[test]
fn close_after_meshd_has_gone_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = Meshd::start(dir.path());
    meshd.service_create("kv", 2, 16, 16);
    let svc = connect(&meshd, c"kv");
    drop(meshd);
    // SAFETY: a live client, closed once.
    assert_eq!(unsafe { mesh_service_close(svc) }, MESH_OK, "{}", last_error());
}

#[test]
fn a_c_program_streams_and_one_killed_with_sigkill_is_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = common::build_c_program("service_client", dir.path()) else { return };
    let meshd = Meshd::start(dir.path());
    meshd.service_create("kv", 4, 64, 64);
    let server = Server::start(&meshd.mailbox, "kv");
    let spawn = |count: &str| {
        Command::new(&exe)
            .args([meshd.socket.to_str().unwrap(), "kv", count])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut victim = spawn("0");
    let survivors: Vec<_> = (0..2).map(|_| spawn("3000")).collect();
    let mut lines = BufReader::new(victim.stdout.take().unwrap()).lines();
    let victim_id: u64 = lines.next().unwrap().unwrap().strip_prefix("id ").unwrap().parse().unwrap();
    assert!(lines.next().unwrap().unwrap().starts_with("done"), "the victim streams");
    assert!(meshd.bound_ids("kv").contains(&victim_id));
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    wait_until("meshd's departure of the killed client", || !meshd.bound_ids("kv").contains(&victim_id));
    for s in survivors {
        let out = s.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.lines().last(), Some("ok 3000"), "{stdout}");
    }
    meshd.settle("kv");
    let (replied, departed, skipped) = server.stop();
    assert!(replied >= 2 * 3000 + 100, "{replied}");
    assert_eq!(departed, 3);
    assert!(skipped <= 1, "one skip at most, for the send the kill cut off: {skipped}");
}
