//! One bulk channel split into parts served by B blocks at a GPU end, end to end through meshd: a host `BulkProducer` into `bulk_parts_sink` and `bulk_parts_source` → `bulk_parts_sink`, parts 1, 4 and 32, then the same with four messages a call at each GPU end (`_x_batch4`, parts 4 and 32), in blink and MPS mode.
//!
//! Message seq's 4-byte word k is `stress_value(seq, k)` (bulk_parts.cuh: word 0 the low half of
//! seq, every other word [`stress::word`]); the sink's block b checks every word of its share of the
//! parts in place and keeps, in user word b, its count (low 24 bits) and the shares that failed
//! (high 8 bits). Every end uses B = parts blocks of 1024 threads on ONE binding. The channels are
//! made by meshd (`channel create --parts P`: `Mailbox::create_channel_parts` in meshd). They print
//! SKIPPED without `MESH_GPU_TESTS=1`. Written before the parts programs first ran on a GPU.

use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::stress;
use mesh_gpu_tests::{programs_dir, require_gpu};
use mesh_shm::BulkProducer;

const DEADLINE: Duration = Duration::from_secs(60);
/// Threads per block of the parts programs (a multiple of 32).
const BLOCK: &str = "1024";
/// Parts of the channel, and blocks per GPU end.
const PARTS: [u32; 3] = [1, 4, 32];
/// 1 MiB: a multiple of 16 × 32 (every part 16-byte aligned at 32 parts).
const SIZE: u32 = 1 << 20;
const CAPACITY: u32 = 4;
/// Messages per case: 25 laps of the ring; not a multiple of the sink's batch of 16.
const MESSAGES: u64 = 100;
/// bulk_parts.cuh's PARTS_COUNT_MASK and PARTS_BAD_SHIFT.
const COUNT_MASK: u32 = 0xff_ffff;
const BAD_SHIFT: u32 = 24;

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// Writes message `seq` as the parts programs do: word k is `stress_value(seq, k)` for every k.
#[allow(
    clippy::cast_possible_truncation,
    reason = "word 0 is the low half of seq, as the GPU writes it; k < a message's words, far below 2^32"
)]
fn parts_fill(buf: &mut [u8], seq: u64) {
    for (k, w) in buf.chunks_exact_mut(4).enumerate() {
        let v = if k == 0 { seq as u32 } else { stress::word(seq, k as u32) };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Block b's user word of a parts program: (count, bad).
fn split(word: u32) -> (u64, u32) {
    (u64::from(word & COUNT_MASK), word >> BAD_SHIFT)
}

struct Mesh {
    d: Meshd,
    mb: mesh_shm::Mailbox,
    next: u32,
}

impl Mesh {
    fn start(mps: bool, dir: &std::path::Path) -> Self {
        let mut args = vec!["--channels", "64", "--shm-size", "256M"];
        let mps_dir = dir.join("mps");
        if mps {
            args.extend(["--isolation", "mps", "--pool", "4", "--mps-dir", mps_dir.to_str().unwrap()]);
        }
        let d = Meshd::start(&args);
        let mb = d.mailbox();
        Self { d, mb, next: 0 }
    }

    /// A new bulk channel of SIZE-byte messages split into `parts` parts.
    fn channel(&mut self, parts: u32, placement: &str) -> String {
        self.next += 1;
        let name = format!("p{}", self.next);
        let (size, cap, parts_arg) = (SIZE.to_string(), CAPACITY.to_string(), parts.to_string());
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
            "--parts",
            &parts_arg,
        ]);
        assert!(out.contains("protocol bulk"), "parts {parts}: channel create said {out}");
        name
    }

    fn load(&self, name: &str, program: &str, blocks: u32, channel: &str) {
        let (image, grid) = (ptx_file(program), blocks.to_string());
        self.d.ok(&["load", name, &image, "--grid", &grid, "--block", BLOCK, "--bind", channel]);
    }

    fn user_words(&self, name: &str) -> [u32; 32] {
        self.d.user_words(&self.mb, name)
    }

    /// Waits until every one of the `blocks` blocks of sink `name` has passed `n` messages, asserting
    /// on every read that none found a bad share; `exact`: none may pass more than `n` (a host
    /// producer sent exactly `n`). The user words last read.
    fn sink_passed(&self, name: &str, blocks: u32, n: u64, exact: bool, what: &str) -> [u32; 32] {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let w = self.user_words(name);
            for b in 0..blocks {
                let (count, bad) = split(w[b as usize]);
                assert_eq!(
                    bad, 0,
                    "{what}: sink block {b} of {blocks} found {bad} bad shares (user word {b} read {:#010x}: count {count})",
                    w[b as usize]
                );
                assert!(
                    !exact || count <= n,
                    "{what}: sink block {b} of {blocks} counted {count} of {n} messages sent (user word {b} read {:#010x})",
                    w[b as usize]
                );
            }
            let (least, slowest) = (0..blocks).map(|b| (split(w[b as usize]).0, b)).min().unwrap();
            if least >= n {
                return w;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: sink block {slowest} of {blocks} passed {least} of {n} messages within {DEADLINE:?} (user word {slowest} read {:#010x}; words 0..{blocks}: {:x?})",
                w[slowest as usize],
                &w[..blocks as usize]
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// (a) A host producer (serving every part) into `bulk_parts_sink` of `parts` blocks: every block
/// counts exactly MESSAGES, none bad.
fn host_to_sink(m: &mut Mesh, parts: u32, mode: &str, variant: &str) {
    let what = format!("{mode} host→bulk_parts_sink{variant}, parts {parts}, {parts} blocks, {SIZE} B");
    let data = m.channel(parts, "host");
    m.load("sink", &format!("bulk_parts_sink{variant}"), parts, &data);
    {
        let mut tx = BulkProducer::claim(&m.mb, &data).unwrap_or_else(|e| panic!("{what}: claim: {e}"));
        let mut msg = vec![0u8; SIZE as usize];
        for seq in 0..MESSAGES {
            parts_fill(&mut msg, seq);
            tx.send(&msg, DEADLINE).unwrap_or_else(|e| panic!("{what}: message {seq}: {e}"));
        }
    }
    let w = m.sink_passed("sink", parts, MESSAGES, true, &what);
    for b in 0..parts {
        assert_eq!(
            split(w[b as usize]),
            (MESSAGES, 0),
            "{what}: sink block {b} of {parts}: user word {b} read {:#010x}, expected count {MESSAGES} and bad 0",
            w[b as usize]
        );
    }
    m.d.ok(&["unload", "sink"]);
}

/// (b) `bulk_parts_source` → `bulk_parts_sink`, `parts` blocks each end on one channel of `parts`
/// parts: fill in place, check every byte in place; the counts move and nothing is bad.
fn source_to_sink(m: &mut Mesh, parts: u32, placement: &str, mode: &str, variant: &str) {
    let what = format!(
        "{mode} bulk_parts_source{variant}→bulk_parts_sink{variant}, {placement} channel, parts {parts}, {parts} blocks each end, {SIZE} B"
    );
    let data = m.channel(parts, placement);
    m.load("sink", &format!("bulk_parts_sink{variant}"), parts, &data);
    m.load("source", &format!("bulk_parts_source{variant}"), parts, &data);
    let first = m.sink_passed("sink", parts, MESSAGES, false, &what);
    let least = (0..parts).map(|b| split(first[b as usize]).0).min().unwrap();
    // Still moving: another MESSAGES past the slowest block's count (far below the 24-bit wrap).
    let later = m.sink_passed("sink", parts, least + MESSAGES, false, &what);
    let source = m.user_words("source");
    for b in 0..parts {
        let (sent, _) = split(source[b as usize]);
        let passed = split(later[b as usize]).0;
        assert!(
            sent > 0,
            "{what}: source block {b} of {parts} reports nothing sent while sink block {b} passed {passed} (user word {b} read {:#010x})",
            source[b as usize]
        );
    }
    m.d.ok(&["unload", "source"]);
    m.d.ok(&["unload", "sink"]);
}

fn run(mps: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Mesh::start(mps, dir.path());
    let mode = if mps { "mps" } else { "blink" };
    // Device channels in blink mode (the parts' target); host channels in MPS mode, as large.rs.
    let placement = if mps { "host" } else { "device" };
    for parts in PARTS {
        let started = Instant::now();
        host_to_sink(&mut m, parts, mode, "");
        source_to_sink(&mut m, parts, placement, mode, "");
        eprintln!("parts {mode} P={parts}: host→sink and source→sink in {:?}", started.elapsed());
    }
    // Several messages a call at both ends (mesh_block_reserve_n / publish_n, peek_n / release_n: the
    // _x_batch4 programs, four a call), every byte checked in place as above.
    for parts in [4, 32] {
        host_to_sink(&mut m, parts, mode, "_x_batch4");
        source_to_sink(&mut m, parts, placement, mode, "_x_batch4");
        eprintln!("parts {mode} P={parts}, four messages a call: host→sink and source→sink passed");
    }
    let info = m.d.ok(&["info"]);
    assert!(info.contains("\"protocol\": \"bulk\""), "info names the protocol: {info}");
    m.d.ok(&["shutdown"]);
}

#[test]
fn bulk_parts_one_channel_many_blocks_blink() {
    require_gpu!("bulk_parts_one_channel_many_blocks_blink");
    run(false);
}

#[test]
fn bulk_parts_one_channel_many_blocks_mps() {
    require_gpu!("bulk_parts_one_channel_many_blocks_mps");
    run(true);
}
