//! `Mailbox::open` over damaged files: every corruption is refused with a named field, never a panic or a stray access.

use std::os::unix::fs::FileExt;

use mesh_shm::layout::{ChannelDesc, Header};
use mesh_shm::{CreateMode, Mailbox, MailboxConfig, Producer, ShmError};
use proptest::prelude::*;

const SIZE: u64 = 256 << 10;

/// A valid mailbox with two channels, as bytes.
fn pristine() -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb =
        Mailbox::create(&path, &MailboxConfig { size: SIZE, slots: 4, channels: 4 }, CreateMode::Exclusive).unwrap();
    mb.create_channel("one", 8, 16).unwrap();
    mb.create_channel("two", 64, 8).unwrap();
    drop(mb);
    let bytes = std::fs::read(&path).unwrap();
    (dir, bytes)
}

fn open_bytes(dir: &tempfile::TempDir, bytes: &[u8]) -> Result<Mailbox, ShmError> {
    let path = dir.path().join("damaged");
    std::fs::write(&path, bytes).unwrap();
    Mailbox::open(&path)
}

fn invalid_field(r: Result<Mailbox, ShmError>) -> &'static str {
    match r {
        Err(ShmError::Invalid { field, .. }) => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn put_u64(bytes: &mut [u8], off: usize, v: u64) {
    bytes[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn each_header_field_is_named_when_wrong() {
    use core::mem::offset_of;
    let (dir, good) = pristine();
    assert!(open_bytes(&dir, &good).is_ok());
    let cases: [(usize, u64, &str); 6] = [
        (offset_of!(Header, magic), 1, "magic"),
        (offset_of!(Header, version), 99, "layout version"),
        (offset_of!(Header, file_size), SIZE * 2, "file size"),
        (offset_of!(Header, slots_offset), SIZE, "slot table"),
        (offset_of!(Header, channels_offset), 4096, "channel table"),
        (offset_of!(Header, arena_offset), 4096 + 64, "ring arena"),
    ];
    for (off, value, field) in cases {
        let mut bad = good.clone();
        if field == "layout version" {
            bad[off..off + 4].copy_from_slice(&u32::try_from(value).unwrap().to_le_bytes());
        } else {
            put_u64(&mut bad, off, value);
        }
        assert_eq!(invalid_field(open_bytes(&dir, &bad)), field, "corrupting {field}");
    }
    assert_eq!(invalid_field(open_bytes(&dir, &good[..good.len() - 4096])), "file size", "truncated");
    assert_eq!(invalid_field(open_bytes(&dir, &good[..100])), "file size", "shorter than a header");
    let err = open_bytes(&dir, &[]).unwrap_err();
    assert!(err.to_string().contains("file size"), "{err}");
}

#[test]
fn a_ring_outside_the_arena_is_refused() {
    let (dir, good) = pristine();
    let mb = open_bytes(&dir, &good).unwrap();
    let desc0 = usize::try_from(mb.geometry().channels_offset).unwrap();
    let ring0 = mb.channel("one").unwrap().ring_offset;
    let ring1 = mb.channel("two").unwrap().ring_offset;
    // open_bytes rewrites the file this mapping shows: read everything needed first.
    drop(mb);
    let mut bad = good.clone();
    put_u64(&mut bad, desc0 + core::mem::offset_of!(ChannelDesc, ring_offset), SIZE - 128);
    let err = open_bytes(&dir, &bad).unwrap_err();
    assert!(err.to_string().contains("channel 0") && err.to_string().contains("arena"), "{err}");
    let mut overlap = good.clone();
    put_u64(&mut overlap, desc0 + core::mem::offset_of!(ChannelDesc, ring_offset), ring1);
    put_u64(
        &mut overlap,
        desc0 + core::mem::offset_of!(ChannelDesc, slots_offset),
        mesh_shm::layout::host_slots_offset(ring1),
    );
    assert_ne!(ring0, ring1);
    let err = open_bytes(&dir, &overlap).unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
}

#[test]
fn corrupted_ring_indices_are_an_error_not_a_read() {
    let (dir, good) = pristine();
    let mb = open_bytes(&dir, &good).unwrap();
    let ring = mb.channel("one").unwrap().ring_offset;
    // Producer index ahead of the consumer's by more than the capacity.
    let file = std::fs::OpenOptions::new().write(true).open(mb.path()).unwrap();
    file.write_all_at(&1000u64.to_le_bytes(), ring).unwrap();
    // The consumer never reads `head` on its path (it polls the slots' tags), so it checks at claim time.
    let err = mesh_shm::Consumer::claim(&mb, "one").unwrap_err();
    assert!(matches!(err, ShmError::Corrupt { head: 1000, tail: 0, capacity: 16, .. }), "{err}");
    let mut p = mesh_shm::Producer::claim(&mb, "one").unwrap();
    let err = p.try_send(&[0; 8]).unwrap_err();
    assert!(matches!(err, ShmError::Corrupt { head: 1000, tail: 0, capacity: 16, .. }), "{err}");
}

#[test]
fn an_overwritten_arena_cursor_refuses_the_creation_and_leaves_the_channels_as_they_were() {
    use core::mem::offset_of;
    let (dir, good) = pristine();
    let mb = open_bytes(&dir, &good).unwrap();
    let one = mb.channel("one").unwrap();
    let two = mb.channel("two").unwrap();
    drop(mb);
    let file_cursor = two.ring_offset + mesh_shm::layout::ring_bytes_at(two.ring_offset, 64, 8, 0, 0, 1).unwrap();
    // Written after the open (as another process of the uid can), past the check `open` makes: behind
    // the live rings (a new ring would overlap them), off a line (every later open would refuse the
    // file), past the arena (outside the mapping), and where the sum would overflow.
    for (cursor, words) in [
        (0, "overlap"),
        (one.ring_offset - mesh_shm::layout::HEADER_SIZE, "overlap"),
        (8, "multiple of the 128-byte line"),
        (1 << 30, "bytes used of a"),
        (u64::MAX, "bytes used of a"),
    ] {
        let mb = open_bytes(&dir, &good).unwrap();
        let arena = mb.geometry().arena_offset;
        assert!(file_cursor > arena);
        let mut p = Producer::claim(&mb, "one").unwrap();
        p.try_send(&[7; 8]).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(mb.path()).unwrap();
        file.write_all_at(&cursor.to_le_bytes(), offset_of!(Header, arena_used) as u64).unwrap();
        let err = mb.create_channel("three", 8, 16).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, ShmError::Invalid { field: "arena cursor", .. }) && text.contains(words),
            "cursor {cursor}: {text}"
        );
        assert!(matches!(mb.channel("three"), Err(ShmError::NoSuchChannel(_))), "cursor {cursor}: nothing made");
        // Channel one's ring is untouched: the message sent before is still there.
        let mut c = mesh_shm::Consumer::claim(&mb, "one").unwrap();
        let mut buf = [0u8; 8];
        c.recv(&mut buf, std::time::Duration::from_secs(1)).unwrap();
        assert_eq!(buf, [7; 8], "cursor {cursor}");
        drop((p, c, mb));
        // With its cursor put back where the rings end, the file opens (no damaged descriptor was
        // published) and a creation works again.
        file.write_all_at(&(file_cursor - arena).to_le_bytes(), offset_of!(Header, arena_used) as u64).unwrap();
        let mb = Mailbox::open(dir.path().join("damaged")).unwrap_or_else(|e| panic!("cursor {cursor}: {e}"));
        mb.create_channel("three", 8, 16).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random bytes over the header and the descriptor table: open either refuses or yields a
    /// mailbox whose every channel can be claimed and used without touching memory outside the file.
    #[test]
    fn open_never_panics_on_corrupted_tables(
        edits in prop::collection::vec((0usize..4096 + 4 * 384 + 4 * 128, any::<u8>()), 1..12),
        widen in any::<bool>(),
    ) {
        let (dir, mut bytes) = pristine();
        for (off, v) in edits {
            let off = if widen { off } else { off % 128 };
            bytes[off] = v;
        }
        if let Ok(mb) = open_bytes(&dir, &bytes) {
            let g = mb.geometry();
            prop_assert_eq!(g.file_size, SIZE);
            for info in mb.channels().unwrap_or_default() {
                prop_assert!(info.ring_offset >= g.arena_offset);
                prop_assert!(
                    mesh_shm::layout::ring_bytes_at(info.ring_offset, info.msg_size, info.capacity, info.placement.code(), info.protocol.code(), info.parts)
                        .is_some_and(|bytes| info.ring_offset + bytes <= g.file_size)
                );
                if let Ok(mut p) = Producer::claim(&mb, &info.name) {
                    let _ = p.try_send(&[1; 8]);
                }
            }
        }
    }

    /// `Geometry::validate` alone, over fully random headers and lengths.
    #[test]
    fn validate_is_total(header in prop::collection::vec(any::<u8>(), 0..200), len in any::<u64>()) {
        let _ = mesh_shm::Geometry::validate(&header, len);
    }
}
