//! Fan-in channels and channel groups in a real mailbox file: creation and validation, the wrong ends refused, and whole request/reply services between threads and between processes.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test counts and check words: truncation is the point or impossible"
)]

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mesh_shm::claim::Holder;
use mesh_shm::layout::{
    BINDING_PARTS_SHIFT, PROTOCOL_FANIN, PROTOCOL_GROUP, binding_protocol, fanin_region_bytes, fanin_shard_offset,
    fanin_shard_span, fanin_slot_bytes, group_bytes, host_slots_offset,
};
use mesh_shm::{
    BulkProducer, ClientId, Consumer, CreateMode, FanInReceiver, FanInSender, GroupClient, GroupServer, Mailbox,
    MailboxConfig, Placement, Producer, Protocol, Replied, ServiceOwner, ShmError, Taken,
};

const LONG: Duration = Duration::from_secs(60);

fn small() -> MailboxConfig {
    MailboxConfig { size: 4 << 20, slots: 8, channels: 16 }
}

/// A request: its number in the client's stream, the client's id, and a check word.
fn request(k: u64, id: ClientId) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&k.to_le_bytes());
    m[8..12].copy_from_slice(&id.0.to_le_bytes());
    m[12..].copy_from_slice(&(!id.0 ^ k as u32).to_le_bytes());
    m
}

fn parse_request(m: &[u8]) -> (u64, u32, u32) {
    let k = u64::from_le_bytes(m[..8].try_into().unwrap());
    let id = u32::from_le_bytes(m[8..12].try_into().unwrap());
    (k, id, u32::from_le_bytes(m[12..16].try_into().unwrap()) ^ !id ^ k as u32)
}

/// The reply to request `k` of client `id`: `f(id, k)`, which only that request's reply carries.
fn reply_to(k: u64, id: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&k.to_le_bytes());
    m[8..].copy_from_slice(&(k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(id)).to_le_bytes());
    m
}

/// Bye: the last request of a client's stream.
const BYE: u64 = u64::MAX;

/// A client's whole stream: `n` requests, at most `window` in flight, every reply checked in order,
/// then a bye. The window is at most the reply ring's capacity, so the server never finds it full.
/// `on_reply` sees the count of replies after each.
fn run_client(tx: &mut FanInSender, rx: &mut GroupClient, n: u64, window: u64, mut on_reply: impl FnMut(u64)) {
    let id = tx.id();
    let (mut sent, mut got) = (0u64, 0u64);
    let mut buf = [0u8; 16];
    // Stuck means no progress for LONG, not a slow run: on a loaded 2-core machine a window-1 client
    // spinning beside four others made 145 round trips a second, and a 60 s budget for the whole
    // stream failed a correct run.
    let mut progress = Instant::now();
    while got < n {
        if sent < n && sent - got < window && tx.try_send(&request(sent, id)).unwrap() {
            sent += 1;
            progress = Instant::now();
        }
        if rx.try_recv(&mut buf).unwrap() {
            assert_eq!(buf, reply_to(got, id.0), "client {id:?}: reply {got} is not f({id:?}, {got})");
            got += 1;
            on_reply(got);
            progress = Instant::now();
        }
        assert!(progress.elapsed() < LONG, "client {id:?} stuck at {sent} sent, {got} replies");
    }
    tx.send(&request(BYE, id), LONG).unwrap();
    assert!(!rx.try_recv(&mut buf).unwrap(), "a reply nobody asked for");
}

