//! Blink mode end to end through the `meshd` binary and its socket: four programs under traffic, twenty
//! upgrades, refusals that leave the others running, a program that ignores stop, a clean shutdown.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{program, programs_dir, require_gpu, wait_until};
use mesh_shm::{Consumer, Mailbox, Producer};

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// Sequence-numbered traffic through one echo program: a sender thread and a checking receiver thread.
struct Traffic {
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(mailbox: &Mailbox, input: &str, output: &str) -> Self {
        let (sent, received, stop) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let mut tx = Producer::claim(mailbox, input).unwrap();
        let mut rx = Consumer::claim(mailbox, output).unwrap();
        let (s, st) = (sent.clone(), stop.clone());
        let sender = std::thread::spawn(move || {
            let mut i = 0u64;
            while !st.load(Ordering::Relaxed) {
                let mut m = [0u8; 16];
                m[..8].copy_from_slice(&i.to_le_bytes());
                m[8..].copy_from_slice(&(!i).to_le_bytes());
                if tx.try_send(&m).unwrap() {
                    i += 1;
                    s.store(i, Ordering::Release);
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        let (r, st, s) = (received.clone(), stop.clone(), sent.clone());
        let receiver = std::thread::spawn(move || {
            let mut m = [0u8; 16];
            let mut expect = 0u64;
            loop {
                if rx.try_recv(&mut m).unwrap() {
                    let a = u64::from_le_bytes(m[..8].try_into().unwrap());
                    assert_eq!(a, expect, "lost, duplicated or reordered");
                    assert_eq!(u64::from_le_bytes(m[8..].try_into().unwrap()), !a, "torn");
                    expect += 1;
                    r.store(expect, Ordering::Release);
                } else if st.load(Ordering::Relaxed) && expect == s.load(Ordering::Acquire) {
                    return;
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        Self { sent, received, stop, threads: vec![sender, receiver] }
    }

    /// Stops sending, waits until every message sent came back; returns how many.
    fn finish(self, timeout: Duration) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + timeout;
        for t in self.threads {
            while !t.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "{} sent, {} received",
                    self.sent.load(Ordering::Relaxed),
                    self.received.load(Ordering::Relaxed)
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            t.join().expect("traffic thread failed its sequence check");
        }
        self.received.load(Ordering::Acquire)
    }
}

#[test]
fn four_programs_twenty_upgrades_no_message_lost() {
    require_gpu!("four_programs_twenty_upgrades_no_message_lost");
    let d = Meshd::start(&[]);
    for i in 0..3 {
        d.ok(&["channel", "create", &format!("in{i}"), "--msg-size", "16", "--capacity", "1024"]);
        d.ok(&["channel", "create", &format!("out{i}"), "--msg-size", "16", "--capacity", "1024"]);
        d.ok(&[
            "load",
            &format!("echo{i}"),
            &ptx_file("echo"),
            "--bind",
            &format!("in{i}"),
            "--bind",
            &format!("out{i}"),
        ]);
    }
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    let mailbox = d.mailbox();
    let traffic: Vec<Traffic> =
        (0..3).map(|i| Traffic::start(&mailbox, &format!("in{i}"), &format!("out{i}"))).collect();
    std::thread::sleep(Duration::from_millis(200));
    let dir = tempfile::tempdir().unwrap();
    let mut before = d.heartbeats();
    assert_eq!(before.len(), 4);
    let started = Instant::now();
    for k in 0..20 {
        // A fresh image each time (a comment changes its hash), so that each upgrade really links.
        let image = dir.path().join(format!("echo-v{k}.ptx"));
        let mut bytes = program("echo");
        bytes.extend_from_slice(format!("\n// version {k}\n").as_bytes());
        std::fs::write(&image, bytes).unwrap();
        let out = d.ok(&["upgrade", "echo1", image.to_str().unwrap()]);
        assert!(out.contains("upgraded echo1"), "{out}");
        std::thread::sleep(Duration::from_millis(20));
        let now = d.heartbeats();
        for ((name, b0, _), (_, b1, state)) in before.iter().zip(&now) {
            assert_eq!(state, "running", "{name} after upgrade {k}");
            assert!(b1 >= b0, "{name}'s heartbeat went back from {b0} to {b1}");
        }
        before = now;
    }
    eprintln!("20 upgrades in {:?}", started.elapsed());
    assert!(
        wait_until(Duration::from_secs(2), || d.heartbeats().iter().zip(&before).all(|(a, b)| a.1 > b.1)),
        "every heartbeat continues"
    );
    for (i, t) in traffic.into_iter().enumerate() {
        let n = t.finish(Duration::from_secs(30));
        eprintln!("echo{i}: {n} messages, none lost, duplicated or reordered");
        assert!(n > 1000, "echo{i} carried only {n} messages");
    }
    let rows: Vec<serde_json::Value> = serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap();
    let echo1 = rows.iter().find(|r| r["name"] == "echo1").unwrap();
    assert!(echo1["generation"].as_u64().unwrap() >= 21, "each upgrade relaunched echo1: {echo1}");
    d.ok(&["unload", "echo2"]);
    assert!(!d.ok(&["ps"]).contains("echo2"));
    d.ok(&["shutdown"]);
}

#[test]
fn bad_loads_are_refused_while_the_others_keep_running() {
    require_gpu!("bad_loads_are_refused_while_the_others_keep_running");
    let d = Meshd::start(&[]);
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"\x00\x01 definitely not a GPU image").unwrap();
    let err = d.refused(&["load", "g", garbage.to_str().unwrap()]);
    assert!(err.contains("neither PTX, cubin, fatbin nor LTO-IR"), "{err}");
    let broken = dir.path().join("broken.ptx");
    std::fs::write(
        &broken,
        ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry mesh_main() { nonsense; }\n",
    )
    .unwrap();
    let err = d.refused(&["load", "b", broken.to_str().unwrap()]);
    assert!(err.contains("linking for") && err.contains("ptxas"), "nvJitLink's log is in the refusal: {err}");
    let no_main = dir.path().join("no_main.ptx");
    std::fs::write(&no_main, ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry other() { ret; }\n")
        .unwrap();
    let err = d.refused(&["load", "n", no_main.to_str().unwrap()]);
    assert!(err.contains("no entry point mesh_main"), "{err}");
    let err = d.refused(&["load", "huge", &ptx_file("heartbeat"), "--grid", "100000", "--block", "1024"]);
    assert!(err.contains("cannot be resident") && err.contains("fit per SM"), "{err}");
    eprintln!("too large: {err}");
    let err = d.refused(&["load", "beat", &ptx_file("heartbeat")]);
    assert!(err.contains("already loaded"), "{err}");
    let err = d.refused(&["load", "x", &ptx_file("echo"), "--bind", "nope"]);
    assert!(err.contains("no such channel"), "{err}");
    let b0 = d.heartbeats()[0].1;
    assert!(wait_until(Duration::from_secs(2), || d.heartbeats()[0].1 > b0), "the running program kept beating");
    assert_eq!(d.heartbeats().len(), 1, "no refused program was left behind");
    d.ok(&["shutdown"]);
}

#[test]
fn a_program_that_ignores_stop_gives_a_bounded_error_and_meshd_still_answers() {
    require_gpu!("a_program_that_ignores_stop_gives_a_bounded_error_and_meshd_still_answers");
    let mut d = Meshd::start(&["--stop-timeout-ms", "1000"]);
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    d.ok(&["load", "stubborn", &ptx_file("ignore_stop")]);
    let t = Instant::now();
    let err = d.refused(&["load", "late", &ptx_file("heartbeat")]);
    let took = t.elapsed();
    eprintln!("refused after {took:?}: {err}");
    assert!(err.contains("stubborn") && err.contains("did not stop within 1000 ms"), "{err}");
    assert!(took < Duration::from_secs(10), "bounded: {took:?}");
    let ps = d.ok(&["ps"]);
    assert!(ps.contains("stubborn") && ps.contains("beat"), "{ps}");
    let err = d.refused(&["unload", "beat"]);
    assert!(err.contains("degraded"), "a half-done state accepts only status and shutdown: {err}");
    let b0 = d.heartbeats().iter().find(|r| r.0 == "beat").unwrap().1;
    assert!(
        wait_until(Duration::from_secs(2), || d.heartbeats().iter().find(|r| r.0 == "beat").unwrap().1 > b0),
        "the program that did stop was relaunched"
    );
    d.ok(&["shutdown"]);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = d.child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "meshd did not exit after shutdown; its log:\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("meshd exited {status} {:?} after shutdown", t.elapsed());
    assert!(!Path::new(&d.socket).exists(), "the socket is removed");
}

/// (name, heartbeat, state, restarts) of every program; empty while meshd replaces its process
/// after a sticky fault (the socket is bound again by the new image).
fn rows_now(d: &Meshd) -> Vec<(String, u64, String, u64)> {
    let out = d.cli(&["ps", "--json"]);
    let rows: Vec<serde_json::Value> =
        if out.status.success() { serde_json::from_slice(&out.stdout).unwrap_or_default() } else { Vec::new() };
    rows.iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["heartbeat"].as_u64().unwrap_or(0),
                r["state"].as_str().unwrap_or_default().to_string(),
                r["restarts"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn a_fault_in_blink_mode_is_recovered_and_meshd_takes_changes_again() {
    require_gpu!("a_fault_in_blink_mode_is_recovered_and_meshd_takes_changes_again");
    let mut d = Meshd::start(&[]);
    let pid = d.child.id();
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    let loaded = Instant::now();
    d.ok(&["load", "fault", &ptx_file("fault")]);
    // No request but ps: the fault is sticky, so meshd replaces its process (same pid); the new image
    // relaunches beat and finds the culprit by halves (both images were fresh: recency cannot tell).
    let recovered = wait_until(Duration::from_secs(20), || {
        let rows = rows_now(&d);
        rows.iter().any(|r| r.0 == "fault" && r.2.starts_with("faulted") && r.2.contains("left stopped"))
            && rows.iter().any(|r| r.0 == "beat" && r.2 == "running" && r.3 >= 1)
    });
    let took = loaded.elapsed();
    let rows = rows_now(&d);
    for r in &rows {
        eprintln!("blink mode after the fault: {} {} restarts {}", r.0, r.2, r.3);
    }
    assert!(recovered, "recovered with the culprit left stopped: {rows:?}\n{}", d.log_text());
    assert_eq!(d.child.id(), pid, "the same process");
    assert!(d.child.try_wait().unwrap().is_none(), "meshd still runs:\n{}", d.log_text());
    eprintln!(
        "watchdog blink (2 programs, culprit searched): {:.0} ms from the faulting load to the culprit named; {}",
        took.as_secs_f64() * 1e3,
        d.log_text().lines().filter(|l| l.contains("recovered in")).collect::<Vec<_>>().join(" | ")
    );
    let b0 = rows.iter().find(|r| r.0 == "beat").unwrap().1;
    assert!(
        wait_until(Duration::from_secs(2), || d.heartbeats().iter().find(|r| r.0 == "beat").unwrap().1 > b0),
        "beat runs again"
    );
    d.ok(&["load", "late", &ptx_file("heartbeat")]);
    d.ok(&["upgrade", "fault", &ptx_file("heartbeat")]);
    assert!(
        wait_until(Duration::from_secs(2), || d.heartbeats().iter().all(|r| r.2 == "running")),
        "a new image revives the culprit: {:?}",
        d.heartbeats()
    );
    d.ok(&["shutdown"]);
    let t = Instant::now();
    while d.child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(15), "meshd did not exit after shutdown; its log:\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("meshd exited {:?} after shutdown", t.elapsed());
}
