//! A channel's ends: claiming a producer or a consumer end, sending and receiving through it, and releasing it.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use crate::args::{c_str, msg_slice, out_slice};
use crate::handles::{AnyConsumer, AnyProducer, MeshChannelInfo, MeshConsumer, MeshMailbox, MeshProducer};
use crate::status::{MESH_EMPTY, MESH_ERR_NULL, MESH_FULL, MESH_OK, MeshStatus, fail, guard, shm_fail};
// Named by the calls' documentation (the header's text too, so its links stay short).
#[cfg(doc)]
use crate::{mailbox::mesh_shm_channel, status::MESH_TIMEOUT};

/// Claims the producer end of channel `name` for this process into `*out` (refused while a live
/// process holds it). A kernel of this process may drive the end instead of the host calls.
///
/// # Safety
/// `mb` is NULL or a live mailbox; `name` is NULL or NUL-terminated; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_producer_claim(
    mb: *const MeshMailbox,
    name: *const c_char,
    out: *mut *mut MeshProducer,
) -> MeshStatus {
    guard(|| {
        if mb.is_null() || out.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_producer_claim: mb and out must not be NULL");
        }
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let name = match unsafe { c_str(name, "mesh_shm_producer_claim: name") } {
            Ok(n) => n,
            Err(code) => return code,
        };
        // SAFETY: a live mailbox by the caller's contract.
        match AnyProducer::claim(&unsafe { &*mb }.mailbox, name) {
            Ok(inner) => {
                // SAFETY: writable by the caller's contract.
                unsafe { out.write(Box::into_raw(Box::new(MeshProducer { inner }))) };
                MESH_OK
            }
            Err(e) => shm_fail(&e),
        }
    })
}

/// Claims the consumer end of channel `name` for this process into `*out`.
///
/// # Safety
/// As [`mesh_shm_producer_claim`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_consumer_claim(
    mb: *const MeshMailbox,
    name: *const c_char,
    out: *mut *mut MeshConsumer,
) -> MeshStatus {
    guard(|| {
        if mb.is_null() || out.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_consumer_claim: mb and out must not be NULL");
        }
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let name = match unsafe { c_str(name, "mesh_shm_consumer_claim: name") } {
            Ok(n) => n,
            Err(code) => return code,
        };
        // SAFETY: a live mailbox by the caller's contract.
        match AnyConsumer::claim(&unsafe { &*mb }.mailbox, name) {
            Ok(inner) => {
                // SAFETY: writable by the caller's contract.
                unsafe { out.write(Box::into_raw(Box::new(MeshConsumer { inner }))) };
                MESH_OK
            }
            Err(e) => shm_fail(&e),
        }
    })
}

/// The claimed channel of a producer into `*info` (`head` and `tail` as they were at the claim:
/// [`mesh_shm_channel`] reads them now).
///
/// # Safety
/// `p` is NULL or a live producer; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_producer_info(p: *const MeshProducer, info: *mut MeshChannelInfo) -> MeshStatus {
    guard(|| {
        if p.is_null() || info.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_producer_info: p and info must not be NULL");
        }
        // SAFETY: live and writable by the caller's contract.
        unsafe { info.write(MeshChannelInfo::from((*p).inner.info())) };
        MESH_OK
    })
}

/// The claimed channel of a consumer into `*info` (`head` and `tail` as they were at the claim).
///
/// # Safety
/// `c` is NULL or a live consumer; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_consumer_info(c: *const MeshConsumer, info: *mut MeshChannelInfo) -> MeshStatus {
    guard(|| {
        if c.is_null() || info.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_consumer_info: c and info must not be NULL");
        }
        // SAFETY: live and writable by the caller's contract.
        unsafe { info.write(MeshChannelInfo::from((*c).inner.info())) };
        MESH_OK
    })
}

/// Sends one message of `len` bytes (at most the channel's message size; shorter ones are
/// zero-padded). [`MESH_FULL`] when the ring has no room.
///
/// # Safety
/// `p` is NULL or a live producer, used by one thread at a time; `msg` is NULL or `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_try_send(p: *mut MeshProducer, msg: *const c_void, len: usize) -> MeshStatus {
    guard(|| {
        if p.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_try_send: p is NULL");
        }
        // SAFETY: a live producer, not shared between threads, by the caller's contract.
        let p = unsafe { &mut *p };
        let info = p.inner.info();
        // SAFETY: NULL or `len` readable bytes by the caller's contract.
        let msg = match unsafe { msg_slice(msg, len, info.msg_size, &info.name, "mesh_shm_try_send") } {
            Ok(m) => m,
            Err(code) => return code,
        };
        match p.inner.try_send(msg) {
            Ok(true) => MESH_OK,
            Ok(false) => MESH_FULL,
            Err(e) => shm_fail(&e),
        }
    })
}

