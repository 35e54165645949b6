//! The bulk ring's protocol over heap memory: flags, parts, wrap-around and corrupt indices, a model checked by proptest, and two threads (what Miri runs).

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
