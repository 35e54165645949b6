//! The MPS backend: each program in its own worker (an MPS client of meshd's private server), so that a
//! load, upgrade or unload halts no other program.
//!
//! A module load in one MPS client does not wait for the other clients' kernels (measured on the H200:
//! 0.09 to 0.14 ms while another client's kernel ran), so an idle worker loads and probes the new cubin
//! while everything runs. Creating a client stalls the running kernels once (up to 0.4 ms), so the pool
//! is started before any program runs and a freed worker goes back to it.
//!
//! **The watchdog** ([`Backend::watch`], every few tens of ms, and at once when a worker has news)
//! reads what the workers pushed (each checks its own kernel every 5 ms by default and says when it
//! ended or failed; no worker is asked in turn); a failed kernel or a worker gone starts a recovery
//! (see [`MpsBackend`]'s `recover`): every client ended at once, the culprit named or searched by
//! halves and left stopped, the others relaunched in fresh workers started side by side, the pool
//! refilled. `status` only reads.
//!
//! **Silent workers.** Every worker says `alive` every quarter second from its checking loop. One
//! that says nothing for [`SILENCE_LIMIT`] (SIGSTOP, a wedged driver call) cannot act on a fault,
//! an unload or a stop, while its kernel runs on and its heartbeats stay fresh: the watchdog breaks
//! it off and replaces it alone (no GPU fault happened, the other programs run on): its kernel is
//! asked to stop and given the stop deadline to leave in order, the server cuts the client off
//! (`terminate_client`), it is killed, and its program relaunched in a fresh worker (an idle one of
//! its size if the pool has one, else a new client). An idle worker silent that long is discarded.
//! Silence is not judged while a fault is being recovered from, nor until meshd has run 3 s since
//! its own last stall ([`SilenceClock`]). Not yet verified on a GPU.
//!
//! **Device channels** (opt-in, `MESH_MPS_DEVICE_CHANNELS=1`, not yet verified on a GPU): meshd's
//! own plain context, created before the MPS daemon, owns every device ring (mesh-cuda's
//! `exported`); a worker maps a ring's descriptor before launching a program bound to it. The memory
//! outlives every worker; after a recovery each ring is renewed, its loss counted, and zeroed by the
//! first worker that maps it again (meshd's own context runs no GPU work: it would time-slice).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mesh_backend::cleanup::{self, CleanupId};
use mesh_backend::recover::{self, Recovery};
use mesh_backend::roster::{self, HasCore};
use mesh_backend::watch::{self, Evidence, Verdict};
use mesh_backend::{
    Backend, BackendError, BackendEvent, ImageKind, IsolationMode, LaunchShape, Phase, ProgramCore, ProgramSpec,
    ProgramStatus, RecoveryBoard, Result, SmBudget, check_resident,
};
use mesh_cuda::exported::SharedRings;
use mesh_cuda::{Context, Device, Jit, slots};
use mesh_mps_worker::{KernelState, Probe};
use mesh_shm::Mailbox;
use mesh_shm::layout::{STATE_EXITED, STATE_IDLE, STATE_RUNNING, STATE_STOPPED};
use parking_lot::{Mutex, MutexGuard};

use crate::control::MpsControl;
use crate::standby::Standby;
use crate::worker::{NewsSender, SilenceClock, WORKER_LAUNCH, WORKER_LOAD, Worker, WorkerNews};

/// How long a program relaunched after a GPU fault is watched before it is trusted: on the H200 a
/// fault reached the clients about 150 ms after the faulting launch.
pub const FAULT_WATCH: Duration = Duration::from_millis(600);

pub use crate::pool::MAX_CLIENTS;
use crate::pool::PoolFigures;

/// A worker that says nothing for this long (it says `alive` every 250 ms) is taken for stopped or
/// wedged and replaced: well above a loaded host's scheduling hiccups, well below what a user of a
/// stuck program would wait.
pub const SILENCE_LIMIT: Duration = Duration::from_secs(3);

/// How long the server gets to cut a client off before its SIGKILL (gpu.md: within 0.1 s; a SIGKILL
/// of a client whose kernel still runs fails every other client's kernel).
const CUT_OFF: Duration = Duration::from_millis(200);

/// Options of the MPS backend.
#[derive(Debug, Clone)]
pub struct MpsConfig {
    /// A green context of this many SMs per worker.
    pub sms: Option<u32>,
    /// Pipe and log directories (default `/tmp/meshd-mps.PID`).
    pub mps_dir: Option<PathBuf>,
    /// Workers started before any program runs.
    pub pool: u32,
    /// Whether a load or upgrade that finds the pool empty may create an MPS client (stalling every
    /// running program once, counted), and whether discarded workers are replaced; else it is refused.
    pub pool_grow: bool,
    /// How long a program gets to stop before its worker is cut off.
    pub stop_deadline: Duration,
    /// How often each worker checks its running kernel's stream (`KERNEL_CHECK`, 5 ms, by default):
    /// how soon a fault is heard, against each worker's CPU use.
    pub kernel_check: Duration,
    /// Idle workers of the standby server (a second MPS daemon, made at start) that take the programs
    /// over after a fault: `None` as many as the pool (every program a pool can hold); `Some(0)` no
    /// standby (a fault then stalls every program for the faulted server's teardown, 1.3-1.6 s on the
    /// H200).
    pub standby: Option<u32>,
}

impl MpsConfig {
    /// The standby's size: as many as the pool unless set.
    pub fn standby_size(&self) -> u32 {
        self.standby.unwrap_or(self.pool)
    }
}

impl Default for MpsConfig {
    fn default() -> Self {
        Self {
            sms: None,
            mps_dir: None,
            pool: 2,
            pool_grow: false,
            stop_deadline: Duration::from_secs(2),
            kernel_check: mesh_mps_worker::KERNEL_CHECK,
            standby: None,
        }
    }
}

/// A loaded program: what every backend keeps, its worker, and its linked image.
#[derive(Debug)]
struct Program {
    core: ProgramCore,
    worker: Worker,
    /// The linked image, kept to relaunch the program in a fresh worker after a GPU fault.
    cubin: Arc<Vec<u8>>,
    /// When its workers died from outside while its kernel ran (within [`DEATH_WINDOW`]): past
    /// [`DEATH_LIMIT`] it is left stopped rather than relaunched again.
    deaths: Vec<Instant>,
}

/// A program whose worker dies this many times within [`DEATH_WINDOW`] is left stopped (a worker
/// that keeps dying under it, or an operator who keeps killing it, says something a relaunch will not
/// fix); fewer deaths are relaunched with everyone else.
pub const DEATH_LIMIT: usize = 3;
/// See [`DEATH_LIMIT`].
pub const DEATH_WINDOW: Duration = Duration::from_secs(60);

/// How long `terminate_client` may take before meshd gives up on it and signals the worker anyway:
/// the server cuts a client off within 0.1 s (gpu.md); a server busy with a fault can hold the
/// command for the control daemon's 10 s timeout, which every program would wait out.
pub const TERMINATE_WITHIN: Duration = Duration::from_millis(500);

impl HasCore for Program {
    fn core(&self) -> &ProgramCore {
        &self.core
    }
}

/// What the cleanup action needs, shared with it (and what a recovery under its lock keeps).
#[derive(Debug, Default)]
struct Shared {
    control: Option<Arc<MpsControl>>,
    idle: Vec<Worker>,
    programs: Vec<Program>,
    /// Recoveries not yet handed to meshd's metrics ([`Backend::take_events`]); kept here because
    /// a recovery runs under this lock (from the watchdog, or before a change).
    events: Vec<BackendEvent>,
    /// That some worker has news (its reader's copy): drained, then every worker refreshed.
    news: Option<Receiver<WorkerNews>>,
    /// Device channels' rings, owned by meshd's own plain context (opt-in).
    rings: Option<SharedRings>,
    /// The standby server (`--standby`, on by default).
    standby: Option<Standby>,
}

/// How long a recovery waits for every faulted worker to say its kernel failed before it may move
/// the programs to the standby (on the H200 the fault reached 8 clients within 41 ms of each other).
pub const FAULT_SPREAD: Duration = Duration::from_millis(100);

/// Why device channels are refused in MPS mode, if they are: meshd's own plain context, which owns
/// every device ring, could not be made when the backend opened (a compute mode that allows one
/// context per device, another MPS server in meshd's environment). `None` while no MPS backend has
/// opened, and when they are served.
static DEVICE_CHANNELS_REFUSED: Mutex<Option<String>> = Mutex::new(None);

/// Why a device channel is refused in MPS mode now (see [`DEVICE_CHANNELS_REFUSED`]), else `None`.
pub fn device_channels_refusal() -> Option<String> {
    DEVICE_CHANNELS_REFUSED.lock().clone()
}

/// meshd's own context for the device rings: a plain (non-MPS) context, made before the MPS daemon
/// starts. A process whose environment leads it to an MPS server becomes its client instead, so the
/// context is checked (`MPS_ENABLED` = 0) and refused with the reason otherwise.
fn owner_context(device: &Device) -> Result<SharedRings> {
    let refuse = |reason: String| BackendError::Invalid { what: "device channels in MPS mode".into(), reason };
    mesh_cuda::exported::check_support(device)?;
    let ctx = Context::primary(device).map_err(|e| refuse(format!("meshd's own context for device rings: {e}")))?;
    let seen = Device::get(0)?;
    if seen.mps_enabled {
        let pipe = std::env::var_os(crate::control::PIPE_ENV)
            .map_or_else(|| "unset: the default /tmp/nvidia-mps".to_string(), |p| format!("{p:?}"));
        return Err(refuse(format!(
            "meshd's own context became a client of another MPS server (CUDA_MPS_PIPE_DIRECTORY {pipe} in meshd's \
             environment), but the device rings must outlive every MPS client: start meshd where no other MPS \
             daemon serves this GPU, or with CUDA_MPS_PIPE_DIRECTORY naming an empty directory"
        )));
    }
    Ok(SharedRings::new(ctx)?)
}

