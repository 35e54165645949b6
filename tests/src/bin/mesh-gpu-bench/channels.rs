//! Channel benchmarks, each beside the true limit measured in the same process and context.
//!
//! * Round trip host→GPU→host by message size: the warp path (`echo_warp`) and the one-thread path
//!   (`echo`), beside the relaxed raw mapped-word ping-pong (`raw_pingpong`: volatile load and store,
//!   no fence) and beside no resident kernel at all (`copy_once`: launch + synchronize of a kernel
//!   that copies the same bytes through mapped memory).
//! * One-way streaming, host→GPU (`sink`) and GPU→host (`source`), one warp on the GPU end, beside what
//!   one warp reaches reading and writing mapped host memory with plain volatile 16-byte accesses (`warp_bw`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_backend::LaunchShape;
use mesh_cuda::{Module, Stream, StreamState};
use mesh_gpu_tests::stress::{self, user};
use mesh_gpu_tests::{Fixture, wait_until};
use mesh_shm::{Consumer, Producer};

use crate::{percentiles, us};

const WARP: LaunchShape = LaunchShape { grid: [1, 1, 1], block: [32, 1, 1], shared_mem: 0 };
const THREAD: LaunchShape = LaunchShape { grid: [1, 1, 1], block: [1, 1, 1], shared_mem: 0 };
const ROUNDS: usize = 20_000;
const WARMUP: usize = 1_000;
const SIZES: [u32; 6] = [8, 64, 256, 1024, 2368, 4096];

/// A program launched in the fixture's context on slot `slot`, stopped on drop.
struct Running<'f> {
    f: &'f Fixture,
    slot: u32,
    stream: Stream,
    _module: Module,
}

impl<'f> Running<'f> {
    fn start(f: &'f Fixture, slot: u32, program: &str, channels: &[u32], shape: &LaunchShape) -> Self {
        let module = f.load_in(&f.ctx, program);
        let s = f.mailbox.slot(slot).unwrap();
        s.reset_status();
        s.bind(program, channels).unwrap();
        s.arm(1);
        let stream = f.ctx.stream().unwrap();
        module
            .function("mesh_main")
            .unwrap()
            .launch(shape, &stream, &f.mailbox.mesh_ctx(slot, f.registered.device_address()).unwrap())
            .unwrap();
        Self { f, slot, stream, _module: module }
    }

    fn user_words(&self) -> [u32; 32] {
        self.f.mailbox.slot(self.slot).unwrap().user_words()
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.f.mailbox.slot(self.slot).unwrap().request_stop();
        assert!(wait_until(Duration::from_secs(10), || self.stream.state() == StreamState::Idle), "stop");
        self.f.mailbox.slot(self.slot).unwrap().release();
    }
}

/// (median, p99) in µs.
fn stats(v: Vec<Duration>) -> (f64, f64) {
    let (median, p99, _) = percentiles(v);
    (us(median), us(p99))
}

/// The raw baseline: the host stores a sequence number into one mapped word, the GPU copies it into another.
fn raw_round_trip(f: &Fixture) -> (f64, f64) {
    let scratch = f.mailbox.create_channel("raw", 8, 2).unwrap();
    let running = Running::start(f, 0, "raw_pingpong", &[scratch.index], &WARP);
    let (base, _) = f.mailbox.as_raw_parts();
    // SAFETY: the ring's head and tail lines lie inside the mapping, 8-aligned; used as plain words here.
    let (ping, pong) = unsafe {
        (
            AtomicU64::from_ptr(base.add(usize::try_from(scratch.ring_offset).unwrap()).cast()),
            AtomicU64::from_ptr(base.add(usize::try_from(scratch.ring_offset).unwrap() + 128).cast()),
        )
    };
    let mut times = Vec::with_capacity(ROUNDS);
    for i in 1..=(ROUNDS + WARMUP) as u64 {
        let t = Instant::now();
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        if i > WARMUP as u64 {
            times.push(t.elapsed());
        }
    }
    ping.store(u64::MAX, Ordering::Release);
    drop(running);
    stats(times)
}

