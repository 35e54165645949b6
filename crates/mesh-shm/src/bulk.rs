//! The bulk ring over raw memory: large messages as NCCL's Simple protocol moves them (payload, fence, one flag per part).
//!
//! Kept free of files and mappings so that Miri can run it over heap memory (`cargo +nightly miri
//! test -p mesh-shm --lib bulk::`).
//!
//! **Format** (channels of protocol bulk, [`crate::layout::PROTOCOL_BULK`]). Every message of
//! `msg_size` bytes is split into `parts` equal parts (a power of two, 1 to
//! [`crate::layout::MAX_BULK_PARTS`]; `msg_size` a multiple of 16 × `parts`): part `p` is bytes
//! `p × msg_size / parts` to `(p + 1) × msg_size / parts`, so that B GPU blocks can move one message
//! together, block `p` part `p`, without any barrier between blocks. A ring's slots start with
//! `capacity × parts` 8-byte *flags* (slot `s`, part `p` at index `s × parts + p`); for more than one
//! part, `2 × parts` index lines of 128 bytes follow on the next line boundary (part `p`'s head, then
//! its tail; one writer each); the whole padded to a page ([`bulk_payload_offset`]), then `capacity`
//! payloads of `msg_size` bytes exactly as sent. One part is exactly the format before parts existed:
//! no index lines, the part's head and tail are the [`RingHeader`]'s.
//!
//! Message `seq` lives in slot `seq & (capacity - 1)`; part `p`'s flag holds `seq + 1` once that
//! part is whole (0: never written; a flag left from the previous lap holds `seq + 1 - capacity`,
//! so it never passes for this one), and the message is whole when all its parts' flags do. The
//! writer of a part writes its bytes with any stores it likes (wide, non-temporal, several threads, a
//! whole GPU block), fences, then stores the part's flag; the reader loads the flag with Acquire (a
//! GPU consumer: its threads, then a block barrier), then copies the part. Nothing in the payload
//! is a tag: the ring costs its payload plus 8 bytes a part a message.
//!
//! **Indices.** Part `p`'s head (producer) and tail (consumer) say how far that part's writer and
//! reader are; the producer of part `p` may not rewrite part `p` of slot `seq` until part `p`'s
//! tail `> seq - capacity`. The parts move independently (a GPU end serves them with different
//! blocks); the host ends here move all of them together, one message at a time. For more than one
//! part the [`RingHeader`]'s head and tail are lower bounds over the parts, for `meshd info` and the
//! lost-message count (a host end keeps them exact; a GPU end publishes them when it closes); the
//! ends here resume from the parts' own lines.
//!
//! **Resuming.** A producer starts each part at the larger of its head and tail, then past the
//! messages whose flag says that part was written after its head was last published (a GPU producer
//! that stopped without `mesh_bulk_close`): exactly the rule of one part. When the parts disagree (a
//! GPU producer's blocks stopped at different messages, or a host producer died between two parts'
//! flags), it continues at the furthest and *completes* the parts left behind with what their slots
//! hold, as their consumers make room: a message a producer left half-written is delivered torn,
//! never waited for forever and never rewritten under a reader. A consumer starts at the furthest of
//! the parts' tails and moves the others there: the messages in between were already partly taken
//! by the previous consumer, so they are skipped (a part's producer that is behind then finds its
//! tail ahead of it and jumps: no reader waits for those parts).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

pub use crate::indices::Corrupt;
use crate::indices::RingIndices;
use crate::layout::{LINE, RingHeader, bulk_lines_offset, bulk_payload_offset};

/// [`LINE`] as an offset.
#[allow(clippy::cast_possible_truncation, reason = "128")]
const LINE_BYTES: usize = LINE as usize;

/// A bulk ring's memory: its header, its flags, its index lines, its payloads.
#[derive(Debug, Clone, Copy)]
pub struct BulkMemory {
    indices: RingIndices,
    flags: NonNull<AtomicU64>,
    /// The `2 × parts` index lines (more than one part), else the header's (unused).
    lines: NonNull<u8>,
    payload: NonNull<u8>,
    msg_size: usize,
    parts: usize,
}

// SAFETY: the ring is shared memory by design; flags and indices are accessed through atomics, and
// the protocol hands each payload part to one side at a time (see the module's comment).
unsafe impl Send for BulkMemory {}
// SAFETY: as above.
unsafe impl Sync for BulkMemory {}

