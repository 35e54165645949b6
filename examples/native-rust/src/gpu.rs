//! The CUDA side, with cudarc: the mailbox registered in this process's context, the kernel's
//! module, and its launch. cudarc's safe layer gives the context, stream, allocation and events;
//! the registration and the module go through its `sys` / `result` layers (its safe `load_module`
//! needs the `nvrtc` feature, which the workspace leaves off), each behind a guard that undoes it.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaStream};
use mesh_shm::{Mailbox, MeshCtx};

/// The kernel (examples/native-cuda/native_kernel.cu), as nvcc wrote it; regenerate from the repository root with
/// `nvcc -ptx -arch=compute_80 -I crates/mesh-shm/include -o examples/native-rust/native_kernel.ptx examples/native-cuda/native_kernel.cu`.
pub const PTX: &str = include_str!("../native_kernel.ptx");
/// Its entry point.
pub const KERNEL: &str = "native_exchange";

fn check(what: &str, r: CUresult) -> Result<()> {
    r.result().cuda().with_context(|| what.to_string())
}

/// A driver error as `NAME: description` (cudarc's Display is its Debug).
pub fn describe(e: DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name}: {}", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// A cudarc result with its driver error described ([`describe`]).
pub trait Cuda<T> {
    /// The value, or the error as `NAME: description`.
    fn cuda(self) -> Result<T>;
}

impl<T> Cuda<T> for Result<T, DriverError> {
    fn cuda(self) -> Result<T> {
        self.map_err(|e| anyhow::Error::msg(describe(e)))
    }
}

/// The CUDA context (the device's primary context; under `--isolation mps` an MPS client of meshd's
/// server, through `CUDA_MPS_PIPE_DIRECTORY`).
pub fn context() -> Result<Arc<CudaContext>> {
    // SAFETY: only loads libcuda (what every later call would load) to see whether it is there, so
    // that a machine without the driver gets an error rather than cudarc's panic.
    if !unsafe { sys::is_culib_present() } {
        bail!("the CUDA driver library (libcuda.so) was not found: a native GPU worker needs an NVIDIA driver");
    }
    CudaContext::new(0).cuda().context("creating the CUDA context on device 0")
}

/// The whole mailbox mapping registered with the context (`cuMemHostRegister`, `DEVICEMAP`), and
/// its device address; unregistered on drop. Keep it alive while a kernel may touch the mailbox,
/// and drop it before the mailbox's mapping.
#[derive(Debug)]
pub struct Registered {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    /// The mailbox's address in the context (`mesh_ctx.base`).
    pub device: u64,
}

impl Registered {
    /// Registers `mailbox`'s mapping in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, mailbox: &Mailbox) -> Result<Self> {
        let (host, len) = mailbox.as_raw_parts();
        let host = host.cast::<c_void>();
        ctx.bind_to_thread().cuda()?;
        // SAFETY: `host` and `len` are the mailbox's whole shared mapping (page aligned, `len` bytes),
        // which `mailbox` keeps mapped; the caller drops this registration before the mailbox.
        let r = unsafe { sys::cuMemHostRegister_v2(host, len, sys::CU_MEMHOSTREGISTER_DEVICEMAP) };
        check(&format!("cuMemHostRegister of the mailbox ({len} bytes)"), r)?;
        let mut reg = Self { ctx: ctx.clone(), host, device: 0 };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was registered with DEVICEMAP just above; `device` is a valid out pointer.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) };
        check("cuMemHostGetDevicePointer of the mailbox", r)?;
        reg.device = device;
        Ok(reg)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `host` was registered by `new` in this context and is unregistered once, here.
            let _ = unsafe { sys::cuMemHostUnregister(self.host) };
        }
    }
}

/// The kernel's module and function; unloaded on drop.
#[derive(Debug)]
pub struct Kernel {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    func: sys::CUfunction,
}

