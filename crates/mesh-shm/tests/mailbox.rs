//! The mailbox through its public API in one process: creation rules, channels, claims, slots and the kernel context.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use mesh_shm::layout::{MAX_BINDINGS, NO_CHANNEL, STATE_IDLE};
use mesh_shm::{Consumer, CreateMode, End, Mailbox, MailboxConfig, Placement, Producer, ShmError};

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
    // Names are printed in tables and listed in `--bind a,b`: no control characters, spaces or commas.
    for bad in ["a,b", "c\u{1}h", "two words", "nl\nname", "tab\t"] {
        let err = mb.create_channel(bad, 8, 4).unwrap_err().to_string();
        assert!(err.contains("control characters, spaces or commas"), "{bad:?}: {err}");
    }
    assert!(mb.create_channel("ok-name_1.replies/x", 8, 4).is_ok(), "punctuation other than a comma is a name");
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
    assert_eq!(slot.name(), "echo");
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
    assert_eq!(slot.name(), "bad", "a shorter name leaves none of the longer one behind");
    assert!(mb.mesh_ctx(3, 0).is_err(), "a binding to no live channel is refused");
}

#[test]
fn host_slots_start_on_a_page_and_the_binding_gives_their_device_address() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    let a = mb.create_channel("a", 8, 16).unwrap();
    let b = mb.create_channel("b", 256, 64).unwrap();
    for c in [&a, &b] {
        assert_eq!(c.placement, Placement::Host);
        assert_eq!(c.slots_offset % 4096, 0, "{}: slots at {}", c.name, c.slots_offset);
        assert!(c.slots_offset >= c.ring_offset + 384, "the slots follow the ring's header");
    }
    assert!(b.ring_offset >= a.slots_offset + 2 * 8 * 16, "rings do not overlap");
    let slot = mb.slot(0).unwrap();
    slot.bind("p", &[a.index, b.index]).unwrap();
    let ctx = mb.mesh_ctx(0, 0x7000_0000).unwrap();
    assert_eq!(ctx.bindings[1].slots, 0x7000_0000 + b.slots_offset);
    assert_eq!(ctx.bindings[1].placement, mesh_shm::layout::PLACEMENT_HOST);
    assert_eq!((ctx.stop_due, ctx.stop_seen), (0, 0), "the kernel's own stop-check state starts at zero");
    // Messages still go through, in a reopened file too.
    Producer::claim(&mb, "b").unwrap().send(&[7; 256], Duration::from_secs(1)).unwrap();
    let again = Mailbox::open(mb.path()).unwrap();
    let mut out = [0u8; 256];
    Consumer::claim(&again, "b").unwrap().recv(&mut out, Duration::from_secs(1)).unwrap();
    assert_eq!(out, [7; 256]);
}

#[test]
fn a_device_channel_is_for_gpu_programs_only() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    let before = mb.create_channel("host", 8, 4).unwrap();
    let d = mb.create_channel_placed("dev", 4096, 1024, Placement::Device).unwrap();
    assert_eq!((d.placement, d.slots_offset), (Placement::Device, 0));
    let after = mb.create_channel("after", 8, 4).unwrap();
    assert!(after.ring_offset - d.ring_offset < 4096, "a device ring takes only its header from the arena");
    assert!(d.ring_offset > before.ring_offset);
    // A host process is refused either end, with the reason.
    for e in [Producer::claim(&mb, "dev").unwrap_err(), Consumer::claim(&mb, "dev").unwrap_err()] {
        assert!(matches!(e, ShmError::DevicePlacement { .. }), "{e}");
        assert!(e.to_string().contains("device memory") && e.to_string().contains("--placement host"), "{e}");
    }
    // No claim was left behind by the refusal.
    assert_eq!(mb.channel("dev").unwrap().producer_pid, None);
    // The kernel context needs the ring's address in the launching context.
    let slot = mb.slot(1).unwrap();
    slot.bind("p", &[before.index, d.index]).unwrap();
    assert!(matches!(mb.mesh_ctx(1, 0x7000_0000), Err(ShmError::NoDeviceRing { .. })));
    let ctx = mb.mesh_ctx_with(1, 0x7000_0000, |c| (c.name == "dev").then_some(0x9_0000_0000)).unwrap();
    assert_eq!((ctx.bindings[1].slots, ctx.bindings[1].placement), (0x9_0000_0000, mesh_shm::layout::PLACEMENT_DEVICE));
    assert_eq!(ctx.bindings[0].slots, 0x7000_0000 + before.slots_offset);
    // A reopened mailbox keeps the placement.
    let again = Mailbox::open(mb.path()).unwrap();
    assert_eq!(again.channel("dev").unwrap().placement, Placement::Device);
}

