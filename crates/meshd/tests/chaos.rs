//! Chaos without a GPU: a seeded schedule of loads, upgrades, unloads, refused loads, channel creates,
//! native workers spawned and stopped, sticky faults (the process replaced by exec), orderly restarts
//! and `kill -9` of meshd started again by the same command, while host streams run through the
//! mailbox. After every event the daemon must show exactly what the test asked for; at the end every
//! stream message came exactly once, in order and whole, and no worker, descriptor or thread leaked.
//!
//! meshd is this test binary re-run as a child (`MESHD_CHAOS_CHILD`), wired as `meshd run
//! --keep-shm` wires the daemon (the mailbox claimed or taken over, the state directory's channels
//! restored, the backend thread, the socket) around a stand-in backend: the `meshd` binary itself
//! always opens a CUDA backend, so it cannot run here. A sticky fault replaces the child's process
//! with `meshd::replace::exec_self`, the real exec. The host streams never pass through meshd: what
//! is checked is that no restart, crash or change of meshd disturbs them (exactly-once even across
//! crashes, since both of their ends live in this process).
//!
//! `MESH_CHAOS_SEED` replays a schedule (the seed is printed first); `MESH_CHAOS_EVENTS` sets its
//! length (default 150, a few seconds).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{ListBackend, PTX, load_req, wait_until};
use mesh_backend::watch::{Replacement, Verdict};
use mesh_backend::{Backend, IsolationMode, ProgramSpec, ProgramStatus};
use mesh_shm::{Consumer, Mailbox, MailboxConfig, Producer};
use meshd::protocol::{Request, Response, read_response, write_request};
use meshd::server::{Limits, Opened, Server};
use meshd::start::{bind_socket, claim_mailbox};
use meshd::state::StateStore;

const CHILD: &str = "MESHD_CHAOS_CHILD";
/// Generous: a deadline for what takes milliseconds, never a measurement.
const DEADLINE: Duration = Duration::from_secs(20);
/// The image a `fault…` load carries: the stand-in backend faults (stickily) on it once loaded.
const FAULT_PTX: &[u8] = b".version 8.0\n.target sm_90\n// fault\n";
/// Another image: an upgrade changes the program's image hash in the state directory.
const PTX_V2: &[u8] = b".version 8.0\n.target sm_90\n// v2\n";

/// Program slots in the chaos mailbox.
const SLOTS: u32 = 32;

fn config() -> MailboxConfig {
    MailboxConfig { size: 4 << 20, slots: SLOTS, channels: 64 }
}

/// The stand-in backend: [`ListBackend`], plus a sticky fault (a replacement of the process, as the
/// blink backend asks for one) on the next watch after a load of [`FAULT_PTX`], naming that program.
struct Chaotic {
    inner: ListBackend,
    faulting: Option<String>,
    replacement: Option<Replacement>,
}

impl Backend for Chaotic {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
    }
    fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
        let faults = spec.image == FAULT_PTX;
        let name = spec.name.clone();
        let status = self.inner.load(spec)?;
        if faults {
            self.faulting = Some(name);
        }
        Ok(status)
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
        let Some(culprit) = self.faulting.take() else { return Vec::new() };
        let programs: Vec<String> = self.inner.status().into_iter().map(|p| p.name).collect();
        let Some(index) = programs.iter().position(|p| *p == culprit) else { return Vec::new() };
        let linked = programs.iter().map(|p| (p.clone(), Arc::new(PTX.to_vec()))).collect();
        self.replacement = Some(Replacement {
            error: "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered".into(),
            programs,
            verdict: Verdict::Culprit { index, why: "its image was loaded just before the fault".into() },
            noticed: Instant::now(),
            linked,
            arch: "sm_90".into(),
        });
        vec![format!("sticky fault by {culprit}")]
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

