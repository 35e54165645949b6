//! The index logic every ring format shares (LL, bulk, index): where an end resumes, the cached copy of the other end's index, when it is read again, what is impossible.
//!
//! A ring of `capacity` slots has two indices in its [`RingHeader`], each on its own line with one
//! writer: `head` (messages ever sent, the producer's) and `tail` (messages ever received, the
//! consumer's). Message `seq` lives in slot `seq & (capacity - 1)`. The producer may write message
//! `seq` once `tail > seq - capacity` (its Acquire load of `tail` orders the consumer's reads of the
//! slot's last lap before the producer's stores); `head - tail` above `capacity`, read as an unsigned
//! distance, is impossible. How a consumer learns that a message is whole differs per format (a tag
//! in every word, a flag per slot, the producer's `head`) and stays in each format's module; this one
//! holds what is the same, so that the formats cannot drift apart.
//!
//! Kept free of files and mappings so that Miri runs it over heap memory with the formats' tests.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use crate::layout::RingHeader;

/// The ring's indices say something impossible: the producer is more than a ring ahead of the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt {
    /// The producer index read.
    pub head: u64,
    /// The consumer index read.
    pub tail: u64,
}

/// A ring's header and capacity: the indices' memory.
#[derive(Debug, Clone, Copy)]
pub struct RingIndices {
    header: NonNull<RingHeader>,
    capacity: u64,
}

// SAFETY: the header is shared memory by design and holds only atomics.
unsafe impl Send for RingIndices {}
// SAFETY: as above; `&RingIndices` exposes only atomic accesses.
unsafe impl Sync for RingIndices {}

impl RingIndices {
    /// # Safety
    /// `header` must point to a [`RingHeader`], valid for as long as the returned value and its copies
    /// are used; `capacity` must be a non-zero power of two.
    pub unsafe fn new(header: NonNull<RingHeader>, capacity: u64) -> Self {
        debug_assert!(capacity.is_power_of_two());
        Self { header, capacity }
    }

    /// Messages the ring holds.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    #[inline]
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: `new`'s contract keeps the header valid; it is only accessed through atomics.
        unsafe { self.header.as_ref() }
    }

    /// The producer index, as last published (Acquire: the slots it covers are written).
    #[inline]
    pub fn head(&self) -> u64 {
        self.header().producer.head.load(Ordering::Acquire)
    }

    /// The consumer index, as last published (Acquire: the slots it frees are read).
    #[inline]
    pub fn tail(&self) -> u64 {
        self.header().consumer.tail.load(Ordering::Acquire)
    }

    /// The slot message `seq` uses.
    #[inline]
    pub fn slot_of(&self, seq: u64) -> usize {
        #[allow(clippy::cast_possible_truncation, reason = "masked to capacity - 1, whose slots are in memory")]
        let slot = (seq & (self.capacity - 1)) as usize;
        slot
    }
}

/// The producer end's private state: its own index and a cached copy of the consumer's.
#[derive(Debug)]
pub struct ProducerIndex {
    ring: RingIndices,
    head: u64,
    cached_tail: u64,
}

impl ProducerIndex {
    /// Takes over the producer end where the last producer left it: at the larger of the published
    /// `head` and `tail` (a GPU producer publishes `head` in batches, so it may lag what the consumer
    /// has already taken), then past every message `written` says is already in its slot (one the
    /// lagging `head` does not cover yet; a format with no mark in its slots passes `|_| false`).
    /// The position found is published.
    pub fn resume(ring: RingIndices, written: impl Fn(u64) -> bool) -> Self {
        let published = ring.header().producer.head.load(Ordering::Relaxed);
        let tail = ring.tail();
        let mut head = if (tail.wrapping_sub(published) as i64) > 0 { tail } else { published };
        while head.wrapping_sub(tail) < ring.capacity && written(head) {
            head = head.wrapping_add(1);
        }
        if head != published {
            ring.header().producer.head.store(head, Ordering::Release);
        }
        Self { ring, head, cached_tail: tail }
    }

    /// The indices.
    #[inline]
    pub fn ring(&self) -> &RingIndices {
        &self.ring
    }

