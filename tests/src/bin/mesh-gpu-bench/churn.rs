//! `mesh-gpu-bench churn blink|mps`: what creating and deleting channels and services costs a program that binds none of them.
//!
//! A bystander, `echo_header` (the header's loop) on two host channels, answers round trips from this
//! process without a pause, through three windows: quiet, then while another thread runs
//! `--cycles` create/delete cycles (default 1000), paced over as long as a quiet window, on the same
//! mailbox, then quiet again. A cycle creates one channel (LL, bulk or index, 8 B to 16 MiB a
//! message) or one service (a fan-in channel and its reply group) and deletes the oldest of the 8 it
//! keeps alive, as meshd's control plane does: the mailbox's table lock, the ring arena's allocator,
//! and the new ring zeroed by the host while the bystander polls its own ring. Every round trip is checked. The figure is the bystander's slowest
//! round trip in the churn window beside its slowest in the quiet windows, the same program in the
//! same run (its normal variation), with the medians and the 99.9th percentiles beside them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mesh_gpu_tests::stress;
use mesh_shm::mailbox::SERVICE_REPLIES_SUFFIX;
use mesh_shm::{Consumer, Mailbox, Placement, Producer, Protocol, ShmError};

use crate::roundtrip::Bench;
use crate::us;

/// The live channels and services a churn keeps: each cycle adds one and deletes the oldest.
const LIVE: usize = 8;
/// Each quiet window's length.
const QUIET: Duration = Duration::from_secs(3);

/// What one cycle creates.
#[derive(Debug, Clone, Copy)]
enum Made {
    Channel,
    Service,
}

/// splitmix64: a fixed seed, so that every run churns the same sizes.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
    /// `1 << e` for `e` uniform in `lo..=hi`: sizes spread over decades.
    fn pow2(&mut self, lo: u32, hi: u32) -> u32 {
        1 << (lo + u32::try_from(self.below(u64::from(hi - lo + 1))).expect("an exponent below 32"))
    }
}

/// The churn's tally.
#[derive(Debug, Default)]
struct Tally {
    cycles: u64,
    /// Creates refused because the mailbox was full (descriptors or arena bytes) or fragmented.
    refused: u64,
    /// The cycles' own time, the pacing between them left out.
    took: Duration,
}

/// One create (of a kind and size drawn from `rng`) and, beyond [`LIVE`], one delete of the oldest.
fn cycle(mb: &Mailbox, rng: &mut Rng, live: &mut VecDeque<(String, Made)>, n: u64, tally: &mut Tally) {
    let name = format!("churn{n}");
    let channel = |protocol, size, capacity| {
        mb.create_channel_with(&name, size, capacity, Placement::Host, protocol).map(|_| Made::Channel)
    };
    // Each draw's size first, then its capacity.
    let made = match rng.below(4) {
        0 => channel(Protocol::Ll, rng.pow2(3, 16), rng.pow2(1, 6)),
        1 => channel(Protocol::Bulk, rng.pow2(4, 24), rng.pow2(1, 2)),
        2 => channel(Protocol::Index, rng.pow2(3, 16), rng.pow2(1, 6)),
        _ => {
            let (size, clients) = (rng.pow2(3, 10), rng.pow2(0, 3));
            match mb.create_fanin(&name, size, 16, 4) {
                Ok(_) => match mb.create_group(&format!("{name}{SERVICE_REPLIES_SUFFIX}"), clients, size, 16) {
                    Ok(_) => Ok(Made::Service),
                    Err(e) => {
                        // The fan-in channel made alone goes as the service it was to be.
                        mb.delete_service(&name, true).unwrap_or_else(|d| panic!("deleting {name} alone: {d}"));
                        Err(e)
                    }
                },
                Err(e) => Err(e),
            }
        }
    };
    let refused = match made {
        Ok(m) => {
            live.push_back((name, m));
            false
        }
        Err(ShmError::Full { .. }) => true,
        Err(e) => panic!("creating {name}: {e}"),
    };
    tally.refused += u64::from(refused);
    // Beyond LIVE the oldest goes; after a refusal too, so that the next create finds room.
    if live.len() > LIVE || (refused && !live.is_empty()) {
        let (old, m) = live.pop_front().expect("one is live");
        delete(mb, &old, m);
    }
    tally.cycles += 1;
}

fn delete(mb: &Mailbox, name: &str, made: Made) {
    match made {
        Made::Channel => mb.delete_channel(name, true),
        Made::Service => mb.delete_service(name, true),
    }
    .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
}

/// Round trips through the bystander until `until` says so, each timed and checked; `seq` carries the
/// sequence across windows.
fn round_trips(tx: &mut Producer, rx: &mut Consumer, seq: &mut u64, until: impl Fn() -> bool) -> Vec<Duration> {
    let (mut msg, mut back) = (vec![0u8; 64], vec![0u8; 64]);
    let mut times = Vec::new();
    while !until() {
        stress::fill(&mut msg, *seq);
        let t = Instant::now();
        while !tx.try_send(&msg).unwrap() {}
        while !rx.try_recv(&mut back).unwrap() {
            std::hint::spin_loop();
        }
        times.push(t.elapsed());
        stress::check(&back, *seq).unwrap_or_else(|e| panic!("the bystander's round trip {seq}: {e}"));
        *seq += 1;
    }
    times
}

