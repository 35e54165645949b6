//! MPS programs outliving meshd (`--orphan-grace-ms`): after a kill -9 of meshd each program's kernel
//! runs on in its worker; with no meshd back within the grace, each is stopped in order (its stop,
//! once) and nothing is left (no worker, no MPS daemon or server); a meshd started again within the
//! grace adopts the programs (same workers, same generations, kernels never stopped), and upgrades,
//! unloads and shuts them down as its own, a device channel's ring kept with every message in it; a meshd started again without a grace retires the
//! orphans, and waits for their exit, before it relaunches the programs, so that two generations of
//! a program never run at once; an orderly shutdown still ends everything; `meshd handoff` under the
//! grace, to the same build or to another (`meshd-next`, built beside meshd in the bundle), hands
//! every program to the new image, which adopts it without a stop; after a GPU fault moved the
//! programs to the standby server, a restart adopts them on the standby's daemon and makes the new
//! standby in the other. Each test prints what it measured.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mesh_gpu_tests::chaos;
use mesh_gpu_tests::harness::{Meshd, kill_mps_processes, mps_processes};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};
use mesh_mps_worker::orphan::process_alive;
use mesh_shm::Mailbox;
use mesh_shm::layout::STATE_STOPPED;

const UP: Duration = Duration::from_secs(30);

/// (name, slot, worker pid) of every running program.
fn programs(d: &Meshd) -> Vec<(String, u32, u32)> {
    let rows: Vec<serde_json::Value> = serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap();
    rows.iter()
        .filter(|r| r["state"] == "running")
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                u32::try_from(r["slot"].as_u64().unwrap()).unwrap(),
                u32::try_from(
                    r["worker_pid"].as_u64().unwrap_or_else(|| panic!("a running MPS program has a worker: {r}")),
                )
                .unwrap(),
            )
        })
        .collect()
}

/// `meshd run`'s options of these tests: MPS mode on directory `mps`, a pool of `pool`, no standby,
/// and `--orphan-grace-ms` when given.
fn mps_args<'a>(mps: &'a Path, pool: &'a str, grace_ms: Option<&'a str>) -> Vec<&'a str> {
    let mut args = vec!["--isolation", "mps", "--pool", pool, "--standby", "0", "--mps-dir", mps.to_str().unwrap()];
    if let Some(g) = grace_ms {
        args.extend(["--orphan-grace-ms", g]);
    }
    args
}

/// Starts meshd in MPS mode with `grace_ms` on MPS directory `mps`, and programs `a` and `b` of the
/// images `a` and `b` beating; returns it, the mailbox (mapped here) and the programs. The pool of 3
/// keeps one worker idle for an upgrade: after an adoption the two adopted workers are the pool's
/// in use, and the third is made while the new meshd serves.
fn two_programs(mps: &Path, grace_ms: &str, images: [&str; 2]) -> (Meshd, Mailbox, Vec<(String, u32, u32)>) {
    let d = Meshd::start(&mps_args(mps, "3", Some(grace_ms)));
    for (name, image) in ["a", "b"].into_iter().zip(images) {
        let image = programs_dir().join(format!("{image}.ptx"));
        d.ok(&["load", name, image.to_str().unwrap()]);
    }
    assert!(wait_until(UP, || programs(&d).len() == 2), "both programs run: {}", d.ok(&["ps"]));
    let mb = d.mailbox();
    let progs = programs(&d);
    let beating = wait_until(UP, || progs.iter().all(|(_, slot, _)| mb.slot(*slot).unwrap().status().heartbeat > 0));
    assert!(beating, "both beat");
    (d, mb, progs)
}

/// meshd's `log` says each of `progs` (name, slot, worker pid) was adopted: that worker, in that slot.
fn assert_each_adopted(log: &str, progs: &[(String, u32, u32)]) {
    for (name, slot, pid) in progs {
        assert!(
            log.contains(&format!("adopted from the previous meshd: worker {pid}, slot {slot}")),
            "{name} adopted:\n{log}"
        );
    }
}

