//! Hostile writes into a live mailbox: arbitrary values stored into one service's and one channel's shared words after every end is open, then every operation run; none may panic, hang, or harm the untouched service and channel beside them.
//!
//! Any process of the mailbox's uid can map the file and store anything anywhere at any time.
//! `corrupt.rs` covers a damaged file at `Mailbox::open`; this covers words changed while meshd's
//! side (`ServiceOwner`) and the host ends run. What may happen on the corrupted channel is a wrong
//! message or an error naming it; what must hold is checked here: no panic (each operation runs
//! under `catch_unwind`, so that a failure names it), every call returns (the whole case runs under
//! a watchdog), and a second service and a second channel, whose words nobody touched, still carry
//! messages both ways.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test offsets, counts and ids are small; truncation is impossible or the point"
)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use mesh_shm::claim::Holder;
use mesh_shm::fanin::SendOp;
use mesh_shm::group::GroupMemory;
use mesh_shm::layout::{
    LINE, bulk_lines_offset, fanin_shard_offset, fanin_shard_owners_offset, fanin_shard_slots_offset,
};
use mesh_shm::{
    BulkConsumer, BulkProducer, ChannelInfo, ClientId, Consumer, CreateMode, FanInReceiver, FanInSender, GroupClient,
    GroupServer, Mailbox, MailboxConfig, Placement, Producer, Protocol, ServiceOwner, Taken,
};
use proptest::prelude::*;

/// Short enough that a case's dozens of timed calls stay well under the watchdog.
const SHORT: Duration = Duration::from_millis(5);
/// What a call on the untouched service or channel may take: it must succeed.
const LONG: Duration = Duration::from_secs(5);
/// A case that has not finished by then hangs somewhere.
const WATCHDOG: Duration = Duration::from_secs(60);

const MSG: u32 = 16;
const CAP: u32 = 8;
const SHARDS: u32 = 2;
const CLIENTS: u32 = 4;

/// A mailbox with two services (`a`, the victim, and `b`) and channels of each host protocol
/// (`x`, `xb`, `xi`, the victims, and `y`), every end open, some traffic in flight.
struct Rig {
    _dir: tempfile::TempDir,
    mb: Mailbox,
    owner_a: ServiceOwner,
    owner_b: ServiceOwner,
    rx_a: FanInReceiver,
    rx_b: FanInReceiver,
    srv_a: GroupServer,
    srv_b: GroupServer,
    /// Clients of `a`: a sender and a reply end each; the second is stopped in the middle of a send.
    clients_a: Vec<(FanInSender, GroupClient)>,
    stopped: (SendOp, ClientId),
    x: (Producer, Consumer),
    xb: (BulkProducer, BulkConsumer),
    xi: (Producer, Consumer),
    y: (Producer, Consumer),
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let cfg = MailboxConfig { size: 4 << 20, slots: 4, channels: 16 };
    let mb = Mailbox::create(dir.path().join("mb"), &cfg, CreateMode::Exclusive).unwrap();
    for s in ["a", "b"] {
        mb.create_fanin(s, MSG, CAP, SHARDS).unwrap();
        mb.create_group(&format!("{s}.replies"), CLIENTS, MSG, CAP).unwrap();
    }
    mb.create_channel("x", MSG, CAP).unwrap();
    mb.create_channel_parts("xb", 32, CAP, Placement::Host, Protocol::Bulk, 2).unwrap();
    mb.create_channel_with("xi", MSG, CAP, Placement::Host, Protocol::Index).unwrap();
    mb.create_channel("y", MSG, CAP).unwrap();
    let mut owner_a = ServiceOwner::open(&mb, "a", "a.replies").unwrap();
    let owner_b = ServiceOwner::open(&mb, "b", "b.replies").unwrap();
    let mut rx_a = FanInReceiver::claim(&mb, "a").unwrap();
    let rx_b = FanInReceiver::claim(&mb, "b").unwrap();
    let mut srv_a = GroupServer::claim(&mb, "a.replies").unwrap();
    let srv_b = GroupServer::claim(&mb, "b.replies").unwrap();
    let mut clients_a = Vec::new();
    for _ in 0..3 {
        let id = owner_a.connect(Holder::current()).unwrap();
        clients_a.push((FanInSender::open(&mb, "a", id).unwrap(), GroupClient::claim(&mb, "a.replies", id).unwrap()));
    }
    // Traffic: requests taken and replied to, requests left in the ring, one send stopped half way.
    for (k, (tx, _)) in clients_a.iter_mut().enumerate() {
        for j in 0..2u8 {
            tx.send(&[k as u8, j], LONG).unwrap();
        }
    }
    let mut buf = [0u8; MSG as usize];
    for _ in 0..3 {
        if let Taken::Message { sender } = rx_a.take(&mut buf, LONG).unwrap() {
            srv_a.reply(ClientId(sender), &buf).unwrap();
        }
    }
    let mut op = SendOp::default();
    let stopped_id = clients_a[1].0.id();
    for _ in 0..3 {
        clients_a[1].0.step(&mut op, &[9; 8]).unwrap();
    }
    let mut x = (Producer::claim(&mb, "x").unwrap(), Consumer::claim(&mb, "x").unwrap());
    let mut xb = (BulkProducer::claim(&mb, "xb").unwrap(), BulkConsumer::claim(&mb, "xb").unwrap());
    let mut xi = (Producer::claim(&mb, "xi").unwrap(), Consumer::claim(&mb, "xi").unwrap());
    let y = (Producer::claim(&mb, "y").unwrap(), Consumer::claim(&mb, "y").unwrap());
    for k in 0..3u8 {
        x.0.send(&[k], LONG).unwrap();
        xb.0.send(&[k; 32], LONG).unwrap();
        xi.0.send(&[k], LONG).unwrap();
    }
    x.1.recv(&mut buf, LONG).unwrap();
    xi.1.recv(&mut buf, LONG).unwrap();
    Rig {
        _dir: dir,
        mb,
        owner_a,
        owner_b,
        rx_a,
        rx_b,
        srv_a,
        srv_b,
        clients_a,
        stopped: (op, stopped_id),
        x,
        xb,
        xi,
        y,
    }
}