/// A host server: takes requests, checks each sender's order, replies `f`, acknowledges departures;
/// returns once `byes` clients said bye, with each sender's request count and the skips seen.
fn run_server(rx: &mut FanInReceiver, srv: &mut GroupServer, byes: usize) -> (HashMap<u32, u64>, Vec<u32>) {
    let mut next: HashMap<u32, u64> = HashMap::new();
    let (mut done, mut skips) = (0, Vec::new());
    let mut buf = [0u8; 16];
    let mut progress = Instant::now(); // stuck: nothing taken for LONG (see run_client)
    while done < byes {
        assert!(progress.elapsed() < LONG, "server stuck: {done} byes of {byes}, {next:?}");
        // Acknowledged as returned. A departed sender's state is kept: its requests can still sit in
        // the fan-in ring after the ack (its id's epoch keeps them apart from its entry's next client).
        srv.departures().unwrap();
        let taken = rx.try_take(&mut buf).unwrap();
        if taken.is_some() {
            progress = Instant::now();
        }
        match taken {
            None => std::thread::yield_now(),
            Some(Taken::Skipped { sender }) => skips.push(sender),
            Some(Taken::Message { sender }) => {
                let (k, id, check) = parse_request(&buf);
                assert_eq!((id, check), (sender, 0), "a request carries its sender's id, whole");
                if k == BYE {
                    done += 1;
                    continue;
                }
                let want = next.entry(sender).or_insert(0);
                assert_eq!(k, *want, "sender {sender:#x}: request {k} out of order");
                *want += 1;
                loop {
                    match srv.reply(ClientId(sender), &reply_to(k, sender)).unwrap() {
                        Replied::Sent | Replied::Gone => break,
                        Replied::Full => std::thread::yield_now(),
                    }
                }
            }
        }
    }
    (next, skips)
}

