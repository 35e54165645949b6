//! The model test the two message rings share (LL's [`crate::ring`] and [`crate::index_ring`]): any
//! sequence of sends and receives, single and batched, and restarts of either end, gives what a
//! bounded queue of `capacity` messages gives, and the published indices count what is in flight.
//! Each ring's tests drive it through [`ModelRing`] from their own `proptest!`, with the start
//! indices that matter to that ring's format.

use std::collections::VecDeque;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// A message of `size` bytes whose every byte says where it is and which message it is from.
pub fn pattern(size: usize, salt: u8) -> Vec<u8> {
    (0..size).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect()
}

/// A ring under test, through its two ends' calls (each end's core, over the same memory).
pub trait ModelRing {
    /// Sends one message; false: full.
    fn push(&mut self, msg: &[u8]) -> bool;
    /// Sends as many of `msgs` as fit, publishing once; how many.
    fn push_batch(&mut self, msgs: &[Vec<u8>]) -> u64;
    /// Receives one message into `out`; false: empty.
    fn pop(&mut self, out: &mut [u8]) -> bool;
    /// Receives as many whole messages as `out` holds and the ring has; how many.
    fn pop_batch(&mut self, out: &mut [u8]) -> u64;
    /// The producer's process dies and a new one claims the end (a new core over the same memory).
    fn restart_producer(&mut self);
    /// The consumer's process dies and a new one claims the end.
    fn restart_consumer(&mut self);
    /// `head - tail` as published in the ring's header.
    fn in_flight(&self) -> u64;
}

/// One step of the model test.
#[derive(Debug, Clone)]
pub enum Op {
    /// Send one message of this many bytes (at most the message size; shorter is zero-padded).
    Push(usize),
    /// Send this many whole messages in one batch.
    PushBatch(usize),
    /// Receive one message.
    Pop,
    /// Receive up to this many messages in one batch.
    PopBatch(usize),
    /// The producer's process dies and a new one claims the end.
    RestartProducer,
    /// The consumer's process dies and a new one claims the end.
    RestartConsumer,
}

/// The steps, sends and receives four times as likely as each restart.
pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..=80).prop_map(Op::Push),
        2 => (0usize..20).prop_map(Op::PushBatch),
        4 => Just(Op::Pop),
        2 => (1usize..20).prop_map(Op::PopBatch),
        1 => Just(Op::RestartProducer),
        1 => Just(Op::RestartConsumer),
    ]
}

/// Runs `ops` on `ring` (messages of `size` bytes, `capacity` slots) beside a queue, checking every
/// answer, every message received and the published indices after each step.
pub fn check(ring: &mut impl ModelRing, size: usize, capacity: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut model: VecDeque<Vec<u8>> = VecDeque::new();
    let mut salt = 0u8;
    for op in ops {
        match op {
            Op::Push(len) => {
                salt = salt.wrapping_add(1);
                let msg = pattern(len.min(size), salt);
                let sent = ring.push(&msg);
                prop_assert_eq!(sent, (model.len() as u64) < capacity);
                if sent {
                    let mut padded = msg.clone();
                    padded.resize(size, 0);
                    model.push_back(padded);
                }
            }
            Op::PushBatch(k) => {
                salt = salt.wrapping_add(1);
                let msgs: Vec<Vec<u8>> = (0..k).map(|i| pattern(size, salt ^ (i as u8) << 4)).collect();
                let sent = ring.push_batch(&msgs) as usize;
                prop_assert_eq!(sent, k.min(capacity as usize - model.len()));
                model.extend(msgs.into_iter().take(sent));
            }
            Op::Pop => {
                let mut out = vec![0u8; size];
                let got = ring.pop(&mut out);
                prop_assert_eq!(got, !model.is_empty());
                if got {
                    prop_assert_eq!(&out, &model.pop_front().unwrap());
                }
            }
            Op::PopBatch(k) => {
                let mut out = vec![0u8; size * k];
                let got = ring.pop_batch(&mut out) as usize;
                prop_assert_eq!(got, k.min(model.len()));
                for record in out.chunks(size).take(got) {
                    prop_assert_eq!(record, &model.pop_front().unwrap()[..]);
                }
            }
            Op::RestartProducer => ring.restart_producer(),
            Op::RestartConsumer => ring.restart_consumer(),
        }
        prop_assert_eq!(ring.in_flight(), model.len() as u64);
    }
    Ok(())
}
