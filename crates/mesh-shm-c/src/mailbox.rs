//! Opening a mailbox and what a native worker builds from it: the region to register with CUDA, channels by name or by bind order, and a kernel's `mesh_ctx`.

use std::ffi::{c_char, c_void};

use mesh_shm::Mailbox;

use crate::args::c_str;
use crate::handles::{MESH_SHM_MAX_BINDINGS, MeshChannelInfo, MeshMailbox, MeshShmBinding, MeshShmCtx};
use crate::status::{MESH_ERR_ARG, MESH_ERR_ENV, MESH_ERR_NULL, MESH_OK, MeshStatus, fail, guard, shm_fail};

/// Reads a `MESH_*` variable meshd sets for its native workers.
pub(crate) fn env_var(name: &str) -> Result<String, MeshStatus> {
    std::env::var(name).map_err(|_| {
        fail(MESH_ERR_ENV, format!("{name} is not set (is this process a native worker started by `meshd spawn`?)"))
    })
}

/// The channel names of `MESH_CHANNELS` (comma-separated, in bind order).
fn bound_names() -> Result<Vec<String>, MeshStatus> {
    let v = env_var("MESH_CHANNELS")?;
    Ok(v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect())
}

/// Opens the mailbox at `path` (NULL: the path in `MESH_MAILBOX`), validating it, into `*out`.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `out` is NULL or points to writable storage for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_open(path: *const c_char, out: *mut *mut MeshMailbox) -> MeshStatus {
    guard(|| {
        if out.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_open: out is NULL");
        }
        let path = if path.is_null() {
            match env_var("MESH_MAILBOX") {
                Ok(p) => p,
                Err(code) => return code,
            }
        } else {
            // SAFETY: non-null, NUL-terminated by the caller's contract.
            match unsafe { c_str(path, "mesh_shm_open: path") } {
                Ok(p) => p.to_string(),
                Err(code) => return code,
            }
        };
        match Mailbox::open(&path) {
            Ok(mailbox) => {
                // SAFETY: `out` is non-null and writable by the caller's contract.
                unsafe { out.write(Box::into_raw(Box::new(MeshMailbox { mailbox }))) };
                MESH_OK
            }
            Err(e) => shm_fail(&e),
        }
    })
}

/// Unmaps a mailbox opened by [`mesh_shm_open`] (its channel ends keep their own mapping). NULL is ignored.
///
/// # Safety
/// `mb` is NULL or a pointer from `mesh_shm_open` not closed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_close(mb: *mut MeshMailbox) {
    let _ = guard(|| {
        if !mb.is_null() {
            // SAFETY: a pointer from Box::into_raw in mesh_shm_open, closed once by the caller's contract.
            drop(unsafe { Box::from_raw(mb) });
        }
        MESH_OK
    });
}

/// The mailbox's host address and length: what a CUDA program registers with
/// `cudaHostRegister(base, len, cudaHostRegisterMapped)` (or `cuMemHostRegister` with
/// `CU_MEMHOSTREGISTER_DEVICEMAP`) before asking for its device pointer.
///
/// # Safety
/// `mb` is NULL or a live mailbox; `base` and `len` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_region(
    mb: *const MeshMailbox,
    base: *mut *mut c_void,
    len: *mut usize,
) -> MeshStatus {
    guard(|| {
        if mb.is_null() || base.is_null() || len.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_region: mb, base and len must not be NULL");
        }
        // SAFETY: a live mailbox by the caller's contract.
        let (host, n) = unsafe { &*mb }.mailbox.as_raw_parts();
        // SAFETY: both writable by the caller's contract.
        unsafe {
            base.write(host.cast());
            len.write(n);
        }
        MESH_OK
    })
}

/// Looks up the live channel called `name` into `*info`.
///
/// # Safety
/// `mb` is NULL or a live mailbox; `name` is NULL or NUL-terminated; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_channel(
    mb: *const MeshMailbox,
    name: *const c_char,
    info: *mut MeshChannelInfo,
) -> MeshStatus {
    guard(|| {
        if mb.is_null() || info.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_channel: mb and info must not be NULL");
        }
        // SAFETY: NULL or NUL-terminated by the caller's contract.
        let name = match unsafe { c_str(name, "mesh_shm_channel: name") } {
            Ok(n) => n,
            Err(code) => return code,
        };
        // SAFETY: a live mailbox by the caller's contract.
        match unsafe { &*mb }.mailbox.channel(name) {
            Ok(c) => {
                // SAFETY: writable by the caller's contract.
                unsafe { info.write(MeshChannelInfo::from(&c)) };
                MESH_OK
            }
            Err(e) => shm_fail(&e),
        }
    })
}

/// How many channels `MESH_CHANNELS` names (the `--bind` options of `meshd spawn`).
///
/// # Safety
/// `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_bound_count(count: *mut u32) -> MeshStatus {
    guard(|| {
        if count.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_bound_count: count is NULL");
        }
        match bound_names() {
            Ok(names) => {
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "one environment variable names far fewer than 2^32 channels"
                )]
                let n = names.len() as u32;
                // SAFETY: writable by the caller's contract.
                unsafe { count.write(n) };
                MESH_OK
            }
            Err(code) => code,
        }
    })
}