/// Takes in whatever the workers pushed, without waiting: the shared channel drained (it only says
/// that there is news), then each worker's own queue.
fn absorb(s: &mut Shared) {
    if let Some(news) = &s.news {
        while news.try_recv().is_ok() {}
    }
    for p in &mut s.programs {
        p.worker.refresh();
    }
    for w in &mut s.idle {
        w.refresh();
    }
}

/// Maps, in `worker`, every device channel program slot `slot` binds (meshd's rings, opt-in);
/// without the opt-in nothing (a binding to a device channel is then refused by the launch).
fn map_channels(rings: &mut Option<SharedRings>, mailbox: &Mailbox, worker: &mut Worker, slot: u32) -> Result<()> {
    let Some(rings) = rings.as_mut() else { return Ok(()) };
    for ring in rings.export_for(mailbox, slot)? {
        if ring.zero || !worker.has_mapped(ring.channel) {
            worker.map(ring.channel, &ring.fd, ring.bytes, ring.zero)?;
            if ring.zero {
                rings.zeroed(ring.channel);
            }
        }
    }
    for loss in rings.take_losses() {
        tracing::warn!(
            channel = loss.channel,
            "channel {:?}: its device ring was made anew, empty: {} messages lost",
            loss.channel,
            loss.lost
        );
    }
    Ok(())
}

/// The control daemon of the running MPS backend, for `native_pipe_dir` / `check_native`.
pub(crate) static ACTIVE: Mutex<Option<Arc<MpsControl>>> = Mutex::new(None);

/// The MPS backend (the seed's `mesh_cuda_backend_open` with `iso` = mps).
#[derive(Debug)]
pub struct MpsBackend {
    shared: Arc<Mutex<Shared>>,
    mailbox: Mailbox,
    jit: Jit,
    device: Device,
    config: MpsConfig,
    cleanup_id: CleanupId,
    cubins: PathBuf,
    next_cubin: AtomicU64,
    shut_down: bool,
    /// MPS clients the device takes (48, or 60 from CUDA 13.1).
    client_limit: u32,
    /// The pool's figures, shared with meshd's `info`.
    pool: PoolFigures,
    /// Where every worker's reader hands its news.
    news: NewsSender,
    /// When the watchdog may judge the workers' silence (not until meshd has run a whole bound
    /// since its last stall: see [`SilenceClock`]).
    silence: SilenceClock,
    /// Where a recovery in place shows at once (meshd's `ps`, `/readyz`, `/metrics`).
    board: RecoveryBoard,
}

/// Starts the pool's workers, each checked to be our client, into `shared`'s idle list: the first
/// alone (its context creation starts the MPS server, and its error is the clearest), the rest side
/// by side (each client takes 0.1-0.4 s to create; one after the other, a pool of 14 and a standby
/// of 14 took seconds at every start).
fn start_pool(
    control: &MpsControl,
    mailbox: &Mailbox,
    config: &MpsConfig,
    shared: &Mutex<Shared>,
    news: &NewsSender,
) -> Result<()> {
    if config.pool == 0 {
        return Ok(());
    }
    let started = Instant::now();
    let first = Worker::start(control, mailbox.path(), config.sms, news, WORKER_LOAD)?;
    tracing::info!(
        worker = first.pid(),
        server = first.server,
        context_ms = first.ready.context_ms,
        kernel_check_us = first.ready.kernel_check_us,
        "first pool worker ready in {:?} (the MPS server started with it)",
        started.elapsed()
    );
    shared.lock().idle.push(first);
    let rest = start_all(control, mailbox.path(), config.sms, news, config.pool as usize - 1, "pool")?;
    shared.lock().idle.extend(rest);
    tracing::info!("MPS pool of {} worker(s) ready in {:?}", config.pool, started.elapsed());
    Ok(())
}

/// Exactly `n` workers started side by side for `what` (at meshd's start), or an error naming why
/// the last one failed.
fn start_all(
    control: &MpsControl,
    mailbox: &Path,
    sms: Option<u32>,
    news: &NewsSender,
    n: usize,
    what: &str,
) -> Result<Vec<Worker>> {
    let (ready, last) = start_many_or_why(control, mailbox, sms, news, n);
    if ready.len() < n {
        let got = ready.len();
        for mut w in ready {
            w.kill();
        }
        return Err(BackendError::MpsDaemon(format!(
            "started {got} of the {n} MPS workers of the {what}: {}",
            last.map_or_else(|| "no reason given".to_string(), |e| e.to_string())
        )));
    }
    Ok(ready)
}

/// Every worker killed, then the daemon quit; waits for both. Programs should have been stopped first.
fn tear_down(shared: &Mutex<Shared>) {
    let mut s = shared.lock();
    for mut p in s.programs.drain(..) {
        p.worker.kill();
    }
    for mut w in s.idle.drain(..) {
        w.kill();
    }
    let mut controls: Vec<Arc<MpsControl>> = s.control.take().into_iter().collect();
    if let Some(mut standby) = s.standby.take() {
        controls.push(standby.tear_down());
    }
    // The standby's directory is nested in the first daemon's (whichever is active now), which
    // removes it when it made it: the nested one quits first, while its pipes still exist.
    controls.sort_by_key(|c| std::cmp::Reverse(c.root().as_os_str().len()));
    for control in controls {
        control.quit();
    }
    *ACTIVE.lock() = None;
}

/// The standby daemon (`<mps dir>/standby`) and its workers (`--standby`, by default as many as
/// the pool), started now side by side, before any program runs, into `shared` (so that the cleanup
/// tears them down on failure). `--standby 0`: none.
fn start_standby(
    control: &MpsControl,
    mailbox: &Mailbox,
    config: &MpsConfig,
    shared: &Mutex<Shared>,
    news: &NewsSender,
) -> Result<()> {
    let k = config.standby_size();
    if k == 0 {
        tracing::warn!(
            "--standby 0: no standby MPS server; a GPU fault stalls every program until the faulted server has \
             torn its clients down (1.3-1.6 s on the H200, against 15 ms with a standby)"
        );
        return Ok(());
    }
    let started = Instant::now();
    let sb_control = Arc::new(
        MpsControl::start(Some(&control.root().join("standby")))?
            .with_device(control.device().map(String::from))
            .with_kernel_check(control.kernel_check()),
    );
    shared.lock().standby = Some(Standby::new(sb_control.clone(), k as usize));
    let first = Worker::start(&sb_control, mailbox.path(), config.sms, news, WORKER_LOAD)?;
    let mut workers = vec![first];
    workers.extend(start_all(&sb_control, mailbox.path(), config.sms, news, k as usize - 1, "standby")?);
    if let Some(sb) = shared.lock().standby.as_mut() {
        sb.adopt(workers);
    }
    tracing::info!(
        "MPS standby server ready with {k} idle worker(s) in {:?}: after a GPU fault they take the programs over",
        started.elapsed()
    );
    Ok(())
}

/// Waits up to [`FAULT_SPREAD`] until every watched program's worker has said its kernel failed:
/// then no kernel of the faulted server runs on, and the programs may move to the standby at once.
fn every_kernel_failed(s: &mut Shared) -> bool {
    news_until(s, Instant::now() + FAULT_SPREAD, |s| {
        s.programs.iter().filter(|p| on_watch(p)).all(|p| failed(&p.worker).is_some())
    })
}

/// Takes the workers' news until `holds` does (true) or `deadline` passes (false), waking for
/// each piece of news rather than polling.
fn news_until(s: &mut Shared, deadline: Instant, holds: impl Fn(&Shared) -> bool) -> bool {
    loop {
        absorb(s);
        if holds(s) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        match s.news.as_ref().map(|n| n.recv_timeout(left)) {
            Some(Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout)) => {}
            // No news channel (cannot happen while the backend runs): watch by the clock.
            _ => std::thread::sleep(left.min(Duration::from_millis(5))),
        }
    }
}

/// A refused life transition (a bug), as the contract's error naming the program.
fn illegal(name: &str, e: mesh_backend::life::IllegalTransition) -> BackendError {
    BackendError::Invalid { what: format!("program {name:?}"), reason: e.to_string() }
}

/// The MPS backend as a recovery drives it, under its lock: a reset ends every client, a relaunch
/// starts fresh workers side by side.
struct Clients<'a> {
    backend: &'a MpsBackend,
    s: &'a mut Shared,
    control: &'a MpsControl,
    times: Breakdown,
    /// The programs move to the standby server: the faulted server's workers are abandoned (killed,
    /// reaped later), and the relaunch takes standby workers instead of starting clients.
    standby: bool,
}

/// Where a recovery's time went, for its log line (summed over a search by halves' rounds).
#[derive(Debug, Default, Clone, Copy)]
struct Breakdown {
    /// Ending every client (and renewing the device rings).
    ending: Duration,
    /// Starting the new workers (MPS clients) side by side.
    new_clients: Duration,
    /// Loading each program into its new worker and launching it.
    relaunch: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn unix_ns_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Recovery for Clients<'_> {
    type Error = std::convert::Infallible;

    fn reset(&mut self) -> std::result::Result<(), Self::Error> {
        let started = Instant::now();
        if self.standby {
            self.backend.abandon_all_clients(self.s);
        } else {
            self.backend.end_all_clients(self.s, self.control);
        }
        // No client maps a ring now: each is renewed (and marked for zeroing) before anything relaunches.
        if let Some(rings) = self.s.rings.as_mut() {
            for e in rings.renew_all(&self.backend.mailbox) {
                tracing::error!("{e}");
            }
            for loss in rings.take_losses() {
                tracing::warn!(
                    channel = loss.channel,
                    "channel {:?}: its device ring was renewed empty after the GPU fault: {} messages lost",
                    loss.channel,
                    loss.lost
                );
            }
        }
        self.times.ending += started.elapsed();
        Ok(())
    }