impl BulkMemory {
    /// # Safety
    /// `header` must point to a [`RingHeader`], 128-byte aligned, and `slots` to
    /// `bulk_slot_bytes(msg_size, capacity, parts)` writable bytes, 128-byte aligned, laid out as
    /// the module says, both valid for as long as the returned value and its copies are used.
    /// `capacity` must be a non-zero power of two below 2^32; `parts` a power of two from 1 to
    /// [`crate::layout::MAX_BULK_PARTS`]; `msg_size` a non-zero multiple of `16 × parts`.
    pub unsafe fn new(
        header: NonNull<RingHeader>,
        slots: NonNull<u8>,
        msg_size: usize,
        capacity: u64,
        parts: u32,
    ) -> Self {
        debug_assert!(capacity.is_power_of_two() && capacity < 1 << 32 && parts.is_power_of_two());
        debug_assert!(msg_size > 0 && msg_size.is_multiple_of(16 * parts as usize));
        #[allow(clippy::cast_possible_truncation, reason = "capacity < 2^32 (the contract)")]
        let (offset, lines) =
            (bulk_payload_offset(capacity as u32, parts) as usize, bulk_lines_offset(capacity as u32, parts) as usize);
        // SAFETY: the payloads start `offset` bytes into the slots, and the lines `lines` bytes (for
        // more than one part; for one, `lines` is the end of the flags, which stays unused), inside
        // the region the caller promised.
        let (payload, lines) = unsafe { (slots.add(offset), slots.add(lines)) };
        // SAFETY: the header's part of this function's contract.
        let indices = unsafe { RingIndices::new(header, capacity) };
        Self { indices, flags: slots.cast(), lines, payload, msg_size, parts: parts as usize }
    }

    /// Payload bytes per message.
    pub fn msg_size(&self) -> usize {
        self.msg_size
    }

    /// Parts every message is split into.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// Payload bytes per part.
    pub fn part_size(&self) -> usize {
        self.msg_size / self.parts
    }

    /// Messages the ring holds.
    pub fn capacity(&self) -> u64 {
        self.indices.capacity()
    }

    /// The producer index, as last published in the ring's header (for more than one part, a lower
    /// bound over the parts' heads).
    #[inline]
    pub fn head(&self) -> u64 {
        self.indices.head()
    }

    /// The consumer index, as last published in the ring's header (for more than one part, a lower
    /// bound over the parts' tails).
    #[inline]
    pub fn tail(&self) -> u64 {
        self.indices.tail()
    }

    /// Part `p`'s head line (the header's head for one part).
    #[inline]
    pub fn part_head(&self, p: usize) -> &AtomicU64 {
        if self.parts == 1 {
            return &self.indices.header().producer.head;
        }
        debug_assert!(p < self.parts);
        // SAFETY: line 2p of the 2 × parts lines `new` promised, line aligned (128-aligned slots, the
        // lines on a line boundary), accessed only atomically.
        unsafe { self.lines.add(2 * p * LINE_BYTES).cast::<AtomicU64>().as_ref() }
    }

    /// Part `p`'s tail line (the header's tail for one part).
    #[inline]
    pub fn part_tail(&self, p: usize) -> &AtomicU64 {
        if self.parts == 1 {
            return &self.indices.header().consumer.tail;
        }
        debug_assert!(p < self.parts);
        // SAFETY: line 2p + 1 of the lines `new` promised, as in `part_head`.
        unsafe { self.lines.add((2 * p + 1) * LINE_BYTES).cast::<AtomicU64>().as_ref() }
    }

    /// The slot message `seq` uses.
    #[inline]
    pub fn slot_of(&self, seq: u64) -> usize {
        self.indices.slot_of(seq)
    }

    /// The flag of part `p` of message `seq`'s slot.
    #[inline]
    fn flag(&self, seq: u64, p: usize) -> &AtomicU64 {
        debug_assert!(p < self.parts);
        // SAFETY: slot < capacity and p < parts, and `new` promised `capacity × parts` flags, 8-aligned
        // (aligned slots), accessed only atomically.
        unsafe { self.flags.add(self.slot_of(seq) * self.parts + p).as_ref() }
    }

    /// Whether part `p` of message `seq` is whole in its slot.
    #[inline]
    pub fn part_written(&self, seq: u64, p: usize) -> bool {
        self.flag(seq, p).load(Ordering::Acquire) == seq.wrapping_add(1)
    }

