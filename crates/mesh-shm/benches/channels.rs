//! Mailbox channel throughput and round-trip latency, thread to thread and process to process, beside rtrb.
//!
//! `cargo bench -p mesh-shm --bench channels`. rtrb is a heap ring and cannot cross processes, so the
//! process rows compare against the same mesh channel between threads. The bench binary re-runs itself
//! as the child process (role in `MESH_BENCH_CHILD`). Round trips run at 8 B to 4 KiB (64-slot rings
//! above 256 B), throughput at 8 to 256 B. Rows named `mesh-*` are channels of protocol ll (what a GPU
//! program can be an end of), `index-*` of protocol index (host ends only, rtrb's format), through
//! the same `Producer`/`Consumer` calls.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Placement, Producer, Protocol};

const CAPACITY: u32 = 1024;
const SIZES: [usize; 3] = [8, 64, 256];
/// Round trips also at the sizes host↔GPU messages reach; their rings hold fewer slots.
const RT_SIZES: [usize; 5] = [8, 64, 256, 1024, 4096];
const RT_BIG_CAPACITY: u32 = 64;
const STOP: u64 = u64::MAX;
const QUIT: u64 = u64::MAX - 1;

/// The protocols measured: the row prefix and the channel-name prefix of each.
const PROTOCOLS: [(&str, &str, Protocol); 2] = [("mesh", "", Protocol::Ll), ("index", "i", Protocol::Index)];

/// A mailbox at `path` with a `data`/`back` pair of `size`-byte channels of `capacity` in each protocol.
fn pair_mailbox(path: &std::path::Path, size: usize, capacity: u32) -> Mailbox {
    let mb =
        Mailbox::create(path, &MailboxConfig { size: 8 << 20, slots: 1, channels: 8 }, CreateMode::Exclusive).unwrap();
    let size = u32::try_from(size).unwrap();
    for (_, prefix, protocol) in PROTOCOLS {
        for end in ["data", "back"] {
            mb.create_channel_with(&format!("{prefix}{end}{size}"), size, capacity, Placement::Host, protocol).unwrap();
        }
    }
    mb
}

// Inlined into each sized caller, so that the message's length is a constant there, as in rtrb's rows.
#[inline(always)]
fn spin_send(p: &mut Producer, msg: &[u8]) {
    while !p.try_send(msg).unwrap() {
        std::hint::spin_loop();
    }
}

#[inline(always)]
fn spin_recv(c: &mut Consumer, out: &mut [u8]) {
    while !c.try_recv(out).unwrap() {
        std::hint::spin_loop();
    }
}

/// Calls `$f::<N>($args)` for the message size `$size` (one of [`RT_SIZES`]): the mesh rows, like
/// rtrb's `[u8; N]`, move fixed-size arrays, so both sides of a comparison know the size at compile
/// time (a caller with a run-time size pays a few branches more per message).
macro_rules! sized {
    ($size:expr, $f:ident($($arg:expr),*)) => {
        match $size {
            8 => $f::<8>($($arg),*),
            64 => $f::<64>($($arg),*),
            256 => $f::<256>($($arg),*),
            1024 => $f::<1024>($($arg),*),
            4096 => $f::<4096>($($arg),*),
            other => panic!("no sized copy of the harness for {other}-byte messages"),
        }
    };
}

/// The far side of a channel pair: `sink` drains `data` and acks each STOP on `back`; `echo` returns every message.
fn far_side(mb: &Mailbox, size: usize, role: &str, prefix: &str) {
    sized!(size, far_side_n(mb, role, prefix))
}

fn far_side_n<const N: usize>(mb: &Mailbox, role: &str, prefix: &str) {
    let mut rx = Consumer::claim(mb, &format!("{prefix}data{N}")).unwrap();
    let mut tx = Producer::claim(mb, &format!("{prefix}back{N}")).unwrap();
    let echo = role == "echo";
    let mut msg = [0u8; N];
    loop {
        spin_recv(&mut rx, &mut msg);
        // Only the first 8 bytes are looked at: the sink does what rtrb's consumer does, plus this test.
        let tag = u64::from_le_bytes(msg[..8].try_into().unwrap());
        if echo || tag >= QUIT {
            spin_send(&mut tx, &msg);
        }
        if tag == QUIT || (echo && tag == STOP) {
            return;
        }
    }
}

/// Sends `n` messages and waits for the sink's ack; the time per batch.
fn stream(tx: &mut Producer, rx: &mut Consumer, size: usize, n: u64) -> Duration {
    sized!(size, stream_n(tx, rx, n))
}

fn stream_n<const N: usize>(tx: &mut Producer, rx: &mut Consumer, n: u64) -> Duration {
    let mut msg = [0u8; N];
    let start = Instant::now();
    for i in 0..n {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        spin_send(tx, &msg);
    }
    msg[..8].copy_from_slice(&STOP.to_le_bytes());
    spin_send(tx, &msg);
    spin_recv(rx, &mut msg);
    start.elapsed()
}