/// Round trips of `size`-byte messages through an echo program; every reply checked.
/// Returns (median, p99, polls per 1000 round trips that found the request half-arrived).
fn channel_round_trip(f: &Fixture, program: &str, shape: &LaunchShape, size: u32, slot: u32) -> (f64, f64, f64) {
    let (to, from) = (format!("{program}-to-{size}"), format!("{program}-from-{size}"));
    let a = f.mailbox.create_channel(&to, size, 64).unwrap();
    let b = f.mailbox.create_channel(&from, size, 64).unwrap();
    let running = Running::start(f, slot, program, &[a.index, b.index], shape);
    let mut tx = Producer::claim(&f.mailbox, &to).unwrap();
    let mut rx = Consumer::claim(&f.mailbox, &from).unwrap();
    let (mut msg, mut back) = (vec![0u8; size as usize], vec![0u8; size as usize]);
    let rounds = if shape.block[0] == 1 && size > 64 { ROUNDS / 10 } else { ROUNDS };
    let mut times = Vec::with_capacity(rounds);
    for i in 0..(rounds + WARMUP) as u64 {
        stress::fill(&mut msg, i);
        let t = Instant::now();
        while !tx.try_send(&msg).unwrap() {}
        while !rx.try_recv(&mut back).unwrap() {
            std::hint::spin_loop();
        }
        let took = t.elapsed();
        stress::check(&back, i).unwrap_or_else(|e| panic!("{program}: {e}"));
        if i >= WARMUP as u64 {
            times.push(took);
        }
    }
    // Let the program publish its count of polls that found a message half-arrived.
    std::thread::sleep(Duration::from_millis(5));
    let partial = running.user_words()[0];
    drop(running);
    let (median, p99) = stats(times);
    (median, p99, f64::from(partial) * 1000.0 / (rounds + WARMUP) as f64)
}

/// No resident kernel: launch a kernel that copies `size` bytes of mapped memory, then synchronize.
fn launch_round_trip(f: &Fixture, size: u32, slot: u32) -> (f64, f64) {
    let a = f.mailbox.create_channel(&format!("copy-a-{size}"), size, 1).unwrap();
    let b = f.mailbox.create_channel(&format!("copy-b-{size}"), size, 1).unwrap();
    let module = f.load_in(&f.ctx, "copy_once");
    let func = module.function("mesh_main").unwrap();
    let s = f.mailbox.slot(slot).unwrap();
    s.bind("copy_once", &[a.index, b.index]).unwrap();
    let ctx = f.mailbox.mesh_ctx(slot, f.registered.device_address()).unwrap();
    let stream = f.ctx.stream().unwrap();
    let (base, _) = f.mailbox.as_raw_parts();
    let (src, dst) = (usize::try_from(a.ring_offset).unwrap() + 384, usize::try_from(b.ring_offset).unwrap() + 384);
    let (mut msg, mut back) = (vec![0u8; size as usize], vec![0u8; size as usize]);
    let mut times = Vec::with_capacity(ROUNDS);
    for i in 0..(ROUNDS + WARMUP) as u64 {
        stress::fill(&mut msg, i);
        let t = Instant::now();
        // SAFETY: both slot areas (2 × size bytes each) lie inside the mapping; no kernel runs now.
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), base.add(src), msg.len()) };
        func.launch(&WARP, &stream, &ctx).unwrap();
        stream.synchronize().unwrap();
        // SAFETY: as above; the kernel has finished.
        unsafe { std::ptr::copy_nonoverlapping(base.add(dst), back.as_mut_ptr(), back.len()) };
        let took = t.elapsed();
        stress::check(&back, i).unwrap_or_else(|e| panic!("copy_once: {e}"));
        if i >= WARMUP as u64 {
            times.push(took);
        }
    }
    s.release();
    stats(times)
}

