//! Every call's status: the codes, this thread's last error (recorded, and read by `mesh_shm_last_error`), a mailbox error's code, and the guard that keeps a panic from crossing into C.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use mesh_shm::ShmError;
use mesh_shm::group::GroupError;

/// The result of every call: 0 done, > 0 not now, < 0 an error (see [`mesh_shm_last_error`]).
pub type MeshStatus = i32;

/// Done.
pub const MESH_OK: MeshStatus = 0;
/// A try_send found the ring full: nothing was sent.
pub const MESH_FULL: MeshStatus = 1;
/// A try_recv found no whole message: nothing was received.
pub const MESH_EMPTY: MeshStatus = 2;
/// A blocking send or receive ran out of time.
pub const MESH_TIMEOUT: MeshStatus = 3;
/// A pointer argument was NULL.
pub const MESH_ERR_NULL: MeshStatus = -1;
/// An argument is out of range or not valid UTF-8 (a name, an index, a count).
pub const MESH_ERR_ARG: MeshStatus = -2;
/// No live channel has that name.
pub const MESH_ERR_NO_CHANNEL: MeshStatus = -3;
/// A live process already holds that end of the channel.
pub const MESH_ERR_CLAIMED: MeshStatus = -4;
/// A message of the wrong size for the channel.
pub const MESH_ERR_MSG_SIZE: MeshStatus = -5;
/// The file is not a valid mailbox (magic, layout version, sizes, tables).
pub const MESH_ERR_INVALID: MeshStatus = -6;
/// A system call failed (open, map, write).
pub const MESH_ERR_IO: MeshStatus = -7;
/// A ring's indices are impossible (a buggy writer or a corrupted file).
pub const MESH_ERR_CORRUPT: MeshStatus = -8;
/// A `MESH_*` environment variable that meshd sets for its native workers, or a service client's
/// `MESHD_DEVICE`, is missing or malformed.
pub const MESH_ERR_ENV: MeshStatus = -9;
/// A bug inside this library (a panic, caught): the call did nothing.
pub const MESH_ERR_PANIC: MeshStatus = -10;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error and returns `code`.
pub(crate) fn fail(code: MeshStatus, msg: impl std::fmt::Display) -> MeshStatus {
    let text = CString::new(msg.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = text);
    code
}

/// The status a mailbox error maps to, its text recorded.
pub(crate) fn shm_fail(e: &ShmError) -> MeshStatus {
    let code = match e {
        ShmError::Io { .. } => MESH_ERR_IO,
        ShmError::Invalid { .. } => MESH_ERR_INVALID,
        ShmError::NoSuchChannel(_) => MESH_ERR_NO_CHANNEL,
        ShmError::Claimed { .. } => MESH_ERR_CLAIMED,
        ShmError::MessageSize { .. } => MESH_ERR_MSG_SIZE,
        ShmError::Timeout { .. } => MESH_TIMEOUT,
        ShmError::Corrupt { .. } | ShmError::FanIn { .. } => MESH_ERR_CORRUPT,
        ShmError::Group {
            error:
                GroupError::Invalid { .. } | GroupError::BadState { .. } | GroupError::Ring { .. } | GroupError::FanIn(_),
            ..
        } => MESH_ERR_CORRUPT,
        _ => MESH_ERR_ARG,
    };
    fail(code, e)
}

/// Runs a call's body; a panic becomes [`MESH_ERR_PANIC`] instead of unwinding into C.
pub(crate) fn guard(body: impl FnOnce() -> MeshStatus) -> MeshStatus {
    catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|_| fail(MESH_ERR_PANIC, "a panic inside mesh-shm-c (a bug): the call did nothing"))
}

/// The text of the last error on this thread ("" when none): valid until the next call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn mesh_shm_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
