//! The control plane: every connection served on its own thread, changes applied one at a time on the backend thread, `ps` and `info` from a published snapshot.
//!
//! * **The backend thread** opens the backend and owns it until meshd ends. The MPS backend
//!   spawns its daemon and workers with `PR_SET_PDEATHSIG`, which fires when the *spawning thread*
//!   exits, so that thread must live as long as meshd; and one owner applies changes one at a time,
//!   in arrival order. After every change, and every [`Limits::refresh`], it publishes a snapshot.
//!   Between changes it is the **watchdog**: every [`Limits::watch`] (25 ms) it calls
//!   [`Backend::watch`], which polls the kernels and recovers from a fault with no request; while
//!   a recovery runs, `ps` answers from the last snapshot. When the backend says the fault is
//!   sticky ([`mesh_backend::watch::take_replacement`], after every backend call), it records what
//!   the new process needs and replaces the process ([`crate::replace`]); the new image's backend
//!   thread relaunches the recorded programs but the culprit, which `ps` shows left stopped, and
//!   runs a culprit search's next question.
//! * **Connection threads** check the peer (SO_PEERCRED), read one bounded request, and either
//!   answer from the snapshot (`ps`, `info`: heartbeats read fresh from the mailbox's slots, so
//!   they never wait behind a slow client, a slow load or a backend call) or queue it for the
//!   backend thread and wait for its answer.
//! * **The accept loop** blocks in `poll` on the listener and a wake socket (written by SIGINT,
//!   SIGTERM and by the backend thread when it ends): no sleep between polls.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use mesh_backend::watch::{self, Replacement};
use mesh_backend::{Backend, ImageKind, IsolationMode, LaunchShape, ProgramSpec, ProgramState, ProgramStatus};
use mesh_shm::Mailbox;
use mesh_shm::layout::STATE_EXITED;
use rustix::event::{PollFd, PollFlags};

use crate::protocol::{
    ChannelRow, Info, ProgramRow, Request, RequestError, Response, read_request_within, write_response,
};
use crate::replace::{self, QUESTION_WATCH, Search, Step, mono_ns};
use crate::state::{Carried, HeldMark, Pending, Recorded, StateStore};

/// The slot `ps` shows for a program held back (recorded, not in the backend: it holds no slot).
pub const HELD_SLOT: u32 = u32::MAX;

/// Why a program stays stopped while a culprit search asks about others.
const SEARCH_HELD: &str = "held back while the culprit of a GPU fault is searched by halves";

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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(2),
            write: Duration::from_secs(5),
            max_connections: 128,
            refresh: Duration::from_millis(250),
            watch: mesh_backend::watch::TICK,
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
}

/// A change for the backend thread, with where to send its answer.
enum Job {
    Change { req: Request, image: Vec<u8>, reply: mpsc::SyncSender<Response> },
    Shutdown { reply: Option<mpsc::SyncSender<Response>> },
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
}

impl Shared {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn publish(&self, programs: Vec<ProgramStatus>) {
        let mut s = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
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
            })),
            stopping: Arc::new(AtomicBool::new(false)),
            limits,
            own_uid: rustix::process::getuid().as_raw(),
            connections: AtomicUsize::new(0),
            waker: Waker(Arc::new(wake_tx)),
            natives: crate::native::Natives::new(&mailbox),
        });
        let (jobs, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let for_thread = shared.clone();
        let backend = std::thread::Builder::new()
            .name("meshd-backend".into())
            .spawn(move || backend_thread(&for_thread, open, state, replacer, &rx, &ready_tx))
            .context("starting the backend thread")?;
        match ready_rx.recv() {
            Ok(Ok(relaunched)) => Ok(Self { shared, jobs, backend, wake_rx, relaunched }),
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

    /// Serves `listener` until a `shutdown` request or a stop (signal or [`StopHandle`]).
    /// Returns whether every program stopped (false: some kernel ignored its stop request and still runs).
    pub fn run(self, listener: UnixListener) -> Result<bool> {
        listener.set_nonblocking(true)?;
        loop {
            let (conn_ready, wake_ready) = {
                let mut fds = [PollFd::new(&listener, PollFlags::IN), PollFd::new(&self.wake_rx, PollFlags::IN)];
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e).context("poll on the control socket"),
                }
                (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
            };
            if wake_ready {
                let mut buf = [0u8; 64];
                while matches!((&self.wake_rx).read(&mut buf), Ok(n) if n > 0) {}
            }
            if self.shared.stopping.load(Ordering::Acquire) || self.backend.is_finished() {
                break;
            }
            if conn_ready {
                self.accept(&listener);
            }
        }
        self.shared.stopping.store(true, Ordering::Release);
        // The backend thread may already have ended (after a shutdown request): then this send fails, harmlessly.
        let _ = self.jobs.send(Job::Shutdown { reply: None });
        self.backend.join().map_err(|_| anyhow!("the backend thread panicked"))
    }

    fn accept(&self, listener: &UnixListener) {
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                // EMFILE and the like: wait a little for descriptors to free, watching for a stop.
                tracing::warn!("accept: {e}");
                let mut fds = [PollFd::new(&self.wake_rx, PollFlags::IN)];
                let _ = rustix::event::poll(&mut fds, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 50_000_000 }));
                return;
            }
        };
        let _ = conn.set_nonblocking(false);
        let n = self.shared.connections.fetch_add(1, Ordering::AcqRel);
        let guard = ConnectionSlot(self.shared.clone());
        if n >= self.shared.limits.max_connections {
            tracing::warn!("refused a connection: {n} already being served");
            let _ = conn.set_write_timeout(Some(self.shared.limits.write));
            let _ = write_response(
                &mut &conn,
                &Response::error(format!("meshd is serving {n} connections, its limit; try again")),
            );
            return;
        }
        let (shared, jobs) = (self.shared.clone(), self.jobs.clone());
        let spawned = std::thread::Builder::new().name("meshd-conn".into()).spawn(move || {
            let _guard = guard;
            serve_connection(&shared, &jobs, &conn);
        });
        if let Err(e) = spawned {
            tracing::warn!("no thread for a connection: {e}");
        }
    }
}

