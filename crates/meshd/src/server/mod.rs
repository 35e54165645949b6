//! The control plane: every connection served on its own thread, changes applied one at a time on the backend thread, `ps` and `info` from a published snapshot.
//!
//! * **The backend thread** opens the backend and owns it until meshd ends. The MPS backend
//!   spawns its daemon and workers with `PR_SET_PDEATHSIG`, which fires when the *spawning thread*
//!   exits, so that thread must live as long as meshd; and one owner applies changes one at a time,
//!   in arrival order. After every change, and every [`Limits::refresh`], it publishes a snapshot.
//!   Between changes it is the **watchdog**: every [`Limits::watch`] (25 ms) it calls
//!   [`Backend::watch`], which polls the kernels and recovers from a fault with no request; while
//!   a recovery runs, `ps` answers from the last snapshot overlaid with the recovery board, which
//!   the backend marks from the moment it notices the fault ([`Backend::set_recovery_board`]). When the backend says the fault is
//!   sticky ([`Backend::take_replacement`], after every backend call), it records what
//!   the new process needs and replaces the process ([`crate::replace`]); the new image's backend
//!   thread relaunches the recorded programs but the culprit, which `ps` shows left stopped, and
//!   runs a culprit search's next question.
//! * **Connection threads** check the peer (SO_PEERCRED), read one bounded request, and either
//!   answer from the snapshot (`ps`, `info`, `metrics`: heartbeats read fresh from the mailbox's
//!   slots, so they never wait behind a slow client, a slow load or a backend call) or queue it for
//!   the backend thread and wait for its answer.
//! * **The accept loop** blocks in `poll` on the listener and a wake socket (written by SIGINT,
//!   SIGTERM and by the backend thread when it ends): no sleep between polls.
//! * **Service leases** (`services.rs`): a connection that attached a client to a service stays open,
//!   outside the connection limit, until the client detaches, closes it or dies.
//! * **The stall watcher** (`stalls.rs`, [`Limits::client_stall`]): one thread, started when the
//!   server runs, that revokes (or reports) a service client holding its fan-in ring's consumer.

mod listener;
mod natives;
mod recovery;
mod services;
mod stalls;
mod worker;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use mesh_backend::pool::PoolFigures;
use mesh_backend::{Backend, IsolationMode, ProgramStatus, RecoveryBoard};
use mesh_shm::Mailbox;
use parking_lot::Mutex;

use crate::metrics::Metrics;
use crate::monitor::Monitor;
use crate::native::NativeSpec;
use crate::protocol::{Request, Response};
use crate::replace;
use crate::start::DeviceId;
use crate::state::StateStore;

pub use crate::protocol::HELD_SLOT;
pub use listener::peer_allowed;
/// What replaces the process ([`crate::replace::exec_self`]); returns only when that failed, with why.
pub type Replacer = Box<dyn FnMut() -> std::io::Error + Send>;

/// The control plane's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A client that sends nothing for this long is dropped.
    pub idle: Duration,
    /// How long writing an answer to a client may block.
    pub write: Duration,
    /// Connections served at once; more are answered with a refusal and closed.
    pub max_connections: usize,
    /// How often the backend thread refreshes the snapshot when no change comes.
    pub refresh: Duration,
    /// The watchdog's tick: how often the backend thread calls [`Backend::watch`] (at most 50 ms, so
    /// that a fault is noticed within 100 ms with no request).
    pub watch: Duration,
    /// Service leases held at once (each an attached client's open connection and its thread);
    /// they do not count against `max_connections`. A group's entries bound them too.
    pub max_leases: usize,
    /// The services' stall watcher: how long one client's reservation may hold a fan-in ring's
    /// consumer before it is revoked (not yet begun: the program takes a skip, the client sends the
    /// request again) or, between the begin and the commit of a send, reported. `None`: no watcher.
    /// `meshd run` sets it from `--client-stall-ms` (50 ms unless told); `Limits::default()` leaves
    /// it off, so that an embedding (a test) opts in.
    pub client_stall: Option<Duration>,
    /// With the watcher: kill (SIGKILL) a client that has held a fan-in ring this long between the
    /// begin and the commit of a send (what cannot be revoked while it lives); its death completes
    /// the slot. `None` (the default): never.
    pub client_stall_kill: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(2),
            write: Duration::from_secs(5),
            max_connections: 128,
            refresh: Duration::from_millis(250),
            watch: mesh_backend::watch::TICK,
            max_leases: 4096,
            client_stall: None,
            client_stall_kill: None,
        }
    }
}

