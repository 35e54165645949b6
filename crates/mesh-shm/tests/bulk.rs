//! Bulk channels through the public API: streams of large messages between threads (every message sequence-numbered and checksummed), and damaged bulk descriptors.

use std::time::Duration;

use mesh_shm::layout::{ChannelDesc, bulk_slot_bytes};
use mesh_shm::{
    BulkConsumer, BulkProducer, CopyConfig, CreateMode, Mailbox, MailboxConfig, Placement, Protocol, ShmError,
};

const WAIT: Duration = Duration::from_secs(60);

fn mailbox(dir: &tempfile::TempDir, size: u64) -> Mailbox {
    Mailbox::create(dir.path().join("mb"), &MailboxConfig { size, slots: 2, channels: 8 }, CreateMode::Exclusive)
        .unwrap()
}

/// Message `seq` of `len` bytes: word 0 is `seq`, the words up to the last come from a generator
/// seeded by `seq`, the last is a checksum over every word before it and its position.
fn fill(buf: &mut [u8], seq: u64) {
    let words = buf.len() / 8;
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut sum = 0u64;
    for (k, w) in buf.chunks_exact_mut(8).enumerate().take(words - 1) {
        let v = if k == 0 {
            seq
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        w.copy_from_slice(&v.to_le_bytes());
        sum = sum.wrapping_add(v.wrapping_mul(2 * k as u64 + 1)).rotate_left(5);
    }
    buf[(words - 1) * 8..].copy_from_slice(&sum.to_le_bytes());
}

/// Whether `buf` is message `seq` whole: its sequence number, and the checksum over every word.
fn check(buf: &[u8], seq: u64) -> Result<(), String> {
    let words = buf.len() / 8;
    let word = |k: usize| u64::from_le_bytes(buf[k * 8..k * 8 + 8].try_into().unwrap());
    if word(0) != seq {
        return Err(format!("expected message {seq}, got {} (lost, repeated or reordered)", word(0)));
    }
    let mut sum = 0u64;
    for k in 0..words - 1 {
        sum = sum.wrapping_add(word(k).wrapping_mul(2 * k as u64 + 1)).rotate_left(5);
    }
    if sum != word(words - 1) {
        return Err(format!("message {seq}: checksum mismatch (torn or corrupted)"));
    }
    let mut expect = vec![0u8; buf.len()];
    fill(&mut expect, seq);
    if expect != buf {
        return Err(format!("message {seq}: a byte differs from what was sent"));
    }
    Ok(())
}

/// Streams `count` messages of `size` bytes from a producer thread to this thread, through a ring
/// of `capacity`, and checks each. `in_place`: the ends write and read the slots themselves.
fn stream(size: u32, capacity: u32, count: u64, config: CopyConfig, in_place: bool) {
    let dir = tempfile::tempdir().unwrap();
    let need = bulk_slot_bytes(size, capacity, 1) + (1 << 20);
    let mb = mailbox(&dir, need);
    let info = mb.create_channel("big", size, capacity).unwrap();
    assert_eq!(info.protocol, if size > 65536 { Protocol::Bulk } else { Protocol::Ll });
    if info.protocol != Protocol::Bulk {
        mb.create_channel_with("bulk", size, capacity, Placement::Host, Protocol::Bulk).unwrap();
    }
    let name = if info.protocol == Protocol::Bulk { "big" } else { "bulk" };
    let mut tx = BulkProducer::claim_with(&mb, name, config).unwrap();
    let mut rx = BulkConsumer::claim_with(&mb, name, config).unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut msg = vec![0u8; size as usize];
            for seq in 0..count {
                if in_place {
                    let deadline = std::time::Instant::now() + WAIT;
                    while !tx.try_send_with(|slot| fill(slot, seq)).unwrap() {
                        assert!(std::time::Instant::now() < deadline, "no room for {WAIT:?}");
                        std::thread::yield_now();
                    }
                } else {
                    fill(&mut msg, seq);
                    tx.send(&msg, WAIT).unwrap();
                }
            }
        });
        let mut out = vec![0u8; size as usize];
        for seq in 0..count {
            if in_place {
                let deadline = std::time::Instant::now() + WAIT;
                loop {
                    if let Some(r) = rx.try_recv_with(|msg| check(msg, seq)).unwrap() {
                        r.unwrap();
                        break;
                    }
                    assert!(std::time::Instant::now() < deadline, "nothing for {WAIT:?}");
                    std::thread::yield_now();
                }
            } else {
                rx.recv(&mut out, WAIT).unwrap();
                check(&out, seq).unwrap();
            }
        }
        assert!(!rx.try_recv(&mut out).unwrap(), "nothing past the last message");
    });
    let info = mb.channel(name).unwrap();
    assert_eq!((info.head, info.tail), (count, count));
}

#[test]
fn streams_of_64_kib_messages_wrap_the_ring_intact() {
    stream(64 << 10, 4, 300, CopyConfig::default(), false);
}

