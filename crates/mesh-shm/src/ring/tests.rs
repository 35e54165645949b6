//! The LL ring's protocol over heap memory: words, tags, laps, stale words and corrupt indices, a model checked by proptest, and two threads (what Miri runs).

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
        let size = core::mem::size_of::<RingHeader>() + msg_size * WIRE_FACTOR * capacity as usize;
        let layout = Layout::from_size_align(size, 128).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        // SAFETY: the allocation holds the header and the slots, is 128-aligned and zeroed
        // (zero is a valid RingHeader and an untagged word), and lives as long as `self`.
        let slots = NonNull::new(ptr.as_ptr().wrapping_add(core::mem::size_of::<RingHeader>())).unwrap();
        // SAFETY: as above; the slots follow the header in the same allocation.
        let ring = unsafe { RingMemory::new(ptr.cast(), slots.cast(), msg_size, capacity) };
        Self { ptr, layout, ring }
    }

    /// Stores one word of message `seq` as a GPU producer would: no index published.
    fn store_word(&self, seq: u64, index: usize, payload: u32) {
        self.ring.words(seq)[index].store(word(seq, payload), Ordering::Relaxed);
    }

    fn set_indices(&self, head: u64, tail: u64) {
        let h = self.ring.indices.header();
        h.producer.head.store(head, Ordering::Relaxed);
        h.consumer.tail.store(tail, Ordering::Relaxed);
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
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let mut out = [0u8; 8];
    assert!(!c.try_pop(&mut out), "a new ring is empty");
    for round in 0u64..10 {
        for i in 0..4u64 {
            assert!(p.try_push(&(round * 4 + i).to_le_bytes()).unwrap());
        }
        assert!(!p.try_push(&[1]).unwrap(), "a full ring refuses");
        for i in 0..4u64 {
            assert!(c.try_pop(&mut out));
            assert_eq!(u64::from_le_bytes(out), round * 4 + i);
        }
        assert!(!c.try_pop(&mut out));
    }
    assert_eq!(heap.ring.head(), 40);
    assert_eq!(heap.ring.tail(), 40);
}

