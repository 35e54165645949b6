//! Crash-safe start on the GPU: meshd killed with SIGKILL under traffic, started again on the same
//! mailbox and state; every program runs again from its slots and channels (in MPS mode under the
//! default orphan grace it never stopped: the restart adopts it), and no message is lost (a message
//! the program had taken but not yet acknowledged may come again: at-least-once after a crash).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};
use mesh_shm::{Consumer, Producer};

const DEADLINE: Duration = Duration::from_secs(30);

/// What the receiving thread saw.
#[derive(Default)]
struct Seen {
    /// The next sequence number expected: every one below it arrived.
    next: AtomicU64,
    /// Replies whose sequence number had arrived already (replays after the crash).
    replayed: AtomicU64,
}

fn kill_9_under_traffic(mode: &str, extra: &[&str]) {
    let mut d = Meshd::start(extra);
    d.ok(&["channel", "create", "to", "--msg-size", "16", "--capacity", "64"]);
    d.ok(&["channel", "create", "from", "--msg-size", "16", "--capacity", "64"]);
    let echo = programs_dir().join("echo_warp.ptx");
    d.ok(&["load", "echo", echo.to_str().unwrap(), "--bind", "to", "--bind", "from"]);
    let mb = d.mailbox();
    let (stop, sent, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(Seen::default()));
    let sender = {
        let (mb, stop, sent) = (mb.clone(), stop.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut tx = Producer::claim(&mb, "to").unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut m = [0u8; 16];
                m[..8].copy_from_slice(&i.to_le_bytes());
                m[8..].copy_from_slice(&(!i).to_le_bytes());
                if tx.try_send(&m).unwrap() {
                    i += 1;
                    sent.store(i, Ordering::Release);
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        })
    };
    let receiver = {
        let (mb, seen, stop, sent) = (mb.clone(), seen.clone(), stop.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut rx = Consumer::claim(&mb, "from").unwrap();
            let mut m = [0u8; 16];
            loop {
                if rx.try_recv(&mut m).unwrap() {
                    let a = u64::from_le_bytes(m[..8].try_into().unwrap());
                    assert_eq!(u64::from_le_bytes(m[8..].try_into().unwrap()), !a, "torn reply {a}");
                    let next = seen.next.load(Ordering::Relaxed);
                    assert!(a <= next, "lost: reply {a} came while {next} was expected");
                    if a == next {
                        seen.next.store(next + 1, Ordering::Release);
                    } else {
                        seen.replayed.fetch_add(1, Ordering::Relaxed);
                    }
                } else if stop.load(Ordering::Relaxed)
                    && seen.next.load(Ordering::Acquire) == sent.load(Ordering::Acquire)
                {
                    return;
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        })
    };
    let progress = |n: u64| wait_until(DEADLINE, || seen.next.load(Ordering::Acquire) >= n);
    assert!(progress(20_000), "{mode}: traffic before the crash");
    let before = seen.next.load(Ordering::Acquire);
    let t = Instant::now();
    d.kill9_and_restart();
    let back = t.elapsed();
    assert!(
        wait_until(DEADLINE, || d.heartbeats().iter().any(|(n, _, s)| n == "echo" && s == "running")),
        "{mode}: echo is not running again after the restart: {:?}\n{}",
        d.heartbeats(),
        d.log_text()
    );
    let running_again = t.elapsed();
    assert!(
        progress(before + 20_000),
        "{mode}: traffic after the restart ({} of {}; killed after {before} replies)\ninfo: {}\nps: {}\nlog:\n{}",
        seen.next.load(Ordering::Acquire),
        before + 20_000,
        String::from_utf8_lossy(&d.cli(&["info"]).stdout),
        String::from_utf8_lossy(&d.cli(&["ps"]).stdout),
        d.log_text()
    );
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    let t_end = Instant::now();
    while !receiver.is_finished() {
        assert!(
            t_end.elapsed() < DEADLINE,
            "{mode}: {} sent, every reply up to {} arrived",
            sent.load(Ordering::Acquire),
            seen.next.load(Ordering::Acquire)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    receiver.join().expect("the receiver found a lost or torn reply");
    let total = sent.load(Ordering::Acquire);
    assert_eq!(seen.next.load(Ordering::Acquire), total, "{mode}: every message came back");
    eprintln!(
        "restart {mode}: kill -9 under traffic after {before} replies; meshd answering again in {back:?}, echo running in {running_again:?}; {total} messages in all, none lost, {} replayed",
        seen.replayed.load(Ordering::Relaxed)
    );
    d.ok(&["shutdown"]);
}

#[test]
fn kill_9_under_traffic_loses_nothing_blink() {
    require_gpu!("kill_9_under_traffic_loses_nothing_blink");
    kill_9_under_traffic("blink", &[]);
}

#[test]
fn kill_9_under_traffic_loses_nothing_mps() {
    require_gpu!("kill_9_under_traffic_loses_nothing_mps");
    // The default orphan grace: echo runs on through the kill and the restart adopts it.
    kill_9_under_traffic("mps", &["--isolation", "mps", "--pool", "2"]);
}

#[test]
fn kill_9_under_traffic_loses_nothing_mps_without_a_grace() {
    require_gpu!("kill_9_under_traffic_loses_nothing_mps_without_a_grace");
    // Echo dies with meshd and the restart relaunches it.
    kill_9_under_traffic("mps, --orphan-grace-ms 0", &["--isolation", "mps", "--pool", "2", "--orphan-grace-ms", "0"]);
}

/// `meshd handoff` in blink mode: the same process executes the new image, which relaunches the
/// program once (its next generation), and it beats again.
#[test]
fn a_handoff_in_blink_mode_relaunches_each_program_once_in_the_same_process() {
    require_gpu!("a_handoff_in_blink_mode_relaunches_each_program_once_in_the_same_process");
    let d = Meshd::start(&[]);
    let image = programs_dir().join("heartbeat.ptx");
    d.ok(&["load", "hb", image.to_str().unwrap()]);
    let mb = d.mailbox();
    let slot = 0;
    assert!(wait_until(Duration::from_secs(30), || mb.slot(slot).unwrap().status().heartbeat > 0), "it beats");
    let generation = mb.slot(slot).unwrap().generation();
    let pid = d.child.id();
    let started = Instant::now();
    let out = d.cli(&["handoff"]);
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "handoff: {}\n{said}\n{}", String::from_utf8_lossy(&out.stderr), d.log_text());
    assert!(said.contains("1 program(s) stopped in order") && said.contains("1 of 1 program(s) running"), "{said}");
    assert_eq!(d.child.id(), pid, "the same process");
    assert_eq!(mb.slot(slot).unwrap().generation(), generation + 1, "relaunched once, at its next generation");
    let beat = mb.slot(slot).unwrap().status().heartbeat;
    assert!(wait_until(Duration::from_secs(10), || mb.slot(slot).unwrap().status().heartbeat > beat), "it beats again");
    eprintln!("blink handoff: `meshd handoff` returned after {took:?} (the new image answering)\n{said}");
    d.ok(&["shutdown"]);
}

/// One kill -9 of a blink meshd running `heartbeat`, timed from the kill: when its mailbox lock
/// comes free (what a standby would wait on), when the kernel's last iteration was (host clock,
/// and its own `%globaltimer` against the last iteration seen before the kill), and its slot's state
/// then. With `stop_at_lock`, the slot's stop is asked the moment the lock is free, as a standby's
/// fence would.
fn time_a_blink_kill(stop_at_lock: bool, pin_in: Option<&mesh_cuda::Context>) -> String {
    let mut d = Meshd::start(&[]);
    let image = programs_dir().join("heartbeat.ptx");
    d.ok(&["load", "hb", image.to_str().unwrap()]);
    let mb = d.mailbox();
    // With `pin_in`: the same mailbox pages registered (pinned) by a context of this process too,
    // as a blink standby's context holds them, until the kill has been timed.
    let _pinned_here = pin_in.map(|ctx| mesh_cuda::RegisteredMailbox::register(ctx, &mb).expect("registered here too"));
    let slot = mb.slot(0).unwrap();
    assert!(wait_until(Duration::from_secs(30), || slot.status().heartbeat > 1000), "it beats");
    let lock_path = format!("{}.lock", d.mailbox_path());
    let lock_file = std::fs::OpenOptions::new().read(true).write(true).open(&lock_path).unwrap();
    let gpu_now = || {
        let w = slot.user_words();
        (u64::from(w[3]) << 32) | u64::from(w[2])
    };
    let gpu_before = gpu_now();
    let killed = Instant::now();
    d.child.kill().unwrap();
    let mut lock_free = None;
    let (mut last_beat, mut beat) = (killed, slot.status().heartbeat);
    // Past the lock, 200 ms more: the kernel has long stopped by then.
    while killed.elapsed() < lock_free.unwrap_or(Duration::from_secs(5)) + Duration::from_millis(200) {
        if lock_free.is_none()
            && rustix::fs::flock(&lock_file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
        {
            lock_free = Some(killed.elapsed());
            if stop_at_lock {
                slot.request_stop();
            }
        }
        let now = slot.status().heartbeat;
        if now != beat {
            (beat, last_beat) = (now, Instant::now());
        }
    }
    // Past any teardown: nothing moves any more.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(slot.status().heartbeat, beat, "the kernel stopped");
    let gpu_ran_ms = gpu_now().saturating_sub(gpu_before) as f64 / 1e6;
    let state = slot.status().state;
    let _ = d.child.wait();
    let lock_free = lock_free.unwrap_or_else(|| panic!("the mailbox lock was not free within 5 s of the kill"));
    drop(lock_file);
    format!(
        "lock free at {:.2} ms, last beat at {:.2} ms (its own timer: {gpu_ran_ms:.2} ms past the last beat seen \
         before the kill), slot state {state} ({})",
        lock_free.as_secs_f64() * 1e3,
        (last_beat - killed).as_secs_f64() * 1e3,
        if state == mesh_shm::layout::STATE_STOPPED { "stopped in order" } else { "as it was" },
    )
}

/// What a blink standby's takeover waits for: after a kill -9 of a blink meshd, the mailbox lock
/// comes free, and the killed context's kernels stop, each timed from the kill (five kills, then
/// five with the slot's stop asked the moment the lock is free, then five beside a second, idle
/// meshd's context, then five with the killed meshd's mailbox registered by a context of this
/// process too). Printed, not asserted: the figures decide how the standby fences the old kernels,
/// and whether it may hold a context, and the mailbox registered, before it takes over.
#[test]
fn a_killed_blink_meshd_frees_its_lock_and_its_kernels_stop() {
    require_gpu!("a_killed_blink_meshd_frees_its_lock_and_its_kernels_stop");
    for stop_at_lock in [false, true] {
        for round in 0..5 {
            let line = time_a_blink_kill(stop_at_lock, None);
            eprintln!("blink kill -9{} #{round}: {line}", if stop_at_lock { ", stop asked at the lock" } else { "" });
        }
    }
    // Beside a second, idle meshd: a context of another process on the GPU, as a blink standby
    // would hold one. Whether another context slows the killed one's teardown, and so the lock's
    // release, is what these show.
    let mut other = Meshd::start(&[]);
    for round in 0..5 {
        let line = time_a_blink_kill(false, None);
        eprintln!("blink kill -9 beside an idle meshd's context #{round}: {line}");
    }
    other.ok(&["shutdown"]);
    let _ = other.child.wait();
    // With the same mailbox pages pinned by another process's context (a blink standby registers
    // the mailbox it will take over): whether the shared pinning, rather than a second context,
    // slows the killed one's teardown (its unpinning runs as its files close at exit).
    let ctx = mesh_cuda::Context::primary(&mesh_cuda::Device::get(0).expect("GPU 0")).expect("a context here");
    for round in 0..5 {
        let line = time_a_blink_kill(false, Some(&ctx));
        eprintln!("blink kill -9 with its mailbox registered by another process too #{round}: {line}");
    }
}
