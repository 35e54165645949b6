//! The chaos test's host streams: a producer and a consumer in this process on one channel, every
//! message checked for loss, repetition, reordering and tearing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use mesh_shm::{Consumer, Mailbox, Producer};

use crate::daemon::Rng;

/// Message `seq` of a stream: word 0 the sequence number, every other word a function of it and of
/// the word's place, so that a lost, repeated, reordered or torn message cannot pass.
pub fn fill(buf: &mut [u8], stream: u64, seq: u64) {
    for (k, w) in buf.chunks_mut(8).enumerate() {
        let v = if k == 0 { seq } else { Rng(seq ^ (stream << 48) ^ ((k as u64) << 32)).next() };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// What one stream's consumer saw.
#[derive(Default)]
pub struct Tally {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub lost: AtomicU64,
    pub repeated: AtomicU64,
    pub torn: AtomicU64,
}

/// A host producer and consumer on one channel, in this process, running until `stop` and drained.
pub fn stream(
    mb: &Mailbox,
    name: &str,
    index: u64,
    size: usize,
    stop: &Arc<AtomicBool>,
) -> (Arc<Tally>, [std::thread::JoinHandle<()>; 2]) {
    let tally = Arc::new(Tally::default());
    let producer = {
        let (mut tx, stop, tally) = (Producer::claim(mb, name).unwrap(), stop.clone(), tally.clone());
        std::thread::spawn(move || {
            let mut msg = vec![0u8; size];
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                fill(&mut msg, index, seq);
                if tx.try_send(&msg).unwrap() {
                    seq += 1;
                    tally.sent.store(seq, Ordering::Release);
                    // A stream, not a flood: the machine is shared, and meshd must get its turn.
                    if seq % 16 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                } else {
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
        })
    };
    let consumer = {
        let (mut rx, stop, tally) = (Consumer::claim(mb, name).unwrap(), stop.clone(), tally.clone());
        std::thread::spawn(move || {
            let (mut msg, mut want) = (vec![0u8; size], vec![0u8; size]);
            let mut next = 0u64;
            loop {
                if rx.try_recv(&mut msg).unwrap() {
                    tally.received.fetch_add(1, Ordering::Relaxed);
                    let seq = u64::from_le_bytes(msg[..8].try_into().unwrap());
                    fill(&mut want, index, seq);
                    if msg != want {
                        tally.torn.fetch_add(1, Ordering::Relaxed);
                    } else if seq < next {
                        tally.repeated.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tally.lost.fetch_add(seq - next, Ordering::Relaxed);
                        next = seq + 1;
                    }
                } else if stop.load(Ordering::Relaxed)
                    && tally.received.load(Ordering::Relaxed) >= tally.sent.load(Ordering::Acquire)
                {
                    return;
                } else {
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
        })
    };
    (tally, [producer, consumer])
}
