//! What a worker says and what a status means: readiness to meshd (`mesh_shm_ready`), and a status's text for the C caller.

use std::ffi::{CStr, c_char};

use crate::mailbox::env_var;
use crate::service::{MESH_ERR_PROTOCOL, MESH_ERR_REFUSED, MESH_ERR_UNREACHABLE, MESH_ERR_WINDOW};
use crate::status::{
    MESH_EMPTY, MESH_ERR_ARG, MESH_ERR_CLAIMED, MESH_ERR_CORRUPT, MESH_ERR_ENV, MESH_ERR_INVALID, MESH_ERR_IO,
    MESH_ERR_MSG_SIZE, MESH_ERR_NO_CHANNEL, MESH_ERR_NULL, MESH_ERR_PANIC, MESH_FULL, MESH_OK, MESH_TIMEOUT,
    MeshStatus, fail, guard,
};

/// Tells meshd this native worker is ready: writes `ready\n` to the descriptor `MESH_READY_FD`
/// names (the same as `dprintf(atoi(getenv("MESH_READY_FD")), "ready\n")`). The descriptor is left open.
#[unsafe(no_mangle)]
pub extern "C" fn mesh_shm_ready() -> MeshStatus {
    guard(|| {
        use std::io::Write;
        use std::os::fd::FromRawFd;
        let fd = match env_var("MESH_READY_FD").map(|v| v.trim().parse::<i32>()) {
            Ok(Ok(fd)) if fd >= 0 => fd,
            Ok(_) => return fail(MESH_ERR_ENV, "MESH_READY_FD is not a descriptor number"),
            Err(code) => return code,
        };
        // SAFETY: the File is never dropped (ManuallyDrop), so the descriptor is only written, never
        // closed; a descriptor that is not open makes the write fail with EBADF.
        let mut file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        match file.write_all(b"ready\n") {
            Ok(()) => MESH_OK,
            Err(e) => fail(MESH_ERR_IO, format!("writing ready to MESH_READY_FD {fd}: {e}")),
        }
    })
}

/// What a status means, as a static string (never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn mesh_shm_strerror(code: MeshStatus) -> *const c_char {
    let s: &'static CStr = match code {
        MESH_OK => c"ok",
        MESH_FULL => c"the ring is full",
        MESH_EMPTY => c"no message waiting",
        MESH_TIMEOUT => c"timed out",
        MESH_ERR_NULL => c"a pointer argument is NULL",
        MESH_ERR_ARG => c"an argument is out of range",
        MESH_ERR_NO_CHANNEL => c"no such channel",
        MESH_ERR_CLAIMED => c"that end of the channel is claimed by a live process",
        MESH_ERR_MSG_SIZE => c"wrong message size for the channel",
        MESH_ERR_INVALID => c"not a valid meshd mailbox",
        MESH_ERR_IO => c"a system call failed",
        MESH_ERR_CORRUPT => c"ring indices corrupt",
        MESH_ERR_ENV => c"a MESH_* environment variable is missing or malformed",
        MESH_ERR_PANIC => c"internal error in mesh-shm-c",
        MESH_ERR_REFUSED => c"meshd refused the request",
        MESH_ERR_UNREACHABLE => c"no meshd answers on the control socket",
        MESH_ERR_PROTOCOL => c"meshd's answer could not be read",
        MESH_ERR_WINDOW => c"the client's window of unanswered requests is full: receive replies first",
        _ => c"unknown status",
    };
    s.as_ptr()
}
