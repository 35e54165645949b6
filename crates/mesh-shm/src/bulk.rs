//! The bulk ring over raw memory: large messages as NCCL's Simple protocol moves them (payload, fence, one flag).
//!
//! Kept free of files and mappings so that Miri can run it over heap memory (`cargo +nightly miri
//! test -p mesh-shm --lib bulk::`).
//!
//! **Format** (channels of protocol bulk, [`crate::layout::PROTOCOL_BULK`]). A ring's slots start
//! with `capacity` 8-byte *flags*, padded to a page ([`bulk_payload_offset`]), then `capacity`
//! payloads of `msg_size` bytes (a multiple of 16) exactly as sent. Message `seq` lives in slot
//! `seq & (capacity - 1)`; its flag holds `seq + 1` once the payload is whole (0: never written;
//! a flag left from the previous lap holds `seq + 1 - capacity`, so it never passes for this one).
//! The producer writes the payload with any stores it likes (wide, non-temporal, several threads, a
//! whole GPU block), fences, then stores the flag; the consumer loads the flag with Acquire (a GPU
//! consumer: one thread, then a block barrier), then copies the payload. Unlike the LL format
//! (`ring`) nothing in the payload is a tag: the ring costs its payload plus 8 bytes a message, and
//! a GPU receiver pays one round trip for the flag before it may load the payload, which a message
//! of 64 KiB or more amortises.
//!
//! **Indices** as in `ring`: `head` (producer line) and `tail` (consumer line), one writer each.
//! Both are published on every message (one store per message of at least tens of KiB is free); the
//! producer may not rewrite slot `seq` until `tail > seq - capacity`. A producer resumes at the larger
//! of `head` and `tail`, then skips messages whose flag says they were written after `head` was last
//! published (a GPU producer that stopped without `mesh_bulk_close`).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

pub use crate::indices::Corrupt;
use crate::indices::{ConsumerIndex, ProducerIndex, RingIndices};
use crate::layout::{RingHeader, bulk_payload_offset};

/// A bulk ring's memory: its header, its flags, its payloads.
#[derive(Debug, Clone, Copy)]
pub struct BulkMemory {
    indices: RingIndices,
    flags: NonNull<AtomicU64>,
    payload: NonNull<u8>,
    msg_size: usize,
}

// SAFETY: the ring is shared memory by design; flags and indices are accessed through atomics, and
// the protocol hands each payload slot to one side at a time (see the module's comment).
unsafe impl Send for BulkMemory {}
// SAFETY: as above.
unsafe impl Sync for BulkMemory {}

impl BulkMemory {
    /// # Safety
    /// `header` must point to a [`RingHeader`], 128-byte aligned, and `slots` to
    /// `bulk_slot_bytes(msg_size, capacity)` writable bytes, 16-byte aligned, laid out as the module
    /// says, both valid for as long as the returned value and its copies are used. `capacity` must be
    /// a non-zero power of two below 2^32; `msg_size` a non-zero multiple of 16.
    pub unsafe fn new(header: NonNull<RingHeader>, slots: NonNull<u8>, msg_size: usize, capacity: u64) -> Self {
        debug_assert!(capacity.is_power_of_two() && capacity < 1 << 32 && msg_size > 0 && msg_size % 16 == 0);
        #[allow(clippy::cast_possible_truncation, reason = "capacity < 2^32 (the contract)")]
        let offset = bulk_payload_offset(capacity as u32) as usize;
        // SAFETY: the payloads start `offset` bytes into the slots, inside the region the caller promised.
        let payload = unsafe { slots.add(offset) };
        // SAFETY: the header's part of this function's contract.
        let indices = unsafe { RingIndices::new(header, capacity) };
        Self { indices, flags: slots.cast(), payload, msg_size }
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
    #[inline]
    pub fn head(&self) -> u64 {
        self.indices.head()
    }

    /// The consumer index, as last published.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.indices.tail()
    }

    /// The slot message `seq` uses.
    #[inline]
    pub fn slot_of(&self, seq: u64) -> usize {
        self.indices.slot_of(seq)
    }

