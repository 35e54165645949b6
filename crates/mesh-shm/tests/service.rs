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
use mesh_shm::layout::{PROTOCOL_FANIN, PROTOCOL_GROUP, fanin_slot_bytes, group_bytes, host_slots_offset};
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
    let start = Instant::now();
    while got < n {
        if sent < n && sent - got < window && tx.try_send(&request(sent, id)).unwrap() {
            sent += 1;
        }
        if rx.try_recv(&mut buf).unwrap() {
            assert_eq!(buf, reply_to(got, id.0), "client {id:?}: reply {got} is not f({id:?}, {got})");
            got += 1;
            on_reply(got);
        }
        assert!(start.elapsed() < LONG, "client {id:?} stuck at {sent} sent, {got} replies");
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
    let start = Instant::now();
    while done < byes {
        assert!(start.elapsed() < LONG, "server stuck: {done} byes of {byes}, {next:?}");
        // Acknowledged as returned. A departed sender's state is kept: its requests can still sit in
        // the fan-in ring after the ack (its id's epoch keeps them apart from its entry's next client).
        srv.departures().unwrap();
        match rx.try_take(&mut buf).unwrap() {
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
    let fanin = mb.create_fanin("kv", 24, 64).unwrap();
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
        (mb.create_fanin("f", 12, 4).unwrap_err(), "message size 12: must be a multiple of 8"),
        (mb.create_fanin("f", 8, 6).unwrap_err(), "capacity 6"),
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
        (mb.create_fanin("kv", 8, 4).unwrap_err(), "already exists"),
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
    mb.create_fanin("svc", 16, 64).unwrap();
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
    mb.create_fanin("svc", 16, 64).unwrap();
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
