//! The group and the service core over heap memory: entries handed out, departed and reused, corrupt words refused, and clients that come, go and die under a model and under threads (what Miri runs).

use super::memory::binding;
use super::*;
use crate::claim::Holder;
use crate::fanin::{Completion, FanInShards, Taken};
use crate::fanin::{SendOp, Stage, Step};
use crate::indices::Corrupt;
use crate::layout::RingHeader;
use core::mem::{offset_of, size_of};
use core::ptr::NonNull;
use core::sync::atomic::Ordering;
use proptest::prelude::*;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Zeroed heap memory, 128-byte aligned, freed on drop (what Miri runs the protocol on).
struct Heap {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Heap {
    fn zeroed(bytes: usize) -> Self {
        let layout = Layout::from_size_align(bytes, 128).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        Self { ptr, layout }
    }

    fn len(&self) -> u64 {
        self.layout.size() as u64
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

fn heap_group(entries: u32, msg_size: u32, capacity: u32) -> (Heap, GroupMemory) {
    let heap = Heap::zeroed(GroupMemory::bytes(entries, msg_size, capacity) as usize);
    // SAFETY: the allocation is zeroed, large enough, 128-aligned, outlives the group (the tests
    // keep `heap` alive while they use it) and is shared only through the protocol.
    let group = unsafe { GroupMemory::create(heap.ptr, heap.len(), 0, entries, msg_size, capacity) }.unwrap();
    (heap, group)
}

fn heap_fanin(msg_size: usize, capacity: u64, shards: u32) -> (Heap, FanInShards) {
    let header = size_of::<RingHeader>();
    let (m, c) = (msg_size as u32, capacity as u32);
    let heap = Heap::zeroed(header + crate::layout::fanin_region_bytes(m, c, shards) as usize);
    let at = |off: usize| NonNull::new(heap.ptr.as_ptr().wrapping_add(off)).unwrap();
    // SAFETY: the allocation holds shard 0's header, then the shards' region (128-aligned after
    // the 384-byte header), zeroed (empty rings), and outlives every use in the test that made it.
    let ring = unsafe { FanInShards::new(heap.ptr.cast(), at(header), m, c, shards) };
    (heap, ring)
}

/// A service over heap memory: requests and replies of `msg_size` bytes.
struct HeapService {
    _group: Heap,
    _fanin: Heap,
    svc: ServiceMemory,
}

fn heap_service(entries: u32, msg_size: u32, requests: u64, replies: u32) -> HeapService {
    heap_service_shards(entries, msg_size, requests, replies, 1)
}

/// A service whose fan-in channel has `shards` shards of `requests` slots each.
fn heap_service_shards(entries: u32, msg_size: u32, requests: u64, replies: u32, shards: u32) -> HeapService {
    let (_group, group) = heap_group(entries, msg_size, replies);
    let (_fanin, fanin) = heap_fanin(msg_size as usize, requests, shards);
    HeapService { _group, _fanin, svc: ServiceMemory { fanin, group } }
}

/// A client process as meshd records it (never checked for liveness here: Miri has no /proc).
fn holder(n: u32) -> Holder {
    Holder { pid: 1000 + n, start: 1 }
}

/// An 8-byte reply: who it is for, and its number.
fn short(id: ClientId, n: u32) -> [u8; 8] {
    let mut m = [0u8; 8];
    m[..4].copy_from_slice(&id.0.to_le_bytes());
    m[4..].copy_from_slice(&n.to_le_bytes());
    m
}

fn recv8(rx: &mut ReplyReceiver) -> Option<(ClientId, u32)> {
    let mut out = [0u8; 8];
    rx.try_recv(&mut out).unwrap().then(|| {
        (ClientId(u32::from_le_bytes(out[..4].try_into().unwrap())), u32::from_le_bytes(out[4..].try_into().unwrap()))
    })
}

#[test]
fn the_lines_and_sizes_are_as_documented() {
    assert_eq!(size_of::<GroupHeader>(), 128);
    assert_eq!(size_of::<GroupEntry>(), 256);
    assert_eq!(offset_of!(GroupEntry, program), 128);
    assert_eq!(GroupMemory::ring_stride(8, 4), 384 + 128, "64 bytes of slots, rounded up to a line");
    assert_eq!(GroupMemory::ring_stride(64, 8), 384 + 1024);
    assert_eq!(GroupMemory::bytes(3, 8, 4), 128 + 3 * 256 + 3 * 512);
    let heap = Heap::zeroed(GroupMemory::bytes(3, 8, 4) as usize);
    // SAFETY: as in `heap_group`.
    let g = unsafe { GroupMemory::create(heap.ptr, heap.len(), 4096, 3, 8, 4) }.unwrap();
    assert_eq!(g.reply_ring_offset(2), Some(4096 + 128 + 768 + 2 * 512));
    assert_eq!(g.reply_ring_offset(3), None);
    // SAFETY: as above; laid out by `create` just now.
    let again = unsafe { GroupMemory::open(heap.ptr, heap.len(), 4096) }.unwrap();
    assert_eq!((again.entries(), again.msg_size(), again.capacity()), (3, 8, 4));
    for slot in 0..3 {
        let e = g.snapshot(slot).unwrap();
        assert_eq!(e, EntrySnapshot { epoch: 0, state: EntryState::Free, acked_epoch: 0, holder: None });
    }
    // Epoch in the low half, state in the high half: the design's `epoch u32, state u32`.
    assert_eq!(binding(7, EntryState::Departed), 0x2_0000_0007);
    assert_eq!(ClientId::new(3, 0x1_0005), ClientId(0x0005_0003));
}

#[test]
fn a_zeroed_group_binds_every_entry_then_refuses() {
    let (_heap, g) = heap_group(2, 8, 2);
    let mut meshd = GroupMeshd::new(g);
    assert_eq!(meshd.connect(holder(1)), Ok(ClientId::new(0, 1)));
    assert_eq!(meshd.connect(holder(2)), Ok(ClientId::new(1, 1)));
    assert_eq!(meshd.connect(holder(3)), Err(GroupError::AllBound { entries: 2 }));
    assert_eq!(g.changes(), 2);
    assert_eq!(g.snapshot(1).unwrap().holder, Some(holder(2)));
    assert_eq!(
        meshd.bound().unwrap(),
        [(ClientId::new(0, 1), Some(holder(1))), (ClientId::new(1, 1), Some(holder(2)))]
    );
}

#[test]
fn an_entry_is_reused_only_after_the_ack_and_the_last_clients_replies_never_reach_the_next() {
    let (_heap, g) = heap_group(1, 8, 4);
    let mut meshd = GroupMeshd::new(g);
    let mut prog = GroupProgram::new(g);
    let a = meshd.connect(holder(1)).unwrap();
    {
        let mut rx = ReplyReceiver::new(&g, a).unwrap();
        for n in 0..3 {
            assert_eq!(prog.reply(a, &short(a, n)), Ok(Replied::Sent));
        }
        assert_eq!(recv8(&mut rx), Some((a, 0)));
    }
    meshd.depart(a).unwrap();
    assert_eq!(meshd.depart(a), Err(GroupError::NotBound { id: a.0, epoch: 1, state: EntryState::Departed }));
    let err = meshd.connect(holder(2)).unwrap_err();
    assert_eq!(err, GroupError::AwaitingAck { entries: 1, bound: 0, awaiting_ack: 1 });
    assert!(err.to_string().contains("not yet acknowledged by the program"), "{err}");
    assert_eq!(prog.reply(a, &short(a, 3)), Ok(Replied::Gone), "departed: dropped at the source");
    assert_eq!(prog.departures(), Ok(vec![a]));
    assert_eq!(prog.departures(), Ok(vec![]), "acknowledged once");
    let b = meshd.connect(holder(2)).unwrap();
    assert_eq!(b, ClientId::new(0, 2));
    let mut rx = ReplyReceiver::new(&g, b).unwrap();
    assert_eq!(recv8(&mut rx), None, "a's two unread replies were discarded at connect");
    // A request of `a` still in the fan-in ring after its ack: its reply must not reach `b`.
    assert_eq!(prog.reply(a, &short(a, 4)), Ok(Replied::Gone));
    assert_eq!(prog.reply(b, &short(b, 0)), Ok(Replied::Sent));
    assert_eq!(recv8(&mut rx), Some((b, 0)));
    assert_eq!(recv8(&mut rx), None);
}

#[test]
fn a_restarted_program_acks_what_the_old_one_had_not() {
    let (_heap, g) = heap_group(2, 8, 2);
    let mut meshd = GroupMeshd::new(g);
    let mut old = GroupProgram::new(g);
    let (a, b) = (meshd.connect(holder(1)).unwrap(), meshd.connect(holder(2)).unwrap());
    assert_eq!(old.reply(b, &short(b, 0)), Ok(Replied::Sent));
    meshd.depart(a).unwrap();
    meshd.depart(b).unwrap();
    let found = old.scan().unwrap();
    assert_eq!(found, [Departed { slot: 0, epoch: 1 }, Departed { slot: 1, epoch: 1 }]);
    assert_eq!(old.ack(found[0]), Ok(true));
    drop(old); // dies before acking b
    assert_eq!(meshd.connect(holder(3)), Ok(ClientId::new(0, 2)));
    assert_eq!(meshd.connect(holder(4)), Err(GroupError::AwaitingAck { entries: 2, bound: 1, awaiting_ack: 1 }));
    let mut new = GroupProgram::new(g);
    assert_eq!(new.departures(), Ok(vec![b]), "its first call scans, whatever `changes` says");
    assert_eq!(new.ack(found[1]), Ok(true), "acking again is harmless while the entry waits");
    let c = meshd.connect(holder(4)).unwrap();
    assert_eq!(c, ClientId::new(1, 2));
    assert_eq!(new.ack(found[1]), Ok(false), "the entry is c's now");
    let mut rx = ReplyReceiver::new(&g, c).unwrap();
    assert_eq!(recv8(&mut rx), None, "b's reply, written by the old launch, was discarded");
    assert_eq!(new.reply(c, &short(c, 0)), Ok(Replied::Sent), "the new launch resumed the ring where the old left it");
    assert_eq!(recv8(&mut rx), Some((c, 0)));
}

#[test]
fn departures_scans_only_when_changes_moved() {
    let (_heap, g) = heap_group(2, 8, 2);
    let mut meshd = GroupMeshd::new(g);
    let mut prog = GroupProgram::new(g);
    let a = meshd.connect(holder(1)).unwrap();
    assert_eq!(prog.departures(), Ok(vec![]));
    // An entry departed behind the program's back, without `changes`: not seen until it moves.
    g.entry(0).unwrap().meshd.binding.store(binding(1, EntryState::Departed), Ordering::Release);
    assert_eq!(prog.departures(), Ok(vec![]));
    assert_eq!(prog.scan(), Ok(vec![Departed { slot: 0, epoch: 1 }]), "a full scan sees it");
    g.header().changes.fetch_add(1, Ordering::Release);
    assert_eq!(prog.departures(), Ok(vec![a]));
}

#[test]
fn a_full_reply_ring_says_full_and_the_program_goes_on() {
    let (_heap, g) = heap_group(2, 8, 2);
    let mut meshd = GroupMeshd::new(g);
    let mut prog = GroupProgram::new(g);
    let (a, b) = (meshd.connect(holder(1)).unwrap(), meshd.connect(holder(2)).unwrap());
    let mut rx = ReplyReceiver::new(&g, a).unwrap();
    assert_eq!(prog.reply(a, &short(a, 0)), Ok(Replied::Sent));
    assert_eq!(prog.reply(a, &short(a, 1)), Ok(Replied::Sent));
    assert_eq!(prog.reply(a, &short(a, 2)), Ok(Replied::Full));
    assert_eq!(prog.reply(b, &short(b, 0)), Ok(Replied::Sent), "a slow client holds no one else");
    assert_eq!(recv8(&mut rx), Some((a, 0)));
    assert_eq!(prog.reply(a, &short(a, 2)), Ok(Replied::Sent));
    assert_eq!(prog.reply(a, &[0; 9]), Err(GroupError::TooLong { len: 9, msg_size: 8 }));
    assert_eq!(rx.try_recv(&mut [0; 4]), Err(GroupError::BadBuffer { len: 4, msg_size: 8 }));
}

#[test]
fn corrupt_words_are_reported_not_followed() {
    let (heap, g) = heap_group(2, 8, 4);
    let open = || {
        // SAFETY: `heap` holds a group laid out by `create`; its write-once fields change only by
        // `poke`, on this thread, between the opens.
        unsafe { GroupMemory::open(heap.ptr, heap.len(), 0) }
    };
    let poke = |f: &dyn Fn(&mut GroupHeader, &mut [GroupEntry])| {
        // SAFETY: the header and the two entries lie at the start of `heap` (laid out by `create`);
        // no other reference to them is alive while `f` runs, on this thread alone.
        let (h, e) = unsafe {
            let h = heap.ptr.cast::<GroupHeader>().as_ptr();
            (&mut *h, core::slice::from_raw_parts_mut(h.add(1).cast::<GroupEntry>(), 2))
        };
        f(h, e);
    };
    let field = |e: GroupError| match e {
        GroupError::Invalid { field, .. } => field,
        e => panic!("{e}"),
    };
    poke(&|h, _| h.entries = 0);
    assert_eq!(field(open().unwrap_err()), "entries");
    poke(&|h, _| (h.entries, h.msg_size) = (2, 12));
    assert_eq!(field(open().unwrap_err()), "msg_size");
    poke(&|h, _| (h.msg_size, h.capacity) = (8, 3));
    assert_eq!(field(open().unwrap_err()), "capacity");
    poke(&|h, _| (h.capacity, h.ring_stride) = (4, 1));
    assert_eq!(field(open().unwrap_err()), "ring_stride");
    poke(&|h, _| (h.ring_stride, h.entries) = (GroupMemory::ring_stride(8, 4), 1000));
    let e = open().unwrap_err();
    assert!(e.to_string().contains("need"), "{e}");
    assert_eq!(field(e), "region");
    poke(&|h, e| (h.entries, e[1].meshd.reply_ring_offset) = (2, e[1].meshd.reply_ring_offset + 8));
    let e = open().unwrap_err();
    assert!(e.to_string().contains("entry 1"), "{e}");
    assert_eq!(field(e), "reply_ring_offset");
    poke(&|_, e| e[1].meshd.reply_ring_offset -= 8);
    let g2 = open().unwrap();

    let mut meshd = GroupMeshd::new(g);
    let mut prog = GroupProgram::new(g2);
    let bad = 7 << 32 | 1;
    g.entry(0).unwrap().meshd.binding.store(bad, Ordering::Release);
    assert_eq!(prog.scan(), Err(GroupError::BadState { slot: 0, word: bad }));
    assert_eq!(prog.reply(ClientId::new(0, 1), &[0; 8]), Err(GroupError::BadState { slot: 0, word: bad }));
    let a = meshd.connect(holder(1)).unwrap();
    assert_eq!(a, ClientId::new(1, 1), "the corrupt entry is passed over");
    let e = meshd.connect(holder(2)).unwrap_err();
    assert_eq!(e, GroupError::BadState { slot: 0, word: bad }, "and named when nothing else is left");
    assert!(e.to_string().contains("entry 0") && e.to_string().contains("state 7"), "{e}");
    assert_eq!(prog.reply(ClientId(5), &[0; 8]), Err(GroupError::UnknownClient { id: 5, entries: 2 }));
    assert_eq!(ReplyReceiver::new(&g, ClientId(2)).unwrap_err(), GroupError::UnknownClient { id: 2, entries: 2 });
    assert_eq!(meshd.depart(ClientId(0x10_0009)), Err(GroupError::UnknownClient { id: 0x10_0009, entries: 2 }));
    assert_eq!(
        meshd.depart(ClientId::new(1, 2)),
        Err(GroupError::NotBound { id: ClientId::new(1, 2).0, epoch: 1, state: EntryState::Bound }),
        "a stale or forged id never evicts the bound client"
    );
    // A reply ring whose head a peer moved far ahead of its tail.
    g.ring(1).indices().header().producer.head.store(1000, Ordering::Release);
    let mut prog = GroupProgram::new(g2);
    assert_eq!(prog.reply(a, &[0; 8]), Err(GroupError::Ring { slot: 1, corrupt: Corrupt { head: 1000, tail: 0 } }));
    assert!(ReplyReceiver::new(&g, a).is_err());
    // The corrupt entry holds back no other departure: scan names it, departures passes it over.
    meshd.depart(a).unwrap();
    assert_eq!(prog.scan(), Err(GroupError::BadState { slot: 0, word: bad }));
    assert_eq!(prog.departures(), Ok(vec![a]), "entry 1's departure acknowledged past entry 0");
    assert_eq!(g.entry(1).unwrap().program.acked_epoch.load(Ordering::Acquire), a.epoch16().into());
}

#[test]
fn a_service_round_trip_and_a_client_dead_mid_send() {
    let heap = heap_service(2, 16, 4, 2);
    let svc = heap.svc;
    let mut meshd = ServiceMeshd::new(svc);
    let mut srv = ServiceServer::new(&svc);
    let a = meshd.connect(holder(1)).unwrap();
    let b = meshd.connect(holder(2)).unwrap();
    let mut ca = ServiceClient::new(&svc, a).unwrap();
    ca.send(&request(a, 0), Duration::from_secs(1)).unwrap();
    // b dies after storing its body, before the commit.
    let mut pb = svc.fanin.producer(b.0);
    let (m, mut op) = (request(b, 0), SendOp::default());
    while op.stage != Stage::Body {
        assert_eq!(pb.step(&mut op, &m).unwrap(), Step::Progress);
    }
    ca.send(&request(a, 1), Duration::from_secs(1)).unwrap();
    let mut req = [0u8; 16];
    assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: a.0 })));
    assert_eq!(srv.reply(a.0, &reply(a, 0)), Ok(Replied::Sent));
    assert_eq!(srv.try_take(&mut req), Ok(None), "b's slot holds the consumer until meshd completes it");
    assert_eq!(meshd.depart_dead(b), Ok(Completion { skipped: 1, ..Completion::default() }));
    assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Skipped { sender: b.0 })));
    assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: a.0 })));
    assert_eq!(req, request(a, 1));
    assert_eq!(srv.reply(a.0, &reply(a, 1)), Ok(Replied::Sent));
    assert_eq!(srv.reply(b.0, &reply(b, 0)), Ok(Replied::Gone));
    assert_eq!(srv.departures(), Ok(vec![b]));
    let mut out = [0u8; 16];
    for k in 0..2 {
        ca.recv(&mut out, Duration::from_secs(1)).unwrap();
        assert_eq!(out, reply(a, k));
    }
    assert_eq!(ca.recv(&mut out, Duration::ZERO), Err(GroupError::Timeout));
    assert_eq!(meshd.depart_dead(b), Err(GroupError::NotBound { id: b.0, epoch: 1, state: EntryState::Departed }));
    let c = meshd.connect(holder(3)).unwrap();
    assert_eq!(c.slot(), b.slot(), "b's entry, reused after the ack");
    assert_eq!(ca.try_send(&[0; 17]), Err(GroupError::TooLong { len: 17, msg_size: 16 }));
}