/// The words of a ring header: head, tail and the two claims.
fn header_words(at: u64) -> [u64; 4] {
    [at, at + LINE, at + 2 * LINE, at + 2 * LINE + 8]
}

/// Every shared word the victims' ends and meshd's side read, by name: headers, shards, owner
/// tables, slots, the group's header, entries and reply rings, bulk part lines, descriptors.
fn targets(mb: &Mailbox) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut push = |name: String, at: u64| out.push((name, at));
    let g = mb.geometry();
    let a = mb.channel("a").unwrap();
    for k in 0..SHARDS {
        let header = if k == 0 { a.ring_offset } else { a.slots_offset + fanin_shard_offset(k, MSG, CAP) };
        for (w, at) in ["cursor", "tail", "producer claim", "consumer claim"].iter().zip(header_words(header)) {
            push(format!("a shard {k} {w}"), at);
        }
        let owners = a.slots_offset + fanin_shard_owners_offset(k, MSG, CAP);
        let slots = a.slots_offset + fanin_shard_slots_offset(k, MSG, CAP);
        for i in 0..u64::from(CAP) {
            push(format!("a shard {k} owner {i}"), owners + 8 * i);
        }
        let per_slot = 2 + u64::from(MSG) / 4;
        for j in 0..per_slot * 3 {
            push(format!("a shard {k} slot word {j}"), slots + 8 * j);
        }
    }
    let ar = mb.channel("a.replies").unwrap();
    let base = ar.slots_offset;
    for (w, at) in ["entries|msg_size", "capacity|reserved", "ring_stride", "changes"].iter().zip(0..) {
        push(format!("a.replies header {w}"), base + 8 * at);
    }
    let stride = GroupMemory::ring_stride(MSG, CAP);
    for e in 0..u64::from(CLIENTS) {
        let entry = base + LINE + 2 * LINE * e;
        for (w, off) in [("binding", 0), ("holder", 8), ("reply_ring_offset", 16), ("acked_epoch", LINE)] {
            push(format!("a.replies entry {e} {w}"), entry + off);
        }
        let ring = base + LINE + 2 * LINE * u64::from(CLIENTS) + e * stride;
        for (w, at) in ["head", "tail", "producer claim", "consumer claim"].iter().zip(header_words(ring)) {
            push(format!("a.replies ring {e} {w}"), at);
        }
        push(format!("a.replies ring {e} slot word 0"), ring + 3 * LINE);
    }
    for name in ["x", "xi", "xb"] {
        let c = mb.channel(name).unwrap();
        for (w, at) in ["head", "tail", "producer claim", "consumer claim"].iter().zip(header_words(c.ring_offset)) {
            push(format!("{name} {w}"), at);
        }
        push(format!("{name} slot word 0"), c.slots_offset);
    }
    let xb = mb.channel("xb").unwrap();
    let lines = xb.slots_offset + bulk_lines_offset(CAP, 2);
    for l in 0..4 {
        push(format!("xb part line {l}"), lines + l * LINE);
    }
    for f in 0..u64::from(CAP) * 2 {
        push(format!("xb flag {f}"), xb.slots_offset + 8 * f);
    }
    for c in [a.index, ar.index, mb.channel("x").unwrap().index] {
        for w in 0..16 {
            push(format!("descriptor {c} word {w}"), g.channels_offset + u64::from(c) * 128 + 8 * w);
        }
    }
    out
}

