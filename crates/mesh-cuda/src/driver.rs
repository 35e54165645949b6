//! The driver's `result` layer: libcuda found and checked once, every call's CUresult turned into an error value.
//!
//! cudarc's dynamically loaded sys layer panics when libcuda or a symbol is
//! missing; a daemon must report that instead. [`init`] therefore checks the
//! library and every entry point this crate calls before the first call, and
//! only then runs `cuInit`.

use std::sync::OnceLock;

use cudarc::driver::sys;

pub use crate::error::describe;
use crate::error::{CudaError, DriverError};

/// Every driver entry point mesh-cuda calls, by the name cudarc resolves.
const ENTRY_POINTS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cuCtxSetCurrent",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncGetAttribute",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostGetDevicePointer_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8Async",
    "cuLaunchKernel",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuGetErrorString",
    "cuGetErrorName",
];

/// Entry points needed only for green contexts (CUDA 12.4+ drivers).
pub(crate) const GREEN_ENTRY_POINTS: &[&str] = &[
    "cuDeviceGetDevResource",
    "cuDevSmResourceSplitByCount",
    "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate",
    "cuGreenCtxDestroy",
    "cuCtxFromGreenCtx",
    "cuGreenCtxStreamCreate",
];

/// The driver, checked and initialised.
#[derive(Debug, Clone, Copy)]
pub struct Driver {
    /// `cuDriverGetVersion`: 13000 for CUDA 13.0.
    pub version: i32,
}

/// Loads and initialises the driver once per process; the same error every time if that failed.
pub fn init() -> Result<Driver, CudaError> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: probing for the library only dlopens candidate names.
            if !unsafe { sys::is_culib_present() } {
                let names = cudarc::get_lib_name_candidates("cuda");
                return Err(format!(
                    "libcuda could not be loaded (tried {}); is the NVIDIA driver installed?",
                    names.join(", ")
                ));
            }
            if let Some(missing) = missing_symbols(ENTRY_POINTS).first() {
                return Err(format!("libcuda lacks {missing}: the driver is too old for meshd"));
            }
            // Every entry point was checked above, so cudarc's call does not panic.
            if let Err(e) = cudarc::driver::result::init() {
                return Err(format!("cuInit: {}", describe(e.0)));
            }
            let mut version = 0;
            // SAFETY: valid out-pointer.
            unsafe { sys::cuDriverGetVersion(&mut version) };
            Ok(Driver { version })
        })
        .clone()
        .map_err(|e| match e {
            e if e.contains("cuInit") => CudaError::NoDevice(e),
            e => CudaError::NoDriver(e),
        })
}

/// The entry points of `names` that libcuda does not export.
pub(crate) fn missing_symbols(names: &[&'static str]) -> Vec<&'static str> {
    // SAFETY: only called after is_culib_present() said the library loads, so culib() does not panic.
    let lib = unsafe { sys::culib() };
    names
        .iter()
        .copied()
        .filter(|name| {
            let mut bytes = name.as_bytes().to_vec();
            bytes.push(0);
            // SAFETY: looking a symbol up does not call it.
            unsafe { lib.get::<*const std::ffi::c_void>(bytes.as_slice()) }.is_err()
        })
        .collect()
}

/// Names the entry point behind an error of cudarc's result layer (a bare `CUresult`).
pub(crate) fn named(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> DriverError {
    move |e| DriverError { call, code: e.0 }
}

/// Turns a CUresult into `Ok` or an error naming the call.
pub fn check(call: &'static str, code: sys::CUresult) -> Result<(), DriverError> {
    if code == sys::CUresult::CUDA_SUCCESS { Ok(()) } else { Err(DriverError { call, code }) }
}
