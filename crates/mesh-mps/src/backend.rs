//! The MPS backend: each program in its own worker (an MPS client of meshd's private server), so that a
//! load, upgrade or unload halts no other program.
//!
//! A module load in one MPS client does not wait for the other clients' kernels (measured on the H200:
//! 0.09 to 0.14 ms while another client's kernel ran), so an idle worker loads and probes the new cubin
//! while everything runs. Creating a client stalls the running kernels once (up to 0.4 ms), so the pool
//! is started before any program runs and a freed worker goes back to it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mesh_backend::cleanup::{self, CleanupId};
use mesh_backend::{
    Backend, BackendError, ImageKind, IsolationMode, KernelRun, LaunchShape, ProgramSpec, ProgramState, ProgramStatus,
    Result,
};
use mesh_cuda::{Device, Jit};
use mesh_mps_worker::{Command as WorkerCommand, Probe};
use mesh_shm::Mailbox;
use mesh_shm::layout::STATE_EXITED;

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

#[derive(Debug)]
struct Program {
    name: String,
    slot: u32,
    kind: ImageKind,
    shape: LaunchShape,
    worker: Worker,
    generation: u32,
    share: f64,
    faulted: Option<String>,
    /// The linked image, kept to relaunch the program in a fresh worker after a GPU fault.
    cubin: Arc<Vec<u8>>,
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
    next_cubin: std::sync::atomic::AtomicU64,
    shut_down: bool,
}

