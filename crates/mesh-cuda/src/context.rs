//! Contexts and streams: the device's primary context, or a green context holding N SMs, each with its streams.
//!
//! Driver calls act on the context current on the calling thread. Making one current costs a
//! driver call, and a blink relaunches every program with the others stopped, so this module
//! remembers per thread which [`Context`] it last made current: [`Context::make_current`] (what
//! every launch and release does) calls the driver only when another context is current, and a
//! loop of launches in one context binds once.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{result, sys};

use crate::device::Device;
use crate::driver::{check, named};
use crate::error::CudaError;

thread_local! {
    /// The id of the [`Context`] this thread last made current through this module (0: none).
    /// Ids are never reused, so a context released since can never be taken for a live one.
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// The next context id (0 is "none").
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug)]
enum Kind {
    Primary,
    Green(sys::CUgreenCtx),
}

#[derive(Debug)]
struct Inner {
    /// Unique in this process, for the thread's record of what is current.
    id: u64,
    device: Device,
    ctx: sys::CUcontext,
    kind: Kind,
    sms: u32,
}

impl Inner {
    fn new(device: &Device, ctx: sys::CUcontext, kind: Kind, sms: u32) -> Self {
        Self { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), device: device.clone(), ctx, kind, sms }
    }
}

// SAFETY: driver contexts may be used from any thread once made current there (`bind`).
unsafe impl Send for Inner {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // This thread no longer has it current, whatever the driver does with a released context.
        CURRENT.with(|c| {
            if c.get() == self.id {
                c.set(0);
            }
        });
        // Errors on release are ignored: nothing can be done with them and Drop must not panic.
        // SAFETY: the handles were created by `primary` / `green` and are released once, here.
        unsafe {
            match self.kind {
                Kind::Primary => {
                    let _ = result::primary_ctx::release(self.device.handle);
                }
                Kind::Green(g) => {
                    sys::cuGreenCtxDestroy(g);
                }
            }
        }
    }
}

/// A context: cheap to clone, released when the last clone (and every object made in it) is gone.
#[derive(Debug, Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

impl Context {
    /// The device's primary context, made current on this thread.
    pub fn primary(device: &Device) -> Result<Self, CudaError> {
        // SAFETY: a device the driver returned.
        let ctx = unsafe { result::primary_ctx::retain(device.handle) }.map_err(named("cuDevicePrimaryCtxRetain"))?;
        let c = Self { inner: Arc::new(Inner::new(device, ctx, Kind::Primary, device.sm_count)) };
        c.bind()?;
        Ok(c)
    }

    /// A green context of `sms` SMs (checked against the device's partitioning first), made current.
    pub fn green(device: &Device, sms: u32) -> Result<Self, CudaError> {
        let part = device.sm_partitioning()?;
        part.check(sms)?;
        // SAFETY: plain data; zero is a valid starting value.
        let mut input: sys::CUdevResource = unsafe { std::mem::zeroed() };
        // SAFETY: valid device and out-pointer.
        check("cuDeviceGetDevResource", unsafe {
            sys::cuDeviceGetDevResource(device.handle, &mut input, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM)
        })?;
        // SAFETY: plain data.
        let mut group: sys::CUdevResource = unsafe { std::mem::zeroed() };
        // SAFETY: plain data.
        let mut rest: sys::CUdevResource = unsafe { std::mem::zeroed() };
        let mut groups = 1u32;
        // SAFETY: one result slot for one group; input from the device.
        check("cuDevSmResourceSplitByCount", unsafe {
            sys::cuDevSmResourceSplitByCount(&mut group, &mut groups, &input, &mut rest, 0, sms)
        })?;
        if groups != 1 {
            return Err(CudaError::SmPartition { asked: sms, detail: format!("the driver made {groups} groups") });
        }
        // SAFETY: an SM resource's union holds `sm`.
        let got = unsafe { group.__bindgen_anon_1.sm.smCount };
        let mut desc = std::ptr::null_mut();
        // SAFETY: one resource, valid out-pointer.
        check("cuDevResourceGenerateDesc", unsafe { sys::cuDevResourceGenerateDesc(&mut desc, &mut group, 1) })?;
        let mut green = std::ptr::null_mut();
        // SAFETY: the descriptor was just generated; CU_GREEN_CTX_DEFAULT_STREAM is the documented flag.
        check("cuGreenCtxCreate", unsafe {
            sys::cuGreenCtxCreate(
                &mut green,
                desc,
                device.handle,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
        })?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a live green context.
        if let Err(e) = check("cuCtxFromGreenCtx", unsafe { sys::cuCtxFromGreenCtx(&mut ctx, green) }) {
            // SAFETY: created above, not shared.
            unsafe { sys::cuGreenCtxDestroy(green) };
            return Err(e.into());
        }
        let c = Self { inner: Arc::new(Inner::new(device, ctx, Kind::Green(green), got)) };
        c.bind()?;
        Ok(c)
    }

    /// After a fault (a fault is sticky: every later call in the context fails): resets the device's
    /// primary context in place (`cuDevicePrimaryCtxReset`: every module, stream and registration of
    /// it is destroyed). Only for a primary context, and only once every object made in it is gone
    /// (their handles die with it); retain a fresh [`Context::primary`] afterwards. A green context
    /// is recovered by destroying it (drop the last clone) and creating another.
    pub fn reset_primary(&self) -> Result<(), CudaError> {
        if !matches!(self.inner.kind, Kind::Primary) {
            return Err(CudaError::Invalid {
                what: "context reset".into(),
                reason: "only the primary context is reset in place; recreate a green context".into(),
            });
        }
        CURRENT.with(|c| {
            if c.get() == self.inner.id {
                c.set(0);
            }
        });
        // SAFETY: a valid device; the caller guarantees no object of the context is used afterwards.
        check("cuDevicePrimaryCtxReset", unsafe { sys::cuDevicePrimaryCtxReset_v2(self.inner.device.handle) })?;
        Ok(())
    }

    /// Makes this context current on the calling thread (driver calls act on the current context),
    /// with a driver call whatever this thread had current.
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: a live context handle.
        unsafe { result::ctx::set_current(self.inner.ctx) }.map_err(named("cuCtxSetCurrent"))?;
        CURRENT.with(|c| c.set(self.inner.id));
        Ok(())
    }