    fn relaunch(&mut self, which: &[usize]) {
        self.backend.relaunch(self.s, self.control, which, &mut self.times, self.standby);
    }

    fn faulted_within(&mut self, running: &[usize]) -> bool {
        faulted_within(self.s, running)
    }

    fn core(&mut self, i: usize) -> &mut ProgramCore {
        &mut self.s.programs[i].core
    }

    fn relaunchable(&self, i: usize) -> bool {
        relaunchable(&self.s.programs[i])
    }

    fn count(&self) -> usize {
        self.s.programs.len()
    }

    fn record(&mut self, event: BackendEvent) {
        self.s.events.push(event);
    }
}

impl MpsBackend {
    /// Starts the private daemon and the pool (each worker checked to be our client) before any program runs.
    pub fn open(mailbox: &Mailbox, config: MpsConfig) -> Result<Self> {
        let (client_limit, limit_source) = crate::pool::client_limit(mesh_cuda::driver::init().ok().map(|d| d.version));
        if config.pool > client_limit {
            return Err(BackendError::ClientLimit { asked: config.pool, limit: client_limit });
        }
        let standby = config.standby_size();
        if config.pool + standby > client_limit {
            return Err(BackendError::Invalid {
                what: format!("--pool {} with --standby {standby}", config.pool),
                reason: format!(
                    "the pool and the standby would be {} MPS clients, more than this device's {client_limit} \
                     ({limit_source}); lower --standby (it needs one worker per program that runs) or --pool",
                    config.pool + standby
                ),
            });
        }
        let growth = client_limit - config.pool - standby;
        tracing::info!(
            "MPS clients: the pool uses {} and the standby {standby} of this device's {client_limit} ({limit_source}); \
             up to {} program(s) run without creating a client, {}",
            config.pool,
            config.pool,
            if config.pool_grow {
                format!("and --pool-grow may create {growth} more (each stalls the running programs once)")
            } else {
                format!("{growth} more with --pool-grow")
            }
        );
        let check_us = u64::try_from(config.kernel_check.as_micros()).unwrap_or(u64::MAX);
        if !mesh_mps_worker::KERNEL_CHECK_RANGE_US.contains(&check_us) {
            return Err(BackendError::Invalid {
                what: format!("the MPS workers' kernel check period {check_us} µs"),
                reason: format!(
                    "must be {} to {} µs",
                    mesh_mps_worker::KERNEL_CHECK_RANGE_US.start(),
                    mesh_mps_worker::KERNEL_CHECK_RANGE_US.end()
                ),
            });
        }
        tracing::info!(
            "MPS workers check a running kernel's stream every {check_us} µs (how soon a fault is heard, against each \
             worker's CPU use); a worker silent for {} ms is replaced",
            SILENCE_LIMIT.as_millis()
        );
        let device = Device::get(0)?;
        // Every worker looks its GPU up by UUID (under MPS a client sees the server's devices renumbered).
        let uuid = match device.uuid() {
            Ok(uuid) => Some(uuid),
            Err(e) => {
                tracing::warn!("the GPU's UUID: {e}; workers open the server's device 0");
                None
            }
        };
        let pool = PoolFigures::default();
        pool.open(config.pool, config.pool_grow, client_limit, limit_source);
        if let Some(n) = config.sms {
            device.sm_partitioning()?.check(n)?;
        }
        // Before the MPS daemon exists, so that it cannot become its client.
        // MPS mode still starts without it: only device channels are then refused, saying why.
        let rings = match owner_context(&device) {
            Ok(rings) => {
                *DEVICE_CHANNELS_REFUSED.lock() = None;
                tracing::info!("device channels: their rings are owned by meshd's own plain context");
                Some(rings)
            }
            Err(e) => {
                let why = format!("meshd's own context, which owns device rings in MPS mode, could not be made: {e}");
                tracing::warn!("device channels are refused in this MPS meshd: {why}");
                *DEVICE_CHANNELS_REFUSED.lock() = Some(why);
                None
            }
        };
        let control = Arc::new(
            MpsControl::start(config.mps_dir.as_deref())?.with_device(uuid).with_kernel_check(config.kernel_check),
        );
        let (news, news_rx) = NewsSender::channel();
        let shared = Arc::new(Mutex::new(Shared {
            control: Some(control.clone()),
            news: Some(news_rx),
            rings,
            ..Shared::default()
        }));
        let for_cleanup = shared.clone();
        let cleanup_id = cleanup::register("MPS workers and control daemon", move || tear_down(&for_cleanup));
        *ACTIVE.lock() = Some(control.clone());
        let cubins = control.root().join("cubins");
        let built = std::fs::create_dir_all(&cubins)
            .map_err(|e| BackendError::MpsDaemon(format!("{}: {e}", cubins.display())))
            .and_then(|()| start_pool(&control, mailbox, &config, &shared, &news))
            .and_then(|()| start_standby(&control, mailbox, &config, &shared, &news))
            .and_then(|()| Jit::start(&device.arch()));
        let jit = match built {
            Ok(j) => j,
            Err(e) => {
                cleanup::run_one(cleanup_id);
                pool.close();
                return Err(e);
            }
        };
        pool.publish(shared.lock().idle.len(), 0);
        Ok(Self {
            shared,
            mailbox: mailbox.clone(),
            jit,
            device,
            config,
            cleanup_id,
            cubins,
            next_cubin: AtomicU64::new(0),
            shut_down: false,
            client_limit,
            pool,
            news,
            silence: SilenceClock::new(),
            board: RecoveryBoard::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock()
    }

    fn control(&self) -> Result<Arc<MpsControl>> {
        self.lock().control.clone().ok_or(BackendError::ShutDown)
    }

    /// The private daemon's pipe directory.
    pub fn pipe_dir(&self) -> Option<PathBuf> {
        self.lock().control.as_ref().map(|c| c.pipe_dir())
    }

    /// Pids of the idle pool.
    pub fn idle_workers(&self) -> Vec<u32> {
        self.lock().idle.iter().map(Worker::pid).collect()
    }

    /// Refuses after shutdown; recovers from a GPU fault first if one happened since the watchdog
    /// last looked (a change in a poisoned server would fail).
    fn ready(&self) -> Result<()> {
        if self.shut_down {
            return Err(BackendError::ShutDown);
        }
        let failure = {
            let mut s = self.lock();
            absorb(&mut s);
            s.programs.iter().filter(|p| on_watch(p)).find_map(|p| failed(&p.worker))
        };
        if let Some(error) = failure {
            for line in self.recover(&error) {
                tracing::warn!(target: "watchdog", "{line}");
            }
        }
        Ok(())
    }

    /// An idle worker started with `sms` (the program's own `--sms`, else the global one; None: the
    /// whole GPU) for `op` (`load`, `upgrade`) of `program`. None idle: refused with
    /// the reason, unless growth is allowed (`--pool-grow`); then a new MPS client, which stalls the
    /// running programs once: counted, logged, and shown by `info` and the request's reply.
    fn take_worker(&mut self, sms: Option<u32>, program: &str, op: &'static str) -> Result<Worker> {
        let (found, idle_asks, in_use) = {
            let mut s = self.lock();
            // Exactly what was asked: a worker given back by an unloaded `--sms 16` program must not
            // hand a later whole-GPU program 16 SMs.
            let pos = s.idle.iter().position(|w| w.asked_sms == sms);
            let found = pos.map(|p| s.idle.swap_remove(p));
            (found, s.idle.iter().map(|w| w.asked_sms).collect::<Vec<Option<u32>>>(), s.programs.len())
        };
        if let Some(w) = found {
            self.publish_pool();
            return Ok(w);
        }
        if !self.config.pool_grow {
            let why = crate::pool::refusal(op, program, sms, &idle_asks, in_use, self.config.pool);
            tracing::warn!("{why}");
            return Err(BackendError::Invalid { what: "MPS pool".into(), reason: why });
        }
        self.grow(sms, program, op)
    }

    /// A new worker (a new MPS client) for `op` of `program`, growth being allowed: every running
    /// program stalls once, which is counted and logged.
    fn grow(&self, sms: Option<u32>, program: &str, op: &'static str) -> Result<Worker> {
        let (clients, running) = {
            let s = self.lock();
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            let standby = s.standby.as_ref().map_or(0, |sb| sb.pids().len());
            (count(s.idle.len() + s.programs.len() + standby), count(s.programs.iter().filter(|p| on_watch(p)).count()))
        };
        if clients + 1 > self.client_limit {
            return Err(BackendError::ClientLimit { asked: clients + 1, limit: self.client_limit });
        }
        let control = self.control()?;
        let started = Instant::now();
        let w = Worker::start(&control, self.mailbox.path(), sms, &self.news, WORKER_LOAD)?;
        if running > 0 {
            let n = self.pool.record_growth(program, op, running);
            tracing::warn!(
                program,
                "MPS pool grown for {op} of {program:?} (--pool-grow): worker {} created in {:?}; its client creation \
                 stalled {running} running program(s) (stall #{n} since start)",
                w.pid(),
                started.elapsed()
            );
        } else {
            tracing::info!(
                program,
                "MPS pool grown for {op} of {program:?}: worker {} (no program was running)",
                w.pid()
            );
        }
        Ok(w)
    }

    /// After an unload or upgrade of `program`: workers discarded (a program cut off, a failed
    /// kernel) so that fewer than `--pool` exist are replaced only when growth is allowed (each
    /// replacement stalls the running programs once, counted). Workers that return from programs
    /// refill the pool by themselves.
    fn grow_back(&self, program: &str) {
        let missing = {
            let s = self.lock();
            (self.config.pool as usize).saturating_sub(s.idle.len() + s.programs.len())
        };
        if missing > 0 && !self.config.pool_grow {
            tracing::info!(
                "MPS pool: {missing} worker(s) discarded below --pool {} not replaced (creating a client stalls the \
                 running programs; --pool-grow allows it)",
                self.config.pool
            );
        }
        if self.config.pool_grow {
            for _ in 0..missing {
                match self.grow(self.config.sms, program, "refill") {
                    Ok(w) => self.lock().idle.push(w),
                    Err(e) => {
                        tracing::warn!("growing the MPS pool back: {e}");
                        break;
                    }
                }
            }
        }
        self.publish_pool();
    }

    /// The pool's counts for `info`.
    fn publish_pool(&self) {
        self.publish_pool_locked(&self.lock());
    }

    /// [`MpsBackend::publish_pool`] under a lock already held.
    fn publish_pool_locked(&self, s: &Shared) {
        self.pool.publish(s.idle.len(), s.programs.len());
    }

    /// Returns a worker to the pool after unloading its module; a worker that will not is discarded.
    fn give_back(&self, mut w: Worker) {
        match w.unload() {
            Ok(()) => self.lock().idle.push(w),
            Err(e) => {
                tracing::warn!("worker {} discarded: {e}", w.pid());
                // A worker that did not answer may still run a kernel: cut it off through the
                // server first (a SIGKILL of a busy client fails the server's other clients).
                w.refresh();
                if may_run_a_kernel(&w) {
                    let control = self.lock().control.clone();
                    if let Some(control) = control {
                        if let Err(e) = control.terminate_client(w.server, w.pid(), TERMINATE_WITHIN) {
                            tracing::error!("cutting discarded MPS worker {} off its server: {e}", w.pid());
                        }
                        await_cut_off(&mut w);
                    }
                }
                w.kill();
            }
        }
    }

    /// Has `worker` load `cubin` and probe its `mesh_main` for `shape`.
    fn load_into(&self, worker: &mut Worker, name: &str, cubin: &[u8], shape: &LaunchShape) -> Result<Probe> {
        let n = self.next_cubin.fetch_add(1, Ordering::Relaxed);
        let path = self.cubins.join(format!("{n}-{name}.cubin"));
        std::fs::write(&path, cubin)
            .map_err(|e| BackendError::Worker { pid: worker.pid(), detail: format!("{}: {e}", path.display()) })?;
        let probe = worker.load(&path, shape, name);
        let _ = std::fs::remove_file(&path);
        probe
    }

    /// Links `image` and reads its entry point, before any worker is taken: an image refused for
    /// its format, architecture, link or entry is refused for that reason in both modes, never for
    /// an empty pool (and no idle worker is spent on it).
    fn link_checked(&self, name: &str, image: Vec<u8>, kind: ImageKind) -> Result<Arc<Vec<u8>>> {
        let linked = self.jit.link(name, image, kind)?;
        if mesh_cuda::entry::function(&linked.cubin, "mesh_main") == mesh_cuda::entry::Entry::Missing {
            return Err(BackendError::NoEntry {
                program: name.to_string(),
                detail: "the linked cubin's symbol table defines no function mesh_main".into(),
            });
        }
        Ok(linked.cubin)
    }

    /// Has `worker` load and probe the linked `cubin`, and checks that it can be resident beside the
    /// others: every block within the worker's own context, its share counted of the device's SMs,
    /// which every worker shares. Returns the launch's share and the cubin.
    fn prepare(
        &mut self,
        worker: &mut Worker,
        name: &str,
        cubin: Arc<Vec<u8>>,
        shape: &LaunchShape,
        replacing: Option<&str>,
    ) -> Result<(f64, Arc<Vec<u8>>)> {
        let probe = self.load_into(worker, name, &cubin, shape)?;
        let held = roster::held_share(&self.lock().programs, replacing);
        let sms = SmBudget::own_context(probe.sms, self.device.sm_count);
        let share = check_resident(name, shape, &probe.figures(), sms, held)?;
        Ok((share, cubin))
    }

    /// After a GPU fault: NVIDIA documents (and the H200 showed) that a fatal fault in one client is
    /// reported to every client, and that the server takes no new client until all of them have exited.
    /// So every client is ended at once, and the culprit is named from the evidence (mesh-backend's
    /// `watch`: slots, a dead worker, the server's log, recency, heartbeats); the others are relaunched
    /// at once in fresh workers started side by side. When it cannot be named it is searched by halves
    /// (each half relaunched and watched for [`FAULT_WATCH`]). A server that went away names no one.
    /// Returns the log lines.
    fn recover(&self, error: &str) -> Vec<String> {
        let started = Instant::now();
        let started_unix = unix_ns_now();
        let mut s = self.lock();
        let Some(control) = s.control.clone() else { return Vec::new() };
        // Every program on the GPU shows as recovering from now until it is relaunched (the reader
        // thread that heard the fault marked the recovery begun already, naming no program).
        self.board.begin(
            format!("GPU fault: {error}"),
            s.programs.iter().filter(|p| on_watch(p)).map(|p| p.core.name.clone()).collect::<Vec<_>>(),
        );
        // The first worker to see the fault, and when (its own clock reading, not meshd's).
        let first_seen = s.programs.iter().filter_map(|p| p.worker.failed_at().map(|t| (t, p.worker.pid()))).min();
        let evidence = self.evidence(&mut s, &control, started);
        // Only a list that answers and lacks our server says it went away.
        let server_gone = control.servers().is_ok_and(|servers| {
            s.programs.iter().filter(|p| on_watch(p)).any(|p| !servers.contains(&p.worker.server))
        });
        let mut verdict = if server_gone { Verdict::NoCulprit } else { watch::name_culprit(&evidence, watch::TICK) };
        let mut log = vec![format!(
            "GPU fault reported to the MPS clients ({error}){}: ending every client; {verdict:?}",
            if server_gone { "; our MPS server went away" } else { "" }
        )];
        // A worker killed from outside (or crashed) while its kernel ran: its death failed every
        // client's kernel, so no program is to blame and all are relaunched, its own too; a program
        // whose workers keep dying ([`DEATH_LIMIT`] within [`DEATH_WINDOW`]) is left stopped.
        for (i, e) in evidence.iter().enumerate() {
            if !e.process_gone || server_gone {
                continue;
            }
            let p = &mut s.programs[i];
            p.deaths.retain(|t| started.saturating_duration_since(*t) < DEATH_WINDOW);
            p.deaths.push(started);
            let n = p.deaths.len();
            log.push(format!(
                "MPS worker {} of program {} died while its kernel ran, without its kernel reporting a fault of its \
                 own (killed from outside, e.g. the OOM killer or an operator, or crashed): its death failed every \
                 client's kernel; death {n} of {DEATH_LIMIT} allowed within {} s",
                p.worker.pid(),
                p.core.name,
                DEATH_WINDOW.as_secs()
            ));
            if n >= DEATH_LIMIT && !matches!(verdict, Verdict::Culprit { .. }) {
                verdict = Verdict::Culprit {
                    index: i,
                    why: format!(
                        "its MPS worker died {n} times within {} s while its kernel ran (each death fails every \
                         program's kernel); `meshd upgrade` or a new load runs it again",
                        DEATH_WINDOW.as_secs()
                    ),
                };
            }
        }
        // The standby takes the programs over unless one reason below holds; the log names it.
        let to_relaunch: Vec<usize> = (0..s.programs.len()).filter(|&i| relaunchable(&s.programs[i])).collect();
        let refusal = match s.standby.as_ref() {
            None => None,
            Some(_) if matches!(verdict, Verdict::Search { .. }) => Some(
                "the culprit is not named and is searched by halves (a half relaunched on the standby that faulted \
                 would leave no standby)"
                    .to_string(),
            ),
            Some(sb) if sb.ready() < to_relaunch.len() => Some(format!(
                "it has {} ready worker(s) for {} program(s) to relaunch (--standby {}; it refills after each use)",
                sb.ready(),
                to_relaunch.len(),
                sb.wanted()
            )),
            Some(_) => match to_relaunch.iter().find(|&&i| s.programs[i].worker.asked_sms != self.config.sms) {
                Some(&i) => Some(format!(
                    "program {} runs with its own --sms ({}), and the standby's workers have the pool's",
                    s.programs[i].core.name,
                    s.programs[i].worker.asked_sms.map_or_else(|| "the whole GPU".into(), |n| n.to_string())
                )),
                None if !every_kernel_failed(&mut s) => {
                    let quiet: Vec<String> = s
                        .programs
                        .iter()
                        .filter(|p| on_watch(p) && failed(&p.worker).is_none())
                        .map(|p| format!("{} (worker {})", p.core.name, p.worker.pid()))
                        .collect();
                    Some(format!(
                        "{} did not say within {} ms that its kernel failed, so it may still run on the faulted server",
                        quiet.join(", "),
                        FAULT_SPREAD.as_millis()
                    ))
                }
                None => None,
            },
        };
        let standby = s.standby.is_some() && refusal.is_none();
        if let Some(why) = &refusal {
            log.push(format!("MPS standby not used for this recovery: {why}; the usual recovery"));
        }
        let named = started.elapsed();
        let mut clients = Clients { backend: self, s: &mut s, control: &control, times: Breakdown::default(), standby };
        let culprit = recover::recover(&mut clients, &verdict, error, &evidence, started, &mut log);
        let times = clients.times;
        let Ok(culprit) = culprit;
        self.board.end();
        if let Some((i, why)) = &culprit {
            tracing::error!(program = s.programs[*i].core.name, "caused the GPU fault ({why}): left stopped");
        }
        let name = culprit.as_ref().map_or_else(|| "none".to_string(), |(i, _)| s.programs[*i].core.name.clone());
        let running = s.programs.iter().filter(|p| p.core.life.phase() == &Phase::Running).count();
        let detection = first_seen.map_or_else(
            || "no worker said when it saw the fault".to_string(),
            |(at, pid)| {
                format!(
                    "worker {pid} saw the fault {:.1} ms before the recovery began",
                    started_unix.saturating_sub(at) as f64 / 1e6
                )
            },
        );
        log.push(format!(
            "watchdog mps: recovered in {:.1} ms; culprit {name}; {running} program(s) running; breakdown: {detection}; \
             evidence and culprit {:.1} ms; ending the clients {:.1} ms; new clients {:.1} ms; loads and launches {:.1} \
             ms; the rest is a search's watches",
            ms(started.elapsed()),
            ms(named),
            ms(times.ending),
            ms(times.new_clients),
            ms(times.relaunch),
        ));
        if standby {
            // The standby server is the active one now; its idle workers are the pool (creating more
            // would stall the programs just relaunched there), and a new standby is made on the
            // faulted server by the watchdog's ticks, as it takes clients again.
            if let Some(sb) = s.standby.as_mut() {
                let (active, idle) = sb.swap(control.clone());
                log.push(format!(
                    "MPS standby took the programs over: its server is the active one now, with {} idle worker(s); a \
                     new standby is made on the faulted server as it takes clients again",
                    idle.len()
                ));
                s.idle.extend(idle);
                *ACTIVE.lock() = Some(active.clone());
                s.control = Some(active);
            }
        } else {
            self.refill(&mut s, &control);
        }
        log
    }

    /// What each program's slot, worker and heartbeat said when the fault was noticed, with the
    /// server's log searched for a line about the fault that names a worker.
    fn evidence(&self, s: &mut Shared, control: &MpsControl, now: Instant) -> Vec<Evidence> {
        let log = std::fs::read_to_string(control.log_dir().join("server.log")).unwrap_or_default();
        let fault_lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("fatal") || l.contains("exception") || l.contains("fault") || l.contains("illegal")
            })
            .collect();
        s.programs
            .iter_mut()
            .map(|p| {
                let state = self.mailbox.slot(p.core.slot).map(|s| s.status().state).unwrap_or(STATE_IDLE);
                let pid = p.worker.pid().to_string();
                Evidence {
                    on_gpu: on_watch(p) && matches!(state, STATE_IDLE | STATE_RUNNING),
                    named_by_server: fault_lines
                        .iter()
                        .any(|l| l.split(|c: char| !c.is_ascii_digit()).any(|w| w == pid)),
                    process_gone: p.worker.died_unreported(),
                    image_age: p.core.health.image_age(now),
                    beat_stale: p.core.health.beat_stale(now),
                }
            })
            .collect()
    }