/// Values a hostile or buggy writer might leave: boundaries, values just past a ring's capacity,
/// ownership and binding words of nearby laps and states, and anything at all.
fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0,
            1,
            2,
            3,
            7,
            8,
            9,
            16,
            17,
            u64::from(u32::MAX),
            1 << 32,
            (1 << 32) + 1,
            2 << 32,
            3 << 32,
            u64::MAX,
            u64::MAX - 1,
            u64::MAX - 7,
            1 << 63,
            (1 << 63) - 1,
            (1 << 63) + 8,
            1 << 31,
            (1 << 31) - 1,
        ]),
        // Ownership words: ticket, state, owner.
        (0u64..6, 0u64..4, 0u64..5).prop_map(|(t, s, o)| (t << 18) | (s << 16) | o),
        // Binding words: epoch, state.
        (0u64..4, 0u64..5).prop_map(|(e, s)| (s << 32) | e),
        any::<u64>(),
    ]
}

fn poke(mb: &Mailbox, at: u64, v: u64) {
    let (base, len) = mb.as_raw_parts();
    assert!(at.is_multiple_of(8) && (at as usize) + 8 <= len, "target {at} outside the mapping");
    // SAFETY: `at` is an 8-aligned offset inside the mapping (asserted), which `mb` keeps alive;
    // every process accesses the mailbox's shared words atomically.
    unsafe { AtomicU64::from_ptr(base.add(at as usize).cast::<u64>()) }.store(v, Ordering::Release);
}

/// The operation running now and the writes before it, for the watchdog's message.
static WHERE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Runs `f`, turning a panic into one that names the operation and the writes before it.
fn op<T>(name: &str, writes: &str, f: impl FnOnce() -> T) -> Option<T> {
    *WHERE.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = format!("{name} after {writes}");
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("{name} panicked after {writes}: {}", msg.unwrap_or_default());
        }
    }
}