fn round_trips(tx: &mut Producer, rx: &mut Consumer, size: usize, n: u64) -> Duration {
    sized!(size, round_trips_n(tx, rx, n))
}

fn round_trips_n<const N: usize>(tx: &mut Producer, rx: &mut Consumer, n: u64) -> Duration {
    let mut msg = [0u8; N];
    let start = Instant::now();
    for i in 0..n {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        spin_send(tx, &msg);
        spin_recv(rx, &mut msg);
    }
    start.elapsed()
}

fn rtrb_stream<const N: usize>(n: u64) -> Duration {
    let (mut p, mut c) = rtrb::RingBuffer::<[u8; N]>::new(CAPACITY as usize);
    let consumer = std::thread::spawn(move || {
        for _ in 0..n {
            loop {
                if let Ok(m) = c.pop() {
                    black_box(m);
                    break;
                }
                std::hint::spin_loop();
            }
        }
    });
    let start = Instant::now();
    let mut msg = [0u8; N];
    for i in 0..n {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        while p.push(msg).is_err() {
            std::hint::spin_loop();
        }
    }
    consumer.join().unwrap();
    start.elapsed()
}

fn rtrb_round_trips<const N: usize>(n: u64) -> Duration {
    let capacity = if N > 256 { RT_BIG_CAPACITY } else { CAPACITY } as usize;
    let (mut p1, mut c1) = rtrb::RingBuffer::<[u8; N]>::new(capacity);
    let (mut p2, mut c2) = rtrb::RingBuffer::<[u8; N]>::new(capacity);
    let echo = std::thread::spawn(move || {
        for _ in 0..n {
            let m = loop {
                if let Ok(m) = c1.pop() {
                    break m;
                }
                std::hint::spin_loop();
            };
            while p2.push(m).is_err() {}
        }
    });
    let start = Instant::now();
    let mut msg = [0u8; N];
    for i in 0..n {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        while p1.push(msg).is_err() {}
        msg = loop {
            if let Ok(m) = c2.pop() {
                break m;
            }
            std::hint::spin_loop();
        };
    }
    echo.join().unwrap();
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    // /dev/shm, as meshd's mailbox: a file on a disk filesystem pays page-cache writeback faults.
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    let mut throughput = c.benchmark_group("throughput");
    throughput.throughput(Throughput::Elements(1));
    for size in SIZES {
        throughput.bench_function(BenchmarkId::new("rtrb-thread", size), |b| {
            b.iter_custom(|n| match size {
                8 => rtrb_stream::<8>(n),
                64 => rtrb_stream::<64>(n),
                _ => rtrb_stream::<256>(n),
            })
        });
        let mb = pair_mailbox(&dir.path().join(format!("tt{size}")), size, CAPACITY);
        let pmb = pair_mailbox(&dir.path().join(format!("tp{size}")), size, CAPACITY);
        for (row, prefix, _) in PROTOCOLS {
            // A sink thread for the whole group: each sample streams n messages and waits for the ack.
            let sink_mb = mb.clone();
            let sink = std::thread::spawn(move || far_side(&sink_mb, size, "sink", prefix));
            let mut tx = Producer::claim(&mb, &format!("{prefix}data{size}")).unwrap();
            let mut rx = Consumer::claim(&mb, &format!("{prefix}back{size}")).unwrap();
            throughput.bench_function(BenchmarkId::new(format!("{row}-thread"), size), |b| {
                b.iter_custom(|n| stream(&mut tx, &mut rx, size, n))
            });
            quit(&mut tx, size);
            sink.join().unwrap();
            // The same channel pair, fresh, with the sink in another process.
            let mut child = spawn_child(&dir.path().join(format!("tp{size}")), size, "sink", prefix);
            let mut tx = Producer::claim(&pmb, &format!("{prefix}data{size}")).unwrap();
            let mut rx = Consumer::claim(&pmb, &format!("{prefix}back{size}")).unwrap();
            throughput.bench_function(BenchmarkId::new(format!("{row}-process"), size), |b| {
                b.iter_custom(|n| stream(&mut tx, &mut rx, size, n))
            });
            quit(&mut tx, size);
            let _ = child.wait();
        }
    }
    throughput.finish();

    let mut latency = c.benchmark_group("round-trip");
    for size in RT_SIZES {
        let capacity = if size > 256 { RT_BIG_CAPACITY } else { CAPACITY };
        latency.bench_function(BenchmarkId::new("rtrb-thread", size), |b| {
            b.iter_custom(|n| match size {
                8 => rtrb_round_trips::<8>(n),
                64 => rtrb_round_trips::<64>(n),
                256 => rtrb_round_trips::<256>(n),
                1024 => rtrb_round_trips::<1024>(n),
                _ => rtrb_round_trips::<4096>(n),
            })
        });
        let lmb = pair_mailbox(&dir.path().join(format!("rt{size}")), size, capacity);
        let tmb = pair_mailbox(&dir.path().join(format!("rtt{size}")), size, capacity);
        for (row, prefix, _) in PROTOCOLS {
            let mut child = spawn_child(&dir.path().join(format!("rt{size}")), size, "echo", prefix);
            {
                let mut tx = Producer::claim(&lmb, &format!("{prefix}data{size}")).unwrap();
                let mut rx = Consumer::claim(&lmb, &format!("{prefix}back{size}")).unwrap();
                latency.bench_function(BenchmarkId::new(format!("{row}-process"), size), |b| {
                    b.iter_custom(|n| round_trips(&mut tx, &mut rx, size, n))
                });
                let mut stop = vec![0u8; size];
                stop[..8].copy_from_slice(&STOP.to_le_bytes());
                spin_send(&mut tx, &stop);
            }
            let _ = child.wait();
            // Thread to thread: an echo thread over a fresh pair.
            let emb = tmb.clone();
            let echo = std::thread::spawn(move || far_side(&emb, size, "echo", prefix));
            let mut tx = Producer::claim(&tmb, &format!("{prefix}data{size}")).unwrap();
            let mut rx = Consumer::claim(&tmb, &format!("{prefix}back{size}")).unwrap();
            latency.bench_function(BenchmarkId::new(format!("{row}-thread"), size), |b| {
                b.iter_custom(|n| round_trips(&mut tx, &mut rx, size, n))
            });
            let mut stop = vec![0u8; size];
            stop[..8].copy_from_slice(&STOP.to_le_bytes());
            spin_send(&mut tx, &stop);
            echo.join().unwrap();
        }
    }
    latency.finish();

    // The host's own work per message, send then receive in one thread (no second core, so no cache
    // line moves): the part of a host↔GPU round trip that the host end adds.
    let mut own = c.benchmark_group("one-thread");
    for size in RT_SIZES {
        let capacity = if size > 256 { RT_BIG_CAPACITY } else { CAPACITY };
        own.bench_function(BenchmarkId::new("rtrb", size), |b| match size {
            8 => rtrb_one_thread::<8>(b),
            64 => rtrb_one_thread::<64>(b),
            256 => rtrb_one_thread::<256>(b),
            1024 => rtrb_one_thread::<1024>(b),
            _ => rtrb_one_thread::<4096>(b),
        });
        let omb = pair_mailbox(&dir.path().join(format!("own{size}")), size, capacity);
        for (row, prefix, _) in PROTOCOLS {
            let mut tx = Producer::claim(&omb, &format!("{prefix}data{size}")).unwrap();
            let mut rx = Consumer::claim(&omb, &format!("{prefix}data{size}")).unwrap();
            let mut msg = vec![0u8; size];
            let mut out = vec![0u8; size];
            let mut i = 0u64;
            own.bench_function(BenchmarkId::new(row, size), |b| {
                b.iter(|| {
                    // One 8-byte store: a narrower one under a wider load would stall the load.
                    i += 1;
                    msg[..8].copy_from_slice(&i.to_le_bytes());
                    assert!(tx.try_send(black_box(&msg)).unwrap());
                    assert!(rx.try_recv(black_box(&mut out)).unwrap());
                    u64::from_le_bytes(out[..8].try_into().unwrap())
                })
            });
        }
    }
    own.finish();
}

