//! mesh-cuda's own errors: what the driver layer can report, turned into the backend contract's
//! [`BackendError`] at the boundary (the blink backend, the JIT, meshd) by `From`.
//!
//! The CUDA layer is used by the MPS worker, the tests and benchmarks too: they see what failed in
//! the driver's terms (the call and its `CUresult`) and can ask for the code, not search a message.

use std::ffi::CStr;
use std::fmt;

use cudarc::driver::sys;
use mesh_backend::BackendError;

/// A driver call that failed: the entry point and its `CUresult` (after cudarc's `DriverError`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DriverError {
    /// The entry point (`cuModuleLoadData`).
    pub call: &'static str,
    /// What it returned.
    pub code: sys::CUresult,
}

impl DriverError {
    /// The driver's own `CUDA_ERROR_NAME: message` for the code.
    pub fn message(&self) -> String {
        describe(self.code)
    }
}

/// `CUDA_ERROR_NAME: the driver's message`.
pub fn describe(code: sys::CUresult) -> String {
    let e = cudarc::driver::DriverError(code);
    // A code the driver does not know has no name or text.
    let s = |r: Result<&CStr, _>| r.map_or_else(|_| "?".to_string(), |c| c.to_string_lossy().into_owned());
    format!("{}: {}", s(e.error_name()), s(e.error_string()))
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.message(), self.code as u32)
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DriverError({self})")
    }
}

impl std::error::Error for DriverError {}

/// What the CUDA layer refuses or fails with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[allow(missing_docs, reason = "a field whose name says what it is (reason) needs no line of its own")]
pub enum CudaError {
    /// No CUDA driver library could be loaded, or it lacks an entry point.
    #[error("CUDA driver unavailable: {0}")]
    NoDriver(String),
    /// The driver loaded but there is no usable GPU.
    #[error("no usable GPU: {0}")]
    NoDevice(String),
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A green context of that many SMs cannot be made on this device.
    #[error("green context of {asked} SMs refused: {detail}")]
    SmPartition {
        /// SMs asked for.
        asked: u32,
        /// The device's minimum, alignment and count.
        detail: String,
    },
    /// An argument the driver would misread (a kernel name holding a NUL, a stream of another context).
    #[error("{what}: {reason}")]
    Invalid {
        /// What was refused.
        what: String,
        reason: String,
    },
    /// The mailbox could not be registered for the GPU.
    #[error("registering {path} ({len} bytes) for the GPU: {source}{hint}")]
    Register {
        /// The mailbox file.
        path: String,
        /// Bytes of its mapping.
        len: usize,
        /// The driver's error.
        source: DriverError,
        /// What to do about it, where meshd can tell (empty, or starting with "; ").
        hint: String,
    },
}

impl CudaError {
    /// The driver's code, when a driver call failed.
    pub fn code(&self) -> Option<sys::CUresult> {
        match self {
            CudaError::Driver(e) | CudaError::Register { source: e, .. } => Some(e.code),
            _ => None,
        }
    }
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::NoDriver(m) => BackendError::NoDriver(m),
            CudaError::NoDevice(m) => BackendError::NoDevice(m),
            CudaError::Driver(d) => BackendError::Cuda { call: d.call, code: d.code as u32, message: d.message() },
            CudaError::SmPartition { asked, detail } => BackendError::SmPartition { asked, detail },
            CudaError::Invalid { what, reason } => BackendError::Invalid { what, reason },
            e @ CudaError::Register { .. } => BackendError::Mailbox(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_becomes_the_contracts_kind_with_the_same_text() {
        let cases = [
            CudaError::NoDriver("libcuda absent".into()),
            CudaError::NoDevice("0 devices".into()),
            CudaError::SmPartition { asked: 3, detail: "at least 8".into() },
            CudaError::Invalid { what: "kernel name".into(), reason: "holds a NUL".into() },
        ];
        for e in cases {
            let text = e.to_string();
            let contract = BackendError::from(e.clone());
            assert_eq!(contract.to_string(), text, "{e:?}");
        }
        assert!(matches!(BackendError::from(CudaError::NoDriver(String::new())), BackendError::NoDriver(_)));
        assert!(matches!(
            BackendError::from(CudaError::SmPartition { asked: 3, detail: String::new() }),
            BackendError::SmPartition { asked: 3, .. }
        ));
    }
}
