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
mod tests;
