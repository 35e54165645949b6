//! The fan-in ring's protocol over heap memory: every step of a send stopped, completed and repaired, shards, and a model of the whole checked by proptest (what Miri runs).

use super::memory::TICKET_MASK;
use super::*;
use crate::layout::{self, RingHeader};
use crate::ring::tag;
use core::ptr::NonNull;
use core::sync::atomic::Ordering;
use proptest::prelude::*;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::{BTreeMap, VecDeque};

/// A fan-in ring over zeroed heap memory, freed on drop (what Miri runs the protocol on).
struct HeapFanIn {
    ptr: NonNull<u8>,
    layout: Layout,
    ring: FanInMemory,
}

impl HeapFanIn {
    fn new(msg_size: usize, capacity: u64) -> Self {
        let header = core::mem::size_of::<RingHeader>();
        let owners = FanInMemory::owner_bytes(capacity) as usize;
        let slots = FanInMemory::slot_bytes(msg_size as u32, capacity) as usize;
        let layout = Layout::from_size_align(header + owners + slots, 128).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        let at = |off: usize| NonNull::new(ptr.as_ptr().wrapping_add(off)).unwrap();
        // SAFETY: the allocation holds the header, the table (8-aligned after 384 bytes) and the
        // slots (16-aligned: 384 + 8 * capacity), zeroed (an empty ring), living as long as `self`.
        let ring =
            unsafe { FanInMemory::new(ptr.cast(), at(header).cast(), at(header + owners).cast(), msg_size, capacity) };
        Self { ptr, layout, ring }
    }

    /// Puts the ring at position `start` (cursor and tail), every slot's last lap done.
    fn start_at(&self, start: u64) {
        start_ring_at(&self.ring, start);
    }
}

impl Drop for HeapFanIn {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A fan-in channel of `count` shards over zeroed heap memory laid out as in a mailbox: shard 0's
/// header, then the slots region at the offsets `layout` defines (`fanin_shard_offset`).
struct HeapShards {
    ptr: NonNull<u8>,
    layout: Layout,
    shards: FanInShards,
}

impl HeapShards {
    const HEADER: usize = core::mem::size_of::<RingHeader>();

    fn new(msg_size: u32, capacity: u32, count: u32) -> Self {
        let region = layout::fanin_region_bytes(msg_size, capacity, count) as usize;
        let layout = Layout::from_size_align(Self::HEADER + region, 128).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        let region = NonNull::new(ptr.as_ptr().wrapping_add(Self::HEADER)).unwrap();
        // SAFETY: the allocation holds shard 0's header and, 128-aligned after it (384 bytes), the
        // region of `count` shards, zeroed (every shard empty at 0), living as long as `self`.
        let shards = unsafe { FanInShards::new(ptr.cast(), region, msg_size, capacity, count) };
        Self { ptr, layout, shards }
    }

    /// The address of byte `off` of the slots region.
    fn region_at(&self, off: u64) -> usize {
        self.ptr.as_ptr() as usize + Self::HEADER + off as usize
    }

