//! A service on the GPU: one resident service program and 64 client processes, in blink and MPS mode.
//!
//! meshd makes the service (`meshd service create svc --clients 64 --msg-size 64 --capacity 256
//! --reply-size 64 --reply-capacity 16`: the fan-in channel `svc` and the group `svc.replies`) and loads
//! `tests/programs/service.cu` bound to both (`--bind svc --bind svc.replies`). 64 processes of
//! `mesh-service-client` (`--mode run`, 4 requests in flight each: 256 in all, the fan-in ring's capacity,
//! and never more than a reply ring holds) each check every reply: word 0 the sequence number of the
//! request it answers, word 1 the sent value + 1, words 2-3 the client's own pid and nonce (a reply that
//! reached another client fails), the body as sent. For `MESH_SERVICE_SECS` (default 24) a seeded schedule
//! (`MESH_CHAOS_SEED=N` replays it; the seed is printed first) kills clients with SIGKILL mid-stream (one
//! or two at a time, and one just before each upgrade), lets others detach cleanly (stdin closed: the
//! client receives what it is owed, then `detach`), starts new clients in the freed entries, and upgrades
//! the program twice (`meshd upgrade` with the same image, at a third and two thirds).
//!
//! Checked: every client that was not killed exits 0 having received every reply in order, none lost, none
//! for another client, and none repeated (a repeat would be a reply to a request taken twice: mesh.cuh's
//! fan-in consumer is exact across an orderly stop, so an upgrade repeats nothing; only a crash of the
//! program, not part of this test, may; the client counts repeats, this test allows none); a killed
//! client's entry is taken back (its pid leaves the group's table in the mailbox and `meshd info`'s service
//! row), and a new client attaches in its place; after the last event every surviving client still makes
//! progress; after everyone left, no entry is bound; the program ran throughout (state running, heartbeat
//! rising, 3 launches at least), took no more skips than clients were killed; in MPS mode no client process
//! is an MPS client. The service has 32 fan-in shards and service.cu is loaded with a grid of 4 blocks
//! of 256 (the README's 64-client recipe: 32 warps, a shard each); `MESH_SERVICE_SHARDS=P` creates it
//! with `--shards P`, `MESH_SERVICE_GRID=G` and `MESH_SERVICE_BLOCK=T` load the program with G blocks of T threads, `MESH_SERVICE_PROGRAM=NAME` runs
//! another program of tests/programs (a variant of the loop). The longest wait of any client for a reply is printed with the event before it
//! (measured, not asserted: no assertion on speed). Prints SKIPPED without `MESH_GPU_TESTS=1`.
//!
//! The client side is also CPU-tested by `service_host.rs`, against meshd's control plane
//! with a host thread for the program.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mesh_gpu_tests::chaos::{self, Rng};
use mesh_gpu_tests::harness::{Meshd, mps_membership};
use mesh_gpu_tests::service::{ClientProcess, bound_clients, field, service_shape};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};

const SERVICE: &str = "svc";
const REPLIES: &str = "svc.replies";
const CLIENTS: usize = 64;
const MSG: &str = "64";
const CAPACITY: &str = "256";
const REPLY_CAPACITY: &str = "16";
const INFLIGHT: &str = "4";
/// Events in a run, one per tick (upgrades included).
const TICKS: u32 = 20;
/// A deadline for things that take milliseconds, never a measurement.
const DEADLINE: Duration = Duration::from_secs(30);
/// service.cu's user words.
const W_SENT: usize = 0;
const W_SKIPS: usize = 1;
const W_GONE: usize = 2;
const W_FULL: usize = 3;
const W_DEPARTED: usize = 4;
const W_CORRUPT: usize = 5;
const W_LAUNCHES: usize = 6;

fn secs() -> Duration {
    let s = std::env::var("MESH_SERVICE_SECS")
        .ok()
        .map(|s| s.trim().parse::<u64>().unwrap_or_else(|e| panic!("MESH_SERVICE_SECS={s}: not a whole number ({e})")));
    Duration::from_secs(s.unwrap_or(24))
}

