//! meshd's MPS backend: a private MPS control daemon, a pool of worker processes, loads that halt no other program.
//!
//! * [`control`]: the daemon (`nvidia-cuda-mps-control -f` as meshd's child, pipe and log directories
//!   of mode 0700), its commands, and the membership check (`get_server_list`, `get_client_list`).
//! * [`worker`]: a worker process as meshd sees it.
//! * [`MpsBackend`]: the backend; [`native_pipe_dir`] and [`check_native`] for native GPU workers.
//!
//! There is no fallback to blink mode: no daemon, a worker that is not our client, or a failed
//! register refuses.

pub mod backend;
pub mod control;
mod process;
pub mod worker;

pub use backend::{MAX_CLIENTS, MpsBackend, MpsConfig};
pub use control::MpsControl;

use mesh_backend::BackendError;

/// Under `--isolation mps`: the pipe directory a native GPU worker must be started with
/// (`CUDA_MPS_PIPE_DIRECTORY`) to be a client of meshd's server; `None` in blink mode.
pub fn native_pipe_dir() -> Option<std::path::PathBuf> {
    backend::ACTIVE.lock().as_ref().map(|c| c.pipe_dir())
}

/// A native GPU worker that said `ready` must be a client of our server: the driver silently runs a
/// process that cannot reach the server as a plain context, so this check is the only proof.
pub fn check_native(pid: u32) -> Result<(), BackendError> {
    let control = backend::ACTIVE.lock().clone();
    match control {
        Some(c) => c.check_client(pid).map(|_| ()),
        None => Err(BackendError::MpsDaemon("no MPS backend is running (blink mode?)".into())),
    }
}