/// What opening a backend yields.
pub struct Opened {
    /// The backend.
    pub backend: Box<dyn Backend>,
    /// The GPU's name, for `info`.
    pub device: String,
    /// The GPU's architecture (`sm_90`): the key of the linked images stored for a replacement of
    /// the process; `None`: none are stored or used.
    pub arch: Option<String>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Opened({} on {})", self.backend.mode(), self.device)
    }
}

/// What `ps` and `info` read without asking the backend.
#[derive(Debug, Clone)]
struct Snapshot {
    programs: Vec<ProgramStatus>,
    mode: IsolationMode,
    device: String,
    host_atomics: bool,
    /// The MPS pool's figures, read fresh by each `info`.
    pool: Option<PoolFigures>,
}

/// What the connection threads answer themselves: reads of the snapshot and the mailbox, a
/// native worker's stop, and the shutdown.
#[derive(Debug)]
enum Query {
    Ps,
    Info,
    Metrics,
    Stop {
        name: String,
    },
    Shutdown,
    /// A `detach` on a connection that attached nothing.
    StrayDetach,
}

/// What only the backend thread applies, one at a time (a native worker's spawn is its own job:
/// its answer comes from the worker's waiting thread).
#[derive(Debug)]
enum Change {
    Load {
        name: String,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        bind: Vec<String>,
        sms: Option<u32>,
        no_readiness: bool,
    },
    Upgrade {
        name: String,
    },
    Unload {
        name: String,
    },
    ChannelCreate {
        name: String,
        msg_size: u32,
        capacity: u32,
        placement: String,
        protocol: String,
        parts: u32,
    },
    ServiceCreate(services::ServiceSpec),
}

impl Change {
    /// Its `op` label in the metrics.
    fn op(&self) -> &'static str {
        match self {
            Self::Load { .. } => "load",
            Self::Upgrade { .. } => "upgrade",
            Self::Unload { .. } => "unload",
            Self::ChannelCreate { .. } => "channel_create",
            Self::ServiceCreate(_) => "service_create",
        }
    }
}

/// A request's `op` label in the metrics when the backend thread applies it; `None` for the rest.
pub fn change_op(req: &Request) -> Option<&'static str> {
    match Routed::from(req.clone()) {
        Routed::Change(change) => Some(change.op()),
        Routed::Query(_) | Routed::Spawn(_) | Routed::Attach { .. } => None,
    }
}

/// A request sorted by who answers it.
#[derive(Debug)]
enum Routed {
    Query(Query),
    Change(Change),
    Spawn(NativeSpec),
    /// A client attaching to a service: its connection becomes the lease.
    Attach {
        service: String,
    },
}

impl From<Request> for Routed {
    fn from(req: Request) -> Self {
        match req {
            Request::Ps => Self::Query(Query::Ps),
            Request::Info => Self::Query(Query::Info),
            Request::Metrics => Self::Query(Query::Metrics),
            Request::Stop { name } => Self::Query(Query::Stop { name }),
            Request::Shutdown => Self::Query(Query::Shutdown),
            Request::Load { name, grid, block, shared_mem, bind, sms, no_readiness, image_len: _ } => {
                Self::Change(Change::Load { name, grid, block, shared_mem, bind, sms, no_readiness })
            }
            Request::Upgrade { name, image_len: _ } => Self::Change(Change::Upgrade { name }),
            Request::Unload { name } => Self::Change(Change::Unload { name }),
            Request::ChannelCreate { name, msg_size, capacity, placement, protocol, parts } => {
                Self::Change(Change::ChannelCreate { name, msg_size, capacity, placement, protocol, parts })
            }
            Request::Spawn { name, bind, command, ready_timeout_ms } => {
                Self::Spawn(NativeSpec { name, bind, command, ready_timeout: Duration::from_millis(ready_timeout_ms) })
            }
            Request::ServiceCreate { name, clients, msg_size, capacity, reply_size, reply_capacity, shards } => {
                Self::Change(Change::ServiceCreate(services::ServiceSpec {
                    name,
                    clients,
                    msg_size,
                    capacity,
                    reply_size: reply_size.unwrap_or(msg_size),
                    reply_capacity,
                    shards,
                }))
            }
            Request::ServiceAttach { service } => Self::Attach { service },
            Request::Detach => Self::Query(Query::StrayDetach),
        }
    }
}