fn unix_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Live,
    Killed,
    Detached,
}

struct Client {
    p: ClientProcess,
    fate: Fate,
    /// Started after the first 64 (in an entry a killed or detached client freed).
    joined: bool,
}

struct Run {
    d: Meshd,
    mb: mesh_shm::Mailbox,
    mode: &'static str,
    dir: tempfile::TempDir,
    clients: Vec<Client>,
    /// (unix ms, what) of every event.
    events: Vec<(u128, String)>,
    /// How long each kill took to leave the group's table (kill to the pid gone).
    taken_back: Vec<Duration>,
    mps_pipe: Option<std::path::PathBuf>,
}

impl Run {
    fn start(mps: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mps_dir = dir.path().join("mps");
        let mut args = vec!["--channels", "64"];
        if mps {
            args.extend(["--isolation", "mps", "--pool", "4", "--mps-dir", mps_dir.to_str().unwrap()]);
        }
        let d = Meshd::start(&args);
        let mb = d.mailbox();
        // MESH_SERVICE_SHARDS=P: the fan-in channel in P shards (a program built before shards refuses it).
        let shards = mesh_gpu_tests::service::service_shards().to_string();
        let out = d.ok(&[
            "service",
            "create",
            SERVICE,
            "--clients",
            &CLIENTS.to_string(),
            "--msg-size",
            MSG,
            "--capacity",
            CAPACITY,
            "--reply-size",
            MSG,
            "--reply-capacity",
            REPLY_CAPACITY,
            "--shards",
            &shards,
        ]);
        eprintln!("service create (MESH_SERVICE_SHARDS {shards}): {}", out.trim());
        let mode = if mps { "mps" } else { "blink" };
        let mps_pipe = mps.then(|| mps_dir.join("pipe"));
        Self { d, mb, mode, dir, clients: Vec::new(), events: Vec::new(), taken_back: Vec::new(), mps_pipe }
    }

    /// The program's PTX: `service` unless `MESH_SERVICE_PROGRAM` names another of tests/programs
    /// (`service_x_serial`, or a variant before it becomes the header's loop).
    fn image() -> String {
        let program = std::env::var("MESH_SERVICE_PROGRAM").unwrap_or_else(|_| "service".into());
        let ptx = programs_dir().join(format!("{program}.ptx"));
        assert!(
            ptx.is_file(),
            "{}: no PTX (the service programs have none committed: the bundle's ./run compiles every program \
             with nvcc; by hand, `cargo xtask ptx` where nvcc exists)",
            ptx.display()
        );
        ptx.display().to_string()
    }

    /// `meshd load`'s grid and block: `MESH_SERVICE_GRID` blocks (else 4) of `MESH_SERVICE_BLOCK`
    /// threads (else 256: 8 warps a block).
    fn block() -> Vec<String> {
        service_shape()
    }

    fn ps_row(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = serde_json::from_str(&self.d.ok(&["ps", "--json"])).unwrap();
        rows.into_iter().find(|r| r["name"] == "svc").unwrap_or_else(|| panic!("svc not in ps:\n{}", self.d.log_text()))
    }

    fn user_words(&self) -> [u32; 32] {
        self.d.user_words(&self.mb, "svc")
    }

    /// Waits until the program runs and its heartbeat moves; panics with its state otherwise.
    fn wait_running(&self, what: &str) {
        let beat = |r: &serde_json::Value| r["heartbeat"].as_u64().unwrap_or(0);
        let first = beat(&self.ps_row());
        let ok = wait_until(DEADLINE, || {
            let r = self.ps_row();
            r["state"] == "running" && beat(&r) > first
        });
        let r = self.ps_row();
        assert!(
            ok,
            "{} {what}: svc is not running with a rising heartbeat: {r} (service.cu exits 1 when binding 0 is not a \
             fan-in channel, binding 1 not its group, or their sizes differ)\nlog:\n{}",
            self.mode,
            self.d.log_text()
        );
    }