    /// Relaunches programs `which` (stopped, their clients ended) in fresh workers started side by
    /// side; a program whose relaunch fails is left stopped with the error.
    fn relaunch(&self, s: &mut Shared, control: &MpsControl, which: &[usize], times: &mut Breakdown, standby: bool) {
        let spawned = Instant::now();
        let taken = if standby { s.standby.as_mut().and_then(|sb| sb.take(which.len())) } else { None };
        let workers = match taken {
            Some(w) => w,
            None => {
                // Each program in a worker of its own size (its `--sms`, else the global one):
                // the sizes one after the other, each size's workers side by side.
                let mut asks: BTreeMap<Option<u32>, usize> = BTreeMap::new();
                for &i in which {
                    *asks.entry(s.programs[i].worker.asked_sms).or_default() += 1;
                }
                asks.into_iter()
                    .flat_map(|(ask, n)| start_many(control, self.mailbox.path(), ask, &self.news, n))
                    .collect()
            }
        };
        times.new_clients += spawned.elapsed();
        let launched_at = Instant::now();
        self.launch_in(s, which, workers, standby, "a GPU fault");
        times.relaunch += launched_at.elapsed();
    }

    /// Relaunches programs `which` (stopped) in `workers`, one each, the old worker of each killed (or
    /// handed to the standby to reap); a program left without a worker, or whose launch fails, is
    /// left stopped with the error, naming `after` (what the relaunch follows). Workers left over go
    /// to the pool (standby) or are killed.
    fn launch_in(&self, s: &mut Shared, which: &[usize], mut workers: Vec<Worker>, standby: bool, after: &str) {
        for &i in which {
            let ask = s.programs[i].worker.asked_sms;
            let Some(mut worker) = workers.iter().position(|w| w.asked_sms == ask).map(|at| workers.swap_remove(at))
            else {
                s.programs[i].core.life.fault(format!("relaunch after {after} failed: no MPS client could be started"));
                continue;
            };
            let Shared { programs, rings, standby: sb, .. } = &mut *s;
            let p = &mut programs[i];
            let launched = self.load_into(&mut worker, &p.core.name, &p.cubin, &p.core.shape).and_then(|_| {
                map_channels(rings, &self.mailbox, &mut worker, p.core.slot)?;
                let generation = p.core.life.launch().map_err(|e| illegal(&p.core.name, e))?;
                slots::arm(&self.mailbox, p.core.slot, generation)?;
                p.core.health.launched(slots::reading(&self.mailbox, p.core.slot).heartbeat);
                worker.launch(p.core.slot)
            });
            let old = std::mem::replace(&mut p.worker, worker);
            match sb.as_mut().filter(|_| standby) {
                Some(sb) => sb.bury(old),
                None => {
                    old.signal_kill();
                    reap_later(old);
                }
            }
            match launched {
                Ok(()) => {
                    p.core.health.restarts += 1;
                    self.board.relaunched(&p.core.name);
                }
                Err(e) => {
                    tracing::error!(program = p.core.name, "relaunch after {after} failed: {e}");
                    p.core.life.returned();
                    p.core.life.fault(format!("relaunch after {after} failed: {e}"));
                }
            }
        }
        for mut w in workers {
            if standby {
                s.idle.push(w);
            } else {
                w.kill();
            }
        }
    }

