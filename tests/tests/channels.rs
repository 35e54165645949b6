//! The channel format under stress, end to end through meshd in both modes: every direction (host→GPU,
//! GPU→host, GPU→GPU, host→host), every size from 8 B to 4 KiB, the one-thread and the warp calls, a slow
//! consumer and a slow producer, many wrap-arounds; then the same during 20 upgrades of the GPU end.
//! Every message is checked for its sequence number and a checksum over every payload byte.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::stress::{self, user};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};
use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Producer};

const SIZES: [u32; 6] = [8, 24, 64, 256, 1024, 4096];
/// Small, so that every case wraps the ring many times.
const CAPACITY: u32 = 16;
/// What a slow GPU end pauses per message, and what a slow host end spins.
const PAUSE: Duration = Duration::from_micros(2);
const DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    HostToGpu,
    GpuToHost,
    GpuToGpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slow {
    Consumer,
    Producer,
}

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// Messages per case: enough for many laps, few enough for the one-thread path at 4 KiB (a round trip per 8 B).
fn messages(size: u32, warp: bool) -> u64 {
    match (warp, size) {
        (true, s) if s <= 256 => 4000,
        (true, _) => 1000,
        (false, s) if s <= 64 => 2000,
        (false, 256) => 500,
        (false, _) => 120,
    }
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// A meshd under test with its mailbox mapped here, and a counter for unique channel names.
struct Mesh {
    d: Meshd,
    mb: Mailbox,
    next: u32,
}

impl Mesh {
    fn start(mps: bool, dir: &std::path::Path) -> Self {
        let mut args = vec!["--channels", "1024", "--shm-size", "256M"];
        let mps_dir = dir.join("mps");
        if mps {
            args.extend(["--isolation", "mps", "--pool", "4", "--mps-dir", mps_dir.to_str().unwrap()]);
        }
        let d = Meshd::start(&args);
        let mb = d.mailbox();
        Self { d, mb, next: 0 }
    }

    /// A data channel and a knob channel holding one knob message.
    fn channels(&mut self, size: u32, knobs: [u8; 8]) -> (String, String) {
        self.channels_placed(size, knobs, "host")
    }

    /// A data channel of `placement` (host or device) and a host knob channel holding one knob message.
    fn channels_placed(&mut self, size: u32, knobs: [u8; 8], placement: &str) -> (String, String) {
        self.next += 1;
        let (data, knob) = (format!("c{}", self.next), format!("k{}", self.next));
        let (size, capacity) = (size.to_string(), CAPACITY.to_string());
        self.d.ok(&[
            "channel",
            "create",
            &data,
            "--msg-size",
            &size,
            "--capacity",
            &capacity,
            "--placement",
            placement,
        ]);
        self.d.ok(&["channel", "create", &knob, "--msg-size", "8", "--capacity", "2"]);
        Producer::claim(&self.mb, &knob).unwrap().send(&knobs, Duration::from_secs(1)).unwrap();
        (data, knob)
    }

    fn load(&self, name: &str, program: &str, warp: bool, binds: &[&str]) {
        let image = ptx_file(program);
        let mut args = vec!["load", name, &image, "--block", if warp { "32" } else { "1" }];
        for b in binds {
            args.extend(["--bind", b]);
        }
        self.d.ok(&args);
    }

    fn user_words(&self, name: &str) -> [u32; 32] {
        let rows: Vec<serde_json::Value> = serde_json::from_str(&self.d.ok(&["ps", "--json"])).unwrap();
        let row = rows.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{name} not in ps: {rows:?}"));
        assert_eq!(row["state"], "running", "{name}: {row}");
        self.mb.slot(u32::try_from(row["slot"].as_u64().unwrap()).unwrap()).unwrap().user_words()
    }

    /// Waits until sink `name` has passed `n` messages; asserts none failed and every relaunch resumed exactly.
    fn sink_passed(&self, name: &str, n: u64, what: &str) -> [u32; 32] {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let w = self.user_words(name);
            assert_eq!(
                w[user::ERRORS],
                0,
                "{what}: the sink found {} bad messages, the first at position {}",
                w[user::ERRORS],
                w[user::FIRST_BAD]
            );
            assert_eq!(w[user::RESUME], 0, "{what}: a relaunch resumed at a position other than the count kept");
            if user::count(&w) >= n {
                return w;
            }
            assert!(Instant::now() < deadline, "{what}: the sink passed {} of {n} messages", user::count(&w));
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The host producer of a host→GPU case: `n` stress messages, pausing after each when slow.
fn host_send(mb: &Mailbox, channel: &str, size: u32, n: u64, slow: bool) {
    let mut tx = Producer::claim(mb, channel).unwrap();
    let mut msg = vec![0u8; size as usize];
    for seq in 0..n {
        stress::fill(&mut msg, seq);
        tx.send(&msg, DEADLINE).unwrap();
        if slow {
            spin(PAUSE);
        }
    }
}

/// The host consumer of a GPU→host case: `n` messages, each checked, pausing after each when slow.
fn host_recv(mb: &Mailbox, channel: &str, size: u32, n: u64, slow: bool, what: &str) {
    let mut rx = Consumer::claim(mb, channel).unwrap();
    let mut msg = vec![0u8; size as usize];
    for seq in 0..n {
        rx.recv(&mut msg, DEADLINE).unwrap_or_else(|e| panic!("{what}: message {seq}: {e}"));
        stress::check(&msg, seq).unwrap_or_else(|e| panic!("{what}: {e}"));
        if slow {
            spin(PAUSE);
        }
    }
}

fn run_case(m: &mut Mesh, dir: Dir, size: u32, warp: bool, slow: Slow) {
    let n = messages(size, warp);
    let what = format!("{dir:?} {size} B {} slow {slow:?}", if warp { "warp" } else { "thread" });
    let gpu_pause = |gpu_end_is_slow: bool| if gpu_end_is_slow { u32::try_from(PAUSE.as_nanos()).unwrap() } else { 0 };
    let started = Instant::now();
    match dir {
        Dir::HostToGpu => {
            let (data, knob) = m.channels(size, stress::knobs(gpu_pause(slow == Slow::Consumer), 64, false));
            m.load("sink", "sink", warp, &[&data, &knob]);
            host_send(&m.mb, &data, size, n, slow == Slow::Producer);
            m.sink_passed("sink", n, &what);
            m.d.ok(&["unload", "sink"]);
        }
        Dir::GpuToHost => {
            let (data, knob) = m.channels(size, stress::knobs(gpu_pause(slow == Slow::Producer), 64, false));
            m.load("source", "source", warp, &[&data, &knob]);
            host_recv(&m.mb, &data, size, n, slow == Slow::Consumer, &what);
            m.d.ok(&["unload", "source"]);
        }
        Dir::GpuToGpu => {
            let (data, sink_knob) = m.channels(size, stress::knobs(gpu_pause(slow == Slow::Consumer), 64, false));
            let (_, source_knob) = m.channels(8, stress::knobs(gpu_pause(slow == Slow::Producer), 64, false));
            m.load("sink", "sink", warp, &[&data, &sink_knob]);
            m.load("source", "source", warp, &[&data, &source_knob]);
            m.sink_passed("sink", n, &what);
            m.d.ok(&["unload", "source"]);
            m.d.ok(&["unload", "sink"]);
        }
    }
    eprintln!("channel-stress {what}: {n} messages checked in {:?}", started.elapsed());
}

fn every_case(mps: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(mps, dir.path());
    let mut cases = 0;
    for dir in [Dir::HostToGpu, Dir::GpuToHost, Dir::GpuToGpu] {
        for size in SIZES {
            for warp in [true, false] {
                for slow in [Slow::Consumer, Slow::Producer] {
                    run_case(&mut m, dir, size, warp, slow);
                    cases += 1;
                }
            }
        }
    }
    eprintln!("channel-stress {}: {cases} cases passed", if mps { "mps" } else { "blink" });
    m.d.ok(&["shutdown"]);
}

#[test]
fn every_direction_size_and_speed_blink() {
    require_gpu!("every_direction_size_and_speed_blink");
    every_case(false);
}

#[test]
fn every_direction_size_and_speed_mps() {
    require_gpu!("every_direction_size_and_speed_mps");
    every_case(true);
}

/// Streams through the GPU end while it is upgraded 20 times; nothing lost, repeated, reordered or torn.
fn upgrades(mps: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(mps, dir.path());
    let mode = if mps { "mps" } else { "blink" };
    for size in SIZES {
        for gpu_dir in [Dir::HostToGpu, Dir::GpuToHost, Dir::GpuToGpu] {
            let what = format!("{mode} {gpu_dir:?} {size} B, 20 upgrades");
            let (data, knob) = m.channels(size, stress::knobs(0, 64, false));
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let upgraded = match gpu_dir {
                Dir::HostToGpu | Dir::GpuToGpu => "sink",
                Dir::GpuToHost => "source",
            };
            let host = match gpu_dir {
                Dir::HostToGpu => {
                    m.load("sink", "sink", true, &[&data, &knob]);
                    let (mb, stop, done) = (m.mb.clone(), stop.clone(), done.clone());
                    Some(std::thread::spawn(move || {
                        let mut tx = Producer::claim(&mb, &data).unwrap();
                        let mut msg = vec![0u8; size as usize];
                        let mut seq = 0;
                        while !stop.load(Ordering::Relaxed) {
                            stress::fill(&mut msg, seq);
                            tx.send(&msg, DEADLINE).unwrap();
                            seq += 1;
                            done.store(seq, Ordering::Release);
                        }
                    }))
                }
                Dir::GpuToHost => {
                    m.load("source", "source", true, &[&data, &knob]);
                    let (mb, stop, done, what) = (m.mb.clone(), stop.clone(), done.clone(), what.clone());
                    Some(std::thread::spawn(move || {
                        let mut rx = Consumer::claim(&mb, &data).unwrap();
                        let mut msg = vec![0u8; size as usize];
                        let mut seq = 0;
                        while !stop.load(Ordering::Relaxed) {
                            rx.recv(&mut msg, DEADLINE).unwrap_or_else(|e| panic!("{what}: message {seq}: {e}"));
                            stress::check(&msg, seq).unwrap_or_else(|e| panic!("{what}: {e}"));
                            seq += 1;
                            done.store(seq, Ordering::Release);
                        }
                    }))
                }
                Dir::GpuToGpu => {
                    let (_, source_knob) = m.channels(8, stress::knobs(0, 64, false));
                    m.load("sink", "sink", true, &[&data, &knob]);
                    m.load("source", "source", true, &[&data, &source_knob]);
                    None
                }
            };
            let started = Instant::now();
            let progress = |m: &Mesh| match gpu_dir {
                Dir::GpuToGpu => user::count(&m.user_words("sink")),
                _ => done.load(Ordering::Acquire),
            };
            for k in 0..20 {
                // Traffic must flow between upgrades: each one lands mid-stream.
                let before = progress(&m);
                assert!(
                    wait_until(DEADLINE, || progress(&m) > before + u64::from(CAPACITY)),
                    "{what}: no traffic before upgrade {k}"
                );
                m.d.ok(&["upgrade", upgraded, &ptx_file(upgraded)]);
            }
            stop.store(true, Ordering::Relaxed);
            if let Some(t) = host {
                t.join().unwrap_or_else(|_| panic!("{what}: the host end failed its check"));
            }
            let total = progress(&m);
            if gpu_dir != Dir::GpuToHost {
                let w = m.sink_passed("sink", total, &what);
                assert!(w[user::LAUNCHES] >= 21, "{what}: the sink was launched {} times", w[user::LAUNCHES]);
            } else {
                let w = m.user_words("source");
                assert!(w[user::LAUNCHES] >= 21, "{what}: the source was launched {} times", w[user::LAUNCHES]);
            }
            eprintln!("channel-upgrades {what}: {total} messages checked in {:?}", started.elapsed());
            if gpu_dir == Dir::GpuToGpu {
                m.d.ok(&["unload", "source"]);
            }
            m.d.ok(&["unload", upgraded]);
        }
    }
    m.d.ok(&["shutdown"]);
}

#[test]
fn twenty_upgrades_lose_nothing_blink() {
    require_gpu!("twenty_upgrades_lose_nothing_blink");
    upgrades(false);
}

#[test]
fn twenty_upgrades_lose_nothing_mps() {
    require_gpu!("twenty_upgrades_lose_nothing_mps");
    upgrades(true);
}

/// A device channel between two GPU programs, each end upgraded 20 times mid-stream (alternately): every
/// message sequence-checked and checksummed by the sink, every relaunch resuming exactly; a host
/// process is refused either end, with the reason.
#[test]
fn device_channel_survives_twenty_upgrades_of_each_end() {
    require_gpu!("device_channel_survives_twenty_upgrades_of_each_end");
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(false, dir.path());
    for size in [8u32, 64, 1024, 4096] {
        let what = format!("device channel {size} B, 20 upgrades of each end");
        let (data, knob) = m.channels_placed(size, stress::knobs(0, 64, false), "device");
        let (_, source_knob) = m.channels(8, stress::knobs(0, 64, false));
        m.load("sink", "sink", true, &[&data, &knob]);
        m.load("source", "source", true, &[&data, &source_knob]);
        let started = Instant::now();
        for k in 0..40 {
            let before = user::count(&m.user_words("sink"));
            assert!(
                wait_until(DEADLINE, || user::count(&m.user_words("sink")) > before + u64::from(CAPACITY)),
                "{what}: no traffic before upgrade {k}"
            );
            let end = if k % 2 == 0 { "sink" } else { "source" };
            m.d.ok(&["upgrade", end, &ptx_file(end)]);
        }
        let total = user::count(&m.user_words("sink"));
        let w = m.sink_passed("sink", total + 1000, &what);
        assert!(w[user::LAUNCHES] >= 21, "{what}: the sink was launched {} times", w[user::LAUNCHES]);
        let s = m.user_words("source");
        assert!(s[user::LAUNCHES] >= 21, "{what}: the source was launched {} times", s[user::LAUNCHES]);
        eprintln!("channel-device {what}: {} messages checked in {:?}", user::count(&w), started.elapsed());
        if size == 8 {
            for e in [Producer::claim(&m.mb, &data).unwrap_err(), Consumer::claim(&m.mb, &data).unwrap_err()] {
                assert!(e.to_string().contains("device memory"), "a host end of a device channel: {e}");
            }
            let refused = m.d.refused(&["send", &data, "12345678"]);
            assert!(refused.contains("device memory") && refused.contains("--placement host"), "{refused}");
        }
        m.d.ok(&["unload", "source"]);
        m.d.ok(&["unload", "sink"]);
    }
    let info = m.d.ok(&["info"]);
    assert!(info.contains("\"placement\": \"device\""), "info names the placement: {info}");
    m.d.ok(&["shutdown"]);
}

/// The channel's row in `meshd info`: (head, tail, lost).
fn channel_row(d: &Meshd, name: &str) -> (u64, u64, u64) {
    let info: serde_json::Value = serde_json::from_str(&d.ok(&["info"])).unwrap();
    let row = info["channels"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned();
    let row = row.unwrap_or_else(|| panic!("{name} not in info: {info}"));
    (row["head"].as_u64().unwrap(), row["tail"].as_u64().unwrap(), row["lost"].as_u64().unwrap())
}

/// meshd killed with SIGKILL while a device ring holds messages: the new meshd makes the ring anew,
/// empty, and `info` and the log say exactly how many messages were lost (a full ring: its capacity).
#[test]
fn a_device_rings_loss_after_a_crash_is_reported_exactly() {
    require_gpu!("a_device_rings_loss_after_a_crash_is_reported_exactly");
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(false, dir.path());
    let (data, knob) = m.channels_placed(64, stress::knobs(0, 64, false), "device");
    // A source and no consumer: the ring fills, and a full ring makes the producer publish its head.
    m.load("source", "source", true, &[&data, &knob]);
    let full = u64::from(CAPACITY);
    assert!(wait_until(DEADLINE, || channel_row(&m.d, &data) == (full, 0, 0)), "{:?}", channel_row(&m.d, &data));
    m.d.kill9_and_restart();
    // The source runs again (recorded state) on a new, empty ring and fills it once more.
    assert!(
        wait_until(DEADLINE, || channel_row(&m.d, &data) == (2 * full, full, full)),
        "head, tail, lost: {:?}; log:\n{}",
        channel_row(&m.d, &data),
        m.d.log_text()
    );
    let log = m.d.log_text();
    assert!(log.contains(&format!("{full} messages lost")), "the log says what was lost:\n{log}");
    m.d.ok(&["shutdown"]);
}

/// In MPS mode device channels are served by default (meshd's own context owns the rings; every
/// worker maps them): one is created without any option, `info` lists it, and a host end is refused.
/// (Only a compute mode that refuses meshd's context refuses them; mps_device.rs moves data on them.)
#[test]
fn device_channels_are_served_in_mps_mode_by_default() {
    require_gpu!("device_channels_are_served_in_mps_mode_by_default");
    let dir = tempfile::tempdir().unwrap();
    let m = Mesh::start(true, dir.path());
    m.d.ok(&["channel", "create", "d", "--msg-size", "8", "--capacity", "4", "--placement", "device"]);
    let info = m.d.ok(&["info"]);
    assert!(info.contains("\"placement\": \"device\""), "info names the placement: {info}");
    let e = Consumer::claim(&m.mb, "d").unwrap_err();
    assert!(e.to_string().contains("device memory"), "a host end of a device channel: {e}");
    m.d.ok(&["shutdown"]);
}

/// Host→host through the same rings (no GPU): every size, both speed orders, thousands of laps.
#[test]
fn host_to_host_every_size_and_speed() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(
        dir.path().join("mb"),
        &MailboxConfig { size: 8 << 20, slots: 1, channels: 16 },
        CreateMode::Exclusive,
    )
    .unwrap();
    for size in SIZES {
        for slow in [Slow::Consumer, Slow::Producer] {
            let name = format!("h{size}{slow:?}");
            mb.create_channel(&name, size, CAPACITY).unwrap();
            let n = 20_000;
            let (mb2, name2) = (mb.clone(), name.clone());
            let producer = std::thread::spawn(move || host_send(&mb2, &name2, size, n, slow == Slow::Producer));
            host_recv(&mb, &name, size, n, slow == Slow::Consumer, &format!("host→host {size} B slow {slow:?}"));
            producer.join().unwrap();
        }
    }
}
