//! The calls that read what `meshd spawn` puts in a native worker's environment (`MESH_MAILBOX`, `MESH_CHANNELS`, `MESH_READY_FD`): one test, alone in its binary, so that no other thread reads the environment while it changes.

use std::ffi::c_char;
use std::os::fd::AsRawFd;
use std::ptr::{null, null_mut};

use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use mesh_shm_c::*;

#[test]
fn environment_of_a_native_worker() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let owner =
        Mailbox::create(&path, &MailboxConfig { size: 1 << 20, slots: 4, channels: 8 }, CreateMode::Exclusive).unwrap();
    owner.create_channel("in", 16, 8).unwrap();
    owner.create_channel("out", 32, 8).unwrap();
    let mut mb = null_mut();
    let mut count = 0u32;
    // SAFETY: writable outs; nothing else in this binary touches the environment.
    unsafe {
        std::env::remove_var("MESH_MAILBOX");
        std::env::remove_var("MESH_CHANNELS");
        std::env::remove_var("MESH_READY_FD");
        assert_eq!(mesh_shm_open(null(), &mut mb), MESH_ERR_ENV);
        assert_eq!(mesh_shm_bound_count(&mut count), MESH_ERR_ENV);
        assert_eq!(mesh_shm_ready(), MESH_ERR_ENV);
        std::env::set_var("MESH_MAILBOX", &path);
        std::env::set_var("MESH_CHANNELS", "out,in");
        assert_eq!(mesh_shm_open(null(), &mut mb), MESH_OK);
        assert_eq!(mesh_shm_bound_count(&mut count), MESH_OK);
    }
    assert_eq!(count, 2);
    let mut info = MeshChannelInfo::default();
    let mut name = [0 as c_char; 3];
    let mut ctx = MeshShmCtx::default();
    // SAFETY: a live mailbox, writable outs of the sizes given.
    unsafe {
        assert_eq!(mesh_shm_bound_channel(mb, 0, &mut info, name.as_mut_ptr(), name.len()), MESH_OK);
        assert_eq!(info.msg_size, 32);
        assert_eq!(std::ffi::CStr::from_ptr(name.as_ptr()).to_bytes(), b"ou", "truncated to fit, NUL-terminated");
        assert_eq!(mesh_shm_bound_channel(mb, 2, &mut info, null_mut(), 0), MESH_ERR_ARG);
        assert_eq!(mesh_shm_ctx(mb, 4096, null(), 0, &mut ctx), MESH_OK);
        assert_eq!((ctx.binding_count, ctx.bindings[0].msg_size, ctx.bindings[1].msg_size), (2, 32, 16));
        mesh_shm_close(mb);
    }
    let ready = dir.path().join("ready");
    let w = std::fs::File::create(&ready).unwrap();
    // SAFETY: nothing else in this binary touches the environment.
    unsafe { std::env::set_var("MESH_READY_FD", w.as_raw_fd().to_string()) };
    assert_eq!(mesh_shm_ready(), MESH_OK);
    drop(w);
    let got = std::fs::read_to_string(&ready).unwrap();
    assert_eq!(got, "ready\n");
    // SAFETY: as above.
    unsafe { std::env::set_var("MESH_READY_FD", "not-a-number") };
    assert_eq!(mesh_shm_ready(), MESH_ERR_ENV);
}
