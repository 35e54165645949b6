//! The host ends of the test's sequence-checked streams: host to GPU, GPU to host, and a round trip through a GPU echo.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use mesh_shm::{Consumer, Mailbox, Producer};

use super::failure::FirstFailure;
use crate::stress;

/// What a host end of a stream counted. A failure (a lost, torn or reordered message) is kept with
/// its text and stops the thread; repeats are counted (allowed only after a crash, within a bound).
#[derive(Debug, Default)]
pub struct Tally {
    /// Messages sent by a host producer.
    pub sent: AtomicU64,
    /// Messages received by a host consumer (repeats included).
    pub received: AtomicU64,
    /// Distinct messages delivered in order to a host consumer: every sequence number below it came.
    pub delivered: AtomicU64,
    /// Messages that came again (sequence numbers already received).
    pub repeated: AtomicU64,
    /// The first failure.
    pub failure: FirstFailure,
}

impl Tally {
    fn fail(&self, why: String) {
        self.failure.set(why);
    }

    /// The first failure, if any.
    pub fn failed(&self) -> Option<String> {
        self.failure.get()
    }

    /// Reads one counter.
    pub fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Acquire)
    }
}

/// A host thread of a stream: stops when `stop` is set (a producer at once; a consumer once it has
/// everything its producer sent, or after `drain`).
#[derive(Debug)]
pub struct HostEnd {
    /// What it counted.
    pub tally: Arc<Tally>,
    /// The threads.
    pub threads: Vec<JoinHandle<()>>,
}

/// Host → GPU: stress message `seq` at ring position `seq` (the GPU `sink` checks each).
pub fn host_producer(mb: &Mailbox, channel: &str, size: usize, stop: &Arc<AtomicBool>) -> HostEnd {
    let tally = Arc::new(Tally::default());
    let mut tx = Producer::claim(mb, channel).expect("the host end of the host→GPU channel");
    let (t, stop) = (tally.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let mut msg = vec![0u8; size];
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            stress::fill(&mut msg, seq);
            match tx.try_send(&msg) {
                Ok(true) => {
                    seq += 1;
                    t.sent.store(seq, Ordering::Release);
                }
                Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                Err(e) => return t.fail(format!("send {seq}: {e}")),
            }
        }
    });
    HostEnd { tally, threads: vec![thread] }
}

/// GPU → host: the `source`'s stress messages, each checked against the host's own count: exactly
/// once, in order and whole, whatever happens to meshd (a GPU producer resumes at its published head).
pub fn host_consumer(mb: &Mailbox, channel: &str, size: usize, stop: &Arc<AtomicBool>) -> HostEnd {
    let tally = Arc::new(Tally::default());
    let mut rx = Consumer::claim(mb, channel).expect("the host end of the GPU→host channel");
    let (t, stop) = (tally.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let mut msg = vec![0u8; size];
        let mut seq = 0u64;
        loop {
            match rx.try_recv(&mut msg) {
                Ok(true) => {
                    if let Err(e) = stress::check(&msg, seq) {
                        return t.fail(format!("GPU→host: {e}"));
                    }
                    seq += 1;
                    t.received.store(seq, Ordering::Release);
                    t.delivered.store(seq, Ordering::Release);
                }
                Ok(false) if stop.load(Ordering::Relaxed) => return,
                Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                Err(e) => return t.fail(format!("recv {seq}: {e}")),
            }
        }
    });
    HostEnd { tally, threads: vec![thread] }
}

/// Host → GPU echo → host: 16-byte messages (`seq`, `!seq`), at most `window` in flight. A reply
/// ahead of the next one expected is a loss (a failure); one behind it a repeat (counted).
pub fn host_round_trip(mb: &Mailbox, to: &str, from: &str, window: u64, stop: &Arc<AtomicBool>) -> HostEnd {
    let tally = Arc::new(Tally::default());
    let mut tx = Producer::claim(mb, to).expect("the host end of the echo's input");
    let mut rx = Consumer::claim(mb, from).expect("the host end of the echo's output");
    let next = Arc::new(AtomicU64::new(0));
    let sender = {
        let (t, stop, next) = (tally.clone(), stop.clone(), next.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if seq >= next.load(Ordering::Acquire) + window {
                    std::thread::sleep(Duration::from_micros(50));
                    continue;
                }
                let mut m = [0u8; 16];
                m[..8].copy_from_slice(&seq.to_le_bytes());
                m[8..].copy_from_slice(&(!seq).to_le_bytes());
                match tx.try_send(&m) {
                    Ok(true) => {
                        seq += 1;
                        t.sent.store(seq, Ordering::Release);
                    }
                    Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                    Err(e) => return t.fail(format!("send {seq}: {e}")),
                }
            }
        })
    };
    let receiver = {
        let (t, stop) = (tally.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut m = [0u8; 16];
            loop {
                match rx.try_recv(&mut m) {
                    Ok(true) => {
                        t.received.fetch_add(1, Ordering::AcqRel);
                        let a = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
                        let b = u64::from_le_bytes(m[8..].try_into().expect("8 bytes"));
                        let want = next.load(Ordering::Acquire);
                        if b != !a {
                            return t.fail(format!("echo: reply {a} is torn ({b:#x})"));
                        } else if a > want {
                            return t.fail(format!("echo: reply {a} came while {want} was expected: lost"));
                        } else if a < want {
                            t.repeated.fetch_add(1, Ordering::AcqRel);
                        } else {
                            next.store(want + 1, Ordering::Release);
                            t.delivered.store(want + 1, Ordering::Release);
                        }
                    }
                    Ok(false) => {
                        if stop.load(Ordering::Relaxed)
                            && next.load(Ordering::Acquire) >= t.sent.load(Ordering::Acquire)
                        {
                            return;
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    Err(e) => return t.fail(format!("recv: {e}")),
                }
            }
        })
    };
    HostEnd { tally, threads: vec![sender, receiver] }
}