    /// Puts every shard at position `start`.
    fn start_at(&self, start: u64) {
        for ring in self.shards.iter() {
            start_ring_at(&ring, start);
        }
    }
}

impl Drop for HeapShards {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Puts `r` at position `start` (cursor and tail), every slot's last lap done.
fn start_ring_at(r: &FanInMemory, start: u64) {
    r.cursor().store(start, Ordering::Relaxed);
    r.header().consumer.tail.store(start, Ordering::Relaxed);
    for k in 0..r.capacity {
        let prev = start.wrapping_add(k).wrapping_sub(r.capacity);
        let own = Ownership { ticket: r.ticket(prev), state: OwnState::Done, owner: 0 };
        r.owner_word(r.index(prev)).store(own.word(), Ordering::Relaxed);
    }
}

/// Message `k` of sender `s`: the two numbers, then a pattern.
fn msg(size: usize, s: u32, k: u32) -> Vec<u8> {
    let mut m: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(37) ^ (k as u8)).collect();
    m[..4].copy_from_slice(&s.to_le_bytes());
    m[4..8].copy_from_slice(&k.to_le_bytes());
    m
}

fn take(c: &mut FanInConsumer, size: usize) -> Option<(Taken, Vec<u8>)> {
    let mut out = vec![0u8; size];
    c.try_take(&mut out).unwrap().map(|t| (t, out))
}

#[test]
fn ownership_words_round_trip_and_zero_is_a_finished_lap() {
    let own = Ownership { ticket: TICKET_MASK, state: OwnState::Writing, owner: 0xbeef };
    assert_eq!(Ownership::from_word(own.word()), own);
    assert_eq!(Ownership::from_word(0), Ownership { ticket: 0, state: OwnState::Done, owner: 0 });
}

#[test]
fn many_senders_are_taken_in_order_with_their_ids() {
    let heap = HeapFanIn::new(16, 4);
    let mut ps: Vec<FanInProducer> = (0..3).map(|s| FanInProducer::new(heap.ring, 0x1_0000 | s)).collect();
    let mut c = FanInConsumer::new(heap.ring);
    for round in 0..5u32 {
        for (s, p) in ps.iter_mut().enumerate() {
            assert!(p.try_send(&msg(16, s as u32, round)).unwrap());
        }
        for s in 0..3u32 {
            let (t, out) = take(&mut c, 16).unwrap();
            assert_eq!(t, Taken::Message { sender: 0x1_0000 | s });
            assert_eq!(out, msg(16, s, round));
        }
    }
    assert!(take(&mut c, 16).is_none());
    for k in 0..4 {
        assert!(ps[0].try_send(&msg(16, 0, k)).unwrap());
    }
    assert!(!ps[1].try_send(&[1]).unwrap(), "a full ring refuses every producer");
    assert_eq!((heap.ring.next(), heap.ring.tail()), (19, 15));
}

#[test]
fn a_slot_is_sender_kind_then_the_ll_body() {
    let heap = HeapFanIn::new(8, 2);
    let mut p = FanInProducer::new(heap.ring, 7);
    assert!(p.try_send(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap());
    let words: Vec<u64> = heap.ring.words(0).iter().map(|w| w.load(Ordering::Relaxed)).collect();
    assert_eq!(words, [0x8000_0000_0000_0007, 0x8000_0000_0000_0000, 0x8000_0000_0403_0201, 0x8000_0000_0807_0605]);
    assert_eq!(heap.ring.ownership(0), Ownership { ticket: 1, state: OwnState::Done, owner: 7 });
}

/// Runs a send of sender `s` to `stage` (that many steps), returning the op.
fn send_to(p: &mut FanInProducer, m: &[u8], stage: Stage) -> SendOp {
    let mut op = SendOp::default();
    while op.stage != stage {
        assert_eq!(p.step(&mut op, m).unwrap(), Step::Progress);
    }
    op
}

#[test]
fn a_producer_dead_at_every_step_is_completed_and_the_ring_goes_on() {
    let stages = [Stage::Reserved, Stage::Writing, Stage::HalfBody, Stage::Body, Stage::Kind, Stage::Committed];
    for (n, &stage) in stages.iter().enumerate() {
        let heap = HeapFanIn::new(16, 2);
        let mut c = FanInConsumer::new(heap.ring);
        let mut dying = FanInProducer::new(heap.ring, 1);
        let mut other = FanInProducer::new(heap.ring, 2);
        let _ = send_to(&mut dying, &msg(16, 1, 0), stage);
        assert!(other.try_send(&msg(16, 2, 0)).unwrap());
        if stage == Stage::Committed {
            // Committed: the message is whole and taken; completion only finishes its slot.
            assert_eq!(take(&mut c, 16).unwrap(), (Taken::Message { sender: 1 }, msg(16, 1, 0)));
            assert_eq!(complete_dead(&heap.ring, 1), Completion { finished: 1, ..Completion::default() });
        } else {
            assert!(take(&mut c, 16).is_none(), "stage {stage:?}: the dead slot holds the consumer");
            let done = complete_dead(&heap.ring, 1);
            assert_eq!(done, Completion { skipped: 1, ..Completion::default() }, "stage {n}");
            assert_eq!(take(&mut c, 16).unwrap().0, Taken::Skipped { sender: 1 });
        }
        assert_eq!(take(&mut c, 16).unwrap(), (Taken::Message { sender: 2 }, msg(16, 2, 0)));
        // Laps later, the slots are reused as ever, and a new client in the dead one's place works.
        let mut again = FanInProducer::new(heap.ring, 1 | 1 << 16);
        for k in 1..6 {
            assert!(again.try_send(&msg(16, 1, k)).unwrap());
            assert_eq!(take(&mut c, 16).unwrap(), (Taken::Message { sender: 1 | 1 << 16 }, msg(16, 1, k)));
        }
        assert_eq!(complete_dead(&heap.ring, 1), Completion::default(), "nothing left to complete");
    }
}

#[test]
fn a_stopped_reservation_is_revoked_and_its_late_begin_stores_nothing() {
    let heap = HeapFanIn::new(8, 2);
    let mut c = FanInConsumer::new(heap.ring);
    let mut stopped = FanInProducer::new(heap.ring, 3);
    let m = msg(8, 3, 0);
    let mut op = send_to(&mut stopped, &m, Stage::Reserved);
    assert_eq!(revoke_live(&heap.ring, 3), Completion { skipped: 1, ..Completion::default() });
    assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 3 });
    // Another producer takes the slot's next lap while the first is still stopped.
    let mut q = FanInProducer::new(heap.ring, 4);
    assert!(q.try_send(&msg(8, 4, 0)).unwrap());
    assert!(q.try_send(&msg(8, 4, 1)).unwrap());
    // The stopped producer resumes: its begin fails, it stored nothing, and it sends anew.
    assert_eq!(stopped.step(&mut op, &m).unwrap(), Step::Revoked);
    assert_eq!(op, SendOp::default());
    assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 4 }, msg(8, 4, 0)));
    assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 4 }, msg(8, 4, 1)));
    assert!(stopped.try_send(&m).unwrap());
    assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 3 }, m));
}

#[test]
fn a_producer_stopped_while_writing_holds_its_slot_and_one_stopped_after_its_commit_does_not() {
    let heap = HeapFanIn::new(8, 2);
    let mut c = FanInConsumer::new(heap.ring);
    let mut p = FanInProducer::new(heap.ring, 5);
    let m = msg(8, 5, 0);
    let mut op = send_to(&mut p, &m, Stage::HalfBody);
    assert_eq!(revoke_live(&heap.ring, 5), Completion { stuck: 1, ..Completion::default() });
    assert!(take(&mut c, 8).is_none(), "between begin and commit: the consumer waits");
    while op.stage != Stage::Committed {
        p.step(&mut op, &m).unwrap();
    }
    // Stopped between its commit and its finish: the message is taken, the slot finished for it.
    assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 5 }, m.clone()));
    assert_eq!(revoke_live(&heap.ring, 5), Completion { finished: 1, ..Completion::default() });
    let mut q = FanInProducer::new(heap.ring, 6);
    assert!(q.try_send(&msg(8, 6, 0)).unwrap());
    assert!(q.try_send(&msg(8, 6, 1)).unwrap(), "the slot's next lap");
    // The late finish fails and changes nothing (the slot is q's now).
    assert_eq!(p.step(&mut op, &m).unwrap(), Step::Sent);
    assert_eq!(heap.ring.ownership(0), Ownership { ticket: 2, state: OwnState::Done, owner: 6 });
    assert_eq!(take(&mut c, 8).unwrap().0, Taken::Message { sender: 6 });
    assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 6 }, msg(8, 6, 1)));
}