    /// Makes this context current on the calling thread unless this module already did so: no
    /// driver call when it is current, so launching many programs in one context binds once.
    pub fn make_current(&self) -> Result<(), CudaError> {
        if CURRENT.with(Cell::get) == self.inner.id {
            return Ok(());
        }
        self.bind()
    }

    /// Whether `other` is the same driver context (a clone, or the device's primary context retained again).
    pub fn same(&self, other: &Context) -> bool {
        // Both handles are live (each `Context` holds its own), so equal handles are one context.
        self.inner.ctx == other.inner.ctx
    }

    /// The raw handle (for tests that call the driver directly).
    pub fn raw(&self) -> sys::CUcontext {
        self.inner.ctx
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// SMs this context may use (all of them for the primary context).
    pub fn sms(&self) -> u32 {
        self.inner.sms
    }

    /// Whether this is a green context.
    pub fn is_green(&self) -> bool {
        matches!(self.inner.kind, Kind::Green(_))
    }

    /// A new non-blocking stream in this context.
    pub fn stream(&self) -> Result<Stream, CudaError> {
        self.make_current()?;
        let mut stream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a live (green) context, current on this thread; `stream` is a valid out-pointer.
        let (call, code) = unsafe {
            match self.inner.kind {
                Kind::Green(g) => ("cuGreenCtxStreamCreate", sys::cuGreenCtxStreamCreate(&mut stream, g, flags, 0)),
                Kind::Primary => ("cuStreamCreate", sys::cuStreamCreate(&mut stream, flags)),
            }
        };
        check(call, code)?;
        Ok(Stream { raw: stream, ctx: self.clone() })
    }
}

/// What a stream's work is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamState {
    /// Everything queued has finished.
    Idle,
    /// Work is still running.
    Busy,
    /// The work failed (a fault in the kernel); the driver's message.
    Failed(String),
}

impl From<StreamState> for mesh_backend::KernelRun {
    fn from(s: StreamState) -> Self {
        match s {
            StreamState::Idle => Self::Returned,
            StreamState::Busy => Self::Running,
            StreamState::Failed(why) => Self::Failed(why),
        }
    }
}

/// A stream, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    ctx: Context,
}

// SAFETY: streams may be used from any thread with their context current (`Context::bind`).
unsafe impl Send for Stream {}

impl Stream {
    /// The raw handle, for the launch in this crate.
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Whether the stream's work has finished, without waiting.
    pub fn state(&self) -> StreamState {
        // SAFETY: a live stream.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => StreamState::Idle,
            sys::CUresult::CUDA_ERROR_NOT_READY => StreamState::Busy,
            code => StreamState::Failed(crate::driver::describe(code)),
        }
    }

    /// Waits until the stream's work has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: a live stream.
        Ok(unsafe { result::stream::synchronize(self.raw) }.map_err(named("cuStreamSynchronize"))?)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: created in `Context::stream`, destroyed once; an error cannot be acted on here.
        let _ = unsafe { result::stream::destroy(self.raw) };
    }
}