#[test]
fn streams_of_1_mib_messages_with_helper_threads_and_streaming_stores() {
    let config = CopyConfig { threads: 3, min_part: 64 << 10, non_temporal: true };
    stream(1 << 20, 4, 40, config, false);
}

#[test]
fn streams_of_16_mib_messages_in_place() {
    stream(16 << 20, 2, 5, CopyConfig::default(), true);
}

#[test]
fn streams_of_odd_sizes_and_tiny_rings() {
    // 80 KiB + 16: not a multiple of a page, a cache line's worth of tail; capacity 1 alternates.
    stream((80 << 10) + 16, 1, 50, CopyConfig { threads: 2, min_part: 4096, non_temporal: true }, false);
    stream(4096, 2, 500, CopyConfig::default(), true);
}

#[test]
fn ends_resume_where_the_last_ones_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    mb.create_channel("big", 128 << 10, 4).unwrap();
    let mut msg = vec![0u8; 128 << 10];
    {
        let mut tx = BulkProducer::claim(&mb, "big").unwrap();
        for seq in 0..3 {
            fill(&mut msg, seq);
            assert!(tx.try_send(&msg).unwrap());
        }
    }
    {
        let mut rx = BulkConsumer::claim(&mb, "big").unwrap();
        rx.recv(&mut msg, WAIT).unwrap();
        check(&msg, 0).unwrap();
    }
    let mut tx = BulkProducer::claim(&mb, "big").unwrap();
    let mut rx = BulkConsumer::claim(&mb, "big").unwrap();
    for seq in 3..5 {
        fill(&mut msg, seq);
        assert!(tx.try_send(&msg).unwrap());
    }
    assert!(!tx.try_send(&msg).unwrap(), "4 in flight: full");
    for seq in 1..5 {
        rx.recv(&mut msg, WAIT).unwrap();
        check(&msg, seq).unwrap();
    }
}

#[test]
fn wrong_sizes_and_ends_are_refused_naming_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 4 << 20);
    mb.create_channel_with("b", 4096, 2, Placement::Host, Protocol::Bulk).unwrap();
    let mut tx = BulkProducer::claim(&mb, "b").unwrap();
    match tx.try_send(&[0; 4097]) {
        Err(ShmError::MessageSize { size: 4096, got: 4097, .. }) => {}
        other => panic!("expected MessageSize, got {other:?}"),
    }
    let mut rx = BulkConsumer::claim(&mb, "b").unwrap();
    assert!(matches!(rx.try_recv(&mut [0; 16]), Err(ShmError::MessageSize { got: 16, .. })));
    let e = BulkProducer::claim(&mb, "b").unwrap_err().to_string();
    assert!(e.contains("already claimed"), "{e}");
    let e = rx.recv(&mut [0; 4096], Duration::from_millis(1)).unwrap_err().to_string();
    assert!(e.contains("timed out"), "{e}");
    mb.create_channel_with("d", 4096, 2, Placement::Device, Protocol::Bulk).unwrap();
    let e = BulkConsumer::claim(&mb, "d").unwrap_err().to_string();
    assert!(e.contains("device memory"), "{e}");
}

/// The descriptor of the first channel in a mailbox's bytes.
fn desc_offset(mb: &Mailbox) -> usize {
    usize::try_from(mb.geometry().channels_offset).unwrap()
}

#[test]
fn damaged_bulk_descriptors_are_refused_on_open() {
    use core::mem::offset_of;
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir, 1 << 20);
    let info = mb.create_channel_with("b", 64 << 10, 4, Placement::Host, Protocol::Bulk).unwrap();
    assert_eq!(info.slots_offset % 4096, 0);
    let d = desc_offset(&mb);
    drop(mb);
    let good = std::fs::read(dir.path().join("mb")).unwrap();
    let reopen = |bytes: &[u8]| {
        let path = dir.path().join("damaged");
        std::fs::write(&path, bytes).unwrap();
        Mailbox::open(&path)
    };
    assert_eq!(reopen(&good).unwrap().channel("b").unwrap().protocol, Protocol::Bulk);
    let put32 = |bytes: &mut Vec<u8>, off: usize, v: u32| bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
    for (field, value, says) in [
        (offset_of!(ChannelDesc, protocol), 7, "protocol 7"),
        (offset_of!(ChannelDesc, msg_size), 24, "multiple of 16"),
        (offset_of!(ChannelDesc, msg_size), 32 << 20, "16 MiB"),
        // 1 MiB x 4 of payload: more than the file holds.
        (offset_of!(ChannelDesc, msg_size), 1 << 20, "arena"),
        (offset_of!(ChannelDesc, capacity), 1 << 20, "arena"),
    ] {
        let mut bad = good.clone();
        put32(&mut bad, d + field, value);
        match reopen(&bad) {
            Err(ShmError::Invalid { field: "channel table", reason, .. }) => assert!(reason.contains(says), "{reason}"),
            other => panic!("{value} at {field}: expected Invalid channel table, got {other:?}"),
        }
    }
}
