//! The mailbox through its public API in one process: creation rules, channels, claims, slots and the kernel context.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use mesh_shm::layout::{MAX_BINDINGS, NO_CHANNEL, STATE_IDLE};
use mesh_shm::{Consumer, CreateMode, End, Mailbox, MailboxConfig, Producer, ShmError};

fn small() -> MailboxConfig {
    MailboxConfig { size: 1 << 20, slots: 8, channels: 16 }
}

#[test]
fn create_is_exclusive_private_and_zeroed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb = Mailbox::create(&path, &small(), CreateMode::Exclusive).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 1 << 20);
    assert!(mb.channels().unwrap().is_empty());
    match Mailbox::create(&path, &small(), CreateMode::Exclusive) {
        Err(ShmError::Exists { path: p }) => assert_eq!(p, path),
        other => panic!("expected Exists, got {other:?}"),
    }
    mb.create_channel("a", 8, 4).unwrap();
    let again = Mailbox::create(&path, &small(), CreateMode::Replace).unwrap();
    assert!(again.channels().unwrap().is_empty(), "replace starts from an empty file");
}

#[test]
fn bad_configs_are_refused_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let err = Mailbox::create(
        dir.path().join("x"),
        &MailboxConfig { size: 8192, slots: 8, channels: 16 },
        CreateMode::Exclusive,
    )
    .unwrap_err();
    assert!(err.to_string().contains("size 8192"), "{err}");
    assert!(!dir.path().join("x").exists(), "a refused create leaves no file");
    let err = Mailbox::create(dir.path().join("y"), &MailboxConfig { slots: 0, ..small() }, CreateMode::Exclusive)
        .unwrap_err();
    assert!(err.to_string().contains("0 program slots"), "{err}");
}

#[test]
fn channels_are_validated_named_and_found_by_other_mappings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb = Mailbox::create(&path, &small(), CreateMode::Exclusive).unwrap();
    for (size, cap, why) in
        [(12, 4, "multiple of 8"), (0, 4, "multiple of 8"), (8, 3, "power of two"), (8, 0, "power of two")]
    {
        let err = mb.create_channel("c", size, cap).unwrap_err();
        assert!(err.to_string().contains(why), "{size}/{cap}: {err}");
    }
    assert!(mb.create_channel("", 8, 4).unwrap_err().to_string().contains("name"));
    assert!(mb.create_channel(&"n".repeat(49), 8, 4).is_err());
    let a = mb.create_channel("alpha", 64, 1024).unwrap();
    assert!(matches!(mb.create_channel("alpha", 8, 4), Err(ShmError::ChannelExists(n)) if n == "alpha"));
    let other = Mailbox::open(&path).unwrap();
    let seen = other.channel("alpha").unwrap();
    assert_eq!((seen.index, seen.msg_size, seen.capacity, seen.ring_offset), (a.index, 64, 1024, a.ring_offset));
    assert!(matches!(other.channel("beta"), Err(ShmError::NoSuchChannel(_))));
}

#[test]
fn arena_and_table_exhaustion_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(
        dir.path().join("mb"),
        &MailboxConfig { size: 64 << 10, slots: 1, channels: 2 },
        CreateMode::Exclusive,
    )
    .unwrap();
    let err = mb.create_channel("huge", 1024, 1024).unwrap_err();
    assert!(matches!(err, ShmError::Full { .. }) && err.to_string().contains("bytes"), "{err}");
    mb.create_channel("a", 8, 8).unwrap();
    mb.create_channel("b", 8, 8).unwrap();
    let err = mb.create_channel("c", 8, 8).unwrap_err();
    assert!(err.to_string().contains("all 2 channel descriptors"), "{err}");
}

