//! The single-producer single-consumer ring over raw memory: the LL word format, the index arithmetic and the publish protocol.
//!
//! Kept free of files and mappings so that Miri can run it over heap memory.
//!
//! **Format (layout version 3).** A message of `msg_size` payload bytes occupies `msg_size / 4`
//! 8-byte *words* in its slot; each word carries 4 payload bytes in its low half and the tag of
//! the message's sequence number in its high half (`tag(seq)`: its low 31 bits, top bit set), the packing of
//! NCCL's LL protocol. A word is valid on its own: 8 bytes is the only single-copy atomic unit
//! PTX promises over PCIe, so a consumer that sees the right tag in a word has that word's
//! payload, whatever order the producer's stores arrived in. The consumer therefore polls the
//! slot itself and never reads `head` on its path, which on the GPU saves one dependent PCIe read
//! per message (see `mesh.cuh`). The ring costs twice its payload in memory.
//!
//! **Indices.** `head` (producer line) and `tail` (consumer line) still exist, each with one
//! writer: `tail` is the producer's credit (it must not overwrite message `seq` until
//! `tail > seq`), `head` is where a new producer resumes. Host ends publish theirs on every call
//! (a store to a line nobody polls costs nothing on the host); GPU ends publish in batches and
//! exactly on `mesh_chan_close`, so a published `head` may lag the true one: a new producer
//! starts at the larger of `head` and `tail` and skips forward over messages already written
//! (their first word carries their own tag).
//!
//! Memory orders: words are Relaxed atomics (each validates itself); the consumer stores `tail`
//! with Release after reading a message's words and the producer loads it with Acquire before
//! overwriting them, so a slot is never rewritten under a reader.
//!
//! **Host copies (x86-64).** The words are written and read two at a time with aligned 16-byte SSE
//! accesses in `asm!` (each 8-byte half is single-copy atomic, which is all the format asks; the
//! compiler sees an opaque access, i.e. relaxed atomic word accesses in order), the tag interleaved
//! into or gathered out of 16 payload bytes per step; elsewhere and under Miri the same words go
//! through `AtomicU64` one pair at a time. The bytes in memory are the same either way (tests
//! compare them word by word). The producer rereads `tail` only when its cached copy says full.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

pub use crate::indices::Corrupt;
use crate::indices::{ConsumerIndex, ProducerIndex, RingIndices};
use crate::layout::RingHeader;

/// Payload bytes one 8-byte word carries (the rest is its tag).
pub const WORD_PAYLOAD: usize = 4;
/// Bytes of ring memory per byte of payload.
#[allow(clippy::cast_possible_truncation, reason = "2")]
pub const WIRE_FACTOR: usize = crate::layout::RING_WIRE_FACTOR as usize;
const _: () = assert!(WIRE_FACTOR * WORD_PAYLOAD == 8);

/// The tag that marks a word as part of message `seq`: its low 31 bits with the top bit set, so
/// that it is never 0 (untouched memory) and differs from a word left from the previous lap,
/// `tag(seq - capacity)`, for every capacity below 2^31.
#[inline]
#[allow(clippy::cast_possible_truncation, reason = "the tag keeps only the low 31 bits of seq, on purpose")]
pub const fn tag(seq: u64) -> u32 {
    (seq as u32) | 0x8000_0000
}

/// One word of message `seq` carrying `payload`.
#[inline]
pub const fn word(seq: u64, payload: u32) -> u64 {
    ((tag(seq) as u64) << 32) | payload as u64
}

/// Payload bytes of two words: a message's size is a multiple of this, so the host ends move payload
/// 8 bytes (one pair of words) at a time, with no 4-byte tail to handle.
const PAIR: usize = 2 * WORD_PAYLOAD;
/// A word's payload half.
const LOW: u64 = 0xffff_ffff;

