//! The MPS backend: each program in its own worker (an MPS client of meshd's private server), so that a
//! load, upgrade or unload halts no other program.
//!
//! A module load in one MPS client does not wait for the other clients' kernels (measured on the H200:
//! 0.09 to 0.14 ms while another client's kernel ran), so an idle worker loads and probes the new cubin
//! while everything runs. Creating a client stalls the running kernels once (up to 0.4 ms), so the pool
//! is started before any program runs and a freed worker goes back to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_backend::cleanup::{self, CleanupId};
use mesh_backend::roster::{self, HasCore};
use mesh_backend::{
    Backend, BackendError, ImageKind, IsolationMode, LaunchShape, ProgramCore, ProgramSpec, ProgramStatus, Result,
    SmBudget, check_resident,
};
use mesh_cuda::{Device, Jit, slots};
use mesh_mps_worker::{KernelState, Probe};
use mesh_shm::Mailbox;
use parking_lot::{Mutex, MutexGuard};

use crate::control::MpsControl;
use crate::worker::{WORKER_LAUNCH, WORKER_LOAD, Worker};

/// How long a program relaunched after a GPU fault is watched before it is trusted: on the H200 a
/// fault reached the clients about 150 ms after the faulting launch.
pub const FAULT_WATCH: Duration = Duration::from_millis(600);

/// MPS client contexts per device on Volta and later (NVIDIA's MPS documentation; 60 from CUDA 13.1).
pub const MAX_CLIENTS: u32 = 48;

/// Options of the MPS backend.
#[derive(Debug, Clone)]
pub struct MpsConfig {
    /// A green context of this many SMs per worker.
    pub sms: Option<u32>,
    /// Pipe and log directories (default `/tmp/meshd-mps.PID`).
    pub mps_dir: Option<PathBuf>,
    /// Workers started before any program runs.
    pub pool: u32,
    /// How long a program gets to stop before its worker is cut off.
    pub stop_deadline: Duration,
}

impl Default for MpsConfig {
    fn default() -> Self {
        Self { sms: None, mps_dir: None, pool: 2, stop_deadline: Duration::from_secs(2) }
    }
}

/// A loaded program: what every backend keeps, its worker, and its linked image.
#[derive(Debug)]
struct Program {
    core: ProgramCore,
    worker: Worker,
    /// The linked image, kept to relaunch the program in a fresh worker after a GPU fault.
    cubin: Arc<Vec<u8>>,
}

impl HasCore for Program {
    fn core(&self) -> &ProgramCore {
        &self.core
    }
}

/// What the cleanup action needs, shared with it.
#[derive(Debug, Default)]
struct Shared {
    control: Option<Arc<MpsControl>>,
    idle: Vec<Worker>,
    programs: Vec<Program>,
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
    if let Some(control) = s.control.take() {
        control.quit();
    }
    *ACTIVE.lock() = None;
}