    /// The sequence number the next message gets.
    #[inline]
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Free slots, rereading the consumer's `tail` only when fewer than `wanted` look free to the
    /// cached copy (or the cached copy is impossible: the reread then reports it, even for `wanted` 0).
    #[inline]
    pub fn free(&mut self, wanted: u64) -> Result<u64, Corrupt> {
        let used = self.head.wrapping_sub(self.cached_tail);
        if used > self.ring.capacity || self.ring.capacity - used < wanted {
            return self.refresh();
        }
        Ok(self.ring.capacity - used)
    }

    /// Whether one more message fits: [`ProducerIndex::free`] for one, as one compare on the hot path.
    #[inline]
    pub fn has_room(&mut self) -> Result<bool, Corrupt> {
        if self.head.wrapping_sub(self.cached_tail) >= self.ring.capacity {
            return Ok(self.refresh()? > 0);
        }
        Ok(true)
    }

    /// Rereads the consumer's `tail` (Acquire: its reads of the slots it frees happened before the
    /// caller's stores) and returns the free slots it leaves. Out of line and cold: it runs about once
    /// a lap, and without it the send paths are small enough to inline into the caller's loop.
    #[cold]
    #[inline(never)]
    fn refresh(&mut self) -> Result<u64, Corrupt> {
        self.cached_tail = self.ring.tail();
        let used = self.head.wrapping_sub(self.cached_tail);
        if used > self.ring.capacity {
            return Err(Corrupt { head: self.head, tail: self.cached_tail });
        }
        Ok(self.ring.capacity - used)
    }

    /// Counts `n` messages as written (their slots filled), without publishing.
    #[inline]
    pub fn advance(&mut self, n: u64) {
        self.head = self.head.wrapping_add(n);
    }

    /// Publishes `head` (Release: every store to the slots it covers happened before).
    #[inline]
    pub fn publish(&self) {
        self.ring.header().producer.head.store(self.head, Ordering::Release);
    }
}

/// The consumer end's private state: its own index and a cached copy of the producer's.
#[derive(Debug)]
pub struct ConsumerIndex {
    ring: RingIndices,
    tail: u64,
    cached_head: u64,
}

impl ConsumerIndex {
    /// Takes over the consumer end at the published `tail`. Refuses indices no producer can have
    /// left: a published `head` more than a ring ahead of `tail` (a `head` behind it is a GPU
    /// producer's lagging publication, which is fine).
    pub fn claim(ring: RingIndices) -> Result<Self, Corrupt> {
        let tail = ring.header().consumer.tail.load(Ordering::Relaxed);
        let head = ring.head();
        let ahead = head.wrapping_sub(tail);
        if (ahead as i64) > 0 && ahead > ring.capacity {
            return Err(Corrupt { head, tail });
        }
        // The cached copy starts at `tail`, not at the `head` just read: a copy is taken only through
        // the refresh, which checks it (a lagging `head`, fine for LL's consumer, is corrupt for index's).
        Ok(Self { ring, tail, cached_head: tail })
    }

    /// The indices.
    #[inline]
    pub fn ring(&self) -> &RingIndices {
        &self.ring
    }

    /// The sequence number of the next message to read.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Messages published and not yet read, rereading the producer's `head` only when fewer than
    /// `wanted` look available to the cached copy: for formats whose consumer learns of a message
    /// from `head` (protocol index). An impossible `head` (more than a ring ahead, or behind `tail`:
    /// a host producer publishes exactly) is reported.
    #[inline]
    pub fn available(&mut self, wanted: u64) -> Result<u64, Corrupt> {
        let ready = self.cached_head.wrapping_sub(self.tail);
        if ready < wanted || ready > self.ring.capacity {
            return self.refresh();
        }
        Ok(ready)
    }

    /// Whether a message is there to read: [`ConsumerIndex::available`] for one, as one compare on the
    /// hot path (every cached `head` passed the refresh's check, and `tail` never passes it).
    #[inline]
    pub fn has_message(&mut self) -> Result<bool, Corrupt> {
        if self.cached_head == self.tail {
            return Ok(self.refresh()? > 0);
        }
        Ok(true)
    }