#[test]
fn every_word_carries_its_messages_tag() {
    let heap = HeapRing::new(8, 2);
    let mut p = ProducerCore::new(heap.ring);
    assert!(p.try_push(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap());
    let words: Vec<u64> = heap.ring.words(0).iter().map(|w| w.load(Ordering::Relaxed)).collect();
    assert_eq!(words, [0x8000_0000_0403_0201, 0x8000_0000_0807_0605]);
    assert_eq!(tag(0x1_8000_0005), 0x8000_0005, "31 bits of sequence, top bit set");
}

#[test]
fn short_messages_are_zero_padded() {
    let heap = HeapRing::new(16, 2);
    let mut p = ProducerCore::new(heap.ring);
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    assert!(p.try_push(&[0xff; 16]).unwrap());
    assert!(p.try_push(&[0xff; 16]).unwrap());
    let mut out = [0u8; 16];
    assert!(c.try_pop(&mut out));
    assert!(p.try_push(&[7, 7, 7, 7, 7]).unwrap());
    assert!(c.try_pop(&mut out));
    assert!(c.try_pop(&mut out));
    assert_eq!(out[..5], [7; 5]);
    assert!(out[5..].iter().all(|&b| b == 0), "the rest of a reused slot is cleared");
}

#[test]
fn a_message_is_taken_only_when_every_word_has_arrived() {
    let heap = HeapRing::new(16, 4);
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let mut out = [0u8; 16];
    // A GPU warp's stores may land in any order: the last word first, the first word last.
    heap.store_word(0, 3, 4);
    heap.store_word(0, 1, 2);
    assert!(!c.try_pop(&mut out), "words 0 and 2 are missing");
    assert_eq!(out, [0; 16], "a read refused for a missing first word leaves the buffer alone");
    heap.store_word(0, 0, 1);
    assert!(!c.try_pop(&mut out), "word 2 is missing");
    heap.store_word(0, 2, 3);
    assert!(c.try_pop(&mut out));
    let got: Vec<u32> = out.chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(got, [1, 2, 3, 4]);
    assert_eq!(heap.ring.tail(), 1);
}

#[test]
fn a_word_left_from_the_previous_lap_is_not_taken() {
    let heap = HeapRing::new(8, 2);
    let mut p = ProducerCore::new(heap.ring);
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let mut out = [0u8; 8];
    for i in 0..2u64 {
        assert!(p.try_push(&i.to_le_bytes()).unwrap());
        assert!(c.try_pop(&mut out));
    }
    // Message 2 reuses message 0's slot: with only its first word rewritten it is not whole.
    heap.store_word(2, 0, 9);
    assert!(!c.try_pop(&mut out));
    heap.store_word(2, 1, 0);
    assert!(c.try_pop(&mut out));
    assert_eq!(u64::from_le_bytes(out), 9);
}

#[test]
fn a_new_producer_skips_messages_written_after_the_published_head() {
    // A GPU producer publishes head in batches: head says 1, messages 1 and 2 are in the ring.
    let heap = HeapRing::new(8, 8);
    let mut p = ProducerCore::new(heap.ring);
    assert!(p.try_push(&[0; 8]).unwrap());
    for seq in 1..3 {
        heap.store_word(seq, 0, seq as u32);
        heap.store_word(seq, 1, 0);
    }
    let mut p = ProducerCore::new(heap.ring);
    assert_eq!(heap.ring.head(), 3, "resumes after the last message written");
    assert!(p.try_push(&3u64.to_le_bytes()).unwrap());
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let mut out = [0u8; 8];
    for expect in 0..4u64 {
        assert!(c.try_pop(&mut out));
        assert_eq!(u64::from_le_bytes(out), expect);
    }
    assert!(!c.try_pop(&mut out));
}

#[test]
fn a_new_producer_starts_no_earlier_than_the_consumer() {
    // The consumer took messages the lagging published head does not cover yet.
    let heap = HeapRing::new(8, 4);
    heap.set_indices(1, 6);
    let mut p = ProducerCore::new(heap.ring);
    assert!(p.try_push(&6u64.to_le_bytes()).unwrap());
    assert_eq!(heap.ring.head(), 7);
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let mut out = [0u8; 8];
    assert!(c.try_pop(&mut out));
    assert_eq!(u64::from_le_bytes(out), 6);
}

#[test]
fn corrupt_indices_are_reported_not_followed() {
    let heap = HeapRing::new(8, 4);
    heap.set_indices(1000, 0);
    assert_eq!(ConsumerCore::new(heap.ring).unwrap_err(), Corrupt { head: 1000, tail: 0 });
    let mut p = ProducerCore::new(heap.ring);
    assert_eq!(p.try_push(&[1]), Err(Corrupt { head: 1000, tail: 0 }));
    // An empty batch too (its room was once computed as capacity - used, which overflowed).
    assert_eq!(p.push_with(0, |_| &[]), Err(Corrupt { head: 1000, tail: 0 }));
}

#[test]
fn sequence_numbers_past_the_tags_31_bits_keep_working() {
    let heap = HeapRing::new(8, 4);
    let start = (1u64 << 31) - 5;
    heap.set_indices(start, start);
    let mut p = ProducerCore::new(heap.ring);
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let mut out = [0u8; 8];
    for i in start..start + 20 {
        assert!(p.try_push(&i.to_le_bytes()).unwrap());
        assert!(c.try_pop(&mut out));
        assert_eq!(u64::from_le_bytes(out), i);
    }
}

#[test]
fn batches_publish_once_and_stop_at_capacity() {
    let heap = HeapRing::new(8, 8);
    let mut p = ProducerCore::new(heap.ring);
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let msgs: Vec<[u8; 8]> = (0..20u64).map(u64::to_le_bytes).collect();
    assert_eq!(p.push_with(20, |i| &msgs[i as usize]).unwrap(), 8);
    let mut out = [0u8; 8 * 5];
    assert_eq!(c.pop_into(&mut out), 5);
    let mut seen: Vec<u64> = out.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
    let more: Vec<[u8; 8]> = (100..120u64).map(u64::to_le_bytes).collect();
    assert_eq!(p.push_with(20, |i| &more[i as usize]).unwrap(), 5);
    let mut out = [0u8; 8 * 99];
    assert_eq!(c.pop_into(&mut out), 8);
    seen.extend(out[..64].chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())));
    assert_eq!(seen, [0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103, 104]);
}

use crate::queue_model::pattern;

#[test]
fn every_size_is_written_word_by_word_as_the_format_says() {
    // 8: the head pair only; 16, 24, 32, 40: the 16-byte loop with and without a pair left over;
    // 4096: the largest a channel is used with.
    for size in [8, 16, 24, 32, 40, 64, 72, 4096] {
        let heap = HeapRing::new(size, 2);
        let mut p = ProducerCore::new(heap.ring);
        let mut c = ConsumerCore::new(heap.ring).unwrap();
        for seq in 0..3u64 {
            let msg = pattern(size, seq as u8);
            assert!(p.try_push(&msg).unwrap());
            let words: Vec<u64> = heap.ring.words(seq).iter().map(|w| w.load(Ordering::Relaxed)).collect();
            let expect: Vec<u64> =
                msg.chunks(WORD_PAYLOAD).map(|b| word(seq, u32::from_le_bytes(b.try_into().unwrap()))).collect();
            assert_eq!(words, expect, "size {size}, message {seq}");
            let mut out = vec![0u8; size];
            assert!(c.try_pop(&mut out));
            assert_eq!(out, msg, "size {size}, message {seq}");
        }
    }
}

