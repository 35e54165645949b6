//! The index ring over raw memory: host-only channels in Lamport's (and rtrb's) format, the payload alone in each slot, the producer's `head` saying what is whole.
//!
//! Kept free of files and mappings so that Miri can run it over heap memory (`cargo +nightly miri
//! test -p mesh-shm --lib index_ring::`).
//!
//! **Format** (channels of protocol index, [`crate::layout::PROTOCOL_INDEX`]). A ring's slots are
//! `capacity` payloads of `msg_size` bytes (a multiple of 8), exactly as sent, message `seq` in slot
//! `seq & (capacity - 1)`. Nothing in a slot says whether it is written: the producer writes the
//! payload with plain stores, then publishes `head` with a Release store; the consumer loads `head`
//! with Acquire and reads every slot below it, then publishes `tail` with a Release store, which the
//! producer loads with Acquire before it rewrites a slot. So 8 bytes of message cost 8 bytes of
//! ring, 8 messages per cache line, against LL's 4 (a tag in every word, `ring`), which is what
//! bounds LL's host↔host throughput of small messages.
//!
//! **Why host only.** A GPU consumer of this format would read `head` and then the slot: two
//! dependent round trips over PCIe per message where LL's tags need one, and the order of a GPU
//! producer's payload stores and its `head` store is not what a host reader sees without a
//! system-scope fence per message. So meshd refuses to bind a channel of this protocol to a
//! program, and both its ends are host processes.
//!
//! **Indices** (the shared core, `indices`): each end keeps a cached copy of the other's index and
//! rereads it (Acquire) only when the copy says full (producer) or empty (consumer); each publishes
//! its own on every call (a single message) or once per batch. A producer resumes at the larger of
//! `head` and `tail` (a host producer publishes exactly, and a message written but not yet published
//! was never sent: its send had not returned); a consumer resumes at `tail`, so a message read but
//! not yet released by a consumer that died comes again (as with LL).

use core::ptr::NonNull;

pub use crate::indices::Corrupt;
use crate::indices::{ConsumerIndex, ProducerIndex, RingIndices};
use crate::layout::RingHeader;

/// An index ring's memory: its header and `capacity` payload slots.
#[derive(Debug, Clone, Copy)]
pub struct IndexMemory {
    indices: RingIndices,
    slots: NonNull<u8>,
    msg_size: usize,
}

// SAFETY: the ring is shared memory by design; indices are atomics, and the protocol hands each slot
// to one side at a time (see the module's comment).
unsafe impl Send for IndexMemory {}
// SAFETY: as above.
unsafe impl Sync for IndexMemory {}

impl IndexMemory {
    /// # Safety
    /// `header` must point to a [`RingHeader`], 128-byte aligned, and `slots` to `capacity *
    /// msg_size` writable bytes, 8-byte aligned, both valid for as long as the returned value and its
    /// copies are used. `capacity` must be a non-zero power of two; `msg_size` a non-zero multiple of 8.
    pub unsafe fn new(header: NonNull<RingHeader>, slots: NonNull<u8>, msg_size: usize, capacity: u64) -> Self {
        debug_assert!(msg_size > 0 && msg_size.is_multiple_of(8) && slots.as_ptr().addr().is_multiple_of(8));
        // SAFETY: the header's part of this function's contract.
        let indices = unsafe { RingIndices::new(header, capacity) };
        Self { indices, slots, msg_size }
    }

    /// Payload bytes per message.
    pub fn msg_size(&self) -> usize {
        self.msg_size
    }

    /// Messages the ring holds.
    pub fn capacity(&self) -> u64 {
        self.indices.capacity()
    }

    /// The producer index, as last published.
    pub fn head(&self) -> u64 {
        self.indices.head()
    }

    /// The consumer index, as last published.
    pub fn tail(&self) -> u64 {
        self.indices.tail()
    }