#[test]
fn the_hold_at_tail_names_the_reservation_the_consumer_waits_for_and_revoking_it_frees_the_ring() {
    let heap = HeapFanIn::new(8, 2);
    let ring = &heap.ring;
    let mut c = FanInConsumer::new(heap.ring);
    assert_eq!(hold_at_tail(ring), None, "an empty ring holds nothing");
    let mut p = FanInProducer::new(heap.ring, 0x2_0005);
    let m = msg(8, 5, 0);
    // Reserved, not begun: the consumer waits at seq 0 for owner 5.
    let mut op = send_to(&mut p, &m, Stage::Reserved);
    let h = hold_at_tail(ring).unwrap();
    assert_eq!((h.tail, h.seq, h.owner, h.state, h.committed), (0, 0, 5, OwnState::Reserved, false));
    assert_eq!(h.word, ring.owner_word(0).load(Ordering::Relaxed));
    assert_eq!(hold_at_tail(ring), Some(h), "unmoved: the same word");
    // Writing, not committed: another hold (another word) at the same place.
    assert_eq!(p.step(&mut op, &m).unwrap(), Step::Progress);
    let h = hold_at_tail(ring).unwrap();
    assert_eq!((h.seq, h.state, h.committed), (0, OwnState::Writing, false));
    // Committed, not finished: the consumer takes it; the hold moves to the slot's next lap,
    // which no producer can reserve until the last lap is finished.
    while op.stage != Stage::Committed {
        p.step(&mut op, &m).unwrap();
    }
    assert_eq!(hold_at_tail(ring).map(|h| (h.seq, h.committed)), Some((0, true)));
    assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 0x2_0005 }, m.clone()));
    assert_eq!(hold_at_tail(ring), None, "seq 1's slot is free: the ring is not held");
    let mut q = FanInProducer::new(heap.ring, 6);
    assert!(q.try_send(&msg(8, 6, 0)).unwrap());
    assert_eq!(take(&mut c, 8).unwrap().0, Taken::Message { sender: 6 });
    assert!(!q.try_send(&msg(8, 6, 1)).unwrap(), "seq 2 needs seq 0's slot, never finished");
    let h = hold_at_tail(ring).unwrap();
    assert_eq!((h.tail, h.seq, h.owner, h.state, h.committed), (2, 0, 5, OwnState::Writing, true));
    // The watcher's rule: revoke_live finishes it, and the ring goes on.
    assert_eq!(revoke_live(ring, 0x2_0005), Completion { finished: 1, ..Completion::default() });
    assert_eq!(hold_at_tail(ring), None);
    assert!(q.try_send(&msg(8, 6, 1)).unwrap());
    // A reservation revoked at the tail: a skip, then nothing holds the ring.
    assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 6 }, msg(8, 6, 1)));
    let _ = send_to(&mut p, &m, Stage::Reserved);
    let h = hold_at_tail(ring).unwrap();
    assert_eq!((h.tail, h.seq, h.state), (3, 3, OwnState::Reserved));
    assert_eq!(revoke_live(ring, 0x2_0005), Completion { skipped: 1, ..Completion::default() });
    assert_eq!(hold_at_tail(ring), None);
    assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 0x2_0005 });
}

#[test]
fn repair_writes_the_header_a_dead_completer_left_out() {
    let heap = HeapFanIn::new(8, 4);
    let mut c = FanInConsumer::new(heap.ring);
    let mut p = FanInProducer::new(heap.ring, 9);
    let _ = send_to(&mut p, &msg(8, 9, 0), Stage::Reserved);
    // A completer's CAS, then its death before the header.
    let own = heap.ring.ownership(0);
    heap.ring.owner_word(0).store(Ownership { state: OwnState::Skipped, ..own }.word(), Ordering::Release);
    assert!(take(&mut c, 8).is_none());
    assert_eq!(repair(&heap.ring), 1);
    assert_eq!(repair(&heap.ring), 0, "idempotent");
    assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 9 });
}

