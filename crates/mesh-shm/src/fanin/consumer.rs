//! The consumer of a fan-in ring (a host server's), and of every shard of a fan-in channel round-robin.

use core::sync::atomic::Ordering;

use super::memory::{FanInCorrupt, FanInMemory, HEADER_WORDS, KIND_DATA, KIND_SKIP, LOW};
use super::shards::FanInShards;
use crate::ring::tag;

/// What the consumer took from a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A message from this sender, copied into the caller's buffer.
    Message {
        /// The sender id its producer wrote.
        sender: u32,
    },
    /// A slot completed as a skip: it carries nothing (the sender's send was cut off by its death,
    /// or revoked and sent again later). The buffer is untouched.
    Skipped {
        /// The sender whose reservation it was.
        sender: u32,
    },
}

/// The single consumer's private state (a host consumer; the GPU's is in `mesh.cuh`, same rules).
#[derive(Debug)]
pub struct FanInConsumer {
    ring: FanInMemory,
    tail: u64,
}

impl FanInConsumer {
    /// Takes over the consumer end at the published `tail` (a consumer that died after taking a
    /// message and before publishing gives it again: a host consumer publishes on every take).
    pub fn new(ring: FanInMemory) -> Self {
        Self { ring, tail: ring.tail() }
    }

    /// The sequence number of the next slot to take.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// Takes the next slot: a message (copied into `out`, exactly the message size) with its
    /// sender, a skip, or `None` when the slot is not committed yet. Publishes `tail`.
    pub fn try_take(&mut self, out: &mut [u8]) -> Result<Option<Taken>, FanInCorrupt> {
        assert_eq!(out.len(), self.ring.msg_size, "the buffer must be one message");
        let seq = self.tail;
        let w = self.ring.words(seq);
        let t = tag(seq);
        // Acquire on the commit word: a host producer's Release store of it covers every other word.
        let w0 = w[0].load(Ordering::Acquire);
        if (w0 >> 32) as u32 != t {
            return Ok(None);
        }
        let w1 = w[1].load(Ordering::Relaxed);
        if (w1 >> 32) as u32 != t {
            return Ok(None); // still arriving (a GPU-side reader can see word 0 first)
        }
        #[allow(clippy::cast_possible_truncation, reason = "a word's payload is its low half")]
        let (sender, kind) = ((w0 & LOW) as u32, (w1 & LOW) as u32);
        let taken = match kind {
            KIND_SKIP => Taken::Skipped { sender },
            KIND_DATA => {
                // Every word checked, as the GPU does: the protocol does not need it on the host
                // (the Acquire above does), but a slot that fails it is a bug we want to see, not read.
                let mut whole = true;
                for (word, o) in w[HEADER_WORDS..].iter().zip(out.chunks_exact_mut(4)) {
                    let v = word.load(Ordering::Relaxed);
                    whole &= (v >> 32) as u32 == t;
                    #[allow(clippy::cast_possible_truncation, reason = "a word's payload is its low half")]
                    o.copy_from_slice(&(v as u32).to_le_bytes());
                }
                if !whole {
                    return Ok(None);
                }
                Taken::Message { sender }
            }
            kind => return Err(FanInCorrupt::Kind { seq, kind }),
        };
        self.tail = seq.wrapping_add(1);
        // Release: our reads of the slot happen before any producer's Acquire of this `tail` and its
        // stores into the slot's next lap.
        self.ring.header().consumer.tail.store(self.tail, Ordering::Release);
        Ok(Some(taken))
    }
}

/// The consumer of every shard of a fan-in channel (a host server's): one [`FanInConsumer`] per
/// shard, taken from round-robin, one message or skip at a time from the next shard that has one, so
/// that no shard's senders wait behind another's. Order holds within a shard (so for every sender),
/// not across shards.
#[derive(Debug)]
pub struct ShardedConsumer {
    shards: Vec<FanInConsumer>,
    next: usize,
}

impl ShardedConsumer {
    /// Takes over every shard's consumer end at its published `tail` (see [`FanInConsumer::new`]);
    /// the round-robin starts at shard 0.
    pub fn new(shards: &FanInShards) -> Self {
        Self { shards: shards.iter().map(FanInConsumer::new).collect(), next: 0 }
    }

    /// How many shards.
    pub fn count(&self) -> u32 {
        u32::try_from(self.shards.len()).unwrap_or(u32::MAX)
    }

    /// Each shard's next sequence number to take.
    pub fn positions(&self) -> Vec<u64> {
        self.shards.iter().map(FanInConsumer::position).collect()
    }

    /// The sum of the shards' positions: slots taken over the channel's life, modulo 2^64. For one
    /// shard, exactly the sequence number of its next slot ([`FanInConsumer::position`]).
    pub fn position(&self) -> u64 {
        self.shards.iter().fold(0u64, |n, c| n.wrapping_add(c.position()))
    }

    /// Takes the next slot of the first shard, from the one after the last taken from, that has one:
    /// the shard's index and what it held (as [`FanInConsumer::try_take`]), or `None` when no shard
    /// has a committed slot at its position. An impossible state comes with its shard's index.
    pub fn try_take(&mut self, out: &mut [u8]) -> Result<Option<(u32, Taken)>, (u32, FanInCorrupt)> {
        let n = self.shards.len();
        for i in 0..n {
            let k = (self.next + i) % n;
            #[allow(clippy::cast_possible_truncation, reason = "at most MAX_FANIN_SHARDS shards")]
            let shard = k as u32;
            if let Some(t) = self.shards[k].try_take(out).map_err(|c| (shard, c))? {
                self.next = (k + 1) % n;
                return Ok(Some((shard, t)));
            }
        }
        Ok(None)
    }
}