    fn event(&mut self, what: String) {
        eprintln!("{} +{:>6} ms  {what}", self.mode, self.events.first().map_or(0, |e| unix_ms() - e.0));
        self.events.push((unix_ms(), what));
    }

    /// Starts a client and waits until it attached.
    fn spawn(&mut self, joined: bool) -> usize {
        let k = self.clients.len();
        let log = self.dir.path().join(format!("client-{k}.log"));
        let args: Vec<String> = ["--mode", "run", "--inflight", INFLIGHT, "--attach-for-ms", "20000"]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
        let p = ClientProcess::spawn(&self.d.socket, SERVICE, &args, log);
        self.clients.push(Client { p, fate: Fate::Live, joined });
        k
    }

    fn wait_ready(&mut self, k: usize) {
        let mode = self.mode;
        if let Err(e) = self.clients[k].p.wait_ready(DEADLINE) {
            panic!("{mode}: client {k}: {e}\nmeshd log:\n{}", self.d.log_text());
        }
    }

    fn live(&self) -> Vec<usize> {
        (0..self.clients.len()).filter(|&k| self.clients[k].fate == Fate::Live).collect()
    }

    fn bound(&self) -> Vec<(u32, u32)> {
        bound_clients(&self.mb, SERVICE).unwrap_or_else(|e| panic!("{}: the group's table: {e}", self.mode))
    }

    /// SIGKILL of client `k`, then waits until its pid has left the group's table.
    fn kill(&mut self, k: usize) {
        let pid = self.clients[k].p.pid();
        let id = self.bound().into_iter().find(|&(_, p)| p == pid).map(|(id, _)| id);
        assert!(
            id.is_some(),
            "{}: client {k} (pid {pid}) is live but not in the group's table: {:?}",
            self.mode,
            self.bound()
        );
        let t = Instant::now();
        self.clients[k].p.kill9();
        self.clients[k].fate = Fate::Killed;
        self.event(format!("kill -9 client {k} (pid {pid}, id {:#x})", id.unwrap_or(0)));
        let gone = wait_until(DEADLINE, || self.bound().iter().all(|&(_, p)| p != pid));
        let took = t.elapsed();
        assert!(
            gone,
            "{}: killed client {k} (pid {pid}) still bound after {took:?}: {:?}\nlog:\n{}",
            self.mode,
            self.bound(),
            self.d.log_text()
        );
        self.taken_back.push(took);
    }

    /// Closes client `k`'s stdin: it receives what it is owed and detaches; checked at the end.
    fn detach(&mut self, k: usize) {
        let pid = self.clients[k].p.pid();
        self.clients[k].p.finish();
        self.clients[k].fate = Fate::Detached;
        self.event(format!("detach client {k} (pid {pid})"));
    }

    fn join(&mut self) {
        let k = self.spawn(true);
        self.wait_ready(k);
        let ready = self.clients[k].p.heard().ready.unwrap_or_default();
        self.event(format!("join client {k} (pid {}): {ready}", self.clients[k].p.pid()));
    }

    fn upgrade(&mut self, n: u32) {
        let t = Instant::now();
        let out = self.d.ok(&["upgrade", "svc", &Self::image()]);
        self.event(format!("upgrade {n} in {:?}: {}", t.elapsed(), out.trim()));
        self.wait_running(&format!("after upgrade {n}"));
    }

    /// `info`'s row for the service.
    fn info_row(&self) -> meshd::protocol::ServiceRow {
        let info: meshd::protocol::Info = serde_json::from_str(&self.d.ok(&["info"])).expect("meshd info's JSON");
        info.services
            .into_iter()
            .find(|s| s.name == SERVICE)
            .unwrap_or_else(|| panic!("{}: no {SERVICE} in info", self.mode))
    }

    /// Replies each live client had reported when last heard.
    fn progress(&self) -> BTreeMap<usize, u64> {
        self.live().into_iter().map(|k| (k, self.clients[k].p.heard().progress.map_or(0, |p| p.0))).collect()
    }
}