/// (median, 99.9th percentile, largest) in µs.
fn summary(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort_unstable();
    (us(v[v.len() / 2]), us(v[v.len() * 999 / 1000]), us(v[v.len() - 1]))
}

pub fn churn_bench(mps: bool) {
    let cycles: u64 = crate::opt("cycles").map_or(1000, |v| v.parse().unwrap_or_else(|e| panic!("--cycles {v}: {e}")));
    let mut b = Bench::open(mps);
    let mode = b.mode;
    let (to, from) = (b.channel(64, 64, Placement::Host), b.channel(64, 64, Placement::Host));
    b.load_block("bystander", "echo_header", &[&to, &from], 32);
    let mut tx = Producer::claim(&b.mb, &to).unwrap();
    let mut rx = Consumer::claim(&b.mb, &from).unwrap();
    let mut seq = 0;
    // Warm-up: the first round trips pay for the program's first poll.
    let warm = Instant::now();
    round_trips(&mut tx, &mut rx, &mut seq, || warm.elapsed() > Duration::from_millis(300));

    let t = Instant::now();
    let before = round_trips(&mut tx, &mut rx, &mut seq, || t.elapsed() > QUIET);

    let done = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let churn = {
        let (mb, done, tally) = (b.mb.clone(), done.clone(), tally.clone());
        std::thread::spawn(move || {
            let (mut rng, mut live, mut t) = (Rng(0x6d65_7368), VecDeque::new(), Tally::default());
            // Paced over a quiet window's length, so that the churn window's figures (its largest
            // round trip above all) compare with the quiet windows' over as many round trips.
            let start = Instant::now();
            for n in 0..cycles {
                let at = Instant::now();
                cycle(&mb, &mut rng, &mut live, n, &mut t);
                t.took += at.elapsed();
                let next = start + QUIET.mul_f64((n + 1) as f64 / cycles as f64);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            for (old, m) in live {
                delete(&mb, &old, m);
            }
            *tally.lock().unwrap() = t;
            done.store(true, Ordering::Release);
        })
    };
    let during = round_trips(&mut tx, &mut rx, &mut seq, || done.load(Ordering::Acquire));
    churn.join().expect("the churn thread");
    let t = Instant::now();
    let after = round_trips(&mut tx, &mut rx, &mut seq, || t.elapsed() > QUIET);
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    let usage = b.mb.arena_usage();
    drop((tx, rx));
    b.backend.unload("bystander").unwrap();
    b.shutdown();

    let (q1, q2, d) = (summary(before.clone()), summary(after.clone()), summary(during.clone()));
    println!();
    println!(
        "A bystander (echo_header, 64 B host round trips, {mode} mode) while another thread of this process \
         creates and deletes channels and services: {} cycles paced over {QUIET:?}, {:.3} s of work ({:.0} µs a cycle), {} creates refused \
         (mailbox full or fragmented); afterwards {} bytes of the arena in use.",
        tally.cycles,
        tally.took.as_secs_f64(),
        us(tally.took) / tally.cycles.max(1) as f64,
        tally.refused,
        usage.in_use
    );
    println!("| window | round trips | median µs | p99.9 µs | largest µs |");
    println!("|---|---:|---:|---:|---:|");
    for (name, n, s) in
        [("quiet, before", before.len(), q1), ("during the churn", during.len(), d), ("quiet, after", after.len(), q2)]
    {
        println!("| {name} | {n} | {:.2} | {:.2} | {:.2} |", s.0, s.1, s.2);
    }
    let quiet_largest = q1.2.max(q2.2);
    let figure = format!("bystander's largest round trip during {} create/delete cycles, {mode}", tally.cycles);
    crate::results::record(
        "churn",
        &figure,
        d.2,
        "µs",
        Some(("largest round trip, quiet windows", quiet_largest)),
        None,
    );
    let figure = format!("bystander's p99.9 round trip during {} create/delete cycles, {mode}", tally.cycles);
    crate::results::record(
        "churn",
        &figure,
        d.1,
        "µs",
        Some(("p99.9 round trip, quiet windows", q1.1.max(q2.1))),
        None,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The churn itself, on a mailbox alone: every cycle's create is made or refused as full, its
    /// deletes succeed, and the arena is back to its starting figure at the end.
    #[test]
    fn a_churn_of_every_kind_leaves_the_arena_as_it_found_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = mesh_shm::MailboxConfig { size: 64 << 20, slots: 64, channels: 1024 };
        let mb = Mailbox::create(dir.path().join("mb"), &config, mesh_shm::CreateMode::Exclusive).unwrap();
        mb.create_channel("stays", 64, 64).unwrap();
        let start = mb.arena_usage();
        let (mut rng, mut live, mut tally) = (Rng(0x6d65_7368), VecDeque::new(), Tally::default());
        for n in 0..2000 {
            cycle(&mb, &mut rng, &mut live, n, &mut tally);
            assert!(live.len() <= LIVE, "cycle {n}: {} live", live.len());
        }
        assert!(live.iter().any(|(_, m)| matches!(m, Made::Service)), "services among the live ones");
        for (old, m) in live {
            delete(&mb, &old, m);
        }
        assert_eq!(tally.cycles, 2000);
        assert!(tally.refused < 2000 / 4, "{} of 2000 creates refused", tally.refused);
        assert_eq!(mb.arena_usage().in_use, start.in_use, "the arena's bytes in use after the churn");
    }
}