#[test]
fn a_client_that_detaches_mid_send_keeps_its_entry() {
    let heap = heap_service(1, 8, 2, 2);
    let svc = heap.svc;
    let mut meshd = ServiceMeshd::new(svc);
    let a = meshd.connect(holder(1)).unwrap();
    let mut p = svc.fanin.producer(a.0);
    let (m, mut op) = ([1u8; 8], SendOp::default());
    while op.stage != Stage::Writing {
        p.step(&mut op, &m).unwrap();
    }
    assert_eq!(meshd.detach(a), Err(GroupError::StillSending { id: a.0, stuck: 1 }));
    assert_eq!(svc.group.snapshot(0).unwrap().state, EntryState::Bound);
    while p.step(&mut op, &m).unwrap() != Step::Sent {}
    assert_eq!(meshd.detach(a), Ok(Completion::default()));
    assert_eq!(svc.group.snapshot(0).unwrap().state, EntryState::Departed);
}

#[test]
fn a_service_of_two_shards_flows_past_a_client_dead_mid_send_in_the_other() {
    let heap = heap_service_shards(4, 16, 2, 4, 2);
    let svc = heap.svc;
    let mut meshd = ServiceMeshd::new(svc);
    let mut srv = ServiceServer::new(&svc);
    let a = meshd.connect(holder(1)).unwrap(); // slot 0: shard 0
    let b = meshd.connect(holder(2)).unwrap(); // slot 1: shard 1
    assert_eq!((svc.fanin.shard_of(a.0), svc.fanin.shard_of(b.0)), (0, 1));
    let mut ca = ServiceClient::new(&svc, a).unwrap();
    // b dies with its reservation taken, in shard 1.
    let mut pb = svc.fanin.producer(b.0);
    let (m, mut op) = (request(b, 0), SendOp::default());
    while op.stage != Stage::Reserved {
        assert_eq!(pb.step(&mut op, &m).unwrap(), Step::Progress);
    }
    // a's requests go on, laps past shard 0's capacity, each answered.
    let mut req = [0u8; 16];
    let mut out = [0u8; 16];
    for k in 0..5 {
        ca.send(&request(a, k), Duration::from_secs(1)).unwrap();
        assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: a.0 })));
        assert_eq!(req, request(a, k));
        assert_eq!(srv.reply(a.0, &reply(a, k)), Ok(Replied::Sent));
        ca.recv(&mut out, Duration::from_secs(1)).unwrap();
        assert_eq!(out, reply(a, k));
    }
    assert_eq!(srv.try_take(&mut req), Ok(None), "shard 1 waits for b");
    assert_eq!(meshd.depart_dead(b), Ok(Completion { skipped: 1, ..Completion::default() }));
    assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Skipped { sender: b.0 })));
    assert_eq!(srv.departures(), Ok(vec![b]));
    // Its slot's next client sends into the same shard.
    let c = meshd.connect(holder(3)).unwrap();
    assert_eq!((c.slot(), svc.fanin.shard_of(c.0)), (1, 1));
    let mut cc = ServiceClient::new(&svc, c).unwrap();
    cc.send(&request(c, 0), Duration::from_secs(1)).unwrap();
    assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: c.0 })));
    assert_eq!(meshd.revoke(c), Ok(Completion::default()));
}