/// Every operation on the victims, each allowed to fail (its error must name the channel).
fn attack(r: &mut Rig, writes: &str) {
    let mb = r.mb.clone();
    let named = |what: &str, e: &mesh_shm::ShmError, names: &[&str]| {
        let text = e.to_string();
        assert!(
            names.iter().any(|n| text.contains(n)) || matches!(e, mesh_shm::ShmError::Invalid { .. }),
            "{what} after {writes}: the error does not name the channel: {text}"
        );
    };
    let mut buf = [0u8; MSG as usize];
    // meshd's side, opened before the writes (as meshd's is) and after them.
    let ids: Vec<ClientId> = r.clients_a.iter().map(|(tx, _)| tx.id()).collect();
    op("ServiceOwner::repair", writes, || r.owner_a.repair());
    op("ServiceOwner::bound", writes, || r.owner_a.bound().map_err(|e| named("bound", &e, &["a"])).ok());
    for slot in 0..CLIENTS as u16 + 1 {
        op("ServiceOwner::entry", writes, || r.owner_a.entry(slot).ok());
    }
    let probe = r.owner_a.stall_probe();
    for k in 0..SHARDS + 1 {
        op("FanInProbe::hold", writes, || probe.hold(k));
    }
    op("FanInProbe::holds", writes, || probe.holds());
    op("ServiceOwner::revoke_stalled", writes, || r.owner_a.revoke_stalled(r.stopped.1).ok());
    op("ServiceOwner::connect", writes, || {
        if let Err(e) = r.owner_a.connect(Holder::current()) {
            named("connect", &e, &["a"]);
        }
    });
    // Clients and the server at work.
    for (k, (tx, rx)) in r.clients_a.iter_mut().enumerate() {
        op("FanInSender::send", writes, || {
            if let Err(e) = tx.send(&[k as u8], SHORT) {
                named("send", &e, &["a"]);
            }
        });
        op("FanInSender::try_send", writes, || tx.try_send(&[k as u8; 16]).ok());
        op("GroupClient::recv", writes, || rx.recv(&mut buf, SHORT).ok());
    }
    let (op_state, stopped) = &mut r.stopped;
    let stopped = *stopped;
    for _ in 0..8 {
        op("FanInSender::step", writes, || r.clients_a[1].0.step(op_state, &[9; 8]).ok());
    }
    for _ in 0..(2 * CAP) {
        let got = op("FanInReceiver::try_take", writes, || r.rx_a.try_take_shard(&mut buf));
        match got.unwrap() {
            Ok(Some((_, Taken::Message { sender }))) => {
                op("GroupServer::reply", writes, || r.srv_a.reply(ClientId(sender), &buf).ok());
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                named("try_take", &e, &["a"]);
                break;
            }
        }
    }
    op("FanInReceiver::take", writes, || r.rx_a.take(&mut buf, SHORT).ok());
    op("GroupServer::departures", writes, || r.srv_a.departures().ok());
    op("GroupServer::reply beyond the table", writes, || r.srv_a.reply(ClientId(0xffff), &[1]).ok());
    // Departures: a dead client's, a live one's, and the stopped one's.
    op("ServiceOwner::depart_dead", writes, || r.owner_a.depart_dead(ids[0]).ok());
    op("ServiceOwner::detach", writes, || r.owner_a.detach(ids[2]).ok());
    op("ServiceOwner::detach (stopped)", writes, || r.owner_a.detach(stopped).ok());
    op("GroupServer::departures", writes, || r.srv_a.departures().ok());
    // Ends opened after the writes, by a new process's view of the file.
    op("ServiceOwner::open", writes, || {
        if let Ok(mut o) = ServiceOwner::open(&mb, "a", "a.replies") {
            let _ = o.bound();
            let _ = o.repair();
            let _ = o.stall_probe().holds();
            if let Ok(id) = o.connect(Holder::current()) {
                if let Ok(mut tx) = FanInSender::open(&mb, "a", id) {
                    let _ = tx.send(&[1], SHORT);
                }
                if let Ok(mut rx) = GroupClient::claim(&mb, "a.replies", id) {
                    let _ = rx.try_recv(&mut buf);
                }
                let _ = o.depart_dead(id);
            }
        }
    });
    op("FanInReceiver::claim", writes, || FanInReceiver::claim(&mb, "a").map(|mut rx| rx.try_take(&mut buf)).ok());
    op("GroupServer::claim", writes, || GroupServer::claim(&mb, "a.replies").map(|mut s| s.departures()).ok());
    // The plain channels.
    op("ll", writes, || {
        let _ = r.x.0.send(&[1], SHORT);
        let _ = r.x.0.try_send_batch(&[0; 64]);
        let _ = r.x.1.recv(&mut buf, SHORT);
        let mut many = [0u8; 64];
        let _ = r.x.1.try_recv_batch(&mut many);
        let _ = Producer::claim(&mb, "x").map(|mut p| p.try_send(&[1]));
        let _ = Consumer::claim(&mb, "x").map(|mut c| c.try_recv(&mut buf));
    });
    op("index", writes, || {
        let _ = r.xi.0.send(&[1], SHORT);
        let _ = r.xi.1.recv(&mut buf, SHORT);
        let mut many = [0u8; 64];
        let _ = r.xi.1.try_recv_batch(&mut many);
        let _ = r.xi.0.try_send_batch(&[0; 64]);
    });
    op("bulk", writes, || {
        let _ = r.xb.0.send(&[1; 32], SHORT);
        let mut big = [0u8; 32];
        for _ in 0..3 {
            if let Ok(Some(_)) = r.xb.1.try_peek() {
                let _ = r.xb.1.read_peeked(&mut big);
                let _ = r.xb.1.release();
            }
        }
        let _ = BulkProducer::claim(&mb, "xb").map(|mut p| p.try_send(&[1; 32]));
        let _ = BulkConsumer::claim(&mb, "xb").map(|mut c| c.try_peek().map(|p| p.is_some()));
    });
    op("Mailbox::channels", writes, || mb.channels().ok());
    op("Mailbox::bound_channels", writes, || mb.bound_channels(0).ok());
}