/// Stores 8 payload bytes `v` as the two words of `pair`, tagged with `t` (already shifted).
///
/// On x86-64 one aligned 16-byte store (`movdqa`) writes both words: each aligned 8-byte half of it is
/// single-copy atomic (Intel SDM vol. 3 §9.1.1, AMD APM vol. 2 §7.3.2; the whole 16 bytes are, on
/// processors with AVX), so it is what the format needs, two relaxed 8-byte atomic stores, in one
/// store-buffer entry and one request for the line.
#[inline(always)]
fn store_pair(pair: &[AtomicU64], t: u64, v: u64) {
    let (lo, hi) = (t | (v & LOW), t | (v >> 32));
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let p = pair[..2].as_ptr();
        debug_assert!(p.addr().is_multiple_of(16));
        // SAFETY: `p` points to two words of a slot (the bounds check above), 16-byte aligned (slots
        // are 16-aligned, a multiple of 16 bytes long, and pairs start at even words). The asm writes
        // those 16 bytes and nothing else, which the Rust memory model sees as two relaxed atomic
        // stores to `pair[0]` and `pair[1]` (it has no other effect on memory, flags or the stack).
        unsafe {
            core::arch::asm!(
                "movq {a}, {lo}",
                "movq {b}, {hi}",
                "punpcklqdq {a}, {b}",
                "movdqa xmmword ptr [{p}], {a}",
                p = in(reg) p,
                lo = in(reg) lo,
                hi = in(reg) hi,
                a = out(xmm_reg) _,
                b = out(xmm_reg) _,
                options(nostack, preserves_flags),
            );
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        pair[0].store(lo, Ordering::Relaxed);
        pair[1].store(hi, Ordering::Relaxed);
    }
}

/// Loads the two words of `pair`.
///
/// On x86-64 one aligned 16-byte load (`movdqa`; each 8-byte half single-copy atomic, see
/// [`store_pair`]): an 8-byte message is then read with one request for its line, with no window
/// between its two words in which the producer can take the line back.
#[inline(always)]
fn load_pair(pair: &[AtomicU64]) -> (u64, u64) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let p = pair[..2].as_ptr();
        debug_assert!(p.addr().is_multiple_of(16));
        let (lo, hi): (u64, u64);
        // SAFETY: `p` points to two words of a slot (the bounds check above), 16-byte aligned (as in
        // `store_pair`). The asm reads those 16 bytes and nothing else: to the Rust memory model,
        // relaxed atomic loads of `pair[0]` and `pair[1]`.
        unsafe {
            core::arch::asm!(
                "movdqa {x}, xmmword ptr [{p}]",
                "movq {lo}, {x}",
                "punpckhqdq {x}, {x}",
                "movq {hi}, {x}",
                p = in(reg) p,
                lo = out(reg) lo,
                hi = out(reg) hi,
                x = out(xmm_reg) _,
                options(nostack, preserves_flags, readonly),
            );
        }
        (lo, hi)
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        (pair[0].load(Ordering::Relaxed), pair[1].load(Ordering::Relaxed))
    }
}

/// Payload bytes `8k..8k + 8` of `msg`, zero-padded past its end.
#[inline]
fn padded_pair(msg: &[u8], k: usize) -> u64 {
    let mut b = [0u8; PAIR];
    let rest = msg.get(k * PAIR..).unwrap_or(&[]);
    let n = rest.len().min(PAIR);
    b[..n].copy_from_slice(&rest[..n]);
    u64::from_le_bytes(b)
}

