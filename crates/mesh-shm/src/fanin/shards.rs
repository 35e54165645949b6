//! A fan-in channel of several shards: whole fan-in rings side by side, where `layout` places them.

use core::ptr::NonNull;

use super::completion::{Completion, Hold, complete_dead, hold_at_tail, repair, revoke_live};
use super::memory::FanInMemory;
use super::producer::FanInProducer;
use crate::layout::{self, RingHeader};

/// A fan-in channel's shards: P whole fan-in rings (P a power of two, 1 to
/// [`layout::MAX_FANIN_SHARDS`]), each with its own cursor, tail, owner table and slots, sharing
/// nothing, so that senders contend only with the senders of their shard (one cursor line that every
/// sender writes caps one ring near 3 M sends/s; see `docs/explanation/services.md`). Where each lies
/// is `layout`'s to say ([`layout::fanin_shard_offset`]); one shard is exactly the one ring of a
/// fan-in channel before shards existed.
///
/// A sender sends into shard [`FanInShards::shard_of`] its id (its client slot modulo P) and no
/// other, so its messages stay in order in one ring; a consumer takes from every shard
/// ([`ShardedConsumer`](super::ShardedConsumer)); a completer and the stall watcher look at every shard.
#[derive(Debug, Clone, Copy)]
pub struct FanInShards {
    first: FanInMemory,
    region: NonNull<u8>,
    msg_size: u32,
    capacity: u32,
    count: u32,
}

// SAFETY: as for `FanInMemory`: shared memory by design, every access atomic.
unsafe impl Send for FanInShards {}
// SAFETY: as above; `&FanInShards` only hands out `FanInMemory` views of the same memory.
unsafe impl Sync for FanInShards {}

impl FanInShards {
    /// # Safety
    /// `header` must point to shard 0's [`RingHeader`]; `region` to the channel's slots region,
    /// [`layout::fanin_region_bytes`]`(msg_size, capacity, count)` writable bytes, 128-byte aligned
    /// (every shard's header is then line aligned, its owner table and slots page aligned from it);
    /// all valid for as long as the returned value and its copies are used, and accessed by others
    /// only through this protocol. `count` must be a power of two from 1 to
    /// [`layout::MAX_FANIN_SHARDS`]; `capacity` a power of two below 2^31; `msg_size` a non-zero
    /// multiple of 8. Zeroed memory is every shard empty at position 0.
    pub unsafe fn new(
        header: NonNull<RingHeader>,
        region: NonNull<u8>,
        msg_size: u32,
        capacity: u32,
        count: u32,
    ) -> Self {
        debug_assert!(count.is_power_of_two() && count <= layout::MAX_FANIN_SHARDS);
        // SAFETY: the caller's contract: shard 0's owner table starts the region, its slots
        // `fanin_slots_offset` after it, inside the region's bytes.
        let first = unsafe {
            let slots = region.add(in_region(layout::fanin_slots_offset(capacity)));
            FanInMemory::new(header, region.cast(), slots.cast(), msg_size as usize, u64::from(capacity))
        };
        Self { first, region, msg_size, capacity, count }
    }

    /// How many shards.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Payload bytes per message (every shard's).
    pub fn msg_size(&self) -> usize {
        self.first.msg_size()
    }

    /// Messages each shard holds.
    pub fn capacity(&self) -> u64 {
        self.first.capacity()
    }

    /// Shard `k` (below [`FanInShards::count`]; a caller's bug otherwise, never a file's: the count
    /// is checked when the channel is opened).
    pub fn shard(&self, k: u32) -> FanInMemory {
        assert!(k < self.count, "shard {k} of a fan-in channel of {} shards", self.count);
        if k == 0 {
            return self.first;
        }
        let (m, c) = (self.msg_size, self.capacity);
        // SAFETY: shard k's header, owner table and slots lie in the region `new`'s contract promised
        // (`fanin_region_bytes` counts them), at the offsets `layout` defines; its header is
        // page aligned from the region's start, its owner table and slots page aligned after it.
        unsafe {
            let at = |off: u64| self.region.add(in_region(off));
            FanInMemory::new(
                at(layout::fanin_shard_offset(k, m, c)).cast(),
                at(layout::fanin_shard_owners_offset(k, m, c)).cast(),
                at(layout::fanin_shard_slots_offset(k, m, c)).cast(),
                m as usize,
                u64::from(c),
            )
        }
    }

    /// Every shard, in order.
    pub fn iter(&self) -> impl Iterator<Item = FanInMemory> + '_ {
        (0..self.count).map(|k| self.shard(k))
    }

    /// The shard `sender` sends into: its client slot (the id's low 16 bits) modulo the count.
    pub fn shard_of(&self, sender: u32) -> u32 {
        layout::fanin_shard_of(sender, self.count)
    }

    /// The producer of `sender`, on its shard.
    pub fn producer(&self, sender: u32) -> FanInProducer {
        FanInProducer::new(self.shard(self.shard_of(sender)), sender)
    }

    /// [`complete_dead`] over every shard (a sender only ever reserves in its own, but a completer
    /// that looks at all of them cannot miss one).
    pub fn complete_dead(&self, sender: u32) -> Completion {
        self.iter().fold(Completion::default(), |mut done, ring| {
            done += complete_dead(&ring, sender);
            done
        })
    }

    /// [`revoke_live`] over every shard.
    pub fn revoke_live(&self, sender: u32) -> Completion {
        self.iter().fold(Completion::default(), |mut done, ring| {
            done += revoke_live(&ring, sender);
            done
        })
    }

    /// [`repair`] over every shard: how many skip headers it wrote.
    pub fn repair(&self) -> u32 {
        self.iter().map(|ring| repair(&ring)).sum()
    }

    /// [`hold_at_tail`] of every shard that is held, with the shard's index.
    pub fn holds(&self) -> Vec<(u32, Hold)> {
        (0..self.count).filter_map(|k| hold_at_tail(&self.shard(k)).map(|h| (k, h))).collect()
    }

    /// The sum of every shard's reservation cursor: messages reserved over the channel's life,
    /// modulo 2^64 (for one shard, its cursor).
    pub fn next(&self) -> u64 {
        self.iter().fold(0u64, |n, ring| n.wrapping_add(ring.next()))
    }

    /// The sum of every shard's published consumer position: messages (and skips) taken over the
    /// channel's life, modulo 2^64 (for one shard, its `tail`).
    pub fn tail(&self) -> u64 {
        self.iter().fold(0u64, |n, ring| n.wrapping_add(ring.tail()))
    }
}

/// An offset inside a region the caller's contract says is in memory, as a `usize`.
#[allow(clippy::cast_possible_truncation, reason = "an offset inside memory that exists fits a usize")]
const fn in_region(off: u64) -> usize {
    off as usize
}