/// The child: `meshd run --keep-shm` on `<dir>/mb` with the stand-in backend, serving `<dir>/sock`
/// and recording in `<dir>/state`; a sticky fault executes this same command again (same pid).
#[test]
fn child_meshd() {
    let Some(dir) = std::env::var_os(CHILD) else { return };
    let dir = PathBuf::from(dir);
    // meshd's log, as the daemon writes it, to stderr: the parent points it at the child's log file.
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).try_init();
    let claimed = claim_mailbox(&dir.join("mb"), &config(), false).unwrap();
    let mut store = StateStore::open(&dir.join("state")).unwrap();
    store.restore_channels(&claimed.mailbox).unwrap();
    store.record_channels(&claimed.mailbox).unwrap();
    let server = Server::start(claimed.mailbox.clone(), Limits::default(), Some(store), |mb| {
        Ok(Opened {
            backend: Box::new(Chaotic { inner: ListBackend::new(mb), faulting: None, replacement: None }),
            device: "test double".into(),
            arch: Some("sm_90".into()),
        })
    })
    .unwrap();
    let listener = bind_socket(&dir.join("sock")).unwrap();
    let clean = server.run(listener).unwrap();
    assert!(clean, "every program stopped");
    // --keep-shm: the mailbox and the state stay for the next start; the lock and the socket go.
    let _ = std::fs::remove_file(dir.join("sock"));
    claimed.lock.remove();
}

/// A small generator whose sequence is fixed by its seed for good (splitmix64, Steele et al. 2014):
/// a schedule printed today replays the same in any later build, whatever RNG crates do.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
    fn pick<'a, T>(&mut self, from: &'a [T]) -> Option<&'a T> {
        (!from.is_empty()).then(|| &from[self.below(from.len())])
    }
}

fn seed() -> u64 {
    match std::env::var("MESH_CHAOS_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("MESH_CHAOS_SEED={s}: not a number ({e})"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            Rng(u64::from(t.subsec_nanos()) ^ t.as_secs() ^ (u64::from(std::process::id()) << 32)).next()
        }
    }
}

/// One request, one answer; `None` while nobody answers on `socket` (meshd restarting).
fn try_ask(socket: &Path, req: &Request, image: &[u8]) -> Option<Response> {
    let conn = UnixStream::connect(socket).ok()?;
    conn.set_read_timeout(Some(DEADLINE)).ok()?;
    write_request(&mut conn.try_clone().ok()?, req, image).ok()?;
    read_response(&mut BufReader::new(conn)).ok()
}

/// The child meshd and the command that starts it.
struct Daemon {
    dir: PathBuf,
    child: Child,
}

impl Daemon {
    /// The same command every time (what systemd's `Restart=` would run).
    fn spawn(dir: &Path) -> Child {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_meshd", "--nocapture", "--test-threads=1"])
            .env(CHILD, dir)
            // libtest's report of the child (a failed assertion's text) goes to a log beside the mailbox.
            .stdout(Self::log(dir))
            .stderr(Self::log(dir))
            .spawn()
            .unwrap()
    }