    /// The first byte of message `seq`'s slot (`msg_size` bytes, 8-byte aligned).
    #[inline]
    fn slot(&self, seq: u64) -> *mut u8 {
        // SAFETY: slot < capacity, and `new` promised `capacity * msg_size` bytes.
        unsafe { self.slots.as_ptr().add(self.indices.slot_of(seq) * self.msg_size) }
    }
}

/// Copies `len` bytes; the sizes small messages have are fixed-size moves the compiler inlines (one
/// 8-byte load and store at 8 B) instead of a call to `memcpy` with a length it cannot see.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
#[inline(always)]
unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract, for each arm's fixed length equal to `len`.
    unsafe {
        match len {
            8 => dst.cast::<[u8; 8]>().write_unaligned(src.cast::<[u8; 8]>().read_unaligned()),
            16 => dst.cast::<[u8; 16]>().write_unaligned(src.cast::<[u8; 16]>().read_unaligned()),
            32 => dst.cast::<[u8; 32]>().write_unaligned(src.cast::<[u8; 32]>().read_unaligned()),
            64 => dst.cast::<[u8; 64]>().write_unaligned(src.cast::<[u8; 64]>().read_unaligned()),
            _ => core::ptr::copy_nonoverlapping(src, dst, len),
        }
    }
}

/// The producer end's private state: its index (see `indices`) over the payload slots.
#[derive(Debug)]
pub struct IndexProducerCore {
    ring: IndexMemory,
    index: ProducerIndex,
}

impl IndexProducerCore {
    /// Takes over the producer end where the last producer left it: the larger of `head` and `tail`
    /// (the slots carry no mark to skip over).
    pub fn new(ring: IndexMemory) -> Self {
        Self { ring, index: ProducerIndex::resume(ring.indices, |_| false) }
    }

    /// The ring this end writes.
    pub fn ring(&self) -> &IndexMemory {
        &self.ring
    }

    /// Writes `msg` (at most the message size; shorter ones are zero-padded) into the next slot,
    /// without publishing. The caller has checked that there is room.
    #[inline]
    fn write(&self, msg: &[u8]) {
        let dst = self.ring.slot(self.index.head());
        let size = self.ring.msg_size;
        debug_assert!(msg.len() <= size);
        // SAFETY: the slot's `size` bytes are this end's until `head` passes it (the Acquire load of
        // `tail` in the index's refresh ordered the consumer's reads of its last lap before these
        // stores); `msg` is the caller's, not in the ring.
        unsafe {
            copy(dst, msg.as_ptr(), msg.len());
            if msg.len() < size {
                core::ptr::write_bytes(dst.add(msg.len()), 0, size - msg.len());
            }
        }
    }

    /// Writes one message (shorter ones are zero-padded) and publishes `head`; `false` when full.
    #[inline(always)]
    pub fn try_push(&mut self, msg: &[u8]) -> Result<bool, Corrupt> {
        if !self.index.has_room()? {
            return Ok(false);
        }
        self.write(msg);
        self.index.advance(1);
        self.index.publish();
        Ok(true)
    }

    /// Writes up to `count` messages, message `i` taken from `msg(i)` (at most the message size;
    /// shorter ones are zero-padded), then publishes `head` once. Returns how many were written.
    #[inline]
    pub fn push_with<'m>(&mut self, count: u64, mut msg: impl FnMut(u64) -> &'m [u8]) -> Result<u64, Corrupt> {
        let n = self.index.free(count)?.min(count);
        for i in 0..n {
            self.write(msg(i));
            self.index.advance(1);
        }
        if n > 0 {
            self.index.publish();
        }
        Ok(n)
    }
}

/// The consumer end's private state: its index and the cached `head` that says what is whole.
#[derive(Debug)]
pub struct IndexConsumerCore {
    ring: IndexMemory,
    index: ConsumerIndex,
}

impl IndexConsumerCore {
    /// Takes over the consumer end at the published `tail`; refuses a `head` more than a ring ahead.
    pub fn new(ring: IndexMemory) -> Result<Self, Corrupt> {
        Ok(Self { ring, index: ConsumerIndex::claim(ring.indices)? })
    }

