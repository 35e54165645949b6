//! The C API through its `extern "C"` functions: open, look up, claim, a send/receive round trip between two ends, the context a kernel gets, and bad arguments answered with error codes.

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::{null, null_mut};

use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use mesh_shm_c::*;

struct Fixture {
    _dir: tempfile::TempDir,
    path: CString,
    _owner: Mailbox,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let owner =
        Mailbox::create(&path, &MailboxConfig { size: 1 << 20, slots: 4, channels: 8 }, CreateMode::Exclusive).unwrap();
    owner.create_channel("a", 16, 8).unwrap();
    owner.create_channel("b", 64, 4).unwrap();
    owner.create_channel_with("big", 4096, 2, mesh_shm::Placement::Host, mesh_shm::Protocol::Bulk).unwrap();
    owner.create_channel_with("hh", 16, 4, mesh_shm::Placement::Host, mesh_shm::Protocol::Index).unwrap();
    Fixture { path: CString::new(path.to_str().unwrap()).unwrap(), _dir: dir, _owner: owner }
}

fn last_error() -> String {
    // SAFETY: mesh_shm_last_error returns a NUL-terminated string valid until the next call on this thread.
    unsafe { CStr::from_ptr(mesh_shm_last_error()) }.to_string_lossy().into_owned()
}

fn open(f: &Fixture) -> *mut MeshMailbox {
    let mut mb = null_mut();
    // SAFETY: a NUL-terminated path and a writable out pointer.
    assert_eq!(unsafe { mesh_shm_open(f.path.as_ptr(), &mut mb) }, MESH_OK, "{}", last_error());
    assert!(!mb.is_null());
    mb
}

#[test]
fn round_trip_between_two_c_ends() {
    let f = fixture();
    let mb = open(&f);
    let (mut tx, mut rx) = (null_mut(), null_mut());
    // SAFETY: live mailbox, NUL-terminated names, writable outs; every handle is released once below.
    unsafe {
        assert_eq!(mesh_shm_producer_claim(mb, c"a".as_ptr(), &mut tx), MESH_OK, "{}", last_error());
        assert_eq!(mesh_shm_consumer_claim(mb, c"a".as_ptr(), &mut rx), MESH_OK, "{}", last_error());
        // The mailbox may go before its ends: they keep the mapping.
        mesh_shm_close(mb);
        let mut buf = [0u8; 16];
        assert_eq!(mesh_shm_try_recv(rx, buf.as_mut_ptr().cast(), 16), MESH_EMPTY);
        for i in 0u64..8 {
            let msg = [i.to_le_bytes(), (!i).to_le_bytes()].concat();
            assert_eq!(mesh_shm_try_send(tx, msg.as_ptr().cast(), msg.len()), MESH_OK);
        }
        assert_eq!(mesh_shm_try_send(tx, buf.as_ptr().cast(), 16), MESH_FULL, "capacity 8");
        assert_eq!(mesh_shm_send(tx, buf.as_ptr().cast(), 16, 1), MESH_TIMEOUT);
        for i in 0u64..8 {
            assert_eq!(mesh_shm_recv(rx, buf.as_mut_ptr().cast(), 16, 1000), MESH_OK);
            assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), i);
            assert_eq!(u64::from_le_bytes(buf[8..].try_into().unwrap()), !i);
        }
        // Short messages are zero-padded.
        assert_eq!(mesh_shm_send(tx, c"hi".as_ptr().cast(), 2, 1000), MESH_OK);
        assert_eq!(mesh_shm_try_recv(rx, buf.as_mut_ptr().cast(), 16), MESH_OK);
        assert_eq!(&buf[..3], b"hi\0");
        assert_eq!(mesh_shm_recv(rx, buf.as_mut_ptr().cast(), 16, 1), MESH_TIMEOUT);
        let mut info = MeshChannelInfo::default();
        assert_eq!(mesh_shm_producer_info(tx, &mut info), MESH_OK);
        assert_eq!((info.msg_size, info.capacity), (16, 8));
        assert_eq!(mesh_shm_consumer_info(rx, &mut info), MESH_OK);
        assert_eq!(info.msg_size, 16);
        mesh_shm_producer_release(tx);
        mesh_shm_consumer_release(rx);
    }
}