/// Every worker killed, then the daemon quit; waits for both. Programs should have been stopped first.
fn tear_down(shared: &Mutex<Shared>) {
    let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
    for mut p in s.programs.drain(..) {
        p.worker.kill();
    }
    for mut w in s.idle.drain(..) {
        w.kill();
    }
    if let Some(control) = s.control.take() {
        control.quit();
    }
    *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// Starts a worker, retrying for up to 10 s: after a fault the server refuses new clients until every
/// old one has exited (the H200 took a new client 0.3 s later).
fn start_retrying(control: &MpsControl, mailbox: &std::path::Path, sms: Option<u32>) -> Result<Worker> {
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

fn mb(e: mesh_shm::ShmError) -> BackendError {
    BackendError::Mailbox(e.to_string())
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
        *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = Some(control.clone());
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
                shared.lock().unwrap_or_else(|p| p.into_inner()).idle.push(w);
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
            next_cubin: std::sync::atomic::AtomicU64::new(0),
            shut_down: false,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
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
        match w.request(&WorkerCommand::Unload, WORKER_LAUNCH) {
            Ok(_) => self.lock().idle.push(w),
            Err(e) => {
                tracing::warn!("worker {} discarded: {e}", w.pid());
                w.kill();
            }
        }
    }

    /// Has `worker` load `cubin` and probe its `mesh_main` for `shape`.
    fn load_into(&self, worker: &mut Worker, name: &str, cubin: &[u8], shape: &LaunchShape) -> Result<Probe> {
        let n = self.next_cubin.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.cubins.join(format!("{n}-{name}.cubin"));
        std::fs::write(&path, cubin)
            .map_err(|e| BackendError::Worker { pid: worker.pid(), detail: format!("{}: {e}", path.display()) })?;
        let reply = worker.request(
            &WorkerCommand::Load {
                cubin: path.display().to_string(),
                grid: shape.grid,
                block: shape.block,
                shared_mem: shape.shared_mem,
            },
            WORKER_LOAD,
        );
        let _ = std::fs::remove_file(&path);
        match reply {
            Ok(r) => r
                .probe
                .ok_or_else(|| BackendError::Worker { pid: worker.pid(), detail: "no probe in the load reply".into() }),
            Err(BackendError::Worker { detail, .. }) if detail.contains("mesh_main") => {
                Err(BackendError::NoEntry { program: name.to_string(), detail })
            }
            Err(e) => Err(e),
        }
    }

    /// Links `image`, has `worker` load and probe it, and checks that it can be resident beside the others.
    /// Returns the launch's share of the GPU and the cubin.
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
        let capacity = u64::from(probe.per_sm) * u64::from(probe.sms);
        let whole = u64::from(probe.per_sm) * u64::from(self.device.sm_count);
        let share = if whole == 0 { f64::INFINITY } else { shape.blocks() as f64 / whole as f64 };
        let held: f64 =
            self.lock().programs.iter().filter(|p| Some(p.name.as_str()) != replacing).map(|p| p.share).sum();
        if shape.blocks() > capacity
            || held + share > 1.0 + 1e-9
            || shape.threads_per_block() > u64::from(probe.max_threads_per_block)
        {
            return Err(BackendError::NotResident {
                program: name.to_string(),
                detail: format!(
                    "{} blocks of {} threads ({} registers, {} B static + {} B dynamic shared memory each; mesh_main allows {} threads): {} fit per SM, {capacity} on the worker's {} SMs; the launch needs {:.1}% of the GPU while the resident programs hold {:.1}%",
                    shape.blocks(),
                    shape.threads_per_block(),
                    probe.registers,
                    probe.shared_bytes,
                    shape.shared_mem,
                    probe.max_threads_per_block,
                    probe.per_sm,
                    probe.sms,
                    share * 100.0,
                    held * 100.0
                ),
            });
        }
        Ok((share, linked.cubin))
    }

    /// After a GPU fault: NVIDIA documents (and the H200 showed) that a fatal fault in one client is
    /// reported to every client, and that the server takes no new client until all of them have exited.
    /// So every client is ended, fresh workers are started, and the programs are relaunched one at a
    /// time from their mailbox state; a program whose relaunch faults again is the culprit and is left
    /// stopped. Returns the programs left stopped.
    fn recover(&self) -> Vec<String> {
        let mut s = self.lock();
        let failed: Vec<String> = s
            .programs
            .iter_mut()
            .filter(|p| p.faulted.is_none())
            .filter_map(|p| {
                let state = if p.worker.alive() {
                    p.worker
                        .request(&WorkerCommand::Wait { timeout_ms: 0 }, WORKER_LAUNCH)
                        .map(|r| r.state.unwrap_or_default())
                        .unwrap_or_else(|e| format!("failed: {e}"))
                } else {
                    "failed: the worker process is gone".into()
                };
                state.starts_with("failed").then(|| p.name.clone())
            })
            .collect();
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
            self.end_all_clients(&mut s, &control);
            let mut culprit = None;
            for i in 0..s.programs.len() {
                if s.programs[i].faulted.is_some() {
                    continue;
                }
                if let Err(e) = self.relaunch_in_fresh_worker(&mut s, &control, i) {
                    tracing::error!(program = s.programs[i].name, "relaunch after the fault failed: {e}");
                    s.programs[i].faulted = Some(format!("relaunch after a GPU fault failed: {e}"));
                    continue;
                }
                // A fault reaches the clients some 150 ms after the faulting launch: watch long enough.
                let watch = Instant::now() + FAULT_WATCH;
                let mut again = false;
                while !again && Instant::now() < watch {
                    std::thread::sleep(Duration::from_millis(10));
                    again = s.programs[..=i].iter_mut().filter(|p| p.faulted.is_none()).any(|p| {
                        !p.worker.alive()
                            || p.worker
                                .request(&WorkerCommand::Wait { timeout_ms: 0 }, WORKER_LAUNCH)
                                .map_or(true, |r| r.state.unwrap_or_default().starts_with("failed"))
                    });
                }
                if again {
                    culprit = Some(i);
                    break;
                }
            }
            match culprit {
                Some(i) => {
                    let p = &mut s.programs[i];
                    tracing::error!(program = p.name, "faulted again when relaunched after a GPU fault: left stopped");
                    p.faulted = Some("faulted the GPU (again when relaunched alone): left stopped".into());
                    parked.push(p.name.clone());
                }
                None => break,
            }
        }
        // Refill the pool, now that the server takes clients again.
        while (s.idle.len() as u32) < self.config.pool {
            match start_retrying(&control, self.mailbox.path(), self.config.sms) {
                Ok(w) => s.idle.push(w),
                Err(e) => {
                    tracing::error!("refilling the pool after a fault: {e}");
                    break;
                }
            }
        }
        parked
    }

    /// Ends every client: a stop request to every program, then each worker cut off and killed.
    fn end_all_clients(&self, s: &mut Shared, control: &MpsControl) {
        for p in &s.programs {
            if let Ok(slot) = self.mailbox.slot(p.slot) {
                slot.request_stop();
            }
        }
        let mut doomed: Vec<&mut Worker> =
            s.idle.iter_mut().chain(s.programs.iter_mut().map(|p| &mut p.worker)).collect();
        for w in doomed.iter_mut() {
            if w.alive() {
                let busy = w
                    .request(&WorkerCommand::Wait { timeout_ms: 200 }, WORKER_LAUNCH)
                    .is_ok_and(|r| r.state.as_deref() == Some("busy"));
                if busy {
                    let _ = control.terminate_client(w.server, w.pid());
                }
            }
            w.kill();
        }
        s.idle.clear();
    }

    /// Starts a worker for program `i` (the server may refuse new clients for a moment after a fault),
    /// loads its cubin and launches it in its slot with the generation bumped.
    fn relaunch_in_fresh_worker(&self, s: &mut Shared, control: &MpsControl, i: usize) -> Result<()> {
        let mut worker = start_retrying(control, self.mailbox.path(), self.config.sms)?;
        let (name, cubin, shape, slot) = {
            let p = &s.programs[i];
            (p.name.clone(), p.cubin.clone(), p.shape, p.slot)
        };
        self.load_into(&mut worker, &name, &cubin, &shape)?;
        let p = &mut s.programs[i];
        p.generation += 1;
        self.mailbox.slot(slot).map_err(mb)?.arm(p.generation);
        worker.request(&WorkerCommand::Launch { slot }, WORKER_LAUNCH)?;
        let mut old = std::mem::replace(&mut p.worker, worker);
        old.kill();
        Ok(())
    }

    /// Stops the kernel in `worker`: the stop request through the mailbox; past the deadline,
    /// `terminate_client` on our server; only then SIGKILL. Returns the worker if it is reusable.
    /// Never fails: whatever happens, the kernel is stopped or its worker is gone afterwards.
    fn stop(&self, name: &str, slot: u32, mut worker: Worker) -> Option<Worker> {
        if let Ok(s) = self.mailbox.slot(slot) {
            s.request_stop();
        }
        let deadline = self.config.stop_deadline;
        let state = worker
            .request(&WorkerCommand::Wait { timeout_ms: deadline.as_millis() as u64 }, deadline + WORKER_LAUNCH)
            .map(|r| r.state.unwrap_or_default());
        match state {
            Ok(s) if s == "idle" => Some(worker),
            Ok(s) if s.starts_with("failed") => {
                tracing::warn!(program = name, "its kernel had failed ({s}); worker {} discarded", worker.pid());
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
                let _ = worker.request(&WorkerCommand::Wait { timeout_ms: 200 }, Duration::from_millis(500));
                worker.kill();
                None
            }
        }
    }

    fn index_of(&self, name: &str) -> Result<usize> {
        self.lock()
            .programs
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| BackendError::NoSuchProgram(name.to_string()))
    }
}