#[test]
fn a_renewed_device_ring_reports_what_its_indices_still_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    let d = mb.create_channel_placed("dev", 64, 16, Placement::Device).unwrap();
    assert_eq!(mb.renew_device_ring(&d).unwrap(), 0, "a new ring lost nothing");
    // A GPU producer published head 12, its consumer tail 5: 7 messages were in the slots.
    let (base, _) = mb.as_raw_parts();
    let ring = usize::try_from(d.ring_offset).unwrap();
    // SAFETY: the ring's header lies inside the mapping; head and tail are 8-aligned words.
    unsafe {
        (base.add(ring) as *mut u64).write_volatile(12);
        (base.add(ring + 128) as *mut u64).write_volatile(5);
    }
    assert_eq!(mb.renew_device_ring(&d).unwrap(), 7);
    let now = mb.channel("dev").unwrap();
    assert_eq!((now.head, now.tail), (12, 12), "both ends resume on an empty ring");
    assert_eq!(now.lost, 7, "the loss is kept in the mailbox for info and ps");
    assert_eq!(mb.renew_device_ring(&now).unwrap(), 0);
    assert_eq!(Mailbox::open(mb.path()).unwrap().channel("dev").unwrap().lost, 7, "and survives a reopen");
    let host = mb.create_channel("host", 8, 4).unwrap();
    assert!(mb.renew_device_ring(&host).is_err(), "a host channel's slots are never renewed");
}

#[test]
fn an_index_channel_holds_payloads_alone_between_host_ends_and_no_program_binds_it() {
    use mesh_shm::{BulkConsumer, BulkProducer, Protocol};
    let dir = tempfile::tempdir().unwrap();
    let mb = Mailbox::create(dir.path().join("mb"), &small(), CreateMode::Exclusive).unwrap();
    let i = mb.create_channel_with("i", 8, 16, Placement::Host, Protocol::Index).unwrap();
    let after = mb.create_channel("after", 8, 4).unwrap();
    assert_eq!(i.protocol, Protocol::Index);
    assert_eq!(after.ring_offset, i.slots_offset + 8 * 16, "the ring takes its payloads alone: 8 B a message");
    // Sizes and a placement it does not take, each refused naming the value and the rule.
    for (size, capacity, placement, says) in [
        (12, 4, Placement::Host, "message size 12: must be a multiple of 8 from 8 to 65536 for protocol index"),
        (128 << 10, 4, Placement::Host, "message size 131072"),
        (8, 6, Placement::Host, "capacity 6"),
        (8, 4, Placement::Device, "protocol index is for two host processes"),
    ] {
        let e = mb.create_channel_with("bad", size, capacity, placement, Protocol::Index).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
    // Host ends: Producer/Consumer as for LL; the bulk ends refuse, naming the format.
    let mut tx = Producer::claim(&mb, "i").unwrap();
    let e = BulkProducer::claim(&mb, "i").unwrap_err().to_string();
    assert!(e.contains("index format") && e.contains("protocols ll and index: Producer/Consumer"), "{e}");
    assert!(BulkConsumer::claim(&mb, "i").is_err());
    for v in 0..20u64 {
        assert_eq!(tx.try_send(&v.to_le_bytes()).unwrap(), v < 16, "16 slots");
    }
    let again = Mailbox::open(mb.path()).unwrap();
    assert_eq!(again.channel("i").unwrap().protocol, Protocol::Index, "kept in the file");
    let mut rx = Consumer::claim(&again, "i").unwrap();
    let mut out = [0u8; 8 * 10];
    assert_eq!(rx.try_recv_batch(&mut out).unwrap(), 10);
    let mut one = [0u8; 8];
    rx.recv(&mut one, Duration::from_secs(1)).unwrap();
    assert_eq!(u64::from_le_bytes(one), 10);
    tx.send_batch(&[[1u8; 8], [2; 8]].concat(), Duration::from_secs(1)).unwrap();
    // A GPU program cannot bind it: the binding check and the kernel's context both refuse, naming it.
    let e = mb.channel_for_program("i").unwrap_err();
    assert!(matches!(e, ShmError::HostOnly { .. }) && e.to_string().contains("\"i\""), "{e}");
    assert_eq!(mb.channel_for_program("after").unwrap().index, after.index);
    mb.slot(0).unwrap().bind("p", &[after.index, i.index]).unwrap();
    assert!(matches!(mb.mesh_ctx(0, 0x7000_0000), Err(ShmError::HostOnly { .. })));
}