/// A test's own MPS directory: every process left on it is killed when the test ends, passed or
/// failed (orphans outlive meshd by design, and one left running a kernel would time-slice with
/// the next test's), then the directory is removed.
struct TestMps {
    path: PathBuf,
    _tmp: tempfile::TempDir,
}

impl TestMps {
    fn new() -> Self {
        let tmp = tempfile::tempdir_in("/tmp").unwrap();
        Self { path: tmp.path().join("mps"), _tmp: tmp }
    }
}

impl Drop for TestMps {
    fn drop(&mut self) {
        kill_mps_processes(&self.path);
    }
}

/// An orderly `meshd shutdown`: it ends every process of MPS directory `mps` within 10 s.
fn shutdown_leaves_nothing(mut d: Meshd, mps: &Path) {
    d.ok(&["shutdown"]);
    let _ = d.child.wait();
    assert!(wait_until(Duration::from_secs(10), || mps_processes(mps).is_empty()), "{:?}", mps_processes(mps));
}

fn heartbeat(mb: &Mailbox, slot: u32) -> u64 {
    mb.slot(slot).unwrap().status().heartbeat
}

/// How long the heartbeats of `slots` kept rising, sampled every millisecond for up to `within`.
fn kept_beating(mb: &Mailbox, slots: &[u32], within: Duration) -> Duration {
    let started = Instant::now();
    let mut last: Vec<u64> = slots.iter().map(|&s| heartbeat(mb, s)).collect();
    let mut last_rise = started;
    while started.elapsed() < within {
        std::thread::sleep(Duration::from_millis(1));
        let now: Vec<u64> = slots.iter().map(|&s| heartbeat(mb, s)).collect();
        if now.iter().zip(&last).all(|(n, l)| n > l) {
            last_rise = Instant::now();
        }
        last = now;
    }
    last_rise - started
}

