//! Bulk channels on the host: 1 MiB messages thread to thread through the mailbox, beside a plain memcpy of the same bytes, with 1 and 2 copy threads per end and with streaming stores.
//!
//! `cargo bench -p mesh-shm --bench bulk`. The mailbox lives on /dev/shm (tmpfs, as meshd's does). A
//! channel row times receiving N messages that a producer thread sends as fast as the ring lets it:
//! every message is copied twice (into the ring, out of it), on two threads that overlap.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use mesh_shm::{BulkConsumer, BulkProducer, CopyConfig, CreateMode, Mailbox, MailboxConfig};

const SIZE: usize = 1 << 20;
const CAPACITY: u32 = 4;

fn mailbox(dir: &std::path::Path) -> Mailbox {
    let mb =
        Mailbox::create(dir.join("mb"), &MailboxConfig { size: 8 << 20, slots: 1, channels: 4 }, CreateMode::Exclusive)
            .unwrap();
    mb.create_channel("big", u32::try_from(SIZE).unwrap(), CAPACITY).unwrap();
    mb
}

/// Receives `n` messages that a producer thread sends, copying with `config` at both ends; the time taken.
fn stream(mb: &Mailbox, n: u64, config: CopyConfig) -> Duration {
    let mut tx = BulkProducer::claim_with(mb, "big", config).unwrap();
    let mut rx = BulkConsumer::claim_with(mb, "big", config).unwrap();
    let msg = vec![7u8; SIZE];
    let mut out = vec![0u8; SIZE];
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..n {
                while !tx.try_send(&msg).unwrap() {
                    std::hint::spin_loop();
                }
            }
        });
        let start = Instant::now();
        for _ in 0..n {
            while !rx.try_recv(&mut out).unwrap() {
                std::hint::spin_loop();
            }
            black_box(&out);
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::Builder::new().prefix("mesh-bulk-bench").tempdir_in("/dev/shm").unwrap();
    let mb = mailbox(dir.path());
    let mut g = c.benchmark_group("bulk_1MiB");
    g.throughput(Throughput::Bytes(SIZE as u64));
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(20);
    let src = vec![7u8; SIZE];
    let mut dst = vec![0u8; SIZE];
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        });
    });
    for (name, threads, non_temporal) in [
        ("mailbox/1 thread", 1, false),
        ("mailbox/1 thread, streaming stores", 1, true),
        ("mailbox/2 threads", 2, false),
        ("mailbox/2 threads, streaming stores", 2, true),
    ] {
        let config = CopyConfig { threads, non_temporal, ..CopyConfig::default() };
        g.bench_function(name, |b| b.iter_custom(|n| stream(&mb, n, config)));
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
