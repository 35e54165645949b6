//! The single-producer single-consumer ring over raw memory: the index arithmetic and the publish protocol.
//!
//! Kept free of files and mappings so that Miri can run it over heap memory.
//! Protocol (the device side in `mesh.cuh` does the same with
//! `st.release.sys` / `ld.acquire.sys`): the producer writes a slot, then
//! stores `head` with Release; the consumer loads `head` with Acquire, copies
//! the slot out, then stores `tail` with Release; the producer loads `tail`
//! with Acquire before reusing a slot. Each side caches the other's index and
//! reads the shared line only when the ring looks full or empty.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use crate::layout::RingHeader;

/// A ring's memory: its header and `capacity * msg_size` bytes of slots right after it.
#[derive(Debug, Clone, Copy)]
pub struct RingMemory {
    header: NonNull<RingHeader>,
    msg_size: usize,
    capacity: u64,
}

// SAFETY: the ring is shared memory by design; every access goes through atomics or through slots
// that the protocol hands to one side at a time.
unsafe impl Send for RingMemory {}
// SAFETY: as above; `&RingMemory` only exposes the same protocol-guarded accesses.
unsafe impl Sync for RingMemory {}

/// The ring's indices say something impossible: `head - tail` exceeds the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt {
    /// The producer index read.
    pub head: u64,
    /// The consumer index read.
    pub tail: u64,
}

impl RingMemory {
    /// # Safety
    /// `header` must point to a [`RingHeader`] followed by `capacity * msg_size` writable bytes,
    /// 128-byte aligned, valid for as long as the returned value and its copies are used.
    /// `capacity` must be a power of two and non-zero; `msg_size` non-zero.
    pub unsafe fn new(header: NonNull<RingHeader>, msg_size: usize, capacity: u64) -> Self {
        debug_assert!(capacity.is_power_of_two() && msg_size > 0);
        Self { header, msg_size, capacity }
    }

    /// Bytes per message.
    pub fn msg_size(&self) -> usize {
        self.msg_size
    }

    /// Messages the ring holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    #[inline]
    fn header(&self) -> &RingHeader {
        // SAFETY: `new`'s contract keeps the header valid; it is only read through atomics.
        unsafe { self.header.as_ref() }
    }

    /// The producer index, as last published.
    #[inline]
    pub fn head(&self) -> u64 {
        self.header().producer.head.load(Ordering::Acquire)
    }

    /// The consumer index, as last published.
    #[inline]
    pub fn tail(&self) -> u64 {
        self.header().consumer.tail.load(Ordering::Acquire)
    }

    #[inline]
    fn slot(&self, index: u64) -> *mut u8 {
        let offset = (index & (self.capacity - 1)) as usize * self.msg_size;
        // SAFETY: `offset + msg_size <= capacity * msg_size`, inside the region `new` promised.
        unsafe { self.header.as_ptr().add(1).cast::<u8>().add(offset) }
    }
}

/// Copies one message; the common small sizes as fixed-size copies, which compile to a few moves
/// instead of a `memcpy` call (an 8-byte message costs about as much as the call itself).
#[inline]
fn copy_message(dst: &mut [u8], src: &[u8]) {
    macro_rules! fixed {
        ($($n:literal),*) => {
            match src.len() {
                $($n => {
                    let (d, s): (&mut [u8; $n], &[u8; $n]) = (dst.try_into().expect("same length"), src.try_into().expect("same length"));
                    *d = *s;
                })*
                _ => dst.copy_from_slice(src),
            }
        };
    }
    fixed!(8, 16, 32, 64);
}

/// The producer end's private state: its own index and a cached copy of the consumer's.
#[derive(Debug)]
pub struct ProducerCore {
    ring: RingMemory,
    head: u64,
    cached_tail: u64,
}

impl ProducerCore {
    /// Takes over the producer end at the indices currently published.
    pub fn new(ring: RingMemory) -> Self {
        let head = ring.header().producer.head.load(Ordering::Relaxed);
        let cached_tail = ring.tail();
        Self { ring, head, cached_tail }
    }

    /// The ring this end writes.
    pub fn ring(&self) -> &RingMemory {
        &self.ring
    }