// ---- The model test: meshd, the program (step by step) and the clients, against a model ----

#[derive(Debug, Clone)]
enum Op {
    /// meshd binds a new client.
    Connect,
    /// meshd departs the `i`th bound client (its receiver is dropped).
    Depart(usize),
    /// The program replies to the `i`th id ever bound (its request may outlive its client).
    Reply(usize),
    /// The `i`th bound client receives one reply.
    Recv(usize),
    /// The program scans for departures (without acknowledging).
    Scan,
    /// The program acknowledges the `i`th departure of its last scan.
    Ack(usize),
    /// The program's `departures()`: poll `changes`, scan, acknowledge.
    Departures,
    /// The program is relaunched (its scan and its rings' producer state lost).
    RestartProgram,
}

fn model_op() -> impl Strategy<Value = Op> {
    let i = || any::<u8>().prop_map(usize::from);
    prop_oneof![
        3 => Just(Op::Connect),
        2 => i().prop_map(Op::Depart),
        5 => i().prop_map(Op::Reply),
        4 => i().prop_map(Op::Recv),
        2 => Just(Op::Scan),
        2 => i().prop_map(Op::Ack),
        2 => Just(Op::Departures),
        1 => Just(Op::RestartProgram),
    ]
}

/// An entry as the model sees it, with the replies in its ring since the last connect.
#[derive(Default)]
struct ModelEntry {
    epoch: u32,
    bound: bool,
    departed: bool,
    acked: u32,
    queue: VecDeque<(ClientId, u32)>,
}

