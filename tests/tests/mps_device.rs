//! Device channels in MPS mode (on by default): rings that meshd's own plain context owns and every
//! worker maps by descriptor. These tests are what proves the path. They check a GPU↔GPU ping between two MPS workers over two
//! device channels (every reply's content checked by the ping), a stream that survives ten upgrades
//! of each end exactly once (sequence and checksum of every message), and a GPU fault among the
//! programs: the ring keeps its messages through the recovery, and a sink loaded after it takes
//! every one, sequence-checked, before what the relaunched source sends on.
//! Only a GPU whose compute mode refuses meshd's own context refuses them, saying why (not tested
//! here: the test machine's compute mode is not ours to change).

use std::path::Path;
use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::{Meshd, mps_membership};
use mesh_gpu_tests::stress::{self, user};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};
use mesh_shm::Producer;

const CAPACITY: u32 = 16;
const DEADLINE: Duration = Duration::from_secs(60);

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// meshd in MPS mode (device channels on by default), a pool of `pool` workers, its MPS directory under `dir`.
fn start(dir: &Path, pool: u32) -> Meshd {
    let mps = dir.join("mps");
    let pool = pool.to_string();
    Meshd::start(&["--isolation", "mps", "--pool", &pool, "--mps-dir", mps.to_str().unwrap(), "--channels", "64"])
}

fn channel(d: &Meshd, name: &str, size: u32, placement: &str) {
    let (size, capacity) = (size.to_string(), CAPACITY.to_string());
    d.ok(&["channel", "create", name, "--msg-size", &size, "--capacity", &capacity, "--placement", placement]);
}

/// A host knob channel holding one knob message (stress programs read it on binding 1).
fn knob(d: &Meshd, name: &str) {
    d.ok(&["channel", "create", name, "--msg-size", "8", "--capacity", "2"]);
    Producer::claim(&d.mailbox(), name).unwrap().send(&stress::knobs(0, 64, false), Duration::from_secs(1)).unwrap();
}

fn rows(d: &Meshd) -> Vec<serde_json::Value> {
    serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap()
}

fn user_words(d: &Meshd, name: &str) -> [u32; 32] {
    let rows = rows(d);
    let row = rows.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{name} not in ps: {rows:?}"));
    assert_eq!(row["state"], "running", "{name}: {row}\n{}", d.log_text());
    d.mailbox().slot(u32::try_from(row["slot"].as_u64().unwrap()).unwrap()).unwrap().user_words()
}

/// The channel's row in `meshd info`: (head, tail, lost).
fn channel_row(d: &Meshd, name: &str) -> (u64, u64, u64) {
    let info: serde_json::Value = serde_json::from_str(&d.ok(&["info"])).unwrap();
    let row = info["channels"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned();
    let row = row.unwrap_or_else(|| panic!("{name} not in info: {info}"));
    (row["head"].as_u64().unwrap(), row["tail"].as_u64().unwrap(), row["lost"].as_u64().unwrap())
}

/// A ping in one worker and an echo in another over two device channels: round trips flow, every
/// reply is whole, and meshd itself is no client of its MPS server (its context owns the rings).
#[test]
fn a_ping_crosses_device_channels_between_two_mps_workers() {
    require_gpu!("a_ping_crosses_device_channels_between_two_mps_workers");
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), 3);
    let (_, clients) = mps_membership(&dir.path().join("mps/pipe"));
    assert!(!clients.contains(&d.child.id()), "meshd's own context is plain, not an MPS client: {clients:?}");
    for size in [8u32, 64, 1024] {
        let (to, from) = (format!("to{size}"), format!("from{size}"));
        channel(&d, &to, size, "device");
        channel(&d, &from, size, "device");
        d.ok(&["load", "echo", &ptx_file("echo_header"), "--block", "32", "--bind", &to, "--bind", &from]);
        d.ok(&["load", "ping", &ptx_file("ping"), "--block", "32", "--bind", &to, "--bind", &from]);
        let started = Instant::now();
        let timed = |w: &[u32; 32]| u64::from(w[0]) | (u64::from(w[1]) << 32);
        assert!(
            wait_until(DEADLINE, || timed(&user_words(&d, "ping")) >= 20_000),
            "{size} B: the ping timed {} round trips\n{}",
            timed(&user_words(&d, "ping")),
            d.log_text()
        );
        let w = user_words(&d, "ping");
        let total = u64::from(w[2]) | (u64::from(w[3]) << 32);
        assert_eq!(w[5], 0, "{size} B: replies whose content was wrong");
        eprintln!(
            "mps-device ping {size} B: {} round trips, mean {:.2} µs, min {:.2} µs, max {:.2} µs ({:?})",
            timed(&w),
            total as f64 / timed(&w) as f64 / 1e3,
            f64::from(w[4]) / 1e3,
            f64::from(w[6]) / 1e3,
            started.elapsed()
        );
        d.ok(&["unload", "ping"]);
        d.ok(&["unload", "echo"]);
    }
    let info = d.ok(&["info"]);
    assert!(info.contains("\"placement\": \"device\""), "{info}");
    d.ok(&["shutdown"]);
}

