//! Deleting a channel or a service in C: `mesh_channel_delete` and `mesh_service_delete` send one request over meshd's control socket, as `meshd channel delete` and `meshd service delete` do.

use std::ffi::{c_char, c_int};

use serde_json::Value;

use crate::args::c_str;
use crate::service::{MESH_ERR_PROTOCOL, ask, dial};
use crate::status::{MESH_ERR_ENV, MESH_OK, MeshStatus, fail, guard};

/// Sends `{"op": op, "name": name[, "discard": true]}` to the meshd at `socket_path` (NULL: as
/// `mesh_service_connect` finds it) and writes the count it answers into `*discarded` (when not NULL).
///
/// # Safety
/// As the two public calls: `socket_path` NULL or NUL-terminated, `name` NULL (refused) or
/// NUL-terminated, `discarded` NULL or writable.
unsafe fn delete(
    call: &str,
    op: &str,
    socket_path: *const c_char,
    name: *const c_char,
    discard: c_int,
    discarded: *mut u64,
) -> MeshStatus {
    // SAFETY: NULL (refused) or NUL-terminated by the caller's contract.
    let name = match unsafe { c_str(name, &format!("{call}: name")) } {
        Ok(s) => s,
        Err(code) => return code,
    };
    let socket = if socket_path.is_null() {
        match mesh_shm::paths::client_socket_from_env() {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(why) => return fail(MESH_ERR_ENV, format!("{call}: {why}")),
        }
    } else {
        // SAFETY: non-null, NUL-terminated by the caller's contract.
        match unsafe { c_str(socket_path, &format!("{call}: socket_path")) } {
            Ok(s) => s.to_string(),
            Err(code) => return code,
        }
    };
    let mut request = serde_json::json!({"op": op, "name": name});
    if discard != 0 {
        request["discard"] = Value::Bool(true);
    }
    let answer = dial(&socket).and_then(|conn| ask(&conn, &format!("{request}\n"), op));
    match answer {
        Ok(answer) => {
            let count = match answer.get("discarded") {
                None => 0,
                Some(v) => match v.as_u64() {
                    Some(n) => n,
                    None => {
                        return fail(MESH_ERR_PROTOCOL, format!("{call}: meshd answered discarded {v}, not a count"));
                    }
                },
            };
            if !discarded.is_null() {
                // SAFETY: non-null and writable by the caller's contract.
                unsafe { discarded.write(count) };
            }
            MESH_OK
        }
        Err((code, text)) => fail(code, text),
    }
}

/// Deletes channel `name` through the meshd listening on `socket_path` (NULL: the path in
/// `MESHD_SOCKET`, else `MESHD_DEVICE`'s meshd, else `/tmp/meshd.sock`, as [`mesh_service_connect`]
/// finds it): its ring's bytes are reused by the next channel created (a device ring's GPU memory
/// is freed), and the name can be created again at once, with any size. With `discard` non-zero the
/// messages it holds are dropped; `*discarded` (when not NULL) gets how many.
///
/// Returns [`MESH_ERR_REFUSED`](crate::MESH_ERR_REFUSED), meshd's reason in
/// `mesh_shm_last_error()`, while a program binds the channel, a process holds one of its ends (a
/// producer or consumer claimed, this process's included: release it first), or it holds messages
/// and `discard` is 0; and for a service's channel (deleted with [`mesh_service_delete`]).
/// [`MESH_ERR_UNREACHABLE`](crate::MESH_ERR_UNREACHABLE) when no meshd answers there.
///
/// [`mesh_service_connect`]: crate::mesh_service_connect
///
/// # Safety
/// `socket_path` is NULL or NUL-terminated; `name` is NULL (refused) or NUL-terminated;
/// `discarded` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_channel_delete(
    socket_path: *const c_char,
    name: *const c_char,
    discard: c_int,
    discarded: *mut u64,
) -> MeshStatus {
    // SAFETY: the caller's contract is `delete`'s.
    guard(|| unsafe { delete("mesh_channel_delete", "channel_delete", socket_path, name, discard, discarded) })
}

/// Deletes service `name`, its fan-in channel `name` and its group `name.replies`, through the
/// meshd at `socket_path` (NULL: as [`mesh_channel_delete`] finds it). With `discard` non-zero the
/// requests and replies it holds are dropped; `*discarded` (when not NULL) gets how many.
///
/// Returns [`MESH_ERR_REFUSED`](crate::MESH_ERR_REFUSED), meshd's reason in
/// `mesh_shm_last_error()`, while a client is attached (a `MeshService` of any process, this one's
/// included: close it first), while a program binds either channel, or while requests or replies
/// are queued and `discard` is 0.
///
/// # Safety
/// `socket_path` is NULL or NUL-terminated; `name` is NULL (refused) or NUL-terminated;
/// `discarded` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_delete(
    socket_path: *const c_char,
    name: *const c_char,
    discard: c_int,
    discarded: *mut u64,
) -> MeshStatus {
    // SAFETY: the caller's contract is `delete`'s.
    guard(|| unsafe { delete("mesh_service_delete", "service_delete", socket_path, name, discard, discarded) })
}