/// Counts a connection until dropped.
struct ConnectionSlot(Arc<Shared>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a peer of `uid` may talk to a meshd running as `own_uid`: that uid and root.
pub fn peer_allowed(uid: u32, own_uid: u32) -> bool {
    uid == own_uid || uid == 0
}

fn serve_connection(shared: &Shared, jobs: &mpsc::Sender<Job>, conn: &UnixStream) {
    let limits = shared.limits;
    let _ = conn.set_write_timeout(Some(limits.write));
    let peer = match rustix::net::sockopt::socket_peercred(conn.as_fd()) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("refused a connection: no peer credentials ({e})");
            let _ = write_response(&mut &*conn, &Response::error(format!("no peer credentials: {e}")));
            return;
        }
    };
    let (pid, uid) = (peer.pid.as_raw_nonzero().get(), peer.uid.as_raw());
    if !peer_allowed(uid, shared.own_uid) {
        tracing::warn!(peer_pid = pid, peer_uid = uid, "refused a client of another user");
        let why = format!("uid {uid} may not control this meshd (it serves uid {} and root)", shared.own_uid);
        let _ = write_response(&mut &*conn, &Response::error(why));
        return;
    }
    if let Err(e) = conn.set_read_timeout(Some(limits.idle)) {
        tracing::warn!("connection from pid {pid}: {e}");
        return;
    }
    let response = match read_request_within(&mut BufReader::new(conn), Some(limits.idle)) {
        Ok((req, image)) => answer(shared, jobs, req, image),
        Err(RequestError::Closed) => {
            tracing::debug!(peer_pid = pid, "a client closed its connection without a request");
            return;
        }
        Err(e @ RequestError::Idle(_)) => {
            tracing::info!(peer_pid = pid, "dropped a silent client: {e}");
            Response::error(e)
        }
        Err(e) => {
            tracing::warn!(peer_pid = pid, "refused a request: {e}");
            Response::error(e)
        }
    };
    if let Err(e) = write_response(&mut &*conn, &response) {
        tracing::warn!(peer_pid = pid, "answering a client: {e}");
    }
}

/// Answers `ps` and `info` from the snapshot; queues anything else for the backend thread.
fn answer(shared: &Shared, jobs: &mpsc::Sender<Job>, req: Request, image: Vec<u8>) -> Response {
    match req {
        Request::Ps => Response {
            ok: true,
            programs: Some(ps_rows(shared)),
            natives: Some(shared.natives.rows()),
            ..Response::default()
        },
        Request::Stop { name } => native_stop(shared, &name),
        Request::Info => info(shared),
        Request::Shutdown => {
            let (reply, answer) = mpsc::sync_channel(1);
            shared.stopping.store(true, Ordering::Release);
            if jobs.send(Job::Shutdown { reply: Some(reply) }).is_err() {
                return Response::ok();
            }
            // The backend thread may have ended already (a signal raced): the daemon stops either way.
            answer.recv().unwrap_or_else(|_| Response::ok())
        }
        req => {
            if shared.stopping.load(Ordering::Acquire) {
                return Response::error("meshd is shutting down");
            }
            let (reply, answer) = mpsc::sync_channel(1);
            if jobs.send(Job::Change { req, image, reply }).is_err() {
                return Response::error("meshd is shutting down");
            }
            answer.recv().unwrap_or_else(|_| Response::error("meshd is shutting down"))
        }
    }
}

/// The snapshot's programs with heartbeat and exit read now from their slots (plain host memory).
fn ps_rows(shared: &Shared) -> Vec<ProgramRow> {
    let snap = shared.snapshot();
    snap.programs.iter().map(|p| ProgramRow::from(&fresh(&shared.mailbox, p))).collect()
}

