//! Host registration: the mailbox's mapping made visible to kernels (`DEVICEMAP | PORTABLE`), released on drop.

use cudarc::driver::sys;
use mesh_shm::Mailbox;

use crate::context::Context;
use crate::driver::check;
use crate::error::CudaError;

/// The mailbox registered in a context: its device address, unregistered on drop.
#[derive(Debug)]
pub struct RegisteredMailbox {
    host: *mut u8,
    device: u64,
    len: usize,
    ctx: Context,
    _mailbox: Mailbox,
}

// SAFETY: the registration is a process-wide driver object; the pointer is only handed to the driver.
unsafe impl Send for RegisteredMailbox {}

impl RegisteredMailbox {
    /// Registers the whole mapping of `mailbox` in `ctx`.
    pub fn register(ctx: &Context, mailbox: &Mailbox) -> Result<Self, CudaError> {
        Self::register_in(ctx, mailbox, false)
    }

    /// Registers it again after the context that held it was reset or destroyed after a fault: a
    /// registration the driver still holds for the range (its unregister failed in the faulted
    /// context) is released first. Only for the process's one registration of this mailbox.
    pub fn register_again(ctx: &Context, mailbox: &Mailbox) -> Result<Self, CudaError> {
        Self::register_in(ctx, mailbox, true)
    }

    fn register_in(ctx: &Context, mailbox: &Mailbox, replace_stale: bool) -> Result<Self, CudaError> {
        ctx.bind()?;
        let (host, len) = mailbox.as_raw_parts();
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: a page-aligned shared mapping of `len` bytes that `_mailbox` keeps alive until drop.
        let mut registered = check("cuMemHostRegister", unsafe { sys::cuMemHostRegister_v2(host.cast(), len, flags) });
        let stale = matches!(&registered, Err(e) if e.code == sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        if replace_stale && stale {
            // A registration that outlived its context (a faulted context whose unregister failed):
            // meshd owns this mapping, so it is released and registered again in `ctx`.
            // SAFETY: the same range; unregistering a stale registration touches no live object.
            unsafe { sys::cuMemHostUnregister(host.cast()) };
            // SAFETY: as above.
            registered = check("cuMemHostRegister", unsafe { sys::cuMemHostRegister_v2(host.cast(), len, flags) });
        }
        registered.map_err(|source| CudaError::Register {
            path: mailbox.path().display().to_string(),
            len,
            source,
            hint: not_tmpfs_hint(mailbox.path()),
        })?;
        let mut device = 0;
        // SAFETY: the range was just registered with DEVICEMAP.
        if let Err(e) = check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0)
        }) {
            // SAFETY: registered above, not yet shared.
            unsafe { sys::cuMemHostUnregister(host.cast()) };
            return Err(e.into());
        }
        Ok(Self { host, device, len, ctx: ctx.clone(), _mailbox: mailbox.clone() })
    }

    /// The mailbox's address in device code.
    pub fn device_address(&self) -> u64 {
        self.device
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is registered (never: a mailbox has a header page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Why a mailbox file may not register, where the file says: on the H200 a mailbox on a disk
/// filesystem (`/tmp` there) failed `cuMemHostRegister` with INVALID_VALUE, and every mailbox on tmpfs
/// (`/dev/shm`, the default) registered. Empty when the file is on tmpfs or its filesystem is unknown.
pub fn not_tmpfs_hint(path: &std::path::Path) -> String {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let Ok(fs) = rustix::fs::statfs(path) else { return String::new() };
    #[allow(clippy::cast_sign_loss)] // f_type is a magic number, compared bit for bit
    let kind = fs.f_type as u64;
    if kind == TMPFS_MAGIC {
        return String::new();
    }
    format!(
        "; the mailbox is not on tmpfs (filesystem type {kind:#x}): the GPU maps host memory the driver can pin, \
         so put it under /dev/shm (the default --shm) or another tmpfs"
    )
}

impl Drop for RegisteredMailbox {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: registered in `register`, unregistered once; errors cannot be acted on in Drop.
        unsafe { sys::cuMemHostUnregister(self.host.cast()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mailbox_off_tmpfs_is_told_to_move_to_dev_shm() {
        assert_eq!(not_tmpfs_hint(std::path::Path::new("/dev/shm")), "", "/dev/shm is tmpfs");
        assert_eq!(not_tmpfs_hint(std::path::Path::new("/nonexistent/mailbox")), "", "unknown: no guess");
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let hint = not_tmpfs_hint(here);
        let on_tmpfs = rustix::fs::statfs(here).is_ok_and(|fs| fs.f_type == 0x0102_1994);
        if on_tmpfs {
            assert_eq!(hint, "");
        } else {
            assert!(hint.contains("not on tmpfs") && hint.contains("/dev/shm"), "{hint}");
        }
    }
}
