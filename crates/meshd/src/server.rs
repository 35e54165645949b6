//! The control plane: every connection served on its own thread, changes applied one at a time on the backend thread, `ps` and `info` from a published snapshot.
//!
//! * **The backend thread** opens the backend and owns it until meshd ends. The MPS backend
//!   spawns its daemon and workers with `PR_SET_PDEATHSIG`, which fires when the *spawning thread*
//!   exits, so that thread must live as long as meshd; and one owner applies changes one at a time,
//!   in arrival order. After every change, and every [`Limits::refresh`], it publishes a snapshot.
//!   Between changes it is the **watchdog**: every [`Limits::watch`] (25 ms) it calls
//!   [`Backend::watch`], which polls the kernels and recovers from a fault with no request; while
//!   a recovery runs, `ps` answers from the last snapshot.
//! * **Connection threads** check the peer (SO_PEERCRED), read one bounded request, and either
//!   answer from the snapshot (`ps`, `info`: heartbeats read fresh from the mailbox's slots, so
//!   they never wait behind a slow client, a slow load or a backend call) or queue it for the
//!   backend thread and wait for its answer.
//! * **The accept loop** blocks in `poll` on the listener and a wake socket (written by SIGINT,
//!   SIGTERM and by the backend thread when it ends): no sleep between polls.

use std::io::{BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use mesh_backend::{Backend, IsolationMode, LaunchShape, ProgramSpec, ProgramState, ProgramStatus};
use mesh_shm::Mailbox;
use mesh_shm::layout::STATE_EXITED;
use rustix::event::{PollFd, PollFlags};

use crate::protocol::{
    ChannelRow, Info, ProgramRow, Request, RequestError, Response, read_request_within, write_response,
};
use crate::state::{Recorded, StateStore};

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
            .spawn(move || backend_thread(&for_thread, open, state, &rx, &ready_tx))
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
        .map(|c| ChannelRow { name: c.name, msg_size: c.msg_size, capacity: c.capacity, head: c.head, tail: c.tail })
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
    jobs: &mpsc::Receiver<Job>,
    ready: &Ready,
) -> bool
where
    F: FnOnce(&Mailbox) -> Result<Opened>,
{
    let Opened { mut backend, device } = match open(&shared.mailbox) {
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
    let mut worker = BackendWorker { backend: &mut *backend, shared, state };
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

struct BackendWorker<'a> {
    backend: &'a mut dyn Backend,
    shared: &'a Shared,
    state: Option<StateStore>,
}

impl BackendWorker<'_> {
    fn publish(&self) {
        self.shared.publish(self.backend.status());
    }

    /// Loads every program the state directory records, as it was recorded; returns (relaunched, failed).
    fn relaunch(&mut self) -> (usize, usize) {
        let Some(state) = &self.state else { return (0, 0) };
        let programs = state.recorded().programs.clone();
        let (mut ok, mut failed) = (0, 0);
        for p in programs {
            let spec = match state.spec_of(&p) {
                Ok(spec) => spec,
                Err(e) => {
                    tracing::error!(program = %p.name, "cannot relaunch: {e:#}");
                    failed += 1;
                    continue;
                }
            };
            match self.backend.load(spec) {
                Ok(status) => {
                    tracing::info!(program = %p.name, slot = status.slot, "relaunched");
                    ok += 1;
                }
                Err(e) => {
                    tracing::error!(program = %p.name, "relaunch refused: {}", plain(&e));
                    failed += 1;
                }
            }
            self.publish();
        }
        if ok + failed > 0 {
            tracing::info!("relaunched {ok} of {} recorded programs", ok + failed);
        }
        (ok, failed)
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
                    } else {
                        self.change(req, image)
                    };
                    self.publish();
                    let _ = reply.send(response);
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
            let seen = if self.shared.stopping.load(Ordering::Acquire) { Vec::new() } else { self.backend.watch() };
            if !seen.is_empty() {
                for line in &seen {
                    tracing::warn!(target: "watchdog", "{line}");
                }
                self.publish();
                next_publish = Instant::now() + limits.refresh;
            } else if Instant::now() >= next_publish {
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
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Request::Upgrade { name, .. } => {
                let status = self.backend.upgrade(&name, image.clone())?;
                tracing::info!(program = %name, generation = status.generation, "upgraded");
                self.record(|s| s.record_upgrade(&name, &image));
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Request::Unload { name } => {
                self.backend.unload(&name)?;
                tracing::info!(program = %name, "unloaded");
                self.record(|s| s.record_unload(&name));
                Ok(Response::ok())
            }
            Request::ChannelCreate { name, msg_size, capacity } => {
                self.shared.mailbox.create_channel(&name, msg_size, capacity)?;
                tracing::info!(channel = %name, msg_size, capacity, "channel created");
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