    /// Whether message `seq` is whole in its slot: every part's flag says so.
    #[inline]
    pub fn written(&self, seq: u64) -> bool {
        (0..self.parts).all(|p| self.part_written(seq, p))
    }

    /// The first byte of message `seq`'s payload slot (`msg_size` bytes, 16-byte aligned; part `p`
    /// at `p × part_size()` from it).
    #[inline]
    pub fn payload_ptr(&self, seq: u64) -> *mut u8 {
        // SAFETY: slot < capacity, and `new` promised `capacity * msg_size` payload bytes.
        unsafe { self.payload.as_ptr().add(self.slot_of(seq) * self.msg_size) }
    }

    /// The first byte of the ring's slots (its flags) and the slots' length: what an end prefaults.
    pub fn slots_raw(&self) -> (*const u8, usize) {
        let start = self.flags.as_ptr().cast::<u8>().cast_const();
        let capacity = usize::try_from(self.capacity()).unwrap_or(usize::MAX);
        let len =
            (self.payload.as_ptr() as usize - start as usize).saturating_add(capacity.saturating_mul(self.msg_size));
        (start, len)
    }

    /// Publishes `v` as the header's head (more than one part: the lower bound the module describes).
    fn publish_header_head(&self, v: u64) {
        if self.parts > 1 {
            self.indices.header().producer.head.store(v, Ordering::Release);
        }
    }

    /// Publishes `v` as the header's tail (more than one part).
    fn publish_header_tail(&self, v: u64) {
        if self.parts > 1 {
            self.indices.header().consumer.tail.store(v, Ordering::Release);
        }
    }
}

/// Whether `a` is after `b` on the wrapping sequence line.
#[inline]
fn after(a: u64, b: u64) -> bool {
    #[allow(clippy::cast_possible_wrap, reason = "a signed distance, as the ring's indices are read everywhere")]
    let ahead = a.wrapping_sub(b) as i64 > 0;
    ahead
}

/// The producer end's private state: the next message, a cached lower bound of the parts' tails and,
/// after resuming where parts disagreed, the positions of the parts still behind.
#[derive(Debug)]
pub struct BulkProducerCore {
    ring: BulkMemory,
    head: u64,
    cached_tail: u64,
    /// Per part, how far it is written, while some part is behind `head` (empty otherwise).
    behind: Box<[u64]>,
}

impl BulkProducerCore {
    /// Takes over the producer end where the last producer left it (see the module's comment).
    /// Whatever position it finds is published.
    pub fn new(ring: BulkMemory) -> Self {
        let cap = ring.capacity();
        let mut pos = Vec::with_capacity(ring.parts);
        let mut tails = Vec::with_capacity(ring.parts);
        for p in 0..ring.parts {
            let published = ring.part_head(p).load(Ordering::Relaxed);
            let tail = ring.part_tail(p).load(Ordering::Acquire);
            let mut at = if after(tail, published) { tail } else { published };
            while at.wrapping_sub(tail) < cap && ring.part_written(at, p) {
                at = at.wrapping_add(1);
            }
            if at != published {
                ring.part_head(p).store(at, Ordering::Release);
            }
            pos.push(at);
            tails.push(tail);
        }
        let head = pos.iter().copied().fold(pos[0], |m, x| if after(x, m) { x } else { m });
        let low = pos.iter().copied().fold(pos[0], |m, x| if after(m, x) { x } else { m });
        let cached_tail = tails.iter().copied().fold(tails[0], |m, x| if after(m, x) { x } else { m });
        ring.publish_header_head(low);
        let behind = if low == head { Box::default() } else { pos.into_boxed_slice() };
        Self { ring, head, cached_tail, behind }
    }

    /// The ring this end writes.
    pub fn ring(&self) -> &BulkMemory {
        &self.ring
    }

    /// The sequence number the next message gets.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Free slots, reading the parts' tails only when the ring looks full (and first completing the
    /// parts a previous producer left behind, as far as their consumers made room: none is free
    /// until they all are).
    #[inline]
    pub fn free(&mut self) -> Result<u64, Corrupt> {
        if !self.behind.is_empty() && !self.catch_up()? {
            return Ok(0);
        }
        let cap = self.ring.capacity();
        let used = self.head.wrapping_sub(self.cached_tail);
        if used >= cap {
            return self.refresh();
        }
        Ok(cap - used)
    }

