//! Chaos without a GPU: a seeded schedule of loads, upgrades, unloads, refused loads, channel and
//! service creates and deletes, messages left queued, native workers spawned and stopped, sticky
//! faults (the process replaced by exec), orderly restarts and `kill -9` of meshd started again by
//! the same command, some while a load is on its way (half of those starts adopting the programs the killed one left running, as
//! MPS mode's under an orphan grace: each in its slot, at its generation, `adopted` in `ps`), while
//! host streams run through the mailbox. After every event the daemon must
//! show exactly what the test asked for, and the mailbox must hold it: every channel's shape and
//! queued messages, no two rings overlapping, the descriptors and arena bytes in use as `info` and
//! the mailbox report them. The model knows the mailbox's limits (32 program slots, 64 channel
//! descriptors, a 4 MiB ring arena placed best fit): a create that fits must succeed, one that does
//! not must be refused naming the limit, and a delete of what a program binds, a host end holds, a
//! client is attached to, or that holds messages (without discard) must be refused naming the
//! holder. At the end every stream message came exactly once, in order and whole, the arena is back
//! to its figures after the streams were made, and no worker, descriptor or thread leaked.
//!
//! meshd is this test binary re-run as a child (`MESHD_CHAOS_CHILD`), wired as `meshd run
//! --keep-shm` wires the daemon (the mailbox claimed or taken over, the state directory's channels
//! restored, the backend thread, the socket) around a stand-in backend: the `meshd` binary itself
//! always opens a CUDA backend, so it cannot run here. A sticky fault replaces the child's process
//! with `meshd::replace::exec_self`, the real exec. The host streams never pass through meshd: what
//! is checked is that no restart, crash, create or delete of another channel disturbs them
//! (exactly-once even across crashes, since both of their ends live in this process).
//!
//! `MESH_CHAOS_SEED` replays a schedule (the seed is printed first); `MESH_CHAOS_EVENTS` sets its
//! length (default 150, a few seconds; 100000 runs for many minutes, in release mode too).

#[path = "../common/mod.rs"]
mod common;

mod backend;
mod daemon;
mod events;
mod model;
mod streams;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backend::Chaotic;
use common::{PTX, load_req, wait_until};
use daemon::{Daemon, Rng, seed};
use events::{Chaos, Kind, Outcome, channel_req, draw, service_req, spawn_req};
use mesh_shm::{Mailbox, MailboxConfig, Placement, Protocol};
use meshd::protocol::Request;
use meshd::server::{Limits, Opened, Server};
use meshd::start::{bind_socket, claim_mailbox, claim_mailbox_for_adoption};
use meshd::state::StateStore;
use model::{Chan, Model, agrees};
use streams::stream;

const CHILD: &str = "MESHD_CHAOS_CHILD";
/// Set on a child started after a `kill -9` that adopts the killed one's programs.
const ADOPT: &str = "MESHD_CHAOS_ADOPT";
/// Generous: a deadline for what takes milliseconds, never a measurement.
const DEADLINE: Duration = Duration::from_secs(20);
/// Another image: an upgrade changes the program's image hash in the state directory.
const PTX_V2: &[u8] = b".version 8.0\n.target sm_90\n// v2\n";

/// Program slots in the chaos mailbox.
const SLOTS: u32 = 32;

fn config() -> MailboxConfig {
    MailboxConfig { size: 4 << 20, slots: SLOTS, channels: 64 }
}

/// The child: `meshd run --keep-shm` on `<dir>/mb` with the stand-in backend, serving `<dir>/sock`
/// and recording in `<dir>/state`; a sticky fault executes this same command again (same pid).
#[test]
fn child_meshd() {
    let Some(dir) = std::env::var_os(CHILD) else { return };
    let dir = PathBuf::from(dir);
    // meshd's log, as the daemon writes it, to stderr: the parent points it at the child's log file.
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).try_init();
    // A start that adopts (as MPS mode's under an orphan grace) what the killed meshd left running;
    // read once and removed, so that the image a sticky fault executes relaunches instead.
    let adopt = std::env::var_os(ADOPT).is_some();
    // SAFETY: the child runs this one test on one thread (`--test-threads=1`), and no other
    // thread of it reads the environment yet.
    unsafe { std::env::remove_var(ADOPT) };
    let claimed = if adopt {
        claim_mailbox_for_adoption(&dir.join("mb"), &config(), false).unwrap()
    } else {
        claim_mailbox(&dir.join("mb"), &config(), false).unwrap()
    };
    let mut store = StateStore::open(&dir.join("state")).unwrap();
    store.restore_channels(&claimed.mailbox).unwrap();
    store.record_channels(&claimed.mailbox).unwrap();
    let server = Server::start(claimed.mailbox.clone(), Limits::default(), Some(store), move |mb| {
        let backend = if adopt { Chaotic::adopting(mb) } else { Chaotic::new(mb) };
        Ok(Opened { backend: Box::new(backend), device: "test double".into(), arch: Some("sm_90".into()) })
    })
    .unwrap();
    let listener = bind_socket(&dir.join("sock")).unwrap();
    let clean = server.run(listener).unwrap();
    assert!(clean, "every program stopped");
    // --keep-shm: the mailbox and the state stay for the next start; the lock and the socket go.
    let _ = std::fs::remove_file(dir.join("sock"));
    claimed.lock.remove();
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// Process `pid` and its start time (clock ticks after boot), while it runs: a long run spawns more
/// workers than there are pids, so a pid alone may name another process by the end.
fn process(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    // `rest` starts at field 3 (state); the start time is field 22.
    let started = rest.split_whitespace().nth(19)?.parse().ok()?;
    (!rest.starts_with('Z')).then_some((pid, started))
}