/// `p` with what its slot says now: the heartbeat, and an exit the backend has not seen yet.
fn fresh(mailbox: &Mailbox, p: &ProgramStatus) -> ProgramStatus {
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

fn info(shared: &Shared) -> Response {
    let snap = shared.snapshot();
    let channels = match shared.mailbox.channels() {
        Ok(c) => c,
        Err(e) => return Response::error(e),
    };
    let channels = channels
        .into_iter()
        .map(|c| ChannelRow {
            placement: c.placement.to_string(),
            lost: c.lost,
            name: c.name,
            msg_size: c.msg_size,
            capacity: c.capacity,
            head: c.head,
            tail: c.tail,
        })
        .collect();
    Response {
        ok: true,
        info: Some(Info {
            mode: snap.mode.to_string(),
            mailbox: shared.mailbox.path().display().to_string(),
            device: snap.device.clone(),
            host_atomics: snap.host_atomics,
            channels,
            extra: crate::protocol::InfoExtra::now(),
        }),
        ..Response::default()
    }
}

type Ready = mpsc::SyncSender<Result<(usize, usize)>>;

/// The backend thread: open, relaunch what is recorded, then apply changes until shutdown.
/// Returns whether every program stopped.
fn backend_thread<F>(
    shared: &Shared,
    open: F,
    state: Option<StateStore>,
    replacer: Replacer,
    jobs: &mpsc::Receiver<Job>,
    ready: &Ready,
) -> bool
where
    F: FnOnce(&Mailbox) -> Result<Opened>,
{
    let Opened { mut backend, device, arch } = match open(&shared.mailbox) {
        Ok(o) => o,
        Err(e) => {
            let _ = ready.send(Err(e));
            return true;
        }
    };
    {
        let mut s = shared.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        *s = Arc::new(Snapshot {
            programs: backend.status(),
            mode: backend.mode(),
            device,
            host_atomics: backend.host_atomics(),
        });
    }
    if backend.mode() == IsolationMode::Mps {
        shared.natives.set_membership(Arc::new(crate::native::MpsMembership));
    }
    let mut worker = BackendWorker {
        backend: &mut *backend,
        shared,
        state,
        arch,
        held: Vec::new(),
        kinds: HashMap::new(),
        search: None,
        replacer,
        opened_mono_ns: mono_ns(),
    };
    let relaunched = worker.relaunch();
    let _ = ready.send(Ok(relaunched));
    let clean = worker.serve(jobs);
    drop(worker);
    if clean {
        // Dropped here, on the thread that opened it (MPS: the thread its children's PDEATHSIG watches).
        drop(backend);
    } else {
        // A kernel ignored its stop request: releasing the context would wait for it. meshd leaves
        // with `_exit` right after (the driver then ends the kernel), so the backend is never dropped.
        std::mem::forget(backend);
    }
    shared.waker.wake();
    clean
}

/// A recorded program that is not in the backend: left stopped across a replacement of the
/// process, or held back while a culprit search asks about others.
#[derive(Debug, Clone)]
struct Held {
    name: String,
    why: String,
    /// It caused a GPU fault (`ps`: faulted); else only stopped.
    culprit: bool,
    kind: ImageKind,
}

struct BackendWorker<'a> {
    backend: &'a mut dyn Backend,
    shared: &'a Shared,
    state: Option<StateStore>,
    /// The key of the stored linked images.
    arch: Option<String>,
    /// Recorded programs not in the backend, in record order.
    held: Vec<Held>,
    /// The image kind `ps` shows for programs relaunched from a stored linked image (the backend
    /// was given the cubin).
    kinds: HashMap<String, ImageKind>,
    /// A culprit search's question being watched, since when.
    search: Option<(Search, Instant)>,
    replacer: Replacer,
    /// When the backend was open (`CLOCK_MONOTONIC` ns), for the recovery's log.
    opened_mono_ns: u64,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn ms_between(from_ns: u64, to_ns: u64) -> f64 {
    to_ns.saturating_sub(from_ns) as f64 / 1e6
}

impl BackendWorker<'_> {
    fn publish(&self) {
        self.shared.publish(self.statuses());
    }

    /// What `ps` shows: the backend's programs with what the state carries across replacements
    /// (restarts added, the last fault where the backend saw none), then the programs held back.
    fn statuses(&self) -> Vec<ProgramStatus> {
        let recorded = self.state.as_ref().map(StateStore::recorded);
        let carried = |name: &str| recorded.and_then(|r| r.carried.get(name));
        let mut rows = self.backend.status();
        for r in &mut rows {
            if let Some(kind) = self.kinds.get(&r.name) {
                r.kind = *kind;
            }
            if let Some(c) = carried(&r.name) {
                r.restarts += c.restarts;
                if r.last_fault.is_none() {
                    r.last_fault = c.last_fault.clone();
                    r.last_fault_unix_ms = c.last_fault_unix_ms;
                }
            }
        }
        for h in &self.held {
            let Some(p) = recorded.and_then(|r| r.programs.iter().find(|p| p.name == h.name)) else { continue };
            let c = carried(&h.name).cloned().unwrap_or_default();
            rows.push(ProgramStatus {
                name: h.name.clone(),
                slot: HELD_SLOT,
                state: if h.culprit { ProgramState::Faulted(h.why.clone()) } else { ProgramState::Stopped },
                generation: 0,
                heartbeat: 0,
                worker_pid: None,
                sms: p.sms,
                shape: LaunchShape { grid: p.grid, block: p.block, shared_mem: p.shared_mem },
                kind: h.kind,
                restarts: c.restarts,
                last_fault: c.last_fault,
                last_fault_unix_ms: c.last_fault_unix_ms,
                stopped_why: Some(h.why.clone()),
            });
        }
        rows
    }

    fn is_held(&self, name: &str) -> bool {
        self.held.iter().any(|h| h.name == name)
    }

    fn unhold(&mut self, name: &str) {
        self.held.retain(|h| h.name != name);
    }

    /// Holds `p` back (not loaded), with `why`.
    fn hold(&mut self, p: &Recorded, why: String, culprit: bool) {
        let kind = self.state.as_ref().and_then(|s| s.spec_of(p).ok()).map_or(ImageKind::Ptx, |s| s.kind);
        self.unhold(&p.name);
        self.held.push(Held { name: p.name.clone(), why, culprit, kind });
    }

    /// Loads the recorded `p`: from its stored linked image where there is one for this GPU (no
    /// link), else from its image.
    fn load_recorded(&mut self, p: &Recorded) -> Result<ProgramStatus> {
        let state = self.state.as_ref().context("no state directory")?;
        let spec = state.spec_of(p)?;
        let linked = self.arch.as_deref().and_then(|arch| state.linked(&p.image_sha256, arch));
        if let Some(image) = linked.filter(|i| ImageKind::detect(i).is_some()) {
            let mut fast = spec.clone();
            fast.kind = ImageKind::detect(&image).unwrap_or(spec.kind);
            fast.image = image;
            match self.backend.load(fast) {
                Ok(status) => {
                    self.kinds.insert(p.name.clone(), spec.kind);
                    return Ok(status);
                }
                Err(e) => {
                    tracing::warn!(program = %p.name, "its stored linked image was refused ({}); linking it again", plain(&e))
                }
            }
        }
        self.kinds.remove(&p.name);
        Ok(self.backend.load(spec)?)
    }

    /// Adds one restart to each of `names` (relaunched after a fault).
    fn count_restarts(&mut self, names: &[String]) {
        self.record(|s| {
            s.update(|st| {
                for n in names {
                    st.carried.entry(n.clone()).or_default().restarts += 1;
                }
            })
        });
    }

    /// Loads every program the state directory records, as it was recorded, but those left stopped
    /// and those a culprit search holds back; after a replacement of the process, logs how long the
    /// recovery took. Returns (relaunched, failed).
    fn relaunch(&mut self) -> (usize, usize) {
        let Some(state) = &self.state else { return (0, 0) };
        let started = mono_ns();
        let rec = state.recorded().clone();
        let pending = rec.recovery.pending.clone();
        let question = rec.recovery.search.clone().and_then(|s| match s.step() {
            Step::Ask(set) => Some((s, set)),
            _ => None,
        });
        let (mut ok, mut failed) = (0, 0);
        let mut relaunched = Vec::new();
        for p in &rec.programs {
            if let Some(mark) = rec.carried.get(&p.name).and_then(|c| c.held.as_ref()) {
                tracing::warn!(program = %p.name, "not relaunched: {}", mark.why);
                self.hold(p, mark.why.clone(), mark.culprit);
                continue;
            }
            if let Some((s, set)) = &question {
                if s.suspects.contains(&p.name) && !set.contains(&p.name) {
                    tracing::info!(program = %p.name, "{SEARCH_HELD}");
                    self.hold(p, SEARCH_HELD.into(), false);
                    continue;
                }
            }
            match self.load_recorded(p) {
                Ok(status) => {
                    tracing::info!(program = %p.name, slot = status.slot, "relaunched");
                    relaunched.push(p.name.clone());
                    ok += 1;
                }
                Err(e) => {
                    tracing::error!(program = %p.name, "relaunch refused: {}", plain(&e));
                    failed += 1;
                }
            }
        }
        self.publish();
        if ok + failed > 0 {
            tracing::info!("relaunched {ok} of {} recorded programs", ok + failed);
        }
        if let Some(pending) = pending {
            self.count_restarts(&relaunched);
            self.record(|s| s.update(|st| st.recovery.pending = None));
            self.publish();
            let done = mono_ns();
            let same = pending.from_pid == std::process::id();
            let main = replace::process_start().unwrap_or(started);
            tracing::info!(
                "after the replacement of pid {} ({}): exec {:.1} ms after the fault, this image's main {:.1} ms after \
                 the exec, backend open {:.1} ms later, {ok} program(s) relaunched in {:.1} ms",
                pending.from_pid,
                if same { "an exec of this process" } else { "a crash came in between" },
                ms_between(pending.noticed_mono_ns, pending.exec_mono_ns),
                ms_between(pending.exec_mono_ns, main),
                ms_between(main, self.opened_mono_ns),
                ms_between(started, done),
            );
            let culprit = match (&pending.culprit, &question) {
                (Some(c), _) => c.clone(),
                (None, Some(_)) => "being searched".into(),
                (None, None) => "none".into(),
            };
            tracing::warn!(
                target: "watchdog",
                "watchdog blink: recovered in {:.1} ms by replacing the process (pid {}): culprit {culprit}; {ok} \
                 program(s) running, {} held back; fault {}",
                ms_between(pending.noticed_mono_ns, done),
                std::process::id(),
                self.held.len(),
                pending.error
            );
        }
        if let Some((s, set)) = question {
            tracing::warn!(
                target: "watchdog",
                "culprit search, question {}: {} relaunched beside the innocent programs; watching {} ms",
                s.answers.len() + 1,
                set.join(", "),
                QUESTION_WATCH.as_millis()
            );
            self.search = Some((s, Instant::now()));
        }
        (ok, failed)
    }

    /// The watched question of a culprit search ran clean for [`QUESTION_WATCH`]: records the
    /// answer and relaunches the next set, or leaves the culprit found stopped and relaunches the rest.
    fn search_tick(&mut self) {
        let Some((s, since)) = &self.search else { return };
        if since.elapsed() < QUESTION_WATCH {
            return;
        }
        let mut s = s.clone();
        s.answers.push(false);
        let step = s.step();
        let (to_run, culprit) = match &step {
            Step::Ask(set) => (set.clone(), None),
            Step::Found(name) => {
                let rest = self.held.iter().filter(|h| !h.culprit && &h.name != name).map(|h| h.name.clone());
                (rest.collect(), Some(name.clone()))
            }
            Step::Nobody => (self.held.iter().filter(|h| !h.culprit).map(|h| h.name.clone()).collect(), None),
        };
        let to_run: Vec<String> = to_run.into_iter().filter(|n| self.is_held(n)).collect();
        tracing::info!(target: "watchdog", "culprit search, question {} ran clean", s.answers.len());
        if let Some(name) = &culprit {
            let why = format!("found by halves in {} relaunch(es) of {} suspects", s.answers.len(), s.suspects.len());
            let error = s.error.clone();
            self.mark_culprit(name, &error, &why);
        }
        let mut relaunched = Vec::new();
        for name in &to_run {
            let Some(p) = self.state.as_ref().and_then(|st| st.program(name).cloned()) else { continue };
            self.unhold(name);
            match self.load_recorded(&p) {
                Ok(_) => relaunched.push(name.clone()),
                Err(e) => {
                    tracing::error!(program = %name, "relaunch refused: {}", plain(&e));
                    self.hold(&p, format!("relaunch after a GPU fault failed: {}", plain(&e)), false);
                }
            }
        }
        self.count_restarts(&relaunched);
        match step {
            Step::Ask(set) => {
                tracing::warn!(
                    target: "watchdog",
                    "culprit search, question {}: {} relaunched beside the cleared programs; watching {} ms",
                    s.answers.len() + 1,
                    set.join(", "),
                    QUESTION_WATCH.as_millis()
                );
                let recorded = s.clone();
                self.record(|st| st.update(|d| d.recovery.search = Some(recorded)));
                self.search = Some((s, Instant::now()));
            }
            Step::Found(_) | Step::Nobody => {
                self.search = None;
                self.record(|st| st.update(|d| d.recovery.search = None));
                let running = self.backend.status().iter().filter(|p| p.state == ProgramState::Running).count();
                tracing::warn!(
                    target: "watchdog",
                    "watchdog blink: recovered in {:.1} ms (from the fault, by replacing the process and searching by \
                     halves in {} question(s)): culprit {}; {running} program(s) running",
                    ms_between(s.noticed_mono_ns, mono_ns()),
                    s.answers.len(),
                    culprit.as_deref().unwrap_or("none")
                );
            }
        }
        self.publish();
    }

    /// Records `name` as the culprit of the fault `error` (named: `why`), holds it back, and names
    /// it in the others' last fault.
    fn mark_culprit(&mut self, name: &str, error: &str, why: &str) {
        let stopped = culprit_why(why);
        let at = unix_ms();
        self.record(|s| {
            s.update(|st| {
                for (n, c) in st.carried.iter_mut() {
                    if n == name {
                        c.held = Some(HeldMark { why: stopped.clone(), culprit: true });
                        c.last_fault = Some(format!("GPU fault: {error} (caused by this program: {why})"));
                        c.last_fault_unix_ms = Some(at);
                    } else if let Some(f) = &mut c.last_fault {
                        if f.ends_with(SEARCHED) {
                            *f = format!("{}(caused by {name})", f.trim_end_matches(SEARCHED));
                        }
                    }
                }
                if !st.carried.contains_key(name) {
                    let c = Carried {
                        held: Some(HeldMark { why: stopped.clone(), culprit: true }),
                        last_fault: Some(format!("GPU fault: {error} (caused by this program: {why})")),
                        last_fault_unix_ms: Some(at),
                        ..Carried::default()
                    };
                    st.carried.insert(name.to_string(), c);
                }
            })
        });
        if let Some(p) = self.state.as_ref().and_then(|s| s.program(name).cloned()) {
            self.hold(&p, stopped, true);
        }
    }

    /// Acts on a pending request to replace the process, if the backend made one.
    fn check_replacement(&mut self) {
        if let Some(r) = watch::take_replacement() {
            self.replace(r);
        }
    }

    /// Replaces the process after a sticky fault: decides whom the new image leaves stopped (or
    /// which question of a search it asks), records that with restarts, last faults, the time of
    /// the fault and the linked images in the state directory, and executes meshd again. Returns
    /// only when that could not be done (the backend then refuses every change, as before).
    fn replace(&mut self, r: Replacement) {
        let noticed = mono_ns().saturating_sub(r.noticed.elapsed().as_nanos() as u64);
        if self.state.is_none() {
            tracing::error!(
                "a sticky GPU fault ({}) needs a new process, but there is no state directory to \
                             relaunch from: restart meshd",
                r.error
            );
            return;
        }
        let now = unix_ms();
        let history = self.state.as_ref().map(|s| s.recorded().recovery.reexecs_unix_ms.clone()).unwrap_or_default();
        let asking = self.search.take().map(|(s, _)| s);
        if let Some(s) = &asking {
            tracing::warn!(target: "watchdog", "culprit search, question {}: the fault came back", s.answers.len() + 1);
        }
        let plan = replace::plan(&r.programs, &r.verdict, &r.error, noticed, asking, &history, now);
        let shown = self.statuses();
        let error = r.error.clone();
        let culprit = plan.culprit.clone();
        let (search, halted) = (plan.search.clone(), plan.halted.clone());
        let recorded = self.state.as_mut().map(|state| {
            state.update(|st| {
                let names: Vec<String> = st.programs.iter().map(|p| p.name.clone()).collect();
                for name in names {
                    let c = st.carried.entry(name.clone()).or_default();
                    if let Some(row) = shown.iter().find(|r| r.name == name) {
                        c.restarts = row.restarts;
                    }
                    match &culprit {
                        Some((n, why)) if *n == name => {
                            c.held = Some(HeldMark { why: culprit_why(why), culprit: true });
                            c.last_fault = Some(format!("GPU fault: {error} (caused by this program: {why})"));
                            c.last_fault_unix_ms = Some(now);
                            continue;
                        }
                        _ => {}
                    }
                    if c.held.is_some() {
                        continue;
                    }
                    c.last_fault = Some(match &culprit {
                        Some((n, _)) => format!("GPU fault: {error} (caused by {n})"),
                        None if search.is_some() => format!("GPU fault: {error} {SEARCHED}"),
                        None => format!("GPU fault: {error} (no culprit named)"),
                    });
                    c.last_fault_unix_ms = Some(now);
                    if let Some(h) = &halted {
                        c.held = Some(HeldMark { why: h.clone(), culprit: false });
                    }
                }
                let mut reexecs = replace::recent(&history, now);
                reexecs.push(now);
                st.recovery = crate::state::Recovery {
                    reexecs_unix_ms: reexecs,
                    search: search.clone(),
                    pending: Some(Pending {
                        from_pid: std::process::id(),
                        error: error.clone(),
                        noticed_mono_ns: noticed,
                        exec_mono_ns: 0,
                        culprit: culprit.as_ref().map(|c| c.0.clone()),
                    }),
                };
            })
        });
        if let Some(Err(e)) = recorded {
            tracing::error!(
                "a sticky GPU fault ({error}) needs a new process, but recording the state failed: {e:#}; \
                             restart meshd"
            );
            return;
        }
        let mut stored = 0;
        if let Some(state) = &self.state {
            for (name, image) in &r.linked {
                let Some(p) = state.program(name) else { continue };
                match state.store_linked(&p.image_sha256, &r.arch, image) {
                    Ok(()) => stored += 1,
                    Err(e) => tracing::warn!(program = %name, "storing its linked image: {e:#}"),
                }
            }
        }
        if !self.shared.natives.rows().is_empty() {
            tracing::warn!("ending the native GPU workers before the process is replaced");
            self.shared.natives.stop_all();
        }
        let what = match (&plan.culprit, &plan.search, &plan.halted) {
            (_, _, Some(h)) => format!("the bound is reached, nothing will be relaunched ({h})"),
            (Some((c, why)), _, _) => format!("culprit {c} ({why}) left stopped, every other program relaunched"),
            (None, Some(s), _) => match s.step() {
                Step::Ask(set) => format!("culprit unknown: searching by halves, next {}", set.join(", ")),
                _ => "culprit unknown".into(),
            },
            (None, None, _) => "no culprit named: every program relaunched".into(),
        };
        let exec_at = mono_ns();
        self.record(|s| {
            s.update(|st| {
                if let Some(p) = &mut st.recovery.pending {
                    p.exec_mono_ns = exec_at;
                }
            })
        });
        tracing::warn!(
            target: "watchdog",
            "replacing the process (pid {}) {:.1} ms after the fault ({error}): {what}; {stored} linked image(s) stored; \
             exec /proc/self/exe",
            std::process::id(),
            ms_between(noticed, mono_ns())
        );
        let e = (self.replacer)();
        tracing::error!("replacing the process failed: {e}; every change is refused: restart meshd");
    }

    /// Applies changes in arrival order until a shutdown, and between them runs the watchdog every
    /// [`Limits::watch`] (publishing at once when it changed something, else every
    /// [`Limits::refresh`]); returns whether every program stopped.
    fn serve(&mut self, jobs: &mpsc::Receiver<Job>) -> bool {
        let limits = self.shared.limits;
        let tick = limits.watch.min(Duration::from_millis(50));
        let mut next_publish = Instant::now() + limits.refresh;
        loop {
            let job = jobs.recv_timeout(tick);
            if !matches!(job, Err(mpsc::RecvTimeoutError::Timeout)) {
                next_publish = Instant::now() + limits.refresh;
            }
            match job {
                Ok(Job::Change { req: req @ Request::Spawn { .. }, reply, .. }) => {
                    native_spawn(self.shared, req, reply)
                }
                Ok(Job::Change { req, image, reply }) => {
                    let response = if self.shared.stopping.load(Ordering::Acquire) {
                        Response::error("meshd is shutting down")
                    } else if let Some((s, _)) = &self.search {
                        Response::error(format!(
                            "meshd is searching the culprit of a GPU fault by halves (question {}); try again in a \
                             moment",
                            s.answers.len() + 1
                        ))
                    } else {
                        self.change(req, image)
                    };
                    self.publish();
                    let _ = reply.send(response);
                    // A change that met a sticky fault: the refusal is on its way; then the process is replaced.
                    self.check_replacement();
                }
                Ok(Job::Shutdown { reply }) => {
                    self.shared.stopping.store(true, Ordering::Release);
                    // Answer first: the client need not wait while every program stops.
                    if let Some(reply) = reply {
                        let _ = reply.send(Response::ok());
                    }
                    return self.shutdown();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.shutdown(),
            }
            let stopping = self.shared.stopping.load(Ordering::Acquire);
            let seen = if stopping { Vec::new() } else { self.backend.watch() };
            for line in &seen {
                tracing::warn!(target: "watchdog", "{line}");
            }
            if !stopping {
                self.check_replacement();
                self.search_tick();
            }
            if !seen.is_empty() || Instant::now() >= next_publish {
                self.publish();
                next_publish = Instant::now() + limits.refresh;
            }
        }
    }

    fn shutdown(&mut self) -> bool {
        self.shared.natives.stop_all();
        tracing::info!("shutting down: stopping every program");
        let clean = match self.backend.shutdown() {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("shutdown: {}", plain(&e));
                false
            }
        };
        self.shared.publish(Vec::new());
        clean
    }

    /// Applies one change; the answer says how long the backend took.
    fn change(&mut self, req: Request, image: Vec<u8>) -> Response {
        let what = describe(&req);
        let started = Instant::now();
        let result = self.apply(req, image);
        let backend_us = Some(started.elapsed().as_micros() as u64);
        match result {
            Ok(mut r) => {
                r.backend_us = backend_us;
                r
            }
            Err(e) => {
                let msg = plain(&e);
                tracing::warn!("{what} refused: {msg}");
                Response { backend_us, ..Response::error(msg) }
            }
        }
    }

    fn apply(&mut self, req: Request, image: Vec<u8>) -> Result<Response> {
        match req {
            Request::Load { name, grid, block, shared_mem, bind, sms, .. } => {
                let mut spec = ProgramSpec::new(&name, image)?;
                spec.shape = LaunchShape { grid, block, shared_mem };
                spec.bindings = bind;
                spec.sms = sms;
                let record = Recorded::of(&spec);
                let status = self.backend.load(spec.clone())?;
                tracing::info!(program = %name, slot = status.slot, "loaded");
                self.record(|s| s.record_load(record, &spec.image));
                // A program left stopped of that name is replaced by this one.
                self.unhold(&name);
                self.kinds.remove(&name);
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Request::Upgrade { name, .. } if self.is_held(&name) => {
                // Left stopped (not in the backend): the new image is loaded with its recorded shape.
                let p = self.state.as_ref().and_then(|s| s.program(&name).cloned()).context("not recorded")?;
                let mut spec = ProgramSpec::new(&name, image.clone())?;
                spec.shape = LaunchShape { grid: p.grid, block: p.block, shared_mem: p.shared_mem };
                spec.bindings = p.bindings.clone();
                spec.sms = p.sms;
                let status = self.backend.load(spec)?;
                tracing::info!(program = %name, slot = status.slot, "upgraded (it was left stopped): running again");
                self.record(|s| s.record_upgrade(&name, &image));
                self.unhold(&name);
                self.kinds.remove(&name);
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Request::Unload { name } if self.is_held(&name) => {
                tracing::info!(program = %name, "unloaded (it was left stopped)");
                self.record(|s| s.record_unload(&name));
                self.unhold(&name);
                Ok(Response::ok())
            }
            Request::Upgrade { name, .. } => {
                self.kinds.remove(&name);
                let status = self.backend.upgrade(&name, image.clone())?;
                tracing::info!(program = %name, generation = status.generation, "upgraded");
                self.record(|s| s.record_upgrade(&name, &image));
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Request::Unload { name } => {
                self.kinds.remove(&name);
                self.backend.unload(&name)?;
                tracing::info!(program = %name, "unloaded");
                self.record(|s| s.record_unload(&name));
                Ok(Response::ok())
            }
            Request::ChannelCreate { name, msg_size, capacity, placement } => {
                let placement = crate::placement::parse(&placement, self.backend.mode())?;
                self.shared.mailbox.create_channel_placed(&name, msg_size, capacity, placement)?;
                tracing::info!(channel = %name, msg_size, capacity, %placement, "channel created");
                let mailbox = self.shared.mailbox.clone();
                self.record(move |s| s.record_channels(&mailbox));
                Ok(Response::ok())
            }
            // Answered by the connection threads; never queued.
            Request::Ps | Request::Info | Request::Shutdown | Request::Spawn { .. } | Request::Stop { .. } => {
                Ok(Response::ok())
            }
        }
    }

    /// Writes a change to the state directory; a failure is logged, the change stands (the GPU has it).
    fn record(&mut self, f: impl FnOnce(&mut StateStore) -> Result<()>) {
        if let Some(state) = &mut self.state {
            if let Err(e) = f(state) {
                tracing::error!("recording the desired state in {}: {e:#}", state.dir().display());
            }
        }
    }
}

/// The end of the others' last fault while a search looks for its culprit.
const SEARCHED: &str = "(its culprit is being searched)";

/// `ps`'s `stopped_why` of a culprit named `why`.
fn culprit_why(why: &str) -> String {
    format!("caused a GPU fault: left stopped; upgrade or reload it to run it again (named: {why})")
}

/// How a request is named in the log.
fn describe(req: &Request) -> String {
    match req {
        Request::Load { name, .. } => format!("load {name:?}"),
        Request::Upgrade { name, .. } => format!("upgrade {name:?}"),
        Request::Unload { name } => format!("unload {name:?}"),
        Request::ChannelCreate { name, .. } => format!("channel create {name:?}"),
        Request::Ps => "ps".into(),
        Request::Info => "info".into(),
        Request::Shutdown => "shutdown".into(),
        Request::Spawn { name, .. } => format!("spawn {name:?}"),
        Request::Stop { name } => format!("stop {name:?}"),
    }
}

/// An error's text without a leading "refused: ": the answer is a refusal already, and the log line
/// and the CLI say so once (some backend errors carry the word in their own text).
fn plain(e: &dyn std::fmt::Display) -> String {
    let text = format!("{e:#}");
    match text.strip_prefix("refused: ") {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

// ---- Native GPU workers (crate::native) ----

/// `spawn`, on the backend thread (the worker's PDEATHSIG watches it); answered from the worker's
/// own waiting thread once it is ready or refused, so the backend thread goes on meanwhile.
fn native_spawn(shared: &Shared, req: Request, reply: mpsc::SyncSender<Response>) {
    let Request::Spawn { name, bind, command, ready_timeout_ms } = req else { return };
    if shared.stopping.load(Ordering::Acquire) {
        let _ = reply.send(Response::error("meshd is shutting down"));
        return;
    }
    let spec =
        crate::native::NativeSpec { name, bind, command, ready_timeout: Duration::from_millis(ready_timeout_ms) };
    shared.natives.spawn(spec, move |outcome| {
        let _ = reply.send(match outcome {
            Ok(row) => Response { ok: true, natives: Some(vec![row]), ..Response::default() },
            Err(why) => Response::error(why),
        });
    });
}

/// `stop`, on the connection thread (it waits out the grace period; nothing else waits on it).
fn native_stop(shared: &Shared, name: &str) -> Response {
    match shared.natives.stop(name) {
        Ok(row) => Response { ok: true, natives: Some(vec![row]), ..Response::default() },
        Err(why) => Response::error(why),
    }
}