/// Looks up channel `i` of `MESH_CHANNELS` (bind order) into `*info`; its name into `name`
/// (`name_len` bytes, NUL-terminated, truncated to fit) unless `name` is NULL.
///
/// # Safety
/// `mb` is NULL or a live mailbox; `info` is NULL or writable; `name` is NULL or `name_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_bound_channel(
    mb: *const MeshMailbox,
    i: u32,
    info: *mut MeshChannelInfo,
    name: *mut c_char,
    name_len: usize,
) -> MeshStatus {
    guard(|| {
        if mb.is_null() || info.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_bound_channel: mb and info must not be NULL");
        }
        let names = match bound_names() {
            Ok(n) => n,
            Err(code) => return code,
        };
        let Some(found) = names.get(i as usize) else {
            return fail(MESH_ERR_ARG, format!("binding {i}: MESH_CHANNELS names {} channels", names.len()));
        };
        // SAFETY: a live mailbox by the caller's contract.
        let c = match unsafe { &*mb }.mailbox.channel(found) {
            Ok(c) => c,
            Err(e) => return shm_fail(&e),
        };
        // SAFETY: writable by the caller's contract.
        unsafe { info.write(MeshChannelInfo::from(&c)) };
        if !name.is_null() && name_len > 0 {
            let n = found.len().min(name_len - 1);
            // SAFETY: `name` has `name_len` writable bytes; `n + 1 <= name_len`.
            unsafe {
                std::ptr::copy_nonoverlapping(found.as_ptr().cast::<c_char>(), name, n);
                name.add(n).write(0);
            }
        }
        MESH_OK
    })
}

/// Builds the `mesh_ctx` a kernel of this process gets: `device_base` (the mailbox's device address
/// in the kernel's context) and the channels `names[0..count]` as bindings 0, 1, … (`names` NULL: the
/// channels of `MESH_CHANNELS`, `count` ignored). At most [`MESH_SHM_MAX_BINDINGS`] channels.
///
/// # Safety
/// `mb` is NULL or a live mailbox; `names` is NULL or `count` NUL-terminated strings (or NULLs,
/// refused); `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_shm_ctx(
    mb: *const MeshMailbox,
    device_base: u64,
    names: *const *const c_char,
    count: u32,
    out: *mut MeshShmCtx,
) -> MeshStatus {
    guard(|| {
        if mb.is_null() || out.is_null() {
            return fail(MESH_ERR_NULL, "mesh_shm_ctx: mb and out must not be NULL");
        }
        let list: Vec<String> = if names.is_null() {
            match bound_names() {
                Ok(n) => n,
                Err(code) => return code,
            }
        } else {
            // Before any of them is read: `names` holds `count` pointers, and a count past the
            // most a ctx holds (a stray negative number) would have the loop read past the array.
            if count as usize > MESH_SHM_MAX_BINDINGS {
                return fail(MESH_ERR_ARG, format!("{count} channels: a mesh_ctx holds {MESH_SHM_MAX_BINDINGS}"));
            }
            let mut v = Vec::new();
            for i in 0..count as usize {
                // SAFETY: `names` holds `count` pointers by the caller's contract.
                let p = unsafe { names.add(i).read() };
                // SAFETY: NULL (refused) or NUL-terminated by the caller's contract.
                match unsafe { c_str(p, "mesh_shm_ctx: a channel name") } {
                    Ok(n) => v.push(n.to_string()),
                    Err(code) => return code,
                }
            }
            v
        };
        if list.len() > MESH_SHM_MAX_BINDINGS {
            return fail(MESH_ERR_ARG, format!("{} channels: a mesh_ctx holds {MESH_SHM_MAX_BINDINGS}", list.len()));
        }
        #[allow(clippy::cast_possible_truncation, reason = "at most MESH_SHM_MAX_BINDINGS (checked above)")]
        let binding_count = list.len() as u32;
        let mut ctx = MeshShmCtx { base: device_base, slot: u32::MAX, binding_count, ..Default::default() };
        for (b, name) in ctx.bindings.iter_mut().zip(&list) {
            // SAFETY: a live mailbox by the caller's contract.
            match unsafe { &*mb }.mailbox.channel(name) {
                Ok(c) if c.placement != mesh_shm::Placement::Host => {
                    return shm_fail(&mesh_shm::ShmError::DevicePlacement { channel: c.name });
                }
                Ok(c) if !c.protocol.gpu_bindable() => {
                    return shm_fail(&mesh_shm::ShmError::HostOnly { channel: c.name, protocol: c.protocol });
                }
                Ok(c) => {
                    let Some(slots) = device_base.checked_add(c.slots_offset) else {
                        return fail(
                            MESH_ERR_ARG,
                            format!(
                                "device_base {device_base:#x}: the mailbox does not fit above it (channel {:?})",
                                c.name
                            ),
                        );
                    };
                    *b = MeshShmBinding {
                        ring_offset: c.ring_offset,
                        slots,
                        msg_size: c.msg_size,
                        capacity: c.capacity,
                        placement: 0,
                        protocol: c.protocol.code(),
                    }
                }
                Err(e) => return shm_fail(&e),
            }
        }
        // SAFETY: writable by the caller's contract.
        unsafe { out.write(ctx) };
        MESH_OK
    })
}