/// Mapped-memory bandwidth of one warp (or one thread) by kind of access (`warp_bw`'s modes), GB/s.
fn mapped_bandwidth(f: &Fixture, mode: u64, slot: u32) -> f64 {
    let one_thread = mode == 7 || mode == 8;
    let bytes: u64 = if one_thread { 1 << 20 } else { 8 << 20 };
    // The buffer after the 8 KiB of parameters, in whole steps of the mode (16 KiB for mode 9).
    let step: u64 = if mode == 9 { 16 << 10 } else { 8 << 10 };
    let usable = (bytes - 8192) / step * step;
    let passes: u64 = if one_thread { 1 } else { 16 };
    let buf = f.mailbox.create_channel(&format!("bw{mode}"), 4096, 1024).unwrap();
    let module = f.load_in(&f.ctx, "warp_bw");
    let s = f.mailbox.slot(slot).unwrap();
    s.bind("warp_bw", &[buf.index]).unwrap();
    let (base, _) = f.mailbox.as_raw_parts();
    let params = base.wrapping_add(usize::try_from(buf.ring_offset).unwrap() + 384).cast::<u64>();
    // SAFETY: the ring's slot area (8 MiB: 8 KiB of parameters, then the buffer) lies inside the
    // mapping; no kernel runs yet.
    unsafe {
        params.write_volatile(mode);
        params.add(1).write_volatile(usable);
        params.add(2).write_volatile(passes);
    }
    let stream = f.ctx.stream().unwrap();
    let func = module.function("mesh_main").unwrap();
    let ctx = f.mailbox.mesh_ctx(slot, f.registered.device_address()).unwrap();
    let t = Instant::now();
    func.launch(&WARP, &stream, &ctx).unwrap();
    stream.synchronize().unwrap();
    let took = t.elapsed();
    s.release();
    (usable * passes) as f64 / took.as_secs_f64() / 1e9
}

/// Host→GPU streaming: `n` messages of `size` bytes into a warp sink that only counts. Messages/s.
fn stream_to_gpu(f: &Fixture, size: u32, capacity: u32, n: u64, slot: u32) -> f64 {
    let data = f.mailbox.create_channel(&format!("h2g-{size}"), size, capacity).unwrap();
    let knob = f.mailbox.create_channel(&format!("h2g-k-{size}"), 8, 2).unwrap();
    Producer::claim(&f.mailbox, &knob.name)
        .unwrap()
        .send(&stress::knobs(0, 4096, true), Duration::from_secs(1))
        .unwrap();
    let running = Running::start(f, slot, "sink", &[data.index, knob.index], &WARP);
    let mut tx = Producer::claim(&f.mailbox, &data.name).unwrap();
    let per_call = 32usize;
    let mut batch = vec![0u8; size as usize * per_call];
    let t = Instant::now();
    let mut sent = 0u64;
    while sent < n {
        let k = per_call.min(usize::try_from(n - sent).unwrap_or(usize::MAX));
        for (j, m) in batch.chunks_mut(size as usize).take(k).enumerate() {
            m[..8].copy_from_slice(&(sent + j as u64).to_le_bytes());
        }
        sent += tx.try_send_batch(&batch[..k * size as usize]).unwrap() as u64;
    }
    assert!(wait_until(Duration::from_secs(30), || user::count(&running.user_words()) >= n), "the sink got them all");
    let took = t.elapsed();
    drop(running);
    n as f64 / took.as_secs_f64()
}

/// GPU→host streaming: a warp source (fixed content) into a host consumer, `n` messages after warm-up. Messages/s.
fn stream_from_gpu(f: &Fixture, size: u32, capacity: u32, n: u64, slot: u32) -> f64 {
    let data = f.mailbox.create_channel(&format!("g2h-{size}"), size, capacity).unwrap();
    let knob = f.mailbox.create_channel(&format!("g2h-k-{size}"), 8, 2).unwrap();
    Producer::claim(&f.mailbox, &knob.name)
        .unwrap()
        .send(&stress::knobs(0, 4096, true), Duration::from_secs(1))
        .unwrap();
    let running = Running::start(f, slot, "source", &[data.index, knob.index], &WARP);
    let mut rx = Consumer::claim(&f.mailbox, &data.name).unwrap();
    let mut batch = vec![0u8; size as usize * 64];
    let mut got = 0u64;
    let mut t = Instant::now();
    let warm = n / 10;
    while got < n + warm {
        let k = rx.try_recv_batch(&mut batch).unwrap() as u64;
        if got < warm && got + k >= warm {
            t = Instant::now();
        }
        got += k;
    }
    let took = t.elapsed();
    drop(running);
    (got - warm) as f64 / took.as_secs_f64()
}

