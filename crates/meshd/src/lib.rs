//! meshd as a library: the control protocol, the control plane over any [`mesh_backend::Backend`], the crash-safe start, the desired state, the replacement of the process after a sticky GPU fault, the native GPU workers, a Rust client of the control socket ([`control`]), and the Rust client of a service ([`ServiceClient`]).
//!
//! The `meshd` binary wires these to the CUDA backends; the tests wire them to stand-ins, so that
//! everything but the GPU is tested on any machine.

pub mod control;
pub mod handoff;
pub mod health;
pub mod http;
pub mod metrics;
pub mod monitor;
pub mod native;
pub mod observe;
pub mod placement;
pub mod protocol;
pub mod replace;
pub mod server;
pub mod service_client;
pub mod stand_in;
pub mod start;
pub mod state;

pub use service_client::ServiceClient;
