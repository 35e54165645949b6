//! Large messages through bulk channels (protocol bulk) on the GPU, end to end through meshd: host→GPU, GPU→host, GPU→GPU (host and device placement, 1 and 8 blocks) and a round trip through `bulk_echo`, 64 KiB to 16 MiB, in blink and MPS mode; a device channel through upgrades of both ends.
//!
//! Every message is checked for its sequence number and a checksum over every byte (stress.cuh's
//! format, filled and checked by a whole block in place: bulk_stress.cuh). They print SKIPPED without
//! `MESH_GPU_TESTS=1`. Sized to keep `./run tests` within 6 minutes on the H200: every direction and
//! size class once, a few ring laps each, 5 upgrades of each end. (The first GPU run, 2026-12-03,
//! waited out two deadlines: the sink published its count every 16th message only, so a stream of
//! 200 showed 192 until the sink stopped; it now also publishes whenever it finds its ring empty.)

use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::stress::{self, bulk};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};
use mesh_shm::{BulkConsumer, BulkProducer, Mailbox, Producer};

const DEADLINE: Duration = Duration::from_secs(60);
/// Threads per block of the bulk programs.
const BLOCK: &str = "1024";

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// Messages per case at `size`: many laps of the ring (4 at 16 MiB), well under a second of traffic.
/// Not multiples of the sink's batch of 16, so that a count published only in batches would show.
fn messages(size: u32) -> u64 {
    match size {
        s if s <= 64 << 10 => 1000,
        s if s <= 1 << 20 => 100,
        _ => 8,
    }
}

/// Ring capacity at `size` (the mailbox holds every channel a run creates).
fn capacity(size: u32) -> u32 {
    if size >= 16 << 20 { 2 } else { 4 }
}

struct Mesh {
    d: Meshd,
    mb: Mailbox,
    next: u32,
}

impl Mesh {
    fn start(mps: bool, dir: &std::path::Path) -> Self {
        let mut args = vec!["--channels", "256", "--shm-size", "640M"];
        let mps_dir = dir.join("mps");
        if mps {
            args.extend(["--isolation", "mps", "--pool", "4", "--mps-dir", mps_dir.to_str().unwrap()]);
        }
        let d = Meshd::start(&args);
        let mb = d.mailbox();
        Self { d, mb, next: 0 }
    }

    /// A new bulk channel of `size`-byte messages.
    fn bulk(&mut self, size: u32, placement: &str) -> String {
        self.next += 1;
        let name = format!("b{}", self.next);
        let (size, cap) = (size.to_string(), capacity(size).to_string());
        let out = self.d.ok(&[
            "channel",
            "create",
            &name,
            "--msg-size",
            &size,
            "--capacity",
            &cap,
            "--placement",
            placement,
            "--protocol",
            "bulk",
        ]);
        assert!(out.contains("protocol bulk"), "{out}");
        name
    }

    /// A knob channel holding one knob message (an LL channel of 8 bytes, host placement).
    fn knob(&mut self, knobs: [u8; 8]) -> String {
        self.next += 1;
        let name = format!("k{}", self.next);
        self.d.ok(&["channel", "create", &name, "--msg-size", "8", "--capacity", "2"]);
        Producer::claim(&self.mb, &name).unwrap().send(&knobs, Duration::from_secs(1)).unwrap();
        name
    }

    fn load(&self, name: &str, program: &str, grid: u32, binds: &[&str]) {
        let (image, grid) = (ptx_file(program), grid.to_string());
        let mut args = vec!["load", name, &image, "--grid", &grid, "--block", BLOCK];
        for b in binds {
            args.extend(["--bind", b]);
        }
        self.d.ok(&args);
    }

    fn user_words(&self, name: &str) -> [u32; 32] {
        self.d.user_words(&self.mb, name)
    }

