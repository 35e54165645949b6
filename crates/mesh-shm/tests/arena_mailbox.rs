//! The ring arena through a real mailbox: what `arena_usage` reports, deleted channels' space reused and zeroed, and the refusals of a delete and of a create that does not fit.

use std::os::unix::fs::FileExt;
use std::time::Duration;

use mesh_shm::layout::{Header, LINE, ring_bytes_at};
use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Placement, Producer, ShmError};

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
    assert!(err.contains("deleted with its service"), "{err}");
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
    let full = mb.create_channel("more", 64, 256).unwrap_err().to_string();
    assert!(full.contains("mailbox full") && full.contains("needs") && full.contains("are free"), "{full}");
    for i in (0..n).step_by(2) {
        mb.delete_channel(&format!("r{i}"), false).unwrap();
    }
    let u = mb.arena_usage();
    assert!(u.free > 4 * u.largest_free, "{u:?}");
    assert_eq!(u.largest_free % LINE, 0);
    let err = mb.create_channel("big", 64, 1024).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ShmError::Full { .. }) && text.contains("fragmented:"), "{text}");
    assert!(text.contains("free in all") && text.contains("largest free run"), "{text}");
    // A ring the size of a hole still goes in one.
    mb.create_channel("fits", 64, 256).unwrap();
}