#[test]
fn fanin_and_group_channels_are_listed_checked_and_refuse_the_wrong_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    let fanin = mb.create_fanin("kv", 24, 64, 1).unwrap();
    let group = mb.create_group("kv.replies", 5, 16, 8).unwrap();
    let after = mb.create_channel("after", 8, 4).unwrap();
    assert_eq!((fanin.protocol, fanin.clients(), fanin.parts), (Protocol::FanIn, None, 1));
    assert_eq!((group.protocol, group.clients(), group.msg_size, group.capacity), (Protocol::Group, Some(5), 16, 8));
    // Sizes: fan-in = its owner table (a page) then 64 slots of 16 + 2 × 24 bytes; the group as
    // group.rs lays it out (a header line, 5 entries of 2 lines, 5 rings of 384 + 2 × 16 × 8 bytes).
    assert_eq!(fanin_slot_bytes(24, 64), 4096 + 64 * 64);
    assert_eq!(group_bytes(5, 16, 8), 128 + 5 * 256 + 5 * (384 + 256));
    assert_eq!(fanin.slots_offset, host_slots_offset(fanin.ring_offset));
    assert_eq!(group.ring_offset, (fanin.slots_offset + fanin_slot_bytes(24, 64)).div_ceil(128) * 128);
    assert_eq!(after.ring_offset, (group.slots_offset + group_bytes(5, 16, 8)).div_ceil(128) * 128);

    // Listed with their protocols, after a reopen (which validates every descriptor) too.
    let again = Mailbox::open(mb.path()).unwrap();
    let listed: Vec<_> = again.channels().unwrap().into_iter().map(|c| (c.name, c.protocol, c.parts)).collect();
    assert_eq!(
        listed,
        [
            ("kv".to_string(), Protocol::FanIn, 1),
            ("kv.replies".to_string(), Protocol::Group, 5),
            ("after".to_string(), Protocol::Ll, 1)
        ]
    );
    assert_eq!(Protocol::FanIn.to_string(), "fanin");
    assert_eq!(Protocol::from_code(PROTOCOL_GROUP), Some(Protocol::Group));

    // The wrong ends, each refused naming the channel, its format and the ends that speak it.
    let wrong = |e: ShmError, channel: &str, format: &str| {
        let text = e.to_string();
        assert!(matches!(e, ShmError::Protocol { .. }), "{text}");
        assert!(text.contains(&format!("{channel:?}")) && text.contains(&format!("{format} format")), "{text}");
        assert!(text.contains("protocol fanin: FanInSender/FanInReceiver"), "{text}");
    };
    wrong(Producer::claim(&mb, "kv").unwrap_err(), "kv", "fanin");
    wrong(Consumer::claim(&mb, "kv").unwrap_err(), "kv", "fanin");
    wrong(BulkProducer::claim(&mb, "kv").unwrap_err(), "kv", "fanin");
    wrong(Producer::claim(&mb, "kv.replies").unwrap_err(), "kv.replies", "group");
    wrong(FanInReceiver::claim(&mb, "kv.replies").unwrap_err(), "kv.replies", "group");
    wrong(FanInReceiver::claim(&mb, "after").unwrap_err(), "after", "ll");
    wrong(GroupServer::claim(&mb, "kv").unwrap_err(), "kv", "fanin");
    wrong(FanInSender::open(&mb, "kv.replies", ClientId(0)).unwrap_err(), "kv.replies", "group");
    wrong(GroupClient::claim(&mb, "after", ClientId(0)).unwrap_err(), "after", "ll");
    assert!(matches!(ServiceOwner::open(&mb, "kv.replies", "kv"), Err(ShmError::Protocol { .. })));
    // The right ends: one consumer, one server; a second is refused while the first holds.
    let rx = FanInReceiver::claim(&mb, "kv").unwrap();
    assert!(matches!(FanInReceiver::claim(&mb, "kv"), Err(ShmError::Claimed { .. })));
    let srv = GroupServer::claim(&mb, "kv.replies").unwrap();
    assert!(matches!(GroupServer::claim(&mb, "kv.replies"), Err(ShmError::Claimed { .. })));
    let info = again.channel("kv").unwrap();
    assert_eq!((info.consumer_pid, info.producer_pid), (Some(std::process::id()), None));
    drop((rx, srv));
    // A client's reply ring: only an entry of the table; one holder at a time.
    let c = GroupClient::claim(&mb, "kv.replies", ClientId::new(4, 1)).unwrap();
    assert!(matches!(GroupClient::claim(&mb, "kv.replies", ClientId::new(4, 1)), Err(ShmError::Claimed { .. })));
    let e = GroupClient::claim(&mb, "kv.replies", ClientId::new(5, 1)).unwrap_err();
    assert!(matches!(e, ShmError::Group { .. }) && e.to_string().contains("\"kv.replies\""), "{e}");
    drop(c);
    // Messages of the wrong size, naming the channel.
    let mut tx = FanInSender::open(&mb, "kv", ClientId::new(0, 1)).unwrap();
    let e = tx.try_send(&[0; 25]).unwrap_err();
    assert!(matches!(e, ShmError::MessageSize { size: 24, got: 25, .. }), "{e}");

    // Bad parameters, each refused naming the channel and the rule.
    for (e, says) in [
        (mb.create_fanin("f", 12, 4, 1).unwrap_err(), "message size 12: must be a multiple of 8"),
        (mb.create_fanin("f", 8, 6, 1).unwrap_err(), "capacity 6"),
        (mb.create_group("g", 0, 8, 4).unwrap_err(), "0 client slots: a group has 1 to 65536"),
        (mb.create_group("g", 65537, 8, 4).unwrap_err(), "65537 client slots"),
        (mb.create_group("g", 4, 128 << 10, 4).unwrap_err(), "message size 131072"),
        (mb.create_group("g", 4, 8, 3).unwrap_err(), "capacity 3"),
        (mb.create_group("g", 4096, 64 << 10, 1 << 10).unwrap_err(), "mailbox full"),
        (
            mb.create_channel_with("f", 8, 4, Placement::Device, Protocol::FanIn).unwrap_err(),
            "protocol fanin has host processes at one end",
        ),
        (
            mb.create_channel_with("g", 8, 4, Placement::Host, Protocol::Group).unwrap_err(),
            "created with its number of client slots",
        ),
        (mb.create_fanin("kv", 8, 4, 1).unwrap_err(), "already exists"),
    ] {
        let text = e.to_string();
        assert!(
            text.contains(says) && (text.contains("\"f\"") || text.contains("\"g\"") || text.contains("\"kv\"")),
            "{text}"
        );
    }
    // A fan-in channel through the generic path is the same channel as create_fanin's.
    let f2 = mb.create_channel_with("f2", 8, 4, Placement::Host, Protocol::FanIn).unwrap();
    assert_eq!(f2.protocol, Protocol::FanIn);

    // A program's bindings: the fan-in's LL slots (past its owner table), the group's header.
    mb.slot(0).unwrap().bind("svc", &[fanin.index, group.index]).unwrap();
    let ctx = mb.mesh_ctx(0, 0x7000_0000).unwrap();
    let (b0, b1) = (ctx.bindings[0], ctx.bindings[1]);
    assert_eq!(
        (b0.protocol, b0.ring_offset, b0.slots),
        (PROTOCOL_FANIN, fanin.ring_offset, 0x7000_0000 + fanin.slots_offset + 4096)
    );
    assert_eq!(
        (b1.protocol, b1.ring_offset, b1.slots),
        (PROTOCOL_GROUP, group.ring_offset, 0x7000_0000 + group.slots_offset)
    );
    assert_eq!((b1.msg_size, b1.capacity), (16, 8), "the reply rings' geometry; the entries are in the header");
}