fn count_entries(dir: String) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
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

/// A host ll or index channel of `msg_size` and `capacity`, as the streams use.
fn host(msg_size: u32, capacity: u32, protocol: Protocol) -> Chan {
    Chan { msg_size, capacity, placement: Placement::Host, protocol, parts: 1 }
}

#[test]
fn chaos_loses_nothing_and_leaks_nothing() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let seed = seed();
    eprintln!("chaos seed: {seed} (replay: MESH_CHAOS_SEED={seed} cargo test -p meshd --test chaos)");
    let events: usize = match std::env::var("MESH_CHAOS_EVENTS") {
        Ok(s) => s.trim().parse().unwrap_or_else(|e| panic!("MESH_CHAOS_EVENTS={s}: not a count of events ({e})")),
        Err(_) => 150,
    };
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path());
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let mut c = Chaos {
        d,
        m: Model::default(),
        mb,
        rng: Rng(seed),
        faults: 0,
        refusals: BTreeMap::new(),
        adoptions: 0,
        loads_cut: [0; 3],
    };

    // Host streams: three sizes and capacities of LL, and one index channel, on channels meshd
    // made (and records).
    let stop = Arc::new(AtomicBool::new(false));
    let mut streams = Vec::new();
    for (i, (size, capacity, protocol)) in
        [(8u32, 16u32, Protocol::Ll), (64, 8, Protocol::Ll), (256, 32, Protocol::Ll), (8, 16, Protocol::Index)]
            .into_iter()
            .enumerate()
    {
        let name = format!("s{i}");
        c.d.ok(&channel_req(&name, host(size, capacity, protocol)), &[]);
        c.m.channels.insert(name.clone(), host(size, capacity, protocol));
        c.m.streams.insert(name.clone());
        streams.push((name.clone(), stream(&c.mb, &name, i as u64, size as usize, &stop)));
    }
    let start_usage = c.mb.arena_usage();

    let mut done: BTreeMap<Kind, (usize, Duration)> = BTreeMap::new();
    let (mut max_gap, mut native_pids, mut fullest) = (Duration::ZERO, BTreeSet::new(), (0, 0));
    let started = Instant::now();
    for i in 0..events {
        let kind = draw(&mut c.rng);
        let t = Instant::now();
        let outcome = c.apply(kind);
        let what = format!("event {i} ({kind:?}, seed {seed})");
        native_pids.extend(agrees(&c.d, &c.mb, &c.m, &what).into_iter().filter_map(process));
        let usage = c.mb.arena_usage();
        fullest = (fullest.0.max(usage.descriptors_in_use), fullest.1.max(usage.in_use));
        if (i + 1).is_multiple_of(10_000) {
            eprintln!("chaos (seed {seed}): {} of {events} events in {:.0?}", i + 1, started.elapsed());
        }
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
    let Chaos { mut d, mut m, mb, refusals, adoptions, loads_cut, .. } = c;
    for name in m.names() {
        d.ok(&Request::Unload { name }, &[]);
    }
    for name in std::mem::take(&mut m.natives) {
        d.ok(&Request::Stop { name }, &[]);
    }
    m.programs.clear();
    m.binds.clear();
    for name in std::mem::take(&mut m.services) {
        d.ok(&Request::ServiceDelete { name: name.clone(), discard: true }, &[]);
        m.drop_channel(&name);
        m.drop_channel(&format!("{name}.replies"));
    }
    let made: Vec<String> = m.plain_channels().into_iter().filter(|n| !m.streams.contains(n)).collect();
    for name in made {
        let r = d.ok(&Request::ChannelDelete { name: name.clone(), discard: true }, &[]);
        assert_eq!(r.discarded.unwrap_or(0), m.queued(&name), "the messages deleting {name} discarded");
        m.drop_channel(&name);
    }
    agrees(&d, &mb, &m, "emptying");
    // Everything made after the streams is gone: the arena is as it was then, its free space in one run.
    assert_eq!(mb.arena_usage(), start_usage, "the arena after deleting every channel but the streams'");
    let pid = d.child.id();
    let cycle = |d: &Daemon, k: usize| {
        let (p, n, ch, sv) = (format!("leak-p{k}"), format!("leak-n{k}"), format!("leak-c{k}"), format!("leak-v{k}"));
        d.ok(&load_req(&p, &["s0"]), PTX);
        d.ok(&Request::Upgrade { name: p.clone(), image_len: PTX_V2.len() }, PTX_V2);
        d.ok(&Request::Unload { name: p }, &[]);
        d.ok(&spawn_req(&n), &[]);
        d.ok(&Request::Stop { name: n }, &[]);
        let placement = if k.is_multiple_of(2) { Placement::Host } else { Placement::Device };
        d.ok(&channel_req(&ch, Chan { placement, ..host(64, 16, Protocol::Ll) }), &[]);
        d.ok(&Request::ChannelDelete { name: ch, discard: false }, &[]);
        d.ok(&service_req(&sv, 2, 16, 16, 4), &[]);
        d.ok(&Request::ServiceDelete { name: sv, discard: false }, &[]);
    };
    cycle(&d, 0);
    let before = settled(pid);
    for k in 1..=20 {
        cycle(&d, k);
    }
    let after = settled(pid);
    assert_eq!(
        after, before,
        "meshd's (descriptors, threads) after 20 load/upgrade/unload/spawn/stop/create/delete cycles"
    );
    assert_eq!(mb.arena_usage(), start_usage, "the arena after 20 channel and service create/delete cycles");

    // Every message accounted for.
    stop.store(true, Ordering::Relaxed);
    eprintln!("chaos (seed {seed}): {events} events in {chaos_took:?}");
    eprintln!("{:<14} {:>6} {:>12}", "event", "count", "longest");
    for (kind, (n, longest)) in &done {
        eprintln!("{:<14} {n:>6} {:>10.1}ms", format!("{kind:?}"), longest.as_secs_f64() * 1e3);
    }
    eprintln!("refusals the model called for:");
    for (why, n) in &refusals {
        eprintln!("  {why}: {n}");
    }
    eprintln!(
        "fullest: {} of {} descriptors, {} of {} arena bytes in use",
        fullest.0,
        start_usage.descriptors_total,
        fullest.1,
        start_usage.in_use + start_usage.free
    );
    eprintln!("max recovery gap (meshd away: kill -9, restart, fault): {:.1} ms", max_gap.as_secs_f64() * 1e3);
    eprintln!("programs adopted after a kill -9: {adoptions}");
    eprintln!(
        "loads met by a kill -9: {} answered, {} run without an answer, {} left nothing",
        loads_cut[0], loads_cut[1], loads_cut[2]
    );
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
    let leftover: Vec<(u32, u64)> = native_pids.into_iter().filter(|&(p, t)| process(p) == Some((p, t))).collect();
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
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let mut m = Model::default();
    d.ok(&spawn_req("kept"), &[]);
    d.ok(&spawn_req("stopped"), &[]);
    d.ok(&Request::Stop { name: "stopped".into() }, &[]);
    d.kill9_and_restart();
    m.natives.insert("kept".into());
    let pids = agrees(&d, &mb, &m, "kill -9 right after a spawn and a stop");
    // And after the restart itself: the recorded worker, started again, is recorded still.
    d.kill9_and_restart();
    agrees(&d, &mb, &m, "kill -9 right after a restart");
    d.shutdown();
    assert!(pids.iter().all(|p| !alive(*p)), "no worker outlives meshd's shutdown");
}

