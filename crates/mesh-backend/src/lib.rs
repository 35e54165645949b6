//! meshd's backend contract: what a backend (blink or MPS) is asked to do, what it reports, and how it refuses.
//!
//! * [`Backend`]: load / upgrade / unload / status / shutdown, and `host_atomics()`.
//! * [`ProgramSpec`], [`ProgramStatus`], [`IsolationMode`], [`ImageKind`], [`LaunchShape`].
//! * [`BackendError`]: one variant for each refusal the seed names, each carrying its numbers or log.
//! * [`cleanup`]: the process-wide registry of actions run once, in reverse order, at exit and on SIGINT/SIGTERM.

pub mod cleanup;
mod error;
mod spec;

pub use error::{BackendError, Result};
pub use spec::{ImageKind, IsolationMode, KernelRun, LaunchShape, ProgramSpec, ProgramState, ProgramStatus};

/// A backend hosts resident GPU programs. All calls come from meshd's control thread.
pub trait Backend: Send {
    /// Which isolation the backend gives.
    fn mode(&self) -> IsolationMode;

    /// Compiles, checks and launches a new program. A refusal leaves every running program as it was.
    fn load(&mut self, spec: ProgramSpec) -> Result<ProgramStatus>;

    /// Replaces a running program's image, keeping its slot, channels and messages.
    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus>;

    /// Stops a program and frees its slot.
    fn unload(&mut self, name: &str) -> Result<()>;

    /// Every loaded program, in load order.
    fn status(&self) -> Vec<ProgramStatus>;

    /// Stops every program and releases the GPU; later calls are refused.
    fn shutdown(&mut self) -> Result<()>;

    /// Whether host and device may share atomics on one word (`HOST_NATIVE_ATOMIC_SUPPORTED`).
    fn host_atomics(&self) -> bool;
}
