//! The watchdog in both modes: 8 heartbeat programs and the `fault` program, no request after the
//! fault but `ps`; within a deadline all 8 run again with rising heartbeats, and the culprit is left
//! stopped, named in `ps --json` with its fault. Prints `watchdog <mode>: ... ms` (fault to all healthy).
//!
//! Blink mode replaces meshd's process after the (sticky) fault: the same pid, the same socket, a
//! short gap in which `ps` finds no meshd (tolerated here). The 8 are loaded more than 1.5 s before
//! the fault, so the recency rule names the culprit and no search is needed (the measured path).

use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// `ps --json`; empty while meshd is being replaced (blink mode: no socket for a moment).
fn ps(d: &Meshd) -> Vec<serde_json::Value> {
    let out = d.cli(&["ps", "--json"]);
    if !out.status.success() {
        return Vec::new();
    }
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

fn beats(rows: &[serde_json::Value]) -> Vec<(String, u64, String)> {
    rows.iter()
        .filter(|r| r["name"] != "fault")
        .map(|r| {
            (r["name"].as_str().unwrap().into(), r["heartbeat"].as_u64().unwrap(), r["state"].as_str().unwrap().into())
        })
        .collect()
}

fn eight_and_a_fault(mode: &str, extra: &[&str]) {
    let mut d = Meshd::start(extra);
    for i in 0..8 {
        d.ok(&["load", &format!("beat{i}"), &ptx_file("heartbeat")]);
    }
    // Past the recency window (1.5 s): the one fresh image at the fault is the culprit's (both modes
    // measure the named path; the search by halves is measured by meshd.rs's blink fault test).
    std::thread::sleep(Duration::from_millis(1700));
    let pid = d.child.id();
    let before = beats(&ps(&d));
    assert_eq!(before.len(), 8);
    // The fault program faults right after its launch; from here on only ps is asked.
    let loaded = Instant::now();
    d.ok(&["load", "fault", &ptx_file("fault")]);
    let mut rows = Vec::new();
    let mut first_down: Option<Instant> = None;
    let healthy = wait_until(Duration::from_secs(20), || {
        rows = ps(&d);
        let now = beats(&rows);
        let culprit_named = rows
            .iter()
            .find(|r| r["name"] == "fault")
            .is_some_and(|r| r["state"].as_str().unwrap_or("").starts_with("faulted"));
        if first_down.is_none() && (culprit_named || now.iter().any(|b| b.2 != "running")) {
            first_down = Some(Instant::now());
        }
        culprit_named
            && now.len() == 8
            && now.iter().all(|b| b.2 == "running")
            && rows.iter().filter(|r| r["name"] != "fault").all(|r| r["restarts"].as_u64().unwrap_or(0) >= 1)
    });
    let took = loaded.elapsed();
    for r in &rows {
        eprintln!(
            "{mode} after the fault: {} {} gen {} restarts {} last_fault {} stopped_why {}",
            r["name"], r["state"], r["generation"], r["restarts"], r["last_fault"], r["stopped_why"]
        );
    }
    assert!(healthy, "not all healthy with the culprit named within 20 s: {rows:#?}\n{}", d.log_text());
    assert_eq!(d.child.id(), pid, "the same meshd process");
    assert!(d.child.try_wait().unwrap().is_none(), "meshd still runs:\n{}", d.log_text());
    let after = beats(&rows);
    assert!(
        wait_until(Duration::from_secs(2), || beats(&ps(&d)).iter().zip(&after).all(|(a, b)| a.1 > b.1)),
        "every heartbeat rises again"
    );
    let fault = rows.iter().find(|r| r["name"] == "fault").unwrap();
    let why = fault["stopped_why"].as_str().unwrap_or_default();
    assert!(why.contains("left stopped") && why.contains("caused a GPU fault"), "{fault}");
    assert!(fault["last_fault"].as_str().is_some() && fault["last_fault_unix_ms"].as_u64().is_some(), "{fault}");
    // The fault program faults within microseconds of its launch, so the load's answer marks the fault.
    eprintln!(
        "watchdog {mode}: {:.0} ms from the faulting load to all 8 healthy (ps saw it down after {:.0} ms); {}",
        took.as_secs_f64() * 1e3,
        first_down.map_or(f64::NAN, |t| (t - loaded).as_secs_f64() * 1e3),
        d.log_text()
            .lines()
            .filter(|l| l.contains("recovered in")
                || l.contains("replacing the process")
                || l.contains("after the replacement"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    // The daemon's own account of the recovery, line by line, for the record of where the time went.
    for line in d.log_text().lines().filter(|l| l.contains("WARN") || l.contains("watchdog")) {
        eprintln!("watchdog {mode} log: {line}");
    }
    // meshd still takes changes.
    d.ok(&["load", "late", &ptx_file("heartbeat")]);
    d.ok(&["unload", "fault"]);
    d.ok(&["shutdown"]);
}

#[test]
fn watchdog_blink_recovers_eight_programs_and_names_the_culprit() {
    require_gpu!("watchdog_blink_recovers_eight_programs_and_names_the_culprit");
    eight_and_a_fault("blink", &[]);
}

#[test]
fn watchdog_mps_recovers_eight_programs_and_names_the_culprit() {
    require_gpu!("watchdog_mps_recovers_eight_programs_and_names_the_culprit");
    eight_and_a_fault("mps", &["--isolation", "mps", "--pool", "10"]);
}
