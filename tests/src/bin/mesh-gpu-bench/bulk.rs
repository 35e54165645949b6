//! Large messages through bulk channels (`mesh-gpu-bench bulk blink|mps`), beside back-to-back cudaMemcpyAsync of the same sizes in the same run.
//!
//! * raw limits (blink run only: an MPS run's process holds no plain context): back-to-back
//!   `cuMemcpy*Async` host→device and device→host from pinned memory, and device→device, at 64 KiB,
//!   1 MiB and 16 MiB, 200 copies on one stream, per copy;
//! * host→GPU: a host `BulkProducer` (the default `claim`, which picks its copy settings by size,
//!   beside 1, 2, 4 (and 8 at 16 MiB) copy threads with plain or streaming stores) into
//!   `bulk_sink` (one block of 1024 threads copying each message out, FIXED knob: counted, not checked);
//! * GPU→host: `bulk_source` (FIXED: one buffer sent again and again) into a host `BulkConsumer`;
//! * GPU→GPU streaming: `bulk_source` → `bulk_sink`, 1 and 8 blocks per end (a channel per block),
//!   on device channels (blink) and host channels.
//!
//! * 16 MiB (capacity 4, in a mailbox of its own): the same rows, and the default host end's first lap
//!   over a fresh channel (pages never touched by the copy) beside its steady state.

use std::time::{Duration, Instant};

use cudarc::driver::sys;
use mesh_backend::{LaunchShape, ProgramSpec};
use mesh_gpu_tests::stress::{self, bulk};
use mesh_gpu_tests::{program, wait_until};
use mesh_shm::{BulkConsumer, BulkProducer, CopyConfig, Placement, Producer, Protocol};

use crate::roundtrip::Bench;

const SIZES: [u32; 2] = [64 << 10, 1 << 20];
const BIG: u32 = 16 << 20;
const CAPACITY: u32 = 8;
/// A 16 MiB channel holds 4 messages: 64 MiB a channel, 15 channels in the 16 MiB table.
const BIG_CAPACITY: u32 = 4;
const BLOCK: u32 = 1024;

fn check(what: &str, r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// Back-to-back async copies of `size` bytes: (host→device, device→host, device→device) µs per copy.
fn raw_copies(size: usize) -> (f64, f64, f64) {
    const COPIES: u32 = 200;
    let device = mesh_cuda::Device::get(0).unwrap();
    let ctx = mesh_cuda::Context::primary(&device).unwrap();
    ctx.bind().unwrap();
    let (mut host, mut a, mut b, mut stream) = (std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
    // SAFETY: out pointers and sizes; the context is current; everything is freed below.
    unsafe {
        check("cuMemHostAlloc", sys::cuMemHostAlloc(&mut host, size, 0));
        check("cuMemAlloc", sys::cuMemAlloc_v2(&mut a, size));
        check("cuMemAlloc", sys::cuMemAlloc_v2(&mut b, size));
        check("cuStreamCreate", sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32));
    }
    let time = |copy: &dyn Fn()| {
        copy();
        // SAFETY: a live stream of the current context.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(stream) });
        let t = Instant::now();
        for _ in 0..COPIES {
            copy();
        }
        // SAFETY: as above.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(stream) });
        t.elapsed().as_secs_f64() * 1e6 / f64::from(COPIES)
    };
    let h2d = time(&|| {
        // SAFETY: `host` is `size` pinned bytes, `a` `size` device bytes, both live until freed below.
        check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(a, host, size, stream) });
    });
    let d2h = time(&|| {
        // SAFETY: as above.
        check("cuMemcpyDtoHAsync", unsafe { sys::cuMemcpyDtoHAsync_v2(host, a, size, stream) });
    });
    let d2d = time(&|| {
        // SAFETY: `a` and `b` are `size` device bytes each, live until freed below.
        check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(b, a, size, stream) });
    });
    // SAFETY: allocated above, freed once, nothing in flight (synchronized).
    unsafe {
        sys::cuStreamDestroy_v2(stream);
        sys::cuMemFree_v2(a);
        sys::cuMemFree_v2(b);
        sys::cuMemFreeHost(host);
    }
    (h2d, d2h, d2d)
}