/// Sends one message, waiting up to `timeout_ms` for room ([`MESH_TIMEOUT`] then).
///
/// # Safety
/// As [`mesh_shm_try_send`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_send(
    p: *mut MeshProducer,
    msg: *const c_void,
    len: usize,
    timeout_ms: u32,
) -> MeshStatus {
    guard(|| {
        if p.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_send: p is NULL");
        }
        // SAFETY: a live producer, not shared between threads, by the caller's contract.
        let p = unsafe { &mut *p };
        let info = p.inner.info();
        // SAFETY: NULL or `len` readable bytes by the caller's contract.
        let msg = match unsafe { msg_slice(msg, len, info.msg_size, &info.name, "mesh_shm_send") } {
            Ok(m) => m,
            Err(code) => return code,
        };
        match p.inner.send(msg, Duration::from_millis(u64::from(timeout_ms))) {
            Ok(()) => MESH_OK,
            Err(e) => shm_fail(&e),
        }
    })
}

/// Receives one message into `out` (`len` must be the channel's message size). [`MESH_EMPTY`]
/// when no whole message is there (`out` may then hold part of one still arriving).
///
/// # Safety
/// `c` is NULL or a live consumer, used by one thread at a time; `out` is NULL or `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_try_recv(c: *mut MeshConsumer, out: *mut c_void, len: usize) -> MeshStatus {
    guard(|| {
        if c.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_try_recv: c is NULL");
        }
        // SAFETY: a live consumer, not shared between threads, by the caller's contract.
        let c = unsafe { &mut *c };
        let info = c.inner.info();
        // SAFETY: NULL or `len` writable bytes by the caller's contract.
        let out = match unsafe { out_slice(out, len, info.msg_size, &info.name, "mesh_shm_try_recv") } {
            Ok(o) => o,
            Err(code) => return code,
        };
        match c.inner.try_recv(out) {
            Ok(true) => MESH_OK,
            Ok(false) => MESH_EMPTY,
            Err(e) => shm_fail(&e),
        }
    })
}

/// Receives one message, waiting up to `timeout_ms` ([`MESH_TIMEOUT`] then).
///
/// # Safety
/// As [`mesh_shm_try_recv`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_recv(
    c: *mut MeshConsumer,
    out: *mut c_void,
    len: usize,
    timeout_ms: u32,
) -> MeshStatus {
    guard(|| {
        if c.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_recv: c is NULL");
        }
        // SAFETY: a live consumer, not shared between threads, by the caller's contract.
        let c = unsafe { &mut *c };
        let info = c.inner.info();
        // SAFETY: NULL or `len` writable bytes by the caller's contract.
        let out = match unsafe { out_slice(out, len, info.msg_size, &info.name, "mesh_shm_recv") } {
            Ok(o) => o,
            Err(code) => return code,
        };
        match c.inner.recv(out, Duration::from_millis(u64::from(timeout_ms))) {
            Ok(()) => MESH_OK,
            Err(e) => shm_fail(&e),
        }
    })
}

/// Releases a producer end (another process may claim it then). NULL is ignored.
///
/// # Safety
/// `p` is NULL or a live producer, released once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_producer_release(p: *mut MeshProducer) {
    let _ = guard(|| {
        if !p.is_null() {
            // SAFETY: from Box::into_raw in mesh_shm_producer_claim, released once by the caller's contract.
            drop(unsafe { Box::from_raw(p) });
        }
        MESH_OK
    });
}

/// Releases a consumer end. NULL is ignored.
///
/// # Safety
/// `c` is NULL or a live consumer, released once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_consumer_release(c: *mut MeshConsumer) {
    let _ = guard(|| {
        if !c.is_null() {
            // SAFETY: from Box::into_raw in mesh_shm_consumer_claim, released once by the caller's contract.
            drop(unsafe { Box::from_raw(c) });
        }
        MESH_OK
    });
}
