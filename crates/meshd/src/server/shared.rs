//! What every thread of the control plane shares: the published snapshot, the stop flag and the accept loop's waker, the limits, the native workers, the metrics, the recovery board and the services.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use mesh_backend::pool::PoolFigures;
use mesh_backend::{IsolationMode, ProgramState, ProgramStatus, RecoveryBoard};
use mesh_shm::Mailbox;
use mesh_shm::layout::STATE_EXITED;
use parking_lot::Mutex;

use super::limits::Limits;
use super::services::Services;
use crate::metrics::{Metrics, beats_of};
use crate::native::Natives;
use crate::start::DeviceId;

/// What `ps` and `info` read without asking the backend.
#[derive(Debug, Clone)]
pub(super) struct Snapshot {
    pub(super) programs: Vec<ProgramStatus>,
    pub(super) mode: IsolationMode,
    pub(super) device: String,
    pub(super) host_atomics: bool,
    /// The MPS pool's figures, read fresh by each `info`.
    pub(super) pool: Option<PoolFigures>,
}

/// Wakes the accept loop (a byte on a socket it polls). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Waker(pub(super) Arc<UnixStream>);

impl Waker {
    /// Asks the accept loop to look at the stop flag.
    pub(super) fn wake(&self) {
        // Non-blocking: a full buffer already holds a wakeup.
        let _ = (&*self.0).write(&[1]);
    }
}

/// A handle that stops a running server (what SIGINT / SIGTERM do).
#[derive(Debug, Clone)]
pub struct StopHandle {
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) waker: Waker,
}

impl StopHandle {
    /// Asks the server to stop: queued changes are refused, every program stopped, `run` returns.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.waker.wake();
    }
}

pub(super) struct Shared {
    pub(super) mailbox: Mailbox,
    pub(super) snapshot: Mutex<Arc<Snapshot>>,
    /// Set by a signal, a stop handle or a shutdown request: changes are refused from then on.
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) limits: Limits,
    pub(super) own_uid: u32,
    pub(super) connections: AtomicUsize,
    pub(super) waker: Waker,
    /// Native GPU workers (`meshd spawn`).
    pub(super) natives: Natives,
    /// The GPU's UUID and how `--device` named it, for `info` ([`Server::set_device`]).
    pub(super) device_id: OnceLock<DeviceId>,
    /// What the monitoring endpoint and `meshd metrics` read beside the snapshot.
    pub(super) metrics: Arc<Metrics>,
    /// The one recovery board: the backend marks a recovery in place on it as it happens (it is
    /// handed over the moment the backend opens), and `ps`, `/readyz` and `/metrics` read it here,
    /// never waiting for the backend thread, which is inside that recovery's one long call.
    pub(super) board: RecoveryBoard,
    /// The services' owners, leases and the watcher of clients adopted at start.
    pub(super) services: Arc<Services>,
}

impl Shared {
    pub(super) fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.lock().clone()
    }

    pub(super) fn publish(&self, programs: Vec<ProgramStatus>) {
        let fresh: Vec<ProgramStatus> = programs.iter().map(|p| fresh(&self.mailbox, p)).collect();
        self.metrics.observe_heartbeats(beats_of(&fresh));
        let mut s = self.snapshot.lock();
        let mut next = (**s).clone();
        next.programs = programs;
        *s = Arc::new(next);
    }
}

/// `p` with what its slot says now: the heartbeat, and an exit the backend has not seen yet.
pub(super) fn fresh(mailbox: &Mailbox, p: &ProgramStatus) -> ProgramStatus {
    let mut p = p.clone();
    if let Ok(slot) = mailbox.slot(p.slot) {
        let now = slot.status();
        p.heartbeat = now.heartbeat;
        // Only an exit is taken from the slot: a stop happens at the backend's request, and it publishes that itself.
        if p.state == ProgramState::Running && now.state == STATE_EXITED {
            p.state = ProgramState::Exited(now.exit_code);
        }
    }
    p
}
