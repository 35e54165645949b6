//! The fan-in ring's host side alone (`mesh-gpu-bench fanin-host`): N sender threads, each a
//! `FanInSender` with its own id, sending 64-byte requests as fast as the ring takes them into one
//! fan-in channel of a mailbox in /dev/shm, and one consumer thread (`FanInReceiver`) taking them:
//! aggregate requests/s for N = 1, 2, 4, 8, 16 (up to the CPUs less one), 1 s each after 0.2 s of
//! warm-up, and each sender's mean time per `try_send` that succeeded. No GPU: it separates what the
//! host protocol (the shared cursor, the owner table's compare-and-swaps) costs from what the GPU's
//! polling of the same memory adds in `mesh-gpu-bench service`, which tops out near 2 M requests/s
//! from 8 clients on with one shard: the host side alone tops out there too, and falls as senders are
//! added (the shared reservation cursor and the owner table's lines, not the GPU).
//!
//! A second table measures fan-in shards (docs/explanation/services.md, "Shards"): the same
//! senders into one fan-in channel of P = 1, 2, 4, 8 shards (`Mailbox::create_fanin`'s last
//! argument), each shard a whole ring of the same capacity with its own cursor; sender s (client slot
//! s + 1) sends into shard (s + 1) % P, and the one consumer thread (`FanInReceiver`) takes from the
//! shards round-robin.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mesh_shm::{ClientId, CreateMode, FanInReceiver, FanInSender, Mailbox, MailboxConfig};

const MSG: u32 = 64;
const CAPACITY: u32 = 256;
const WARMUP: Duration = Duration::from_millis(200);
const WINDOW: Duration = Duration::from_secs(1);
const SHARD_WINDOW: Duration = Duration::from_millis(500);

/// One measurement: `senders` threads into fan-in channel `name` (each into its shard), one
/// consumer taking from it (its shards round-robin). Aggregate requests/s taken, and the senders'
/// mean ns per successful send.
fn row(mailbox: &Mailbox, name: &str, senders: u16, window: Duration) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let send_ns = Arc::new(AtomicU64::new(0));
    let sends = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(usize::from(senders) + 1));
    let mut threads = Vec::new();
    for s in 0..senders {
        let mut tx = FanInSender::open(mailbox, name, ClientId::new(s + 1, 1)).expect("a sender");
        let (stop, measuring, send_ns, sends, start) =
            (stop.clone(), measuring.clone(), send_ns.clone(), sends.clone(), start.clone());
        threads.push(std::thread::spawn(move || {
            let mut msg = [0u8; MSG as usize];
            let (mut ns, mut n) = (0u64, 0u64);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                msg[..8].copy_from_slice(&n.to_le_bytes());
                let t = Instant::now();
                if tx.try_send(&msg).expect("a send") && measuring.load(Ordering::Relaxed) {
                    ns += u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    n += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
            send_ns.fetch_add(ns, Ordering::Relaxed);
            sends.fetch_add(n, Ordering::Relaxed);
        }));
    }
    let mut rx = FanInReceiver::claim(mailbox, name).expect("the consumer");
    let mut out = [0u8; MSG as usize];
    start.wait();
    let mut taken = 0u64;
    let began = Instant::now();
    let mut window_start = None;
    loop {
        if rx.try_take(&mut out).expect("a take").is_some() {
            taken += 1;
        }
        let now = Instant::now();
        match window_start {
            None if now - began >= WARMUP => {
                window_start = Some((now, taken));
                measuring.store(true, Ordering::Relaxed);
            }
            Some((at, _)) if now - at >= window => break,
            _ => {}
        }
    }
    let (at, before) = window_start.expect("the window began");
    let rate = (taken - before) as f64 / at.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    // Drain what the senders still put in, so that they finish (a sender never waits, but a full
    // ring would leave it spinning).
    for t in threads {
        while !t.is_finished() {
            let _ = rx.try_take(&mut out);
        }
        t.join().expect("a sender thread");
    }
    drop(rx);
    let n = sends.load(Ordering::Relaxed).max(1);
    (rate, send_ns.load(Ordering::Relaxed) as f64 / n as f64)
}

/// `mesh-gpu-bench fanin-host`.
pub fn fanin_host() {
    let dir =
        tempfile::Builder::new().prefix("mesh-fanin-bench").tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    let config = MailboxConfig { size: 16 << 20, slots: 8, channels: 64 };
    let mailbox = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).expect("a mailbox");
    let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    // Sender counts that leave a CPU for the consumer (one sender whatever the machine);
    // `--senders` (comma-separated, each 1 to 64) overrides them, oversubscribed or not.
    let given: Vec<u16> = crate::opt_list("senders")
        .unwrap_or_default()
        .iter()
        .filter_map(|w| w.parse().ok())
        .filter(|n| (1..=64).contains(n))
        .collect();
    let counts: Vec<u16> = if given.is_empty() {
        [1u16, 2, 4, 8, 16]
            .into_iter()
            .enumerate()
            .filter(|&(i, n)| i == 0 || usize::from(n) < cpus)
            .map(|(_, n)| n)
            .collect()
    } else {
        given
    };
    let mut made = 0;
    let mut fresh = |shards: u32| -> String {
        // A fresh channel per measurement: the senders' ids start over.
        made += 1;
        let name = format!("fanin-{made}");
        mailbox.create_fanin(&name, MSG, CAPACITY, shards).expect("a fan-in channel");
        name
    };
    println!();
    println!("Fan-in ring, host only: N sender threads into one fan-in channel ({MSG} B, capacity {CAPACITY}),");
    println!("one consumer thread, /dev/shm mailbox, {cpus} CPUs; 1 s per row after 0.2 s of warm-up.");
    println!();
    println!("| senders | requests/s taken | × 1 sender | mean ns per successful try_send |");
    println!("|---:|---:|---:|---:|");
    let mut one = None;
    for &senders in &counts {
        let (rate, ns) = row(&mailbox, &fresh(1), senders, WINDOW);
        let base = *one.get_or_insert(rate);
        println!("| {senders} | {rate:.0} | {:.2} | {ns:.0} |", rate / base);
    }
    println!();
    println!("The same senders into one fan-in channel of P shards (capacity {CAPACITY} each; sender s, client");
    println!("slot s + 1, into shard (s + 1) % P; the one consumer takes from the shards round-robin): requests/s");
    println!("taken, 0.5 s per cell after 0.2 s of warm-up. P above the senders leaves shards idle, which the");
    println!("consumer still looks at.");
    println!();
    println!("| senders | P = 1 | P = 2 | P = 4 | P = 8 |");
    println!("|---:|---:|---:|---:|---:|");
    for &senders in &counts {
        let cells: Vec<String> = [1u32, 2, 4, 8]
            .into_iter()
            .map(|p| {
                let (rate, _) = row(&mailbox, &fresh(p), senders, SHARD_WINDOW);
                format!("{rate:.0}")
            })
            .collect();
        println!("| {senders} | {} |", cells.join(" | "));
    }
}
