//! The service GPU test's client side on the CPU (runs everywhere, no gate): `mesh-service-client`
//! processes, their checks and the harness that drives them (`mesh_gpu_tests::service`), against meshd's
//! real control plane and mailbox around its stand-in backend, with a host thread playing
//! `tests/programs/service.cu` (take each request, reply with payload word 1 + 1, acknowledge
//! departures). Clients are killed with SIGKILL mid-stream, detach, join in the freed entries, and the
//! "program" is stopped and claimed again (what an upgrade does to the GPU program's ends). Checked as
//! the GPU test checks: every client not killed exits 0 with every reply in order and none repeated,
//! killed clients leave the group's table and `info`, nothing is bound at the end.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use mesh_gpu_tests::service::{ClientProcess, bound_clients, field};
use mesh_gpu_tests::wait_until;
use mesh_shm::{ClientId, CreateMode, FanInReceiver, GroupServer, Mailbox, MailboxConfig, Replied, Taken};
use meshd::protocol::Request;
use meshd::server::{Limits, Opened, Server, StopHandle};
use meshd::stand_in::StandInBackend;

const DEADLINE: Duration = Duration::from_secs(30);
const CLIENTS: u32 = 12;
const MSG: u32 = 64;

/// meshd's control plane over `mailbox` at `socket`, as `meshd run` wires it, without a GPU.
struct Control {
    stop: StopHandle,
    server: Option<JoinHandle<()>>,
}

impl Control {
    fn start(mailbox: Mailbox, socket: &Path) -> Self {
        let server = Server::start(mailbox, Limits::default(), None, |mb| {
            Ok(Opened { backend: Box::new(StandInBackend::new(mb)), device: "stand-in".into(), arch: None })
        })
        .expect("meshd's server");
        let listener = meshd::start::bind_socket(socket).expect("the socket");
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || {
            server.run(listener).expect("meshd's server ran");
        }));
        Self { stop, server }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

/// One request and its answer.
fn ask(socket: &Path, req: &Request) -> meshd::protocol::Response {
    let conn = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    meshd::protocol::write_request(&mut &conn, req, &[]).expect("write");
    meshd::protocol::read_response(&mut std::io::BufReader::new(&conn)).expect("answer")
}

#[derive(Default)]
struct Counts {
    replies: AtomicU64,
    skips: AtomicU64,
    gone: AtomicU64,
    departed: AtomicU64,
}

/// The host "program": service.cu's loop with the host ends, until `stop`.
fn program(mb: Mailbox, stop: Arc<AtomicBool>, counts: Arc<Counts>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut rx = FanInReceiver::claim(&mb, "svc").expect("the fan-in's consumer end");
        let mut server = GroupServer::claim(&mb, "svc.replies").expect("the group's server end");
        let mut buf = vec![0u8; MSG as usize];
        let mut idle = 0u32;
        while !stop.load(Ordering::Acquire) {
            let gone = server.departures().expect("departures").len();
            counts.departed.fetch_add(gone as u64, Ordering::Relaxed);
            match rx.try_take(&mut buf).expect("take") {
                None => {
                    idle += 1;
                    if idle > 100 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                Some(Taken::Skipped { .. }) => {
                    counts.skips.fetch_add(1, Ordering::Relaxed);
                }
                Some(Taken::Message { sender }) => {
                    idle = 0;
                    let w1 = u32::from_le_bytes(buf[4..8].try_into().unwrap()).wrapping_add(1);
                    buf[4..8].copy_from_slice(&w1.to_le_bytes());
                    // A reply waiting for room is held (as service.cu holds it), departures still seen.
                    loop {
                        match server.reply(ClientId(sender), &buf).expect("reply") {
                            Replied::Sent => counts.replies.fetch_add(1, Ordering::Relaxed),
                            Replied::Gone => counts.gone.fetch_add(1, Ordering::Relaxed),
                            Replied::Full => {
                                let gone = server.departures().expect("departures").len();
                                counts.departed.fetch_add(gone as u64, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_micros(50));
                                continue;
                            }
                        };
                        break;
                    }
                }
            }
        }
    })
}

fn spawn(socket: &Path, dir: &Path, k: usize) -> ClientProcess {
    let args: Vec<String> =
        ["--mode", "run", "--inflight", "4", "--attach-for-ms", "20000"].iter().map(|s| (*s).to_string()).collect();
    let mut p = ClientProcess::spawn(socket, "svc", &args, dir.join(format!("client-{k}.log")));
    p.wait_ready(DEADLINE).unwrap_or_else(|e| panic!("client {k}: {e}"));
    p
}

fn replies_of(p: &ClientProcess) -> u64 {
    p.heard().progress.map_or(0, |x| x.0)
}