    /// Rereads `head` (Acquire: the producer's stores to the slots it covers happened before the
    /// caller's reads). Inline, unlike the producer's refresh (once a lap): a consumer that keeps up
    /// (every ping-pong, every host round trip) finds the ring empty at every message.
    #[inline]
    fn refresh(&mut self) -> Result<u64, Corrupt> {
        let head = self.ring.head();
        let ready = head.wrapping_sub(self.tail);
        if ready > self.ring.capacity {
            // Not cached: the fast path of `has_message` trusts every cached copy.
            return Err(Corrupt { head, tail: self.tail });
        }
        self.cached_head = head;
        Ok(ready)
    }

    /// Counts `n` messages as read, without publishing.
    #[inline]
    pub fn advance(&mut self, n: u64) {
        self.tail = self.tail.wrapping_add(n);
    }

    /// Publishes `tail` (Release: every read of the slots it frees happened before).
    #[inline]
    pub fn publish(&self) {
        self.ring.header().consumer.tail.store(self.tail, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header on the heap (Box keeps its 128-byte alignment).
    fn header(head: u64, tail: u64) -> Box<RingHeader> {
        // SAFETY: all-zero bytes are a valid RingHeader (atomics and zeros).
        let h: Box<RingHeader> = unsafe { Box::new(core::mem::zeroed()) };
        h.producer.head.store(head, Ordering::Relaxed);
        h.consumer.tail.store(tail, Ordering::Relaxed);
        h
    }

    fn indices(h: &RingHeader, capacity: u64) -> RingIndices {
        // SAFETY: `h` outlives every use in the test that made it; the capacity is a power of two.
        unsafe { RingIndices::new(NonNull::from(h), capacity) }
    }

    #[test]
    fn a_producer_resumes_at_the_larger_index_past_written_slots() {
        let h = header(3, 5);
        let p = ProducerIndex::resume(indices(&h, 4), |seq| seq < 7);
        assert_eq!(p.head(), 7, "past the tail (5), then past 5 and 6, which `written` says are whole");
        assert_eq!(h.producer.head.load(Ordering::Relaxed), 7, "the position found is published");
        let h = header(9, 5);
        let p = ProducerIndex::resume(indices(&h, 4), |_| true);
        assert_eq!(p.head(), 9, "never more than a ring past the tail, whatever `written` says");
    }

    #[test]
    fn the_producer_rereads_tail_only_when_short_of_room() {
        let h = header(0, 0);
        let mut p = ProducerIndex::resume(indices(&h, 4), |_| false);
        p.advance(4);
        h.consumer.tail.store(2, Ordering::Relaxed);
        assert_eq!(p.free(0).unwrap(), 0, "the cached tail is enough when nothing is wanted");
        assert_eq!(p.free(1).unwrap(), 2, "short of room: reread");
        h.consumer.tail.store(100, Ordering::Relaxed);
        assert!(p.has_room().unwrap(), "the cached tail (2) still leaves room");
        p.advance(2);
        assert_eq!(p.has_room(), Err(Corrupt { head: 6, tail: 100 }));
    }

    #[test]
    fn the_consumer_rereads_head_only_when_short_of_messages() {
        let h = header(0, 0);
        let mut c = ConsumerIndex::claim(indices(&h, 4)).unwrap();
        assert_eq!(c.available(1).unwrap(), 0);
        h.producer.head.store(3, Ordering::Relaxed);
        assert_eq!(c.available(0).unwrap(), 0, "the cached head is enough when nothing is wanted");
        assert_eq!(c.available(1).unwrap(), 3);
        h.producer.head.store(1000, Ordering::Relaxed);
        assert_eq!(c.available(2).unwrap(), 3, "not reread while the cached copy has enough");
        c.advance(3);
        c.publish();
        assert_eq!(h.consumer.tail.load(Ordering::Relaxed), 3);
        assert_eq!(c.available(1), Err(Corrupt { head: 1000, tail: 3 }));
    }

    #[test]
    fn impossible_indices_are_refused_at_claim() {
        let h = header(10, 0);
        assert_eq!(ConsumerIndex::claim(indices(&h, 8)).unwrap_err(), Corrupt { head: 10, tail: 0 });
        let h = header(2, 5);
        assert!(ConsumerIndex::claim(indices(&h, 8)).is_ok(), "a lagging head is a GPU producer's, fine");
    }
}