    /// The flag of message `seq`'s slot.
    #[inline]
    fn flag(&self, seq: u64) -> &AtomicU64 {
        // SAFETY: the slot index is below the capacity, and `new` promised `capacity` flags, 8-aligned
        // (16-aligned slots), accessed only atomically.
        unsafe { self.flags.add(self.slot_of(seq)).as_ref() }
    }

    /// Whether message `seq` is whole in its slot.
    #[inline]
    pub fn written(&self, seq: u64) -> bool {
        self.flag(seq).load(Ordering::Acquire) == seq.wrapping_add(1)
    }

    /// The first byte of message `seq`'s payload slot (`msg_size` bytes, 16-byte aligned).
    #[inline]
    pub fn payload_ptr(&self, seq: u64) -> *mut u8 {
        // SAFETY: slot < capacity, and `new` promised `capacity * msg_size` payload bytes.
        unsafe { self.payload.as_ptr().add(self.slot_of(seq) * self.msg_size) }
    }
}

/// The producer end's private state: its index (see `indices`) over the flags and payloads.
#[derive(Debug)]
pub struct BulkProducerCore {
    ring: BulkMemory,
    index: ProducerIndex,
}

impl BulkProducerCore {
    /// Takes over the producer end where the last producer left it (see the module's comment).
    pub fn new(ring: BulkMemory) -> Self {
        Self { ring, index: ProducerIndex::resume(ring.indices, |seq| ring.written(seq)) }
    }

    /// The ring this end writes.
    pub fn ring(&self) -> &BulkMemory {
        &self.ring
    }

    /// The sequence number the next message gets.
    pub fn head(&self) -> u64 {
        self.index.head()
    }

    /// Free slots, reading the consumer's index only when the ring looks full.
    #[inline]
    pub fn free(&mut self) -> Result<u64, Corrupt> {
        self.index.free(1)
    }

    /// The payload slot of the next message when there is room: the caller may write its
    /// `msg_size` bytes (and nothing else) until [`BulkProducerCore::publish`]. The Acquire load of
    /// `tail` behind `free` ordered the consumer's reads of the slot's last lap before these writes.
    #[inline]
    pub fn reserve(&mut self) -> Result<Option<*mut u8>, Corrupt> {
        Ok((self.free()? > 0).then(|| self.ring.payload_ptr(self.index.head())))
    }

    /// Publishes the message written into the slot [`BulkProducerCore::reserve`] gave: its flag, then
    /// `head`, both with Release. Every store to the payload must be visible before this call (a
    /// helper thread's: handed over with a synchronising operation; non-temporal ones: followed by
    /// `sfence`).
    #[inline]
    pub fn publish(&mut self) {
        let seq = self.index.head();
        self.ring.flag(seq).store(seq.wrapping_add(1), Ordering::Release);
        self.index.advance(1);
        self.index.publish();
    }
}

/// The consumer end's private state: its index (the bulk consumer reads flags, not `head`).
#[derive(Debug)]
pub struct BulkConsumerCore {
    ring: BulkMemory,
    index: ConsumerIndex,
}

impl BulkConsumerCore {
    /// Takes over the consumer end at the published `tail`; refuses a `head` more than a ring ahead.
    pub fn new(ring: BulkMemory) -> Result<Self, Corrupt> {
        Ok(Self { ring, index: ConsumerIndex::claim(ring.indices)? })
    }

    /// The ring this end reads.
    pub fn ring(&self) -> &BulkMemory {
        &self.ring
    }

    /// The sequence number of the next message to read.
    pub fn tail(&self) -> u64 {
        self.index.tail()
    }

    /// The payload of the next message if it is whole: the caller may read its `msg_size` bytes until
    /// [`BulkConsumerCore::release`]. The Acquire load of its flag orders the producer's payload
    /// stores before the caller's reads.
    #[inline]
    pub fn peek(&self) -> Option<*const u8> {
        let seq = self.index.tail();
        self.ring.written(seq).then(|| self.ring.payload_ptr(seq).cast_const())
    }