/// An answered delete is recorded at once: a `kill -9` right after it does not bring the channel or
/// the service back from the state directory, and the name made again right after keeps its new
/// shape through the next `kill -9`.
#[test]
fn an_answered_delete_survives_an_immediate_kill_9() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let mut m = Model::default();
    let (small, large) = (host(64, 16, Protocol::Ll), host(256, 64, Protocol::Ll));
    for name in ["a", "b"] {
        d.ok(&channel_req(name, small), &[]);
        m.channels.insert(name.into(), small);
    }
    d.ok(&service_req("v", 2, 16, 16, 4), &[]);
    let rings = events::service_rings(2, 16, 16, 4);
    m.channels.insert("v".into(), rings[0]);
    m.channels.insert("v.replies".into(), rings[1]);
    m.services.insert("v".into());
    agrees(&d, &mb, &m, "the setup");
    d.ok(&Request::ChannelDelete { name: "a".into(), discard: false }, &[]);
    d.ok(&Request::ServiceDelete { name: "v".into(), discard: false }, &[]);
    d.kill9_and_restart();
    for name in ["a", "v", "v.replies"] {
        m.drop_channel(name);
    }
    m.services.clear();
    agrees(&d, &mb, &m, "kill -9 right after a channel delete and a service delete");
    d.ok(&Request::ChannelDelete { name: "b".into(), discard: false }, &[]);
    d.ok(&channel_req("b", large), &[]);
    d.kill9_and_restart();
    m.channels.insert("b".into(), large);
    agrees(&d, &mb, &m, "kill -9 right after a channel made again with another shape");
    d.shutdown();
}

