//! The checks a call makes on its C arguments before it touches them: a string as UTF-8, a message or a receive buffer against the channel's message size.

use std::ffi::{CStr, c_char, c_void};

use mesh_shm::ShmError;

use crate::status::{MESH_ERR_ARG, MESH_ERR_NULL, MeshStatus, fail, shm_fail};

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, MeshStatus> {
    if p.is_null() {
        return Err(fail(MESH_ERR_NULL, format!("{what} is NULL")));
    }
    // SAFETY: non-null, NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| fail(MESH_ERR_ARG, format!("{what} is not valid UTF-8")))
}

/// A message argument as a slice, refused ([`MESH_ERR_MSG_SIZE`](crate::MESH_ERR_MSG_SIZE)) when `len` is more than the
/// channel's `msg_size`: checked before the slice is made, so that a wrong length (a `(size_t)-1`,
/// a buffer's size for its message's) never has the library read past the caller's buffer, nor
/// make a slice longer than `isize::MAX` bytes (undefined behaviour; an abort in a debug build).
///
/// # Safety
/// `msg` is NULL or `len` readable bytes.
pub(crate) unsafe fn msg_slice<'a>(
    msg: *const c_void,
    len: usize,
    msg_size: u32,
    channel: &str,
    what: &str,
) -> Result<&'a [u8], MeshStatus> {
    if msg.is_null() {
        return Err(fail(MESH_ERR_NULL, format!("{what}: msg is NULL")));
    }
    if len > msg_size as usize {
        let size = msg_size as usize;
        return Err(shm_fail(&ShmError::MessageSize { channel: channel.to_string(), size, got: len }));
    }
    // SAFETY: `len` readable bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) })
}

/// A receive buffer as a slice, refused ([`MESH_ERR_MSG_SIZE`](crate::MESH_ERR_MSG_SIZE)) unless `len` is the channel's
/// `msg_size`: checked before the slice is made, as in [`msg_slice`].
///
/// # Safety
/// `out` is NULL or `len` writable bytes.
pub(crate) unsafe fn out_slice<'a>(
    out: *mut c_void,
    len: usize,
    msg_size: u32,
    channel: &str,
    what: &str,
) -> Result<&'a mut [u8], MeshStatus> {
    if out.is_null() {
        return Err(fail(MESH_ERR_NULL, format!("{what}: out is NULL")));
    }
    if len != msg_size as usize {
        let size = msg_size as usize;
        return Err(shm_fail(&ShmError::MessageSize { channel: channel.to_string(), size, got: len }));
    }
    // SAFETY: `len` writable bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) })
}
