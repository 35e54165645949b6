//! `cargo xtask bench`: GPU benchmarks, each beside its raw baseline in the same run. Numbers, not assertions.
//!
//! * host↔GPU round trip through a mesh channel pair (echo program) against a raw mapped-word
//!   ping-pong (raw_pingpong program), same mailbox, same context;
//! * nvJitLink: cold (library start-up, paid once by `Jit::start`), warm, cached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_backend::{ImageKind, LaunchShape};
use mesh_cuda::StreamState;
use mesh_gpu_tests::{Fixture, program, wait_until};
use mesh_shm::{Consumer, Producer};

const ONE: LaunchShape = LaunchShape { grid: [1, 1, 1], block: [32, 1, 1], shared_mem: 0 };
const ROUNDS: usize = 20_000;

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort_unstable();
    (v[v.len() / 2], v[v.len() * 99 / 100], v[0])
}

fn row(name: &str, (median, p99, min): (Duration, Duration, Duration)) {
    println!("| {name:<44} | {:>9.2} µs | {:>9.2} µs | {:>9.2} µs |", us(median), us(p99), us(min));
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    if !mesh_gpu_tests::gpu_enabled("mesh-gpu-bench") {
        return;
    }
    let f = Fixture::new();
    println!("device: {} ({}), {} SMs", f.device.name, f.device.arch(), f.device.sm_count);
    println!();
    println!("| benchmark                                    |     median |        p99 |        min |");
    println!("|----------------------------------------------|------------|------------|------------|");

    // Raw baseline: the host writes a sequence number into one mapped word, the GPU copies it into another.
    let scratch = f.mailbox.create_channel("raw", 8, 2).unwrap();
    let raw_module = f.load_in(&f.ctx, "raw_pingpong");
    let slot = f.mailbox.slot(0).unwrap();
    slot.bind("raw", &[scratch.index]).unwrap();
    slot.arm(1);
    let raw_stream = f.ctx.stream().unwrap();
    raw_module
        .function("mesh_main")
        .unwrap()
        .launch(&ONE, &raw_stream, &f.mailbox.mesh_ctx(0, f.registered.device_address()).unwrap())
        .unwrap();
    let (base, _) = f.mailbox.as_raw_parts();
    // SAFETY: the ring's head and tail lines lie inside the mapping, 8-aligned; used as plain words here.
    let (ping, pong) = unsafe {
        (
            AtomicU64::from_ptr(base.add(scratch.ring_offset as usize).cast()),
            AtomicU64::from_ptr(base.add(scratch.ring_offset as usize + 128).cast()),
        )
    };
    let mut raw = Vec::with_capacity(ROUNDS);
    for i in 1..=(ROUNDS as u64 + 1000) {
        let t = Instant::now();
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        if i > 1000 {
            raw.push(t.elapsed());
        }
    }
    ping.store(u64::MAX, Ordering::Release);
    assert!(wait_until(Duration::from_secs(5), || raw_stream.state() == StreamState::Idle));
    let raw_p = percentiles(raw);
    row("round trip, raw mapped word (baseline)", raw_p);

    // The same through the mailbox's channels and the echo program.
    let a = f.mailbox.create_channel("ping", 8, 64).unwrap();
    let b = f.mailbox.create_channel("pong", 8, 64).unwrap();
    let echo = f.load_in(&f.ctx, "echo");
    let slot = f.mailbox.slot(1).unwrap();
    slot.bind("echo", &[a.index, b.index]).unwrap();
    slot.arm(1);
    let echo_stream = f.ctx.stream().unwrap();
    echo.function("mesh_main")
        .unwrap()
        .launch(&ONE, &echo_stream, &f.mailbox.mesh_ctx(1, f.registered.device_address()).unwrap())
        .unwrap();
    let mut tx = Producer::claim(&f.mailbox, "ping").unwrap();
    let mut rx = Consumer::claim(&f.mailbox, "pong").unwrap();
    let mut msg = [0u8; 8];
    let mut chan = Vec::with_capacity(ROUNDS);
    for i in 0..(ROUNDS as u64 + 1000) {
        let t = Instant::now();
        while !tx.try_send(&i.to_le_bytes()).unwrap() {}
        while !rx.try_recv(&mut msg).unwrap() {
            std::hint::spin_loop();
        }
        assert_eq!(u64::from_le_bytes(msg), i);
        if i >= 1000 {
            chan.push(t.elapsed());
        }
    }
    slot.request_stop();
    assert!(wait_until(Duration::from_secs(5), || echo_stream.state() == StreamState::Idle));
    let chan_p = percentiles(chan);
    row("round trip, mesh channel pair + echo program", chan_p);
    println!(
        "| {:<44} | {:>9.2}x  |            |            |",
        "channel / raw (median; goal <= 1.15)",
        us(chan_p.0) / us(raw_p.0)
    );

    // nvJitLink.
    println!(
        "| {:<44} | {:>9.2} ms |            |            |",
        "JIT cold: library start + first link",
        f.jit.warmup.as_secs_f64() * 1e3
    );
    for name in ["echo", "heartbeat"] {
        // A fresh image (a comment changes its hash) so that the link is warm, not cached.
        let mut image = program(name);
        image.extend_from_slice(format!("\n// bench {:?}\n", Instant::now()).as_bytes());
        let warm = f.jit.link(name, image.clone(), ImageKind::Ptx).unwrap();
        let t = Instant::now();
        let cached = f.jit.link(name, image, ImageKind::Ptx).unwrap();
        let cached_time = t.elapsed();
        assert!(cached.cached);
        println!(
            "| {:<44} | {:>9.3} ms |            |            |",
            format!("JIT warm link: {name}.ptx"),
            warm.link_time.as_secs_f64() * 1e3
        );
        println!(
            "| {:<44} | {:>9.3} ms |            |            |",
            format!("JIT cached: {name}.ptx"),
            cached_time.as_secs_f64() * 1e3
        );
    }
}