fn gbs(size: u32, us: f64) -> f64 {
    f64::from(size) / us / 1e3
}

struct Bulk {
    b: Bench,
    next: u32,
}

impl Bulk {
    fn channel(&mut self, size: u32, placement: Placement, protocol: Protocol) -> String {
        self.next += 1;
        let name = format!("L{}", self.next);
        let capacity = if size >= BIG { BIG_CAPACITY } else { CAPACITY };
        self.b.mb.create_channel_with(&name, size, capacity, placement, protocol).unwrap();
        name
    }

    /// A knob channel with the FIXED knob: sources send one buffer, sinks count without checking.
    fn fixed_knob(&mut self) -> String {
        let name = self.channel(8, Placement::Host, Protocol::Ll);
        Producer::claim(&self.b.mb, &name).unwrap().send(&stress::knobs(0, 1, true), Duration::from_secs(1)).unwrap();
        name
    }

    fn load(&mut self, name: &str, program_name: &str, blocks: u32, channels: &[String]) -> u32 {
        let mut spec = ProgramSpec::new(name, program(program_name)).unwrap();
        spec.shape = LaunchShape { grid: [blocks, 1, 1], block: [BLOCK, 1, 1], shared_mem: 0 };
        spec.bindings = channels.to_vec();
        self.b.backend.load(spec).unwrap_or_else(|e| panic!("load {program_name}: {e}")).slot
    }

    fn counts(&self, slot: u32, blocks: u32) -> u64 {
        let w = self.b.mb.slot(slot).unwrap().user_words();
        (0..blocks).map(|k| bulk::count(&w, k)).sum()
    }

    /// Host→GPU: `n` messages from a host producer copying with `config` (`None`: the default
    /// `claim`). GB/s of payload: (the first lap over the fresh ring, the steady state after warm-up).
    fn host_to_gpu(&mut self, size: u32, config: Option<CopyConfig>, n: u64) -> (f64, f64) {
        let data = self.channel(size, Placement::Host, Protocol::Bulk);
        let knob = self.fixed_knob();
        let slot = self.load("sink", "bulk_sink", 1, &[data.clone(), knob]);
        let mut tx = match config {
            Some(config) => BulkProducer::claim_with(&self.b.mb, &data, config).unwrap(),
            None => BulkProducer::claim(&self.b.mb, &data).unwrap(),
        };
        let msg = vec![7u8; size as usize];
        let lap = u64::from(self.b.mb.channel(&data).unwrap().capacity);
        let t = Instant::now();
        for _ in 0..lap {
            tx.send(&msg, Duration::from_secs(10)).unwrap();
        }
        let first = gbs(size, t.elapsed().as_secs_f64() * 1e6 / lap as f64);
        for _ in 0..n / 10 {
            tx.send(&msg, Duration::from_secs(10)).unwrap();
        }
        let (t, start) = (Instant::now(), self.counts(slot, 1));
        for _ in 0..n {
            tx.send(&msg, Duration::from_secs(10)).unwrap();
        }
        assert!(wait_until(Duration::from_secs(60), || self.counts(slot, 1) >= start + n), "the sink got them all");
        let took = t.elapsed();
        self.b.backend.unload("sink").unwrap();
        (first, gbs(size, took.as_secs_f64() * 1e6 / n as f64))
    }

    /// GPU→host: `n` messages into a host consumer copying with `config` (`None`: the default
    /// `claim`). GB/s of payload.
    fn gpu_to_host(&mut self, size: u32, config: Option<CopyConfig>, n: u64) -> f64 {
        let data = self.channel(size, Placement::Host, Protocol::Bulk);
        let knob = self.fixed_knob();
        self.load("source", "bulk_source", 1, &[data.clone(), knob]);
        let mut rx = match config {
            Some(config) => BulkConsumer::claim_with(&self.b.mb, &data, config).unwrap(),
            None => BulkConsumer::claim(&self.b.mb, &data).unwrap(),
        };
        let mut out = vec![0u8; size as usize];
        for _ in 0..n / 10 {
            rx.recv(&mut out, Duration::from_secs(10)).unwrap();
        }
        let t = Instant::now();
        for _ in 0..n {
            rx.recv(&mut out, Duration::from_secs(10)).unwrap();
        }
        let took = t.elapsed();
        self.b.backend.unload("source").unwrap();
        gbs(size, took.as_secs_f64() * 1e6 / n as f64)
    }