    /// Breaks off every worker of `s` silent for more than [`SILENCE_LIMIT`] at `now`, and replaces
    /// each such program's worker alone: no GPU fault happened, so the other programs run on. Its
    /// kernel is asked to stop and gets the stop deadline to leave in order (read from its slot);
    /// then the server cuts the silent client off (a kernel still running ends), it is killed (a
    /// stopped process too), and the program is relaunched in an idle worker of its size, else in a new client
    /// (which stalls the running programs once, counted as the pool's growth). Idle and standby
    /// workers found silent are only broken off: the watchdog and the standby's tick discard them.
    /// Returns the log lines.
    fn replace_silent(&self, s: &mut Shared, now: Instant) -> Vec<String> {
        let silent = silent_programs(s, now, SILENCE_LIMIT);
        let Some(control) = s.control.clone().filter(|_| !silent.is_empty()) else { return Vec::new() };
        self.board.begin(
            format!("MPS worker(s) silent for more than {} ms", SILENCE_LIMIT.as_millis()),
            silent.iter().map(|&(i, _)| s.programs[i].core.name.clone()).collect::<Vec<_>>(),
        );
        for &(i, _) in &silent {
            let p = &mut s.programs[i];
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
        }
        // A silent worker's kernel still runs and reads its stop word: given the stop deadline to
        // leave in order (mesh_end after closing its channels publishes their exact positions, so
        // its relaunch repeats nothing), read from its slot, before the server cuts it off.
        let slots: Vec<u32> = silent.iter().map(|&(i, _)| s.programs[i].core.slot).collect();
        let state_of = |slot: u32| self.mailbox.slot(slot).map_or(STATE_EXITED, |s| s.status().state);
        let in_order = await_stops(&slots, Instant::now() + self.config.stop_deadline, state_of);
        // Side by side and bounded: a stopped client may never let the command finish (test-mps's
        // SIGSTOPped worker was replaced 13.28 s after its stop, against a 3 s bound).
        let cut: Vec<(u32, u32)> =
            silent.iter().map(|&(i, _)| (s.programs[i].worker.server, s.programs[i].worker.pid())).collect();
        for (pid, e) in control.terminate_clients(&cut, TERMINATE_WITHIN) {
            tracing::error!("terminate_client of silent MPS worker {pid}: {e}; it is killed all the same");
        }
        // All cut off first, then one wait for the server, then the signals.
        std::thread::sleep(CUT_OFF);
        // A GPU fault reported meanwhile (during the stop wait) poisons every client of the server,
        // the idle ones too: a relaunch now would fail and leave the program faulted, which the
        // recovery that follows in this tick would not relaunch. Left stopped instead, for it.
        let fault_meanwhile = fault_pending(s);
        let mut log = Vec::new();
        for ((i, silent), in_order) in silent.into_iter().zip(in_order) {
            let p = &mut s.programs[i];
            p.worker.signal_kill();
            p.core.life.returned();
            let (old, name, ask) = (p.worker.pid(), p.core.name.clone(), p.worker.asked_sms);
            if fault_meanwhile {
                log.push(format!(
                    "MPS worker {old} of program {name} was silent for {} ms: cut off its MPS server and killed; \
                     {name} is relaunched by the recovery from the GPU fault reported meanwhile",
                    silent.as_millis()
                ));
                continue;
            }
            let (workers, from) = match take_idle(&mut s.idle, ask) {
                Some(w) => (vec![w], "an idle worker of the pool"),
                None => {
                    let running = s.programs.iter().filter(|p| on_watch(p)).count();
                    if running > 0 {
                        let stalled = u32::try_from(running).unwrap_or(u32::MAX);
                        self.pool.record_growth(&name, "replace a silent worker", stalled);
                    }
                    // Started with what the old worker was started with (the program's own --sms).
                    let fresh = start_many(&control, self.mailbox.path(), ask, &self.news, 1);
                    (fresh, "a new MPS client: the running programs stalled once")
                }
            };
            self.launch_in(s, &[i], workers, false, "its worker went silent");
            let p = &s.programs[i];
            let outcome = match p.core.life.faulted() {
                None if in_order => format!(
                    "{name} stopped in order first (exactly once on its channels) and relaunched in worker {} ({from})",
                    p.worker.pid()
                ),
                // Cut off, not stopped in order: a GPU consumer publishes its position in batches.
                None => format!(
                    "{name} did not stop in order within {} ms and was cut off, then relaunched in worker {} ({from}); \
                     its channels are at-least-once across this: messages its kernel had taken since it last \
                     published its position come again",
                    self.config.stop_deadline.as_millis(),
                    p.worker.pid()
                ),
                Some(why) => format!("{name} left stopped: {why}"),
            };
            log.push(format!(
                "MPS worker {old} of program {name} was silent for {} ms (it says alive every {} ms; the bound is {} \
                 ms): stopped or wedged; cut off its MPS server and killed; {outcome}",
                silent.as_millis(),
                mesh_mps_worker::ALIVE_EVERY.as_millis(),
                SILENCE_LIMIT.as_millis()
            ));
        }
        self.publish_pool_locked(s);
        self.board.end();
        log
    }