#[test]
fn orphans_run_on_through_the_grace_then_stop_once_and_leave_nothing() {
    require_gpu!("orphans_run_on_through_the_grace_then_stop_once_and_leave_nothing");
    let dir = TestMps::new();
    let mps = dir.path.clone();
    // The GPU's memory in use before meshd starts: where the orphan limit must bring it back.
    let memory_before = chaos::gpu_memory_mib();
    let (mut d, mb, progs) = two_programs(&mps, "3000", ["heartbeat", "heartbeat"]);
    let slots: Vec<u32> = progs.iter().map(|p| p.1).collect();
    let workers: Vec<u32> = progs.iter().map(|p| p.2).collect();
    let killed = Instant::now();
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    // The kernels run on while meshd is gone: every heartbeat rises for the first second.
    let ran = kept_beating(&mb, &slots, Duration::from_secs(1));
    assert!(ran >= Duration::from_millis(900), "the programs stopped with meshd: they beat for {ran:?} after the kill");
    let sockets = std::fs::read_dir(mps.join("orphans")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(sockets, 2, "each orphan waits at its rendezvous");
    // grace 3 s + 5 s: no worker, no MPS daemon or server; each program stopped in order.
    let gone = wait_until(Duration::from_secs(8), || mps_processes(&mps).is_empty());
    let all_gone = killed.elapsed();
    assert!(gone, "left behind {:?} after {all_gone:?}", mps_processes(&mps));
    for (&slot, &pid) in slots.iter().zip(&workers) {
        let st = mb.slot(slot).unwrap().status();
        assert_eq!(st.state, STATE_STOPPED, "slot {slot}: the program stopped in order, not failed: {st:?}");
        // A zombie counts as gone: a detached worker's parent is init, which may be slow to reap.
        assert!(!process_alive(pid), "worker {pid} is gone");
    }
    let h: Vec<u64> = slots.iter().map(|&s| heartbeat(&mb, s)).collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(h, slots.iter().map(|&s| heartbeat(&mb, s)).collect::<Vec<_>>(), "nothing beats any more");
    // Every byte of GPU memory back within the grace + 5 s of the kill (nvidia-smi's figure).
    let memory = memory_before
        .and_then(|before| chaos::memory_settled(before, Duration::from_secs(8).saturating_sub(killed.elapsed())));
    let memory_back = killed.elapsed();
    if let (Some(before), Some(now)) = (memory_before, memory) {
        assert!(
            !chaos::memory_leaked(before, now),
            "GPU memory in use {now} MiB {memory_back:?} after the kill, {before} MiB before meshd started"
        );
    }
    eprintln!(
        "orphan grace 3000 ms: the programs beat on for {ran:?} of the first second after the kill; every worker, \
         the MPS server and the daemon gone {all_gone:?} after the kill; GPU memory in use {memory:?} MiB \
         {memory_back:?} after it ({memory_before:?} before meshd started)"
    );
}

/// Program `name`'s largest gap between two iterations so far, by its own `%globaltimer`, ms.
fn largest_gap_ms(mb: &Mailbox, slot: u32) -> f64 {
    f64::from(mb.slot(slot).unwrap().user_words()[0]) / 1e6
}

#[test]
fn a_restart_within_the_grace_adopts_the_programs_which_never_stop() {
    require_gpu!("a_restart_within_the_grace_adopts_the_programs_which_never_stop");
    let dir = TestMps::new();
    let mps = dir.path.clone();
    let (mut d, mb, progs) = two_programs(&mps, "30000", ["heartbeat", "heartbeat"]);
    let slots: Vec<u32> = progs.iter().map(|p| p.1).collect();
    // A second of running first: the gaps a program sees without any kill.
    std::thread::sleep(Duration::from_secs(1));
    let gaps_before: Vec<f64> = slots.iter().map(|&s| largest_gap_ms(&mb, s)).collect();
    let generations: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    let memory_before = mesh_gpu_tests::chaos::gpu_memory_mib();
    let restarted = Instant::now();
    // Sampled while meshd is killed and started again: the heartbeats never stop rising.
    let watcher = {
        let mb = d.mailbox();
        let slots = slots.clone();
        std::thread::spawn(move || kept_beating(&mb, &slots, Duration::from_secs(4)))
    };
    d.kill9_and_restart();
    let up = restarted.elapsed();
    let beat_for = watcher.join().unwrap();
    let log = d.log_text();
    assert_each_adopted(&log, &progs);
    assert!(beat_for >= Duration::from_millis(3900), "the heartbeats stopped {beat_for:?} into the restart:\n{log}");
    let now = programs(&d);
    assert_eq!(now, progs, "the same programs, in the same slots and workers");
    let after: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    assert_eq!(after, generations, "no new generation: nothing was launched again");
    let gaps_after: Vec<f64> = slots.iter().map(|&s| largest_gap_ms(&mb, s)).collect();
    // The killed meshd's own context is gone with it (no child holds its descriptors): the GPU's
    // memory in use is what it was, the new meshd's context in place of the old one.
    std::thread::sleep(Duration::from_secs(1));
    let memory_after = mesh_gpu_tests::chaos::gpu_memory_mib();
    eprintln!(
        "adoption: meshd answered {up:?} after the kill; the heartbeats rose throughout ({beat_for:?} of 4 s); \
         largest gap by the programs' own timers before the kill {gaps_before:?} ms, after the restart {gaps_after:?} ms; \
         GPU memory in use {memory_before:?} MiB before the kill, {memory_after:?} MiB after the adoption"
    );
    if let (Some(before), Some(after)) = (memory_before, memory_after) {
        assert!(
            !mesh_gpu_tests::chaos::memory_leaked(before, after),
            "the killed meshd's context still holds GPU memory: {before} MiB before, {after} MiB after"
        );
    }
    // The adopted workers are this meshd's now: an upgrade moves `a` to a fresh worker (the pool's
    // third, being made since the start, waited for), an unload stops `b` in order, and a shutdown
    // ends everything.
    let image = programs_dir().join("heartbeat.ptx");
    d.ok(&["upgrade", "a", image.to_str().unwrap()]);
    let log = d.log_text();
    let pool_line = log.lines().find(|l| l.contains("MPS pool of 3:")).unwrap_or_default();
    assert!(pool_line.contains("the 2 adopted program(s) hold workers of it, and 1 idle"), "{log}");
    assert!(
        wait_until(UP, || programs(&d).iter().any(|p| p.0 == "a" && p.2 != progs[0].2)),
        "a upgraded into a new worker: {}",
        d.ok(&["ps"])
    );
    assert!(
        wait_until(UP, || d.log_text().contains("MPS pool of 3 worker(s) ready in")),
        "the pool is full again (the old worker of a given back):\n{}",
        d.log_text()
    );
    d.ok(&["unload", "b"]);
    assert_eq!(mb.slot(progs[1].1).unwrap().status().state, STATE_STOPPED, "b stopped in order");
    shutdown_leaves_nothing(d, &mps);
    for (_, _, pid) in &progs {
        assert!(!process_alive(*pid), "adopted worker {pid} is gone after the shutdown");
    }
}

#[test]
fn a_restart_without_a_grace_retires_the_orphans_before_it_relaunches_and_shutdown_ends_all() {
    require_gpu!("a_restart_without_a_grace_retires_the_orphans_before_it_relaunches_and_shutdown_ends_all");
    let dir = TestMps::new();
    let mps = dir.path.clone();
    // `b` ignores its stop: the takeover's stop request does not end it, so the new meshd must
    // retire its orphan (which has the server cut it off) before `b` runs again.
    let (mut d, mb, progs) = two_programs(&mps, "30000", ["heartbeat", "ignore_stop"]);
    let old_workers: Vec<u32> = progs.iter().map(|p| p.2).collect();
    let generations: Vec<u32> = progs.iter().map(|p| mb.slot(p.1).unwrap().generation()).collect();
    let restarted = Instant::now();
    // The operator turned the grace off: nothing is adopted, everything relaunched.
    d.kill9_and_restart_with(&mps_args(&mps, "2", Some("0")));
    let up = restarted.elapsed();
    let log = d.log_text();
    let stubborn = old_workers[1];
    assert!(log.contains(&format!("retired the previous meshd's worker {stubborn}")), "{stubborn} retired:\n{log}");
    for pid in &old_workers {
        assert!(!process_alive(*pid), "old worker {pid} is gone");
    }
    // Retired before anything was relaunched.
    let retired_at = log.find(&format!("retired the previous meshd's worker {stubborn}")).unwrap();
    assert!(log[retired_at..].contains("relaunched"), "the programs are relaunched after the retirement:\n{log}");
    assert!(wait_until(UP, || programs(&d).len() == 2), "both relaunched: {}", d.ok(&["ps"]));
    let now = programs(&d);
    for ((name, old_slot, _), old_gen) in progs.iter().zip(generations) {
        let (_, slot, pid) = now.iter().find(|p| &p.0 == name).unwrap_or_else(|| panic!("{name} relaunched"));
        assert!(!old_workers.contains(pid), "{name} runs in a new worker");
        let generation = mb.slot(*slot).unwrap().generation();
        if slot == old_slot {
            assert_ne!(generation, old_gen, "{name}: a new generation in its slot");
        }
    }
    let beats: Vec<u64> = now.iter().map(|p| heartbeat(&mb, p.1)).collect();
    assert!(wait_until(UP, || now.iter().zip(&beats).all(|(p, b)| heartbeat(&mb, p.1) > *b)), "both beat again");
    let gap_ms = f64::from(mb.slot(now.iter().find(|p| p.0 == "a").unwrap().1).unwrap().user_words()[0]) / 1e6;
    eprintln!(
        "restart without a grace: meshd answered {up:?} after the kill; the stubborn orphan was retired (cut off) \
         before the relaunch; program a's largest gap by its own timer {gap_ms:.1} ms"
    );
    shutdown_leaves_nothing(d, &mps);
    assert!(!mps.join("keeper.pid").exists(), "the keeper was released");
}

/// A source and a sink in two workers over a device channel, meshd killed and started again within
/// the grace: both adopted, the ring held by the new meshd from the adopted workers (messages and
/// all), the stream exactly once throughout (every message sequence-checked and checksummed by the
/// sink), and an upgrade afterwards maps the same ring in a fresh worker.
#[test]
fn a_restart_within_the_grace_keeps_a_device_channels_ring_and_every_message() {
    require_gpu!("a_restart_within_the_grace_keeps_a_device_channels_ring_and_every_message");
    use mesh_gpu_tests::stress::{self, user};
    let dir = TestMps::new();
    let mps = dir.path.clone();
    let mut d = Meshd::start(&mps_args(&mps, "3", Some("30000")));
    d.ok(&["channel", "create", "data", "--msg-size", "256", "--capacity", "16", "--placement", "device"]);
    for knob in ["sink-knob", "source-knob"] {
        d.ok(&["channel", "create", knob, "--msg-size", "8", "--capacity", "2"]);
        mesh_shm::Producer::claim(&d.mailbox(), knob)
            .unwrap()
            .send(&stress::knobs(0, 64, false), Duration::from_secs(1))
            .unwrap();
    }
    let ptx = |name: &str| programs_dir().join(format!("{name}.ptx")).display().to_string();
    d.ok(&["load", "sink", &ptx("sink"), "--block", "32", "--bind", "data", "--bind", "sink-knob"]);
    d.ok(&["load", "source", &ptx("source"), "--block", "32", "--bind", "data", "--bind", "source-knob"]);
    let mb = d.mailbox();
    let sink_slot = programs(&d).iter().find(|p| p.0 == "sink").unwrap().1;
    let count = || user::count(&mb.slot(sink_slot).unwrap().user_words());
    assert!(wait_until(UP, || count() > 10_000), "traffic before the kill: {}", count());
    let before = programs(&d);
    d.kill9_and_restart();
    let log = d.log_text();
    assert_each_adopted(&log, &before);
    assert!(log.contains("device ring held from the adopted worker"), "the ring is held:\n{log}");
    let at_restart = count();
    assert!(wait_until(UP, || count() > at_restart + 10_000), "traffic after the restart: {}", count());
    d.ok(&["upgrade", "source", &ptx("source")]);
    let upgraded = count();
    assert!(wait_until(UP, || count() > upgraded + 10_000), "traffic after the upgrade: {}", count());
    let w = mb.slot(sink_slot).unwrap().user_words();
    assert_eq!((w[user::ERRORS], w[user::FIRST_BAD]), (0, 0), "lost, repeated, reordered or torn messages");
    let info: serde_json::Value = serde_json::from_str(&d.ok(&["info"])).unwrap();
    let data = info["channels"].as_array().unwrap().iter().find(|c| c["name"] == "data").cloned().unwrap();
    assert_eq!(data["lost"], 0, "nothing lost: {data}");
    eprintln!("adoption with a device channel: {} messages checked, exactly once across the restart", user::count(&w));
    shutdown_leaves_nothing(d, &mps);
}

#[test]
fn a_handoff_under_the_grace_hands_every_program_to_the_new_image_which_never_stops_them() {
    require_gpu!("a_handoff_under_the_grace_hands_every_program_to_the_new_image_which_never_stops_them");
    let dir = TestMps::new();
    let mps = dir.path.clone();
    let (d, mb, progs) = two_programs(&mps, "30000", ["heartbeat", "heartbeat"]);
    let slots: Vec<u32> = progs.iter().map(|p| p.1).collect();
    std::thread::sleep(Duration::from_secs(1));
    let gaps_before: Vec<f64> = slots.iter().map(|&s| largest_gap_ms(&mb, s)).collect();
    let generations: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    let pid = d.child.id();
    let watcher = {
        let mb = d.mailbox();
        let slots = slots.clone();
        std::thread::spawn(move || kept_beating(&mb, &slots, Duration::from_secs(4)))
    };
    // `systemctl reload`'s command: the same build, from the file meshd was started from.
    let started = Instant::now();
    let out = d.cli(&["handoff"]);
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let beat_for = watcher.join().unwrap();
    let log = d.log_text();
    assert!(out.status.success(), "handoff: {}\n{said}\n{log}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("2 program(s) run on for it to adopt") && said.contains("answers"), "{said}");
    assert!(process_alive(pid) && d.child.id() == pid, "the same process, a new image");
    assert_each_adopted(&log, &progs);
    assert!(beat_for >= Duration::from_millis(3900), "the heartbeats stopped {beat_for:?} into the handoff:\n{log}");
    assert_eq!(programs(&d), progs, "the same programs, in the same slots and workers");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap();
    assert!(rows.iter().all(|r| r["adopted"] == true), "ps says each was adopted: {rows:?}");
    let after: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    assert_eq!(after, generations, "no new generation: nothing was launched again");
    let gaps_after: Vec<f64> = slots.iter().map(|&s| largest_gap_ms(&mb, s)).collect();
    eprintln!(
        "handoff: `meshd handoff` returned after {took:?} (the new image answering); the heartbeats rose throughout \
         ({beat_for:?} of 4 s); largest gap by the programs' own timers before {gaps_before:?} ms, after \
         {gaps_after:?} ms\n{said}"
    );
    shutdown_leaves_nothing(d, &mps);
}

#[test]
fn a_handoff_to_another_build_keeps_every_program_and_the_new_build_answers() {
    require_gpu!("a_handoff_to_another_build_keeps_every_program_and_the_new_build_answers");
    let next = mesh_gpu_tests::harness::meshd_bin().with_file_name("meshd-next");
    if !next.is_file() {
        eprintln!(
            "SKIPPED a_handoff_to_another_build_keeps_every_program_and_the_new_build_answers: no {} (the bundle of \
             `cargo xtask gpu-test --bundle DIR` carries that second build)",
            next.display()
        );
        return;
    }
    let dir = TestMps::new();
    let mps = dir.path.clone();
    let (d, mb, progs) = two_programs(&mps, "30000", ["heartbeat", "heartbeat"]);
    let slots: Vec<u32> = progs.iter().map(|p| p.1).collect();
    let generations: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    let out = d.cli(&["handoff", "--binary", next.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "handoff: {}\n{said}\n{}", String::from_utf8_lossy(&out.stderr), d.log_text());
    assert!(said.contains("2 program(s) run on for it to adopt"), "{said}");
    let answered = said.lines().last().unwrap_or_default();
    assert!(answered.contains("+next (state") && answered.contains("answers"), "the new build answers: {said}");
    assert_eq!(programs(&d), progs, "the same programs, in the same slots and workers");
    let after: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    assert_eq!(after, generations, "no new generation: nothing was launched again");
    let beats: Vec<u64> = slots.iter().map(|&s| heartbeat(&mb, s)).collect();
    assert!(
        wait_until(UP, || slots.iter().zip(&beats).all(|(&s, &b)| heartbeat(&mb, s) > b)),
        "both beat on under the new build"
    );
    eprintln!("handoff to another build:\n{said}");
    shutdown_leaves_nothing(d, &mps);
}

/// `ps --json`'s row of `name`, if it is there.
fn row_of(d: &Meshd, name: &str) -> Option<serde_json::Value> {
    let rows: Vec<serde_json::Value> = serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap();
    rows.into_iter().find(|r| r["name"] == name)
}

/// Loads `fault` (a program that faults at once) and waits until it is left faulted and `a` and
/// `b` run again in workers other than `before`'s.
fn fault_and_recover(d: &Meshd, fault: &str, before: &[(String, u32, u32)]) {
    // Past the recency rule's window: the fault's image must be the only fresh one for the culprit
    // to be named, and only a named culprit moves the others to the standby.
    std::thread::sleep(mesh_backend::watch::FAULT_WINDOW + Duration::from_millis(500));
    let image = programs_dir().join("fault.ptx");
    d.ok(&["load", fault, image.to_str().unwrap()]);
    let moved = wait_until(UP, || {
        let faulted = row_of(d, fault).is_some_and(|r| r["state"].as_str().unwrap_or("").starts_with("faulted"));
        let now = programs(d);
        faulted
            && now.len() == 2
            && now.iter().all(|(name, _, pid)| before.iter().any(|(n, _, old)| n == name && old != pid))
    });
    assert!(moved, "{fault} faulted and a and b run in new workers: {}\n{}", d.ok(&["ps"]), d.log_text());
    d.ok(&["unload", fault]);
}

#[test]
fn after_a_fault_moved_the_programs_to_the_standby_a_restart_adopts_them_there() {
    require_gpu!("after_a_fault_moved_the_programs_to_the_standby_a_restart_adopts_them_there");
    let dir = TestMps::new();
    let mps = dir.path.clone();
    let args = [
        "--isolation",
        "mps",
        "--pool",
        "3",
        "--standby",
        "2",
        "--mps-dir",
        mps.to_str().unwrap(),
        "--orphan-grace-ms",
        "30000",
    ];
    let mut d = Meshd::start(&args);
    let image = programs_dir().join("heartbeat.ptx");
    for name in ["a", "b"] {
        d.ok(&["load", name, image.to_str().unwrap()]);
    }
    assert!(wait_until(UP, || programs(&d).len() == 2), "both programs run: {}", d.ok(&["ps"]));
    let first = programs(&d);
    // The fault: the standby's server takes a and b over, and its daemon is the active one.
    fault_and_recover(&d, "fault1", &first);
    let log = d.log_text();
    assert!(log.contains("MPS standby took the programs over"), "{log}");
    let ready = wait_until(UP, || d.log_text().matches("MPS standby ready again").count() >= 1);
    assert!(ready, "a new standby was made on the faulted server:\n{}", d.log_text());
    let progs = programs(&d);
    let mb = d.mailbox();
    let slots: Vec<u32> = progs.iter().map(|p| p.1).collect();
    let generations: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    let watcher = {
        let mb = d.mailbox();
        let slots = slots.clone();
        std::thread::spawn(move || kept_beating(&mb, &slots, Duration::from_secs(4)))
    };
    let restarted = Instant::now();
    d.kill9_and_restart();
    let up = restarted.elapsed();
    let beat_for = watcher.join().unwrap();
    let log = d.log_text();
    let nested = mps.join("standby").join("pipe");
    assert!(
        log.contains(&format!("of {} and 2 orphan(s) running a kernel", nested.display())),
        "the standby's daemon adopted:\n{log}"
    );
    assert_each_adopted(&log, &progs);
    assert!(beat_for >= Duration::from_millis(3900), "the heartbeats stopped {beat_for:?} into the restart:\n{log}");
    assert_eq!(programs(&d), progs, "the same programs, in the same slots and workers");
    let after: Vec<u32> = slots.iter().map(|&s| mb.slot(s).unwrap().generation()).collect();
    assert_eq!(after, generations, "no new generation: nothing was launched again");
    // The new standby, made in the MPS directory itself, takes the next fault as the first did.
    assert!(
        wait_until(UP, || d.log_text().matches("MPS standby server ready with 2 idle worker(s)").count() >= 2),
        "the new meshd's standby is ready:\n{}",
        d.log_text()
    );
    let took_over = d.log_text().matches("MPS standby took the programs over").count();
    fault_and_recover(&d, "fault2", &progs);
    assert_eq!(
        d.log_text().matches("MPS standby took the programs over").count(),
        took_over + 1,
        "the second fault moved the programs to the new standby:\n{}",
        d.log_text()
    );
    eprintln!(
        "adoption after a fault: meshd answered {up:?} after the kill; the heartbeats rose throughout \
         ({beat_for:?} of 4 s); a second fault moved both programs to the standby made in {}",
        mps.display()
    );
    shutdown_leaves_nothing(d, &mps);
}
