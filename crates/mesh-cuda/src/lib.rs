//! meshd's CUDA layer over cudarc's driver bindings (loaded at run time), and the JIT.
//!
//! Layers, after cudarc: cudarc's `sys` (raw, dynamically loaded) and `result` layers, the latter
//! wherever it has the call; [`driver`] checks libcuda and every entry point before the first call
//! (cudarc would panic on a missing one), names the entry point in each [`DriverError`], and calls
//! `sys` itself only for what cudarc's `result` lacks (green contexts, host registration with
//! flags, the primary context's reset, stream creation with flags and stream queries);
//! the owning types ([`Device`], [`Context`] and [`Stream`], [`Module`] and the [`Function`]s that
//! keep it loaded, [`RegisteredMailbox`]), whose `Drop` never panics and which hand no raw handle
//! out. Their errors are [`CudaError`], turned into the contract's `BackendError` by `From` where
//! a backend answers. [`jit`] runs nvJitLink on its own thread, after [`image`] has read what each
//! image needs (used as it is, linked, or refused). [`blink`] is the blink backend; [`slots`] what
//! it and the MPS backend do with the mailbox alike;
//! [`exported`] the device memory MPS mode shares by descriptor;
//! [`bindings`] the check of a program's declared bindings against the channels a load binds.

pub mod bindings;
pub mod blink;
pub mod context;
pub mod device;
pub mod device_ring;
pub mod driver;
pub mod entry;
pub mod error;
pub mod exported;
pub mod image;
pub mod jit;
pub mod memory;
pub mod module;
pub mod slots;

pub use blink::{BlinkBackend, BlinkConfig, BlinkTimes};
pub use context::{Context, Stream, StreamState};
pub use device::{Device, SmPartitioning};
pub use error::{CudaError, DriverError};
pub use jit::{Jit, Linked};
pub use memory::RegisteredMailbox;
pub use module::{Function, FunctionAttributes, Module};

/// The contract types this layer speaks, for crates (the MPS worker) that depend on mesh-cuda alone.
pub use mesh_backend::{BackendError, ImageKind, KernelFigures, KernelRun, LaunchShape};