#[test]
fn an_unknown_protocol_or_a_group_header_that_disagrees_is_refused_naming_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb = Mailbox::create(&path, &small(), CreateMode::Exclusive).unwrap();
    let g = mb.create_group("grp", 3, 8, 4).unwrap();
    let x = mb.create_channel("future", 8, 4).unwrap();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // The group's header says 4 entries where its descriptor says 3: the server's claim says so.
    file.write_all_at(&4u32.to_le_bytes(), g.slots_offset).unwrap();
    let e = GroupServer::claim(&Mailbox::open(&path).unwrap(), "grp").unwrap_err();
    assert!(matches!(e, ShmError::Group { .. }) && e.to_string().contains("\"grp\""), "{e}");
    file.write_all_at(&3u32.to_le_bytes(), g.slots_offset).unwrap();
    GroupServer::claim(&Mailbox::open(&path).unwrap(), "grp").unwrap();
    // A protocol this build does not know (a newer meshd's): the open refuses it, naming the
    // channel, rather than reading it as LL.
    let desc = mb.geometry().channels_offset + u64::from(x.index) * 128;
    file.write_all_at(&5u32.to_le_bytes(), desc + 88).unwrap();
    let e = Mailbox::open(&path).unwrap_err().to_string();
    assert!(e.contains("\"future\": protocol 5") && e.contains("does not know its format"), "{e}");
}