/// Every channel benchmark; prints its tables.
pub fn channel_benches(f: &Fixture) {
    let (raw_median, raw_p99) = raw_round_trip(f);
    println!();
    println!("Round trip host→GPU→host, µs (median / p99 of {ROUNDS}; one-thread path 2,000 above 64 B).");
    println!("Raw relaxed mapped word (volatile load + store, no fence): {raw_median:.2} / {raw_p99:.2}");
    println!("(‰ half: polls per 1000 round trips that caught the request half-written, each one more round trip.)");
    println!();
    println!("| size | warp path | ×raw | one-thread path | ×raw | launch + sync, no resident kernel |");
    println!("|-----:|----------:|-----:|----------------:|-----:|----------------------------------:|");
    let mut slot = 1;
    for size in SIZES {
        let warp = channel_round_trip(f, "echo_warp", &WARP, size, slot);
        let thread = (size <= 256).then(|| channel_round_trip(f, "echo", &THREAD, size, slot + 1));
        let launch = launch_round_trip(f, size, slot + 2);
        slot += 3;
        let thread_cell =
            thread.map_or("(echo takes ≤ 256 B)".to_string(), |(m, p, h)| format!("{m:.2} / {p:.2} ({h:.0}‰ half)"));
        let thread_ratio = thread.map_or(String::new(), |(m, _, _)| format!("{:.2}", m / raw_median));
        println!(
            "| {size} | {:.2} / {:.2} ({:.0}‰ half) | {:.2} | {thread_cell} | {thread_ratio} | {:.2} / {:.2} |",
            warp.0,
            warp.1,
            warp.2,
            warp.0 / raw_median,
            launch.0,
            launch.1
        );
    }
    println!("(2368 B is the wire size a 7+1 packing would need for a 4 KiB payload: 592 words.)");
    println!();
    println!("Mapped host memory, one warp (8 KiB in flight) or one thread (32 loads in flight), GB/s:");
    println!();
    println!("| access | GB/s |");
    println!("|--------|-----:|");
    let mut read = 0f64;
    let mut write = 0f64;
    for (mode, what) in [
        (1, "warp, ld.volatile.v2.u64 ×16 per lane"),
        (3, "warp, ld.volatile.u64 ×32 per lane (the channel's loads)"),
        (4, "warp, ld.relaxed.sys.u64 ×32 per lane"),
        (5, "warp, ld.global.cv.u64 ×32 per lane"),
        (6, "warp, ld.global.cv.v2.u64 ×16 per lane"),
        (9, "warp, ld.volatile.v2.u64 ×32 per lane (16 KiB in flight)"),
        (7, "one thread, ld.volatile.u64 ×32"),
        (8, "one thread, ld.relaxed.sys.u64 ×32"),
        (2, "warp, st.volatile.v2.u64 ×16 per lane"),
    ] {
        let gbs = mapped_bandwidth(f, mode, slot);
        slot += 1;
        println!("| {what} | {gbs:.2} |");
        if mode == 2 {
            write = gbs;
        } else if !(7..=8).contains(&mode) {
            read = read.max(gbs);
        }
    }
    println!();
    println!("One-way streaming, one warp on the GPU end (bytes moved = 2 × payload: the LL tag words),");
    println!("beside the best warp read above ({read:.2} GB/s) and the warp write ({write:.2} GB/s).");
    println!();
    println!("| direction | size | messages/s | payload GB/s | bytes moved GB/s | moved / plain |");
    println!("|-----------|-----:|-----------:|-------------:|-----------------:|--------------:|");
    for (size, capacity, n) in [(64u32, 1024u32, 2_000_000u64), (4096, 64, 100_000)] {
        let to = stream_to_gpu(f, size, capacity, n, slot);
        let from = stream_from_gpu(f, size, capacity, n, slot + 1);
        slot += 2;
        for (dir, rate, plain) in [("host→GPU", to, read), ("GPU→host", from, write)] {
            let payload = rate * f64::from(size) / 1e9;
            println!(
                "| {dir} | {size} | {:.2} M | {payload:.2} | {:.2} | {:.0}% |",
                rate / 1e6,
                2.0 * payload,
                200.0 * payload / plain
            );
        }
    }
}