#[test]
fn ends_are_claimed_once_and_freed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    mb.create_channel("ch", 8, 4).unwrap();
    let p = Producer::claim(&mb, "ch").unwrap();
    match Producer::claim(&mb, "ch") {
        Err(ShmError::Claimed { end: End::Producer, pid, .. }) => assert_eq!(pid, std::process::id()),
        other => panic!("expected Claimed, got {other:?}"),
    }
    let c = Consumer::claim(&mb, "ch").unwrap();
    assert_eq!(mb.channel("ch").unwrap().producer_pid, Some(std::process::id()));
    drop(p);
    assert_eq!(mb.channel("ch").unwrap().producer_pid, None);
    let _p = Producer::claim(&mb, "ch").unwrap();
    drop(c);
}

#[test]
fn send_recv_with_deadlines_batches_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    mb.create_channel("ch", 16, 4).unwrap();
    let mut p = Producer::claim(&mb, "ch").unwrap();
    let mut c = Consumer::claim(&mb, "ch").unwrap();
    let mut out = [0u8; 16];
    let err = c.recv(&mut out, Duration::from_millis(20)).unwrap_err();
    assert!(matches!(err, ShmError::Timeout { op: "recv", .. }), "{err}");
    assert!(matches!(p.try_send(&[0; 17]), Err(ShmError::MessageSize { size: 16, got: 17, .. })));
    assert!(matches!(c.try_recv(&mut [0; 8]), Err(ShmError::MessageSize { .. })));
    let batch: Vec<u8> = (0u8..6).flat_map(|i| [i; 16]).collect();
    assert_eq!(p.try_send_batch(&batch).unwrap(), 4, "a 4-slot ring takes 4 of 6");
    let err = p.send(b"x", Duration::from_millis(20)).unwrap_err();
    assert!(matches!(err, ShmError::Timeout { op: "send", .. }), "{err}");
    let mut many = [0u8; 16 * 8];
    assert_eq!(c.recv_batch(&mut many, Duration::from_secs(1)).unwrap(), 4);
    assert_eq!(&many[..64], &batch[..64]);
    p.send_batch(&batch[64..], Duration::from_secs(1)).unwrap();
    c.recv(&mut out, Duration::from_secs(1)).unwrap();
    assert_eq!(out, [4; 16]);
    let info = mb.channel("ch").unwrap();
    assert_eq!((info.head, info.tail), (6, 5));
}

#[test]
fn slots_carry_control_status_and_the_kernel_context() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    let a = mb.create_channel("in", 8, 16).unwrap();
    let b = mb.create_channel("out", 32, 8).unwrap();
    let slot = mb.slot(3).unwrap();
    assert!(!slot.in_use());
    slot.bind("echo", &[a.index, b.index]).unwrap();
    slot.arm(7);
    assert!(slot.in_use() && !slot.stop_requested());
    assert_eq!(slot.generation(), 7);
    assert_eq!(slot.status().state, STATE_IDLE);
    slot.request_stop();
    assert!(slot.stop_requested());
    let ctx = mb.mesh_ctx(3, 0x7000_0000).unwrap();
    assert_eq!((ctx.base, ctx.slot, ctx.binding_count), (0x7000_0000, 3, 2));
    assert_eq!(ctx.slot_offset, slot.offset());
    assert_eq!(
        (ctx.bindings[0].ring_offset, ctx.bindings[0].msg_size, ctx.bindings[0].capacity),
        (a.ring_offset, 8, 16)
    );
    assert_eq!((ctx.bindings[1].ring_offset, ctx.bindings[1].msg_size), (b.ring_offset, 32));
    assert_eq!(ctx.bindings[2].ring_offset, 0, "unused bindings are zero");
    assert!(matches!(mb.slot(8), Err(ShmError::NoSuchSlot { index: 8, count: 8 })));
    assert!(matches!(slot.bind("x", &[0; MAX_BINDINGS + 1]), Err(ShmError::TooManyBindings { .. })));
    slot.bind("bad", &[NO_CHANNEL - 1]).unwrap();
    assert!(mb.mesh_ctx(3, 0).is_err(), "a binding to no live channel is refused");
}