/// A source and a sink in two workers over a device channel, each end upgraded ten times mid-stream
/// (an MPS upgrade loads the new image in another worker, which maps the ring, then swaps): every
/// message sequence-checked and checksummed, every relaunch resuming exactly where the last stopped.
#[test]
fn a_device_channel_survives_upgrades_of_either_end_in_mps_mode() {
    require_gpu!("a_device_channel_survives_upgrades_of_either_end_in_mps_mode");
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), 3);
    channel(&d, "data", 256, "device");
    knob(&d, "sink-knob");
    knob(&d, "source-knob");
    d.ok(&["load", "sink", &ptx_file("sink"), "--block", "32", "--bind", "data", "--bind", "sink-knob"]);
    d.ok(&["load", "source", &ptx_file("source"), "--block", "32", "--bind", "data", "--bind", "source-knob"]);
    for k in 0..20 {
        let before = user::count(&user_words(&d, "sink"));
        assert!(
            wait_until(DEADLINE, || user::count(&user_words(&d, "sink")) > before + u64::from(CAPACITY)),
            "no traffic before upgrade {k}\n{}",
            d.log_text()
        );
        let end = if k % 2 == 0 { "sink" } else { "source" };
        d.ok(&["upgrade", end, &ptx_file(end)]);
    }
    let total = user::count(&user_words(&d, "sink"));
    assert!(wait_until(DEADLINE, || user::count(&user_words(&d, "sink")) > total + 1000), "traffic after");
    let w = user_words(&d, "sink");
    assert_eq!((w[user::ERRORS], w[user::FIRST_BAD]), (0, 0), "lost, repeated, reordered or torn messages");
    assert_eq!(w[user::RESUME], 0, "a relaunch resumed elsewhere than the count kept (exactly once across upgrades)");
    assert!(w[user::LAUNCHES] >= 11, "the sink was launched {} times", w[user::LAUNCHES]);
    assert_eq!(channel_row(&d, "data").2, 0, "orderly upgrades lose nothing");
    eprintln!("mps-device upgrades: {} messages checked", user::count(&w));
    d.ok(&["shutdown"]);
}

/// A full device ring when another program faults: the recovery ends every MPS client, and the
/// ring (meshd's memory, which outlives them) keeps its messages, as the log says. A sink loaded
/// afterwards takes every one of them, then what the relaunched source sends on: each
/// sequence-checked and checksummed, none lost, none counted lost.
#[test]
fn a_device_ring_keeps_its_messages_through_an_mps_recovery() {
    require_gpu!("a_device_ring_keeps_its_messages_through_an_mps_recovery");
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), 3);
    channel(&d, "data", 64, "device");
    knob(&d, "source-knob");
    knob(&d, "sink-knob");
    // A source and no consumer: the ring fills, and a full ring makes the producer publish its head.
    d.ok(&["load", "source", &ptx_file("source"), "--block", "32", "--bind", "data", "--bind", "source-knob"]);
    let full = u64::from(CAPACITY);
    assert!(wait_until(DEADLINE, || channel_row(&d, "data") == (full, 0, 0)), "{:?}", channel_row(&d, "data"));
    // A relaunch is a new generation in the source's slot.
    let generation = |d: &Meshd| rows(d).iter().find(|r| r["name"] == "source").and_then(|r| r["generation"].as_u64());
    let before = generation(&d);
    d.ok(&["load", "fault", &ptx_file("fault")]);
    assert!(
        wait_until(DEADLINE, || rows(&d)
            .iter()
            .any(|r| r["name"] == "fault" && r["state"].as_str().is_some_and(|s| s.starts_with("faulted")))),
        "the fault was noticed\n{}",
        d.log_text()
    );
    let relaunched = wait_until(DEADLINE, || {
        rows(&d).iter().any(|r| r["name"] == "source" && r["state"] == "running") && generation(&d) != before
    });
    assert!(relaunched, "the source was relaunched after the fault\n{}", d.log_text());
    assert_eq!(channel_row(&d, "data"), (full, 0, 0), "the ring kept, its indices and nothing counted lost");
    let log = d.log_text();
    assert!(log.contains(&format!("its device ring keeps its {full} message(s) through the recovery")), "{log}");
    d.ok(&["load", "sink", &ptx_file("sink"), "--block", "32", "--bind", "data", "--bind", "sink-knob"]);
    let enough = 100 * full;
    assert!(
        wait_until(DEADLINE, || user::count(&user_words(&d, "sink")) > enough),
        "the sink took {} messages\n{}",
        user::count(&user_words(&d, "sink")),
        d.log_text()
    );
    let w = user_words(&d, "sink");
    assert_eq!((w[user::ERRORS], w[user::FIRST_BAD]), (0, 0), "lost, repeated, reordered or torn messages");
    assert_eq!(channel_row(&d, "data").2, 0, "nothing counted lost");
    eprintln!(
        "mps-device recovery: the ring kept its {full} messages through the fault; the sink then checked {}",
        user::count(&w)
    );
    d.ok(&["unload", "fault"]);
    d.ok(&["shutdown"]);
}