impl Backend for MpsBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Mps
    }

    fn load(&mut self, spec: ProgramSpec) -> Result<ProgramStatus> {
        self.ready()?;
        spec.validate()?;
        if self.lock().programs.iter().any(|p| p.name == spec.name) {
            return Err(BackendError::AlreadyLoaded(spec.name));
        }
        if let Some(n) = spec.sms {
            self.device.sm_partitioning()?.check(n)?;
        }
        let mut bindings = Vec::with_capacity(spec.bindings.len());
        for channel in &spec.bindings {
            bindings.push(self.mailbox.channel(channel).map_err(mb)?.index);
        }
        let taken: Vec<u32> = self.lock().programs.iter().map(|p| p.slot).collect();
        let count = self.mailbox.geometry().slot_count;
        let slot = (0..count).find(|s| !taken.contains(s)).ok_or_else(|| {
            BackendError::Mailbox(format!("all {count} program slots are in use (create the mailbox with more slots)"))
        })?;
        let mut worker = self.take_worker(spec.sms)?;
        let (share, cubin) = match self.prepare(&mut worker, &spec.name, spec.image, spec.kind, &spec.shape, None) {
            Ok(s) => s,
            Err(e) => {
                self.give_back(worker);
                return Err(e);
            }
        };
        let s = self.mailbox.slot(slot).map_err(mb)?;
        s.bind(&spec.name, &bindings).map_err(mb)?;
        s.reset_status();
        s.arm(1);
        if let Err(e) = worker.request(&WorkerCommand::Launch { slot }, WORKER_LAUNCH) {
            s.release();
            self.give_back(worker);
            return Err(e);
        }
        let program = Program {
            name: spec.name,
            slot,
            kind: spec.kind,
            shape: spec.shape,
            worker,
            generation: 1,
            share,
            faulted: None,
            cubin,
        };
        let status = self.status_of(&program, "busy");
        self.lock().programs.push(program);
        Ok(status)
    }

    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus> {
        self.ready()?;
        let i = self.index_of(name)?;
        let kind = ImageKind::detect_for(name, &image)?;
        let (shape, sms) = {
            let s = self.lock();
            (s.programs[i].shape, Some(s.programs[i].worker.ready.sms).filter(|_| self.config.sms.is_some()))
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
        let kept = self.stop(name, old.slot, old.worker);
        old.generation += 1;
        self.mailbox.slot(old.slot).map_err(mb)?.arm(old.generation);
        let launched = fresh.request(&WorkerCommand::Launch { slot: old.slot }, WORKER_LAUNCH);
        if let Some(w) = kept {
            self.give_back(w);
        }
        old.worker = fresh;
        old.kind = kind;
        old.share = share;
        old.cubin = cubin;
        old.faulted = launched.as_ref().err().map(ToString::to_string);
        let status = self.status_of(&old, if launched.is_ok() { "busy" } else { "idle" });
        self.lock().programs.insert(i, old);
        launched?;
        Ok(status)
    }

    fn unload(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        let i = self.index_of(name)?;
        let p = self.lock().programs.remove(i);
        let slot = p.slot;
        let kept = self.stop(name, slot, p.worker);
        self.mailbox.slot(slot).map_err(mb)?.release();
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
        let mut out = Vec::new();
        for p in s.programs.iter_mut() {
            let state = if p.faulted.is_some() {
                "idle".to_string()
            } else if !p.worker.alive() {
                "failed: the worker process is gone".to_string()
            } else {
                match p.worker.request(&WorkerCommand::Wait { timeout_ms: 0 }, WORKER_LAUNCH) {
                    Ok(r) => r.state.unwrap_or_default(),
                    Err(e) => format!("failed: {e}"),
                }
            };
            out.push((p.name.clone(), state));
        }
        let programs: Vec<ProgramStatus> =
            s.programs.iter().zip(&out).map(|(p, (_, state))| self.status_of(p, state)).collect();
        drop(s);
        programs
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        let programs: Vec<Program> = self.lock().programs.drain(..).collect();
        for p in programs {
            // A program that will not stop is cut off inside `stop`: nothing runs on afterwards.
            if let Some(w) = self.stop(&p.name, p.slot, p.worker) {
                w.exit();
            }
            let _ = self.mailbox.slot(p.slot).map(|s| s.release());
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

impl MpsBackend {
    fn status_of(&self, p: &Program, stream: &str) -> ProgramStatus {
        let snap = self.mailbox.slot(p.slot).ok().map(|s| s.status());
        // The worker answers `busy`, `idle` or `failed: <the driver's error>`.
        let run = match stream {
            s if s.starts_with("failed") => KernelRun::Failed(s.trim_start_matches("failed: ").to_string()),
            "busy" => KernelRun::Running,
            _ => KernelRun::Returned,
        };
        let exit_code = snap.filter(|s| s.state == STATE_EXITED).map(|s| s.exit_code);
        let state = ProgramState::of_kernel(run, p.faulted.as_deref(), exit_code);
        ProgramStatus {
            name: p.name.clone(),
            slot: p.slot,
            state,
            generation: p.generation,
            heartbeat: snap.map_or(0, |s| s.heartbeat),
            worker_pid: Some(p.worker.pid()),
            sms: self.config.sms.map(|_| p.worker.ready.sms),
            shape: p.shape,
            kind: p.kind,
        }
    }
}

impl Drop for MpsBackend {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
