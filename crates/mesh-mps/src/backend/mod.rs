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
//! its own last stall ([`SilenceClock`]).
//!
//! **Device channels** (on by default): meshd's
//! own plain context, made while the MPS daemon starts, owns every device ring (mesh-cuda's
//! `exported`); a worker maps a ring's descriptor before launching a program bound to it. The memory
//! outlives every worker, and a recovery keeps each ring, messages and all, for the relaunched
//! programs; a new ring is zeroed by the first worker that maps it (meshd's own context runs no GPU
//! work: it would time-slice).
//!
//! **Layout.** This file owns the shared state (`Shared`, behind the one lock every job takes), the
//! backend's options and the helpers every job uses; `api` opens the backend and implements
//! [`Backend`]; each job has a file of its own: `workers` (the pool), `changes` (load, upgrade,
//! unload), `recovery` (after a GPU fault), `takeover` (the standby's part), `liveness` (the
//! watchdog's tick, silent workers), `device_rings` (device channels), `adoption` (programs
//! adopted from a previous meshd under an orphan grace) and `handover` (programs left running for
//! the new image of `meshd handoff`). Imports go one way: the
//! job files build on this one and on each other without a loop, and only `api` sits above them.

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

mod adoption;
mod api;
mod changes;
mod device_rings;
mod handover;
mod liveness;
mod recovery;
#[cfg(test)]
mod stand_in;
mod takeover;
mod workers;

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
    /// Pipe and log directories (default [`crate::mps_dir::default_root`] of the mailbox, removed
    /// at an orderly exit).
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
    /// How long a worker whose meshd died keeps its program running, waiting for a meshd, before it
    /// stops it in order and exits (`--orphan-grace-ms`, by default [`DEFAULT_ORPHAN_GRACE`]);
    /// zero: workers, daemons and all die with meshd (`PR_SET_PDEATHSIG`).
    pub orphan_grace: Duration,
}

/// How long the programs outlive a crash of meshd by default (`--orphan-grace-ms 60000`): long
/// enough for systemd to start meshd again (and for an operator to), short enough that a meshd
/// that never comes back leaves nothing for long.
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(60);

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
            orphan_grace: DEFAULT_ORPHAN_GRACE,
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
    /// The keeper of the MPS directory, under an orphan grace.
    keeper: Option<crate::orphans::Keeper>,
    /// Workers adopted from a previous meshd whose programs the relaunch has not claimed yet.
    adopted: Vec<Adoptee>,
    /// The pool's workers still being made, when meshd started with adopted programs running.
    pool_fill: Option<crate::starting::Filling>,
}

/// A worker adopted from a previous meshd, whose program the relaunch has not claimed yet.
#[derive(Debug)]
struct Adoptee {
    /// The program's name, as its slot says.
    name: String,
    slot: u32,
    generation: u32,
    loaded: mesh_mps_worker::Loaded,
    worker: Worker,
    /// How long it ran without a meshd.
    orphaned_ms: u64,
}

/// How long a recovery waits for every faulted worker to say its kernel failed before it may move
/// the programs to the standby (on the H200 the fault reached 8 clients within 41 ms of each other).
pub const FAULT_SPREAD: Duration = Duration::from_millis(100);

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
    /// Workers meshd is cutting off on its own account (a stop past its deadline, a discarded
    /// worker): their kernels' failure is meshd's doing, not a fault, and marks no recovery.
    cutting: Arc<Mutex<std::collections::BTreeSet<u32>>>,
}