    /// Hands the slot [`BulkConsumerCore::peek`] gave back to the producer (`tail` with Release: every
    /// read of it is done). Reads by helper threads must have been joined first.
    #[inline]
    pub fn release(&mut self) {
        self.index.advance(1);
        self.index.publish();
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test capacities, indices and sizes are small")]
mod tests {
    use super::*;
    use crate::layout::bulk_slot_bytes;
    use proptest::prelude::*;
    use std::alloc::{Layout, alloc_zeroed, dealloc};

    /// A bulk ring over heap memory, freed on drop (what Miri runs the protocol on).
    struct HeapBulk {
        ptr: NonNull<u8>,
        layout: Layout,
        ring: BulkMemory,
    }

    impl HeapBulk {
        fn new(msg_size: usize, capacity: u64) -> Self {
            let header = core::mem::size_of::<RingHeader>();
            let size = header + bulk_slot_bytes(msg_size as u32, capacity as u32) as usize;
            let layout = Layout::from_size_align(size, 128).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            let slots = NonNull::new(ptr.as_ptr().wrapping_add(header)).unwrap();
            // SAFETY: the allocation holds the header and the slots, is 128-aligned (the slots 128-aligned
            // after a 384-byte header) and zeroed (zero is a valid header and an unwritten flag), and
            // lives as long as `self`.
            let ring = unsafe { BulkMemory::new(ptr.cast(), slots, msg_size, capacity) };
            Self { ptr, layout, ring }
        }

        fn set_indices(&self, head: u64, tail: u64) {
            let h = self.ring.indices.header();
            h.producer.head.store(head, Ordering::Relaxed);
            h.consumer.tail.store(tail, Ordering::Relaxed);
        }
    }

    impl Drop for HeapBulk {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    /// Writes `msg` (exactly the message size) as the next message; false when full.
    fn send(p: &mut BulkProducerCore, msg: &[u8]) -> bool {
        let Some(dst) = p.reserve().unwrap() else { return false };
        // SAFETY: `reserve` handed this slot of msg_size bytes to the producer until `publish`.
        unsafe { core::ptr::copy_nonoverlapping(msg.as_ptr(), dst, msg.len()) };
        p.publish();
        true
    }

    /// Reads the next message into `out`; false when none is whole.
    fn recv(c: &mut BulkConsumerCore, out: &mut [u8]) -> bool {
        let Some(src) = c.peek() else { return false };
        // SAFETY: `peek` handed this slot of msg_size bytes to the consumer until `release`.
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        c.release();
        true
    }

    fn message(seq: u64, size: usize) -> Vec<u8> {
        (0..size).map(|i| (seq.wrapping_mul(31).wrapping_add(i as u64 * 7)) as u8).collect()
    }

    #[test]
    fn fills_drains_and_wraps() {
        let heap = HeapBulk::new(32, 4);
        let mut p = BulkProducerCore::new(heap.ring);
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 32];
        assert!(!recv(&mut c, &mut out), "a new ring is empty");
        for round in 0u64..5 {
            for i in 0..4 {
                assert!(send(&mut p, &message(round * 4 + i, 32)));
            }
            assert!(!send(&mut p, &[0; 32]), "a full ring refuses");
            for i in 0..4 {
                assert!(recv(&mut c, &mut out));
                assert_eq!(out[..], message(round * 4 + i, 32)[..]);
            }
            assert!(!recv(&mut c, &mut out));
        }
        assert_eq!((heap.ring.head(), heap.ring.tail()), (20, 20));
    }

    #[test]
    fn a_flag_left_from_the_previous_lap_is_not_taken() {
        let heap = HeapBulk::new(16, 2);
        let mut p = BulkProducerCore::new(heap.ring);
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 16];
        for i in 0..2 {
            assert!(send(&mut p, &message(i, 16)));
            assert!(recv(&mut c, &mut out));
        }
        // Message 2 reuses message 0's slot, whose flag still says 1.
        assert!(c.peek().is_none());
        assert!(p.reserve().unwrap().is_some(), "written but not published");
        assert!(c.peek().is_none(), "a payload without its flag is not a message");
    }

    #[test]
    fn a_new_producer_skips_messages_written_after_the_published_head() {
        let heap = HeapBulk::new(16, 8);
        let mut p = BulkProducerCore::new(heap.ring);
        for i in 0..3 {
            assert!(send(&mut p, &message(i, 16)));
        }
        // A GPU producer that stopped without closing: head published at 1, flags of 1 and 2 written.
        heap.set_indices(1, 0);
        let mut p = BulkProducerCore::new(heap.ring);
        assert_eq!(p.head(), 3);
        assert_eq!(heap.ring.head(), 3, "the resumed position is published");
        assert!(send(&mut p, &message(3, 16)));
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        let mut out = [0u8; 16];
        for i in 0..4 {
            assert!(recv(&mut c, &mut out));
            assert_eq!(out[..], message(i, 16)[..]);
        }
    }

    #[test]
    fn a_new_producer_starts_no_earlier_than_the_consumer() {
        let heap = HeapBulk::new(16, 4);
        heap.set_indices(1, 6);
        let p = BulkProducerCore::new(heap.ring);
        assert_eq!(p.head(), 6);
    }

    #[test]
    fn corrupt_indices_are_reported_not_followed() {
        let heap = HeapBulk::new(16, 4);
        heap.set_indices(1000, 0);
        assert_eq!(BulkConsumerCore::new(heap.ring).unwrap_err(), Corrupt { head: 1000, tail: 0 });
        let mut p = BulkProducerCore::new(heap.ring);
        assert_eq!(p.reserve(), Err(Corrupt { head: 1000, tail: 0 }));
    }

    #[test]
    fn payloads_are_aligned_and_disjoint_from_the_flags() {
        let heap = HeapBulk::new(48, 8);
        let base = heap.ring.flags.as_ptr() as usize;
        let first = heap.ring.payload_ptr(0) as usize;
        assert_eq!(first - base, 4096, "8 flags padded to a page");
        for seq in 0..16 {
            let p = heap.ring.payload_ptr(seq) as usize;
            assert_eq!(p % 16, 0);
            assert_eq!(p, first + (seq as usize % 8) * 48);
        }
    }

    proptest! {
        // Under Miri: few cases, and no failure file (Miri's isolation has no working directory).
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
            ..ProptestConfig::default()
        })]

        /// The index math against a model queue: any start (near the u64 wrap too), any capacity,
        /// any interleaving of sends and receives; every message comes out once, whole, in order.
        #[test]
        fn index_math_matches_a_queue(
            start in prop_oneof![0u64..1000, (u64::MAX - 1000)..u64::MAX - 256],
            cap_log in 0u32..5,
            ops in proptest::collection::vec(any::<bool>(), 0..200),
        ) {
            let capacity = 1u64 << cap_log;
            let heap = HeapBulk::new(16, capacity);
            heap.set_indices(start, start);
            let mut p = BulkProducerCore::new(heap.ring);
            let mut c = BulkConsumerCore::new(heap.ring).unwrap();
            let mut model = std::collections::VecDeque::new();
            let mut next = start;
            let mut out = [0u8; 16];
            for op in ops {
                if op {
                    let sent = send(&mut p, &message(next, 16));
                    prop_assert_eq!(sent, (model.len() as u64) < capacity);
                    if sent {
                        model.push_back(next);
                        next = next.wrapping_add(1);
                    }
                } else {
                    let got = recv(&mut c, &mut out);
                    prop_assert_eq!(got, !model.is_empty());
                    if got {
                        let seq = model.pop_front().unwrap();
                        prop_assert_eq!(&out[..], &message(seq, 16)[..]);
                    }
                }
                prop_assert_eq!(heap.ring.head().wrapping_sub(heap.ring.tail()), model.len() as u64);
            }
        }
    }

    #[test]
    fn threads_exchange_in_order() {
        // Small under Miri, which runs this protocol for data races and weak-memory bugs.
        let (count, size): (u64, usize) = if cfg!(miri) { (40, 64) } else { (20_000, 256) };
        let heap = HeapBulk::new(size, 4);
        let ring = heap.ring;
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut p = BulkProducerCore::new(ring);
                let mut i = 0u64;
                while i < count {
                    if send(&mut p, &message(i, size)) {
                        i += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
            let mut c = BulkConsumerCore::new(ring).unwrap();
            let mut out = vec![0u8; size];
            let mut expect = 0u64;
            while expect < count {
                if recv(&mut c, &mut out) {
                    assert!(out == message(expect, size), "message {expect} lost, repeated, reordered or torn");
                    expect += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
    }
}