/// A mailbox, meshd's control plane over it at `socket`, and the service `svc` made through it.
fn setup(dir: &Path, socket: &Path) -> (Mailbox, Control) {
    let config = MailboxConfig { size: 8 << 20, slots: 8, channels: 16 };
    let mb = Mailbox::create(dir.join("mb"), &config, CreateMode::Exclusive).unwrap();
    let control = Control::start(mb.clone(), socket);
    let create = Request::ServiceCreate {
        name: "svc".into(),
        clients: CLIENTS,
        msg_size: MSG,
        capacity: 64,
        reply_size: None,
        reply_capacity: 16,
        shards: 1,
    };
    let created = ask(socket, &create);
    assert!(created.ok, "{created:?}");
    (mb, control)
}

#[test]
fn service_clients_killed_detached_joined_and_the_program_restarted_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let (mb, _control) = setup(dir.path(), &socket);
    let counts = Arc::new(Counts::default());
    let mut stop = Arc::new(AtomicBool::new(false));
    let mut prog = program(mb.clone(), Arc::clone(&stop), Arc::clone(&counts));

    let mut live: Vec<ClientProcess> = (0..CLIENTS as usize).map(|k| spawn(&socket, dir.path(), k)).collect();
    let mut finished: Vec<ClientProcess> = Vec::new();
    let mut killed: Vec<u32> = Vec::new();
    let mut next = live.len();
    let moving = |ps: &[ClientProcess], from: &[u64]| ps.iter().zip(from).all(|(p, &f)| replies_of(p) > f);

    let start: Vec<u64> = live.iter().map(replies_of).collect();
    assert!(wait_until(DEADLINE, || moving(&live, &start)), "clients not moving at the start");
    for round in 0..3 {
        // Kill one mid-stream: its entry leaves the table.
        let mut victim = live.remove(round % live.len());
        let pid = victim.pid();
        victim.kill9();
        killed.push(pid);
        assert!(
            wait_until(DEADLINE, || bound_clients(&mb, "svc").unwrap().iter().all(|&(_, p)| p != pid)),
            "killed client {pid} still bound: {:?}",
            bound_clients(&mb, "svc")
        );
        // One detaches.
        let mut leaving = live.remove(0);
        leaving.finish();
        finished.push(leaving);
        // Two join in the freed entries.
        for _ in 0..2 {
            live.push(spawn(&socket, dir.path(), next));
            next += 1;
        }
        // The "upgrade": the program's ends dropped and claimed again.
        stop.store(true, Ordering::Release);
        prog.join().unwrap();
        stop = Arc::new(AtomicBool::new(false));
        prog = program(mb.clone(), Arc::clone(&stop), Arc::clone(&counts));
        let now: Vec<u64> = live.iter().map(replies_of).collect();
        assert!(wait_until(DEADLINE, || moving(&live, &now)), "clients not moving after round {round}");
    }

    let info = ask(&socket, &Request::Info).info.expect("info");
    let row = info.services.iter().find(|s| s.name == "svc").expect("info's service row");
    assert!(row.clients.iter().all(|c| !killed.contains(&c.pid)), "info lists a killed client: {row:?}");
    assert_eq!(row.clients.len(), live.len(), "info's clients: {row:?}");

    for p in &mut live {
        p.finish();
    }
    finished.append(&mut live);
    let mut total = 0;
    for p in &mut finished {
        let (code, done) = p.wait_done(DEADLINE).unwrap();
        let done = done.unwrap_or_else(|| panic!("no done line: {}", p.said()));
        assert_eq!(code, Some(0), "{done}: {}", p.said());
        assert_eq!(field(&done, "sent"), field(&done, "replies"), "{done}");
        assert_eq!(field(&done, "repeats"), Some(0), "{done}");
        assert_eq!(field(&done, "errors"), Some(0), "{done}");
        total += field(&done, "replies").unwrap();
    }
    assert!(wait_until(DEADLINE, || bound_clients(&mb, "svc").unwrap().is_empty()), "entries still bound at the end");
    stop.store(true, Ordering::Release);
    prog.join().unwrap();
    let sent = counts.replies.load(Ordering::Relaxed);
    assert!(sent >= total, "the program sent {sent} replies, the clients that finished received {total}");
    eprintln!(
        "host service: {} clients finished, {total} replies checked, program: {sent} sent, {} skips, {} gone, {} departures; \
         {} killed",
        finished.len(),
        counts.skips.load(Ordering::Relaxed),
        counts.gone.load(Ordering::Relaxed),
        counts.departed.load(Ordering::Relaxed),
        killed.len()
    );
}

/// Waits for every client to be ready, says `go` to each, then waits for each to finish: its exit code
/// and `done` line (with what it said, in the line, when there is none).
fn go_and_wait(procs: &mut [ClientProcess]) -> Vec<(Option<i32>, String)> {
    for p in procs.iter_mut() {
        p.wait_ready(DEADLINE).unwrap();
    }
    for p in procs.iter_mut() {
        p.say("go");
    }
    procs
        .iter_mut()
        .map(|p| {
            let (code, done) = p.wait_done(DEADLINE).unwrap();
            (code, done.unwrap_or_else(|| panic!("no done line: {}", p.said())))
        })
        .collect()
}

