//! The ring arena through a real mailbox: what `arena_usage` reports, deleted channels' and services' space reused and zeroed, the refusals of a delete and of a create that does not fit, and claims racing deletes.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mesh_shm::arena::Refusal;
use mesh_shm::claim::Holder;
use mesh_shm::layout::{Header, LINE, ring_bytes_at};
use mesh_shm::{
    BulkConsumer, BulkProducer, Consumer, CreateMode, FanInReceiver, FanInSender, GroupClient, GroupServer, Mailbox,
    MailboxConfig, Placement, Producer, Protocol, ServiceOwner, ShmError,
};

fn mailbox(dir: &tempfile::TempDir, size: u64) -> Mailbox {
    let config = MailboxConfig { size, slots: 4, channels: 32 };
    Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap()
}

/// The header's high-water mark, read from the file as an older reader would.
fn high_water(mb: &Mailbox) -> u64 {
    let mut word = [0u8; 8];
    let file = std::fs::File::open(mb.path()).unwrap();
    file.read_exact_at(&mut word, std::mem::offset_of!(Header, arena_used) as u64).unwrap();
    u64::from_le_bytes(word)
}

fn ring_end(mb: &Mailbox, name: &str) -> u64 {
    let c = mb.channel(name).unwrap();
    let bytes = ring_bytes_at(c.ring_offset, c.msg_size, c.capacity, c.placement.code(), c.protocol.code(), c.parts);
    c.ring_offset + bytes.unwrap()
}

#[test]
fn usage_counts_every_kind_of_ring() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    let g = mb.geometry();
    let empty = mb.arena_usage();
    assert_eq!((empty.in_use, empty.free, empty.largest_free), (0, g.arena_size, g.arena_size));
    assert_eq!((empty.descriptors_in_use, empty.descriptors_total), (0, 32));
    mb.create_channel("ll", 64, 16).unwrap();
    mb.create_channel_placed("dev", 64, 16, Placement::Device).unwrap();
    mb.create_fanin("fan", 64, 8, 2).unwrap();
    mb.create_group("grp", 3, 64, 4).unwrap();
    let names = ["ll", "dev", "fan", "grp"];
    let rings: u64 = names.iter().map(|n| ring_end(&mb, n) - mb.channel(n).unwrap().ring_offset).sum();
    let u = mb.arena_usage();
    assert_eq!(u.in_use, rings, "the live rings' bytes, the device ring's header included");
    assert_eq!(u.free, g.arena_size - rings);
    assert_eq!(u.largest_free, u.free, "nothing deleted: one free run, the arena's tail");
    assert_eq!(u.descriptors_in_use, 4);
    assert_eq!(high_water(&mb), rings, "the cursor older readers use is where the rings end");
}

#[test]
fn a_deleted_channels_space_and_name_are_reused_and_its_ring_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    mb.create_channel("a", 64, 64).unwrap();
    let b = mb.create_channel("b", 64, 64).unwrap();
    mb.create_channel("c", 8, 16).unwrap();
    let mark = high_water(&mb);
    let mut tx = Producer::claim(&mb, "b").unwrap();
    for i in 0..10u8 {
        tx.send(&[i + 1; 64], Duration::from_secs(1)).unwrap();
    }
    drop(tx);
    let err = mb.delete_channel("b", false).unwrap_err().to_string();
    assert!(err.contains("holds 10 message(s)") && err.contains("discard"), "{err}");
    assert_eq!(mb.delete_channel("b", true).unwrap(), 10, "the discarded messages are counted");
    assert!(matches!(mb.channel("b"), Err(ShmError::NoSuchChannel(_))));
    assert!(matches!(mb.delete_channel("b", true), Err(ShmError::NoSuchChannel(_))));
    // The same shape goes back where it was (best fit: the hole is exactly its size), and its
    // slots are zeroed: the old messages' LL tags would otherwise read as messages.
    let again = mb.create_channel("b2", 64, 64).unwrap();
    assert_eq!(again.ring_offset, b.ring_offset);
    assert_eq!(high_water(&mb), mark, "the high-water mark does not move for a reused hole");
    let mut rx = Consumer::claim(&mb, "b2").unwrap();
    let mut buf = [0u8; 64];
    assert!(!rx.try_recv(&mut buf).unwrap(), "a reused ring starts empty");
    // The name is free again, with another size; it goes past the live rings.
    let b = mb.create_channel("b", 8, 1024).unwrap();
    assert!(b.ring_offset >= ring_end(&mb, "c"));
    assert!(high_water(&mb) >= ring_end(&mb, "b") - mb.geometry().arena_offset);
    assert_eq!(mb.arena_usage().descriptors_in_use, 4);
}