    /// GPU→GPU: `blocks` blocks per end, a channel each, for about a second after warm-up. GB/s of
    /// payload. `fixed`: the source sends one buffer and the sink copies each message out unchecked
    /// (needs a knob binding: fewer than 8 blocks); otherwise both fill and check every byte in place.
    fn gpu_to_gpu(&mut self, size: u32, placement: Placement, blocks: u32, fixed: bool) -> f64 {
        let data: Vec<String> = (0..blocks).map(|_| self.channel(size, placement, Protocol::Bulk)).collect();
        let with_knob = |knob: String| {
            let mut v = data.clone();
            if fixed {
                v.push(knob);
            }
            v
        };
        let (sink_knob, source_knob) = (self.fixed_knob(), self.fixed_knob());
        let slot = self.load("sink", "bulk_sink", blocks, &with_knob(sink_knob));
        self.load("source", "bulk_source", blocks, &with_knob(source_knob));
        let warm = u64::from(CAPACITY) * 4 * u64::from(blocks);
        assert!(wait_until(Duration::from_secs(30), || self.counts(slot, blocks) >= warm), "traffic");
        let (t, start) = (Instant::now(), self.counts(slot, blocks));
        std::thread::sleep(Duration::from_secs(1));
        let (took, end) = (t.elapsed(), self.counts(slot, blocks));
        let w = self.b.mb.slot(slot).unwrap().user_words();
        let bad: u32 = (0..blocks).map(|k| bulk::bad(&w, k).0).sum();
        assert_eq!(bad, 0, "GPU→GPU {size} B {placement} {blocks} blocks: bad messages");
        self.b.backend.unload("source").unwrap();
        self.b.backend.unload("sink").unwrap();
        (end - start) as f64 * f64::from(size) / took.as_secs_f64() / 1e9
    }
}

