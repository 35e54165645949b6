//! meshd's MPS backend: a private MPS control daemon, a pool of worker processes, loads that halt no other program.
//!
//! * [`control`]: the daemon (`nvidia-cuda-mps-control -f` as meshd's child, pipe and log directories
//!   of mode 0700), its commands, and the membership check (`get_server_list`, `get_client_list`).
//! * [`worker`]: a worker process as meshd sees it; [`news`]: what the workers say unasked, and
//!   when each was last heard.
//! * [`pool`]: the pool's policy (a load past it refused unless `--pool-grow`) and its counters for `info`.
//! * [`standby`]: a second MPS server whose idle workers take the programs over after a fault
//!   (`meshd run --standby N`, by default as many as the pool).
//! * [`MpsBackend`]: the backend; [`native_pipe_dir`] and [`check_native`] for native GPU workers.
//! * [`orphans`]: workers that outlive meshd (`--orphan-grace-ms`): the keeper, the hello and retire
//!   at an orphan's rendezvous, and a start's clearing of what a previous meshd left running.
//!
//! **Outliving meshd.** Under an orphan grace G > 0 ([`DEFAULT_ORPHAN_GRACE`] by default) the
//! daemons, the workers and a keeper are detached (with G = 0 every child dies with meshd,
//! `PR_SET_PDEATHSIG`): after a crash of meshd each program's kernel runs on in its worker for up
//! to G, waiting at a rendezvous (`<mps dir>/orphans/<pid>.sock`); then it is stopped in order (its
//! stop, once), the worker exits, and the keeper quits the daemons once the last worker is gone. A
//! meshd started again on the same MPS directory (the default,
//! `/tmp/meshd-mps-<uid>-<hash of the mailbox path>`, is stable) within G adopts the daemon the
//! programs run on and every orphan that runs what the mailbox says ([`orphans::greet_previous`]);
//! it retires the others, and waits for their exit, before anything runs in their slots: never two
//! generations of one program at once. An orderly exit (`meshd shutdown`, SIGTERM) ends everything.
//!
//! There is no fallback to blink mode: no daemon, a worker that is not our client, or a failed
//! register refuses.

pub mod backend;
pub mod control;
pub mod mps_dir;
pub mod news;
pub mod orphans;
pub mod pool;
pub mod process;
pub mod standby;
pub mod starting;
pub mod worker;

pub use backend::{
    DEATH_LIMIT, DEATH_WINDOW, DEFAULT_ORPHAN_GRACE, MAX_CLIENTS, MpsBackend, MpsConfig, SILENCE_LIMIT,
    TERMINATE_WITHIN, device_channels_refusal,
};
pub use control::MpsControl;
/// The workers' default kernel check period and the range a worker accepts (meshd's `--mps-kernel-check-us`).
pub use mesh_mps_worker::{KERNEL_CHECK, KERNEL_CHECK_RANGE_US, PROTOCOL as WORKER_PROTOCOL};
/// The child handle [`process::spawn_tied`] returns (for meshd's native workers).
pub use shared_child::SharedChild;

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

/// Cuts native GPU worker `pid` off meshd's MPS server (`terminate_client`), so that killing it
/// afterwards cannot fail the other clients' kernels (a SIGKILL of a busy client does on the H200).
/// An error when no MPS backend runs or the worker is no client of its server.
pub fn terminate_native(pid: u32) -> Result<(), BackendError> {
    let control = backend::ACTIVE.lock().clone();
    match control {
        Some(c) => {
            let server = c.check_client(pid)?;
            c.terminate_client(server, pid, backend::TERMINATE_WITHIN)
        }
        None => Err(BackendError::MpsDaemon("no MPS backend is running (blink mode?)".into())),
    }
}