    /// The ring this end reads.
    pub fn ring(&self) -> &IndexMemory {
        &self.ring
    }

    /// Copies the next message into `out` (exactly the message size), without publishing. The caller
    /// has checked that `head` covers it.
    #[inline]
    fn read(&self, out: &mut [u8]) {
        debug_assert_eq!(out.len(), self.ring.msg_size);
        let src = self.ring.slot(self.index.tail());
        // SAFETY: the slot's bytes are this end's until `tail` passes it (the Acquire load of `head`
        // in the index's refresh ordered the producer's stores before these reads); `out` is the
        // caller's, not in the ring.
        unsafe { copy(out.as_mut_ptr(), src, out.len()) };
    }

    /// Reads one message into `out` (its length must be the message size) and publishes `tail`;
    /// `false` when empty.
    #[inline(always)]
    pub fn try_pop(&mut self, out: &mut [u8]) -> Result<bool, Corrupt> {
        if !self.index.has_message()? {
            return Ok(false);
        }
        self.read(out);
        self.index.advance(1);
        self.index.publish();
        Ok(true)
    }

    /// Reads up to `out.len() / msg_size` messages into consecutive records of `out`, then publishes
    /// `tail` once. Returns how many were read (0 when the ring is empty).
    #[inline]
    pub fn pop_into(&mut self, out: &mut [u8]) -> Result<u64, Corrupt> {
        let size = self.ring.msg_size;
        let wanted = (out.len() / size) as u64;
        let n = self.index.available(wanted)?.min(wanted);
        #[allow(clippy::cast_possible_truncation, reason = "n <= out.len() / size, a usize")]
        for record in out.chunks_exact_mut(size).take(n as usize) {
            self.read(record);
            self.index.advance(1);
        }
        if n > 0 {
            self.index.publish();
        }
        Ok(n)
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test capacities, indices and sizes are small")]
mod tests {
    use super::*;
    use core::sync::atomic::Ordering;
    use proptest::prelude::*;
    use std::alloc::{Layout, alloc_zeroed, dealloc};

    use crate::queue_model::{ModelRing, check, op, pattern};

    /// An index ring over heap memory, freed on drop (what Miri runs the protocol on).
    struct HeapIndex {
        ptr: NonNull<u8>,
        layout: Layout,
        ring: IndexMemory,
    }

    impl HeapIndex {
        fn new(msg_size: usize, capacity: u64) -> Self {
            let header = core::mem::size_of::<RingHeader>();
            let size = header + msg_size * capacity as usize;
            let layout = Layout::from_size_align(size, 128).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            let slots = NonNull::new(ptr.as_ptr().wrapping_add(header)).unwrap();
            // SAFETY: the allocation holds the header and the slots, is 128-aligned (the slots too,
            // after a 384-byte header) and zeroed (a valid header), and lives as long as `self`.
            let ring = unsafe { IndexMemory::new(ptr.cast(), slots, msg_size, capacity) };
            Self { ptr, layout, ring }
        }

        fn set_indices(&self, head: u64, tail: u64) {
            let h = self.ring.indices.header();
            h.producer.head.store(head, Ordering::Relaxed);
            h.consumer.tail.store(tail, Ordering::Relaxed);
        }

        /// The bytes of message `seq`'s slot as they are in the ring.
        fn slot_bytes(&self, seq: u64) -> Vec<u8> {
            // SAFETY: no other thread touches the ring while a test inspects it.
            unsafe { core::slice::from_raw_parts(self.ring.slot(seq), self.ring.msg_size) }.to_vec()
        }
    }

    impl Drop for HeapIndex {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    #[test]
    fn fills_drains_and_wraps() {
        let heap = HeapIndex::new(8, 4);
        let mut p = IndexProducerCore::new(heap.ring);
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 8];
        assert!(!c.try_pop(&mut out).unwrap(), "a new ring is empty");
        for round in 0u64..10 {
            for i in 0..4u64 {
                assert!(p.try_push(&(round * 4 + i).to_le_bytes()).unwrap());
            }
            assert!(!p.try_push(&[1]).unwrap(), "a full ring refuses");
            for i in 0..4u64 {
                assert!(c.try_pop(&mut out).unwrap());
                assert_eq!(u64::from_le_bytes(out), round * 4 + i);
            }
            assert!(!c.try_pop(&mut out).unwrap());
        }
        assert_eq!((heap.ring.head(), heap.ring.tail()), (40, 40));
    }

    #[test]
    fn a_slot_holds_the_payload_alone() {
        for size in [8, 16, 24, 32, 64, 72, 4096] {
            let heap = HeapIndex::new(size, 2);
            let mut p = IndexProducerCore::new(heap.ring);
            let mut c = IndexConsumerCore::new(heap.ring).unwrap();
            for seq in 0..3u64 {
                let msg = pattern(size, seq as u8);
                assert!(p.try_push(&msg).unwrap());
                assert_eq!(heap.slot_bytes(seq), msg, "size {size}, message {seq}: the slot is the message");
                let mut out = vec![0u8; size];
                assert!(c.try_pop(&mut out).unwrap());
                assert_eq!(out, msg, "size {size}, message {seq}");
            }
        }
    }

    #[test]
    fn short_messages_are_zero_padded() {
        let heap = HeapIndex::new(16, 1);
        let mut p = IndexProducerCore::new(heap.ring);
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 16];
        assert!(p.try_push(&[0xff; 16]).unwrap());
        assert!(c.try_pop(&mut out).unwrap());
        assert!(p.try_push(&[7; 5]).unwrap());
        assert!(c.try_pop(&mut out).unwrap());
        assert_eq!(out[..5], [7; 5]);
        assert!(out[5..].iter().all(|&b| b == 0), "the rest of a reused slot is cleared");
    }

    #[test]
    fn a_message_is_seen_only_once_head_covers_it() {
        let heap = HeapIndex::new(8, 4);
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 8];
        // A producer that wrote the slot and died before publishing: the message was never sent.
        // SAFETY: the test is alone with the ring; slot 0 has 8 bytes.
        unsafe { heap.ring.slot(0).cast::<u64>().write(42) };
        assert!(!c.try_pop(&mut out).unwrap());
        let mut p = IndexProducerCore::new(heap.ring);
        assert!(p.try_push(&7u64.to_le_bytes()).unwrap(), "a new producer writes over it");
        assert!(c.try_pop(&mut out).unwrap());
        assert_eq!(u64::from_le_bytes(out), 7);
    }