impl ModelEntry {
    fn waits_for_ack(&self) -> bool {
        self.departed && self.acked != self.epoch
    }
}

fn run_model(entries: u32, cap_log: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let capacity = 1u32 << cap_log;
    let (_heap, g) = heap_group(entries, 8, capacity);
    let mut meshd = GroupMeshd::new(g);
    let mut prog = GroupProgram::new(g);
    let mut model: Vec<ModelEntry> = (0..entries).map(|_| ModelEntry::default()).collect();
    let mut clients: Vec<ReplyReceiver> = Vec::new();
    let mut known: Vec<ClientId> = Vec::new();
    let mut pending: Vec<Departed> = Vec::new();
    let (mut changes, mut seen, mut n, mut holders) = (0u64, None, 0u32, 0u32);
    let expect_departed = |model: &[ModelEntry]| -> Vec<Departed> {
        (0..entries as u16)
            .filter(|&s| model[usize::from(s)].waits_for_ack())
            .map(|s| Departed { slot: s, epoch: model[usize::from(s)].epoch })
            .collect()
    };
    for op in ops {
        match op {
            Op::Connect => {
                holders += 1;
                let got = meshd.connect(holder(holders));
                match model.iter().position(|e| !e.bound && e.acked == e.epoch) {
                    Some(slot) => {
                        let e = &mut model[slot];
                        e.epoch += 1;
                        (e.bound, e.departed) = (true, false);
                        e.queue.clear();
                        changes += 1;
                        let id = ClientId::new(slot as u16, e.epoch);
                        prop_assert_eq!(got, Ok(id));
                        clients.push(ReplyReceiver::new(&g, id).unwrap());
                        known.push(id);
                    }
                    None => {
                        let bound = model.iter().filter(|e| e.bound).count() as u32;
                        let want = if bound == entries {
                            GroupError::AllBound { entries }
                        } else {
                            GroupError::AwaitingAck { entries, bound, awaiting_ack: entries - bound }
                        };
                        prop_assert_eq!(got, Err(want), "refused, with the reason");
                    }
                }
            }
            Op::Depart(i) if !clients.is_empty() => {
                let id = clients.remove(i % clients.len()).id();
                prop_assert_eq!(meshd.depart(id), Ok(()));
                let e = &mut model[usize::from(id.slot())];
                (e.bound, e.departed) = (false, true);
                changes += 1;
            }
            Op::Reply(i) if !known.is_empty() => {
                let id = known[i % known.len()];
                let got = prog.reply(id, &short(id, n));
                let e = &mut model[usize::from(id.slot())];
                let want = if !e.bound || ClientId::new(id.slot(), e.epoch) != id {
                    Replied::Gone
                } else if e.queue.len() == capacity as usize {
                    Replied::Full
                } else {
                    e.queue.push_back((id, n));
                    Replied::Sent
                };
                prop_assert_eq!(got, Ok(want), "reply {} to {:x}", n, id.0);
                n += 1;
            }
            Op::Recv(i) if !clients.is_empty() => {
                let i = i % clients.len();
                let me = clients[i].id();
                let got = recv8(&mut clients[i]);
                if let Some((to, _)) = got {
                    prop_assert_eq!(to, me, "a reply meant for another client reached {:x}", me.0);
                }
                prop_assert_eq!(got, model[usize::from(me.slot())].queue.pop_front());
            }
            Op::Scan => {
                pending = prog.scan().unwrap();
                prop_assert_eq!(&pending, &expect_departed(&model));
            }
            Op::Ack(i) if !pending.is_empty() => {
                let d = pending[i % pending.len()];
                let e = &mut model[usize::from(d.slot)];
                let want = e.departed && e.epoch == d.epoch;
                prop_assert_eq!(prog.ack(d), Ok(want));
                if want {
                    e.acked = e.epoch;
                }
            }
            Op::Departures => {
                let got = prog.departures().unwrap();
                let want: Vec<ClientId> = if seen == Some(changes) {
                    Vec::new()
                } else {
                    let found = expect_departed(&model);
                    for d in &found {
                        model[usize::from(d.slot)].acked = d.epoch;
                    }
                    seen = Some(changes);
                    found.into_iter().map(Departed::id).collect()
                };
                prop_assert_eq!(got, want);
            }
            Op::RestartProgram => {
                prog = GroupProgram::new(g);
                pending.clear();
                seen = None;
            }
            Op::Depart(_) | Op::Reply(_) | Op::Recv(_) | Op::Ack(_) => {}
        }
        for (slot, e) in model.iter().enumerate() {
            let s = g.snapshot(slot as u16).unwrap();
            prop_assert_eq!((s.epoch, s.acked_epoch), (e.epoch, e.acked), "entry {}", slot);
        }
    }
    // Everyone leaves; the program's next `departures` acknowledges every entry, and each is bound
    // again, with nothing of its last clients in its ring.
    for rx in clients.drain(..) {
        prop_assert_eq!(meshd.depart(rx.id()), Ok(()));
    }
    prog.departures().unwrap();
    for slot in 0..entries as u16 {
        let s = g.snapshot(slot).unwrap();
        prop_assert_eq!(s.acked_epoch, s.epoch, "entry {} acknowledged", slot);
    }
    let mut slots = Vec::new();
    for k in 0..entries {
        let id = meshd.connect(holder(10_000 + k)).unwrap();
        slots.push(id.slot());
        let mut rx = ReplyReceiver::new(&g, id).unwrap();
        prop_assert_eq!(recv8(&mut rx), None, "entry {}: a reply to an earlier client", id.slot());
        prop_assert_eq!(prog.reply(id, &short(id, 0)), Ok(Replied::Sent));
        prop_assert_eq!(recv8(&mut rx), Some((id, 0)));
    }
    slots.sort_unstable();
    prop_assert_eq!(slots, (0..entries as u16).collect::<Vec<_>>(), "every entry reused");
    prop_assert_eq!(meshd.connect(holder(1)), Err(GroupError::AllBound { entries }));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 512 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any interleaving of connects, departures, replies (to bound and to departed ids), receives,
    /// and the program's scans, acknowledgements and relaunches: a reply reaches only the client
    /// it was meant for, in order, and never the next client of a departed one's entry; connect
    /// takes an entry exactly when one is acknowledged, and otherwise says why not; a relaunched
    /// program acknowledges what the last launch had not; at the end every entry is reused.
    #[test]
    fn connect_depart_ack_and_replies_match_the_model(
        entries in 1u32..5,
        cap_log in 0u32..3,
        ops in proptest::collection::vec(model_op(), 1..if cfg!(miri) { 40 } else { 200 }),
    ) {
        run_model(entries, cap_log, ops)?;
    }
}