/// `mesh-gpu-bench bulk MODE`.
pub fn bulk_benches(mps: bool) {
    let mode = if mps { "mps" } else { "blink" };
    // (size, host→device GB/s, device→host GB/s) of the raw copies: the limit beside the host ends.
    let mut raws: Vec<(u32, f64, f64)> = Vec::new();
    if !mps {
        println!();
        println!("Raw: back-to-back cuMemcpy*Async, 200 on one stream, pinned host memory, µs per copy (GB/s):");
        println!();
        println!("| size | host→device | device→host | device→device |");
        println!("|-----:|------------:|------------:|--------------:|");
        for size in SIZES.into_iter().chain([BIG]) {
            let (h2d, d2h, d2d) = raw_copies(size as usize);
            raws.push((size, gbs(size, h2d), gbs(size, d2h)));
            println!(
                "| {size} | {h2d:.2} ({:.1}) | {d2h:.2} ({:.1}) | {d2d:.2} ({:.1}) |",
                gbs(size, h2d),
                gbs(size, d2h),
                gbs(size, d2d)
            );
        }
    }
    let mut b = Bulk { b: Bench::open_sized(mps, 512 << 20), next: 0 };
    println!();
    println!("Bulk channels, {mode} mode, host ↔ GPU (one block of {BLOCK} threads on the GPU end), GB/s of payload:");
    println!();
    println!("| size | host copy threads | stores | host→GPU | GPU→host |");
    println!("|-----:|------------------:|--------|---------:|---------:|");
    for size in SIZES {
        let n = if size <= 64 << 10 { 20_000 } else { 2_000 };
        host_rows(&mut b, size, n, &[1, 2, 4], (mode, &raws));
    }
    println!();
    println!("Bulk channels, {mode} mode, GPU→GPU streaming (blocks of {BLOCK} threads, a channel per block), GB/s:");
    println!();
    println!("(copy: mesh_block_try_send of one buffer, mesh_block_try_recv into one; fill+check: the source");
    println!("fills every word in place, the sink checks every byte in place. 8 blocks take all 8 bindings, so");
    println!("no knob: fill+check only. More than 8 blocks per end needs more bindings than a program has.)");
    println!();
    println!("| size | blocks per end | path | device channels | host channels |");
    println!("|-----:|---------------:|------|----------------:|--------------:|");
    for size in SIZES {
        for (blocks, fixed) in [(1u32, true), (1, false), (8, false)] {
            let device = (!mps).then(|| b.gpu_to_gpu(size, Placement::Device, blocks, fixed));
            let host = b.gpu_to_gpu(size, Placement::Host, blocks, fixed);
            let device = device.map_or("(MPS: not shared yet)".into(), |g| format!("{g:.2}"));
            let path = if fixed { "copy" } else { "fill+check" };
            println!("| {size} | {blocks} | {path} | {device} | {host:.2} |");
        }
    }
    b.b.shutdown();

    // 16 MiB in a mailbox of its own: 15 channels of 64 MiB (and their knobs) fit in 1.25 GiB.
    let mut big = Bulk { b: Bench::open_sized(mps, 1280 << 20), next: 0 };
    println!();
    println!("Bulk channels, {mode} mode, host ↔ GPU at 16 MiB (capacity {BIG_CAPACITY}), GB/s of payload:");
    println!();
    println!("| size | host copy threads | stores | host→GPU | GPU→host |");
    println!("|-----:|------------------:|--------|---------:|---------:|");
    host_rows(&mut big, BIG, 200, &[1, 2, 4, 8], (mode, &raws));
    big.b.shutdown();
}

/// The host ↔ GPU rows of one size: the default end (with its first lap over the fresh ring), then
/// every `threads` count with plain and streaming stores. The default end's figures go to the results
/// beside `raws`' copies of the same size (blink mode measures them; MPS mode has none).
fn host_rows(b: &mut Bulk, size: u32, n: u64, threads: &[usize], (mode, raws): (&str, &[(u32, f64, f64)])) {
    // The producer's default (host→GPU) and the consumer's (GPU→host) differ from 256 KiB to 4 MiB.
    let (tx, rx) = (CopyConfig::for_producer(size as usize), CopyConfig::for_msg_size(size as usize));
    let (first, to) = b.host_to_gpu(size, None, n);
    let from = b.gpu_to_host(size, None, n);
    let stores = if tx.non_temporal { "streaming" } else { "plain" };
    let both =
        if tx.threads == rx.threads { tx.threads.to_string() } else { format!("{} / {}", tx.threads, rx.threads) };
    println!("| {size} | default ({both}) | {stores} | {to:.2} (first lap {first:.2}) | {from:.2} |");
    let raw = raws.iter().find(|r| r.0 == size);
    let to_raw = raw.map(|r| ("cuMemcpyAsync host→device", r.1));
    let from_raw = raw.map(|r| ("cuMemcpyAsync device→host", r.2));
    crate::results::record("bulk", &format!("host→GPU, default host end, {mode}, {size} B"), to, "GB/s", to_raw, None);
    crate::results::record(
        "bulk",
        &format!("GPU→host, default host end, {mode}, {size} B"),
        from,
        "GB/s",
        from_raw,
        None,
    );
    for &threads in threads {
        for non_temporal in [false, true] {
            let config = CopyConfig { threads, non_temporal, min_part: 64 << 10 };
            let (_, to) = b.host_to_gpu(size, Some(config), n);
            let from = if non_temporal { None } else { Some(b.gpu_to_host(size, Some(config), n)) };
            let stores = if non_temporal { "streaming" } else { "plain" };
            let from = from.map_or("(a consumer's stores are plain)".into(), |g| format!("{g:.2}"));
            println!("| {size} | {threads} | {stores} | {to:.2} | {from} |");
        }
    }
}