#[test]
fn the_same_calls_serve_a_bulk_channel() {
    let f = fixture();
    let mb = open(&f);
    let (mut tx, mut rx) = (null_mut(), null_mut());
    // SAFETY: live mailbox, NUL-terminated names, writable outs; every handle is released once below.
    unsafe {
        assert_eq!(mesh_shm_producer_claim(mb, c"big".as_ptr(), &mut tx), MESH_OK, "{}", last_error());
        assert_eq!(mesh_shm_consumer_claim(mb, c"big".as_ptr(), &mut rx), MESH_OK, "{}", last_error());
        let msg: Vec<u8> = (0..4096u32).map(|i| (i * 7).to_le_bytes()[0]).collect();
        let mut buf = vec![0u8; 4096];
        for _ in 0..2 {
            assert_eq!(mesh_shm_try_send(tx, msg.as_ptr().cast(), msg.len()), MESH_OK, "{}", last_error());
        }
        assert_eq!(mesh_shm_try_send(tx, msg.as_ptr().cast(), msg.len()), MESH_FULL, "capacity 2");
        for _ in 0..2 {
            assert_eq!(mesh_shm_recv(rx, buf.as_mut_ptr().cast(), 4096, 1000), MESH_OK);
            assert_eq!(buf, msg);
        }
        assert_eq!(mesh_shm_try_recv(rx, buf.as_mut_ptr().cast(), 4096), MESH_EMPTY);
        assert_eq!(mesh_shm_try_send(tx, msg.as_ptr().cast(), 4097), MESH_ERR_MSG_SIZE);
        let mut info = MeshChannelInfo::default();
        assert_eq!(mesh_shm_consumer_info(rx, &mut info), MESH_OK);
        assert_eq!((info.msg_size, info.capacity), (4096, 2));
        let mut ctx = MeshShmCtx::default();
        let names = [c"big".as_ptr(), c"a".as_ptr()];
        assert_eq!(mesh_shm_ctx(mb, 1 << 40, names.as_ptr(), 2, &mut ctx), MESH_OK, "{}", last_error());
        assert_eq!((ctx.bindings[0].protocol, ctx.bindings[1].protocol), (1, 0), "bulk, then LL");
        mesh_shm_producer_release(tx);
        mesh_shm_consumer_release(rx);
        mesh_shm_close(mb);
    }
}

#[test]
fn lookup_region_and_kernel_context() {
    let f = fixture();
    let mb = open(&f);
    let mut info = MeshChannelInfo::default();
    let (mut base, mut len) = (null_mut::<c_void>(), 0usize);
    let mut ctx = MeshShmCtx::default();
    let names = [c"b".as_ptr(), c"a".as_ptr()];
    // SAFETY: live mailbox, NUL-terminated names, writable outs.
    unsafe {
        assert_eq!(mesh_shm_channel(mb, c"b".as_ptr(), &mut info), MESH_OK);
        assert_eq!((info.index, info.msg_size, info.capacity), (1, 64, 4));
        assert_eq!(mesh_shm_region(mb, &mut base, &mut len), MESH_OK);
        assert!(!base.is_null() && len == 1 << 20);
        assert_eq!(mesh_shm_ctx(mb, 0xdead_0000, names.as_ptr(), 2, &mut ctx), MESH_OK, "{}", last_error());
    }
    let expect = f._owner.channel("b").unwrap();
    assert_eq!((ctx.base, ctx.slot, ctx.binding_count), (0xdead_0000, u32::MAX, 2));
    assert_eq!((ctx.bindings[0].ring_offset, ctx.bindings[0].msg_size), (expect.ring_offset, 64));
    assert_eq!(ctx.bindings[1].msg_size, 16);
    assert_eq!(info.ring_offset, expect.ring_offset, "the offset a mesh_binding carries");
    // SAFETY: opened above, closed once.
    unsafe { mesh_shm_close(mb) };
}