#[test]
fn a_reused_bulk_or_index_ring_starts_empty_though_only_its_flags_and_indices_are_zeroed() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    let msg = 64 << 10;
    // A bulk ring written full, then deleted with its messages.
    let old = mb.create_channel_with("old", msg, 4, Placement::Host, Protocol::Bulk).unwrap();
    let mut tx = BulkProducer::claim(&mb, "old").unwrap();
    for i in 0..4u8 {
        tx.send(&vec![0xA0 | i; msg as usize], Duration::from_secs(1)).unwrap();
    }
    drop(tx);
    assert_eq!(mb.delete_channel("old", true).unwrap(), 4);
    let again = mb.create_channel_with("again", msg, 4, Placement::Host, Protocol::Bulk).unwrap();
    assert_eq!(again.ring_offset, old.ring_offset, "the same hole");
    let mut rx = BulkConsumer::claim(&mb, "again").unwrap();
    let mut buf = vec![0u8; msg as usize];
    assert!(!rx.try_recv(&mut buf).unwrap(), "its flags were zeroed: no stale message reads as sent");
    let mut tx = BulkProducer::claim(&mb, "again").unwrap();
    tx.send(&vec![7; msg as usize], Duration::from_secs(1)).unwrap();
    assert!(rx.try_recv(&mut buf).unwrap() && buf.iter().all(|&b| b == 7), "a new message is whole");
    assert!(!rx.try_recv(&mut buf).unwrap(), "and alone");
    drop((tx, rx));
    // An index ring: nothing in its slots says written; its head and tail start at zero.
    mb.delete_channel("again", true).unwrap();
    let idx = mb.create_channel_with("idx", 64, 16, Placement::Host, Protocol::Index).unwrap();
    assert_eq!(idx.ring_offset, old.ring_offset, "the same hole again");
    let mut rx = Consumer::claim(&mb, "idx").unwrap();
    let mut small = [0u8; 64];
    assert!(!rx.try_recv(&mut small).unwrap(), "a reused index ring starts empty");
}

#[test]
fn a_delete_is_refused_while_a_program_or_an_end_holds_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    let ch = mb.create_channel("held", 64, 16).unwrap();
    let tx = Producer::claim(&mb, "held").unwrap();
    let err = mb.delete_channel("held", true).unwrap_err().to_string();
    assert!(err.contains(&format!("pid {} holds its producer end", std::process::id())), "{err}");
    drop(tx);
    let slot = mb.slot(2).unwrap();
    slot.bind("prog", &[ch.index]).unwrap();
    let err = mb.delete_channel("held", true).unwrap_err().to_string();
    assert!(err.contains("slot 2 binds it"), "{err}");
    slot.release();
    mb.create_fanin("svc", 64, 8, 1).unwrap();
    let err = mb.delete_channel("svc", true).unwrap_err().to_string();
    assert!(err.contains("deleted with its service") && err.contains("use service delete \"svc\""), "{err}");
    assert_eq!(mb.delete_channel("held", false).unwrap(), 0);
    assert_eq!(mb.arena_usage().descriptors_in_use, 1);
}

