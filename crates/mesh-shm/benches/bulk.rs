//! Bulk channels on the host: 64 KiB, 1 MiB and 16 MiB messages thread to thread through the mailbox, beside a plain memcpy of the same bytes in the same run, with the ends' default (copy threads and stores by message size) and the explicit one-thread setting.
//!
//! `cargo bench -p mesh-shm --bench bulk` (`-- 16MiB` for one size). The mailbox lives on /dev/shm
//! (tmpfs, as meshd's does). A channel row times receiving N messages that a producer thread sends
//! as fast as the ring lets it: every message is copied twice (into the ring, out of it), on two
//! threads that overlap, each with its own helpers. The `first lap` row claims fresh ends on a fresh
//! channel per sample and times its first `CAPACITY` messages: what a new client pays for pages its
//! process has not touched yet (the ends map them at claim, outside the timing).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use mesh_shm::layout::bulk_slot_bytes;
use mesh_shm::{BulkConsumer, BulkProducer, CopyConfig, CreateMode, Mailbox, MailboxConfig, Placement, Protocol};

const CAPACITY: u32 = 4;

fn mailbox(dir: &std::path::Path, size: u32, channels: u32) -> Mailbox {
    let ring = bulk_slot_bytes(size, CAPACITY, 1);
    let config = MailboxConfig { size: ring * u64::from(channels) + (4 << 20), slots: 1, channels: channels + 2 };
    Mailbox::create(dir.join(format!("mb-{size}")), &config, CreateMode::Exclusive).unwrap()
}

/// Receives `n` messages that a producer thread sends; `config` None: the ends' default (`claim`).
/// `msg` and `out` are the caller's, touched before: a fresh 16 MiB buffer per call would time its
/// own page faults.
fn stream(mb: &Mailbox, name: &str, bufs: &mut (Vec<u8>, Vec<u8>), n: u64, config: Option<CopyConfig>) -> Duration {
    let (mut tx, mut rx) = match config {
        Some(c) => (BulkProducer::claim_with(mb, name, c).unwrap(), BulkConsumer::claim_with(mb, name, c).unwrap()),
        None => (BulkProducer::claim(mb, name).unwrap(), BulkConsumer::claim(mb, name).unwrap()),
    };
    let (msg, out) = (&bufs.0, &mut bufs.1);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..n {
                while !tx.try_send(msg).unwrap() {
                    std::hint::spin_loop();
                }
            }
        });
        let start = Instant::now();
        for _ in 0..n {
            while !rx.try_recv(out).unwrap() {
                std::hint::spin_loop();
            }
            black_box(&*out);
        }
        start.elapsed()
    })
}

fn bench_size(c: &mut Criterion, size: u32, label: &str) {
    let dir = tempfile::Builder::new().prefix("mesh-bulk-bench").tempdir_in("/dev/shm").unwrap();
    // One channel for the steady rows, and fresh ones for the first-lap row (a few samples' worth).
    let fresh = 12;
    let mb = mailbox(dir.path(), size, 1 + fresh);
    mb.create_channel_with("big", size, CAPACITY, Placement::Host, Protocol::Bulk).unwrap();
    let bytes = size as usize;
    let mut g = c.benchmark_group(format!("bulk_{label}"));
    g.throughput(Throughput::Bytes(u64::from(size)));
    let (warm, measure) = if size >= 16 << 20 { (2, 4) } else { (1, 3) };
    g.warm_up_time(Duration::from_secs(warm)).measurement_time(Duration::from_secs(measure)).sample_size(10);
    let src = vec![7u8; bytes];
    let mut dst = vec![0u8; bytes];
    g.bench_function("memcpy, one thread", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        });
    });
    // The raw cost of first touch: the same copy into a /dev/shm file mapped fresh for each message.
    g.bench_function("memcpy into fresh /dev/shm pages (first touch)", |b| {
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                let f = tempfile::tempfile_in("/dev/shm").unwrap();
                f.set_len(u64::from(size)).unwrap();
                // SAFETY: a private temporary file nobody else maps.
                let mut map = unsafe { memmap2::MmapMut::map_mut(&f) }.unwrap();
                let start = Instant::now();
                map.copy_from_slice(black_box(&src));
                total += start.elapsed();
                black_box(&map);
            }
            total
        });
    });
    let mut bufs = (vec![7u8; bytes], vec![1u8; bytes]);
    let auto = CopyConfig::for_msg_size(bytes);
    let name = format!(
        "mailbox, default by size ({} thread(s), {} stores)",
        auto.threads,
        if auto.non_temporal { "streaming" } else { "plain" }
    );
    g.bench_function(&name, |b| b.iter_custom(|n| stream(&mb, "big", &mut bufs, n, None)));
    g.bench_function("mailbox, 1 thread, plain stores (the old default)", |b| {
        b.iter_custom(|n| stream(&mb, "big", &mut bufs, n, Some(CopyConfig::default())));
    });
    let mut next = 0;
    g.bench_function("mailbox, default, first lap of a fresh channel", |b| {
        b.iter_custom(|n| {
            // n messages, in laps of CAPACITY on fresh channels while they last (then the last one).
            let mut total = Duration::ZERO;
            let mut left = n;
            while left > 0 {
                let name = format!("fresh{}", next.min(fresh - 1));
                if next < fresh {
                    mb.create_channel_with(&name, size, CAPACITY, Placement::Host, Protocol::Bulk).unwrap();
                    next += 1;
                }
                let k = left.min(u64::from(CAPACITY));
                total += stream(&mb, &name, &mut bufs, k, None);
                left -= k;
            }
            total
        });
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench_size(&mut c, 64 << 10, "64KiB");
    bench_size(&mut c, 1 << 20, "1MiB");
    bench_size(&mut c, 16 << 20, "16MiB");
    c.final_summary();
}