    /// Refills the pool, now that the server takes clients again (workers started side by side).
    fn refill(&self, s: &mut Shared, control: &MpsControl) {
        let missing = (self.config.pool as usize).saturating_sub(s.idle.len());
        s.idle.extend(start_many(control, self.mailbox.path(), self.config.sms, &self.news, missing));
    }

    /// Abandons every client of the faulted server (the standby takes the programs over): a stop
    /// request to every program, every worker signalled (each kernel has failed, so a SIGKILL harms
    /// no other), the idle ones handed to the standby to reap; none is waited for.
    fn abandon_all_clients(&self, s: &mut Shared) {
        for p in &mut s.programs {
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
            p.worker.signal_kill();
        }
        let idle = std::mem::take(&mut s.idle);
        match s.standby.as_mut() {
            Some(sb) => idle.into_iter().for_each(|w| sb.bury(w)),
            None => idle.into_iter().for_each(|mut w| w.kill()),
        }
        for p in &mut s.programs {
            p.core.life.returned();
        }
    }

    /// Ends every client, bounded (at most about [`FAULT_SPREAD`] + [`TERMINATE_WITHIN`] +
    /// [`CUT_OFF`], however many): a stop request to every program; a wait of up to
    /// [`FAULT_SPREAD`] for every worker to say its kernel failed (after a fault they all do, within
    /// some 40 ms of each other on the H200); a worker whose kernel may still run is then cut off
    /// through the server, all side by side, each bounded (a server busy with the fault held a
    /// `terminate_client` for the daemon's 10 s timeout: "ending the clients 10267.3 ms"); then
    /// every worker is signalled. None is reaped here: a SIGKILLed client stays in D state while the
    /// driver tears its context down (up to 2 s), and the server takes new clients only once it is
    /// gone, which the relaunch waits for anyway.
    fn end_all_clients(&self, s: &mut Shared, control: &MpsControl) {
        for p in &mut s.programs {
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
        }
        let every_worker = |s: &Shared| -> Vec<(u32, u32)> {
            s.idle
                .iter()
                .chain(s.programs.iter().map(|p| &p.worker))
                .filter(|w| may_run_a_kernel(w))
                .map(|w| (w.server, w.pid()))
                .collect()
        };
        news_until(s, Instant::now() + FAULT_SPREAD, |s| every_worker(s).is_empty());
        let busy = every_worker(s);
        if !busy.is_empty() {
            let pids: Vec<u32> = busy.iter().map(|b| b.1).collect();
            tracing::warn!(
                "MPS workers {pids:?} did not say their kernel failed within {} ms: cut off through the server first \
                 (at most {} ms)",
                FAULT_SPREAD.as_millis(),
                TERMINATE_WITHIN.as_millis()
            );
            for (pid, e) in control.terminate_clients(&busy, TERMINATE_WITHIN) {
                tracing::error!("cutting MPS worker {pid} off its server: {e}; it is killed all the same");
            }
            std::thread::sleep(CUT_OFF);
        }
        for w in s.idle.iter().chain(s.programs.iter().map(|p| &p.worker)) {
            w.signal_kill();
        }
        for w in s.idle.drain(..) {
            reap_later(w);
        }
        for p in &mut s.programs {
            p.core.life.returned();
        }
    }

    /// Stops the kernel in `worker`: the stop request through the mailbox; past the deadline,
    /// `terminate_client` on our server; only then SIGKILL. Returns the worker if it is reusable.
    /// Never fails: whatever happens, the kernel is stopped or its worker is gone afterwards.
    fn stop(&self, name: &str, slot: u32, mut worker: Worker) -> Option<Worker> {
        slots::request_stop(&self.mailbox, slot);
        let deadline = self.config.stop_deadline;
        match worker.wait(deadline, WORKER_LAUNCH) {
            Ok(KernelState::Idle) => Some(worker),
            Ok(KernelState::Failed { reason }) => {
                tracing::warn!(program = name, "its kernel had failed ({reason}); worker {} discarded", worker.pid());
                worker.kill();
                None
            }
            other => {
                tracing::warn!(
                    program = name,
                    "did not stop within {} ms ({other:?}): cutting worker {} off its MPS server",
                    deadline.as_millis(),
                    worker.pid()
                );
                match self.control() {
                    Ok(control) => {
                        if let Err(e) = control.terminate_client(worker.server, worker.pid(), TERMINATE_WITHIN) {
                            tracing::error!("terminate_client: {e}");
                        }
                    }
                    Err(e) => tracing::error!("terminate_client: {e}"),
                }
                await_cut_off(&mut worker);
                worker.kill();
                None
            }
        }
    }

    fn status_of(&self, p: &Program, state: KernelState) -> ProgramStatus {
        let sms = p.worker.asked_sms.map(|_| p.worker.ready.sms);
        p.core.status(state.into(), slots::reading(&self.mailbox, p.core.slot), Some(p.worker.pid()), sms)
    }
}

/// Whether the watchdog watches program `p`'s kernel: launched, not left stopped, not ended by itself.
fn on_watch(p: &Program) -> bool {
    relaunchable(p) && p.core.life.phase() == &Phase::Running
}

/// The watched programs whose worker said nothing for more than `limit` before `now`, each broken
/// off, with how long it was silent; idle and standby workers silent that long are broken off too
/// (discarded later in the tick). None while a watched kernel has failed or a worker is gone: the
/// recovery that follows in the same tick ends every client anyway, and a replacement now would
/// land in a client of the faulted server (whose load fails, leaving an innocent program stopped
/// for good) or wait for that server to take clients again; a worker can also be legitimately
/// silent then, its driver call held while the server tears the faulted clients down.
fn silent_programs(s: &mut Shared, now: Instant, limit: Duration) -> Vec<(usize, Duration)> {
    for w in &mut s.idle {
        let _ = w.check_silence(now, limit);
    }
    if let Some(sb) = s.standby.as_mut() {
        sb.check_silence(now, limit);
    }
    if fault_pending(s) {
        return Vec::new();
    }
    s.programs
        .iter_mut()
        .enumerate()
        .filter(|(_, p)| on_watch(p))
        .filter_map(|(i, p)| p.worker.check_silence(now, limit).map(|d| (i, d)))
        .collect()
}

/// Whether a watched program's kernel has failed or its worker is gone, as the workers said up to
/// now (their news taken in first): a recovery is due.
fn fault_pending(s: &mut Shared) -> bool {
    absorb(s);
    s.programs.iter().any(|p| on_watch(p) && failed(&p.worker).is_some())
}

/// An idle worker that can take a program whose worker was started with `ask` (its `--sms`): one
/// started with the same, alive and not broken (one found silent at this very tick, or gone, would
/// only fail the relaunch).
fn take_idle(idle: &mut Vec<Worker>, ask: Option<u32>) -> Option<Worker> {
    let pos = idle.iter().position(|w| w.asked_sms == ask && w.alive() && w.broken().is_none())?;
    Some(idle.swap_remove(pos))
}

/// Whether a recovery relaunches `p`: not left stopped, not ended by itself (`mesh_exit`).
fn relaunchable(p: &Program) -> bool {
    p.core.life.relaunchable() && p.core.health.exited.is_none()
}

/// The error of a worker whose kernel failed or that is gone, as it last said (see [`absorb`]).
fn failed(w: &Worker) -> Option<String> {
    match w.kernel() {
        KernelState::Failed { reason } => Some(reason),
        _ => None,
    }
}

/// Watches programs `running` for [`FAULT_WATCH`]: whether the fault came back. Waits on the
/// workers' news (no worker is asked), so a failure is seen as soon as its worker says it.
fn faulted_within(s: &mut Shared, running: &[usize]) -> bool {
    // A fault reaches the clients some 150 ms after the faulting launch: watch long enough.
    news_until(s, Instant::now() + FAULT_WATCH, |s| {
        running.iter().any(|&i| on_watch(&s.programs[i]) && failed(&s.programs[i].worker).is_some())
    })
}

/// Starts `n` workers side by side (spawned together, then each awaited), retrying those the server
/// refuses for up to 10 s: after a fault it takes no client until every old one has exited (the
/// H200 took a new client 0.3 s later). Returns those that started.
fn start_many(control: &MpsControl, mailbox: &Path, sms: Option<u32>, news: &NewsSender, n: usize) -> Vec<Worker> {
    start_many_or_why(control, mailbox, sms, news, n).0
}

