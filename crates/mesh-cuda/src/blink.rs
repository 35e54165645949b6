//! The blink backend: every program a resident kernel of one context; a load, upgrade or unload stops them all,
//! changes the modules, and relaunches them all.
//!
//! Why blink: `cuModuleLoadData` and `cuModuleUnload` in a context wait until every kernel running
//! in it has finished (measured on the H200: a load waited 1.9 s for a running kernel). So the JIT
//! links while everything runs, and only the module change itself happens with the kernels stopped.
//! Channel contents and slot state live in the mailbox and survive a blink untouched.
//!
//! **The watchdog** ([`Backend::watch`], every few tens of ms): a fault is sticky in the one
//! context, so every stream fails with it. Recovery resets the context (the primary context in
//! place; a green context destroyed and made again), registers the mailbox again, reloads every
//! module from its kept cubin, and relaunches every program but the culprit, named from the
//! evidence (mesh-backend's `watch`) or found by halves: relaunch a half, watch it for
//! [`FAULT_WATCH`], reset again if the fault came back. A program that ended itself (`mesh_exit`)
//! is reported once and not relaunched.
//!
//! **A sticky fault** (an illegal address, an illegal instruction, a trap, an assert: [`is_sticky`])
//! cannot be recovered in place: NVIDIA documents that the process must be terminated and
//! relaunched, and on the H200 (driver 580) even `cuDevicePrimaryCtxRetain` fails with the fault's
//! code afterwards. Then the watchdog names the culprit from the same evidence and asks meshd to
//! replace the process ([`Backend::take_replacement`], with every program's linked image so that the
//! new process need not link again); until then every change is refused
//! ([`BackendError::Replacing`]). Any other fault is recovered in place, and when that fails the
//! process is replaced too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_backend::recover::{self, Recovery};
use mesh_backend::roster::{self, HasCore};
use mesh_backend::watch::{self, Evidence, Replacement, ReplacementSlot, Verdict};
use mesh_backend::{
    Backend, BackendError, BackendEvent, ImageKind, IsolationMode, KernelFigures, LaunchShape, Phase, ProgramCore,
    ProgramSpec, ProgramStatus, Result, SmBudget, check_resident,
};
use mesh_shm::Mailbox;
use mesh_shm::layout::{STATE_EXITED, STATE_IDLE, STATE_RUNNING};

use crate::context::{Context, Stream, StreamState};
use crate::device::Device;
use crate::device_ring::DeviceRings;
use crate::jit::Jit;
use crate::memory::RegisteredMailbox;
use crate::module::{Function, Module};
use crate::slots;

/// Options of the blink backend.
#[derive(Debug, Clone, Copy)]
pub struct BlinkConfig {
    /// A green context of this many SMs for all programs; `None`: the whole GPU.
    pub sms: Option<u32>,
    /// How long a blink waits for the programs to stop.
    pub stop_deadline: Duration,
}

impl Default for BlinkConfig {
    fn default() -> Self {
        Self { sms: None, stop_deadline: Duration::from_secs(2) }
    }
}

/// How long a program relaunched by the watchdog's search is watched for the fault to come back.
pub const FAULT_WATCH: Duration = Duration::from_millis(250);

/// The driver errors after which no CUDA call of this process works again (NVIDIA's "sticky"
/// errors: "the process must be terminated and relaunched").
pub const STICKY: [&str; 12] = [
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
];

/// Whether `error` (a failed stream's text, `NAME: description` as the driver names it) is sticky:
/// the process must be replaced, no reset in place can work.
pub fn is_sticky(error: &str) -> bool {
    let name = error.split(':').next().unwrap_or_default().trim();
    STICKY.contains(&name)
}

/// A program's kernel and stream in the one context (gone only while a reset recreates it).
#[derive(Debug)]
struct Gpu {
    /// `mesh_main`, looked up once (a relaunch is on every program's pause); it keeps its module loaded.
    entry: Function,
    stream: Stream,
}