/// Starts a worker, retrying for up to 10 s: after a fault the server refuses new clients until every
/// old one has exited (the H200 took a new client 0.3 s later).
fn start_retrying(control: &MpsControl, mailbox: &Path, sms: Option<u32>) -> Result<Worker> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Worker::start(control, mailbox, sms, WORKER_LOAD) {
            Ok(w) => return Ok(w),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("the MPS server takes no client yet: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A refused life transition (a bug), as the contract's error naming the program.
fn illegal(name: &str, e: mesh_backend::life::IllegalTransition) -> BackendError {
    BackendError::Invalid { what: format!("program {name:?}"), reason: e.to_string() }
}

impl MpsBackend {
    /// Starts the private daemon and the pool (each worker checked to be our client) before any program runs.
    pub fn open(mailbox: &Mailbox, config: MpsConfig) -> Result<Self> {
        if config.pool > MAX_CLIENTS {
            return Err(BackendError::ClientLimit { asked: config.pool, limit: MAX_CLIENTS });
        }
        let device = Device::get(0)?;
        if let Some(n) = config.sms {
            device.sm_partitioning()?.check(n)?;
        }
        let control = Arc::new(MpsControl::start(config.mps_dir.as_deref())?);
        let shared = Arc::new(Mutex::new(Shared { control: Some(control.clone()), ..Shared::default() }));
        let for_cleanup = shared.clone();
        let cleanup_id = cleanup::register("MPS workers and control daemon", move || tear_down(&for_cleanup));
        *ACTIVE.lock() = Some(control.clone());
        let cubins = control.root().join("cubins");
        let built = (|| {
            std::fs::create_dir_all(&cubins)
                .map_err(|e| BackendError::MpsDaemon(format!("{}: {e}", cubins.display())))?;
            for i in 0..config.pool {
                let started = Instant::now();
                // The first worker's context creation also starts the MPS server.
                let w = Worker::start(&control, mailbox.path(), config.sms, WORKER_LOAD)?;
                tracing::info!(
                    worker = w.pid(),
                    server = w.server,
                    context_ms = w.ready.context_ms,
                    "pool worker {i} ready in {:?}",
                    started.elapsed()
                );
                shared.lock().idle.push(w);
            }
            Jit::start(&device.arch())
        })();
        let jit = match built {
            Ok(j) => j,
            Err(e) => {
                cleanup::run_one(cleanup_id);
                return Err(e);
            }
        };
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

    /// Refuses after shutdown; recovers from a GPU fault first if one happened since the last call.
    fn ready(&self) -> Result<()> {
        if self.shut_down {
            return Err(BackendError::ShutDown);
        }
        self.recover();
        Ok(())
    }

    /// An idle worker with `sms`, or a new one (a new MPS client: it stalls the running kernels once).
    fn take_worker(&mut self, sms: Option<u32>) -> Result<Worker> {
        let found = {
            let mut s = self.lock();
            let pos = s.idle.iter().position(|w| sms.is_none_or(|n| w.ready.sms == n));
            pos.map(|p| s.idle.swap_remove(p))
        };
        if let Some(w) = found {
            return Ok(w);
        }
        let clients = {
            let s = self.lock();
            (s.idle.len() + s.programs.len()) as u32
        };
        if clients + 1 > MAX_CLIENTS {
            return Err(BackendError::ClientLimit { asked: clients + 1, limit: MAX_CLIENTS });
        }
        tracing::warn!(
            "no idle worker{}: starting one (creating an MPS client stalls the running kernels once)",
            sms.map_or(String::new(), |n| format!(" of {n} SMs"))
        );
        let control = self.control()?;
        Worker::start(&control, self.mailbox.path(), sms.or(self.config.sms), WORKER_LOAD)
    }

    /// Returns a worker to the pool after unloading its module; a worker that will not is discarded.
    fn give_back(&self, mut w: Worker) {
        match w.unload() {
            Ok(()) => self.lock().idle.push(w),
            Err(e) => {
                tracing::warn!("worker {} discarded: {e}", w.pid());
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

    /// Links `image`, has `worker` load and probe it, and checks that it can be resident beside the
    /// others: every block within the worker's own context, its share counted of the device's SMs,
    /// which every worker shares. Returns the launch's share and the cubin.
    fn prepare(
        &mut self,
        worker: &mut Worker,
        name: &str,
        image: Vec<u8>,
        kind: ImageKind,
        shape: &LaunchShape,
        replacing: Option<&str>,
    ) -> Result<(f64, Arc<Vec<u8>>)> {
        let linked = self.jit.link(name, image, kind)?;
        let probe = self.load_into(worker, name, &linked.cubin, shape)?;
        let held = roster::held_share(&self.lock().programs, replacing);
        let sms = SmBudget::own_context(probe.sms, self.device.sm_count);
        let share = check_resident(name, shape, &probe.figures(), sms, held)?;
        Ok((share, linked.cubin))
    }

    /// After a GPU fault: NVIDIA documents (and the H200 showed) that a fatal fault in one client is
    /// reported to every client, and that the server takes no new client until all of them have exited.
    /// So every client is ended, fresh workers are started, and the programs are relaunched one at a
    /// time from their mailbox state; a program whose relaunch faults again is the culprit and is left
    /// stopped. Returns the programs left stopped.
    fn recover(&self) -> Vec<String> {
        let mut s = self.lock();
        let failed = find_failed(&mut s);
        if failed.is_empty() {
            return Vec::new();
        }
        tracing::error!(
            "GPU fault reported to {}: restarting every MPS client and relaunching the programs",
            failed.join(", ")
        );
        let Some(control) = s.control.clone() else { return Vec::new() };
        let mut parked = Vec::new();
        // Each round relaunches the programs one by one; a fault right after a relaunch names the culprit.
        for _round in 0..=s.programs.len() {
            let Some(i) = self.relaunch_round(&mut s, &control) else { break };
            let p = &mut s.programs[i];
            tracing::error!(program = p.core.name, "faulted again when relaunched after a GPU fault: left stopped");
            p.core.life.fault("faulted the GPU (again when relaunched alone): left stopped");
            parked.push(p.core.name.clone());
        }
        self.refill(&mut s, &control);
        parked
    }

    /// One round of recovery: every client ended, then each program not left stopped relaunched in a
    /// fresh worker and watched. Returns the first whose relaunch brought the fault back.
    fn relaunch_round(&self, s: &mut Shared, control: &MpsControl) -> Option<usize> {
        self.end_all_clients(s, control);
        for i in 0..s.programs.len() {
            if !s.programs[i].core.life.relaunchable() {
                continue;
            }
            if let Err(e) = self.relaunch_in_fresh_worker(s, control, i) {
                tracing::error!(program = s.programs[i].core.name, "relaunch after the fault failed: {e}");
                s.programs[i].core.life.fault(format!("relaunch after a GPU fault failed: {e}"));
                continue;
            }
            if faulted_again(s, i) {
                return Some(i);
            }
        }
        None
    }

    /// Refills the pool, now that the server takes clients again.
    fn refill(&self, s: &mut Shared, control: &MpsControl) {
        while (s.idle.len() as u32) < self.config.pool {
            match start_retrying(control, self.mailbox.path(), self.config.sms) {
                Ok(w) => s.idle.push(w),
                Err(e) => {
                    tracing::error!("refilling the pool after a fault: {e}");
                    break;
                }
            }
        }
    }

    /// Ends every client: a stop request to every program, then each worker cut off and killed.
    fn end_all_clients(&self, s: &mut Shared, control: &MpsControl) {
        for p in &mut s.programs {
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
        }
        let doomed = s.idle.iter_mut().chain(s.programs.iter_mut().map(|p| &mut p.worker));
        for w in doomed {
            if w.alive() {
                let busy = matches!(w.wait(Duration::from_millis(200), WORKER_LAUNCH), Ok(KernelState::Busy));
                if busy {
                    let _ = control.terminate_client(w.server, w.pid());
                }
            }
            w.kill();
        }
        s.idle.clear();
        for p in &mut s.programs {
            p.core.life.returned();
        }
    }

    /// Starts a worker for program `i` (the server may refuse new clients for a moment after a fault),
    /// loads its cubin and launches it in its slot with the generation bumped.
    fn relaunch_in_fresh_worker(&self, s: &mut Shared, control: &MpsControl, i: usize) -> Result<()> {
        let mut worker = start_retrying(control, self.mailbox.path(), self.config.sms)?;
        let p = &mut s.programs[i];
        self.load_into(&mut worker, &p.core.name, &p.cubin, &p.core.shape)?;
        let generation = p.core.life.launch().map_err(|e| illegal(&p.core.name, e))?;
        slots::arm(&self.mailbox, p.core.slot, generation)?;
        worker.launch(p.core.slot)?;
        let mut old = std::mem::replace(&mut p.worker, worker);
        old.kill();
        Ok(())
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
                        if let Err(e) = control.terminate_client(worker.server, worker.pid()) {
                            tracing::error!("terminate_client: {e}");
                        }
                    }
                    Err(e) => tracing::error!("terminate_client: {e}"),
                }
                // Give the server a moment to cut the client off before the signal (gpu.md: within 0.1 s).
                let _ = worker.wait(Duration::from_millis(200), Duration::from_millis(300));
                worker.kill();
                None
            }
        }
    }

    fn status_of(&self, p: &Program, state: KernelState) -> ProgramStatus {
        let sms = self.config.sms.map(|_| p.worker.ready.sms);
        p.core.status(state.into(), slots::reading(&self.mailbox, p.core.slot), Some(p.worker.pid()), sms)
    }
}

/// The programs (not left stopped) whose kernel failed or whose worker is gone: a GPU fault's trace.
fn find_failed(s: &mut Shared) -> Vec<String> {
    s.programs
        .iter_mut()
        .filter(|p| p.core.life.relaunchable())
        .filter_map(|p| matches!(p.worker.poll(), KernelState::Failed { .. }).then(|| p.core.name.clone()))
        .collect()
}

/// Watches the programs relaunched so far (up to `i`) for [`FAULT_WATCH`]: whether the fault came back.
fn faulted_again(s: &mut Shared, i: usize) -> bool {
    // A fault reaches the clients some 150 ms after the faulting launch: watch long enough.
    let watch = Instant::now() + FAULT_WATCH;
    while Instant::now() < watch {
        std::thread::sleep(Duration::from_millis(10));
        let again = s.programs[..=i]
            .iter_mut()
            .filter(|p| p.core.life.relaunchable())
            .any(|p| matches!(p.worker.poll(), KernelState::Failed { .. }));
        if again {
            return true;
        }
    }
    false
}

impl Backend for MpsBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Mps
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
        let mut worker = self.take_worker(spec.sms)?;
        let prepared = self.prepare(&mut worker, &spec.name, spec.image, spec.kind, &spec.shape, None);
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
            .and_then(|()| worker.launch(slot));
        if let Err(e) = launched {
            let _ = slots::release(&self.mailbox, slot);
            self.give_back(worker);
            return Err(e);
        }
        let program = Program { core, worker, cubin };
        let status = self.status_of(&program, KernelState::Busy);
        self.lock().programs.push(program);
        Ok(status)
    }

    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus> {
        self.ready()?;
        let i = roster::index_of(&self.lock().programs, name)?;
        let kind = ImageKind::detect_for(name, &image)?;
        let (shape, sms) = {
            let s = self.lock();
            let p = &s.programs[i];
            (p.core.shape, Some(p.worker.ready.sms).filter(|_| self.config.sms.is_some()))
        };
        // The new image is loaded and probed in another worker while the old one runs.
        let mut fresh = self.take_worker(sms)?;
        let (share, cubin) = match self.prepare(&mut fresh, name, image, kind, &shape, Some(name)) {
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
        let launched = old
            .core
            .life
            .launch()
            .map_err(|e| illegal(name, e))
            .and_then(|generation| slots::arm(&self.mailbox, slot, generation))
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
        launched?;
        Ok(status)
    }

    fn unload(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        let i = roster::index_of(&self.lock().programs, name)?;
        let p = self.lock().programs.remove(i);
        let slot = p.core.slot;
        let kept = self.stop(name, slot, p.worker);
        slots::release(&self.mailbox, slot)?;
        if let Some(w) = kept {
            self.give_back(w);
        }
        Ok(())
    }

    fn status(&self) -> Vec<ProgramStatus> {
        if !self.shut_down {
            self.recover();
        }
        let mut s = self.lock();
        let states: Vec<KernelState> = s
            .programs
            .iter_mut()
            // A program left stopped has no kernel to ask about.
            .map(|p| if p.core.life.relaunchable() { p.worker.poll() } else { KernelState::Idle })
            .collect();
        s.programs.iter().zip(states).map(|(p, state)| self.status_of(p, state)).collect()
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