/// [`start_many`], with the last error when fewer than `n` started.
fn start_many_or_why(
    control: &MpsControl,
    mailbox: &Path,
    sms: Option<u32>,
    news: &NewsSender,
    n: usize,
) -> (Vec<Worker>, Option<BackendError>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ready = Vec::with_capacity(n);
    let mut last = None;
    while ready.len() < n {
        let spawned: Vec<Result<Worker>> =
            (ready.len()..n).map(|_| Worker::spawn(control, mailbox, sms, news)).collect();
        for w in spawned {
            match w.and_then(|w| w.await_ready(control, WORKER_LOAD)) {
                Ok(w) => ready.push(w),
                Err(e) => last = Some(e),
            }
        }
        if ready.len() < n {
            if Instant::now() >= deadline {
                tracing::error!(
                    "started {} of {n} MPS workers: {}",
                    ready.len(),
                    last.as_ref().map_or(String::new(), |e| e.to_string())
                );
                break;
            }
            tracing::debug!("the MPS server takes no client yet: {last:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (ready, last)
}

impl Backend for MpsBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Mps
    }

    fn pool(&self) -> Option<PoolFigures> {
        Some(self.pool.clone())
    }

    fn load(&mut self, spec: ProgramSpec) -> Result<ProgramStatus> {
        self.ready()?;
        spec.validate()?;
        roster::refuse_duplicate(&self.lock().programs, &spec.name)?;
        if let Some(n) = spec.sms {
            self.device.sm_partitioning()?.check(n)?;
        }
        let bindings = slots::channel_indices(&self.mailbox, &spec.bindings)?;
        let slot = slots::free_slot(&self.mailbox, &self.lock().programs)?;
        let cubin = self.link_checked(&spec.name, spec.image, spec.kind)?;
        let mut worker = self.take_worker(spec.sms.or(self.config.sms), &spec.name, "load")?;
        let prepared = self.prepare(&mut worker, &spec.name, cubin, &spec.shape, None);
        let (share, cubin) =
            match prepared.and_then(|p| slots::prepare(&self.mailbox, slot, &spec.name, &bindings).map(|()| p)) {
                Ok(p) => p,
                Err(e) => {
                    self.give_back(worker);
                    return Err(e);
                }
            };
        let mut core = ProgramCore::new(spec.name, slot, spec.kind, spec.shape, share);
        let launched = core
            .life
            .launch()
            .map_err(|e| illegal(&core.name, e))
            .and_then(|generation| slots::arm(&self.mailbox, slot, generation))
            .and_then(|()| map_channels(&mut self.lock().rings, &self.mailbox, &mut worker, slot))
            .and_then(|()| worker.launch(slot));
        if let Err(e) = launched {
            let _ = slots::release(&self.mailbox, slot);
            self.give_back(worker);
            return Err(e);
        }
        let program = Program { core, worker, cubin, deaths: Vec::new() };
        let status = self.status_of(&program, KernelState::Busy);
        self.lock().programs.push(program);
        self.publish_pool();
        Ok(status)
    }

    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus> {
        self.ready()?;
        let i = roster::index_of(&self.lock().programs, name)?;
        let kind = ImageKind::detect_for(name, &image)?;
        let (shape, sms) = {
            let s = self.lock();
            let p = &s.programs[i];
            (p.core.shape, p.worker.asked_sms)
        };
        // The new image is linked first, then loaded and probed in another worker while the old one runs.
        let cubin = self.link_checked(name, image, kind)?;
        let mut fresh = self.take_worker(sms, name, "upgrade")?;
        let (share, cubin) = match self.prepare(&mut fresh, name, cubin, &shape, Some(name)) {
            Ok(s) => s,
            Err(e) => {
                self.give_back(fresh);
                return Err(e);
            }
        };
        // Only this program blinks: stop the old kernel, relaunch in the same slot from the new worker.
        let mut old = self.lock().programs.remove(i);
        let slot = old.core.slot;
        old.core.life.request_stop();
        let kept = self.stop(name, slot, old.worker);
        old.core.life.returned();
        old.core.life.new_image();
        old.core.health.new_image(Instant::now());
        let launched = old
            .core
            .life
            .launch()
            .map_err(|e| illegal(name, e))
            .and_then(|generation| slots::arm(&self.mailbox, slot, generation))
            .and_then(|()| map_channels(&mut self.lock().rings, &self.mailbox, &mut fresh, slot))
            .and_then(|()| fresh.launch(slot));
        if let Some(w) = kept {
            self.give_back(w);
        }
        old.worker = fresh;
        old.core.kind = kind;
        old.core.share = share;
        old.cubin = cubin;
        if let Err(e) = &launched {
            old.core.life.fault(e.to_string());
        }
        let status = self.status_of(&old, if launched.is_ok() { KernelState::Busy } else { KernelState::Idle });
        self.lock().programs.insert(i, old);
        self.grow_back(name);
        launched?;
        Ok(status)
    }

    fn unload(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        let i = roster::index_of(&self.lock().programs, name)?;
        let p = self.lock().programs.remove(i);
        self.board.forget(name);
        let slot = p.core.slot;
        let kept = self.stop(name, slot, p.worker);
        slots::release(&self.mailbox, slot)?;
        if let Some(w) = kept {
            self.give_back(w);
        }
        self.grow_back(name);
        Ok(())
    }

    fn status(&self) -> Vec<ProgramStatus> {
        let mut s = self.lock();
        absorb(&mut s);
        let states: Vec<KernelState> = s
            .programs
            .iter()
            // A program left stopped has no kernel to speak of.
            .map(|p| if on_watch(p) { p.worker.kernel() } else { KernelState::Idle })
            .collect();
        self.pool.publish(s.idle.len(), s.programs.len());
        s.programs.iter().zip(states).map(|(p, state)| self.status_of(p, state)).collect()
    }

    fn watch(&mut self) -> Vec<String> {
        if self.shut_down {
            return Vec::new();
        }
        let now = Instant::now();
        let mut standby_spawned = 0;
        // Not while meshd itself may have been stopped or starved, with the readers that note the
        // workers' lines (see SilenceClock).
        let judge_silence = self.silence.tick(now, SILENCE_LIMIT);
        let mut log = Vec::new();
        let failure = {
            let mut s = self.lock();
            absorb(&mut s);
            if judge_silence {
                log.extend(self.replace_silent(&mut s, now));
            }
            let mut failure = None;
            for p in &mut s.programs {
                let Ok(slot) = self.mailbox.slot(p.core.slot) else { continue };
                let status = slot.status();
                p.core.health.observe_beat(status.heartbeat, now);
                if !on_watch(p) {
                    continue;
                }
                match p.worker.kernel() {
                    KernelState::Failed { reason } => {
                        failure.get_or_insert(reason);
                    }
                    KernelState::Idle if status.state == STATE_EXITED => {
                        // Ended by itself: reported once, never relaunched (until a new image).
                        p.core.health.exited = Some(status.exit_code);
                        p.core.life.returned();
                        log.push(format!(
                            "program {} ended by itself (mesh_exit({})): reported, not relaunched",
                            p.core.name, status.exit_code
                        ));
                    }
                    _ => {}
                }
            }
            if let Some(sb) = s.standby.as_mut() {
                let (lines, spawned) = sb.tick(self.mailbox.path(), self.config.sms, &self.news);
                log.extend(lines);
                standby_spawned = spawned;
            }
            // Each standby worker created while programs run is a new MPS client, counted as the
            // pool's growth is (whether it stalls programs of the other server is the GPU's to say).
            let running = s.programs.iter().filter(|p| on_watch(p)).count();
            if standby_spawned > 0 && running > 0 {
                let stalled = u32::try_from(running).unwrap_or(u32::MAX);
                for _ in 0..standby_spawned {
                    self.pool.record_growth("standby", "refill the standby", stalled);
                }
                log.push(format!(
                    "MPS standby: {standby_spawned} worker(s) being created while {running} program(s) run (counted as \
                     pool growth)"
                ));
            }
            // An idle worker that died (nothing ran in it) is replaced at the next refill.
            s.idle.retain_mut(|w| {
                let usable = w.alive() && w.broken().is_none();
                if !usable {
                    tracing::warn!("idle MPS worker {} discarded: {}", w.pid(), w.broken().unwrap_or("it exited"));
                    w.kill();
                }
                usable
            });
            failure
        };
        match failure {
            Some(error) => log.extend(self.recover(&error)),
            // A failure a reader heard that no recovery followed (a load's probe, a worker meshd
            // itself cut off): nothing to show any more.
            None => self.board.end_if_begun_before(now),
        }
        log
    }

    fn set_recovery_board(&mut self, board: RecoveryBoard) {
        let heard = board.clone();
        self.news.set_on_failure(Arc::new(move |pid, reason| {
            heard.begin(format!("GPU fault reported by MPS worker {pid}: {reason}"), Vec::<String>::new());
        }));
        self.board = board;
    }

    fn set_waker(&mut self, wake: mesh_backend::Waker) {
        self.news.set_wake(wake);
    }

    fn take_events(&mut self) -> Vec<BackendEvent> {
        std::mem::take(&mut self.lock().events)
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        let programs: Vec<Program> = self.lock().programs.drain(..).collect();
        for p in programs {
            // A program that will not stop is cut off inside `stop`: nothing runs on afterwards.
            if let Some(w) = self.stop(&p.core.name, p.core.slot, p.worker) {
                w.exit();
            }
            let _ = slots::release(&self.mailbox, p.core.slot);
        }
        let idle: Vec<Worker> = self.lock().idle.drain(..).collect();
        for w in idle {
            w.exit();
        }
        cleanup::run_one(self.cleanup_id);
        self.pool.close();
        Ok(())
    }

    fn host_atomics(&self) -> bool {
        self.device.host_atomics
    }
}

impl Drop for MpsBackend {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Waits until the kernel of every slot of `slots` has left (its state, read with `state_of`, says
/// stopped at the request or exited) or `deadline` passes. Returns, slot by slot, whether it stopped
/// in order (`mesh_end`: its channels' positions published).
fn await_stops(slots: &[u32], deadline: Instant, state_of: impl Fn(u32) -> u32) -> Vec<bool> {
    loop {
        let states: Vec<u32> = slots.iter().map(|&slot| state_of(slot)).collect();
        if states.iter().all(|&st| st == STATE_STOPPED || st == STATE_EXITED) || Instant::now() >= deadline {
            return states.into_iter().map(|st| st == STATE_STOPPED).collect();
        }
        // A kernel reads its stop word every 100 µs (MESH_STOP_PERIOD_NS) and sees it within two.
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// After `terminate_client` of `w`, before its SIGKILL: gives the server [`CUT_OFF`] to cut it off
/// (gpu.md: within 0.1 s; a SIGKILL of a client whose kernel still runs fails every other client's
/// kernel). A worker that still answers says when its kernel ended, often sooner; one spoken to no
/// more (silent, wedged, past a deadline) cannot, and its `wait` would fail at once, so the whole
/// time is waited.
fn await_cut_off(w: &mut Worker) {
    let started = Instant::now();
    let answered = w.broken().is_none() && w.wait(CUT_OFF, CUT_OFF).is_ok();
    if !answered {
        std::thread::sleep(CUT_OFF.saturating_sub(started.elapsed()));
    }
}

/// Whether `w`'s process lives and a kernel of it may still run: busy as it last said, or broken
/// (it stopped answering, so what its kernel does is unknown). Such a worker is cut off with
/// `terminate_client` before any SIGKILL.
fn may_run_a_kernel(w: &Worker) -> bool {
    // One whose output ended is dying (a SIGKILLed client lingers in D state): no cut-off can help it.
    w.alive() && !w.output_ended() && (w.broken().is_some() || w.kernel() == KernelState::Busy)
}

/// SIGKILLs `w` and reaps it on a thread of its own: the driver can take up to 2 s to tear a
/// killed client's context down, which no recovery should wait for.
fn reap_later(w: Worker) {
    w.signal_kill();
    let spawned = std::thread::Builder::new().name(format!("reap-{}", w.pid())).spawn(move || {
        let mut w = w;
        w.kill();
    });
    if let Err(e) = spawned {
        tracing::warn!("reaping a killed MPS worker on its own thread: {e}; it is reaped at meshd's exit");
    }
}

#[cfg(test)]
mod tests {
    //! The watchdog's choices about silent workers, against stand-in workers (shell scripts that say
    //! `ready` and then nothing, or exit): the MPS backend itself needs a GPU.

    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;

    use super::*;

    /// Says `ready` (with `SMS` SMs), then answers `done` to every command (`MODE=gone`: exits at once).
    const STAND_IN: &str = r#"printf '{"reply":"ready","protocol":3,"pid":%s,"device":"stand-in","mps_enabled":true,"sms":%s,"context_ms":0}\n' $$ "${SMS:-132}"
[ "$MODE" = gone ] && exit 0
while read -r line; do
  case "$line" in *'"op":"exit"'*) exit 0 ;; *) echo '{"reply":"done"}' ;; esac
done
"#;

    struct Bench {
        _dir: tempfile::TempDir,
        script: PathBuf,
        news: NewsSender,
    }

    impl Bench {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let script = dir.path().join("stand-in-worker");
            std::fs::write(&script, STAND_IN).unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
            Self { _dir: dir, script, news: NewsSender::channel().0 }
        }

        fn worker(&self, env: &[(&str, &str)]) -> Worker {
            // By its path: control.rs's test points PATH elsewhere while the tests run side by side.
            let mut cmd = Command::new("/bin/sh");
            cmd.arg(&self.script);
            cmd.envs(env.iter().copied());
            Worker::spawn_command(&mut cmd, &self.news).unwrap().handshake(Duration::from_secs(10)).unwrap()
        }

        /// A running program in slot `slot` of `worker`.
        fn program(&self, slot: u32, worker: Worker) -> Program {
            let mut core = ProgramCore::new(format!("p{slot}"), slot, ImageKind::Ptx, LaunchShape::default(), 0.0);
            core.life.launch().unwrap();
            Program { core, worker, cubin: Arc::new(Vec::new()), deaths: Vec::new() }
        }
    }

    fn kill_all(s: &mut Shared) {
        for p in &mut s.programs {
            p.worker.kill();
        }
        for w in &mut s.idle {
            w.kill();
        }
    }

    #[test]
    fn a_silent_worker_is_replaced_but_not_while_a_fault_is_pending() {
        let bench = Bench::new();
        let mut s = Shared::default();
        s.programs.push(bench.program(0, bench.worker(&[])));
        s.programs.push(bench.program(1, bench.worker(&[])));
        let later = Instant::now() + Duration::from_secs(4);
        let silent = silent_programs(&mut s, later, SILENCE_LIMIT);
        assert_eq!(silent.iter().map(|&(i, _)| i).collect::<Vec<_>>(), [0, 1], "both said nothing past the bound");
        assert!(silent.iter().all(|&(_, d)| d > SILENCE_LIMIT));
        kill_all(&mut s);

        // Program 0's worker is gone (a failure the same tick recovers from, ending every client):
        // program 1's silent worker is left to that recovery, not replaced into the faulted server.
        let mut s = Shared::default();
        s.programs.push(bench.program(0, bench.worker(&[("MODE", "gone")])));
        s.programs.push(bench.program(1, bench.worker(&[])));
        let deadline = Instant::now() + Duration::from_secs(10);
        while failed(&s.programs[0].worker).is_none() {
            assert!(Instant::now() < deadline, "the stand-in's exit was never noticed");
            std::thread::sleep(Duration::from_millis(5));
            s.programs[0].worker.refresh();
        }
        let later = Instant::now() + Duration::from_secs(4);
        assert_eq!(silent_programs(&mut s, later, SILENCE_LIMIT), []);
        assert_eq!(s.programs[1].worker.broken(), None, "left as it was for the recovery");
        // What replace_silent asks again before relaunching: a recovery is due while a watched
        // program's worker failed, not once that program is off watch.
        assert!(fault_pending(&mut s));
        s.programs[0].core.life.request_stop();
        s.programs[0].core.life.returned();
        assert!(!fault_pending(&mut s), "program 1's mute worker alone is no fault");
        kill_all(&mut s);
    }

    #[test]
    fn a_replacement_takes_only_a_usable_idle_worker_of_the_same_size() {
        let bench = Bench::new();
        let sixteen = |env: &[(&str, &str)]| {
            let mut w = bench.worker(env);
            w.asked_sms = Some(16);
            w
        };
        let mut idle = vec![sixteen(&[("SMS", "16")])];
        assert!(
            take_idle(&mut idle, None).is_none(),
            "a worker started with --sms 16 is no home for a whole-GPU program"
        );
        assert!(take_idle(&mut idle, Some(15)).is_none(), "matched by what was asked, not by the rounded SMs");
        assert_eq!(idle.len(), 1);
        // Found silent at this tick: broken, never handed a program.
        assert!(idle[0].check_silence(Instant::now() + Duration::from_secs(4), SILENCE_LIMIT).is_some());
        assert!(take_idle(&mut idle, Some(16)).is_none(), "a broken idle worker is not taken");
        idle.push(sixteen(&[("SMS", "16")]));
        let mut w = take_idle(&mut idle, Some(16)).expect("the usable one");
        assert!(w.broken().is_none());
        w.kill();
        for mut w in idle {
            w.kill();
        }
    }

    #[test]
    fn a_worker_spoken_to_no_more_still_gets_the_servers_time_to_be_cut_off_before_its_kill() {
        let bench = Bench::new();
        let mut w = bench.worker(&[]);
        assert!(w.check_silence(Instant::now() + Duration::from_secs(4), SILENCE_LIMIT).is_some());
        let started = Instant::now();
        await_cut_off(&mut w);
        // A lower bound only: the wait is a sleep, not a race.
        assert!(started.elapsed() >= CUT_OFF, "killed {:?} after terminate_client", started.elapsed());
        w.kill();
    }

    #[test]
    fn a_silent_workers_kernel_gets_its_stop_deadline_to_leave_in_order_before_the_cut_off() {
        use std::cell::Cell;
        // Slot 4's kernel sees its stop on the third look; slot 7's has exited by itself.
        let looks = Cell::new(0);
        let state_of = |slot: u32| match slot {
            4 => {
                looks.set(looks.get() + 1);
                if looks.get() >= 3 { STATE_STOPPED } else { STATE_RUNNING }
            }
            _ => STATE_EXITED,
        };
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(
            await_stops(&[4, 7], far, state_of),
            [true, false],
            "4 stopped in order; 7 left, not at the request"
        );
        assert!(looks.get() >= 3);
        // One that never stops is given up at the deadline (already passed here: one look).
        let stuck = |_slot: u32| STATE_RUNNING;
        assert_eq!(await_stops(&[1, 2], Instant::now(), stuck), [false, false]);
    }

    #[test]
    fn silence_is_judged_only_after_meshd_ran_a_whole_bound_since_its_last_stall() {
        let limit = Duration::from_secs(3);
        let tick = Duration::from_millis(25);
        let mut clock = SilenceClock::new();
        let t0 = Instant::now();
        let mut t = t0;
        let mut first_judged = None;
        while t < t0 + Duration::from_secs(5) {
            if clock.tick(t, limit) && first_judged.is_none() {
                first_judged = Some(t - t0);
            }
            t += tick;
        }
        let first = first_judged.expect("judged once meshd ran past the bound");
        assert!(first > limit && first <= limit + tick, "{first:?}");
        // meshd stopped for 5 s: neither the tick after it nor the ones its news brings at once
        // (before every reader has read what its worker said meanwhile) judge anyone.
        t += Duration::from_secs(5);
        assert!(!clock.tick(t, limit), "the tick after the stall");
        assert!(!clock.tick(t + Duration::from_millis(1), limit), "a tick a wake-up brought right after it");
        let resumed = t;
        while t < resumed + limit {
            assert!(!clock.tick(t, limit), "{:?} after the stall", t - resumed);
            t += tick;
        }
        t += tick;
        assert!(clock.tick(t, limit), "a whole bound after the stall");
        // A gap under half the bound (a long job of the backend thread) is no stall.
        t += limit / 2 - Duration::from_millis(1);
        assert!(clock.tick(t, limit));
    }
}