#[test]
fn bad_arguments_are_error_codes_not_crashes() {
    let f = fixture();
    let mb = open(&f);
    let mut out = null_mut();
    let (mut tx, mut tx2) = (null_mut(), null_mut());
    let mut info = MeshChannelInfo::default();
    let mut ctx = MeshShmCtx::default();
    let bad_utf8 = [0xffu8 as c_char, 0];
    // SAFETY: every pointer is NULL, live, or NUL-terminated as each call's contract allows.
    unsafe {
        assert_eq!(mesh_shm_open(f.path.as_ptr(), null_mut()), MESH_ERR_NULL);
        assert_eq!(mesh_shm_open(c"/nonexistent/mailbox".as_ptr(), &mut out), MESH_ERR_IO);
        assert!(last_error().contains("/nonexistent/mailbox"), "{}", last_error());
        assert!(out.is_null(), "nothing is written on failure");
        let junk = f._dir.path().join("junk");
        std::fs::write(&junk, vec![7u8; 8192]).unwrap();
        let junk = CString::new(junk.to_str().unwrap()).unwrap();
        assert_eq!(mesh_shm_open(junk.as_ptr(), &mut out), MESH_ERR_INVALID);
        assert!(last_error().contains("magic"), "{}", last_error());
        assert_eq!(mesh_shm_channel(mb, c"zzz".as_ptr(), &mut info), MESH_ERR_NO_CHANNEL);
        assert_eq!(mesh_shm_channel(mb, null(), &mut info), MESH_ERR_NULL);
        assert_eq!(mesh_shm_channel(null(), c"a".as_ptr(), &mut info), MESH_ERR_NULL);
        assert_eq!(mesh_shm_channel(mb, bad_utf8.as_ptr(), &mut info), MESH_ERR_ARG);
        assert_eq!(mesh_shm_region(mb, null_mut(), null_mut()), MESH_ERR_NULL);
        assert_eq!(mesh_shm_producer_claim(mb, c"a".as_ptr(), &mut tx), MESH_OK);
        assert_eq!(mesh_shm_producer_claim(mb, c"a".as_ptr(), &mut tx2), MESH_ERR_CLAIMED);
        assert!(last_error().contains(&std::process::id().to_string()), "names the holder: {}", last_error());
        assert_eq!(mesh_shm_try_send(tx, [0u8; 32].as_ptr().cast(), 32), MESH_ERR_MSG_SIZE);
        assert_eq!(mesh_shm_try_send(tx, null(), 16), MESH_ERR_NULL);
        assert_eq!(mesh_shm_try_send(null_mut(), [0u8; 16].as_ptr().cast(), 16), MESH_ERR_NULL);
        let mut rx = null_mut();
        assert_eq!(mesh_shm_consumer_claim(mb, c"a".as_ptr(), &mut rx), MESH_OK);
        assert_eq!(mesh_shm_try_recv(rx, [0u8; 8].as_mut_ptr().cast(), 8), MESH_ERR_MSG_SIZE, "exactly the size");
        assert_eq!(mesh_shm_recv(null_mut(), null_mut(), 16, 1), MESH_ERR_NULL);
        let nine = [c"a".as_ptr(); 9];
        assert_eq!(mesh_shm_ctx(mb, 0, nine.as_ptr(), 9, &mut ctx), MESH_ERR_ARG);
        let with_null = [c"a".as_ptr(), null()];
        assert_eq!(mesh_shm_ctx(mb, 0, with_null.as_ptr(), 2, &mut ctx), MESH_ERR_NULL);
        mesh_shm_producer_release(tx);
        mesh_shm_consumer_release(rx);
        // Releasing frees the end for the next claimant.
        assert_eq!(mesh_shm_producer_claim(mb, c"a".as_ptr(), &mut tx2), MESH_OK);
        mesh_shm_producer_release(tx2);
        // NULL handles are ignored.
        mesh_shm_producer_release(null_mut());
        mesh_shm_consumer_release(null_mut());
        mesh_shm_close(null_mut());
        mesh_shm_close(mb);
    }
    for code in [MESH_OK, MESH_FULL, MESH_ERR_CLAIMED, MESH_ERR_PANIC, 12345] {
        // SAFETY: mesh_shm_strerror returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(mesh_shm_strerror(code)) }.to_string_lossy().into_owned();
        assert!(!text.is_empty());
    }
}

#[test]
fn an_index_channel_works_through_the_same_c_ends_and_no_kernel_context_binds_it() {
    let f = fixture();
    let mb = open(&f);
    let (mut tx, mut rx) = (null_mut(), null_mut());
    // SAFETY: live mailbox, NUL-terminated names, writable outs; every handle is released once below.
    unsafe {
        assert_eq!(mesh_shm_producer_claim(mb, c"hh".as_ptr(), &mut tx), MESH_OK, "{}", last_error());
        assert_eq!(mesh_shm_consumer_claim(mb, c"hh".as_ptr(), &mut rx), MESH_OK, "{}", last_error());
        let mut buf = [0u8; 16];
        for i in 0u64..4 {
            assert_eq!(mesh_shm_try_send(tx, i.to_le_bytes().as_ptr().cast(), 8), MESH_OK, "{}", last_error());
        }
        assert_eq!(mesh_shm_try_send(tx, buf.as_ptr().cast(), 16), MESH_FULL, "capacity 4");
        for i in 0u64..4 {
            assert_eq!(mesh_shm_recv(rx, buf.as_mut_ptr().cast(), 16, 1000), MESH_OK);
            assert_eq!(buf, [i.to_le_bytes(), [0; 8]].concat()[..], "zero-padded to the message size");
        }
        assert_eq!(mesh_shm_try_recv(rx, buf.as_mut_ptr().cast(), 16), MESH_EMPTY);
        mesh_shm_producer_release(tx);
        mesh_shm_consumer_release(rx);
        let names = [c"a".as_ptr(), c"hh".as_ptr()];
        let mut ctx = MeshShmCtx::default();
        assert_eq!(mesh_shm_ctx(mb, 0, names.as_ptr(), 2, &mut ctx), MESH_ERR_ARG);
        let e = last_error();
        assert!(e.contains("\"hh\"") && e.contains("protocol index") && e.contains("cannot bind"), "{e}");
        mesh_shm_close(mb);
    }
}