/// A job for the backend thread, with where to send its answer.
enum Job {
    Change {
        change: Change,
        image: Vec<u8>,
        reply: mpsc::SyncSender<Response>,
    },
    Spawn {
        spec: NativeSpec,
        reply: mpsc::SyncSender<Response>,
    },
    /// Record the native workers' table in the desired state now, then acknowledge: a `spawn` or a
    /// `stop` is answered only once the state says so, so that a crash right after the answer
    /// neither forgets a worker nor starts a stopped one again.
    RecordNatives {
        done: mpsc::SyncSender<()>,
    },
    Shutdown {
        reply: Option<mpsc::SyncSender<Response>>,
    },
    /// The backend has news it received unasked (an MPS worker's kernel ended): run the watchdog now.
    Wake,
}

/// Wakes the accept loop (a byte on a socket it polls). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Waker(Arc<UnixStream>);

impl Waker {
    /// Asks the accept loop to look at the stop flag.
    fn wake(&self) {
        // Non-blocking: a full buffer already holds a wakeup.
        let _ = (&*self.0).write(&[1]);
    }
}

/// A handle that stops a running server (what SIGINT / SIGTERM do).
#[derive(Debug, Clone)]
pub struct StopHandle {
    stopping: Arc<AtomicBool>,
    waker: Waker,
}

impl StopHandle {
    /// Asks the server to stop: queued changes are refused, every program stopped, `run` returns.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.waker.wake();
    }
}

struct Shared {
    mailbox: Mailbox,
    snapshot: Mutex<Arc<Snapshot>>,
    /// Set by a signal, a stop handle or a shutdown request: changes are refused from then on.
    stopping: Arc<AtomicBool>,
    limits: Limits,
    own_uid: u32,
    connections: AtomicUsize,
    waker: Waker,
    /// Native GPU workers (`meshd spawn`).
    natives: crate::native::Natives,
    /// The GPU's UUID and how `--device` named it, for `info` ([`Server::set_device`]).
    device_id: OnceLock<DeviceId>,
    /// What the monitoring endpoint and `meshd metrics` read beside the snapshot.
    metrics: Arc<Metrics>,
    /// The one recovery board: the backend marks a recovery in place on it as it happens (it is
    /// handed over the moment the backend opens), and `ps`, `/readyz` and `/metrics` read it here,
    /// never waiting for the backend thread, which is inside that recovery's one long call.
    board: RecoveryBoard,
    /// The services' owners, leases and the watcher of clients adopted at start.
    services: Arc<services::Services>,
}

impl Shared {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.lock().clone()
    }

    fn publish(&self, programs: Vec<ProgramStatus>) {
        let fresh: Vec<ProgramStatus> = programs.iter().map(|p| listener::fresh(&self.mailbox, p)).collect();
        self.metrics.observe_heartbeats(crate::metrics::beats_of(&fresh));
        let mut s = self.snapshot.lock();
        let mut next = (**s).clone();
        next.programs = programs;
        *s = Arc::new(next);
    }
}

/// A started control plane: the backend open on its thread, ready to serve a listener.
pub struct Server {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
    backend: JoinHandle<bool>,
    wake_rx: UnixStream,
    /// The sender the backend's waker reaches through a `Weak` (so that it never keeps the jobs
    /// channel open by itself: the backend thread still sees it disconnected once the server is gone).
    _wake_jobs: Arc<mpsc::Sender<Job>>,
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
        Self::start_with(mailbox, limits, state, Box::new(replace::exec_self), open)
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
            natives: crate::native::Natives::new(&mailbox),
            metrics: Arc::new(Metrics::new()),
            board: RecoveryBoard::new(),
            services: Arc::new(services::Services::new(&mailbox, stalls::StallConfig::of(&limits))?),
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
                services::adopt(&shared.services);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_have_an_op_label_and_reads_have_none() {
        assert_eq!(change_op(&Request::Unload { name: "x".into() }), Some("unload"));
        assert_eq!(change_op(&Request::Upgrade { name: "x".into(), image_len: 1 }), Some("upgrade"));
        assert_eq!(change_op(&Request::Ps), None);
        assert_eq!(change_op(&Request::Metrics), None);
    }
}