// ---- Threads: clients, meshd and the program at once (what Miri checks for races) ----

/// Request `k` of client `id`: the two numbers, then a pattern.
fn request(id: ClientId, k: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..4].copy_from_slice(&id.0.to_le_bytes());
    m[4..8].copy_from_slice(&k.to_le_bytes());
    m[8..].copy_from_slice(&(u64::from(k) << 32 | u64::from(!id.0)).to_le_bytes());
    m
}

/// `f(client, k)`: the reply to request `k` of client `id`.
fn reply(id: ClientId, k: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..4].copy_from_slice(&id.0.to_le_bytes());
    m[4..8].copy_from_slice(&k.to_le_bytes());
    m[8..].copy_from_slice(&(u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(id.0)).to_le_bytes());
    m
}

/// Set by whichever thread of the test panics, so that the others stop waiting and the test fails
/// instead of hanging; and a deadline, so that a wait that never ends (an entry never acknowledged)
/// fails too. Not under Miri, whose clock runs with the interpreter.
struct Abort(AtomicBool, Instant);

impl Abort {
    fn new() -> Self {
        Self(AtomicBool::new(false), Instant::now())
    }

    /// Yields, or gives up if another thread has failed or the test has run far too long.
    fn pause(&self) {
        assert!(!self.0.load(Ordering::Relaxed), "another thread of the test failed");
        assert!(cfg!(miri) || self.1.elapsed() < Duration::from_secs(60), "stuck: no progress in 60 s");
        std::thread::yield_now();
    }

