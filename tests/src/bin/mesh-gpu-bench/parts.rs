//! One bulk channel split into parts (`mesh-gpu-bench parts blink|mps`): P parts served by B = P blocks each end, beside a plain copy kernel (`copy_blocks`) with the same B blocks in the same run.
//!
//! * B = 1, 2, 4, 8, 16, 32 blocks of 1024 threads, at 1 MiB (capacity 8) and 16 MiB (capacity 4,
//!   in a mailbox of its own), each size and B on a fresh channel of B parts;
//! * copy path (STRESS_FIXED knob): the source's blocks copy their shares of one buffer into the ring
//!   (`mesh_block_try_send`), the sink's copy them out into one (`mesh_block_try_recv`), unchecked:
//!   two copies per message;
//! * fill+check path: the source fills every word in place, the sink checks every word in place;
//! * plain copy: `copy_blocks`, B blocks copying one channel's slot 0 into another's, each a
//!   contiguous 1/B share with `mesh_block_copy` (the channel's copy loop without the ring): one copy;
//!   the copy path's baseline;
//! * plain fill‖check: `fill_blocks` (B blocks filling one channel's slots, slot after slot, with the
//!   pattern) and `check_blocks` (B blocks checking another's, loading through L2 as a sink must)
//!   running side by side, the same 2B blocks, the same per-word work and together the same memory
//!   as the fill+check path, without the ring; its rate is the slower side's. The fill+check path's
//!   baseline (not the plain copy, which is other work; not a re-read of one share, which L1 serves
//!   faster than any transfer between SMs);
//! * device channels in blink mode (ring and copy buffers in GPU memory), host channels in MPS mode.
//!
//! Each measurement: warm-up, then about a second of the programs' per-block counts (user word b,
//! low 24 bits, bulk_parts.cuh), sampled every 20 ms so the 24-bit counts cannot wrap unseen. GB/s of
//! payload: the bytes of the shares counted over the seconds.

use std::time::{Duration, Instant};

use mesh_backend::{LaunchShape, ProgramSpec};
use mesh_gpu_tests::stress;
use mesh_gpu_tests::{program, wait_until};
use mesh_shm::{Placement, Producer, Protocol};

use crate::roundtrip::Bench;

const BLOCKS: [u32; 6] = [1, 2, 4, 8, 16, 32];
const SIZE: u32 = 1 << 20;
const CAPACITY: u32 = 8;
const BIG: u32 = 16 << 20;
const BIG_CAPACITY: u32 = 4;
const BLOCK: u32 = 1024;
/// bulk_parts.cuh's PARTS_COUNT_MASK and PARTS_BAD_SHIFT.
const COUNT_MASK: u32 = 0xff_ffff;
const BAD_SHIFT: u32 = 24;
const WINDOW: Duration = Duration::from_secs(1);
const SAMPLE: Duration = Duration::from_millis(20);

struct Parts {
    b: Bench,
    next: u32,
    placement: Placement,
}

impl Parts {
    fn channel(&mut self, size: u32, capacity: u32, placement: Placement, protocol: Protocol, parts: u32) -> String {
        self.next += 1;
        let name = format!("P{}", self.next);
        self.b
            .mb
            .create_channel_parts(&name, size, capacity, placement, protocol, parts)
            .unwrap_or_else(|e| panic!("channel {name}: {size} B, capacity {capacity}, {parts} parts: {e}"));
        name
    }

    /// A knob channel holding the FIXED knob: the source sends one buffer, the sink copies out unchecked.
    fn fixed_knob(&mut self) -> String {
        let name = self.channel(8, 2, Placement::Host, Protocol::Ll, 1);
        Producer::claim(&self.b.mb, &name).unwrap().send(&stress::knobs(0, 1, true), Duration::from_secs(1)).unwrap();
        name
    }

    fn load(&mut self, name: &str, program_name: &str, blocks: u32, channels: &[String]) -> u32 {
        let mut spec = ProgramSpec::new(name, program(program_name)).unwrap();
        spec.shape = LaunchShape { grid: [blocks, 1, 1], block: [BLOCK, 1, 1], shared_mem: 0 };
        spec.bindings = channels.to_vec();
        self.b.backend.load(spec).unwrap_or_else(|e| panic!("load {program_name} ({blocks} blocks): {e}")).slot
    }

    fn words(&self, slot: u32, blocks: u32) -> Vec<u32> {
        self.b.mb.slot(slot).unwrap().user_words()[..blocks as usize].to_vec()
    }

    /// Waits until every one of the `blocks` blocks of the program in `slot` has counted `n`.
    fn warm(&self, slot: u32, blocks: u32, n: u32, what: &str) {
        let ok = wait_until(Duration::from_secs(30), || self.words(slot, blocks).iter().all(|w| w & COUNT_MASK >= n));
        assert!(ok, "{what}: no traffic; user words 0..{blocks}: {:x?}", self.words(slot, blocks));
    }