    /// Rereads every part's tail (Acquire: each part's consumer's reads of the slots it frees happened
    /// before the caller's stores) and returns the free slots the furthest-behind one leaves.
    #[cold]
    #[inline(never)]
    fn refresh(&mut self) -> Result<u64, Corrupt> {
        let cap = self.ring.capacity();
        let mut worst = 0;
        for p in 0..self.ring.parts {
            let tail = self.ring.part_tail(p).load(Ordering::Acquire);
            let used = self.head.wrapping_sub(tail);
            if used > cap {
                return Err(Corrupt { head: self.head, tail });
            }
            if p == 0 || used > worst {
                worst = used;
                self.cached_tail = tail;
            }
        }
        Ok(cap - worst)
    }

    /// Completes the parts left behind `head` with what their slots hold, each as far as its
    /// consumer has made room; true once none is behind. A part whose tail is ahead of it (its
    /// consumer skipped, see the module) jumps there.
    #[cold]
    #[inline(never)]
    fn catch_up(&mut self) -> Result<bool, Corrupt> {
        let cap = self.ring.capacity();
        for p in 0..self.ring.parts {
            while self.behind[p] != self.head {
                let at = self.behind[p];
                let tail = self.ring.part_tail(p).load(Ordering::Acquire);
                if after(tail, at) {
                    if after(tail, self.head) {
                        return Err(Corrupt { head: self.head, tail });
                    }
                    self.behind[p] = tail;
                    continue;
                }
                if at.wrapping_sub(tail) >= cap {
                    break;
                }
                // The part's bytes are whatever the slot holds (the message its producer left
                // half-written, or an older lap): the flag only lets its reader go on.
                self.ring.flag(at, p).store(at.wrapping_add(1), Ordering::Release);
                self.behind[p] = at.wrapping_add(1);
                self.ring.part_head(p).store(self.behind[p], Ordering::Release);
            }
        }
        if self.behind.iter().all(|&b| b == self.head) {
            self.behind = Box::default();
            self.ring.publish_header_head(self.head);
            return Ok(true);
        }
        Ok(false)
    }

    /// The payload slot of the next message when there is room: the caller may write its
    /// `msg_size` bytes (and nothing else) until [`BulkProducerCore::publish`]. The Acquire loads of
    /// the tails behind `free` ordered the consumers' reads of the slot's last lap before these writes.
    #[inline]
    pub fn reserve(&mut self) -> Result<Option<*mut u8>, Corrupt> {
        Ok((self.free()? > 0).then(|| self.ring.payload_ptr(self.head)))
    }

    /// Publishes the message written into the slot [`BulkProducerCore::reserve`] gave: every part's
    /// flag, then every part's head (then, for more than one part, the header's), all with Release.
    /// Every store to the payload must be visible before this call (a helper thread's: handed over
    /// with a synchronising operation; non-temporal ones: followed by `sfence`). Call it only after a
    /// `reserve` that gave a slot.
    #[inline]
    pub fn publish(&mut self) {
        let seq = self.head;
        for p in 0..self.ring.parts {
            self.ring.flag(seq, p).store(seq.wrapping_add(1), Ordering::Release);
        }
        self.head = seq.wrapping_add(1);
        for p in 0..self.ring.parts {
            self.ring.part_head(p).store(self.head, Ordering::Release);
        }
        self.ring.publish_header_head(self.head);
    }
}

/// The consumer end's private state: the next message to read (the bulk consumer reads flags, not heads).
#[derive(Debug)]
pub struct BulkConsumerCore {
    ring: BulkMemory,
    tail: u64,
}

impl BulkConsumerCore {
    /// Takes over the consumer end at the furthest of the parts' published tails, moving the others
    /// there (see the module); refuses a part whose head is more than a ring ahead of its tail.
    pub fn new(ring: BulkMemory) -> Result<Self, Corrupt> {
        let cap = ring.capacity();
        let mut tail = ring.part_tail(0).load(Ordering::Relaxed);
        for p in 0..ring.parts {
            let t = ring.part_tail(p).load(Ordering::Relaxed);
            let head = ring.part_head(p).load(Ordering::Acquire);
            let ahead = head.wrapping_sub(t);
            // A head behind the tail is a GPU producer's lagging publication, which is fine.
            if after(head, t) && ahead > cap {
                return Err(Corrupt { head, tail: t });
            }
            if after(t, tail) {
                tail = t;
            }
        }
        for p in 0..ring.parts {
            if ring.part_tail(p).load(Ordering::Relaxed) != tail {
                ring.part_tail(p).store(tail, Ordering::Release);
            }
        }
        ring.publish_header_tail(tail);
        Ok(Self { ring, tail })
    }