    /// Sets the flag if the thread holding the guard panics.
    fn guard(&self) -> AbortOnPanic<'_> {
        AbortOnPanic(self)
    }
}

struct AbortOnPanic<'a>(&'a Abort);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.0.store(true, Ordering::Relaxed);
        }
    }
}

/// A client's stream: sends `count` requests (at most `window` unanswered), checks that the
/// replies are `f(id, k)` in order, and stops after `receive` of them. Returns how many it sent.
fn stream(svc: &ServiceMemory, id: ClientId, count: u32, receive: u32, window: u32, abort: &Abort) -> u32 {
    let mut c = ServiceClient::new(svc, id).unwrap();
    let (mut sent, mut got) = (0, 0);
    let mut out = [0u8; 16];
    while got < receive {
        if sent < count && sent - got < window && c.try_send(&request(id, sent)).unwrap() {
            sent += 1;
            continue;
        }
        if c.try_recv(&mut out).unwrap() {
            assert_eq!(out, reply(id, got), "client {:x}: reply {got} lost, repeated, reordered or not its own", id.0);
            got += 1;
        } else {
            abort.pause();
        }
    }
    sent
}

/// meshd's connect for a client that arrives while the table may be full (it waits for a
/// departure and its acknowledgement, as a client library would retry).
fn connect_when_free(meshd: &Mutex<ServiceMeshd>, h: Holder, abort: &Abort) -> ClientId {
    loop {
        match meshd.lock().unwrap().connect(h) {
            Ok(id) => return id,
            Err(GroupError::AllBound { .. } | GroupError::AwaitingAck { .. }) => abort.pause(),
            Err(e) => panic!("{e}"),
        }
    }
}