fn run(mps: bool) {
    let seed = chaos::seed();
    let mode = if mps { "mps" } else { "blink" };
    eprintln!("service {mode}: seed {seed} (MESH_CHAOS_SEED={seed} replays the schedule)");
    let mut rng = Rng(seed);
    let mut r = Run::start(mps);
    let mps_before = r.mps_pipe.as_deref().map(|p: &Path| mps_membership(p).1);
    let image = Run::image();
    let mut load = vec!["load", "svc", image.as_str(), "--bind", SERVICE, "--bind", REPLIES];
    let block = Run::block();
    load.extend(block.iter().map(String::as_str));
    eprintln!("{}", load.join(" "));
    r.d.ok(&load);
    r.wait_running("after load");

    for _ in 0..CLIENTS {
        r.spawn(false);
    }
    for k in 0..CLIENTS {
        r.wait_ready(k);
    }
    r.event(format!("{CLIENTS} clients attached"));
    assert_eq!(r.bound().len(), CLIENTS, "{mode}: every entry bound: {:?}", r.bound());
    if let (Some(pipe), Some(before)) = (r.mps_pipe.as_deref(), mps_before.as_ref()) {
        let (_, now) = mps_membership(pipe);
        let ours: Vec<u32> = r.clients.iter().map(|c| c.p.pid()).filter(|p| now.contains(p)).collect();
        assert!(ours.is_empty(), "{mode}: client processes {ours:?} are MPS clients: {now:?}");
        eprintln!("mps: MPS clients {} before the clients attached, {} with 64 attached", before.len(), now.len());
    }
    // Everyone moving before the chaos.
    let first = r.progress();
    let moving = wait_until(DEADLINE, || r.progress().iter().all(|(k, n)| *n > first[k]));
    assert!(moving, "{mode}: some clients made no progress at the start: {:?}", r.progress());

    let total = secs();
    let tick = total / TICKS;
    let upgrades = [TICKS / 3, 2 * TICKS / 3];
    let mut kills = 0u32;
    for t in 0..TICKS {
        std::thread::sleep(tick);
        if let Some(n) = upgrades.iter().position(|&u| u == t) {
            // A kill just before: its departure is acknowledged by whichever launch scans first, the
            // relaunch's first scan included; the next tick's join needs that acknowledgement.
            let live = r.live();
            let k = *rng.pick(&live).unwrap();
            r.kill(k);
            kills += 1;
            r.upgrade(u32::try_from(n).unwrap() + 1);
            continue;
        }
        // Refill the entries freed by the last tick's kills and detaches, then one more event.
        while r.live().len() < CLIENTS {
            r.join();
        }
        let live = r.live();
        match rng.below(4) {
            0 | 1 => {
                let k = *rng.pick(&live).unwrap();
                r.kill(k);
                kills += 1;
            }
            2 => {
                let k = *rng.pick(&live).unwrap();
                r.detach(k);
            }
            _ => {
                let a = *rng.pick(&live).unwrap();
                let b = *rng.pick(&live).unwrap();
                r.kill(a);
                kills += 1;
                if b != a {
                    r.kill(b);
                    kills += 1;
                }
            }
        }
    }
    while r.live().len() < CLIENTS {
        r.join();
    }
    r.event("schedule over".into());

    // Every survivor still moves after the last event.
    let last = r.progress();
    let moved = wait_until(Duration::from_secs(60), || r.progress().iter().all(|(k, n)| *n >= last[k] + 10));
    let stuck: Vec<(usize, u64)> = r.progress().into_iter().filter(|(k, n)| *n < last[k] + 10).collect();
    assert!(moved, "{mode}: clients (index, replies) stuck after the schedule: {stuck:?}");

    // The killed clients' entries: gone from the table (checked at each kill), and from info's rows.
    let killed: Vec<u32> = r.clients.iter().filter(|c| c.fate == Fate::Killed).map(|c| c.p.pid()).collect();
    // The detached clients have left by now (they had only their replies in flight to receive).
    let settled = wait_until(DEADLINE, || r.info_row().clients.len() == r.live().len());
    let row = r.info_row();
    let still: Vec<u32> = row.clients.iter().map(|c| c.pid).filter(|p| killed.contains(p)).collect();
    assert!(still.is_empty(), "{mode}: info still lists killed clients {still:?}: {row:?}");
    assert!(settled, "{mode}: info lists {} clients, {} are live: {row:?}", row.clients.len(), r.live().len());
    eprintln!(
        "{mode}: info: {} bound, {} awaiting the program's ack, none of the {} killed",
        row.bound,
        row.awaiting_ack,
        killed.len()
    );

    // Everyone left: finish every live client and check every client's counts.
    for k in r.live() {
        r.clients[k].p.finish();
    }
    r.event("every client told to finish".into());
    let mut rows = Vec::new();
    let mut repeats = 0;
    let (mut worst_gap, mut worst_at, mut worst_k) = (0u64, 0u128, usize::MAX);
    // Every client's longest wait (µs), when it ended (Unix ms) and the client: the three longest are
    // printed with the events before them.
    let mut waits: Vec<(u64, u128, usize)> = Vec::new();
    let mut replies = 0u64;
    for k in 0..r.clients.len() {
        if r.clients[k].fate == Fate::Killed {
            continue;
        }
        let (code, done) = r.clients[k].p.wait_done(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let said = r.clients[k].p.said();
        let done = done.unwrap_or_else(|| panic!("{mode}: client {k} said no `done` line (exit {code:?}): {said}"));
        assert_eq!(code, Some(0), "{mode}: client {k} exited {code:?}: {done}\n{said}");
        let (sent, got) = (field(&done, "sent").unwrap(), field(&done, "replies").unwrap());
        let rep = field(&done, "repeats").unwrap();
        assert_eq!(sent, got, "{mode}: client {k} sent {sent} and received {got} replies: {done}");
        assert!(got > 0, "{mode}: client {k} never received a reply: {done}");
        let gap = field(&done, "max_gap_us").unwrap();
        let gap_at = u128::from(field(&done, "max_gap_at_ms").unwrap());
        if gap > worst_gap {
            (worst_gap, worst_at, worst_k) = (gap, gap_at, k);
        }
        waits.push((gap, gap_at, k));
        repeats += rep;
        replies += got;
        rows.push((k, r.clients[k].fate, r.clients[k].joined, done));
    }
    assert_eq!(
        repeats, 0,
        "{mode}: {repeats} repeated replies without a crash of the program (an orderly upgrade must be exact): {rows:?}"
    );
    let empty = wait_until(DEADLINE, || r.bound().is_empty());
    assert!(empty, "{mode}: entries still bound after every client left: {:?}", r.bound());

    // The program: running, relaunched by the upgrades, no more skips than kills.
    r.wait_running("at the end");
    let w = r.user_words();
    assert!(w[W_LAUNCHES] >= 3, "{mode}: service.cu counted {} launches (load + 2 upgrades)", w[W_LAUNCHES]);
    // A skip is a send cut off: by a kill, or by meshd's stall watcher revoking a client that sat on a
    // reservation for --client-stall-ms (one descheduled that long; it logs each). A client detaches
    // with nothing in flight.
    let revoked = r.d.log_text().matches("service client revoked").count();
    assert!(
        w[W_SKIPS] as usize <= kills as usize + revoked,
        "{mode}: service.cu took {} skips with {kills} clients killed and {revoked} revoked by the stall watcher \
         (and the detached ones sent nothing at detach)",
        w[W_SKIPS]
    );
    assert_eq!(w[W_CORRUPT], 0, "{mode}: service.cu passed over fan-in slots of an unknown kind");
    assert!(
        u64::from(w[W_SENT]) >= replies,
        "{mode}: service.cu sent {} replies, the clients got {replies}",
        w[W_SENT]
    );

    // The table. The event before a moment (Unix ms), for the waits.
    let event_before = |at: u128| {
        r.events
            .iter()
            .rev()
            .find(|e| e.0 <= at)
            .map_or("-".to_string(), |e| format!("{} ms after `{}`", at - e.0, e.1))
    };
    let before = event_before(worst_at);
    let taken = r.taken_back.iter().max().copied().unwrap_or_default();
    let (joined, detached) =
        (r.clients.iter().filter(|c| c.joined).count(), r.clients.iter().filter(|c| c.fate == Fate::Detached).count());
    println!();
    println!("service {mode}, seed {seed}, {:?} of events:", total);
    println!(
        "| clients | killed | detached | joined | replies checked | repeats | program: sent / skips / gone / full / departures / launches |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {kills} | {detached} | {joined} | {replies} | {repeats} | {} / {} / {} / {} / {} / {} |",
        r.clients.len(),
        w[W_SENT],
        w[W_SKIPS],
        w[W_GONE],
        w[W_FULL],
        w[W_DEPARTED],
        w[W_LAUNCHES]
    );
    println!(
        "longest wait for a reply: {:.1} ms (client {worst_k}, {before}); a killed client out of the table within {:.1} ms \
         (slowest of {})",
        worst_gap as f64 / 1e3,
        taken.as_secs_f64() * 1e3,
        r.taken_back.len()
    );
    // What a long wait coincided with (measured, not asserted): the next-longest waits, and what
    // meshd's stall watcher did (a client descheduled inside a send holds every request behind it).
    waits.sort_unstable_by(|a, b| b.cmp(a));
    for &(gap, at, k) in waits.iter().skip(1).take(2) {
        println!("next longest wait: {:.1} ms (client {k}, {})", gap as f64 / 1e3, event_before(at));
    }
    let log = r.d.log_text();
    let stalls: Vec<&str> = log.lines().filter(|l| l.contains("service client") || l.contains("held at seq")).collect();
    println!("meshd's stall watcher acted {} time(s){}", stalls.len(), if stalls.is_empty() { "" } else { ":" });
    for line in stalls.iter().take(8) {
        println!("  {line}");
    }
    r.d.ok(&["shutdown"]);
}

#[test]
fn service_64_clients_killed_joining_detaching_and_upgrades_blink() {
    require_gpu!("service_64_clients_killed_joining_detaching_and_upgrades_blink");
    run(false);
}

#[test]
fn service_64_clients_killed_joining_detaching_and_upgrades_mps() {
    require_gpu!("service_64_clients_killed_joining_detaching_and_upgrades_mps");
    run(true);
}

/// The README's lines for a service, on the GPU: `meshd service create kv`, `service.ptx` loaded bound to
/// both channels, and `meshd service request kv --hex 0000000029000000` printing the reply service.cu
/// writes (word 1 plus one, the rest as sent: 64 bytes in hex); then a text request the same way.
#[test]
fn the_readme_service_lines_answer_from_the_shell() {
    require_gpu!("the_readme_service_lines_answer_from_the_shell");
    let d = Meshd::start(&[]);
    d.ok(&["service", "create", "kv", "--clients", "64", "--msg-size", "64", "--shards", "8"]);
    let ptx = programs_dir().join("service.ptx");
    d.ok(&["load", "kv-server", &ptx.display().to_string(), "--block", "256", "--bind", "kv", "--bind", "kv.replies"]);
    let out = d.ok(&["service", "request", "kv", "--hex", "0000000029000000"]);
    assert_eq!(out, format!("000000002a000000{}\n", "0".repeat(112)), "service.cu's reply to 0x29 in word 1");
    // Text: word 1 is bytes 4-7, so "abcdefgh" comes back as "abcdffgh" ('e' + 1).
    assert_eq!(d.ok(&["service", "request", "kv", "abcdefgh"]), "abcdffgh\n");
    let info: serde_json::Value = serde_json::from_str(&d.ok(&["info"])).unwrap();
    let kv = info["services"].as_array().unwrap().iter().find(|s| s["name"] == "kv").unwrap().clone();
    assert_eq!(kv["bound"], serde_json::json!(0), "each request command detached: {kv}");
    d.ok(&["shutdown"]);
}