    #[test]
    fn the_consumer_rereads_head_only_when_it_looks_empty() {
        let heap = HeapIndex::new(8, 8);
        let mut p = IndexProducerCore::new(heap.ring);
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 8];
        for i in 0..3u64 {
            assert!(p.try_push(&i.to_le_bytes()).unwrap());
        }
        assert!(c.try_pop(&mut out).unwrap(), "empty by the cached head: reread, 3 there");
        // A head no producer can have left: a consumer that read it on every receive would refuse now.
        heap.ring.indices.header().producer.head.store(1000, Ordering::Release);
        for expect in 1..3u64 {
            assert!(c.try_pop(&mut out).unwrap(), "the cached head still covers message {expect}");
            assert_eq!(u64::from_le_bytes(out), expect);
        }
        assert_eq!(c.try_pop(&mut out), Err(Corrupt { head: 1000, tail: 3 }), "empty: reread, and refused");
    }

    #[test]
    fn a_new_producer_resumes_after_the_last_message_sent_and_no_earlier_than_the_consumer() {
        let heap = HeapIndex::new(8, 4);
        let mut p = IndexProducerCore::new(heap.ring);
        for i in 0..3u64 {
            assert!(p.try_push(&i.to_le_bytes()).unwrap());
        }
        // The producer's process ends; a new one takes the end over.
        let mut p = IndexProducerCore::new(heap.ring);
        assert!(p.try_push(&3u64.to_le_bytes()).unwrap());
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 8];
        for expect in 0..4u64 {
            assert!(c.try_pop(&mut out).unwrap());
            assert_eq!(u64::from_le_bytes(out), expect);
        }
        heap.set_indices(1, 6);
        let _p = IndexProducerCore::new(heap.ring);
        assert_eq!(heap.ring.head(), 6, "at the tail, published");
    }

    #[test]
    fn a_new_consumer_resumes_at_the_published_tail() {
        let heap = HeapIndex::new(8, 4);
        let mut p = IndexProducerCore::new(heap.ring);
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 8];
        assert_eq!(p.push_with(4, |i| [&[0u8; 8], &[1; 8], &[2; 8], &[3; 8]][i as usize]).unwrap(), 4);
        assert!(c.try_pop(&mut out).unwrap());
        // The consumer's process ends; a new one takes the end over.
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut all = [0u8; 8 * 8];
        assert_eq!(c.pop_into(&mut all).unwrap(), 3);
        assert_eq!(all[..24], [[1u8; 8], [2; 8], [3; 8]].concat()[..]);
    }

    #[test]
    fn corrupt_indices_are_reported_not_followed() {
        let heap = HeapIndex::new(8, 4);
        heap.set_indices(1000, 0);
        assert_eq!(IndexConsumerCore::new(heap.ring).unwrap_err(), Corrupt { head: 1000, tail: 0 });
        let mut p = IndexProducerCore::new(heap.ring);
        assert_eq!(p.try_push(&[1]), Err(Corrupt { head: 1000, tail: 0 }));
        assert_eq!(p.push_with(0, |_| &[]), Err(Corrupt { head: 1000, tail: 0 }));
        // A head behind the tail: a host producer publishes exactly, so this is no lag but corruption.
        heap.set_indices(3, 5);
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 8];
        assert_eq!(c.try_pop(&mut out), Err(Corrupt { head: 3, tail: 5 }));
        assert_eq!(c.try_pop(&mut out), Err(Corrupt { head: 3, tail: 5 }), "an impossible head is never cached");
        assert_eq!(c.pop_into(&mut out), Err(Corrupt { head: 3, tail: 5 }));
    }

    #[test]
    fn batches_publish_once_and_stop_at_what_is_there() {
        let heap = HeapIndex::new(8, 8);
        let mut p = IndexProducerCore::new(heap.ring);
        let mut c = IndexConsumerCore::new(heap.ring).unwrap();
        let msgs: Vec<[u8; 8]> = (0..20u64).map(u64::to_le_bytes).collect();
        assert_eq!(p.push_with(20, |i| &msgs[i as usize]).unwrap(), 8);
        assert_eq!(heap.ring.head(), 8);
        let mut out = [0u8; 8 * 5];
        assert_eq!(c.pop_into(&mut out).unwrap(), 5);
        assert_eq!(heap.ring.tail(), 5);
        let more: Vec<[u8; 8]> = (100..120u64).map(u64::to_le_bytes).collect();
        assert_eq!(p.push_with(20, |i| &more[i as usize]).unwrap(), 5, "stops at the room the fresh tail gives");
        let mut out = [0u8; 8 * 99];
        assert_eq!(c.pop_into(&mut out).unwrap(), 8);
        let got: Vec<u64> = out[..64].chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(got, [5, 6, 7, 100, 101, 102, 103, 104]);
    }

    /// The index ring's two cores over one heap ring, for the shared model test.
    struct Model<'h> {
        heap: &'h HeapIndex,
        p: IndexProducerCore,
        c: IndexConsumerCore,
    }

    impl ModelRing for Model<'_> {
        fn push(&mut self, msg: &[u8]) -> bool {
            self.p.try_push(msg).unwrap()
        }
        fn push_batch(&mut self, msgs: &[Vec<u8>]) -> u64 {
            self.p.push_with(msgs.len() as u64, |i| &msgs[i as usize]).unwrap()
        }
        fn pop(&mut self, out: &mut [u8]) -> bool {
            self.c.try_pop(out).unwrap()
        }
        fn pop_batch(&mut self, out: &mut [u8]) -> u64 {
            self.c.pop_into(out).unwrap()
        }
        fn restart_producer(&mut self) {
            self.p = IndexProducerCore::new(self.heap.ring);
        }
        fn restart_consumer(&mut self) {
            self.c = IndexConsumerCore::new(self.heap.ring).unwrap();
        }
        fn in_flight(&self) -> u64 {
            self.heap.ring.head().wrapping_sub(self.heap.ring.tail())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Any sequence of sends, receives (single and batched) and restarts of either end, across
        /// wraparounds and the 64-bit wrap of the indices, gives what a queue of `capacity` messages
        /// gives, and publishes the same indices: a restart loses and repeats nothing (every call
        /// here publishes before it returns).
        #[test]
        #[cfg_attr(miri, ignore = "proptest is slow under Miri; the unit tests above cover the same paths there")]
        fn the_ring_behaves_as_a_bounded_queue(
            cap_log in 0u32..5,
            words in 1usize..10,
            start in prop_oneof![Just(0u64), Just(u64::MAX - 5), any::<u32>().prop_map(u64::from)],
            ops in proptest::collection::vec(op(), 1..150),
        ) {
            let capacity = 1u64 << cap_log;
            let size = words * 8;
            let heap = HeapIndex::new(size, capacity);
            heap.set_indices(start, start);
            let mut ring =
                Model { heap: &heap, p: IndexProducerCore::new(heap.ring), c: IndexConsumerCore::new(heap.ring).unwrap() };
            check(&mut ring, size, capacity, ops)?;
        }
    }

    #[test]
    fn threads_exchange_in_order() {
        // Small under Miri, which runs this protocol for data races and weak-memory bugs: the slots
        // are plain memory here, so a missing Release/Acquire pair is a data race Miri reports.
        let count: u64 = if cfg!(miri) { 300 } else { 300_000 };
        let heap = HeapIndex::new(16, 8);
        let ring = heap.ring;
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut p = IndexProducerCore::new(ring);
                let mut i = 0u64;
                let mut batch = [[0u8; 16]; 3];
                while i < count {
                    // Singles and batches of up to 3, so both publish paths race the consumer.
                    let sent = if i.is_multiple_of(5) {
                        let mut msg = [0u8; 16];
                        msg[..8].copy_from_slice(&i.to_le_bytes());
                        msg[8..].copy_from_slice(&(!i).to_le_bytes());
                        u64::from(p.try_push(&msg).unwrap())
                    } else {
                        let k = (count - i).min(3);
                        for (j, m) in batch.iter_mut().enumerate() {
                            let v = i + j as u64;
                            m[..8].copy_from_slice(&v.to_le_bytes());
                            m[8..].copy_from_slice(&(!v).to_le_bytes());
                        }
                        p.push_with(k, |j| &batch[j as usize]).unwrap()
                    };
                    i += sent;
                    if sent == 0 {
                        std::thread::yield_now();
                    }
                }
            });
            let mut c = IndexConsumerCore::new(ring).unwrap();
            let mut expect = 0u64;
            let mut out = [0u8; 16 * 2];
            while expect < count {
                let got = if expect.is_multiple_of(3) {
                    u64::from(c.try_pop(&mut out[..16]).unwrap())
                } else {
                    c.pop_into(&mut out).unwrap()
                };
                for m in out.chunks(16).take(got as usize) {
                    let a = u64::from_le_bytes(m[..8].try_into().unwrap());
                    let b = u64::from_le_bytes(m[8..].try_into().unwrap());
                    assert_eq!(a, expect, "lost, duplicated or reordered");
                    assert_eq!(b, !expect, "torn message");
                    expect += 1;
                }
                if got == 0 {
                    std::thread::yield_now();
                }
            }
        });
    }
}