impl Kernel {
    /// Loads [`PTX`] into `ctx` (the driver JIT-compiles it for the device) and finds [`KERNEL`].
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let image = CString::new(PTX).context("the embedded PTX holds a NUL byte")?;
        ctx.bind_to_thread().cuda()?;
        // SAFETY: `image` is a NUL-terminated PTX text, alive for the call (the driver copies it).
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .cuda()
            .context("cuModuleLoadData of native_kernel.ptx")?;
        let mut k = Self { ctx: ctx.clone(), module, func: std::ptr::null_mut() };
        let name = CString::new(KERNEL).context("kernel name")?;
        // SAFETY: `module` was just loaded and is unloaded only by `drop`.
        k.func = unsafe { result::module::get_function(module, name) }
            .cuda()
            .with_context(|| format!("cuModuleGetFunction {KERNEL}"))?;
        Ok(k)
    }

    /// Launches `native_exchange(ctx, count, timeout_ns, out)` on `stream`, one warp.
    ///
    /// # Safety
    /// `ctx` must describe mailbox memory registered in the stream's context (kept registered until
    /// the kernel ends), and `out` must be device memory of at least five `u64`s in that context,
    /// kept allocated until the kernel ends.
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        ctx: MeshCtx,
        count: u64,
        timeout_ns: u64,
        out: sys::CUdeviceptr,
    ) -> Result<()> {
        let (mut ctx, mut count, mut timeout_ns, mut out) = (ctx, count, timeout_ns, out);
        let mut params: [*mut c_void; 4] =
            [(&raw mut ctx).cast(), (&raw mut count).cast(), (&raw mut timeout_ns).cast(), (&raw mut out).cast()];
        self.ctx.bind_to_thread().cuda()?;
        // SAFETY: `func` is native_exchange of this module, whose parameters are a 152-byte mesh_ctx
        // (MeshCtx, the same layout: checked against the PTX by a test), two u64 and a pointer; each
        // entry of `params` points to one of them, alive for the call (cuLaunchKernel copies them).
        // The memory they describe is the caller's contract.
        unsafe { result::launch_kernel(self.func, (1, 1, 1), (32, 1, 1), 0, stream.cu_stream(), &mut params) }
            .cuda()
            .with_context(|| format!("cuLaunchKernel {KERNEL}"))
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `module` was loaded by `load` and is unloaded once, here; no launch of it is
            // still in flight (the caller synchronizes before dropping, and unload waits otherwise).
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PTX's entry takes what `launch` passes: a mesh_ctx of `size_of::<MeshCtx>()` bytes, then three 64-bit words.
    #[test]
    fn ptx_entry_matches_the_launch() {
        let start = PTX.find(&format!(".entry {KERNEL}(")).expect("the PTX has the entry");
        let params = &PTX[start..start + PTX[start..].find(')').unwrap()];
        let params: Vec<&str> = params.lines().skip(1).map(str::trim).filter(|l| !l.is_empty()).collect();
        assert_eq!(params.len(), 4, "{params:?}");
        assert!(params[0].contains(&format!("[{}]", size_of::<MeshCtx>())), "{}", params[0]);
        assert!(params[0].contains(".align 8"), "{}", params[0]);
        for p in &params[1..] {
            assert!(p.starts_with(".param .u64"), "{p}");
        }
    }

    /// The committed PTX is what this machine's nvcc makes of native_kernel.cu, when it is the same nvcc.
    #[test]
    fn ptx_is_current_when_the_same_nvcc_is_here() {
        let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
        let Ok(v) = std::process::Command::new(&nvcc).arg("--version").output() else {
            eprintln!("SKIPPED ptx_is_current_when_the_same_nvcc_is_here: no {nvcc}");
            return;
        };
        let version = String::from_utf8_lossy(&v.stdout);
        let release = version.lines().find(|l| l.starts_with("Cuda compilation tools")).unwrap_or("?");
        if !PTX.contains(release) {
            eprintln!("SKIPPED ptx_is_current_when_the_same_nvcc_is_here: {nvcc} is {release:?}, the PTX another");
            return;
        }
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("k.ptx");
        let ok = std::process::Command::new(&nvcc)
            .current_dir(root)
            .args(["-ptx", "-arch=compute_80", "-I", "crates/mesh-shm/include", "-o"])
            .arg(&out)
            .arg("examples/native-cuda/native_kernel.cu")
            .status()
            .unwrap()
            .success();
        assert!(ok, "nvcc failed");
        let fresh = std::fs::read_to_string(&out).unwrap();
        assert!(
            fresh == PTX,
            "examples/native-rust/native_kernel.ptx is stale: regenerate it (see native_kernel.cu or src/gpu.rs)"
        );
    }
}