#[test]
fn the_benchmarks_latency_and_stream_modes_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let (mb, _control) = setup(dir.path(), &socket);
    let stop = Arc::new(AtomicBool::new(false));
    let prog = program(mb.clone(), Arc::clone(&stop), Arc::new(Counts::default()));
    let files: Vec<_> = (0..2).map(|i| dir.path().join(format!("lat-{i}.bin"))).collect();
    let mut procs: Vec<ClientProcess> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let args = ["--mode", "latency", "--count", "300", "--warmup", "20", "--out", f.to_str().unwrap()];
        let args: Vec<String> = args.iter().map(|s| (*s).to_string()).collect();
        procs.push(ClientProcess::spawn(&socket, "svc", &args, dir.path().join(format!("lat-{i}.log"))));
    }
    for i in 0..2 {
        let args: Vec<String> =
            ["--mode", "stream", "--inflight", "8", "--secs", "0.3"].iter().map(|s| (*s).to_string()).collect();
        procs.push(ClientProcess::spawn(&socket, "svc", &args, dir.path().join(format!("stream-{i}.log"))));
    }
    for (i, (code, done)) in go_and_wait(&mut procs).into_iter().enumerate() {
        assert_eq!(code, Some(0), "{done}");
        assert_eq!(field(&done, "errors"), Some(0), "{done}");
        if i < 2 {
            assert_eq!(field(&done, "replies"), Some(320), "{done}");
            assert_eq!(std::fs::read(&files[i]).unwrap().len(), 300 * 8, "{done}");
        } else {
            assert!(field(&done, "replies").unwrap() >= 8, "{done}");
            assert!(field(&done, "elapsed_us").unwrap() >= 300_000, "{done}");
        }
    }
    stop.store(true, Ordering::Release);
    prog.join().unwrap();
}

/// The benchmark's raw baseline clients (`--mode raw`), with a host thread playing
/// `raw_pingpong_many.cu`: each client's round trips come back through its own pair of words, every
/// one timed, and a word that never comes back is an error within the timeout, exit 1.
#[test]
fn the_benchmarks_raw_mode_round_trips_through_its_own_words() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb = Mailbox::create(&path, &MailboxConfig::default(), CreateMode::Exclusive).unwrap();
    let ch = mb.create_channel("raw-many", 64, 64).unwrap();
    let (base, _) = mb.as_raw_parts();
    let word = |c: usize, back: bool| {
        let at = usize::try_from(ch.slots_offset).unwrap() + 128 * c + if back { 64 } else { 0 };
        // SAFETY: inside the channel's 8 KiB of slots, 8-aligned, mapped while `mb` lives (the test's end).
        unsafe { AtomicU64::from_ptr(base.add(at).cast()) }
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Echoes clients 0 and 3 (the "GPU threads"); client 5's word is never echoed.
    let echo = {
        let stop = Arc::clone(&stop);
        let pairs = [0usize, 3].map(|c| (word(c, false), word(c, true)));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                for (ping, pong) in &pairs {
                    let v = ping.load(Ordering::Acquire);
                    if pong.load(Ordering::Relaxed) != v {
                        pong.store(v, Ordering::Release);
                    }
                }
                std::hint::spin_loop();
            }
        })
    };
    let files: Vec<_> = [0, 3, 5].iter().map(|c| dir.path().join(format!("raw-{c}.bin"))).collect();
    let mut procs: Vec<ClientProcess> = [0usize, 3, 5]
        .iter()
        .zip(&files)
        .map(|(c, f)| {
            let args = [
                "--mode",
                "raw",
                "--shm",
                path.to_str().unwrap(),
                "--index",
                &c.to_string(),
                "--count",
                "200",
                "--warmup",
                "20",
                "--timeout-ms",
                "300",
                "--out",
                f.to_str().unwrap(),
            ];
            let args: Vec<String> = args.iter().map(|s| (*s).to_string()).collect();
            ClientProcess::spawn(Path::new("/nonexistent"), "raw-many", &args, dir.path().join(format!("raw-{c}.log")))
        })
        .collect();
    for (i, (code, done)) in go_and_wait(&mut procs).into_iter().enumerate() {
        if i < 2 {
            assert_eq!((code, field(&done, "errors")), (Some(0), Some(0)), "{done}");
            assert_eq!(field(&done, "replies"), Some(200), "{done}");
            assert_eq!(std::fs::read(&files[i]).unwrap().len(), 200 * 8, "{done}");
        } else {
            assert_eq!((code, field(&done, "errors")), (Some(1), Some(1)), "client 5 is never echoed: {done}");
        }
    }
    // An index past the channel's slots is refused before anything is touched.
    let mut past = ClientProcess::spawn(
        Path::new("/nonexistent"),
        "raw-many",
        &["--mode", "raw", "--shm", path.to_str().unwrap(), "--index", "64"].map(String::from),
        dir.path().join("raw-past.log"),
    );
    assert_eq!(past.wait_done(DEADLINE).unwrap().0, Some(2));
    stop.store(true, Ordering::Release);
    echo.join().unwrap();
}
