//! rtrb, an LL channel and an index channel streaming thread to thread, alternated round by round in one process: the ratios of one round, whose three rows ran within a second of each other.
//!
//! `cargo bench -p mesh-shm --bench interleaved [-- ROUNDS]` (default 15; run it under `chrt -f 1` on
//! a shared machine). Criterion's `channels` bench runs each row for seconds, one after the other; on a
//! VM whose speed changes with where the hypervisor puts its vCPUs (a factor of 5 for the same binary,
//! BENCHMARKS.md) two rows of one run may then be measured in different states. Here each round
//! streams 1 M messages of 8 B and then of 64 B through each of the three, and the figure is the
//! median over rounds of each round's ratio. Every message is sequence-checked by the receiver, as
//! rtrb's receiver checks it; the mesh ends are the `Producer` / `Consumer` every host client uses,
//! with fixed-size arrays as rtrb's `[u8; N]`.

use std::time::Instant;

use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Placement, Producer, Protocol};

const CAPACITY: u32 = 1024;

/// ns per message streaming `messages` through rtrb.
fn rtrb_round<const N: usize>(messages: u64) -> f64 {
    let (mut p, mut c) = rtrb::RingBuffer::<[u8; N]>::new(CAPACITY as usize);
    let receiver = std::thread::spawn(move || {
        let mut expect = 0u64;
        while expect < messages {
            if let Ok(m) = c.pop() {
                // The whole message is taken, as the mesh receiver's copy takes it: not only the 8 bytes checked.
                let m = std::hint::black_box(m);
                assert_eq!(u64::from_le_bytes(m[..8].try_into().unwrap()), expect, "rtrb: out of order");
                expect += 1;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut msg = [0u8; N];
    let start = Instant::now();
    for i in 0..messages {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        // The message is read from memory, as an application's would be, in all three rows (else the
        // compiler may build rtrb's by-value copy in registers from the constant zeros and `i`).
        std::hint::black_box(&mut msg);
        while p.push(msg).is_err() {
            std::hint::spin_loop();
        }
    }
    receiver.join().unwrap();
    start.elapsed().as_secs_f64() * 1e9 / messages as f64
}

/// ns per message streaming `messages` through channel `name` of `mb`.
fn mesh_round<const N: usize>(mb: &Mailbox, name: &str, messages: u64) -> f64 {
    let mut p = Producer::claim(mb, name).unwrap();
    let (mb2, name2) = (mb.clone(), name.to_string());
    let receiver = std::thread::spawn(move || {
        // Claimed on the receiving thread, so that its state lives on that thread's stack.
        let mut c = Consumer::claim(&mb2, &name2).unwrap();
        let mut out = [0u8; N];
        let mut expect = 0u64;
        while expect < messages {
            if c.try_recv(&mut out).unwrap() {
                std::hint::black_box(&out);
                assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), expect, "mesh: out of order");
                expect += 1;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut msg = [0u8; N];
    let start = Instant::now();
    for i in 0..messages {
        msg[..8].copy_from_slice(&i.to_le_bytes());
        std::hint::black_box(&mut msg);
        while !p.try_send(&msg).unwrap() {
            std::hint::spin_loop();
        }
    }
    receiver.join().unwrap();
    start.elapsed().as_secs_f64() * 1e9 / messages as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One size: `rounds` rounds of rtrb, LL, index; prints each round and the medians.
fn size<const N: usize>(dir: &std::path::Path, rounds: usize, messages: u64) {
    let mut rows = Vec::new();
    for round in 0..rounds {
        let path = dir.join(format!("mb{N}-{round}"));
        let mb = Mailbox::create(&path, &MailboxConfig { size: 4 << 20, slots: 1, channels: 2 }, CreateMode::Exclusive)
            .unwrap();
        let size = u32::try_from(N).unwrap();
        mb.create_channel_with("ll", size, CAPACITY, Placement::Host, Protocol::Ll).unwrap();
        mb.create_channel_with("index", size, CAPACITY, Placement::Host, Protocol::Index).unwrap();
        let (r, l, i) =
            (rtrb_round::<N>(messages), mesh_round::<N>(&mb, "ll", messages), mesh_round::<N>(&mb, "index", messages));
        println!(
            "{N:>3} B round {round:>2}: rtrb {r:6.2} ns  ll {l:6.2} ns  index {i:6.2} ns  index/rtrb {:.2}",
            i / r
        );
        rows.push((r, l, i));
        drop(mb);
        let _ = std::fs::remove_file(&path);
    }
    let m = |f: fn(&(f64, f64, f64)) -> f64| median(rows.iter().map(f).collect());
    println!(
        "{N:>3} B medians: rtrb {:.2} ns, ll {:.2} ns, index {:.2} ns; of each round's ratio: index/rtrb {:.2}, \
         ll/rtrb {:.2}, index/ll {:.2}",
        m(|r| r.0),
        m(|r| r.1),
        m(|r| r.2),
        m(|r| r.2 / r.0),
        m(|r| r.1 / r.0),
        m(|r| r.2 / r.1),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this without it, as a test: one
    // short round, every message still sequence-checked. A number among the arguments is the round count.
    let bench = std::env::args().any(|a| a == "--bench");
    let rounds = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(if bench { 15 } else { 1 });
    let messages = if bench { 1_000_000 } else { 20_000 };
    // /dev/shm, as meshd's mailbox.
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    size::<8>(dir.path(), rounds, messages);
    size::<64>(dir.path(), rounds, messages);
}