#[test]
fn the_consumer_restarts_at_the_published_tail_and_impossible_state_is_reported() {
    let heap = HeapFanIn::new(8, 4);
    heap.start_at(u64::MAX - 1);
    let mut p = FanInProducer::new(heap.ring, 1);
    for k in 0..3 {
        assert!(p.try_send(&msg(8, 1, k)).unwrap());
    }
    let mut c = FanInConsumer::new(heap.ring);
    assert_eq!(take(&mut c, 8).unwrap().1, msg(8, 1, 0));
    let mut c = FanInConsumer::new(heap.ring);
    assert_eq!(c.position(), u64::MAX);
    assert_eq!(take(&mut c, 8).unwrap().1, msg(8, 1, 1), "across the 64-bit wrap");
    assert_eq!(take(&mut c, 8).unwrap().1, msg(8, 1, 2));
    heap.ring.cursor().store(100, Ordering::Relaxed);
    assert_eq!(p.try_send(&[1]), Err(FanInCorrupt::Indices { next: 100, tail: 1 }));
    heap.ring.cursor().store(2, Ordering::Relaxed);
    let behind = Ownership { ticket: TICKET_MASK, state: OwnState::Done, owner: 0 }.word();
    heap.ring.owner_word(2).store(behind, Ordering::Relaxed);
    let refused = p.try_send(&[1]);
    assert_eq!(refused, Err(FanInCorrupt::Owner { seq: 2, word: behind }), "seq 2's slot missed a lap");
    heap.ring.words(1)[0].store(u64::from(tag(1)) << 32, Ordering::Relaxed);
    heap.ring.words(1)[1].store(u64::from(tag(1)) << 32 | 7, Ordering::Relaxed);
    let mut out = [0u8; 8];
    assert_eq!(c.try_take(&mut out), Err(FanInCorrupt::Kind { seq: 1, kind: 7 }));
}

// ---- The model test ----

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    /// Producer `p` takes one step of its current send (starting a new one if idle).
    Step(usize),
    /// Producer `p` runs its current send to the end (or until no room).
    Send(usize),
    /// Producer `p`'s process dies where it stands; meshd completes it and a new client takes
    /// its place (same slot, next epoch).
    Die(usize),
    /// meshd finds producer `p` stopped and revokes what it can.
    Revoke(usize),
    /// The consumer takes one slot.
    Take,
    /// The consumer's process dies and a new one takes the end over.
    RestartConsumer,
}

fn model_op(producers: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..producers).prop_map(Op::Step),
        2 => (0..producers).prop_map(Op::Send),
        1 => (0..producers).prop_map(Op::Die),
        1 => (0..producers).prop_map(Op::Revoke),
        5 => Just(Op::Take),
        1 => Just(Op::RestartConsumer),
    ]
}

/// A producer of the model: its core, its send in progress, its counter.
struct Client {
    core: FanInProducer,
    op: SendOp,
    epoch: u32,
    next_k: u32,
    /// meshd revoked its reservation and it has not stepped since.
    revoked: bool,
}

impl Client {
    fn sender(slot: usize, epoch: u32) -> u32 {
        slot as u32 | epoch << 16
    }
}

/// What the model expects: every committed message taken once, in each sender's order; one skip
/// per revoked reservation and per death before a commit.
struct Expect {
    committed: BTreeMap<u32, VecDeque<u32>>,
    skips: BTreeMap<u32, u32>,
}

fn check_take(t: Taken, out: &[u8], expect: &mut Expect, size: usize) -> Result<(), TestCaseError> {
    match t {
        Taken::Message { sender } => {
            let k = u32::from_le_bytes(out[4..8].try_into().unwrap());
            let queue = expect.committed.get_mut(&sender).expect("a sender the model knows");
            prop_assert_eq!(queue.pop_front(), Some(k), "sender {:x}: lost, repeated or reordered", sender);
            prop_assert_eq!(out, &msg(size, sender, k)[..], "torn");
        }
        Taken::Skipped { sender } => {
            let n = expect.skips.entry(sender).or_default();
            prop_assert!(*n > 0, "an unexpected skip from {:x}", sender);
            *n -= 1;
        }
    }
    Ok(())
}

