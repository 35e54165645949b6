//! A program's user words in C: the words its kernel stores with `mesh_user_store`, by the program's name through meshd's `ps`, or by its slot straight from a mapped mailbox.

use std::ffi::c_char;

use serde_json::Value;

use crate::args::c_str;
use crate::handles::MeshMailbox;
use crate::service::{Failed, MESH_ERR_PROTOCOL, MESH_ERR_REFUSED, ask, dial};
use crate::status::{MESH_ERR_ARG, MESH_ERR_ENV, MESH_ERR_NULL, MESH_OK, MeshStatus, fail, guard, shm_fail};

/// How many user words a program slot holds (mesh.cuh's `MESH_SLOT_USER_WORDS`).
pub const MESH_USER_WORDS: u32 = 32;

/// Program `program`'s words from meshd's `ps` answer; refused, saying why, when no row has that
/// name or its row carries none (the texts are `meshd user`'s).
fn words_of(socket: &str, program: &str) -> Result<Vec<u32>, Failed> {
    let conn = dial(socket)?;
    let answer = ask(&conn, "{\"op\":\"ps\"}\n", "ps")?;
    let rows = answer.get("programs").and_then(Value::as_array).cloned().unwrap_or_default();
    let Some(row) = rows.iter().find(|r| r.get("name").and_then(Value::as_str) == Some(program)) else {
        let loaded: Vec<&str> = rows.iter().filter_map(|r| r.get("name").and_then(Value::as_str)).collect();
        let loaded = if loaded.is_empty() { "none".to_string() } else { loaded.join(", ") };
        return Err((MESH_ERR_REFUSED, format!("program {program:?}: not loaded (loaded: {loaded})")));
    };
    let words: Option<Vec<u32>> = row
        .get("user")
        .and_then(Value::as_array)
        .map(|w| w.iter().map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok())).collect())
        .unwrap_or(Some(Vec::new()));
    match words {
        None => Err((MESH_ERR_PROTOCOL, format!("program {program:?}: meshd sent user words that are not u32s"))),
        Some(w) if w.is_empty() && row.get("slot").and_then(Value::as_u64) == Some(u64::from(u32::MAX)) => {
            Err((MESH_ERR_REFUSED, format!("program {program:?}: held back, it holds no slot and so no user words")))
        }
        Some(w) if w.is_empty() => Err((
            MESH_ERR_REFUSED,
            format!("program {program:?}: meshd sent no user words (a meshd older than `meshd user`)"),
        )),
        Some(w) => Ok(w),
    }
}

/// Reads the user words of program `program` (what its kernel stored with `mesh_user_store`, 0
/// where it stored none) from the meshd listening on `socket_path` (NULL: as
/// [`mesh_service_connect`](crate::mesh_service_connect) finds it), into `words[0..count]`
/// (`count` at most [`MESH_USER_WORDS`]; word `i` into `words[i]`). meshd reads them from the
/// program's slot when it answers: `meshd user PROGRAM` prints the same.
///
/// Returns [`MESH_ERR_REFUSED`] when no program has that name or it is held back (it holds no
/// slot), [`MESH_ERR_UNREACHABLE`](crate::MESH_ERR_UNREACHABLE) when no meshd answers there,
/// [`MESH_ERR_PROTOCOL`] when its answer cannot be read, [`MESH_ERR_ARG`] for a `count` above
/// [`MESH_USER_WORDS`].
///
/// # Safety
/// `socket_path` is NULL or NUL-terminated; `program` is NULL (refused) or NUL-terminated; `words`
/// is NULL (refused) or `count` writable `uint32_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_program_user_words(
    socket_path: *const c_char,
    program: *const c_char,
    words: *mut u32,
    count: u32,
) -> MeshStatus {
    guard(|| {
        if words.is_null() {
            return fail(MESH_ERR_NULL, "mesh_program_user_words: words is NULL");
        }
        if count > MESH_USER_WORDS {
            return fail(
                MESH_ERR_ARG,
                format!("mesh_program_user_words: count {count}: a slot holds {MESH_USER_WORDS}"),
            );
        }
        // SAFETY: NULL (refused) or NUL-terminated by the caller's contract.
        let program = match unsafe { c_str(program, "mesh_program_user_words: program") } {
            Ok(s) => s,
            Err(code) => return code,
        };
        let socket = if socket_path.is_null() {
            match mesh_shm::paths::client_socket_from_env() {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(why) => return fail(MESH_ERR_ENV, format!("mesh_program_user_words: {why}")),
            }
        } else {
            // SAFETY: non-null, NUL-terminated by the caller's contract.
            match unsafe { c_str(socket_path, "mesh_program_user_words: socket_path") } {
                Ok(s) => s.to_string(),
                Err(code) => return code,
            }
        };
        match words_of(&socket, program) {
            Ok(w) => {
                let n = (count as usize).min(w.len());
                // SAFETY: `words` holds `count` writable u32s by the caller's contract, and `n <= count`.
                unsafe { std::ptr::copy_nonoverlapping(w.as_ptr(), words, n) };
                MESH_OK
            }
            Err((code, text)) => fail(code, text),
        }
    })
}

/// Reads the user words of program slot `slot` (the `slot` column of `meshd ps`) from a mapped
/// mailbox, into `words[0..count]` (`count` at most [`MESH_USER_WORDS`]). No meshd is asked: a
/// native worker that has the mailbox open reads them in place. [`MESH_ERR_ARG`] for a slot past
/// the mailbox's slot table or a `count` above [`MESH_USER_WORDS`].
///
/// # Safety
/// `mb` is NULL (refused) or a live mailbox; `words` is NULL (refused) or `count` writable `uint32_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_user_words(
    mb: *const MeshMailbox,
    slot: u32,
    words: *mut u32,
    count: u32,
) -> MeshStatus {
    guard(|| {
        if mb.is_null() || words.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_user_words: mb and words must not be NULL");
        }
        if count > MESH_USER_WORDS {
            return fail(MESH_ERR_ARG, format!("mesh_shm_user_words: count {count}: a slot holds {MESH_USER_WORDS}"));
        }
        // SAFETY: a live mailbox by the caller's contract.
        let mailbox = &unsafe { &*mb }.mailbox;
        let w = match mailbox.slot(slot) {
            Ok(s) => s.user_words(),
            Err(e @ mesh_shm::ShmError::NoSuchSlot { .. }) => {
                return fail(MESH_ERR_ARG, format!("mesh_shm_user_words: {e}"));
            }
            Err(e) => return fail(shm_fail(&e), format!("mesh_shm_user_words: {e}")),
        };
        // SAFETY: `words` holds `count` writable u32s by the caller's contract, and `count <= 32`.
        unsafe { std::ptr::copy_nonoverlapping(w.as_ptr(), words, count as usize) };
        MESH_OK
    })
}
