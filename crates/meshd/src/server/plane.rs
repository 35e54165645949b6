//! The control plane's handle, [`Server`]: starting it (the backend thread opened, the clients a previous meshd bound adopted), naming the GPU, the monitor, and the ways to stop it.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, OnceLock, mpsc};
use std::thread::JoinHandle;

use anyhow::{Context, Result, anyhow};
use mesh_backend::{IsolationMode, RecoveryBoard};
use mesh_shm::Mailbox;
use parking_lot::Mutex;

use super::jobs::Job;
use super::leases;
use super::limits::Limits;
use super::services::Services;
use super::shared::{Shared, Snapshot, StopHandle, Waker};
use super::stalls::StallConfig;
use super::worker::{self, Opened, Replacer};
use crate::metrics::Metrics;
use crate::monitor::Monitor;
use crate::native::Natives;
use crate::replace;
use crate::start::DeviceId;
use crate::state::StateStore;

/// A started control plane: the backend open on its thread, ready to serve a listener.
pub struct Server {
    pub(super) shared: Arc<Shared>,
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) backend: JoinHandle<bool>,
    pub(super) wake_rx: UnixStream,
    /// The sender the backend's waker reaches through a `Weak` (so that it never keeps the jobs
    /// channel open by itself: the backend thread still sees it disconnected once the server is gone).
    pub(super) _wake_jobs: Arc<mpsc::Sender<Job>>,
    /// How many recorded programs were relaunched at start (and how many failed).
    pub relaunched: (usize, usize),
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Server(mailbox {})", self.shared.mailbox.path().display())
    }
}

impl Server {
    /// Starts the backend thread, which calls `open` and then relaunches what `state` records;
    /// returns once the backend is open (or with its error, the thread gone).
    pub fn start<F>(mailbox: Mailbox, limits: Limits, state: Option<StateStore>, open: F) -> Result<Self>
    where
        F: FnOnce(&Mailbox) -> Result<Opened> + Send + 'static,
    {
        let replacer: Replacer = Box::new(|binary| match binary {
            Some(binary) => replace::exec(binary),
            None => replace::exec_self(),
        });
        Self::start_with(mailbox, limits, state, replacer, open)
    }

    /// [`Server::start`] with what replaces the process after a sticky fault (tests: a stand-in).
    pub fn start_with<F>(
        mailbox: Mailbox,
        limits: Limits,
        state: Option<StateStore>,
        replacer: Replacer,
        open: F,
    ) -> Result<Self>
    where
        F: FnOnce(&Mailbox) -> Result<Opened> + Send + 'static,
    {
        let (wake_tx, wake_rx) = UnixStream::pair().context("the accept loop's wake socket")?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            mailbox: mailbox.clone(),
            snapshot: Mutex::new(Arc::new(Snapshot {
                programs: Vec::new(),
                mode: IsolationMode::default(),
                device: String::new(),
                host_atomics: false,
                pool: None,
            })),
            device_id: OnceLock::new(),
            stopping: Arc::new(AtomicBool::new(false)),
            limits,
            own_uid: rustix::process::getuid().as_raw(),
            connections: AtomicUsize::new(0),
            waker: Waker(Arc::new(wake_tx)),
            natives: Natives::new(&mailbox).outliving_meshd(limits.natives_outlive_meshd),
            metrics: Arc::new(Metrics::new()),
            board: RecoveryBoard::new(),
            services: Arc::new(Services::new(&mailbox, StallConfig::of(&limits))?),
        });
        let (jobs, rx) = mpsc::channel();
        let wake_jobs = Arc::new(jobs.clone());
        let weak_jobs = Arc::downgrade(&wake_jobs);
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let for_thread = shared.clone();
        let backend = std::thread::Builder::new()
            .name("meshd-backend".into())
            .spawn(move || worker::backend_thread(&for_thread, open, state, replacer, &rx, weak_jobs, &ready_tx))
            .context("starting the backend thread")?;
        match ready_rx.recv() {
            Ok(Ok(relaunched)) => {
                // The clients a previous meshd bound (a takeover): the dead departed, the live watched.
                // Before the listener serves, so that no attach races it.
                leases::adopt(&shared.services);
                Ok(Self { shared, jobs, backend, wake_rx, _wake_jobs: wake_jobs, relaunched })
            }
            Ok(Err(e)) => {
                let _ = backend.join();
                Err(e)
            }
            Err(_) => {
                let _ = backend.join();
                Err(anyhow!("the backend thread ended while opening the backend"))
            }
        }
    }

    /// Names the GPU for `info` (its UUID, and `--device` as given); the first call wins.
    pub fn set_device(&self, id: DeviceId) {
        let _ = self.shared.device_id.set(id);
    }

    /// What the monitoring endpoint (`--metrics-addr`) serves: the metrics and health read from this server.
    pub fn monitor(&self) -> Monitor {
        Monitor::new(self.shared.metrics.clone(), self.shared.clone())
    }

    /// A handle that stops the server from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle { stopping: self.shared.stopping.clone(), waker: self.shared.waker.clone() }
    }

    /// Makes `signals` stop the server: each writes a byte to the wake socket (async-signal-safe).
    pub fn stop_on_signals(&self, signals: &[i32]) -> Result<()> {
        for &sig in signals {
            // The flag first, then the wakeup, so that the accept loop sees the flag set when it wakes.
            signal_hook::flag::register(sig, self.shared.stopping.clone())?;
            let fd = (*self.shared.waker.0).try_clone()?;
            signal_hook::low_level::pipe::register(sig, fd)?;
        }
        Ok(())
    }
}
