//! Modules and functions: load a cubin, find `mesh_main`, read its attributes and occupancy, launch it.
//!
//! Ownership after cudarc's safe layer: a [`Function`] holds its [`Module`] (an `Arc`), and the
//! module its [`Context`], so a kernel handle can never outlive the code it names and no raw
//! `CUfunction` needs to leave this module. The module is unloaded when the last of them goes.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUfunction_attribute as FA};
use mesh_backend::{KernelFigures, LaunchShape};
use mesh_shm::MeshCtx;

use crate::context::{Context, Stream};
use crate::driver::named;
use crate::error::CudaError;

#[derive(Debug)]
struct Loaded {
    raw: sys::CUmodule,
    ctx: Context,
}

// SAFETY: a module handle may be used from any thread with its context current (every use here
// makes it current first); the handle itself is only read.
unsafe impl Send for Loaded {}
// SAFETY: as above: no method mutates through the handle.
unsafe impl Sync for Loaded {}

impl Drop for Loaded {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: loaded in `Module::load`, unloaded once, here, when no Module or Function refers
        // to it any more; an error cannot be acted on in Drop.
        let _ = unsafe { result::module::unload(self.raw) };
    }
}

/// A loaded module: cheap to clone, unloaded when the last clone and the last [`Function`] of it
/// are gone (an unload waits for the context's kernels: drop it only with its programs stopped).
#[derive(Debug, Clone)]
pub struct Module {
    inner: Arc<Loaded>,
}

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

impl FunctionAttributes {
    /// kcheck's figures: these attributes with the blocks per SM of one launch shape.
    pub fn figures(&self, per_sm: u32) -> KernelFigures {
        KernelFigures {
            registers: self.registers,
            shared_bytes: self.shared_bytes,
            max_threads_per_block: self.max_threads_per_block,
            per_sm,
        }
    }
}

impl Module {
    /// Loads `cubin` into `ctx` (made current).
    pub fn load(ctx: &Context, cubin: &[u8]) -> Result<Self, CudaError> {
        ctx.make_current()?;
        // SAFETY: the driver parses the image; it copies what it needs before returning.
        let raw = unsafe { result::module::load_data(cubin.as_ptr().cast()) }.map_err(named("cuModuleLoadData"))?;
        Ok(Self { inner: Arc::new(Loaded { raw, ctx: ctx.clone() }) })
    }

    /// The kernel called `name`; it keeps this module loaded.
    pub fn function(&self, name: &str) -> Result<Function, CudaError> {
        let cname = CString::new(name)
            .map_err(|_| CudaError::Invalid { what: "kernel name".into(), reason: "holds a NUL".into() })?;
        // SAFETY: a live module and a NUL-terminated name.
        let raw =
            unsafe { result::module::get_function(self.inner.raw, cname) }.map_err(named("cuModuleGetFunction"))?;
        Ok(Function { raw, module: self.clone() })
    }

    /// The context it was loaded in.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

/// A kernel of a loaded module, holding the module loaded for as long as it lives.
#[derive(Debug, Clone)]
pub struct Function {
    raw: sys::CUfunction,
    module: Module,
}

// SAFETY: the handle stays valid while `module` is loaded, which `self` guarantees; the driver
// accepts it from any thread with the module's context current, which every use here ensures.
unsafe impl Send for Function {}
// SAFETY: as above; no method mutates through the handle.
unsafe impl Sync for Function {}

impl Function {
    fn attr(&self, a: FA) -> Result<u32, CudaError> {
        // SAFETY: a live function.
        let v =
            unsafe { result::function::get_function_attribute(self.raw, a) }.map_err(named("cuFuncGetAttribute"))?;
        Ok(v as u32)
    }

    /// Registers, shared and local memory, largest block.
    pub fn attributes(&self) -> Result<FunctionAttributes, CudaError> {
        Ok(FunctionAttributes {
            registers: self.attr(FA::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            shared_bytes: self.attr(FA::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            local_bytes: self.attr(FA::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_threads_per_block: self.attr(FA::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        })
    }

    /// Blocks of `shape` that fit on one SM at once.
    pub fn max_active_blocks_per_sm(&self, shape: &LaunchShape) -> Result<u32, CudaError> {
        self.module.context().make_current()?;
        let threads = i32::try_from(shape.threads_per_block()).unwrap_or(i32::MAX);
        // SAFETY: a live function.
        let n = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(self.raw, threads, shape.shared_mem as usize)
        }
        .map_err(named("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        Ok(n as u32)
    }

    /// kcheck's figures for `shape`: the attributes and the blocks per SM.
    pub fn figures(&self, shape: &LaunchShape) -> Result<KernelFigures, CudaError> {
        Ok(self.attributes()?.figures(self.max_active_blocks_per_sm(shape)?))
    }

    /// The module it belongs to.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Launches the kernel with `ctx` as its one by-value argument, on `stream`; returns at once.
    ///
    /// The module's context is made current only when it is not already (see
    /// [`Context::make_current`]): relaunching every program of one context binds it once.
    /// A stream of another context is refused.
    pub fn launch(&self, shape: &LaunchShape, stream: &Stream, ctx: &MeshCtx) -> Result<(), CudaError> {
        let context = self.module.context();
        if !stream.context().same(context) {
            return Err(CudaError::Invalid {
                what: "launch".into(),
                reason: "the stream belongs to another context than the kernel's module".into(),
            });
        }
        context.make_current()?;
        let mut arg = *ctx;
        let mut params = [(&raw mut arg).cast::<c_void>()];
        let (grid, block) = (shape.grid, shape.block);
        // SAFETY: `self` holds its module, so the function is loaded; its context, which is also
        // the stream's (checked above), is current on this thread. mesh_main takes one mesh_ctx by
        // value, which `MeshCtx` mirrors (checked against mesh.cuh); the driver copies the argument
        // before returning.
        unsafe {
            result::launch_kernel(
                self.raw,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                shape.shared_mem,
                stream.raw(),
                &mut params,
            )
        }
        .map_err(named("cuLaunchKernel"))?;
        Ok(())
    }
}