    fn log(dir: &Path) -> std::fs::File {
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("child.log")).unwrap()
    }

    /// The last 80 lines of the child meshd's log (every start appends to it).
    fn log_text(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("child.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(80)..].join("\n")
    }

    fn start(dir: &Path) -> Self {
        let d = Self { dir: dir.to_path_buf(), child: Self::spawn(dir) };
        d.wait_up();
        d
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("sock")
    }

    fn wait_up(&self) {
        assert!(wait_until(DEADLINE, || try_ask(&self.socket(), &Request::Ps, &[]).is_some()), "meshd did not answer");
    }

    fn ask(&self, req: &Request, image: &[u8]) -> Response {
        try_ask(&self.socket(), req, image).unwrap_or_else(|| panic!("meshd did not answer {req:?}"))
    }

    fn ok(&self, req: &Request, image: &[u8]) -> Response {
        let r = self.ask(req, image);
        assert!(r.ok, "{req:?} refused: {:?}", r.error);
        r
    }

    fn kill9_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn(&self.dir);
        self.wait_up();
    }

    fn shutdown(&mut self) {
        self.ok(&Request::Shutdown, &[]);
        let ended = wait_until(DEADLINE, || self.child.try_wait().is_ok_and(|s| s.is_some()));
        assert!(ended, "meshd did not exit after shutdown");
        assert!(self.child.wait().unwrap().success(), "the child meshd failed");
    }

    fn restart(&mut self) {
        self.child = Self::spawn(&self.dir);
        self.wait_up();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Message `seq` of a stream: word 0 the sequence number, every other word a function of it and of
/// the word's place, so that a lost, repeated, reordered or torn message cannot pass.
fn fill(buf: &mut [u8], stream: u64, seq: u64) {
    for (k, w) in buf.chunks_mut(8).enumerate() {
        let v = if k == 0 { seq } else { Rng(seq ^ (stream << 48) ^ ((k as u64) << 32)).next() };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// What one stream's consumer saw.
#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    received: AtomicU64,
    lost: AtomicU64,
    repeated: AtomicU64,
    torn: AtomicU64,
}

/// A host producer and consumer on one channel, in this process, running until `stop` and drained.
fn stream(
    mb: &Mailbox,
    name: &str,
    index: u64,
    size: usize,
    stop: &Arc<AtomicBool>,
) -> (Arc<Tally>, [std::thread::JoinHandle<()>; 2]) {
    let tally = Arc::new(Tally::default());
    let producer = {
        let (mut tx, stop, tally) = (Producer::claim(mb, name).unwrap(), stop.clone(), tally.clone());
        std::thread::spawn(move || {
            let mut msg = vec![0u8; size];
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                fill(&mut msg, index, seq);
                if tx.try_send(&msg).unwrap() {
                    seq += 1;
                    tally.sent.store(seq, Ordering::Release);
                    // A stream, not a flood: the machine is shared, and meshd must get its turn.
                    if seq % 16 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                } else {
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
        })
    };
    let consumer = {
        let (mut rx, stop, tally) = (Consumer::claim(mb, name).unwrap(), stop.clone(), tally.clone());
        std::thread::spawn(move || {
            let (mut msg, mut want) = (vec![0u8; size], vec![0u8; size]);
            let mut next = 0u64;
            loop {
                if rx.try_recv(&mut msg).unwrap() {
                    tally.received.fetch_add(1, Ordering::Relaxed);
                    let seq = u64::from_le_bytes(msg[..8].try_into().unwrap());
                    fill(&mut want, index, seq);
                    if msg != want {
                        tally.torn.fetch_add(1, Ordering::Relaxed);
                    } else if seq < next {
                        tally.repeated.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tally.lost.fetch_add(seq - next, Ordering::Relaxed);
                        next = seq + 1;
                    }
                } else if stop.load(Ordering::Relaxed)
                    && tally.received.load(Ordering::Relaxed) >= tally.sent.load(Ordering::Acquire)
                {
                    return;
                } else {
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
        })
    };
    (tally, [producer, consumer])
}

/// What the test asked meshd to run.
#[derive(Debug, Default)]
struct Model {
    /// Program name → left stopped as a fault's culprit.
    programs: BTreeMap<String, bool>,
    channels: BTreeSet<String>,
    /// Channels of protocol index: host ends only, never bound by a load.
    host_only: BTreeSet<String>,
    natives: BTreeSet<String>,
    next: u32,
}

impl Model {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }
    fn names(&self) -> Vec<String> {
        self.programs.keys().cloned().collect()
    }
}

/// Waits until meshd shows exactly `m`: every program in its state, every native worker running,
/// every channel; `what` names the event for the failure message. Returns the native workers' pids.
fn agrees(d: &Daemon, m: &Model, what: &str) -> Vec<u32> {
    let mut last = String::new();
    let mut pids = Vec::new();
    let same = wait_until(DEADLINE, || {
        let Some(ps) = try_ask(&d.socket(), &Request::Ps, &[]) else { return false };
        let Some(info) = try_ask(&d.socket(), &Request::Info, &[]) else { return false };
        let programs: BTreeMap<String, bool> = ps
            .programs
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let faulted = p.state.starts_with("faulted");
                (p.name, faulted)
            })
            .collect();
        let natives = ps.natives.unwrap_or_default();
        let running: BTreeSet<String> =
            natives.iter().filter(|n| n.state == "running").map(|n| n.name.clone()).collect();
        let channels: BTreeSet<String> =
            info.info.map(|i| i.channels.into_iter().map(|c| c.name).collect()).unwrap_or_default();
        pids = natives.iter().map(|n| n.pid).collect();
        last = format!("programs {programs:?}, natives {natives:?}, channels {channels:?}");
        programs == m.programs && running == m.natives && natives.len() == m.natives.len() && channels == m.channels
    });
    assert!(same, "after {what}: meshd shows {last}\nthe test asked for {m:?}\nmeshd's log:\n{}", d.log_text());
    pids
}

/// A load of `name` whose image is `image` (`image_len` must match the bytes that follow).
fn load_of(name: &str, bind: &[&str], image: &[u8]) -> Request {
    match load_req(name, bind) {
        Request::Load { grid, block, shared_mem, bind, sms, no_readiness, .. } => Request::Load {
            name: name.into(),
            image_len: image.len(),
            grid,
            block,
            shared_mem,
            bind,
            sms,
            no_readiness,
        },
        other => other,
    }
}

fn spawn_req(name: &str) -> Request {
    Request::Spawn {
        name: name.into(),
        bind: Vec::new(),
        // exec: the worker is meshd's direct child, so PDEATHSIG reaches it when meshd is killed.
        // bash: dash (/bin/sh on Debian) cannot redirect to a descriptor above 9, and the ready pipe
        // of a meshd with many descriptors open is one.
        command: vec!["/bin/bash".into(), "-c".into(), "echo ready >&$MESH_READY_FD; exec sleep 1000".into()],
        ready_timeout_ms: 10_000,
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

fn count_entries(dir: String) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Load,
    Upgrade,
    Unload,
    RefusedLoad,
    ChannelCreate,
    Spawn,
    Stop,
    Fault,
    Kill9,
    Restart,
}

/// The schedule's weights: orderly changes most, crashes and faults now and then.
const WEIGHTS: [(Kind, usize); 10] = [
    (Kind::Load, 18),
    (Kind::Upgrade, 14),
    (Kind::Unload, 12),
    (Kind::RefusedLoad, 4),
    (Kind::ChannelCreate, 6),
    (Kind::Spawn, 6),
    (Kind::Stop, 5),
    (Kind::Fault, 2),
    (Kind::Kill9, 5),
    (Kind::Restart, 3),
];

fn draw(rng: &mut Rng) -> Kind {
    let total: usize = WEIGHTS.iter().map(|w| w.1).sum();
    let mut at = rng.below(total);
    for (kind, w) in WEIGHTS {
        if at < w {
            return kind;
        }
        at -= w;
    }
    Kind::Load
}

/// At most this many faults: meshd relaunches after at most 8 replacements of the process within 60 s.
const MAX_FAULTS: usize = 4;

/// What one drawn event did.
enum Outcome {
    /// Nothing to apply it to (no program to upgrade, the faults' bound reached).
    Skipped,
    /// Applied; meshd stayed up.
    Done,
    /// Applied; meshd was away this long (a crash, a restart, a fault's replacement of the process).
    Away(Duration),
}

/// Applies one event.
fn apply(kind: Kind, rng: &mut Rng, d: &mut Daemon, m: &mut Model, faults: &mut usize) -> Outcome {
    let channels: Vec<String> = m.channels.difference(&m.host_only).cloned().collect();
    // A program left stopped holds no slot; a load, or its upgrade, takes one again.
    let full = m.programs.values().filter(|held| !**held).count() >= SLOTS as usize;
    let refused_for_slots = |r: Response, what: &str| {
        let err = r.error.unwrap_or_default();
        assert!(!r.ok && err.contains("slots"), "{what} with every slot taken is refused, naming why: {err}");
    };
    match kind {
        Kind::Load => {
            let name = m.fresh("p");
            let binds: Vec<&str> = (0..rng.below(3)).filter_map(|_| rng.pick(&channels).map(String::as_str)).collect();
            if full {
                refused_for_slots(d.ask(&load_req(&name, &binds), PTX), "a load");
                return Outcome::Done;
            }
            d.ok(&load_req(&name, &binds), PTX);
            m.programs.insert(name, false);
        }
        Kind::Upgrade => {
            let Some(name) = rng.pick(&m.names()).cloned() else { return Outcome::Skipped };
            if full && m.programs[&name] {
                // Left stopped, it runs again only in a slot of its own.
                let r = d.ask(&Request::Upgrade { name: name.clone(), image_len: PTX_V2.len() }, PTX_V2);
                refused_for_slots(r, &format!("the upgrade of {name}, left stopped,"));
                return Outcome::Done;
            }
            let r = d.ok(&Request::Upgrade { name: name.clone(), image_len: PTX_V2.len() }, PTX_V2);
            assert_eq!(r.programs.unwrap_or_default()[0].state, "running", "upgrade of {name}");
            // An upgrade runs a program left stopped again.
            m.programs.insert(name, false);
        }
        Kind::Unload => {
            let Some(name) = rng.pick(&m.names()).cloned() else { return Outcome::Skipped };
            d.ok(&Request::Unload { name: name.clone() }, &[]);
            m.programs.remove(&name);
        }
        Kind::RefusedLoad => {
            let name = m.fresh("bad");
            let host_only: Vec<String> = m.host_only.iter().cloned().collect();
            let (r, why) = if rng.below(2) == 0 {
                let junk = b"no image at all";
                (d.ask(&load_of(&name, &[], junk), junk), "image")
            } else if let Some(h) = rng.pick(&host_only).filter(|_| rng.below(2) == 0) {
                // A program binding an index channel (host ends only) is refused, naming it.
                (d.ask(&load_req(&name, &[h.as_str()]), PTX), h.as_str())
            } else {
                (d.ask(&load_req(&name, &["no-such-channel"]), PTX), "no-such-channel")
            };
            let err = r.error.unwrap_or_default();
            // With every slot taken the backend may name that first: a reason all the same.
            let named = err.contains(why) || (full && err.contains("slots"));
            assert!(!r.ok && named, "a bad load is refused with its reason: {err}");
        }
        Kind::ChannelCreate => {
            let name = m.fresh("c");
            let placement = if rng.below(4) == 0 { "device" } else { "host" };
            let msg_size = 8 << rng.below(6);
            let capacity = 1 << (1 + rng.below(6));
            d.ok(
                &Request::ChannelCreate {
                    name: name.clone(),
                    msg_size,
                    capacity,
                    placement: placement.into(),
                    protocol: String::new(),
                    parts: 1,
                },
                &[],
            );
            // The same name again is refused.
            let again = d.ask(
                &Request::ChannelCreate {
                    name: name.clone(),
                    msg_size,
                    capacity,
                    placement: String::new(),
                    protocol: String::new(),
                    parts: 1,
                },
                &[],
            );
            assert!(!again.ok, "a second channel {name} is refused");
            m.channels.insert(name);
        }
        Kind::Spawn => {
            let name = m.fresh("n");
            d.ok(&spawn_req(&name), &[]);
            m.natives.insert(name);
        }
        Kind::Stop => {
            let natives: Vec<String> = m.natives.iter().cloned().collect();
            let Some(name) = rng.pick(&natives).cloned() else { return Outcome::Skipped };
            d.ok(&Request::Stop { name: name.clone() }, &[]);
            m.natives.remove(&name);
        }
        Kind::Fault => {
            if *faults >= MAX_FAULTS || full {
                return Outcome::Skipped;
            }
            *faults += 1;
            let name = m.fresh("fault");
            let pid = d.child.id();
            let t = Instant::now();
            d.ok(&load_of(&name, &[], FAULT_PTX), FAULT_PTX);
            m.programs.insert(name.clone(), true);
            agrees(d, m, &format!("the sticky fault of {name}"));
            assert_eq!(d.child.id(), pid, "the replacement keeps the pid");
            assert!(d.child.try_wait().unwrap().is_none(), "the replaced meshd still runs");
            return Outcome::Away(t.elapsed());
        }
        Kind::Kill9 => {
            let t = Instant::now();
            d.kill9_and_restart();
            return Outcome::Away(t.elapsed());
        }
        Kind::Restart => {
            let t = Instant::now();
            d.shutdown();
            d.restart();
            return Outcome::Away(t.elapsed());
        }
    }
    Outcome::Done
}

/// Descriptors and threads of the meshd process, once they stop changing.
fn settled(pid: u32) -> (usize, usize) {
    let now = || (count_entries(format!("/proc/{pid}/fd")), count_entries(format!("/proc/{pid}/task")));
    let mut last = now();
    let mut stable = 0;
    wait_until(DEADLINE, || {
        let n = now();
        stable = if n == last { stable + 1 } else { 0 };
        last = n;
        stable >= 20
    });
    last
}

#[test]
fn chaos_loses_nothing_and_leaks_nothing() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let seed = seed();
    eprintln!("chaos seed: {seed} (replay: MESH_CHAOS_SEED={seed} cargo test -p meshd --test chaos)");
    let events: usize = std::env::var("MESH_CHAOS_EVENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let mut m = Model::default();

    // Host streams: three sizes and capacities of LL, and one index channel, on channels meshd
    // made (and records).
    let stop = Arc::new(AtomicBool::new(false));
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let mut streams = Vec::new();
    for (i, (size, capacity, protocol)) in
        [(8u32, 16u32, ""), (64, 8, ""), (256, 32, ""), (8, 16, "index")].into_iter().enumerate()
    {
        let name = format!("s{i}");
        d.ok(
            &Request::ChannelCreate {
                name: name.clone(),
                msg_size: size,
                capacity,
                placement: String::new(),
                protocol: protocol.into(),
                parts: 1,
            },
            &[],
        );
        m.channels.insert(name.clone());
        if protocol == "index" {
            m.host_only.insert(name.clone());
        }
        streams.push((name.clone(), stream(&mb, &name, i as u64, size as usize, &stop)));
    }

    let mut done: BTreeMap<Kind, (usize, Duration)> = BTreeMap::new();
    let (mut faults, mut max_gap, mut native_pids) = (0, Duration::ZERO, BTreeSet::new());
    let started = Instant::now();
    for i in 0..events {
        let kind = draw(&mut rng);
        let t = Instant::now();
        let outcome = apply(kind, &mut rng, &mut d, &mut m, &mut faults);
        let what = format!("event {i} ({kind:?}, seed {seed})");
        native_pids.extend(agrees(&d, &m, &what));
        match outcome {
            Outcome::Skipped => continue,
            Outcome::Away(gap) => max_gap = max_gap.max(gap),
            Outcome::Done => {}
        }
        let e = done.entry(kind).or_default();
        e.0 += 1;
        e.1 = e.1.max(t.elapsed());
    }
    let chaos_took = started.elapsed();

    // Leaks, in the meshd process that is running now: empty it, count, cycle, count again.
    for name in m.names() {
        d.ok(&Request::Unload { name }, &[]);
    }
    for name in std::mem::take(&mut m.natives) {
        d.ok(&Request::Stop { name }, &[]);
    }
    m.programs.clear();
    agrees(&d, &m, "emptying");
    let pid = d.child.id();
    let cycle = |d: &Daemon, k: usize| {
        let (p, n) = (format!("leak-p{k}"), format!("leak-n{k}"));
        d.ok(&load_req(&p, &["s0"]), PTX);
        d.ok(&Request::Upgrade { name: p.clone(), image_len: PTX_V2.len() }, PTX_V2);
        d.ok(&Request::Unload { name: p }, &[]);
        d.ok(&spawn_req(&n), &[]);
        d.ok(&Request::Stop { name: n }, &[]);
    };
    cycle(&d, 0);
    let before = settled(pid);
    for k in 1..=20 {
        cycle(&d, k);
    }
    let after = settled(pid);
    assert_eq!(after, before, "meshd's (descriptors, threads) after 20 load/upgrade/unload/spawn/stop cycles");

    // Every message accounted for.
    stop.store(true, Ordering::Relaxed);
    eprintln!("chaos (seed {seed}): {events} events in {chaos_took:?}");
    eprintln!("{:<14} {:>6} {:>12}", "event", "count", "longest");
    for (kind, (n, longest)) in &done {
        eprintln!("{:<14} {n:>6} {:>10.1}ms", format!("{kind:?}"), longest.as_secs_f64() * 1e3);
    }
    eprintln!("max recovery gap (meshd away: kill -9, restart, fault): {:.1} ms", max_gap.as_secs_f64() * 1e3);
    eprintln!("{:<8} {:>10} {:>10} {:>6} {:>8} {:>5}", "stream", "sent", "received", "lost", "repeated", "torn");
    for (name, (tally, threads)) in streams {
        for t in threads {
            t.join().unwrap_or_else(|_| panic!("stream {name} failed"));
        }
        let get = |a: &AtomicU64| a.load(Ordering::Acquire);
        let (sent, received) = (get(&tally.sent), get(&tally.received));
        let (lost, repeated, torn) = (get(&tally.lost), get(&tally.repeated), get(&tally.torn));
        eprintln!("{name:<8} {sent:>10} {received:>10} {lost:>6} {repeated:>8} {torn:>5}");
        assert!(sent > 0, "stream {name} ran");
        assert_eq!((received, lost, repeated, torn), (sent, 0, 0, 0), "stream {name}: exactly once, in order, whole");
    }

    d.shutdown();
    let leftover: Vec<u32> = native_pids.into_iter().filter(|p| alive(*p)).collect();
    assert!(leftover.is_empty(), "native workers left running after meshd's shutdown: {leftover:?}");
    assert!(!alive(pid), "meshd exited");
}

/// The chaos test's first find, kept as a plain case: a `spawn` or `stop` that was answered is in the
/// desired state at once, so a `kill -9` right after the answer neither forgets the worker nor starts
/// a stopped one again (the state used to be written only at the next publish, up to 250 ms later).
#[test]
fn an_answered_spawn_or_stop_survives_an_immediate_kill_9() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let mut m = Model::default();
    d.ok(&spawn_req("kept"), &[]);
    d.ok(&spawn_req("stopped"), &[]);
    d.ok(&Request::Stop { name: "stopped".into() }, &[]);
    d.kill9_and_restart();
    m.natives.insert("kept".into());
    let pids = agrees(&d, &m, "kill -9 right after a spawn and a stop");
    // And after the restart itself: the recorded worker, started again, is recorded still.
    d.kill9_and_restart();
    agrees(&d, &m, "kill -9 right after a restart");
    d.shutdown();
    assert!(pids.iter().all(|p| !alive(*p)), "no worker outlives meshd's shutdown");
}