#[test]
fn four_client_threads_and_a_server_thread_through_a_mailbox() {
    const N: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    mb.create_fanin("svc", 16, 64, 1).unwrap();
    mb.create_group("svc.r", 4, 16, 8).unwrap();
    let mut meshd = ServiceOwner::open(&mb, "svc", "svc.r").unwrap();
    let ids: Vec<ClientId> = (0..4).map(|_| meshd.connect(Holder::current()).unwrap()).collect();
    let e = meshd.connect(Holder::current()).unwrap_err().to_string();
    assert!(e.contains("\"svc.r\"") && e.contains("all 4 entries are bound"), "{e}");

    let server = {
        let mb = Mailbox::open(mb.path()).unwrap();
        std::thread::spawn(move || {
            let (mut rx, mut srv) =
                (FanInReceiver::claim(&mb, "svc").unwrap(), GroupServer::claim(&mb, "svc.r").unwrap());
            run_server(&mut rx, &mut srv, 4)
        })
    };
    let clients: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let mb = mb.clone();
            std::thread::spawn(move || {
                let mut tx = FanInSender::open(&mb, "svc", id).unwrap();
                let mut rx = GroupClient::claim(&mb, "svc.r", id).unwrap();
                run_client(&mut tx, &mut rx, N, 1 + i as u64 * 2, |_| {}); // windows 1, 3, 5, 7
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (counts, skips) = server.join().unwrap();
    assert!(skips.is_empty(), "no client died: {skips:?}");
    assert_eq!(counts.len(), 4);
    for id in &ids {
        assert_eq!(counts[&id.0], N, "every request of {id:?} taken once, in order");
    }
    // The clients leave; a new server acknowledges their departures and the entries are reused.
    for &id in &ids {
        assert_eq!(meshd.detach(id).unwrap(), Default::default(), "nothing of theirs was in flight");
    }
    let mut srv = GroupServer::claim(&mb, "svc.r").unwrap();
    let mut gone = srv.departures().unwrap();
    gone.sort();
    assert_eq!(gone, ids);
    let again = meshd.connect(Holder::current()).unwrap();
    assert_eq!((again.slot(), again.epoch16()), (0, 2), "entry 0, its second client");
    assert_eq!(srv.reply(ids[0], &[1; 16]).unwrap(), Replied::Gone, "the old client's replies go nowhere");
}

/// The descriptor's bytes of channel `index` as the file holds them.
fn desc_bytes(path: &std::path::Path, mb: &Mailbox, index: u32) -> [u8; 128] {
    let file = std::fs::File::open(path).unwrap();
    let mut d = [0u8; 128];
    file.read_exact_at(&mut d, mb.geometry().channels_offset + u64::from(index) * 128).unwrap();
    d
}

#[test]
fn a_fanin_channel_of_one_shard_is_layout_4_byte_for_byte_and_shards_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb = Mailbox::create(&path, &small(), CreateMode::Exclusive).unwrap();
    let one = mb.create_fanin("one", 24, 64, 1).unwrap();
    let next = mb.create_channel("next", 8, 4).unwrap();
    // The descriptor: live, 24, 64, host, the ring, the name, the slots, protocol 3, parts 1: what a
    // build before shards wrote (its `parts` word was always 1 for a fan-in channel).
    let d = desc_bytes(&path, &mb, one.index);
    let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(d[o..o + 8].try_into().unwrap());
    assert_eq!((u32_at(0), u32_at(4), u32_at(8), u32_at(12)), (1, 24, 64, 0));
    assert_eq!((u64_at(16), &d[24..27]), (one.ring_offset, &b"one"[..]));
    assert_eq!((u64_at(72), u64_at(80), u32_at(88), u32_at(92)), (one.slots_offset, 0, PROTOCOL_FANIN, 1));
    assert!(d[96..].iter().all(|&b| b == 0), "the padding stays zero");
    // Its offsets: slots on the page after the header, the next ring right after its
    // `fanin_slot_bytes` (not page-rounded), as layout 4 placed them.
    assert_eq!(one.ring_offset, mb.geometry().arena_offset);
    assert_eq!(one.slots_offset, host_slots_offset(one.ring_offset));
    assert_eq!(fanin_region_bytes(24, 64, 1), fanin_slot_bytes(24, 64));
    assert_eq!(next.ring_offset, (one.slots_offset + 4096 + 64 * 64).div_ceil(128) * 128);
    // Its binding: the LL slots past the owner table, the protocol word bare.
    mb.slot(0).unwrap().bind("p", &[one.index]).unwrap();
    let b = mb.mesh_ctx(0, 0x7000_0000).unwrap().bindings[0];
    assert_eq!((b.protocol, b.slots), (PROTOCOL_FANIN, 0x7000_0000 + one.slots_offset + 4096));
    assert_eq!(one.shards(), Some(1));

    // The shard count: a power of two from 1 to 64 for protocol fanin; refused, naming the value and
    // the rule, otherwise; still refused above 1 for ll and index.
    for bad in [0, 3, 12, 128] {
        let e = mb.create_fanin("f", 8, 4, bad).unwrap_err().to_string();
        assert!(e.contains(&format!("{bad} shards: a fan-in channel has a power of two from 1 to 64")), "{e}");
        assert!(e.contains("\"f\""), "{e}");
    }
    for protocol in [Protocol::Ll, Protocol::Index] {
        let e = mb.create_channel_parts("x", 16, 4, Placement::Host, protocol, 2).unwrap_err().to_string();
        assert!(e.contains("parts 2: only a channel of protocol bulk"), "{e}");
    }
    let four = mb.create_fanin("four", 24, 64, 4).unwrap();
    let thirty_two = mb.create_fanin("thirty-two", 8, 2, 32).unwrap();
    assert_eq!((four.parts, four.shards(), thirty_two.shards()), (4, Some(4), Some(32)));
    assert_eq!(mb.channel("next").unwrap().shards(), None);

    // Four shards: the region holds shard 0 then three more, each a header page and a span.
    let span = fanin_shard_span(24, 64);
    assert_eq!(span, 8192);
    let after = mb.create_channel("after", 8, 4).unwrap();
    let end = four.slots_offset + span + 3 * (4096 + span);
    assert_eq!(fanin_region_bytes(24, 64, 4), end - four.slots_offset);
    assert_eq!(after.ring_offset, (thirty_two.slots_offset + fanin_region_bytes(8, 2, 32)).div_ceil(128) * 128);
    assert!(thirty_two.ring_offset >= end);
    // The binding: shard 0's LL slots, the shard count above the protocol.
    mb.slot(1).unwrap().bind("p", &[four.index, thirty_two.index]).unwrap();
    let ctx = mb.mesh_ctx(1, 0x7000_0000).unwrap();
    let (b, b32) = (ctx.bindings[0], ctx.bindings[1]);
    assert_eq!((b.protocol, b.slots), (PROTOCOL_FANIN | 4 << 16, 0x7000_0000 + four.slots_offset + 4096));
    assert_eq!((b.msg_size, b.capacity), (24, 64), "per shard");
    assert_eq!(b32.protocol, PROTOCOL_FANIN | 32 << BINDING_PARTS_SHIFT);
    assert_eq!(binding_protocol(PROTOCOL_GROUP, 5), PROTOCOL_GROUP, "a group's word is its entries, never shards");

    // Every shard's cursor and tail where the layout says, in the file: senders of slots 0..8 send
    // 1 + slot requests each into shard slot % 4.
    for slot in 0..8u16 {
        let id = ClientId::new(slot, 1);
        let mut tx = FanInSender::open(&mb, "four", id).unwrap();
        assert_eq!(tx.shard(), u32::from(slot % 4));
        for k in 0..=u64::from(slot) {
            assert!(tx.try_send(&request(k, id)[..16]).unwrap());
        }
    }
    let mut rx = FanInReceiver::claim(&mb, "four").unwrap();
    let mut buf = [0u8; 24];
    for _ in 0..3 {
        assert!(rx.try_take(&mut buf).unwrap().is_some());
    }
    let file = std::fs::File::open(&path).unwrap();
    let word = |off: u64| {
        let mut w = [0u8; 8];
        file.read_exact_at(&mut w, off).unwrap();
        u64::from_le_bytes(w)
    };
    for k in 0..4u32 {
        let header = if k == 0 { four.ring_offset } else { four.slots_offset + fanin_shard_offset(k, 24, 64) };
        let sent = u64::from(k + 1) + u64::from(k + 5);
        let taken = u64::from(k < 3);
        assert_eq!((word(header), word(header + 128)), (sent, taken), "shard {k}'s cursor and tail");
    }
    assert_eq!(rx.positions(), [1, 1, 1, 0], "round-robin from shard 0");
    let info = mb.channel("four").unwrap();
    assert_eq!((info.head, info.tail), (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8, 3), "the sums over the shards");
    // Reopened: every descriptor validates, shards included.
    assert_eq!(Mailbox::open(&path).unwrap().channel("four").unwrap().parts, 4);
    // A shard count a build cannot have written is refused at open, naming the channel and the rule.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&3u32.to_le_bytes(), mb.geometry().channels_offset + u64::from(four.index) * 128 + 92).unwrap();
    let e = Mailbox::open(&path).unwrap_err().to_string();
    assert!(e.contains("3 shards: a fan-in channel has a power of two from 1 to 64"), "{e}");
}

/// 64 shards, the most (one GPU warp serves 32, so 64 are two warps' parts): 64 senders, one a shard,
/// each request taken once from its sender's shard, every shard's position moved by one.
#[test]
fn sixty_four_shards_take_a_request_from_each_sender_in_its_own_shard() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    let info = mb.create_fanin("wide", 16, 4, 64).unwrap();
    assert_eq!((info.parts, info.shards()), (64, Some(64)));
    mb.slot(0).unwrap().bind("p", &[info.index]).unwrap();
    assert_eq!(mb.mesh_ctx(0, 0).unwrap().bindings[0].protocol, PROTOCOL_FANIN | 64 << BINDING_PARTS_SHIFT);
    for slot in 0..64u16 {
        let id = ClientId::new(slot, 1);
        let mut tx = FanInSender::open(&mb, "wide", id).unwrap();
        assert_eq!(tx.shard(), u32::from(slot));
        assert!(tx.try_send(&request(u64::from(slot), id)).unwrap());
    }
    let mut rx = FanInReceiver::claim(&mb, "wide").unwrap();
    assert_eq!(rx.shards(), 64);
    let mut buf = [0u8; 16];
    let mut seen = vec![false; 64];
    while let Some((shard, taken)) = rx.try_take_shard(&mut buf).unwrap() {
        let Taken::Message { sender } = taken else { panic!("shard {shard}: a skip, none was cut off") };
        let (k, id, _) = parse_request(&buf);
        assert_eq!((id, u32::from(ClientId(sender).slot()), k), (sender, shard, u64::from(shard)), "shard {shard}");
        assert!(!std::mem::replace(&mut seen[shard as usize], true), "shard {shard} taken twice");
    }
    assert!(seen.iter().all(|s| *s), "every shard's request taken: {seen:?}");
    assert_eq!(rx.positions(), vec![1; 64]);
}