    /// Waits until every block of sink `name` has passed `n` messages; asserts none failed and every
    /// relaunch resumed exactly. The smallest count.
    fn sink_passed(&self, name: &str, blocks: u32, n: u64, what: &str) -> u64 {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let w = self.user_words(name);
            for b in 0..blocks {
                let (failed, resumed_elsewhere) = bulk::bad(&w, b);
                assert_eq!(failed, 0, "{what}: block {b} of the sink found {failed} bad messages");
                assert_eq!(resumed_elsewhere, 0, "{what}: block {b} resumed at a position other than its count");
            }
            let least = (0..blocks).map(|b| bulk::count(&w, b)).min().unwrap();
            if least >= n {
                return least;
            }
            assert!(Instant::now() < deadline, "{what}: the sink's slowest block passed {least} of {n} messages");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn host_send(mb: &Mailbox, channel: &str, size: u32, n: u64) {
    let mut tx = BulkProducer::claim(mb, channel).unwrap();
    let mut msg = vec![0u8; size as usize];
    for seq in 0..n {
        stress::fill(&mut msg, seq);
        tx.send(&msg, DEADLINE).unwrap();
    }
}

fn host_recv(mb: &Mailbox, channel: &str, size: u32, n: u64, what: &str) {
    let mut rx = BulkConsumer::claim(mb, channel).unwrap();
    let mut msg = vec![0u8; size as usize];
    for seq in 0..n {
        rx.recv(&mut msg, DEADLINE).unwrap_or_else(|e| panic!("{what}: message {seq}: {e}"));
        stress::check(&msg, seq).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

fn host_to_gpu(m: &mut Mesh, size: u32, what: &str) {
    let n = messages(size);
    let (data, knob) = (m.bulk(size, "host"), m.knob(stress::knobs(0, 1, false)));
    m.load("sink", "bulk_sink", 1, &[&data, &knob]);
    host_send(&m.mb, &data, size, n);
    m.sink_passed("sink", 1, n, what);
    m.d.ok(&["unload", "sink"]);
}

fn gpu_to_host(m: &mut Mesh, size: u32, what: &str) {
    let (data, knob) = (m.bulk(size, "host"), m.knob(stress::knobs(0, 1, false)));
    m.load("source", "bulk_source", 1, &[&data, &knob]);
    host_recv(&m.mb, &data, size, messages(size), what);
    m.d.ok(&["unload", "source"]);
}

/// A source and a sink of `blocks` blocks each, block b on channel b.
fn gpu_to_gpu(m: &mut Mesh, size: u32, placement: &str, blocks: u32, what: &str) {
    let data: Vec<String> = (0..blocks).map(|_| m.bulk(size, placement)).collect();
    let (sink_knob, source_knob) = (m.knob(stress::knobs(0, 1, false)), m.knob(stress::knobs(0, 1, false)));
    // The knobs go after the data channels, where there is a binding left (8 blocks take all 8).
    let with = |knob: &str| {
        let mut binds: Vec<String> = data.clone();
        if blocks < 8 {
            binds.push(knob.to_string());
        }
        binds
    };
    let (sink_binds, source_binds) = (with(&sink_knob), with(&source_knob));
    m.load("sink", "bulk_sink", blocks, &sink_binds.iter().map(String::as_str).collect::<Vec<_>>());
    m.load("source", "bulk_source", blocks, &source_binds.iter().map(String::as_str).collect::<Vec<_>>());
    m.sink_passed("sink", blocks, messages(size), what);
    m.d.ok(&["unload", "source"]);
    m.d.ok(&["unload", "sink"]);
}

/// Host → bulk_echo → host: every message back whole, in order.
fn echo(m: &mut Mesh, size: u32, what: &str) {
    let n = messages(size);
    let (to, from) = (m.bulk(size, "host"), m.bulk(size, "host"));
    m.load("echo", "bulk_echo", 1, &[&to, &from]);
    std::thread::scope(|s| {
        let mb = m.mb.clone();
        s.spawn(move || host_send(&mb, &to, size, n));
        host_recv(&m.mb, &from, size, n, what);
    });
    m.d.ok(&["unload", "echo"]);
}

fn host_channels(mps: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(mps, dir.path());
    let mode = if mps { "mps" } else { "blink" };
    for size in [64u32 << 10, 1 << 20, 16 << 20] {
        let started = Instant::now();
        host_to_gpu(&mut m, size, &format!("{mode} host→GPU {size} B"));
        gpu_to_host(&mut m, size, &format!("{mode} GPU→host {size} B"));
        gpu_to_gpu(&mut m, size, "host", 1, &format!("{mode} GPU→GPU host channel {size} B"));
        echo(&mut m, size, &format!("{mode} host→echo→host {size} B"));
        eprintln!("large {mode} {size} B: 4 cases, {} messages each, in {:?}", messages(size), started.elapsed());
    }
    gpu_to_gpu(&mut m, 1 << 20, "host", 8, &format!("{mode} GPU→GPU host channels, 8 blocks, 1 MiB"));
    let info = m.d.ok(&["info"]);
    assert!(info.contains("\"protocol\": \"bulk\""), "info names the protocol: {info}");
    m.d.ok(&["shutdown"]);
}

#[test]
fn bulk_host_channels_every_direction_blink() {
    require_gpu!("bulk_host_channels_every_direction_blink");
    host_channels(false);
}

#[test]
fn bulk_host_channels_every_direction_mps() {
    require_gpu!("bulk_host_channels_every_direction_mps");
    host_channels(true);
}

/// Device channels (blink mode): GPU→GPU at every size, 1 and 8 blocks; a host end is refused.
#[test]
fn bulk_device_channels_gpu_to_gpu_blink() {
    require_gpu!("bulk_device_channels_gpu_to_gpu_blink");
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(false, dir.path());
    for size in [64u32 << 10, 1 << 20, 16 << 20] {
        gpu_to_gpu(&mut m, size, "device", 1, &format!("GPU→GPU device channel {size} B"));
    }
    gpu_to_gpu(&mut m, 1 << 20, "device", 8, "GPU→GPU device channels, 8 blocks, 1 MiB");
    let data = m.bulk(64 << 10, "device");
    for e in [BulkProducer::claim(&m.mb, &data).unwrap_err(), BulkConsumer::claim(&m.mb, &data).unwrap_err()] {
        assert!(e.to_string().contains("device memory"), "a host end of a device channel: {e}");
    }
    m.d.ok(&["shutdown"]);
}

/// A device bulk channel, each end upgraded 5 times mid-stream (alternately): every message checked
/// by the sink, every relaunch resuming exactly where the last launch stopped.
#[test]
fn bulk_device_channel_survives_upgrades_of_each_end() {
    require_gpu!("bulk_device_channel_survives_upgrades_of_each_end");
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(false, dir.path());
    let size = 64u32 << 10;
    let what = "device bulk channel 64 KiB, 5 upgrades of each end";
    let data = m.bulk(size, "device");
    let (sink_knob, source_knob) = (m.knob(stress::knobs(0, 1, false)), m.knob(stress::knobs(0, 1, false)));
    m.load("sink", "bulk_sink", 1, &[&data, &sink_knob]);
    m.load("source", "bulk_source", 1, &[&data, &source_knob]);
    let count = |m: &Mesh| bulk::count(&m.user_words("sink"), 0);
    for k in 0..10 {
        let before = count(&m);
        assert!(
            wait_until(DEADLINE, || count(&m) > before + u64::from(capacity(size))),
            "{what}: no traffic before upgrade {k}"
        );
        let end = if k % 2 == 0 { "sink" } else { "source" };
        let program = if end == "sink" { "bulk_sink" } else { "bulk_source" };
        m.d.ok(&["upgrade", end, &ptx_file(program)]);
    }
    let total = count(&m);
    m.sink_passed("sink", 1, total + 500, what);
    let (sink, source) = (m.user_words("sink"), m.user_words("source"));
    assert!(sink[bulk::LAUNCHES] >= 6, "{what}: the sink was launched {} times", sink[bulk::LAUNCHES]);
    assert!(source[bulk::LAUNCHES] >= 6, "{what}: the source was launched {} times", source[bulk::LAUNCHES]);
    m.d.ok(&["shutdown"]);
}