#[test]
fn a_create_that_fits_in_all_but_in_no_run_says_fragmented() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 1 << 20);
    // Host rings of 256 LL slots of 64 bytes: 32 KiB of slots after a page holding the header,
    // fewer than the table's 32 descriptors fill the arena.
    let mut n = 0;
    while mb.create_channel(&format!("r{n}"), 64, 256).is_ok() {
        n += 1;
    }
    let full = mb.create_channel("more", 64, 256).unwrap_err();
    assert!(matches!(full, ShmError::Full { room: Some(Refusal::Full { .. }), .. }), "{full:?}");
    let full = full.to_string();
    assert!(full.contains("mailbox full: its ring needs") && full.contains("are free"), "{full}");
    for i in (0..n).step_by(2) {
        mb.delete_channel(&format!("r{i}"), false).unwrap();
    }
    let u = mb.arena_usage();
    assert!(u.free > 4 * u.largest_free, "{u:?}");
    assert_eq!(u.largest_free % LINE, 0);
    let err = mb.create_channel("big", 64, 1024).unwrap_err();
    let text = err.to_string();
    let Some(Refusal::Fragmented { asked, free, largest }) = (match err {
        ShmError::Full { room, .. } => room,
        _ => None,
    }) else {
        panic!("not refused as fragmented: {text}")
    };
    assert_eq!((free, largest), (u.free, u.largest_free), "the refusal's figures are arena_usage's");
    assert!(asked > largest && asked <= free, "{text}");
    assert!(text.starts_with("channel \"big\": mailbox fragmented: ") && !text.contains("mailbox full"), "{text}");
    assert!(text.contains("free in all") && text.contains("largest free run"), "{text}");
    // A ring the size of a hole still goes in one.
    mb.create_channel("fits", 64, 256).unwrap();
}

#[test]
fn a_full_channel_table_is_full_with_no_arena_figures() {
    let dir = tempfile::tempdir().unwrap();
    let config = MailboxConfig { size: 1 << 20, slots: 1, channels: 2 };
    let mb = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap();
    mb.create_channel("a", 8, 8).unwrap();
    mb.create_channel("b", 8, 8).unwrap();
    let err = mb.create_channel("c", 8, 8).unwrap_err();
    assert!(matches!(err, ShmError::Full { room: None, .. }), "{err:?}");
    assert!(err.to_string().contains("mailbox full: all 2 channel descriptors are in use"), "{err}");
}

/// Service `name`: its fan-in channel (2 shards) and its group of 4 clients.
fn service(mb: &Mailbox, name: &str) {
    mb.create_fanin(name, 64, 8, 2).unwrap();
    mb.create_group(&format!("{name}.replies"), 4, 64, 4).unwrap();
}

/// A process that has exited.
fn dead_holder() -> Holder {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let holder = Holder::of_pid(child.id());
    child.wait().unwrap();
    holder
}

fn refusal(r: mesh_shm::Result<u64>) -> String {
    match r {
        Err(e @ ShmError::ServiceRefused { .. }) => e.to_string(),
        other => panic!("not a service's refusal: {other:?}"),
    }
}

