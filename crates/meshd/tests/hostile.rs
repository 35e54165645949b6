//! A running meshd while another process scribbles on one service's shared words: meshd stays up, answers `info` and `ps`, departs a killed client of the damaged service without panicking, never kills itself for a forged holder, and the other service keeps serving.
//!
//! meshd runs in this process on the stand-in backend (as `service.rs` runs it); its threads'
//! panics are caught by a panic hook, since a panicking lease or watcher thread would otherwise die
//! unseen. The "program" of each service is a host thread with its host ends. The client killed
//! with -9 is this binary run again as [`hostile_client_child`].
#![allow(clippy::cast_possible_truncation, reason = "test offsets and ids are small")]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{ListBackend, ask, group_entry, poke, wait_until, within};
use mesh_shm::claim::Holder;
use mesh_shm::layout::{LINE, fanin_shard_offset, fanin_shard_owners_offset, fanin_shard_slots_offset};
use mesh_shm::{ChannelInfo, ClientId, CreateMode, FanInReceiver, GroupServer, Mailbox, MailboxConfig, Taken};
use meshd::ServiceClient;
use meshd::protocol::{Request, ServiceRow};
use meshd::server::{Limits, Server};
use meshd::start::bind_socket;

const DEADLINE: Duration = Duration::from_secs(30);
const MSG: u32 = 16;
const CAP: u32 = 8;
const ROLE: &str = "MESHD_HOSTILE_CHILD";

/// Panics seen in any thread of this process (meshd's among them) since the hook was set.
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn catch_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("?").to_string();
            PANICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(format!("{thread}: {info}"));
            prev(info);
        }));
    });
}