    /// Free slots, refreshing the cached consumer index only when the ring looks full.
    #[inline]
    fn free(&mut self, wanted: u64) -> Result<u64, Corrupt> {
        let mut used = self.head.wrapping_sub(self.cached_tail);
        if self.ring.capacity - used.min(self.ring.capacity) < wanted {
            self.cached_tail = self.ring.tail();
            used = self.head.wrapping_sub(self.cached_tail);
        }
        if used > self.ring.capacity {
            return Err(Corrupt { head: self.head, tail: self.cached_tail });
        }
        Ok(self.ring.capacity - used)
    }

    /// Writes up to `count` messages produced by `fill(i, slot)`, publishing them with one index store.
    /// Returns how many were written (0 when the ring is full).
    #[inline]
    pub fn push_with(&mut self, count: u64, mut fill: impl FnMut(u64, &mut [u8])) -> Result<u64, Corrupt> {
        let n = self.free(count)?.min(count);
        for i in 0..n {
            let slot = self.ring.slot(self.head.wrapping_add(i));
            // SAFETY: the slot lies in the ring (see `slot`), and the consumer does not read it until
            // the Release store below publishes it: this end has exclusive access to it now.
            let bytes = unsafe { core::slice::from_raw_parts_mut(slot, self.ring.msg_size) };
            fill(i, bytes);
        }
        if n > 0 {
            self.head = self.head.wrapping_add(n);
            self.ring.header().producer.head.store(self.head, Ordering::Release);
        }
        Ok(n)
    }

    /// Writes one message (shorter ones are zero-padded); `false` when the ring is full.
    #[inline]
    pub fn try_push(&mut self, msg: &[u8]) -> Result<bool, Corrupt> {
        debug_assert!(msg.len() <= self.ring.msg_size);
        let n = self.push_with(1, |_, slot| {
            copy_message(&mut slot[..msg.len()], msg);
            if msg.len() < slot.len() {
                slot[msg.len()..].fill(0);
            }
        })?;
        Ok(n == 1)
    }
}

/// The consumer end's private state: its own index and a cached copy of the producer's.
#[derive(Debug)]
pub struct ConsumerCore {
    ring: RingMemory,
    tail: u64,
    cached_head: u64,
}

impl ConsumerCore {
    /// Takes over the consumer end at the indices currently published.
    pub fn new(ring: RingMemory) -> Self {
        let tail = ring.header().consumer.tail.load(Ordering::Relaxed);
        let cached_head = ring.head();
        Self { ring, tail, cached_head }
    }

    /// The ring this end reads.
    pub fn ring(&self) -> &RingMemory {
        &self.ring
    }

    #[inline]
    fn available(&mut self, wanted: u64) -> Result<u64, Corrupt> {
        let mut ready = self.cached_head.wrapping_sub(self.tail);
        if ready < wanted || ready > self.ring.capacity {
            self.cached_head = self.ring.head();
            ready = self.cached_head.wrapping_sub(self.tail);
        }
        if ready > self.ring.capacity {
            return Err(Corrupt { head: self.cached_head, tail: self.tail });
        }
        Ok(ready)
    }

    /// Reads up to `count` messages into `take(i, slot)`, releasing them with one index store.
    /// Returns how many were read (0 when the ring is empty).
    #[inline]
    pub fn pop_with(&mut self, count: u64, mut take: impl FnMut(u64, &[u8])) -> Result<u64, Corrupt> {
        let n = self.available(count)?.min(count);
        for i in 0..n {
            let slot = self.ring.slot(self.tail.wrapping_add(i));
            // SAFETY: the Acquire load of `head` made this slot's contents visible, and the producer
            // does not reuse it until the Release store of `tail` below.
            let bytes = unsafe { core::slice::from_raw_parts(slot, self.ring.msg_size) };
            take(i, bytes);
        }
        if n > 0 {
            self.tail = self.tail.wrapping_add(n);
            self.ring.header().consumer.tail.store(self.tail, Ordering::Release);
        }
        Ok(n)
    }