/// A loaded program: what every backend keeps, its linked image, and its kernel and stream.
#[derive(Debug)]
struct Program {
    core: ProgramCore,
    /// The linked image, kept to reload the module after a context reset.
    cubin: Arc<Vec<u8>>,
    gpu: Option<Gpu>,
}

impl Program {
    /// What its stream is doing (no stream: nothing runs).
    fn state(&self) -> StreamState {
        self.gpu.as_ref().map_or(StreamState::Idle, |g| g.stream.state())
    }

    /// Whether the watchdog and the blinks relaunch it: not left stopped, not ended by itself.
    fn relaunchable(&self) -> bool {
        self.core.life.relaunchable() && self.core.health.exited.is_none()
    }
}

impl HasCore for Program {
    fn core(&self) -> &ProgramCore {
        &self.core
    }
}

/// Timings of the last blink, for the benchmarks.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlinkTimes {
    /// From the first stop request to every kernel stopped.
    pub stop: Duration,
    /// The module change (load, unload).
    pub change: Duration,
    /// Relaunching every program.
    pub relaunch: Duration,
    /// From the first stop request to the last relaunch.
    pub total: Duration,
}

/// The blink backend (the seed's `mesh_cuda_backend_open` with `iso` = blink).
#[derive(Debug)]
pub struct BlinkBackend {
    programs: Vec<Program>,
    registered: Option<RegisteredMailbox>,
    /// Device channels' slots, in this context.
    device_rings: DeviceRings,
    mailbox: Mailbox,
    jit: Jit,
    ctx: Context,
    device: Device,
    config: BlinkConfig,
    /// Programs that did not stop by the deadline; while any still runs, only status and shutdown are served.
    stuck: Vec<String>,
    shut_down: bool,
    last_blink: BlinkTimes,
    /// Why the backend is unusable after a failed recovery (only status and shutdown are served).
    broken: Option<String>,
    /// A sticky fault: meshd was asked to replace the process (changes are refused meanwhile).
    replacing: bool,
    /// That request, until meshd takes it.
    replacement: ReplacementSlot,
    /// kcheck figures by (cubin, shape): the driver's occupancy calculation is a measurable part of a
    /// blink, and the same cubin always gives the same figures.
    probes: HashMap<(usize, LaunchShape), KernelFigures>,
    /// Blink pauses and recoveries not yet handed to meshd's metrics ([`Backend::take_events`]).
    events: Vec<BackendEvent>,
    /// Where a recovery in place shows at once (meshd's `ps`, `/readyz`, `/metrics`).
    board: mesh_backend::RecoveryBoard,
}

impl BlinkBackend {
    /// Opens device 0: context (primary or green), the mailbox registered once, the JIT started and warm.
    pub fn open(mailbox: &Mailbox, config: BlinkConfig) -> Result<Self> {
        let device = Device::get(0)?;
        let ctx = match config.sms {
            Some(n) => Context::green(&device, n)?,
            None => Context::primary(&device)?,
        };
        let registered = RegisteredMailbox::register(&ctx, mailbox)?;
        let jit = Jit::start(&device.arch())?;
        Ok(Self {
            programs: Vec::new(),
            registered: Some(registered),
            device_rings: DeviceRings::default(),
            mailbox: mailbox.clone(),
            jit,
            ctx,
            device,
            config,
            stuck: Vec::new(),
            broken: None,
            replacing: false,
            replacement: ReplacementSlot::default(),
            shut_down: false,
            last_blink: BlinkTimes::default(),
            probes: HashMap::new(),
            events: Vec::new(),
            board: mesh_backend::RecoveryBoard::new(),
        })
    }

    /// The context every program runs in (kcheck's module-load probe).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Timings of the last blink.
    pub fn last_blink(&self) -> BlinkTimes {
        self.last_blink
    }

    fn device_base(&self) -> u64 {
        self.registered.as_ref().map_or(0, RegisteredMailbox::device_address)
    }