fn panics() -> Vec<String> {
    PANICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// meshd on a new mailbox in `dir`, with its stall watcher (revoke after 20 ms, kill after 100 ms).
fn start(dir: &Path) -> (std::path::PathBuf, meshd::server::StopHandle, JoinHandle<bool>) {
    let mailbox = Mailbox::create(
        dir.join("mb"),
        &MailboxConfig { size: 4 << 20, slots: 8, channels: 16 },
        CreateMode::Exclusive,
    )
    .unwrap();
    let limits = Limits {
        client_stall: Some(Duration::from_millis(20)),
        client_stall_kill: Some(Duration::from_millis(100)),
        ..Limits::default()
    };
    let server = Server::start(mailbox, limits, None, |mb| ListBackend::new(mb).opened()).unwrap();
    let socket = dir.join("sock");
    let listener = bind_socket(&socket).unwrap();
    let stop = server.stop_handle();
    (socket, stop, std::thread::spawn(move || server.run(listener).unwrap()))
}

fn create(socket: &Path, name: &str, shards: u32) {
    let req = Request::ServiceCreate {
        name: name.into(),
        clients: 4,
        msg_size: MSG,
        capacity: CAP,
        reply_size: None,
        reply_capacity: CAP,
        shards,
    };
    let r = ask(socket, &req, &[]);
    assert!(r.ok, "{r:?}");
}

/// A service's program: takes requests, replies with the request, acknowledges departures; errors
/// (the damaged service's) are counted, never fatal.
fn program(mb: &Mailbox, name: &str, stop: Arc<AtomicBool>, errors: Arc<AtomicUsize>) -> JoinHandle<()> {
    let mut rx = FanInReceiver::claim(mb, name).unwrap();
    let mut srv = GroupServer::claim(mb, &format!("{name}.replies")).unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; MSG as usize];
        while !stop.load(Ordering::Acquire) {
            match rx.try_take(&mut buf) {
                Ok(Some(Taken::Message { sender })) => {
                    if srv.reply(ClientId(sender), &buf).is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(Some(Taken::Skipped { .. })) => {}
                Ok(None) => std::thread::sleep(Duration::from_micros(200)),
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if srv.departures().is_err() {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

fn service_row(socket: &Path, name: &str) -> Option<ServiceRow> {
    let r = ask(socket, &Request::Info, &[]);
    assert!(r.ok, "info refused: {r:?}");
    r.info.unwrap().services.into_iter().find(|s| s.name == name)
}

/// A client of `name` round-trips a request, within the deadline.
fn round_trip(socket: &Path, name: &str) {
    let (socket, service) = (socket.to_path_buf(), name.to_string());
    let done = within(DEADLINE, move || {
        let mut c = ServiceClient::connect(&socket, &service).map_err(|e| format!("attach: {e:#}"))?;
        let mut out = [0u8; MSG as usize];
        c.request(b"ping", &mut out, DEADLINE).map_err(|e| format!("request: {e:#}"))?;
        if !out.starts_with(b"ping") {
            return Err(format!("reply {out:?}"));
        }
        c.detach().map_err(|e| format!("detach: {e:#}"))
    });
    match done {
        Some(Ok(())) => {}
        Some(Err(e)) => panic!("service {name:?}: {e}"),
        None => panic!("service {name:?}: a round trip did not end within {DEADLINE:?}"),
    }
}

/// What `hostile_client_child` runs as: attaches to the service, prints its id, then sends forever.
#[test]
fn hostile_client_child() {
    let Ok(socket) = std::env::var(ROLE) else { return };
    let service = std::env::var(format!("{ROLE}_SERVICE")).unwrap();
    let mut c = ServiceClient::connect(Path::new(&socket), &service).unwrap();
    println!("\nATTACHED {}", c.id());
    if std::env::var(format!("{ROLE}_IDLE")).is_ok() {
        std::thread::sleep(DEADLINE * 2);
        return;
    }
    loop {
        let _ = c.send(&[1; 8], Duration::from_millis(5));
        let mut out = [0u8; MSG as usize];
        let _ = c.recv(&mut out, Duration::from_millis(5));
    }
}

fn spawn_child(socket: &Path, service: &str) -> (std::process::Child, u32) {
    spawn_child_with(socket, service, &[])
}

/// [`spawn_child`] with more of its environment (`{ROLE}_IDLE`: it attaches and sends nothing).
fn spawn_child_with(socket: &Path, service: &str, env: &[(String, &str)]) -> (std::process::Child, u32) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["hostile_client_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, socket)
        .env(format!("{ROLE}_SERVICE"), service)
        .envs(env.iter().map(|(k, v)| (k.as_str(), *v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let id = within(DEADLINE, move || {
        out.lines().map_while(Result::ok).find_map(|l| l.strip_prefix("ATTACHED ").map(|s| s.trim().parse::<u32>()))
    });
    let id = id.flatten().expect("the child attached").unwrap();
    (child, id)
}

/// Every shared word of service `name` that meshd's side reads: each shard's header, owner table and
/// first slots, the group's header, entries and reply ring headers.
fn service_words(mb: &Mailbox, name: &str) -> Vec<u64> {
    let (f, g): (ChannelInfo, ChannelInfo) =
        (mb.channel(name).unwrap(), mb.channel(&format!("{name}.replies")).unwrap());
    let mut out = Vec::new();
    for k in 0..f.parts {
        let header = if k == 0 { f.ring_offset } else { f.slots_offset + fanin_shard_offset(k, MSG, CAP) };
        out.extend([header, header + LINE, header + 2 * LINE, header + 2 * LINE + 8]);
        let owners = f.slots_offset + fanin_shard_owners_offset(k, MSG, CAP);
        out.extend((0..u64::from(CAP)).map(|i| owners + 8 * i));
        let slots = f.slots_offset + fanin_shard_slots_offset(k, MSG, CAP);
        out.extend((0..12).map(|j| slots + 8 * j));
    }
    out.extend((0..4).map(|w| g.slots_offset + 8 * w));
    for e in 0..u64::from(g.parts) {
        let entry = group_entry(&g, e);
        out.extend([entry, entry + 8, entry + 16, entry + LINE]);
    }
    out
}

/// Service `name`'s fan-in slot 0 (tail 0) shown reserved by client slot `slot` in lap 1 and being
/// written (between its begin and its commit), and that entry's holder word set to `holder`: a hold
/// the stall watcher cannot revoke, and kills after its delay.
fn hold_mid_send(mb: &Mailbox, name: &str, slot: u16, holder: Holder) {
    let (f, g) = (mb.channel(name).unwrap(), mb.channel(&format!("{name}.replies")).unwrap());
    poke(mb, f.slots_offset, (1 << 18) | (2 << 16) | u64::from(slot));
    poke(mb, group_entry(&g, u64::from(slot)) + 8, holder.word());
}

/// A small xorshift: the same garbage every run, different in every word.
fn garbage(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    match *state % 8 {
        0 => 0,
        1 => u64::MAX,
        2 => 1 << 63,
        3 => ((*state % 6) << 18) | (((*state >> 8) % 4) << 16) | ((*state >> 12) % 4),
        4 => (((*state >> 20) % 4) << 32) | ((*state >> 24) % 3),
        _ => *state,
    }
}

#[test]
fn scribbles_on_one_service_leave_meshd_and_the_other_serving() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    catch_panics();
    let dir = tempfile::tempdir().unwrap();
    let (socket, stop, server) = start(dir.path());
    create(&socket, "a", 2);
    create(&socket, "b", 1);
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let (halt, errors) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let programs = [program(&mb, "a", halt.clone(), errors.clone()), program(&mb, "b", halt.clone(), Arc::default())];
    round_trip(&socket, "a");
    round_trip(&socket, "b");
    let (mut victims, mut ids) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let (child, id) = spawn_child(&socket, "a");
        victims.push(child);
        ids.push(id);
    }
    let words = service_words(&mb, "a");
    let mut state = 0x9e37_79b9_7f4a_7c15;
    for round in 0..4 {
        for &w in &words {
            poke(&mb, w, garbage(&mut state));
        }
        // A client of the damaged service killed while its words are garbage: meshd departs it
        // (complete_dead over the garbage) or says why not, on its lease's thread.
        if let Some(mut v) = victims.pop() {
            v.kill().unwrap();
            v.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(!server.is_finished(), "round {round}: meshd's server ended");
        assert!(panics().is_empty(), "round {round}: a thread panicked: {:?}", panics());
        // meshd answers: info (with the damaged service's row, or an error in it), ps, and the
        // damaged service's attach answers (an id or a refusal), all within the deadline.
        let s = socket.clone();
        let answered = within(DEADLINE, move || {
            let b = service_row(&s, "b").expect("service b listed");
            assert!(b.error.is_none(), "service b: {:?}", b.error);
            let _ = service_row(&s, "a");
            assert!(ask(&s, &Request::Ps, &[]).ok, "ps refused");
            let _ = ServiceClient::connect(&s, "a").map(|mut c| c.send(&[1], Duration::from_millis(20)));
        });
        assert!(answered.is_some(), "round {round}: meshd did not answer within {DEADLINE:?}");
        round_trip(&socket, "b");
    }
    // The damaged service's descriptor itself: its service disappears or is refused, not the other.
    let a = mb.channel("a").unwrap();
    let desc = mb.geometry().channels_offset + u64::from(a.index) * 128;
    poke(&mb, desc, u64::MAX); // state: neither free nor live
    poke(&mb, desc + 8, 0); // capacity 0
    let r = ask(&socket, &Request::Info, &[]);
    assert!(r.ok, "info with a damaged descriptor: {r:?}");
    let info = r.info.unwrap();
    assert!(info.channels.iter().any(|c| c.name == "b"), "b listed in {:?}", info.channels);
    assert!(info.services.iter().any(|s| s.name == "b" && s.error.is_none()), "{:?}", info.services);
    round_trip(&socket, "b");
    assert!(panics().is_empty(), "a thread panicked: {:?}", panics());
    halt.store(true, Ordering::Release);
    for p in programs {
        p.join().unwrap();
    }
    stop.stop();
    assert!(within(DEADLINE, move || server.join().unwrap()).is_some(), "meshd did not stop");
    assert!(panics().is_empty(), "a thread panicked: {:?}", panics());
    drop(ids);
}

/// A bound entry's holder word rewritten to name meshd itself, with its fan-in slot held between
/// begin and commit: the stall watcher, which kills such a holder after its delay, must not kill
/// meshd (here: this test process, which would end the test with SIGKILL).
#[test]
fn a_holder_forged_to_name_meshd_is_not_killed() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    catch_panics();
    let dir = tempfile::tempdir().unwrap();
    let (socket, stop, server) = start(dir.path());
    create(&socket, "c", 1);
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let (s, n) = (socket.clone(), "c".to_string());
    let client = within(DEADLINE, move || ServiceClient::connect(&s, &n).unwrap()).expect("attached");
    hold_mid_send(&mb, "c", ClientId(client.id()).slot(), Holder::current());
    // The stall watcher revokes after 20 ms, finds it stuck, and would kill after 100 ms.
    std::thread::sleep(Duration::from_millis(600));
    let row = wait_until(DEADLINE, || service_row(&socket, "c").is_some_and(|r| !r.holds.is_empty()));
    assert!(row, "the stall watcher reports the hold: {:?}", service_row(&socket, "c"));
    assert!(!server.is_finished(), "meshd's server ended");
    assert!(panics().is_empty(), "a thread panicked: {:?}", panics());
    drop(client);
    stop.stop();
    assert!(within(DEADLINE, move || server.join().unwrap()).is_some(), "meshd did not stop");
}

/// A holder word rewritten to name another process (a decoy of the same uid) while the client it
/// belongs to holds the ring mid-send: the stall watcher's kill goes to the process meshd saw
/// attach, never to the one the shared word names.
#[test]
fn a_holder_rewritten_to_name_another_process_does_not_get_it_killed() {
    use std::os::unix::process::ExitStatusExt;
    if std::env::var(ROLE).is_ok() {
        return;
    }
    catch_panics();
    let dir = tempfile::tempdir().unwrap();
    let (socket, stop, server) = start(dir.path());
    create(&socket, "d", 1);
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let (mut client, id) = spawn_child_with(&socket, "d", &[(format!("{ROLE}_IDLE"), "1")]);
    let mut decoy = Command::new("sleep").arg("60").spawn().expect("a decoy process (`sleep`)");
    // The client holds the ring mid-send; its entry's holder word rewritten to name the decoy.
    hold_mid_send(&mb, "d", ClientId(id).slot(), Holder::of_pid(decoy.id()));
    // The stall watcher finds it stuck after 20 ms and kills after 100 ms: the client, by its record.
    let killed = wait_until(DEADLINE, || client.try_wait().unwrap().is_some());
    assert!(killed, "the attached client was not killed");
    assert_eq!(client.wait().unwrap().signal(), Some(9), "killed with SIGKILL");
    assert!(decoy.try_wait().unwrap().is_none(), "the process the rewritten word named was signalled");
    let killed_count = wait_until(DEADLINE, || service_row(&socket, "d").is_some_and(|r| r.events.stall_killed == 1));
    assert!(killed_count, "{:?}", service_row(&socket, "d"));
    assert!(!server.is_finished(), "meshd's server ended");
    assert!(panics().is_empty(), "a thread panicked: {:?}", panics());
    let _ = decoy.kill();
    let _ = decoy.wait();
    stop.stop();
    assert!(within(DEADLINE, move || server.join().unwrap()).is_some(), "meshd did not stop");
}