    /// Reads one message into `out` (its length must be the message size); `false` when empty.
    #[inline]
    pub fn try_pop(&mut self, out: &mut [u8]) -> Result<bool, Corrupt> {
        debug_assert_eq!(out.len(), self.ring.msg_size);
        let n = self.pop_with(1, |_, slot| copy_message(out, slot))?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{Layout, alloc_zeroed, dealloc};

    /// A ring over heap memory, freed on drop (what Miri runs the protocol on).
    struct HeapRing {
        ptr: NonNull<u8>,
        layout: Layout,
        ring: RingMemory,
    }

    impl HeapRing {
        fn new(msg_size: usize, capacity: u64) -> Self {
            let size = core::mem::size_of::<RingHeader>() + msg_size * capacity as usize;
            let layout = Layout::from_size_align(size, 128).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            // SAFETY: the allocation holds the header and the slots, is 128-aligned and zeroed
            // (zero is a valid RingHeader), and lives as long as `self`.
            let ring = unsafe { RingMemory::new(ptr.cast(), msg_size, capacity) };
            Self { ptr, layout, ring }
        }
    }

    impl Drop for HeapRing {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    #[test]
    fn fills_drains_and_wraps() {
        let heap = HeapRing::new(8, 4);
        let mut p = ProducerCore::new(heap.ring);
        let mut c = ConsumerCore::new(heap.ring);
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
        assert_eq!(heap.ring.head(), 40);
        assert_eq!(heap.ring.tail(), 40);
    }

    #[test]
    fn short_messages_are_zero_padded() {
        let heap = HeapRing::new(16, 2);
        let mut p = ProducerCore::new(heap.ring);
        let mut c = ConsumerCore::new(heap.ring);
        assert!(p.try_push(&[0xff; 16]).unwrap());
        assert!(p.try_push(&[0xff; 16]).unwrap());
        let mut out = [0u8; 16];
        assert!(c.try_pop(&mut out).unwrap());
        assert!(p.try_push(&[7, 7]).unwrap());
        assert!(c.try_pop(&mut out).unwrap());
        assert!(c.try_pop(&mut out).unwrap());
        assert_eq!(out[..2], [7, 7]);
        assert!(out[2..].iter().all(|&b| b == 0), "the rest of a reused slot is cleared");
    }

    #[test]
    fn corrupt_indices_are_reported_not_followed() {
        let heap = HeapRing::new(8, 4);
        // SAFETY: the header is valid; a test writes an impossible head as a buggy kernel might.
        unsafe { heap.ring.header.as_ref() }.producer.head.store(1000, Ordering::Release);
        let mut c = ConsumerCore::new(heap.ring);
        let mut out = [0u8; 8];
        assert_eq!(c.try_pop(&mut out), Err(Corrupt { head: 1000, tail: 0 }));
    }

    #[test]
    fn batches_publish_once_and_stop_at_capacity() {
        let heap = HeapRing::new(8, 8);
        let mut p = ProducerCore::new(heap.ring);
        let mut c = ConsumerCore::new(heap.ring);
        assert_eq!(p.push_with(20, |i, s| s.copy_from_slice(&i.to_le_bytes())).unwrap(), 8);
        let mut seen = Vec::new();
        assert_eq!(c.pop_with(5, |_, s| seen.push(u64::from_le_bytes(s.try_into().unwrap()))).unwrap(), 5);
        assert_eq!(p.push_with(20, |i, s| s.copy_from_slice(&(100 + i).to_le_bytes())).unwrap(), 5);
        assert_eq!(c.pop_with(99, |_, s| seen.push(u64::from_le_bytes(s.try_into().unwrap()))).unwrap(), 8);
        assert_eq!(seen, [0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103, 104]);
    }

    #[test]
    fn threads_exchange_in_order() {
        // Small under Miri, which runs this protocol for data races and weak-memory bugs.
        let count: u64 = if cfg!(miri) { 200 } else { 200_000 };
        let heap = HeapRing::new(16, 8);
        let ring = heap.ring;
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut p = ProducerCore::new(ring);
                let mut i = 0u64;
                while i < count {
                    let mut msg = [0u8; 16];
                    msg[..8].copy_from_slice(&i.to_le_bytes());
                    msg[8..].copy_from_slice(&(!i).to_le_bytes());
                    if p.try_push(&msg).unwrap() {
                        i += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
            let mut c = ConsumerCore::new(ring);
            let mut expect = 0u64;
            let mut out = [0u8; 16];
            while expect < count {
                if c.try_pop(&mut out).unwrap() {
                    let a = u64::from_le_bytes(out[..8].try_into().unwrap());
                    let b = u64::from_le_bytes(out[8..].try_into().unwrap());
                    assert_eq!(a, expect, "lost, duplicated or reordered");
                    assert_eq!(b, !expect, "torn message");
                    expect += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
    }
}