    /// GB/s of the shares (`share` bytes each) the program in `slot` counts over about WINDOW.
    fn rate(&self, slot: u32, blocks: u32, share: u32) -> f64 {
        let mut last = self.words(slot, blocks);
        let t = Instant::now();
        let mut shares = 0u64;
        while t.elapsed() < WINDOW {
            std::thread::sleep(SAMPLE);
            let now = self.words(slot, blocks);
            shares += now.iter().zip(&last).map(|(n, l)| u64::from(n.wrapping_sub(*l) & COUNT_MASK)).sum::<u64>();
            last = now;
        }
        shares as f64 * f64::from(share) / t.elapsed().as_secs_f64() / 1e9
    }

    /// `bulk_parts_source` → `bulk_parts_sink` on a fresh channel of `blocks` parts, `blocks` blocks
    /// each end. GB/s of payload through the sink.
    fn channel_rate(&mut self, size: u32, capacity: u32, blocks: u32, fixed: bool) -> f64 {
        let what = format!("parts channel {size} B, {blocks} parts and blocks, fixed {fixed}");
        let data = self.channel(size, capacity, self.placement, Protocol::Bulk, blocks);
        let (mut sink_binds, mut source_binds) = (vec![data.clone()], vec![data]);
        if fixed {
            sink_binds.push(self.fixed_knob());
            source_binds.push(self.fixed_knob());
        }
        // `--variant _x_NAME`: bulk_parts_sink_x_NAME / bulk_parts_source_x_NAME instead (the same
        // programs built with another of mesh.cuh's knobs).
        let variant = crate::opt("variant").unwrap_or_default();
        let slot = self.load("sink", &format!("bulk_parts_sink{variant}"), blocks, &sink_binds);
        self.load("source", &format!("bulk_parts_source{variant}"), blocks, &source_binds);
        self.warm(slot, blocks, 4 * capacity, &what);
        let gbs = self.rate(slot, blocks, size / blocks);
        let w = self.words(slot, blocks);
        self.b.backend.unload("source").unwrap();
        self.b.backend.unload("sink").unwrap();
        for (b, word) in w.iter().enumerate() {
            assert_eq!(word >> BAD_SHIFT, 0, "{what}: sink block {b}: user word {b} read {word:#010x} (bad shares)");
        }
        gbs
    }

    /// `fill_blocks` on `a`'s slots and `check_blocks` on `b`'s, `blocks` blocks each, side by side:
    /// GB/s of the slower side (a message moves only as fast as both its fill and its check).
    fn fill_check_rate(&mut self, size: u32, blocks: u32, a: &str, b: &str) -> f64 {
        let what = format!("fill_blocks + check_blocks {size} B, {blocks} blocks");
        let fill = self.load("fill", "fill_blocks", blocks, &[a.to_string()]);
        let check = self.load("check", "check_blocks", blocks, &[b.to_string()]);
        self.warm(fill, blocks, 16, &what);
        self.warm(check, blocks, 16, &what);
        // Both sampled over the same window, interleaved, so each sees the other's load.
        let (mut last_f, mut last_c) = (self.words(fill, blocks), self.words(check, blocks));
        let t = Instant::now();
        let (mut filled, mut checked) = (0u64, 0u64);
        let delta = |now: &[u32], last: &[u32]| -> u64 {
            now.iter().zip(last).map(|(n, l)| u64::from(n.wrapping_sub(*l) & COUNT_MASK)).sum()
        };
        while t.elapsed() < WINDOW {
            std::thread::sleep(SAMPLE);
            let (now_f, now_c) = (self.words(fill, blocks), self.words(check, blocks));
            filled += delta(&now_f, &last_f);
            checked += delta(&now_c, &last_c);
            (last_f, last_c) = (now_f, now_c);
        }
        let secs = t.elapsed().as_secs_f64();
        let w = self.words(check, blocks);
        self.b.backend.unload("check").unwrap();
        self.b.backend.unload("fill").unwrap();
        for (i, word) in w.iter().enumerate() {
            assert_eq!(word >> BAD_SHIFT, 0, "{what}: check block {i}: user word {i} read {word:#010x} (bad shares)");
        }
        filled.min(checked) as f64 * f64::from(size / blocks) / secs / 1e9
    }