    /// Refuses while shut down, or while a program that would not stop is still running.
    fn ready(&mut self) -> Result<()> {
        if self.shut_down {
            return Err(BackendError::ShutDown);
        }
        self.stuck.retain(|name| self.programs.iter().any(|p| &p.core.name == name && p.state() == StreamState::Busy));
        // A fault the watchdog has not seen yet: recover before the change (a fault is sticky, so
        // nothing would work in the poisoned context).
        if let Some(error) = self.first_failure() {
            let _ = self.recover(&error);
        }
        if let Some(why) = &self.broken {
            if self.replacing {
                return Err(BackendError::Replacing(why.clone()));
            }
            return Err(BackendError::Degraded(why.clone()));
        }
        if !self.stuck.is_empty() {
            return Err(BackendError::Degraded(format!(
                "program(s) {} ignored a stop request and still run",
                self.stuck.join(", ")
            )));
        }
        Ok(())
    }

    /// Asks every relaunchable program to stop and waits for all, up to the deadline.
    /// On timeout, relaunches those that did stop, records the others as stuck, and refuses.
    fn stop_all(&mut self, started: Instant) -> Result<()> {
        for p in self.programs.iter_mut().filter(|p| p.relaunchable()) {
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
        }
        let deadline = started + self.config.stop_deadline;
        loop {
            let busy: Vec<usize> =
                (0..self.programs.len()).filter(|&i| self.programs[i].state() == StreamState::Busy).collect();
            for (i, p) in self.programs.iter_mut().enumerate() {
                if !busy.contains(&i) {
                    p.core.life.returned();
                }
            }
            if busy.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let names: Vec<String> = busy.iter().map(|&i| self.programs[i].core.name.clone()).collect();
                self.relaunch_all(&busy)?;
                self.stuck = names.clone();
                return Err(BackendError::StopTimeout {
                    programs: names,
                    waited_ms: u64::try_from(self.config.stop_deadline.as_millis()).unwrap_or(u64::MAX),
                });
            }
            // Spin: a blink's pause is what every program feels, and a sleep costs 50 µs or more.
            std::thread::yield_now();
        }
    }

    /// Relaunches every relaunchable program not in `skip`, each with its generation bumped; a
    /// program whose launch fails is left stopped with the error.
    fn relaunch_all(&mut self, skip: &[usize]) -> Result<()> {
        let base = self.device_base();
        // One binding for every launch: each launch then finds the context current.
        self.ctx.bind()?;
        let mut first_err = None;
        // Deleted channels' rings are freed while no kernel runs (a free waits for every kernel of
        // the context): after a blink's stop, not beside a program that would not stop.
        if !self.any_busy() {
            self.device_rings.free_released();
        }
        // Device rings before any kernel runs again (those skipped now too, which may be launched
        // beside running ones later): an allocation may wait for the work before it.
        for i in 0..self.programs.len() {
            if !self.programs[i].relaunchable() {
                continue;
            }
            if let Err(e) = self.device_rings.prepare(&self.ctx, &self.mailbox, self.programs[i].core.slot) {
                self.programs[i].core.life.fault(e.to_string());
                first_err.get_or_insert(e.into());
            }
        }
        for i in 0..self.programs.len() {
            if skip.contains(&i) || !self.programs[i].relaunchable() {
                continue;
            }
            if let Err(e) = self.launch(i, base) {
                self.programs[i].core.life.fault(e.to_string());
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn launch(&mut self, i: usize, base: u64) -> Result<()> {
        let p = &mut self.programs[i];
        let generation = p
            .core
            .life
            .launch()
            .map_err(|e| BackendError::Invalid { what: format!("program {:?}", p.core.name), reason: e.to_string() })?;
        slots::arm(&self.mailbox, p.core.slot, generation)?;
        let ctx = self.device_rings.mesh_ctx(&self.ctx, &self.mailbox, p.core.slot, base)?;
        for loss in self.device_rings.take_losses() {
            eprintln!(
                "meshd: channel {:?}: its device ring was made anew, empty: {} messages lost",
                loss.channel, loss.lost
            );
        }
        p.core.health.launched(slots::reading(&self.mailbox, p.core.slot).heartbeat);
        let gpu = p.gpu.as_ref().ok_or_else(|| BackendError::Degraded("the context is being recreated".into()))?;
        Ok(gpu.entry.launch(&p.core.shape, &gpu.stream, &ctx)?)
    }

    /// kcheck: the module's `mesh_main` and the share of the context the launch would hold beside the
    /// resident programs (all in this one context, so both SM counts are the context's).
    fn kcheck(
        &mut self,
        name: &str,
        module: &Module,
        cubin: &Arc<Vec<u8>>,
        shape: &LaunchShape,
        replacing: Option<&str>,
    ) -> Result<(f64, Function)> {
        let func = module
            .function("mesh_main")
            .map_err(|e| BackendError::NoEntry { program: name.to_string(), detail: e.to_string() })?;
        // The JIT's cache keeps each cubin alive, so its address identifies it for as long as it is cached.
        let key = (Arc::as_ptr(cubin) as usize, *shape);
        let figures = match self.probes.get(&key) {
            Some(&hit) => hit,
            None => {
                let figures = func.figures(shape)?;
                self.probes.insert(key, figures);
                figures
            }
        };
        let held = roster::held_share(&self.programs, replacing);
        let share = check_resident(name, shape, &figures, SmBudget::one_context(self.ctx.sms()), held)?;
        Ok((share, func))
    }

    /// Stops everything, runs `change` on the stopped context, relaunches everything.
    /// A failed change relaunches the programs as they were, so that a refusal loses nothing.
    fn blink<T>(&mut self, change: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let paused: Vec<String> =
            self.programs.iter().filter(|p| p.relaunchable()).map(|p| p.core.name.clone()).collect();
        self.stop_all(started)?;
        let stopped = started.elapsed();
        let result = change(self);
        let changed = started.elapsed();
        let relaunched = self.relaunch_all(&[]);
        let total = started.elapsed();
        self.last_blink = BlinkTimes { stop: stopped, change: changed - stopped, relaunch: total - changed, total };
        let again = paused
            .into_iter()
            .filter(|n| self.programs.iter().any(|p| &p.core.name == n && p.state() == StreamState::Busy))
            .collect();
        self.events.push(BackendEvent::BlinkPause { took: total, relaunched: again });
        let value = result?;
        relaunched?;
        Ok(value)
    }

    fn status_of(&self, p: &Program) -> ProgramStatus {
        let sms = self.ctx.is_green().then(|| self.ctx.sms());
        p.core.status(p.state().into(), slots::reading(&self.mailbox, p.core.slot), None, sms)
    }

    /// Whether any program's kernel is still on the GPU.
    fn any_busy(&self) -> bool {
        self.programs.iter().any(|p| p.state() == StreamState::Busy)
    }

    /// The driver's error of the first program whose stream failed.
    fn first_failure(&self) -> Option<String> {
        self.programs.iter().find_map(|p| match p.state() {
            StreamState::Failed(why) => Some(why),
            _ => None,
        })
    }

    /// Recreates the context after a fault: every kernel object dropped, the context reset (primary)
    /// or made again (green), the mailbox registered again, every module reloaded from its cubin and
    /// given a new stream. Nothing runs afterwards; every program is stopped.
    fn reset(&mut self) -> Result<()> {
        for p in &mut self.programs {
            p.gpu = None;
            p.core.life.returned();
        }
        self.registered = None;
        self.device_rings.forget_all();
        if self.ctx.is_green() {
            let n = self.ctx.sms();
            // The old green context goes with its last clone, here.
            self.ctx = Context::green(&self.device, n)?;
        } else {
            self.ctx.reset_primary()?;
            self.ctx = Context::primary(&self.device)?;
        }
        self.registered = Some(RegisteredMailbox::register_again(&self.ctx, &self.mailbox)?);
        for p in &mut self.programs {
            let module = Module::load(&self.ctx, &p.cubin)?;
            let entry = module.function("mesh_main")?;
            p.gpu = Some(Gpu { entry, stream: self.ctx.stream()? });
        }
        Ok(())
    }

    /// Relaunches program `i` for the watchdog (its restarts counted).
    fn restart(&mut self, i: usize, base: u64) -> Result<()> {
        self.launch(i, base)?;
        self.programs[i].core.health.restarts += 1;
        self.board.relaunched(&self.programs[i].core.name);
        Ok(())
    }

    /// Watches the programs in `running` for [`FAULT_WATCH`]: whether the fault came back.
    fn faulted_within(&self, running: &[usize]) -> bool {
        let until = Instant::now() + FAULT_WATCH;
        while Instant::now() < until {
            if running.iter().any(|&i| matches!(self.programs[i].state(), StreamState::Failed(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// What each program's kernel, slot and heartbeat said when the fault was noticed.
    fn evidence(&self, now: Instant) -> Vec<Evidence> {
        self.programs
            .iter()
            .map(|p| {
                let state = self.mailbox.slot(p.core.slot).map(|s| s.status().state).unwrap_or(STATE_IDLE);
                Evidence {
                    on_gpu: p.relaunchable()
                        && p.core.life.phase() == &Phase::Running
                        && matches!(state, STATE_IDLE | STATE_RUNNING),
                    image_age: p.core.health.image_age(now),
                    beat_stale: p.core.health.beat_stale(now),
                    ..Evidence::default()
                }
            })
            .collect()
    }

    /// Recovers from a fault (`error`, the driver's message): resets the context, names or searches
    /// the culprit, leaves it stopped, relaunches every other program. Returns the log lines.
    fn recover(&mut self, error: &str) -> Vec<String> {
        let started = Instant::now();
        let evidence = self.evidence(started);
        let verdict = watch::name_culprit(&evidence, watch::TICK);
        if is_sticky(error) {
            return vec![self.replace_process(error, verdict, started, "the error is sticky")];
        }
        let mut log = vec![format!("GPU fault in the context ({error}): resetting it; {verdict:?}")];
        // A reset stops every kernel of the context: every program shows as recovering.
        self.board.begin(
            format!("GPU fault: {error}"),
            self.programs.iter().map(|p| p.core.name.clone()).collect::<Vec<_>>(),
        );
        let recovered = recover::recover(&mut InPlace(self), &verdict, error, &evidence, started, &mut log);
        self.board.end();
        match recovered {
            Ok(culprit) => {
                let culprit = culprit.map_or_else(|| "none".to_string(), |(i, _)| self.programs[i].core.name.clone());
                log.push(format!(
                    "watchdog blink: recovered in {:.1} ms; culprit {culprit}; {} program(s) running",
                    started.elapsed().as_secs_f64() * 1e3,
                    self.programs.iter().filter(|p| p.state() == StreamState::Busy).count()
                ));
            }
            Err(e) => {
                log.push(format!("recovering from a GPU fault ({error}) in place failed: {e}"));
                log.push(self.replace_process(error, verdict, started, "recovery in place failed"));
            }
        }
        log
    }

    /// Asks meshd to replace the process (`why`: the fault is sticky, or the reset in place failed),
    /// handing it the verdict and every program's linked image; from now on changes are refused.
    /// Returns the log line.
    fn replace_process(&mut self, error: &str, verdict: Verdict, noticed: Instant, why: &str) -> String {
        let line = format!(
            "GPU fault in the context ({error}): {why}, so this process cannot use the GPU again; {verdict:?}; \
             asking meshd to replace its process"
        );
        self.replacement.ask(Replacement {
            error: error.to_string(),
            programs: self.programs.iter().map(|p| p.core.name.clone()).collect(),
            verdict,
            noticed,
            linked: self.programs.iter().map(|p| (p.core.name.clone(), p.cubin.clone())).collect(),
            arch: self.jit.arch().to_string(),
        });
        self.broken = Some(format!("a GPU fault ({error}) left this process unable to use the GPU ({why})"));
        self.replacing = true;
        line
    }
}

/// The blink backend as a recovery drives it: a reset is the context's (bound again after it),
/// a relaunch a launch of the kernel on its stream.
struct InPlace<'a>(&'a mut BlinkBackend);

impl Recovery for InPlace<'_> {
    type Error = BackendError;

    fn reset(&mut self) -> Result<()> {
        self.0.reset()?;
        Ok(self.0.ctx.bind()?)
    }

    fn relaunch(&mut self, which: &[usize]) {
        let base = self.0.device_base();
        for &i in which {
            if let Err(e) = self.0.restart(i, base) {
                self.0.programs[i].core.life.fault(format!("relaunch after a GPU fault failed: {e}"));
            }
        }
    }

    fn faulted_within(&mut self, running: &[usize]) -> bool {
        self.0.faulted_within(running)
    }

    fn core(&mut self, i: usize) -> &mut ProgramCore {
        &mut self.0.programs[i].core
    }

    fn relaunchable(&self, i: usize) -> bool {
        self.0.programs[i].relaunchable()
    }

    fn count(&self) -> usize {
        self.0.programs.len()
    }

    fn record(&mut self, event: BackendEvent) {
        self.0.events.push(event);
    }
}

impl Backend for BlinkBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
    }

    fn take_replacement(&mut self) -> Option<Replacement> {
        self.replacement.take()
    }

    fn load(&mut self, spec: ProgramSpec) -> Result<ProgramStatus> {
        self.ready()?;
        spec.validate()?;
        roster::refuse_duplicate(&self.programs, &spec.name)?;
        if spec.sms.is_some_and(|n| Some(n) != self.config.sms) {
            return Err(BackendError::Invalid {
                what: format!("program {:?}", spec.name),
                reason: "a per-program SM count needs --isolation mps; in blink mode --sms applies to all programs"
                    .into(),
            });
        }
        let bindings = slots::channel_indices(&self.mailbox, &spec.bindings)?;
        let slot = slots::free_slot(&self.mailbox, &self.programs)?;
        // Link while everything runs; only the module load happens inside the blink.
        let linked = self.jit.link(&spec.name, spec.image, spec.kind)?;
        slots::check_declared(&self.mailbox, &spec.name, &spec.bindings, &linked.cubin)?;
        let stream = self.ctx.stream()?;
        let name = spec.name;
        let (kind, shape) = (spec.kind, spec.shape);
        self.blink(|me| {
            let module = Module::load(&me.ctx, &linked.cubin)?;
            let (share, entry) = me.kcheck(&name, &module, &linked.cubin, &shape, None)?;
            let previous = slots::prepare(&me.mailbox, slot, &name, &bindings)?;
            let cubin = linked.cubin.clone();
            let gpu = Some(Gpu { entry, stream });
            let mut core = ProgramCore::new(name, slot, kind, shape, share);
            core.life = mesh_backend::life::Life::after(previous);
            me.programs.push(Program { core, cubin, gpu });
            Ok(())
        })?;
        let p = self.programs.last().expect("just pushed");
        Ok(self.status_of(p))
    }

    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus> {
        self.ready()?;
        let i = roster::index_of(&self.programs, name)?;
        let kind = ImageKind::detect_for(name, &image)?;
        let linked = self.jit.link(name, image, kind)?;
        slots::check_declared_in(&self.mailbox, name, self.programs[i].core.slot, &linked.cubin)?;
        self.blink(|me| {
            let module = Module::load(&me.ctx, &linked.cubin)?;
            let shape = me.programs[i].core.shape;
            let (share, entry) = me.kcheck(name, &module, &linked.cubin, &shape, Some(name))?;
            let p = &mut me.programs[i];
            // The old module is unloaded here, with its last Function (its kernel is stopped, so the
            // unload does not wait).
            if let Some(gpu) = &mut p.gpu {
                gpu.entry = entry;
            }
            p.cubin = linked.cubin.clone();
            p.core.kind = kind;
            p.core.share = share;
            p.core.life.new_image();
            p.core.health.new_image(Instant::now());
            Ok(())
        })?;
        Ok(self.status_of(&self.programs[i]))
    }

    fn unload(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        let i = roster::index_of(&self.programs, name)?;
        self.board.forget(name);
        self.blink(|me| {
            let p = me.programs.remove(i);
            slots::release(&me.mailbox, p.core.slot)?;
            drop(p);
            Ok(())
        })
    }

    fn status(&self) -> Vec<ProgramStatus> {
        self.programs.iter().map(|p| self.status_of(p)).collect()
    }

    fn watch(&mut self) -> Vec<String> {
        if self.shut_down || self.broken.is_some() {
            return Vec::new();
        }
        let now = Instant::now();
        let mut log = Vec::new();
        for p in &mut self.programs {
            let Ok(slot) = self.mailbox.slot(p.core.slot) else { continue };
            let status = slot.status();
            p.core.health.observe_beat(status.heartbeat, now);
            let running = p.core.life.phase() == &Phase::Running && p.core.health.exited.is_none();
            if running && status.state == STATE_EXITED && p.state() == StreamState::Idle {
                // Ended by itself: reported once, never relaunched (until a new image).
                p.core.health.exited = Some(status.exit_code);
                p.core.life.returned();
                log.push(format!(
                    "program {} ended by itself (mesh_exit({})): reported, not relaunched",
                    p.core.name, status.exit_code
                ));
            }
        }
        if let Some(error) = self.first_failure() {
            log.extend(self.recover(&error));
        }
        log
    }

    fn set_recovery_board(&mut self, board: mesh_backend::RecoveryBoard) {
        self.board = board;
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        for p in &self.programs {
            slots::request_stop(&self.mailbox, p.core.slot);
        }
        let deadline = Instant::now() + self.config.stop_deadline;
        while Instant::now() < deadline && self.any_busy() {
            std::thread::sleep(Duration::from_micros(50));
        }
        let stuck: Vec<String> =
            self.programs.iter().filter(|p| p.state() == StreamState::Busy).map(|p| p.core.name.clone()).collect();
        for p in self.programs.drain(..) {
            let _ = slots::release(&self.mailbox, p.core.slot);
            if !stuck.is_empty() {
                // Unloading any module of the context waits for every kernel in it, the stuck one
                // included (seen on the H200): leave them all to process exit.
                std::mem::forget(p);
            }
        }
        if stuck.is_empty() {
            self.registered.take();
            Ok(())
        } else {
            // Releasing the context or the registration would wait for the stuck kernels too: leave
            // them to process exit (see meshd, which then exits without running destructors).
            std::mem::forget(self.registered.take());
            std::mem::forget(self.ctx.clone());
            Err(BackendError::StopTimeout {
                programs: stuck,
                waited_ms: u64::try_from(self.config.stop_deadline.as_millis()).unwrap_or(u64::MAX),
            })
        }
    }

    fn take_events(&mut self) -> Vec<BackendEvent> {
        std::mem::take(&mut self.events)
    }

    fn channel_deleted(&mut self, index: u32) {
        self.device_rings.release(index);
        // A free waits for every kernel of the context, and resident kernels do not end: freed now
        // only when none runs, else by the next blink (which stops them all first).
        if !self.any_busy() {
            self.device_rings.free_released();
        }
    }

    fn host_atomics(&self) -> bool {
        self.device.host_atomics
    }
}

impl Drop for BlinkBackend {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_illegal_address_is_sticky_and_a_busy_stream_is_not() {
        assert!(is_sticky("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"));
        assert!(is_sticky("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"));
        assert!(is_sticky("CUDA_ERROR_ASSERT"));
        assert!(!is_sticky("CUDA_ERROR_NOT_READY: device not ready"));
        assert!(!is_sticky("CUDA_ERROR_OUT_OF_MEMORY: out of memory"));
        assert!(!is_sticky("?: ?"));
    }
}