/// The untouched service and channel still carry messages both ways, and can be found by name.
fn check_others(r: &mut Rig, writes: &str) {
    let mb = r.mb.clone();
    let info: ChannelInfo = mb.channel("b").unwrap_or_else(|e| panic!("service b not found after {writes}: {e}"));
    assert_eq!(info.protocol, Protocol::FanIn);
    let id = r.owner_b.connect(Holder::current()).unwrap_or_else(|e| panic!("b connect after {writes}: {e}"));
    let mut tx = FanInSender::open(&mb, "b", id).unwrap_or_else(|e| panic!("b sender after {writes}: {e}"));
    let mut rx = GroupClient::claim(&mb, "b.replies", id).unwrap_or_else(|e| panic!("b client after {writes}: {e}"));
    let mut buf = [0u8; MSG as usize];
    tx.send(b"ping", LONG).unwrap_or_else(|e| panic!("b send after {writes}: {e}"));
    assert_eq!(r.rx_b.take(&mut buf, LONG).unwrap(), Taken::Message { sender: id.0 }, "after {writes}");
    assert!(buf.starts_with(b"ping"), "b's request after {writes}");
    r.srv_b.reply(id, b"pong").unwrap_or_else(|e| panic!("b reply after {writes}: {e}"));
    rx.recv(&mut buf, LONG).unwrap_or_else(|e| panic!("b recv after {writes}: {e}"));
    assert!(buf.starts_with(b"pong"), "b's reply after {writes}");
    drop(rx);
    r.owner_b.detach(id).unwrap_or_else(|e| panic!("b detach after {writes}: {e}"));
    assert_eq!(r.srv_b.departures().unwrap(), vec![id], "after {writes}");
    r.y.0.send(&[7; 16], LONG).unwrap_or_else(|e| panic!("y send after {writes}: {e}"));
    r.y.1.recv(&mut buf, LONG).unwrap_or_else(|e| panic!("y recv after {writes}: {e}"));
    assert_eq!(buf, [7; 16], "y's message after {writes}");
}

/// Runs one case on its own thread under the watchdog: a hang fails the test, naming the writes.
fn case(writes: Vec<(usize, u64)>) {
    let (done_tx, done_rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let mut r = rig();
        let targets = targets(&r.mb);
        let named: Vec<(String, u64, u64)> = writes
            .iter()
            .map(|&(t, v)| (targets[t % targets.len()].0.clone(), targets[t % targets.len()].1, v))
            .collect();
        let text = named.iter().map(|(n, _, v)| format!("{n} := {v:#x}")).collect::<Vec<_>>().join(", ");
        // Half the writes before the first round of operations, the rest between the two rounds.
        let (first, second) = named.split_at(named.len() / 2 + 1);
        for (_, at, v) in first {
            poke(&r.mb, *at, *v);
        }
        attack(&mut r, &text);
        for (_, at, v) in second {
            poke(&r.mb, *at, *v);
        }
        attack(&mut r, &text);
        check_others(&mut r, &text);
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(WATCHDOG) {
        Ok(()) => worker.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The worker panicked: its message says which operation and after which writes.
            std::panic::resume_unwind(worker.join().unwrap_err());
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "a case did not finish within {WATCHDOG:?}: {} hangs",
            WHERE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any values, into any of the victims' words, between operations.
    #[test]
    fn hostile_words_hurt_nothing_else(writes in prop::collection::vec((any::<usize>(), value()), 1..5)) {
        case(writes);
    }
}

/// Every word, one at a time, with each boundary value: the systematic sweep beside the random one.
#[test]
fn every_word_with_each_boundary_value() {
    let n = targets(&rig().mb).len();
    for v in [0, u64::MAX, 1 << 63, 1 << 32, u64::from(CAP) + 1, (2 << 32) | 1, (3 << 18) | (1 << 16) | 1] {
        for t in 0..n {
            case(vec![(t, v)]);
        }
    }
}