    /// `copy_blocks` with `blocks` blocks from `from`'s slot 0 into `to`'s. GB/s copied.
    fn copy_rate(&mut self, size: u32, blocks: u32, from: &str, to: &str) -> f64 {
        let slot = self.load("copy", "copy_blocks", blocks, &[from.to_string(), to.to_string()]);
        self.warm(slot, blocks, 16, &format!("copy_blocks {size} B, {blocks} blocks"));
        let gbs = self.rate(slot, blocks, size / blocks);
        self.b.backend.unload("copy").unwrap();
        gbs
    }
}

/// The rows of one size: every B, each path beside its own baseline measured just before it (the
/// copy path beside the plain copy, the fill+check path beside the plain fill‖check).
fn rows(p: &mut Parts, size: u32, capacity: u32) {
    // The baselines use two channels of one part, half the measured channel's capacity each: the copy
    // reads and writes their slot 0; fill‖check cycles through every slot of one each, so that together
    // they touch as much memory as the measured ring (at 16 MiB, 64 MiB: more than the H200's L2).
    let from = p.channel(size, (capacity / 2).max(1), p.placement, Protocol::Bulk, 1);
    let to = p.channel(size, (capacity / 2).max(1), p.placement, Protocol::Bulk, 1);
    for blocks in bench_blocks() {
        for fixed in [true, false] {
            let (plain, baseline) = if fixed {
                (p.copy_rate(size, blocks, &from, &to), "plain copy")
            } else {
                (p.fill_check_rate(size, blocks, &from, &to), "plain fill‖check")
            };
            let gbs = p.channel_rate(size, capacity, blocks, fixed);
            let path = if fixed { "copy" } else { "fill+check" };
            println!("| {size} | {blocks} | {path} | {gbs:.1} | {baseline} | {plain:.1} | {:.2} |", gbs / plain);
            let variant = crate::opt("variant").map_or(String::new(), |v| format!(" ({v})"));
            let figure = format!("{path}{variant}, {}, {size} B, {blocks} blocks", p.b.mode);
            crate::results::record("parts", &figure, gbs, "GB/s", Some((baseline, plain)), None);
        }
    }
}

/// The B of every row: `--blocks` (say "16,32", for a short run) else BLOCKS.
fn bench_blocks() -> Vec<u32> {
    crate::opt_list("blocks").map_or_else(
        || BLOCKS.to_vec(),
        |v| {
            v.iter()
                .map(|b| {
                    b.parse()
                        .ok()
                        .filter(|b| BLOCKS.contains(b))
                        .unwrap_or_else(|| panic!("--blocks: {b:?} is not one of {BLOCKS:?}"))
                })
                .collect()
        },
    )
}

/// Whether `--sizes` (say "1M", for a short run; "1M,16M" when not given) names `label`.
fn bench_size(label: &str) -> bool {
    crate::opt_list("sizes").is_none_or(|v| v.iter().any(|s| s == label))
}

/// `mesh-gpu-bench parts MODE [--variant _x_NAME] [--blocks B,...] [--sizes 1M,16M]`.
pub fn parts_benches(mps: bool) {
    let mode = if mps { "mps" } else { "blink" };
    let placement = if mps { Placement::Host } else { Placement::Device };
    println!();
    println!(
        "Bulk channels of P parts, {mode} mode, {placement} channels: B = P blocks of {BLOCK} threads each end on ONE channel, each path beside the same work without the ring, with the same blocks, in {placement} memory, GB/s of payload:"
    );
    if let Some(variant) = crate::opt("variant") {
        println!("(programs: bulk_parts_source{variant} and bulk_parts_sink{variant})");
    }
    println!();
    println!("(copy: the source copies its shares of one buffer into the ring and the sink copies them out,");
    println!("unchecked: two copies per message, beside copy_blocks (one copy, B blocks); fill+check: the");
    println!("source fills every word in place and the sink checks every word in place, beside fill_blocks");
    println!("and check_blocks side by side (B blocks each, the slower side's rate). ratio: channel / baseline.)");
    println!();
    println!("| size | blocks | path | channel GB/s | baseline | baseline GB/s | ratio |");
    println!("|-----:|-------:|------|-------------:|----------|--------------:|------:|");
    // 1 MiB: 12 channels of 8 MiB, 2 of 2 MiB and 12 knobs (host channels in MPS mode) in 256 MiB.
    if bench_size("1M") {
        let mut p = Parts { b: Bench::open_sized(mps, 256 << 20), next: 0, placement };
        rows(&mut p, SIZE, CAPACITY);
        p.b.shutdown();
    }
    // 16 MiB in a mailbox of its own: 12 channels of 64 MiB and 2 of 32 MiB fit in 1.25 GiB.
    if bench_size("16M") {
        let mut p = Parts { b: Bench::open_sized(mps, 1280 << 20), next: 0, placement };
        rows(&mut p, BIG, BIG_CAPACITY);
        p.b.shutdown();
    }
}