/// What the program saw: each sender's next expected request, the skips, the replies dropped.
#[derive(Debug, Default)]
struct Served {
    next: BTreeMap<u32, u32>,
    skips: Vec<u32>,
    gone: u32,
}

/// The program: takes requests, replies `f(client, k)` (keeping a backlog per client while its
/// ring is full), drops the state of departed clients, until `stop` and nothing left to take.
fn serve(svc: &ServiceMemory, stop: &AtomicBool, abort: &Abort) -> Served {
    let mut srv = ServiceServer::new(svc);
    let mut seen = Served::default();
    let mut backlog: BTreeMap<u32, VecDeque<[u8; 16]>> = BTreeMap::new();
    let mut req = [0u8; 16];
    loop {
        for gone in srv.departures().unwrap() {
            if let Some(q) = backlog.remove(&gone.0) {
                seen.gone += q.len() as u32;
            }
        }
        let mut idle = true;
        match srv.try_take(&mut req).unwrap() {
            Some(Taken::Message { sender }) => {
                let next = seen.next.entry(sender).or_default();
                assert_eq!(req, request(ClientId(sender), *next), "sender {sender:x}: lost, repeated or reordered");
                backlog.entry(sender).or_default().push_back(reply(ClientId(sender), *next));
                *next += 1;
                idle = false;
            }
            Some(Taken::Skipped { sender }) => {
                seen.skips.push(sender);
                idle = false;
            }
            None => {}
        }
        backlog.retain(|&sender, q| {
            while let Some(m) = q.front() {
                match srv.reply(sender, m).unwrap() {
                    Replied::Sent => {
                        q.pop_front();
                        idle = false;
                    }
                    Replied::Full => return true,
                    Replied::Gone => {
                        seen.gone += q.len() as u32;
                        return false;
                    }
                }
            }
            false
        });
        if idle {
            if stop.load(Ordering::Acquire) {
                break;
            }
            abort.pause();
        }
    }
    srv.departures().unwrap();
    seen
}