#[test]
fn a_service_is_deleted_whole_and_refused_while_anything_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    let me = std::process::id();
    mb.create_channel("plain", 8, 8).unwrap();
    let before = mb.arena_usage();
    service(&mb, "kv");
    assert!(matches!(mb.delete_service("nope", true), Err(ShmError::NoSuchService(n)) if n == "nope"));
    let err = refusal(mb.delete_service("plain", true));
    assert!(err.contains("not a service's fan-in channel") && err.contains("channel delete"), "{err}");
    for name in ["kv", "kv.replies"] {
        let err = mb.delete_channel(name, true).unwrap_err().to_string();
        assert!(err.contains("use service delete \"kv\""), "{name}: {err}");
    }

    // A program that binds the group.
    let slot = mb.slot(1).unwrap();
    slot.bind("prog", &[mb.channel("kv.replies").unwrap().index]).unwrap();
    assert!(refusal(mb.delete_service("kv", true)).contains("slot 1 binds it"));
    slot.release();
    // The server's two ends.
    let rx = FanInReceiver::claim(&mb, "kv").unwrap();
    assert!(refusal(mb.delete_service("kv", true)).contains(&format!("pid {me} holds the server's request end")));
    drop(rx);
    let server = GroupServer::claim(&mb, "kv.replies").unwrap();
    assert!(refusal(mb.delete_service("kv", true)).contains(&format!("pid {me} holds the server's reply end")));
    drop(server);
    // A live client, and its reply ring.
    let mut owner = ServiceOwner::open(&mb, "kv", "kv.replies").unwrap();
    let live = owner.connect(Holder::current()).unwrap();
    let client = GroupClient::claim(&mb, "kv.replies", live).unwrap();
    let err = refusal(mb.delete_service("kv", true));
    assert!(err.contains(&format!("pid {me}")) && err.contains("client slot 0"), "{err}");
    drop(client);
    let err = refusal(mb.delete_service("kv", true));
    assert!(err.contains(&format!("client slot 0 is bound to pid {me}, which is alive")), "{err}");

    // Queued: the live client's request, then a reply to a dead client still bound; the departed
    // client's reply is not counted (its entry's next connect drops it).
    FanInSender::open(&mb, "kv", live).unwrap().send(b"req", Duration::from_secs(1)).unwrap();
    let mut server = GroupServer::claim(&mb, "kv.replies").unwrap();
    server.reply(live, b"to the departed").unwrap();
    owner.detach(live).unwrap();
    let dead = owner.connect(dead_holder()).unwrap();
    server.reply(dead, b"to the dead").unwrap();
    drop(server);
    let err = refusal(mb.delete_service("kv", false));
    assert!(err.contains("holds 2 request(s) and unread reply(ies)") && err.contains("discard"), "{err}");
    assert_eq!(mb.delete_service("kv", true).unwrap(), 2, "one request and one reply discarded");
    assert!(matches!(mb.channel("kv"), Err(ShmError::NoSuchChannel(_))));
    assert!(matches!(mb.channel("kv.replies"), Err(ShmError::NoSuchChannel(_))));
    assert_eq!(mb.arena_usage(), before, "both rings' bytes and descriptors are free");
    assert!(matches!(mb.delete_service("kv", true), Err(ShmError::NoSuchService(_))));

    // The name is free at once, with other sizes.
    mb.create_fanin("kv", 128, 16, 1).unwrap();
    mb.create_group("kv.replies", 2, 128, 8).unwrap();
    assert_eq!(mb.delete_service("kv", false).unwrap(), 0);

    // Half a service: a fan-in channel without its group, and a group without its fan-in channel.
    mb.create_fanin("half", 64, 8, 1).unwrap();
    assert_eq!(mb.delete_service("half", false).unwrap(), 0);
    mb.create_group("other.replies", 2, 64, 4).unwrap();
    assert_eq!(mb.delete_service("other", false).unwrap(), 0);
    assert_eq!(mb.arena_usage(), before);
}

/// One thread claims a channel's producer end over and over while another deletes it and creates
/// it again in other sizes (so at other offsets): every claim that succeeds is on the live ring of
/// that name, and none leaves a claim word set anywhere once dropped.
#[test]
fn a_claim_racing_deletes_and_creates_never_holds_a_dead_ring() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    let me = std::process::id();
    let stop = AtomicBool::new(false);
    let (mut claimed, mut gone) = (0u32, 0u32);
    /// Stops the churning thread however the claiming one ends, a failed assertion included.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // A neighbour made and freed now and then moves where "x" lands.
                if i.is_multiple_of(3) {
                    let _ = mb.create_channel("pad", 8, 1 << (i % 7));
                }
                let _ = mb.create_channel("x", 64, 1 << (i % 5 + 1));
                let _ = mb.delete_channel("pad", true);
                let _ = mb.delete_channel("x", true);
                i += 1;
            }
        });
        let _stop = Stop(&stop);
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(2) || claimed < 20 || gone < 20 {
            assert!(t.elapsed() < Duration::from_secs(60), "{claimed} claims, {gone} refused as deleted");
            match Producer::claim(&mb, "x") {
                Ok(tx) => {
                    let now = mb.channel("x").expect("a claimed channel is never deleted");
                    assert_eq!((now.index, now.ring_offset), (tx.info().index, tx.info().ring_offset));
                    assert_eq!(now.capacity, tx.info().capacity, "the claim's ring is the live one");
                    assert_eq!(now.producer_pid, Some(me));
                    claimed += 1;
                }
                Err(ShmError::Deleted { channel, .. }) => {
                    assert_eq!(channel, "x");
                    gone += 1;
                }
                Err(ShmError::NoSuchChannel(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
    });
    println!("{claimed} claims held the live ring, {gone} were refused as deleted under them");
    for c in mb.channels().unwrap() {
        assert_eq!((c.producer_pid, c.consumer_pid), (None, None), "{} was left claimed", c.name);
    }
}