/// A service client outlives two `kill -9`s of meshd: each new meshd finds it still bound (its
/// lease died with the old one), and its detach takes the lease back from the meshd running now and
/// leaves nothing bound, so the service is then deleted without a discard.
#[test]
fn a_service_client_detaches_after_two_kill_9s() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    d.ok(&service_req("v", 2, 16, 16, 4), &[]);
    let client = meshd::ServiceClient::connect(&d.socket(), "v").expect("attached");
    let bound = |d: &Daemon| -> Vec<u32> {
        let info = d.ok(&Request::Info, &[]).info.expect("info");
        let row = info.services.iter().find(|s| s.name == "v").cloned().expect("service v");
        row.clients.iter().map(|c| c.id).collect()
    };
    for k in 1..=2 {
        d.kill9_and_restart();
        assert_eq!(bound(&d), [client.id()], "bound after kill -9 number {k}");
    }
    client.detach().expect("a detach after the restarts takes the lease back");
    assert!(wait_until(Duration::from_secs(10), || bound(&d).is_empty()), "nothing bound: {:?}", bound(&d));
    let r = d.ask(&Request::ServiceDelete { name: "v".into(), discard: false }, &[]);
    assert!(r.ok, "the service, no client attached, is deleted: {:?}", r.error);
    d.shutdown();
}

/// The chaos test's find, kept as a plain case: a service whose two rings each fit a free run of the
/// arena, and fit in the free bytes in all, but not side by side (the fan-in channel takes the one
/// run the group would fit), is refused naming the limit and leaves nothing behind: its fan-in
/// channel, made first, is not kept without its group.
#[test]
fn a_service_whose_rings_do_not_fit_side_by_side_leaves_nothing() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(dir.path());
    let mb = Mailbox::open(dir.path().join("mb")).unwrap();
    let mut m = Model::default();
    let bulk = |msg_size| Chan { protocol: Protocol::Bulk, ..host(msg_size, 2, Protocol::Bulk) };
    // Free runs of 1.5 MiB and 0.5 MiB between live rings, and under 0.5 MiB at the arena's end.
    let made = [("a", bulk(768 << 10)), ("b", host(8, 2, Protocol::Ll)), ("c", bulk(256 << 10))];
    let made = made.into_iter().chain([("d", host(8, 2, Protocol::Ll)), ("e", bulk(768 << 10))]);
    for (name, shape) in made {
        d.ok(&channel_req(name, shape), &[]);
        m.channels.insert(name.into(), shape);
    }
    for name in ["a", "c"] {
        d.ok(&Request::ChannelDelete { name: name.into(), discard: false }, &[]);
        m.drop_channel(name);
    }
    agrees(&d, &mb, &m, "the setup");
    // About 1 MiB each (ll: a tag in every word): 16 requests of 32 KiB; 8 clients, 2 replies each.
    let rings = events::service_rings(8, 32 << 10, 16, 2);
    let room = model::Room::read(&mb, "the setup");
    let each: Vec<u64> = rings.iter().map(|r| r.bytes_at(24576).unwrap()).collect();
    assert!(room.fits(&rings[..1]) && room.fits(&rings[1..]), "each ring ({each:?} bytes) fits a free run: {room:?}");
    assert!(!room.fits(&rings), "but not both: {room:?}");
    let sizes: u64 = rings.iter().map(|r| r.bytes_at(4096).unwrap()).sum();
    assert!(room.free() > sizes + (16 << 10), "the free bytes in all would hold both: {room:?}");
    let r = d.ask(&service_req("v", 8, 32 << 10, 16, 2), &[]);
    let err = r.error.unwrap_or_default();
    assert!(!r.ok && (err.contains("mailbox full") || err.contains("fragmented")), "refused naming the limit: {err}");
    agrees(&d, &mb, &m, "the refused service");
    d.kill9_and_restart();
    agrees(&d, &mb, &m, "kill -9 after the refused service");
    d.shutdown();
}