    /// The ring this end reads.
    pub fn ring(&self) -> &BulkMemory {
        &self.ring
    }

    /// The sequence number of the next message to read.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// The payload of the next message if it is whole (every part's flag): the caller may read its
    /// `msg_size` bytes until [`BulkConsumerCore::release`]. The Acquire loads of the flags order
    /// the producer's payload stores before the caller's reads.
    #[inline]
    pub fn peek(&self) -> Option<*const u8> {
        let seq = self.tail;
        self.ring.written(seq).then(|| self.ring.payload_ptr(seq).cast_const())
    }

    /// Hands the slot [`BulkConsumerCore::peek`] gave back to the producer: every part's tail (then,
    /// for more than one part, the header's) with Release: every read of it is done. Reads by helper
    /// threads must have been joined first.
    #[inline]
    pub fn release(&mut self) {
        self.tail = self.tail.wrapping_add(1);
        for p in 0..self.ring.parts {
            self.ring.part_tail(p).store(self.tail, Ordering::Release);
        }
        self.ring.publish_header_tail(self.tail);
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
            Self::with_parts(msg_size, capacity, 1)
        }

        fn with_parts(msg_size: usize, capacity: u64, parts: u32) -> Self {
            let header = core::mem::size_of::<RingHeader>();
            let size = header + bulk_slot_bytes(msg_size as u32, capacity as u32, parts) as usize;
            let layout = Layout::from_size_align(size, 128).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            let slots = NonNull::new(ptr.as_ptr().wrapping_add(header)).unwrap();
            // SAFETY: the allocation holds the header and the slots, is 128-aligned (the slots 128-aligned
            // after a 384-byte header) and zeroed (zero is a valid header and an unwritten flag), and
            // lives as long as `self`.
            let ring = unsafe { BulkMemory::new(ptr.cast(), slots, msg_size, capacity, parts) };
            Self { ptr, layout, ring }
        }