/// The model over a channel of `shards` shards: client `s` sends into shard `s % shards`, the
/// consumer takes round-robin, meshd completes and revokes over every shard.
fn run_model(producers: usize, cap_log: u32, start: u64, shards: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let size = 16;
    let heap = HeapShards::new(size as u32, 1 << cap_log, shards);
    heap.start_at(start);
    let ring = heap.shards;
    let mut clients: Vec<Client> = (0..producers)
        .map(|s| Client {
            core: ring.producer(Client::sender(s, 0)),
            op: SendOp::default(),
            epoch: 0,
            next_k: 0,
            revoked: false,
        })
        .collect();
    let mut c = ShardedConsumer::new(&ring);
    let mut expect = Expect { committed: BTreeMap::new(), skips: BTreeMap::new() };
    // A take, its shard checked against its sender's.
    let take_one = |c: &mut ShardedConsumer, out: &mut [u8]| -> Result<Option<Taken>, TestCaseError> {
        let Some((shard, t)) = c.try_take(out).unwrap() else { return Ok(None) };
        let (Taken::Message { sender } | Taken::Skipped { sender }) = t;
        prop_assert_eq!(shard, ring.shard_of(sender), "sender {:x} taken from another shard", sender);
        Ok(Some(t))
    };
    for s in 0..producers {
        expect.committed.insert(Client::sender(s, 0), VecDeque::new());
    }
    // One step of client `s`, recording what it committed or had revoked.
    let step = |cl: &mut Client, expect: &mut Expect| -> Result<Step, TestCaseError> {
        let sender = cl.core.sender();
        let m = msg(size, sender, cl.next_k);
        let was = cl.op.stage;
        let r = cl.core.step(&mut cl.op, &m).unwrap();
        if was == Stage::Kind {
            expect.committed.get_mut(&sender).unwrap().push_back(cl.next_k);
        }
        if r == Step::Sent {
            cl.next_k += 1;
        }
        // A revocation's skip was counted when meshd made it (Op::Revoke).
        prop_assert_eq!(r == Step::Revoked, cl.revoked, "a revoked reservation is seen at the next step");
        cl.revoked = false;
        Ok(r)
    };
    let mut out = vec![0u8; size];
    for op in ops {
        match op {
            Op::Step(s) => {
                step(&mut clients[s], &mut expect)?;
            }
            Op::Send(s) => while !matches!(step(&mut clients[s], &mut expect)?, Step::Sent | Step::NoRoom) {},
            Op::Die(s) => {
                let cl = &mut clients[s];
                let sender = cl.core.sender();
                let done = ring.complete_dead(sender);
                let held = cl.op.stage != Stage::Idle && !cl.revoked;
                let committed = cl.op.stage == Stage::Committed;
                prop_assert_eq!(done.skipped, u32::from(held && !committed));
                prop_assert_eq!(done.stuck, 0);
                prop_assert!(done.finished <= u32::from(committed), "a revocation may have finished it already");
                *expect.skips.entry(sender).or_default() += done.skipped;
                cl.epoch += 1;
                let sender = Client::sender(s, cl.epoch);
                *cl = Client {
                    core: ring.producer(sender),
                    op: SendOp::default(),
                    epoch: cl.epoch,
                    next_k: 0,
                    revoked: false,
                };
                expect.committed.insert(sender, VecDeque::new());
            }
            Op::Revoke(s) => {
                let cl = &mut clients[s];
                let sender = cl.core.sender();
                let done = ring.revoke_live(sender);
                let reserved = cl.op.stage == Stage::Reserved && !cl.revoked;
                prop_assert_eq!(done.skipped, u32::from(reserved));
                let writing = !matches!(cl.op.stage, Stage::Idle | Stage::Reserved | Stage::Committed);
                prop_assert_eq!(done.stuck, u32::from(writing), "between begin and commit: left alone");
                *expect.skips.entry(sender).or_default() += done.skipped;
                cl.revoked |= done.skipped == 1;
            }
            Op::Take => {
                if let Some(t) = take_one(&mut c, &mut out)? {
                    check_take(t, &out, &mut expect, size)?;
                }
            }
            Op::RestartConsumer => c = ShardedConsumer::new(&ring),
        }
    }
    // Drain: every send in progress finished, then everything taken.
    loop {
        let mut moved = false;
        for cl in clients.iter_mut().filter(|cl| cl.op.stage != Stage::Idle) {
            moved |= step(cl, &mut expect)? != Step::NoRoom;
        }
        while let Some(t) = take_one(&mut c, &mut out)? {
            check_take(t, &out, &mut expect, size)?;
            moved = true;
        }
        if !moved {
            break;
        }
    }
    for (sender, queue) in &expect.committed {
        prop_assert!(queue.is_empty(), "sender {:x}: committed and never taken: {:?}", sender, queue);
    }
    for (sender, n) in &expect.skips {
        prop_assert_eq!(*n, 0, "sender {:x}: skips not reported", sender);
    }
    for (k, shard) in ring.iter().enumerate() {
        prop_assert_eq!(shard.next(), shard.tail(), "shard {}: every reservation taken", k);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any interleaving of the steps of several producers' sends, deaths at any step (completed
    /// by meshd), revocations of stopped producers and consumer restarts, over 1, 2 or 4 shards:
    /// every committed message is taken exactly once, from its sender's shard, in its sender's
    /// order, whole; every death before a commit and every revocation is one skip attributed to
    /// its sender; nothing else is taken.
    #[test]
    #[cfg_attr(miri, ignore = "proptest is slow under Miri; the unit and thread tests cover the protocol there")]
    fn many_producers_dying_and_revoked_match_the_model(
        producers in 1usize..7,
        cap_log in 0u32..4,
        start in prop_oneof![Just(0u64), Just(u64::MAX - 3), any::<u32>().prop_map(u64::from)],
        shards in prop_oneof![Just(1u32), Just(2), Just(4)],
        ops in proptest::collection::vec(model_op(6), 1..200),
    ) {
        let ops = ops
            .into_iter()
            .map(|op| match op {
                Op::Step(s) => Op::Step(s % producers),
                Op::Send(s) => Op::Send(s % producers),
                Op::Die(s) => Op::Die(s % producers),
                Op::Revoke(s) => Op::Revoke(s % producers),
                op => op,
            })
            .collect();
        run_model(producers, cap_log, start, shards, ops)?;
    }
}

// ---- Shards ----

/// A take from a sharded consumer: its shard, what it was, the message.
fn take_sharded(c: &mut ShardedConsumer, size: usize) -> Option<(u32, Taken, Vec<u8>)> {
    let mut out = vec![0u8; size];
    c.try_take(&mut out).unwrap().map(|(k, t)| (k, t, out))
}

#[test]
fn shards_lie_where_the_layout_says_and_one_shard_is_todays_ring() {
    let (m, cap) = (16u32, 4u32);
    let heap = HeapShards::new(m, cap, 4);
    let span = layout::fanin_shard_span(m, cap);
    assert_eq!(span, 8192, "a page of owner table, 4 slots of 48 bytes, page-rounded");
    for k in 0..4 {
        let r = heap.shards.shard(k);
        let base = if k == 0 { None } else { Some(span + u64::from(k - 1) * (4096 + span)) };
        if let Some(base) = base {
            assert_eq!(layout::fanin_shard_offset(k, m, cap), base);
            assert_eq!(r.header.as_ptr() as usize, heap.region_at(base), "shard {k}'s header");
        } else {
            assert_eq!(r.header.as_ptr() as usize, heap.ptr.as_ptr() as usize, "shard 0's is the channel's");
        }
        let owners = base.map_or(0, |b| b + 4096);
        assert_eq!(r.owners.as_ptr() as usize, heap.region_at(owners), "shard {k}'s owner table");
        assert_eq!(r.slots.as_ptr() as usize, heap.region_at(owners + 4096), "shard {k}'s slots");
        assert_eq!(layout::fanin_shard_slots_offset(k, m, cap), owners + 4096);
    }
    assert_eq!(layout::fanin_region_bytes(m, cap, 4), span + 3 * (4096 + span));
    assert_eq!(layout::fanin_region_bytes(m, cap, 1), layout::fanin_slot_bytes(m, cap), "one shard: today's bytes");
    // One shard: the owner table at the region's start, the slots a page on, as always.
    let one = HeapShards::new(m, cap, 1);
    let r = one.shards.shard(0);
    assert_eq!(r.owners.as_ptr() as usize, one.region_at(0));
    assert_eq!(r.slots.as_ptr() as usize, one.region_at(layout::fanin_slots_offset(cap)));
}

#[test]
fn senders_stay_in_their_shard_and_the_consumer_takes_round_robin() {
    let heap = HeapShards::new(16, 4, 4);
    let shards = heap.shards;
    // Eight clients (slots 0..8, epoch 1): slot s sends into shard s % 4, two clients a shard.
    let ids: Vec<u32> = (0..8).map(|s| s | 1 << 16).collect();
    let mut ps: Vec<FanInProducer> = ids.iter().map(|&id| shards.producer(id)).collect();
    for (s, p) in ps.iter_mut().enumerate().rev() {
        assert!(p.try_send(&msg(16, s as u32, 0)).unwrap());
    }
    for k in 0..4 {
        assert_eq!(shards.shard(k).next(), 2, "shard {k}: its two clients' sends, no other's");
    }
    assert_eq!((shards.next(), shards.tail()), (8, 0));
    let mut c = ShardedConsumer::new(&shards);
    let mut order = Vec::new();
    while let Some((k, t, out)) = take_sharded(&mut c, 16) {
        let Taken::Message { sender } = t else { panic!("a skip from nowhere") };
        assert_eq!(k, shards.shard_of(sender));
        assert_eq!(out, msg(16, sender & 0xffff, 0));
        order.push((k, sender & 0xffff));
    }
    // One from each shard in turn (each shard's in its reservation order: slot 4+k before k).
    assert_eq!(order, [(0, 4), (1, 5), (2, 6), (3, 7), (0, 0), (1, 1), (2, 2), (3, 3)]);
    assert_eq!((c.position(), c.positions()), (8, vec![2, 2, 2, 2]));
    // A full shard refuses its senders only.
    for k in 1..5 {
        assert!(ps[1].try_send(&msg(16, 1, k)).unwrap());
    }
    assert!(!ps[5].try_send(&[1]).unwrap(), "shard 1 is full");
    assert!(ps[2].try_send(&[1]).unwrap(), "shard 2 is not");
}

#[test]
fn a_producer_dead_at_every_step_holds_its_shard_alone_and_is_completed() {
    let stages = [Stage::Reserved, Stage::Writing, Stage::HalfBody, Stage::Body, Stage::Kind, Stage::Committed];
    for &stage in &stages {
        let heap = HeapShards::new(16, 2, 2);
        let shards = heap.shards;
        let mut c = ShardedConsumer::new(&shards);
        let mut dying = shards.producer(1); // shard 1
        let mut other = shards.producer(2); // shard 0
        let _ = send_to(&mut dying, &msg(16, 1, 0), stage);
        if stage == Stage::Committed {
            // Committed, not finished: the message is whole, and taken.
            assert_eq!(take_sharded(&mut c, 16).unwrap(), (1, Taken::Message { sender: 1 }, msg(16, 1, 0)));
        }
        // Shard 0 flows past the dead sender's held shard, laps over.
        for k in 0..5 {
            assert!(other.try_send(&msg(16, 2, k)).unwrap());
            let (shard, t, out) = take_sharded(&mut c, 16).unwrap();
            assert_eq!((shard, t, out), (0, Taken::Message { sender: 2 }, msg(16, 2, k)), "stage {stage:?}");
        }
        let holds = shards.holds();
        if stage == Stage::Committed {
            assert_eq!(holds, [], "its slot's next lap is not the tail's yet");
            assert_eq!(shards.complete_dead(1), Completion { finished: 1, ..Completion::default() });
        } else {
            assert_eq!(holds.iter().map(|(k, h)| (*k, h.owner, h.seq)).collect::<Vec<_>>(), [(1, 1, 0)]);
            assert!(take_sharded(&mut c, 16).is_none(), "stage {stage:?}: shard 1 waits, shard 0 is empty");
            assert_eq!(shards.complete_dead(1), Completion { skipped: 1, ..Completion::default() });
            let (k, t, _) = take_sharded(&mut c, 16).unwrap();
            assert_eq!((k, t), (1, Taken::Skipped { sender: 1 }));
        }
        assert_eq!(shards.holds(), [], "stage {stage:?}: nothing holds any shard");
        // A new client in the dead one's slot: the same shard, which goes on.
        let mut again = shards.producer(1 | 1 << 16);
        for k in 1..4 {
            assert!(again.try_send(&msg(16, 1, k)).unwrap());
            let (shard, t, out) = take_sharded(&mut c, 16).unwrap();
            assert_eq!((shard, t, out), (1, Taken::Message { sender: 1 | 1 << 16 }, msg(16, 1, k)));
        }
        assert_eq!(shards.complete_dead(1), Completion::default(), "nothing left to complete");
    }
}

#[test]
fn the_probe_revocation_and_repair_cover_every_shard() {
    let heap = HeapShards::new(8, 4, 4);
    let shards = heap.shards;
    let mut c = ShardedConsumer::new(&shards);
    // Shard 2: a client stopped after its reservation; shard 3: one stopped mid-copy.
    let mut stopped = shards.producer(2);
    let m = msg(8, 2, 0);
    let mut op = send_to(&mut stopped, &m, Stage::Reserved);
    let mut writing = shards.producer(3);
    let w = msg(8, 3, 0);
    let mut wop = send_to(&mut writing, &w, Stage::HalfBody);
    let holds = shards.holds();
    let seen: Vec<_> = holds.iter().map(|(k, h)| (*k, h.owner, h.state)).collect();
    assert_eq!(seen, [(2, 2, OwnState::Reserved), (3, 3, OwnState::Writing)]);
    // The watcher's rule, shard by shard: the reservation is revoked, the copy left alone.
    assert_eq!(shards.revoke_live(2), Completion { skipped: 1, ..Completion::default() });
    assert_eq!(shards.revoke_live(3), Completion { stuck: 1, ..Completion::default() });
    let (k, t, _) = take_sharded(&mut c, 8).unwrap();
    assert_eq!((k, t), (2, Taken::Skipped { sender: 2 }), "shard 2's skip");
    assert_eq!(shards.holds().iter().map(|(k, _)| *k).collect::<Vec<_>>(), [3]);
    assert_eq!(stopped.step(&mut op, &m).unwrap(), Step::Revoked);
    assert!(stopped.try_send(&m).unwrap());
    while writing.step(&mut wop, &w).unwrap() != Step::Sent {}
    let mut got: Vec<_> = (0..2).map(|_| take_sharded(&mut c, 8).unwrap()).collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(got, [(2, Taken::Message { sender: 2 }, m), (3, Taken::Message { sender: 3 }, w)]);
    // A completer that died between its CAS and its header, in shard 1: repair finds it.
    let mut p = shards.producer(5);
    let _ = send_to(&mut p, &msg(8, 5, 0), Stage::Reserved);
    let r1 = shards.shard(1);
    let own = r1.ownership(0);
    r1.owner_word(0).store(Ownership { state: OwnState::Skipped, ..own }.word(), Ordering::Release);
    assert!(take_sharded(&mut c, 8).is_none());
    assert_eq!(shards.repair(), 1);
    assert_eq!(shards.repair(), 0, "idempotent");
    let (k, t, _) = take_sharded(&mut c, 8).unwrap();
    assert_eq!((k, t), (1, Taken::Skipped { sender: 5 }));
}

#[test]
fn a_sharded_consumer_restarts_at_every_shards_published_tail() {
    let heap = HeapShards::new(8, 4, 2);
    heap.start_at(u64::MAX - 1);
    let shards = heap.shards;
    let mut ps: Vec<_> = (0..2).map(|s| shards.producer(s)).collect();
    for k in 0..3 {
        for (s, p) in ps.iter_mut().enumerate() {
            assert!(p.try_send(&msg(8, s as u32, k)).unwrap());
        }
    }
    let mut c = ShardedConsumer::new(&shards);
    assert_eq!(take_sharded(&mut c, 8).unwrap(), (0, Taken::Message { sender: 0 }, msg(8, 0, 0)));
    assert_eq!(take_sharded(&mut c, 8).unwrap(), (1, Taken::Message { sender: 1 }, msg(8, 1, 0)));
    assert_eq!(take_sharded(&mut c, 8).unwrap(), (0, Taken::Message { sender: 0 }, msg(8, 0, 1)));
    // A new consumer: each shard where the last one published it, across the 64-bit wrap.
    let mut c = ShardedConsumer::new(&shards);
    assert_eq!(c.positions(), [0, u64::MAX], "shard 0 took two, shard 1 one, from 2^64 - 2");
    let mut next = [2u32, 1];
    while let Some((k, t, out)) = take_sharded(&mut c, 8) {
        assert_eq!((t, out), (Taken::Message { sender: k }, msg(8, k, next[k as usize])));
        next[k as usize] += 1;
    }
    assert_eq!(next, [3, 3]);
    // An impossible state names its shard.
    shards.shard(1).cursor().store(100, Ordering::Relaxed);
    assert!(matches!(ps[1].try_send(&[1]), Err(FanInCorrupt::Indices { next: 100, .. })));
    let r1 = shards.shard(1);
    let seq = r1.tail();
    r1.words(seq)[0].store(u64::from(tag(seq)) << 32, Ordering::Relaxed);
    r1.words(seq)[1].store(u64::from(tag(seq)) << 32 | 7, Ordering::Relaxed);
    let mut out = [0u8; 8];
    assert_eq!(c.try_take(&mut out), Err((1, FanInCorrupt::Kind { seq, kind: 7 })));
}

#[test]
fn threads_over_shards_are_taken_in_each_senders_order() {
    let (senders, count, count_shards): (u32, u32, u32) = if cfg!(miri) { (4, 6, 2) } else { (8, 10_000, 4) };
    let heap = HeapShards::new(16, 4, count_shards);
    let shards = heap.shards;
    std::thread::scope(|s| {
        for id in 0..senders {
            s.spawn(move || {
                let mut p = shards.producer(id);
                for k in 0..count {
                    while !p.try_send(&msg(16, id, k)).unwrap() {
                        std::thread::yield_now();
                    }
                }
            });
        }
        let mut c = ShardedConsumer::new(&shards);
        let mut next = vec![0u32; senders as usize];
        let mut out = [0u8; 16];
        let mut left = senders * count;
        while left > 0 {
            match c.try_take(&mut out).unwrap() {
                Some((shard, Taken::Message { sender })) => {
                    assert_eq!(shard, sender % count_shards);
                    let k = u32::from_le_bytes(out[4..8].try_into().unwrap());
                    assert_eq!(k, next[sender as usize], "sender {sender}: lost, repeated or reordered");
                    assert_eq!(out[..], msg(16, sender, k)[..], "torn");
                    next[sender as usize] += 1;
                    left -= 1;
                }
                Some((_, Taken::Skipped { sender })) => panic!("no producer died, yet a skip from {sender}"),
                None => std::thread::yield_now(),
            }
        }
    });
}

// ---- Threads (what Miri checks for races and weak-memory bugs) ----

#[test]
fn threads_send_and_one_takes_in_each_senders_order() {
    let (senders, count): (u32, u32) = if cfg!(miri) { (3, 12) } else { (4, 20_000) };
    let heap = HeapFanIn::new(16, 4);
    let ring = heap.ring;
    std::thread::scope(|s| {
        for id in 0..senders {
            s.spawn(move || {
                let mut p = FanInProducer::new(ring, id);
                for k in 0..count {
                    while !p.try_send(&msg(16, id, k)).unwrap() {
                        std::thread::yield_now();
                    }
                }
            });
        }
        let mut c = FanInConsumer::new(ring);
        let mut next = vec![0u32; senders as usize];
        let mut out = [0u8; 16];
        let mut left = senders * count;
        while left > 0 {
            match c.try_take(&mut out).unwrap() {
                Some(Taken::Message { sender }) => {
                    let k = u32::from_le_bytes(out[4..8].try_into().unwrap());
                    assert_eq!(k, next[sender as usize], "sender {sender}: lost, repeated or reordered");
                    assert_eq!(out[..], msg(16, sender, k)[..], "torn");
                    next[sender as usize] += 1;
                    left -= 1;
                }
                Some(Taken::Skipped { sender }) => panic!("no producer died, yet a skip from {sender}"),
                None => std::thread::yield_now(),
            }
        }
    });
}

#[test]
fn a_revocation_racing_the_begin_delivers_once_either_way() {
    let rounds = if cfg!(miri) { 6 } else { 2_000 };
    for _ in 0..rounds {
        let heap = HeapFanIn::new(8, 2);
        let ring = heap.ring;
        let mut p = FanInProducer::new(ring, 1);
        let m = msg(8, 1, 0);
        let mut op = send_to(&mut p, &m, Stage::Reserved);
        let revoked = std::thread::scope(|s| {
            let meshd = s.spawn(move || revoke_live(&ring, 1));
            let mut revoked = 0;
            loop {
                match p.step(&mut op, &m).unwrap() {
                    Step::Sent => break,
                    Step::Revoked => revoked += 1,
                    Step::Progress | Step::NoRoom => {}
                }
            }
            let done = meshd.join().unwrap();
            assert_eq!(done.skipped, revoked);
            revoked
        });
        let mut c = FanInConsumer::new(ring);
        if revoked == 1 {
            assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 1 });
        }
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 1 }, m));
        assert!(take(&mut c, 8).is_none());
    }
}