#[test]
fn clients_come_go_and_die_while_each_gets_its_own_replies_in_order() {
    let (count, window, requests, replies): (u32, u32, u64, u32) =
        if cfg!(miri) { (4, 2, 4, 2) } else { (3_000, 6, 8, 4) };
    let entries = 4;
    let heap = heap_service(entries, 16, requests, replies);
    let svc = heap.svc;
    let meshd = Mutex::new(ServiceMeshd::new(svc));
    // meshd binds the first four (every entry): the two that join later must reuse an entry.
    let ids: Vec<ClientId> = (0..4).map(|n| meshd.lock().unwrap().connect(holder(n)).unwrap()).collect();
    let (survivors, leaver, dying) = (&ids[..2], ids[2], ids[3]);
    let (left, died, stop) = (AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false));
    let abort = Abort::new();
    let (meshd, left, died, stop, abort) = (&meshd, &left, &died, &stop, &abort);
    let served = std::thread::scope(|s| {
        let _guard = abort.guard();
        let program = s.spawn(move || {
            let _guard = abort.guard();
            serve(&svc, stop, abort)
        });
        let mut clients = Vec::new();
        for &id in survivors {
            clients.push(s.spawn(move || {
                let _guard = abort.guard();
                assert_eq!(stream(&svc, id, count, count, window, abort), count);
                meshd.lock().unwrap().detach(id).unwrap();
                (id, count)
            }));
        }
        // Leaves with requests unanswered and replies unread (its client dropped first, as a
        // process closes its ends before it says goodbye).
        clients.push(s.spawn(move || {
            let _guard = abort.guard();
            let sent = stream(&svc, leaver, count, count / 2, window, abort);
            assert_eq!(meshd.lock().unwrap().detach(leaver), Ok(Completion::default()));
            left.store(true, Ordering::Release);
            (leaver, sent)
        }));
        // Two join once an entry has been given back, and must see only their own replies.
        for (n, gate) in [(10, left), (11, died)] {
            clients.push(s.spawn(move || {
                let _guard = abort.guard();
                while !gate.load(Ordering::Acquire) {
                    abort.pause();
                }
                let id = connect_when_free(meshd, holder(n), abort);
                assert_eq!(stream(&svc, id, count, count, window, abort), count);
                meshd.lock().unwrap().detach(id).unwrap();
                (id, count)
            }));
        }
        // Dies: two requests sent whole, the third cut off after its body.
        let dying_thread = s.spawn(move || {
            let _guard = abort.guard();
            let mut p = svc.fanin.producer(dying.0);
            for k in 0..2 {
                while !p.try_send(&request(dying, k)).unwrap() {
                    abort.pause();
                }
            }
            let (m, mut op) = (request(dying, 2), SendOp::default());
            while op.stage != Stage::Body {
                if p.step(&mut op, &m).unwrap() == Step::NoRoom {
                    abort.pause();
                }
            }
        });
        // meshd: the process is gone (the join orders all its stores before ours, fact 4).
        dying_thread.join().unwrap();
        let done = meshd.lock().unwrap().depart_dead(dying).unwrap();
        assert_eq!(done, Completion { skipped: 1, ..Completion::default() });
        died.store(true, Ordering::Release);
        let sent: Vec<(ClientId, u32)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        stop.store(true, Ordering::Release);
        let served = program.join().unwrap();
        (sent, served)
    });
    let (sent, served) = served;
    for &(id, n) in &sent {
        assert_eq!(served.next.get(&id.0), Some(&n), "client {:x}: every request taken once, in order", id.0);
    }
    assert_eq!(served.next.get(&dying.0), Some(&2), "the dead client's whole requests");
    assert_eq!(served.skips, [dying.0], "one skip, for the send its death cut off");
    let joined: Vec<ClientId> = sent[3..].iter().map(|&(id, _)| id).collect();
    assert!(joined.iter().all(|id| id.epoch16() >= 2), "the joiners reused entries: {joined:?}");
    // Every departure was acknowledged: the table binds all its entries again, rings empty.
    let mut meshd = ServiceMeshd::new(svc);
    for n in 0..entries {
        let id = meshd.connect(holder(100 + n)).unwrap();
        let mut c = ServiceClient::new(&svc, id).unwrap();
        assert!(!c.try_recv(&mut [0; 16]).unwrap(), "entry {}: a reply left for an earlier client", id.slot());
    }
    assert_eq!(meshd.connect(holder(200)), Err(GroupError::AllBound { entries }));
}