/// Every worker killed, then the daemon quit; waits for both. Programs should have been stopped first.
fn tear_down(shared: &Mutex<Shared>) {
    let mut s = shared.lock();
    // An orderly stop: the keeper first, so that it quits nothing of what follows.
    if let Some(keeper) = s.keeper.take() {
        keeper.release();
    }
    for mut p in s.programs.drain(..) {
        p.worker.kill();
    }
    for mut w in s.idle.drain(..) {
        w.kill();
    }
    for mut w in s.pool_fill.take().map(|mut f| f.starting.take_all()).unwrap_or_default() {
        w.kill();
    }
    for a in s.adopted.drain(..) {
        a.end();
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

/// What every job's file shares of the backend: its lock, its control daemon, its readiness, a
/// program's status, and cutting a worker off.
impl MpsBackend {
    /// Cuts `w` off its server on meshd's own account (bounded by [`TERMINATE_WITHIN`]), gives the
    /// server its time, then kills and reaps it. Its kernel's failure, which follows, is not a GPU
    /// fault: the reader hook marks no recovery for it (a `/readyz` 503 until the next tick).
    fn cut_off_and_kill(&self, control: Option<Arc<MpsControl>>, w: &mut Worker, what: &str) {
        let pid = w.pid();
        self.cutting.lock().insert(pid);
        match control {
            Some(control) => {
                if let Err(e) = control.terminate_client(w.server, pid, TERMINATE_WITHIN) {
                    tracing::error!("cutting {what} {pid} off its MPS server: {e}; it is killed all the same");
                }
                await_cut_off(w);
            }
            None => tracing::error!("cutting {what} {pid} off its MPS server: the backend is shut down"),
        }
        w.kill();
        self.cutting.lock().remove(&pid);
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

    fn status_of(&self, p: &Program, state: KernelState) -> ProgramStatus {
        let sms = p.worker.asked_sms.map(|_| p.worker.ready.sms);
        let mut status =
            p.core.status(state.into(), slots::reading(&self.mailbox, p.core.slot), Some(p.worker.pid()), sms);
        // An adopted worker is replaced by a fresh one at the program's next launch.
        status.adopted = p.worker.adopted();
        status
    }
}

/// After `terminate_client` of `w`, before its SIGKILL: gives the server [`CUT_OFF`] to cut it off
/// (gpu.md: within 0.1 s; a SIGKILL of a client whose kernel still runs fails every other client's
/// kernel). A worker that still answers says when its kernel ended, often sooner; one spoken to no
/// more (silent, wedged, past a deadline) cannot, and its `wait` would fail at once, so the whole
/// time is waited.
pub(super) fn await_cut_off(w: &mut Worker) {
    let started = Instant::now();
    let answered = w.broken().is_none() && w.wait(CUT_OFF, CUT_OFF).is_ok();
    if !answered {
        std::thread::sleep(CUT_OFF.saturating_sub(started.elapsed()));
    }
}

/// Whether the watchdog watches program `p`'s kernel: launched, not left stopped, not ended by itself.
fn on_watch(p: &Program) -> bool {
    relaunchable(p) && p.core.life.phase() == &Phase::Running
}

/// Whether a watched program's kernel has failed or its worker is gone, as the workers said up to
/// now (their news taken in first): a recovery is due.
fn fault_pending(s: &mut Shared) -> bool {
    absorb(s);
    s.programs.iter().any(|p| on_watch(p) && failed(&p.worker).is_some())
}

/// Whether a recovery relaunches `p`: not left stopped, not ended by itself (`mesh_exit`).
fn relaunchable(p: &Program) -> bool {
    p.core.life.relaunchable() && p.core.health.exited.is_none()
}

/// Whether `w`'s process lives and a kernel of it may still run: busy as it last said, or broken
/// (it stopped answering, so what its kernel does is unknown). Such a worker is cut off with
/// `terminate_client` before any SIGKILL.
fn may_run_a_kernel(w: &Worker) -> bool {
    // One whose output ended is dying (a SIGKILLed client lingers in D state): no cut-off can help it.
    w.alive() && !w.output_ended() && (w.broken().is_some() || w.kernel() == KernelState::Busy)
}

/// The error of a worker whose kernel failed or that is gone, as it last said (see [`absorb`]).
fn failed(w: &Worker) -> Option<String> {
    match w.kernel() {
        KernelState::Failed { reason } => Some(reason),
        _ => None,
    }
}

/// What a worker's reader thread does the moment its worker says its kernel failed: marks a
/// recovery in place as begun on `board` and logs it (the time every probe's answer, `/readyz`'s
/// 503, is measured from), unless meshd itself is cutting that worker off (`cutting`): then the
/// failure is meshd's doing and no recovery follows.
fn failure_hook(
    board: RecoveryBoard,
    cutting: Arc<Mutex<std::collections::BTreeSet<u32>>>,
) -> crate::worker::OnFailure {
    Arc::new(move |pid, reason| {
        if cutting.lock().contains(&pid) {
            return;
        }
        if board.begin(format!("GPU fault reported by MPS worker {pid}: {reason}"), Vec::<String>::new()) {
            tracing::warn!(target: "watchdog", "MPS worker {pid} says its kernel failed ({reason}): a recovery in place begins");
        }
    })
}

/// Why device channels are refused in MPS mode, if they are: meshd's own plain context, which owns
/// every device ring, could not be made when the backend opened (a compute mode that allows one
/// context per device, another MPS server in meshd's environment). `None` while no MPS backend has
/// opened, and when they are served.
static DEVICE_CHANNELS_REFUSED: Mutex<Option<String>> = Mutex::new(None);

/// Why a device channel is refused in MPS mode now (see `DEVICE_CHANNELS_REFUSED`), else `None`.
pub fn device_channels_refusal() -> Option<String> {
    DEVICE_CHANNELS_REFUSED.lock().clone()
}

#[cfg(test)]
mod hook_tests {
    use super::*;

    #[test]
    fn a_failure_marks_a_recovery_unless_meshd_is_cutting_that_worker_off() {
        let board = RecoveryBoard::new();
        let cutting: Arc<Mutex<std::collections::BTreeSet<u32>>> = Arc::default();
        let hook = failure_hook(board.clone(), cutting.clone());
        cutting.lock().insert(41);
        hook(41, "the MPS client has been terminated by the server");
        assert!(!board.in_progress(), "a worker meshd cut off itself marks no recovery");
        hook(42, "CUDA_ERROR_ILLEGAL_ADDRESS");
        let v = board.view();
        assert!(v.current.as_ref().is_some_and(|c| c.reason.contains("worker 42") && c.reason.contains("ILLEGAL")));
        assert_eq!(v.begun, 1);
        hook(43, "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(board.view().begun, 1, "the other workers' reports join the recovery under way");
    }
}