#[test]
fn a_producer_thread_that_dies_mid_send_is_skipped_while_others_go_on() {
    let count: u32 = if cfg!(miri) { 8 } else { 5_000 };
    let heap = HeapFanIn::new(16, 4);
    let ring = heap.ring;
    std::thread::scope(|s| {
        // The dying client: one message sent, then a second cut off after its body.
        let dying_thread = s.spawn(move || {
            let mut p = FanInProducer::new(ring, 7);
            while !p.try_send(&msg(16, 7, 0)).unwrap() {
                std::thread::yield_now();
            }
            let m = msg(16, 7, 1);
            let mut op = SendOp::default();
            while op.stage != Stage::Body {
                if p.step(&mut op, &m).unwrap() == Step::NoRoom {
                    std::thread::yield_now();
                }
            }
        });
        let other = s.spawn(move || {
            let mut p = FanInProducer::new(ring, 2);
            for k in 0..count {
                while !p.try_send(&msg(16, 2, k)).unwrap() {
                    std::thread::yield_now();
                }
            }
        });
        let mut c = FanInConsumer::new(ring);
        let (mut got7, mut next2, mut skips) = (0, 0, 0);
        let mut out = [0u8; 16];
        let mut dying = Some(dying_thread);
        while next2 < count || got7 + skips < 2 {
            if dying.as_ref().is_some_and(|h| h.is_finished()) {
                // meshd: the process is gone; the join orders all its stores before ours.
                dying.take().unwrap().join().unwrap();
                assert_eq!(complete_dead(&ring, 7), Completion { skipped: 1, ..Completion::default() });
            }
            match c.try_take(&mut out).unwrap() {
                Some(Taken::Message { sender: 7 }) => got7 += 1,
                Some(Taken::Message { sender }) => {
                    assert_eq!(sender, 2);
                    assert_eq!(out[..], msg(16, 2, next2)[..]);
                    next2 += 1;
                }
                Some(Taken::Skipped { sender }) => {
                    assert_eq!(sender, 7);
                    skips += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        other.join().unwrap();
        assert_eq!((got7, skips), (1, 1));
    });
}
