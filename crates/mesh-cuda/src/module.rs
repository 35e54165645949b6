//! Modules and functions: load a cubin, find `mesh_main`, read its attributes and occupancy, launch it.

use std::ffi::{CString, c_void};

use cudarc::driver::sys::{self, CUfunction_attribute as FA};
use mesh_backend::{BackendError, LaunchShape};
use mesh_shm::MeshCtx;

use crate::context::{Context, Stream};
use crate::driver::check;

/// A loaded module, unloaded on drop (which waits for its kernels: unload only stopped programs).
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    ctx: Context,
}

// SAFETY: modules may be used from any thread with their context current.
unsafe impl Send for Module {}

/// What the driver says about a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionAttributes {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u32,
    /// Local memory per thread, bytes.
    pub local_bytes: u32,
    /// Largest block this kernel can be launched with.
    pub max_threads_per_block: u32,
}

impl Module {
    /// Loads `cubin` into `ctx` (made current).
    pub fn load(ctx: &Context, cubin: &[u8]) -> Result<Self, BackendError> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the driver parses the image; it copies what it needs before returning.
        check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut raw, cubin.as_ptr().cast()) })?;
        Ok(Self { raw, ctx: ctx.clone() })
    }

    /// The kernel called `name`.
    pub fn function(&self, name: &str) -> Result<Function<'_>, BackendError> {
        let cname = CString::new(name)
            .map_err(|_| BackendError::Invalid { what: "kernel name".into(), reason: "holds a NUL".into() })?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live module and a NUL-terminated name.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut raw, self.raw, cname.as_ptr()) })?;
        Ok(Function { raw, module: self })
    }

    /// The context it was loaded in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`, unloaded once; an error cannot be acted on in Drop.
        unsafe {
            let _ = self.ctx.bind();
            sys::cuModuleUnload(self.raw);
        }
    }
}

/// A kernel of a loaded module.
#[derive(Debug, Clone, Copy)]
pub struct Function<'m> {
    raw: sys::CUfunction,
    module: &'m Module,
}

impl Function<'_> {
    fn attr(&self, a: FA) -> Result<u32, BackendError> {
        let mut v = 0;
        // SAFETY: a live function, valid out-pointer.
        check("cuFuncGetAttribute", unsafe { sys::cuFuncGetAttribute(&mut v, a, self.raw) })?;
        Ok(v as u32)
    }

    /// Registers, shared and local memory, largest block.
    pub fn attributes(&self) -> Result<FunctionAttributes, BackendError> {
        Ok(FunctionAttributes {
            registers: self.attr(FA::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            shared_bytes: self.attr(FA::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            local_bytes: self.attr(FA::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_threads_per_block: self.attr(FA::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        })
    }

    /// Blocks of `shape` that fit on one SM at once.
    pub fn max_active_blocks_per_sm(&self, shape: &LaunchShape) -> Result<u32, BackendError> {
        self.module.ctx.bind()?;
        let mut n = 0;
        // SAFETY: a live function, valid out-pointer.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                self.raw,
                shape.threads_per_block() as i32,
                shape.shared_mem as usize,
            )
        })?;
        Ok(n as u32)
    }

    /// The raw handle, valid while its module is loaded (for launch paths that cache it).
    pub fn raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// Launches the kernel with `ctx` as its one by-value argument, on `stream`. Returns at once.
    pub fn launch(&self, shape: &LaunchShape, stream: &Stream, ctx: &MeshCtx) -> Result<(), BackendError> {
        self.module.ctx.bind()?;
        // SAFETY: `self` borrows its module, so the function is loaded; the context is current.
        unsafe { launch_raw(self.raw, shape, stream, ctx) }
    }
}

/// Launches `func` (a `mesh_main`) with `ctx` by value on `stream`, without making its context current.
///
/// # Safety
/// `func` must belong to a module that is still loaded, in the context current on this thread,
/// which must also be `stream`'s context.
pub unsafe fn launch_raw(
    func: sys::CUfunction,
    shape: &LaunchShape,
    stream: &Stream,
    ctx: &MeshCtx,
) -> Result<(), BackendError> {
    let mut arg = *ctx;
    let mut params = [(&raw mut arg).cast::<c_void>()];
    // SAFETY: mesh_main takes one mesh_ctx by value, which `MeshCtx` mirrors (checked against
    // mesh.cuh); the driver copies the argument before returning; the caller vouches for `func`.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            func,
            shape.grid[0],
            shape.grid[1],
            shape.grid[2],
            shape.block[0],
            shape.block[1],
            shape.block[2],
            shape.shared_mem,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}