/// Lengths a careless or hostile caller passes: each refused by its number before the library makes
/// a slice of the caller's memory (a `(size_t)-1` slice aborted a debug build, and a length past the
/// message size had the send read past the buffer), a name count past the ctx's room refused before
/// the array is read, and a device base the mailbox's offsets would overflow refused.
#[test]
fn hostile_lengths_counts_and_addresses_are_refused_before_memory_is_touched() {
    let f = fixture();
    let mb = open(&f);
    let (mut tx, mut rx, mut btx, mut brx) = (null_mut(), null_mut(), null_mut(), null_mut());
    let mut ctx = MeshShmCtx::default();
    let buf = [0u8; 16];
    let mut out = [0u8; 16];
    // SAFETY: live handles and buffers; every length that exceeds its buffer is refused before it is
    // read (what this test asserts); every handle is released once.
    unsafe {
        assert_eq!(mesh_shm_producer_claim(mb, c"a".as_ptr(), &mut tx), MESH_OK);
        assert_eq!(mesh_shm_consumer_claim(mb, c"a".as_ptr(), &mut rx), MESH_OK);
        assert_eq!(mesh_shm_producer_claim(mb, c"big".as_ptr(), &mut btx), MESH_OK);
        assert_eq!(mesh_shm_consumer_claim(mb, c"big".as_ptr(), &mut brx), MESH_OK);
        for (len, what) in [(usize::MAX, "SIZE_MAX"), (isize::MAX as usize + 1, "past isize::MAX"), (17, "one past")] {
            assert_eq!(mesh_shm_try_send(tx, buf.as_ptr().cast(), len), MESH_ERR_MSG_SIZE, "{what}");
            assert!(last_error().contains("\"a\"") && last_error().contains("16-byte"), "{}", last_error());
            assert_eq!(mesh_shm_send(tx, buf.as_ptr().cast(), len, 1), MESH_ERR_MSG_SIZE, "{what}");
            assert_eq!(mesh_shm_try_recv(rx, out.as_mut_ptr().cast(), len), MESH_ERR_MSG_SIZE, "{what}");
            assert_eq!(mesh_shm_recv(rx, out.as_mut_ptr().cast(), len, 1), MESH_ERR_MSG_SIZE, "{what}");
            if len > 4096 {
                assert_eq!(mesh_shm_try_send(btx, buf.as_ptr().cast(), len), MESH_ERR_MSG_SIZE, "bulk {what}");
                assert_eq!(mesh_shm_try_recv(brx, out.as_mut_ptr().cast(), len), MESH_ERR_MSG_SIZE, "bulk {what}");
            }
        }
        // Nothing was sent by any of them.
        assert_eq!(mesh_shm_try_recv(rx, out.as_mut_ptr().cast(), 16), MESH_EMPTY);
        // Zero bytes is a message of zeros (zero-padded), not an error.
        assert_eq!(mesh_shm_try_send(tx, buf.as_ptr().cast(), 0), MESH_OK);
        assert_eq!(mesh_shm_try_recv(rx, out.as_mut_ptr().cast(), 16), MESH_OK);
        // One name in the array, a count of u32::MAX (a -1): refused without reading past the array.
        let one = [c"a".as_ptr()];
        assert_eq!(mesh_shm_ctx(mb, 0, one.as_ptr(), u32::MAX, &mut ctx), MESH_ERR_ARG);
        assert!(last_error().contains("4294967295 channels"), "{}", last_error());
        assert_eq!(mesh_shm_ctx(mb, u64::MAX, one.as_ptr(), 1, &mut ctx), MESH_ERR_ARG);
        assert!(last_error().contains("device_base"), "{}", last_error());
        assert_eq!(ctx, MeshShmCtx::default(), "nothing written on failure");
        mesh_shm_producer_release(tx);
        mesh_shm_consumer_release(rx);
        mesh_shm_producer_release(btx);
        mesh_shm_consumer_release(brx);
        mesh_shm_close(mb);
    }
}