fn rtrb_one_thread<const N: usize>(b: &mut criterion::Bencher<'_>) {
    let capacity = if N > 256 { RT_BIG_CAPACITY } else { CAPACITY } as usize;
    let (mut p, mut c) = rtrb::RingBuffer::<[u8; N]>::new(capacity);
    let mut msg = [0u8; N];
    let mut i = 0u64;
    b.iter(|| {
        i += 1;
        msg[..8].copy_from_slice(&i.to_le_bytes());
        assert!(p.push(black_box(msg)).is_ok());
        let out = black_box(c.pop().unwrap());
        u64::from_le_bytes(out[..8].try_into().unwrap())
    });
}

fn quit(tx: &mut Producer, size: usize) {
    let mut msg = vec![0u8; size];
    msg[..8].copy_from_slice(&QUIT.to_le_bytes());
    spin_send(tx, &msg);
}

fn spawn_child(path: &std::path::Path, size: usize, role: &str, prefix: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .env("MESH_BENCH_CHILD", format!("{role}:{size}:{prefix}:{}", path.display()))
        .spawn()
        .unwrap()
}

fn main() {
    if let Ok(spec) = std::env::var("MESH_BENCH_CHILD") {
        let mut parts = spec.splitn(4, ':');
        let mut next = || parts.next().unwrap();
        let (role, size, prefix, path) = (next(), next(), next(), next());
        let mb = Mailbox::open(path).unwrap();
        far_side(&mb, size.parse().unwrap(), role, prefix);
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
}