/// Writes `src` (whole 8-byte pairs) as the tagged words `dst` (two per pair, `tag32` in each high
/// half), in order.
///
/// On x86-64 16 payload bytes at a time: one unaligned load, two interleaves with the tag, two
/// aligned 16-byte stores (each such store is two single-copy-atomic 8-byte words, see
/// [`store_pair`]). Elsewhere, and under Miri, pair by pair.
#[inline]
fn store_words(dst: &[AtomicU64], tag32: u32, src: &[u8]) {
    assert_eq!(dst.len() * WORD_PAYLOAD, src.len(), "two words per 8 payload bytes");
    let t = u64::from(tag32) << 32;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let quads = src.len() / 16;
        if quads > 0 {
            debug_assert!(dst.as_ptr().addr().is_multiple_of(16));
            // SAFETY: `dst` holds 4 words per 16 source bytes (the assert above), 16-byte aligned
            // (slots are 16-aligned and `dst` starts at an even word); `src` holds `16 * quads`
            // readable bytes. The asm reads those bytes and writes those words and nothing else:
            // to the Rust memory model, relaxed atomic stores of each word in order.
            unsafe {
                core::arch::asm!(
                    "movd {tg}, {tag:e}",
                    "pshufd {tg}, {tg}, 0",
                    "2:",
                    "movdqu {a}, xmmword ptr [{src}]",
                    "movdqa {b}, {a}",
                    "punpckldq {a}, {tg}",
                    "punpckhdq {b}, {tg}",
                    "movdqa xmmword ptr [{dst}], {a}",
                    "movdqa xmmword ptr [{dst} + 16], {b}",
                    "add {src}, 16",
                    "add {dst}, 32",
                    "dec {n}",
                    "jnz 2b",
                    tag = in(reg) tag32,
                    src = inout(reg) src.as_ptr() => _,
                    dst = inout(reg) dst.as_ptr() => _,
                    n = inout(reg) quads => _,
                    tg = out(xmm_reg) _,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    options(nostack),
                );
            }
        }
        if !src.len().is_multiple_of(16) {
            let k = src.len() - PAIR;
            store_pair(&dst[k / WORD_PAYLOAD..], t, u64::from_le_bytes(src[k..].try_into().expect("8 bytes")));
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    for (pair, c) in dst.chunks_exact(2).zip(src.chunks_exact(PAIR)) {
        store_pair(pair, t, u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
}

/// Copies the payload of the words `src` (an even number) into `out`; whether every word carries
/// `tag32`. `out` is written whatever the answer.
///
/// On x86-64 four words at a time: two aligned 16-byte loads (each two single-copy-atomic 8-byte
/// words), one shuffle gathering the payloads into one 16-byte store, one gathering the tags into one
/// compare; the tags' verdict is one mask test at the end. Elsewhere, and under Miri, pair by pair.
#[inline]
fn load_words(src: &[AtomicU64], tag32: u32, out: &mut [u8]) -> bool {
    assert_eq!(src.len() * WORD_PAYLOAD, out.len(), "8 payload bytes per two words");
    // The words the 16-byte loop took, and whether any of them was stray.
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let (mut stray, done) = (0u32, 0usize);
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    let (mut stray, done) = {
        let quads = src.len() / 4;
        if quads == 0 {
            (0, 0)
        } else {
            debug_assert!(src.as_ptr().addr().is_multiple_of(16));
            let mask: u32;
            // SAFETY: `src` holds 4 words per 16 bytes of `out` (the assert above), 16-byte aligned
            // (slots are 16-aligned, and `src` starts a slot); `out` is ours to write. The asm reads
            // those words and writes those bytes and nothing else: to the Rust memory model, relaxed
            // atomic loads of each word.
            unsafe {
                core::arch::asm!(
                    "movd {tg}, {tag:e}",
                    "pshufd {tg}, {tg}, 0",
                    "pcmpeqd {acc}, {acc}",
                    "2:",
                    "movdqa {a}, xmmword ptr [{src}]",
                    "movdqa {b}, xmmword ptr [{src} + 16]",
                    "movaps {c}, {a}",
                    "shufps {a}, {b}, 0x88",
                    "shufps {c}, {b}, 0xdd",
                    "pcmpeqd {c}, {tg}",
                    "pand {acc}, {c}",
                    "movdqu xmmword ptr [{dst}], {a}",
                    "add {src}, 32",
                    "add {dst}, 16",
                    "dec {n}",
                    "jnz 2b",
                    "movmskps {mask:e}, {acc}",
                    tag = in(reg) tag32,
                    src = inout(reg) src.as_ptr() => _,
                    dst = inout(reg) out.as_mut_ptr() => _,
                    n = inout(reg) quads => _,
                    mask = out(reg) mask,
                    tg = out(xmm_reg) _,
                    acc = out(xmm_reg) _,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    options(nostack),
                );
            }
            (mask ^ 0xf, quads * 4)
        }
    };
    for (pair, o) in src[done..].chunks_exact(2).zip(out[done * WORD_PAYLOAD..].chunks_exact_mut(PAIR)) {
        let (a, b) = (pair[0].load(Ordering::Relaxed), pair[1].load(Ordering::Relaxed));
        stray |= ((a >> 32) as u32 ^ tag32) | ((b >> 32) as u32 ^ tag32);
        o.copy_from_slice(&((a & LOW) | (b << 32)).to_le_bytes());
    }
    stray == 0
}

/// A ring's memory: its header and `capacity` slots of `msg_size / 4` words right after it.
#[derive(Debug, Clone, Copy)]
pub struct RingMemory {
    indices: RingIndices,
    slots: NonNull<AtomicU64>,
    msg_size: usize,
}

// SAFETY: the ring is shared memory by design; every access goes through atomics, and the
// protocol hands each slot to one writer at a time.
unsafe impl Send for RingMemory {}
// SAFETY: as above; `&RingMemory` only exposes the same atomic accesses.
unsafe impl Sync for RingMemory {}

impl RingMemory {
    /// # Safety
    /// `header` must point to a [`RingHeader`], 128-byte aligned, and `slots` to `capacity *
    /// msg_size * WIRE_FACTOR` writable bytes, 16-byte aligned, both valid for as long as the
    /// returned value and its copies are used. `capacity` must be a power of two and non-zero;
    /// `msg_size` a non-zero multiple of 8.
    pub unsafe fn new(header: NonNull<RingHeader>, slots: NonNull<AtomicU64>, msg_size: usize, capacity: u64) -> Self {
        debug_assert!(capacity.is_power_of_two() && msg_size > 0 && msg_size.is_multiple_of(8));
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

    /// Its indices.
    pub fn indices(&self) -> RingIndices {
        self.indices
    }

    #[inline]
    fn words_per_message(&self) -> usize {
        self.msg_size / WORD_PAYLOAD
    }

    /// The producer index, as last published (a GPU producer publishes in batches: a lower bound).
    #[inline]
    pub fn head(&self) -> u64 {
        self.indices.head()
    }

    /// The consumer index, as last published (a GPU consumer publishes in batches: a lower bound).
    #[inline]
    pub fn tail(&self) -> u64 {
        self.indices.tail()
    }

    /// The words of message `seq`'s slot.
    #[inline]
    fn words(&self, seq: u64) -> &[AtomicU64] {
        let n = self.words_per_message();
        let offset = self.indices.slot_of(seq) * n;
        // SAFETY: the slots are 16-aligned (see `new`), every slot a multiple of 16 bytes, and
        // `offset + n` words lie inside the `capacity * n` words `new` promised. AtomicU64 has the
        // layout of u64, and every access to the words is atomic.
        unsafe { core::slice::from_raw_parts(self.slots.as_ptr().add(offset), n) }
    }

    /// Whether message `seq` is whole in its slot (every word tagged with `seq`).
    #[inline]
    fn complete(&self, seq: u64) -> bool {
        let t = tag(seq);
        self.words(seq).iter().all(|w| (w.load(Ordering::Relaxed) >> 32) as u32 == t)
    }
}

/// The producer end's private state: its index (see `indices`) over the ring's words.
#[derive(Debug)]
pub struct ProducerCore {
    ring: RingMemory,
    index: ProducerIndex,
}

impl ProducerCore {
    /// Takes over the producer end where the last producer left it: at the larger of the published
    /// `head` and `tail`, then past every message already written after it (a GPU producer's
    /// published head may lag; its messages are recognised by their tags).
    pub fn new(ring: RingMemory) -> Self {
        Self { ring, index: ProducerIndex::resume(ring.indices, |seq| ring.complete(seq)) }
    }

    /// The ring this end writes.
    pub fn ring(&self) -> &RingMemory {
        &self.ring
    }

    /// Writes message `self.head` from `msg` (zero-padded to the message size), without publishing.
    /// The first word goes last: a GPU receiver decides "empty" on the first word alone, and on x86
    /// the other words are visible before it, so the receiver rarely catches a message half-written
    /// (which would cost it one more PCIe round trip to re-poll the rest).
    ///
    /// Payload is taken 8 bytes (one pair of words) at a time: the message size is a multiple of 8,
    /// so a pair never straddles the message's end, and one 8-byte load feeds one 16-byte store.
    #[inline]
    fn write(&self, msg: &[u8]) {
        if msg.len() != self.ring.msg_size {
            return self.write_padded(msg);
        }
        let seq = self.index.head();
        let words = self.ring.words(seq);
        let (head_pair, rest) = words.split_at(2);
        store_words(rest, tag(seq), &msg[PAIR..]);
        store_pair(head_pair, u64::from(tag(seq)) << 32, u64::from_le_bytes(msg[..PAIR].try_into().expect("8 bytes")));
    }

    /// [`Self::write`] for a message shorter than the message size: the rest of the slot is zeros.
    #[cold]
    #[inline(never)]
    fn write_padded(&self, msg: &[u8]) {
        let seq = self.index.head();
        let words = self.ring.words(seq);
        let t = u64::from(tag(seq)) << 32;
        let (head_pair, rest) = words.split_at(2);
        for (k, pair) in rest.chunks_exact(2).enumerate() {
            store_pair(pair, t, padded_pair(msg, k + 1));
        }
        store_pair(head_pair, t, padded_pair(msg, 0));
    }

    /// Writes up to `count` messages, message `i` taken from `msg(i)` (at most the message size;
    /// shorter ones are zero-padded), then publishes `head` once. Returns how many were written.
    #[inline]
    pub fn push_with<'m>(&mut self, count: u64, mut msg: impl FnMut(u64) -> &'m [u8]) -> Result<u64, Corrupt> {
        let n = self.index.free(count)?.min(count);
        for i in 0..n {
            // The Acquire load of `tail` in the index's refresh ordered the consumer's reads of this
            // slot before these stores; the consumer accepts a word only once it carries this message's tag.
            self.write(msg(i));
            self.index.advance(1);
        }
        if n > 0 {
            self.index.publish();
        }
        Ok(n)
    }

    /// Writes one message (shorter ones are zero-padded); `false` when the ring is full.
    ///
    /// The path of one message on its own, not [`Self::push_with`]'s loop: a compare against the
    /// cached `tail`, the slot's stores, the `head` store.
    #[inline(always)]
    pub fn try_push(&mut self, msg: &[u8]) -> Result<bool, Corrupt> {
        debug_assert!(msg.len() <= self.ring.msg_size);
        if !self.index.has_room()? {
            return Ok(false);
        }
        // As in `push_with`: the refresh's Acquire load ordered the consumer's reads before these stores.
        self.write(msg);
        self.index.advance(1);
        self.index.publish();
        Ok(true)
    }
}

/// The consumer end's private state: its index (see `indices`; the LL consumer never reads `head`).
#[derive(Debug)]
pub struct ConsumerCore {
    ring: RingMemory,
    index: ConsumerIndex,
}

impl ConsumerCore {
    /// Takes over the consumer end at the published `tail`. Refuses indices no producer can have
    /// left: a published `head` more than a ring ahead of `tail`.
    pub fn new(ring: RingMemory) -> Result<Self, Corrupt> {
        Ok(Self { ring, index: ConsumerIndex::claim(ring.indices)? })
    }

    /// The ring this end reads.
    pub fn ring(&self) -> &RingMemory {
        &self.ring
    }

    /// Copies message `self.tail`'s payload into `out` (exactly the message size), if it is whole.
    /// `out` is left alone when the first or the last word is missing (empty, or still arriving: a
    /// GPU warp stores every word at once, a host producer in order); it may be partly written when
    /// only a middle word is missing.
    ///
    /// One pass after the first and last words: the tags folded into one check at the end (no
    /// branch per word), the payload stored 8 bytes (an 8-byte message: the caller's 8-byte load of
    /// `out` is then forwarded from one store instead of stalling on two 4-byte ones) or 16 bytes at
    /// a time (see [`load_words`]).
    #[inline]
    fn read(&self, out: &mut [u8]) -> bool {
        let seq = self.index.tail();
        let words = self.ring.words(seq);
        let t = tag(seq);
        let n = words.len();
        if n == 2 {
            // Both words in one load, both tags in one test.
            let (first, last) = load_pair(words);
            let want = u64::from(t) << 32;
            if ((first ^ want) | (last ^ want)) >> 32 != 0 {
                return false;
            }
            out.copy_from_slice(&((first & LOW) | (last << 32)).to_le_bytes());
            return true;
        }
        let first = words[0].load(Ordering::Relaxed);
        if (first >> 32) as u32 != t {
            return false;
        }
        let last = words[n - 1].load(Ordering::Relaxed);
        if (last >> 32) as u32 != t {
            return false;
        }
        // The producer cannot rewrite a word of this message before our `tail` store, so what is
        // checked below is what was copied (the first and last words included, read again).
        load_words(words, t, out)
    }

    /// Reads up to `out.len() / msg_size` whole messages into consecutive records of `out`, then
    /// publishes `tail` once. Returns how many were read (0 when the ring is empty).
    #[inline]
    pub fn pop_into(&mut self, out: &mut [u8]) -> u64 {
        let mut n = 0;
        for record in out.chunks_exact_mut(self.ring.msg_size) {
            if !self.read(record) {
                break;
            }
            self.index.advance(1);
            n += 1;
        }
        if n > 0 {
            self.index.publish();
        }
        n
    }

    /// Reads one message into `out` (its length must be the message size); `false` when empty.
    #[inline(always)]
    pub fn try_pop(&mut self, out: &mut [u8]) -> bool {
        debug_assert_eq!(out.len(), self.ring.msg_size);
        // Not `pop_into`: one message needs no record count (a division by the message size).
        if !self.read(out) {
            return false;
        }
        self.index.advance(1);
        self.index.publish();
        true
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test capacities, indices and sequence numbers are small")]
mod tests;