#[test]
fn eight_client_threads_over_four_shards_and_a_server_thread() {
    const N: u64 = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    mb.create_fanin("svc", 16, 16, 4).unwrap();
    mb.create_group("svc.r", 8, 16, 8).unwrap();
    let mut meshd = ServiceOwner::open(&mb, "svc", "svc.r").unwrap();
    assert_eq!(meshd.shards(), 4);
    let ids: Vec<ClientId> = (0..8).map(|_| meshd.connect(Holder::current()).unwrap()).collect();
    let server = {
        let mb = Mailbox::open(mb.path()).unwrap();
        std::thread::spawn(move || {
            let (mut rx, mut srv) =
                (FanInReceiver::claim(&mb, "svc").unwrap(), GroupServer::claim(&mb, "svc.r").unwrap());
            assert_eq!(rx.shards(), 4);
            run_server(&mut rx, &mut srv, 8)
        })
    };
    let clients: Vec<_> = ids
        .iter()
        .map(|&id| {
            let mb = mb.clone();
            std::thread::spawn(move || {
                let mut tx = FanInSender::open(&mb, "svc", id).unwrap();
                let mut rx = GroupClient::claim(&mb, "svc.r", id).unwrap();
                run_client(&mut tx, &mut rx, N, 4, |_| {});
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (counts, skips) = server.join().unwrap();
    assert!(skips.is_empty(), "no client died: {skips:?}");
    for id in &ids {
        assert_eq!(counts[&id.0], N, "every request of {id:?} taken once, in order");
    }
    assert_eq!(meshd.repair(), 0);
    assert!(meshd.stall_probe().holds().is_empty());
    for &id in &ids {
        assert_eq!(meshd.detach(id).unwrap(), Default::default());
    }
}

// ---- Between processes: the test binary re-runs itself as the child (see tests/processes.rs). ----

const ROLE: &str = "MESH_SHM_SERVICE_ROLE";
const PATH: &str = "MESH_SHM_SERVICE_PATH";
const COUNT: &str = "MESH_SHM_SERVICE_COUNT";
const CHILD_TEST: &str = "a_service_runs_between_processes_and_a_client_killed_mid_stream_is_replaced";

/// Re-runs this test binary as `role`; a client reads its id from stdin (meshd binds it after the
/// spawn, with the child's pid as its holder).
fn spawn_child(role: &str, path: &std::path::Path, count: u64) -> Child {
    spawn_child_out(role, path, count, Stdio::null())
}

fn spawn_child_out(role: &str, path: &std::path::Path, count: u64, stdout: Stdio) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PATH, path)
        .env(COUNT, count.to_string())
        .stdin(Stdio::piped())
        .stdout(stdout)
        .spawn()
        .unwrap()
}

fn give_id(child: &mut Child, id: ClientId) {
    child.stdin.take().unwrap().write_all(&id.0.to_le_bytes()).unwrap();
}

/// The child side; returns false in the parent.
fn child_role() -> bool {
    let Ok(role) = std::env::var(ROLE) else { return false };
    let mb = Mailbox::open(std::env::var(PATH).unwrap()).unwrap();
    let count: u64 = std::env::var(COUNT).unwrap().parse().unwrap();
    match role.as_str() {
        "server" => {
            let (mut rx, mut srv) =
                (FanInReceiver::claim(&mb, "svc").unwrap(), GroupServer::claim(&mb, "svc.r").unwrap());
            let (counts, skips) = run_server(&mut rx, &mut srv, count as usize);
            assert!(skips.len() <= 1, "one client died: at most one skip, {skips:?}");
            assert_eq!(counts.len(), 4, "two steady clients, the victim and its replacement: {counts:?}");
            eprintln!("server: {counts:?}, skips {skips:?}");
        }
        "client" => {
            let mut word = [0u8; 4];
            std::io::stdin().read_exact(&mut word).unwrap();
            let id = ClientId(u32::from_le_bytes(word));
            let mut tx = FanInSender::open(&mb, "svc", id).unwrap();
            let mut rx = GroupClient::claim(&mb, "svc.r", id).unwrap();
            // Says when it is well under way (the victim's parent waits for that before the kill).
            let mut out = std::io::stdout();
            run_client(&mut tx, &mut rx, count, 4, |got| {
                if got == 1000 {
                    out.write_all(b"streaming\n").unwrap();
                    out.flush().unwrap();
                }
            });
        }
        other => panic!("unknown role {other}"),
    }
    true
}

fn wait_ok(mut child: Child, what: &str) {
    let status = child.wait().unwrap();
    assert!(status.success(), "{what} failed: {status}");
}

#[test]
fn a_service_runs_between_processes_and_a_client_killed_mid_stream_is_replaced() {
    if child_role() {
        return;
    }
    const N: u64 = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb = Mailbox::create(&path, &small(), CreateMode::Exclusive).unwrap();
    mb.create_fanin("svc", 16, 64, 1).unwrap();
    mb.create_group("svc.r", 3, 16, 8).unwrap();
    let mut meshd = ServiceOwner::open(&mb, "svc", "svc.r").unwrap();
    // Byes: the two steady clients and the one that replaces the victim (the victim never says bye).
    let server = spawn_child("server", &path, 3);
    let bind = |meshd: &mut ServiceOwner, child: &mut Child| {
        let start = Instant::now();
        loop {
            // A holder of the child's pid (start time unknown: 0); retried while the server has not
            // yet acknowledged the departure that frees an entry.
            match meshd.connect(Holder { pid: child.id(), start: 0 }) {
                Ok(id) => {
                    give_id(child, id);
                    return id;
                }
                Err(e) => {
                    assert!(e.to_string().contains("not yet acknowledged"), "{e}");
                    assert!(start.elapsed() < LONG, "the server never acknowledged: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    };
    let mut steady: Vec<Child> = (0..2).map(|_| spawn_child("client", &path, N)).collect();
    for c in &mut steady {
        bind(&mut meshd, c);
    }
    let mut victim = spawn_child_out("client", &path, u64::MAX / 2, Stdio::piped());
    let victim_id = bind(&mut meshd, &mut victim);
    // Let it stream (1000 replies in), then kill it with -9 wherever it is (mid-send, perhaps).
    // (The test harness writes its own words first, on the same line.)
    let out = std::io::BufReader::new(victim.stdout.take().unwrap());
    assert!(out.lines().any(|l| l.unwrap().ends_with("streaming")), "the victim never streamed");
    std::thread::sleep(Duration::from_millis(5));
    victim.kill().unwrap();
    victim.wait().unwrap();
    // meshd's part (its pidfd would say so): complete its fan-in slots, then depart its entry.
    let done = meshd.depart_dead(victim_id).unwrap();
    assert!(done.skipped + done.finished <= 1 && done.stuck == 0, "{done:?}");
    assert!(meshd.entry(victim_id.slot()).unwrap().state == mesh_shm::group::EntryState::Departed);
    // A new client takes the victim's entry once the server has acknowledged (the only free one).
    let mut next = spawn_child("client", &path, N);
    let new_id = bind(&mut meshd, &mut next);
    assert_eq!(new_id.slot(), victim_id.slot(), "the victim's entry, reused");
    assert_eq!(new_id.epoch16(), victim_id.epoch16() + 1);
    for c in steady {
        wait_ok(c, "a steady client");
    }
    wait_ok(next, "the replacing client");
    wait_ok(server, "the server");
    let info = mb.channel("svc").unwrap();
    assert_eq!(info.consumer_pid, None, "the server's claim went with it");
}
