//! meshd's CUDA layer over cudarc's driver bindings (loaded at run time), and the JIT.
//!
//! Layers, after cudarc: cudarc's `sys` (raw, dynamically loaded); [`driver`] (the `result` layer:
//! libcuda and every entry point checked before the first call, each CUresult an error value);
//! the owning types ([`Device`], [`Context`] and [`Stream`], [`Module`], [`RegisteredMailbox`]),
//! whose `Drop` never panics. [`jit`] runs nvJitLink on its own thread, after [`image`] has read
//! what each image needs (used as it is, linked, or refused).

pub mod blink;
pub mod context;
pub mod device;
pub mod driver;
pub mod image;
pub mod jit;
pub mod memory;
pub mod module;

pub use blink::{BlinkBackend, BlinkConfig, BlinkTimes};
pub use context::{Context, Stream, StreamState};
pub use device::{Device, SmPartitioning};
pub use jit::{Jit, Linked};
pub use memory::RegisteredMailbox;
pub use module::{Function, FunctionAttributes, Module};

/// The contract types this layer speaks, for crates (the MPS worker) that depend on mesh-cuda alone.
pub use mesh_backend::{BackendError, ImageKind, LaunchShape};