#[test]
fn a_stray_word_anywhere_in_a_long_message_holds_it_back() {
    // 24 bytes: words 0-3 go through the 16-byte loop, 4-5 through the pair left over.
    for (size, stray) in [(24, 1), (24, 2), (24, 4), (64, 5), (64, 9), (64, 14)] {
        let heap = HeapRing::new(size, 2);
        let mut c = ConsumerCore::new(heap.ring).unwrap();
        let n = size / WORD_PAYLOAD;
        for k in 0..n {
            heap.store_word(0, k, k as u32);
        }
        // The word left from the lap before (message 0 - capacity) still sits at `stray`.
        heap.ring.words(0)[stray].store(word(0u64.wrapping_sub(2), 7), Ordering::Relaxed);
        let mut out = vec![0u8; size];
        assert!(!c.try_pop(&mut out), "size {size}: word {stray} is from the previous lap");
        assert_eq!(heap.ring.tail(), 0);
        heap.store_word(0, stray, stray as u32);
        assert!(c.try_pop(&mut out), "size {size}: now whole");
        let got: Vec<u32> = out.chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(got, (0..n as u32).collect::<Vec<_>>());
    }
}

#[test]
fn the_producer_rereads_tail_only_when_the_ring_looks_full() {
    let heap = HeapRing::new(8, 4);
    let mut p = ProducerCore::new(heap.ring);
    assert!(p.try_push(&[1; 8]).unwrap());
    // A tail no consumer can have left: a producer that read it on every send would refuse now.
    heap.ring.indices.header().consumer.tail.store(1000, Ordering::Release);
    for _ in 0..3 {
        assert!(p.try_push(&[2; 8]).unwrap(), "the cached tail still says there is room");
    }
    assert_eq!(p.try_push(&[3; 8]), Err(Corrupt { head: 4, tail: 1000 }), "full: reread, and refused");
}

#[test]
fn a_stale_cached_tail_is_refreshed_when_the_ring_looks_full() {
    let heap = HeapRing::new(16, 4);
    let mut p = ProducerCore::new(heap.ring);
    let mut c = ConsumerCore::new(heap.ring).unwrap();
    let mut out = [0u8; 16];
    for i in 0..4u8 {
        assert!(p.try_push(&[i; 16]).unwrap());
    }
    assert!(!p.try_push(&[9; 16]).unwrap());
    assert!(c.try_pop(&mut out));
    assert!(c.try_pop(&mut out));
    // The producer's copy of tail says 0; the consumer has published 2.
    assert!(p.try_push(&[4; 16]).unwrap());
    assert_eq!(p.push_with(5, |_| &[5; 16]).unwrap(), 1, "a batch stops at the room the fresh tail gives");
    assert!(!p.try_push(&[9; 16]).unwrap());
    for expect in [2, 3, 4, 5] {
        assert!(c.try_pop(&mut out));
        assert_eq!(out, [expect; 16]);
    }
    assert!(!c.try_pop(&mut out));
}

/// LL's two cores over one heap ring, for the shared model test.
struct Model<'h> {
    heap: &'h HeapRing,
    p: ProducerCore,
    c: ConsumerCore,
}

impl ModelRing for Model<'_> {
    fn push(&mut self, msg: &[u8]) -> bool {
        self.p.try_push(msg).unwrap()
    }
    fn push_batch(&mut self, msgs: &[Vec<u8>]) -> u64 {
        self.p.push_with(msgs.len() as u64, |i| &msgs[i as usize]).unwrap()
    }
    fn pop(&mut self, out: &mut [u8]) -> bool {
        self.c.try_pop(out)
    }
    fn pop_batch(&mut self, out: &mut [u8]) -> u64 {
        self.c.pop_into(out)
    }
    fn restart_producer(&mut self) {
        self.p = ProducerCore::new(self.heap.ring);
    }
    fn restart_consumer(&mut self) {
        self.c = ConsumerCore::new(self.heap.ring).unwrap();
    }
    fn in_flight(&self) -> u64 {
        self.heap.ring.head().wrapping_sub(self.heap.ring.tail())
    }
}

use crate::queue_model::{ModelRing, check, op};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any sequence of sends and receives, single and batched, and restarts of either end,
    /// across wraparounds and the tag's 31-bit boundary, gives what a queue of `capacity`
    /// messages gives, and publishes the same indices.
    #[test]
    #[cfg_attr(miri, ignore = "proptest is slow under Miri; the unit tests above cover the same paths there")]
    fn the_ring_behaves_as_a_bounded_queue(
        cap_log in 0u32..5,
        pairs in 1usize..10,
        start in prop_oneof![Just(0u64), Just((1u64 << 31) - 7), Just((1u64 << 32) - 3), any::<u32>().prop_map(u64::from)],
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let capacity = 1u64 << cap_log;
        let size = pairs * PAIR;
        let heap = HeapRing::new(size, capacity);
        heap.set_indices(start, start);
        let mut ring = Model { heap: &heap, p: ProducerCore::new(heap.ring), c: ConsumerCore::new(heap.ring).unwrap() };
        check(&mut ring, size, capacity, ops)?;
    }
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
        let mut c = ConsumerCore::new(ring).unwrap();
        let mut expect = 0u64;
        let mut out = [0u8; 16];
        while expect < count {
            if c.try_pop(&mut out) {
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
