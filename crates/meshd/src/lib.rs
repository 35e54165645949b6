//! meshd as a library: the control protocol, the control plane over any [`mesh_backend::Backend`], the crash-safe start and the desired state.
//!
//! The `meshd` binary wires these to the CUDA backends; the tests wire them to stand-ins, so that
//! everything but the GPU is tested on any machine.

pub mod protocol;
pub mod server;
pub mod start;
pub mod state;