        fn set_indices(&self, head: u64, tail: u64) {
            let h = self.ring.indices.header();
            h.producer.head.store(head, Ordering::Relaxed);
            h.consumer.tail.store(tail, Ordering::Relaxed);
            for p in 0..self.ring.parts() {
                self.ring.part_head(p).store(head, Ordering::Relaxed);
                self.ring.part_tail(p).store(tail, Ordering::Relaxed);
            }
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

    /// One GPU block's end over part `part` (what mesh.cuh's `mesh_bulk_open_part` does), written in
    /// Rust against the format: its own flag, head or tail line, and bytes of every message.
    struct PartBlock {
        ring: BulkMemory,
        part: usize,
        mine: u64,
    }

    impl PartBlock {
        fn open(ring: BulkMemory, part: usize) -> Self {
            Self { ring, part, mine: 0 }
        }

        fn part_ptr(&self, seq: u64) -> *mut u8 {
            self.ring.payload_ptr(seq).wrapping_add(self.part * self.ring.part_size())
        }

        fn try_send(&mut self, msg: &[u8]) -> bool {
            let tail = self.ring.part_tail(self.part).load(Ordering::Acquire);
            if self.mine.wrapping_sub(tail) >= self.ring.capacity() {
                return false;
            }
            let n = self.ring.part_size();
            // SAFETY: part `part` of the slot is this block's until its flag is stored (its tail
            // says its reader is done with the last lap).
            unsafe { core::ptr::copy_nonoverlapping(msg.as_ptr().add(self.part * n), self.part_ptr(self.mine), n) };
            self.ring.flag(self.mine, self.part).store(self.mine + 1, Ordering::Release);
            self.mine += 1;
            self.ring.part_head(self.part).store(self.mine, Ordering::Release);
            true
        }

        fn try_recv(&mut self, out: &mut [u8]) -> bool {
            if !self.ring.part_written(self.mine, self.part) {
                return false;
            }
            // SAFETY: the part's flag says it is whole; its writer waits for the tail below.
            unsafe { core::ptr::copy_nonoverlapping(self.part_ptr(self.mine), out.as_mut_ptr(), out.len()) };
            self.mine += 1;
            self.ring.part_tail(self.part).store(self.mine, Ordering::Release);
            true
        }
    }

    #[test]
    fn one_part_is_the_format_before_parts() {
        for capacity in [1u32, 8, 512, 1 << 20] {
            assert_eq!(bulk_payload_offset(capacity, 1), (8 * u64::from(capacity)).div_ceil(4096) * 4096);
            assert_eq!(bulk_payload_offset(capacity, 0), bulk_payload_offset(capacity, 1), "0 reads as 1");
        }
        let heap = HeapBulk::new(32, 4);
        let h = heap.ring.indices.header();
        assert!(core::ptr::eq(heap.ring.part_head(0), &h.producer.head));
        assert!(core::ptr::eq(heap.ring.part_tail(0), &h.consumer.tail));
    }

    #[test]
    fn parts_lay_out_flags_then_lines_then_payloads() {
        let heap = HeapBulk::with_parts(32 * 16, 4, 32);
        let base = heap.ring.flags.as_ptr() as usize;
        // 4 × 32 flags: 1024 bytes; then 64 lines: 8192; padded to a page: 12288.
        assert_eq!(heap.ring.payload_ptr(0) as usize - base, 12288);
        assert_eq!(heap.ring.flag(1, 3) as *const AtomicU64 as usize - base, 8 * 35, "slot 1, part 3");
        assert_eq!(heap.ring.part_head(0) as *const AtomicU64 as usize - base, 1024);
        assert_eq!(heap.ring.part_tail(0) as *const AtomicU64 as usize - base, 1024 + 128);
        assert_eq!(heap.ring.part_tail(31) as *const AtomicU64 as usize - base, 1024 + 63 * 128);
        assert_eq!(heap.ring.part_size(), 16);
        let heap = HeapBulk::with_parts(64, 1, 2);
        // 2 flags (16 bytes), lines from 128.
        assert_eq!(heap.ring.part_head(1) as *const AtomicU64 as usize - heap.ring.flags.as_ptr() as usize, 128 + 256);
        assert_eq!(heap.ring.payload_ptr(0) as usize - heap.ring.flags.as_ptr() as usize, 4096);
    }

    #[test]
    fn a_message_is_whole_only_when_every_part_is() {
        let heap = HeapBulk::with_parts(64, 2, 4);
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        let mut blocks: Vec<PartBlock> = (0..4).map(|p| PartBlock::open(heap.ring, p)).collect();
        let msg = message(0, 64);
        for b in &mut blocks[..3] {
            assert!(b.try_send(&msg));
            assert!(c.peek().is_none(), "a message with a part missing is not a message");
        }
        assert_eq!(heap.ring.head(), 0, "blocks publish their parts' heads, not the header's");
        assert!(blocks[3].try_send(&msg));
        let mut out = [0u8; 64];
        assert!(recv(&mut c, &mut out));
        assert_eq!(out[..], msg[..]);
        assert_eq!(heap.ring.tail(), 1, "a host consumer keeps the header's tail");
        for p in 0..4 {
            assert_eq!(heap.ring.part_tail(p).load(Ordering::Relaxed), 1);
        }
    }

    #[test]
    fn a_host_producer_feeds_blocks_that_each_read_their_part() {
        for parts in [1u32, 2, 4, 8, 32] {
            let size = 16 * parts as usize * 2;
            let heap = HeapBulk::with_parts(size, 2, parts);
            let mut p = BulkProducerCore::new(heap.ring);
            let mut blocks: Vec<PartBlock> = (0..parts as usize).map(|q| PartBlock::open(heap.ring, q)).collect();
            let part = size / parts as usize;
            let mut out = vec![0u8; part];
            for seq in 0..5u64 {
                assert!(send(&mut p, &message(seq, size)));
                for (q, b) in blocks.iter_mut().enumerate() {
                    assert!(b.try_recv(&mut out), "{parts} parts, message {seq}, part {q}");
                    assert_eq!(out[..], message(seq, size)[q * part..(q + 1) * part]);
                }
            }
            // Room is the slowest part's: part 0's block stops reading.
            assert!(send(&mut p, &message(5, size)) && send(&mut p, &message(6, size)));
            for b in &mut blocks[1..] {
                assert!(b.try_recv(&mut out) && b.try_recv(&mut out));
            }
            if parts > 1 {
                assert!(!send(&mut p, &message(7, size)), "part 0's reader holds both slots");
            }
            assert!(blocks[0].try_recv(&mut out));
            assert!(send(&mut p, &message(7, size)));
        }
    }

    #[test]
    fn a_producer_resumes_past_parts_left_behind_and_completes_them() {
        // A GPU producer of 4 blocks stopped with parts at 3, 1, 2, 3 (heads published at 0).
        let size = 64;
        let heap = HeapBulk::with_parts(size, 4, 4);
        let mut blocks: Vec<PartBlock> = (0..4).map(|p| PartBlock::open(heap.ring, p)).collect();
        for (b, n) in blocks.iter_mut().zip([3u64, 1, 2, 3]) {
            for seq in 0..n {
                assert!(b.try_send(&message(seq, size)));
            }
            b.ring.part_head(b.part).store(0, Ordering::Relaxed);
        }
        let mut p = BulkProducerCore::new(heap.ring);
        assert_eq!(p.head(), 3, "the furthest part");
        assert_eq!(heap.ring.head(), 1, "the header's head: the lower bound over the parts");
        assert!(send(&mut p, &message(3, size)), "parts 1 and 2 completed, then message 3");
        assert_eq!(heap.ring.head(), 4);
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        let mut out = vec![0u8; size];
        assert!(recv(&mut c, &mut out));
        assert_eq!(out[..], message(0, size)[..]);
        assert!(recv(&mut c, &mut out), "message 1: part 1 completed with what its slot held (torn)");
        assert_eq!(out[..16], message(1, size)[..16]);
        assert_eq!(out[16..32], [0; 16], "part 1 of message 1 was never written");
        assert!(recv(&mut c, &mut out) && recv(&mut c, &mut out));
        assert_eq!(out[..], message(3, size)[..]);
        assert!(!recv(&mut c, &mut out));
    }

    #[test]
    fn completing_parts_waits_for_their_consumers_room() {
        // Part 0 at 4 (a full ring of 4), part 1 at 0: part 1 can be completed, but message 4 has no
        // room until part 0's consumer reads.
        let size = 32;
        let heap = HeapBulk::with_parts(size, 4, 2);
        let mut b0 = PartBlock::open(heap.ring, 0);
        for seq in 0..4 {
            assert!(b0.try_send(&message(seq, size)));
        }
        let mut p = BulkProducerCore::new(heap.ring);
        assert_eq!(p.head(), 4);
        assert_eq!(p.reserve(), Ok(None), "full");
        assert_eq!(heap.ring.part_head(1).load(Ordering::Relaxed), 4, "part 1 completed");
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        let mut out = vec![0u8; size];
        assert!(recv(&mut c, &mut out));
        assert!(send(&mut p, &message(4, size)));
    }

    #[test]
    fn a_consumer_resumes_at_the_furthest_tail_and_skips_partly_taken_messages() {
        let size = 64;
        let heap = HeapBulk::with_parts(size, 8, 2);
        let mut p = BulkProducerCore::new(heap.ring);
        for seq in 0..5 {
            assert!(send(&mut p, &message(seq, size)));
        }
        // A GPU consumer's blocks stopped with part 0 at 1 and part 1 at 3.
        let mut half = [0u8; 32];
        let (mut b0, mut b1) = (PartBlock::open(heap.ring, 0), PartBlock::open(heap.ring, 1));
        assert!(b0.try_recv(&mut half));
        for _ in 0..3 {
            assert!(b1.try_recv(&mut half));
        }
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        assert_eq!(c.tail(), 3);
        assert_eq!(heap.ring.part_tail(0).load(Ordering::Relaxed), 3, "moved forward");
        assert_eq!(heap.ring.tail(), 3);
        let mut out = vec![0u8; size];
        assert!(recv(&mut c, &mut out));
        assert_eq!(out[..], message(3, size)[..]);
        assert!(recv(&mut c, &mut out) && !recv(&mut c, &mut out));
        assert!(send(&mut p, &message(5, size)));
        assert!(recv(&mut c, &mut out));
        assert_eq!(out[..], message(5, size)[..]);
    }

    #[test]
    fn a_part_whose_consumer_skipped_it_jumps_when_completed() {
        // Producer parts at 4 and 1; consumer tails at 4 and 0 → the new consumer moves both to 4;
        // the new producer then finds part 1's tail ahead of it and jumps instead of completing.
        let size = 32;
        let heap = HeapBulk::with_parts(size, 4, 2);
        let mut b0 = PartBlock::open(heap.ring, 0);
        let mut b1 = PartBlock::open(heap.ring, 1);
        let mut r0 = PartBlock::open(heap.ring, 0);
        let mut half = [0u8; 16];
        for seq in 0..4 {
            assert!(b0.try_send(&message(seq, size)));
            assert!(r0.try_recv(&mut half));
        }
        assert!(b1.try_send(&message(0, size)));
        let mut p = BulkProducerCore::new(heap.ring);
        assert_eq!(p.head(), 4);
        let mut c = BulkConsumerCore::new(heap.ring).unwrap();
        assert_eq!(c.tail(), 4);
        assert!(send(&mut p, &message(4, size)));
        let mut out = vec![0u8; size];
        assert!(recv(&mut c, &mut out));
        assert_eq!(out[..], message(4, size)[..]);
    }

    #[test]
    fn corrupt_part_indices_are_reported() {
        let heap = HeapBulk::with_parts(64, 4, 4);
        heap.ring.part_head(2).store(100, Ordering::Relaxed);
        assert_eq!(BulkConsumerCore::new(heap.ring).unwrap_err(), Corrupt { head: 100, tail: 0 });
        heap.ring.part_head(2).store(0, Ordering::Relaxed);
        let mut p = BulkProducerCore::new(heap.ring);
        heap.ring.part_tail(3).store(1000, Ordering::Relaxed);
        for _ in 0..4 {
            assert!(send(&mut p, &message(0, 64)));
        }
        assert_eq!(p.reserve(), Err(Corrupt { head: 4, tail: 1000 }));
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
            parts in prop_oneof![Just(1u32), Just(2), Just(4), Just(8), Just(32)],
            ops in proptest::collection::vec(any::<bool>(), 0..200),
        ) {
            let capacity = 1u64 << cap_log;
            let size = 16 * parts as usize;
            let heap = HeapBulk::with_parts(size, capacity, parts);
            heap.set_indices(start, start);
            let mut p = BulkProducerCore::new(heap.ring);
            let mut c = BulkConsumerCore::new(heap.ring).unwrap();
            let mut model = std::collections::VecDeque::new();
            let mut next = start;
            let mut out = vec![0u8; size];
            for op in ops {
                if op {
                    let sent = send(&mut p, &message(next, size));
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
                        prop_assert_eq!(&out[..], &message(seq, size)[..]);
                    }
                }
                prop_assert_eq!(heap.ring.head().wrapping_sub(heap.ring.tail()), model.len() as u64);
                for q in 0..parts as usize {
                    prop_assert_eq!(heap.ring.part_head(q).load(Ordering::Relaxed), heap.ring.head());
                    prop_assert_eq!(heap.ring.part_tail(q).load(Ordering::Relaxed), heap.ring.tail());
                }
            }
        }
    }

    #[test]
    fn threads_exchange_in_order() {
        // Small under Miri, which runs this protocol for data races and weak-memory bugs.
        let (count, size): (u64, usize) = if cfg!(miri) { (40, 64) } else { (20_000, 256) };
        exchange_in_order(count, size, 1);
    }

    #[test]
    fn threads_exchange_in_order_over_parts() {
        let (count, size): (u64, usize) = if cfg!(miri) { (24, 64) } else { (5_000, 512) };
        exchange_in_order(count, size, 4);
    }

    #[test]
    fn blocks_of_parts_exchange_in_order() {
        // Two threads per end, each the block of one part (what two GPU blocks on one binding do),
        // moving their parts independently; every message arrives whole and in order.
        let (count, size): (u64, usize) = if cfg!(miri) { (12, 32) } else { (5_000, 256) };
        let heap = HeapBulk::with_parts(size, 2, 2);
        let ring = heap.ring;
        let got = std::sync::Mutex::new(vec![vec![0u8; size]; count as usize]);
        std::thread::scope(|s| {
            for part in 0..2 {
                s.spawn(move || {
                    let mut b = PartBlock::open(ring, part);
                    let mut i = 0;
                    while i < count {
                        if b.try_send(&message(i, size)) {
                            i += 1;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                });
                let got = &got;
                s.spawn(move || {
                    let mut b = PartBlock::open(ring, part);
                    let half = size / 2;
                    let mut buf = vec![0u8; half];
                    let mut i = 0;
                    while i < count {
                        if b.try_recv(&mut buf) {
                            got.lock().unwrap()[i as usize][part * half..(part + 1) * half].copy_from_slice(&buf);
                            i += 1;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                });
            }
        });
        for (i, m) in got.into_inner().unwrap().iter().enumerate() {
            assert!(m[..] == message(i as u64, size)[..], "message {i} torn");
        }
    }

    fn exchange_in_order(count: u64, size: usize, parts: u32) {
        let heap = HeapBulk::with_parts(size, 4, parts);
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
