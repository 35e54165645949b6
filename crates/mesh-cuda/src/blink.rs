//! The blink backend: every program a resident kernel of one context; a load, upgrade or unload stops them all,
//! changes the modules, and relaunches them all.
//!
//! Why blink: `cuModuleLoadData` and `cuModuleUnload` in a context wait until every kernel running
//! in it has finished (measured on the H200: a load waited 1.9 s for a running kernel). So the JIT
//! links while everything runs, and only the module change itself happens with the kernels stopped.
//! Channel contents and slot state live in the mailbox and survive a blink untouched.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_backend::roster::{self, HasCore};
use mesh_backend::{
    Backend, BackendError, ImageKind, IsolationMode, KernelFigures, LaunchShape, ProgramCore, ProgramSpec,
    ProgramStatus, Result, SmBudget, check_resident,
};
use mesh_shm::Mailbox;

use crate::context::{Context, Stream, StreamState};
use crate::device::Device;
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

/// A loaded program: what every backend keeps, and its kernel and stream in the one context.
#[derive(Debug)]
struct Program {
    core: ProgramCore,
    /// `mesh_main`, looked up once (a relaunch is on every program's pause); it keeps its module loaded.
    entry: Function,
    stream: Stream,
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
    mailbox: Mailbox,
    jit: Jit,
    ctx: Context,
    device: Device,
    config: BlinkConfig,
    /// Programs that did not stop by the deadline; while any still runs, only status and shutdown are served.
    stuck: Vec<String>,
    shut_down: bool,
    last_blink: BlinkTimes,
    /// kcheck figures by (cubin, shape): the driver's occupancy calculation is a measurable part of a
    /// blink, and the same cubin always gives the same figures.
    probes: HashMap<(usize, LaunchShape), KernelFigures>,
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
            mailbox: mailbox.clone(),
            jit,
            ctx,
            device,
            config,
            stuck: Vec::new(),
            shut_down: false,
            last_blink: BlinkTimes::default(),
            probes: HashMap::new(),
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
        self.stuck
            .retain(|name| self.programs.iter().any(|p| &p.core.name == name && p.stream.state() == StreamState::Busy));
        // A fault is sticky: every later call in the context fails, so nothing but status and shutdown can work.
        let faulted: Vec<String> = self
            .programs
            .iter()
            .filter_map(|p| match p.stream.state() {
                StreamState::Failed(why) => Some(format!("{} ({why})", p.core.name)),
                _ => None,
            })
            .collect();
        if !faulted.is_empty() {
            return Err(BackendError::Degraded(format!(
                "a GPU fault reached program(s) {} and poisons meshd's one context in blink mode; restart meshd",
                faulted.join(", ")
            )));
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
        for p in self.programs.iter_mut().filter(|p| p.core.life.relaunchable()) {
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
        }
        let deadline = started + self.config.stop_deadline;
        loop {
            let busy: Vec<usize> =
                (0..self.programs.len()).filter(|&i| self.programs[i].stream.state() == StreamState::Busy).collect();
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
                    waited_ms: self.config.stop_deadline.as_millis() as u64,
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
        for i in 0..self.programs.len() {
            if skip.contains(&i) || !self.programs[i].core.life.relaunchable() {
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
        let ctx = self.mailbox.mesh_ctx(p.core.slot, base).map_err(BackendError::mailbox)?;
        Ok(p.entry.launch(&p.core.shape, &p.stream, &ctx)?)
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
        self.stop_all(started)?;
        let stopped = started.elapsed();
        let result = change(self);
        let changed = started.elapsed();
        let relaunched = self.relaunch_all(&[]);
        let total = started.elapsed();
        self.last_blink = BlinkTimes { stop: stopped, change: changed - stopped, relaunch: total - changed, total };
        let value = result?;
        relaunched?;
        Ok(value)
    }

    fn status_of(&self, p: &Program) -> ProgramStatus {
        let sms = self.ctx.is_green().then(|| self.ctx.sms());
        p.core.status(p.stream.state().into(), slots::reading(&self.mailbox, p.core.slot), None, sms)
    }

    /// Whether any program's kernel is still on the GPU.
    fn any_busy(&self) -> bool {
        self.programs.iter().any(|p| p.stream.state() == StreamState::Busy)
    }
}

impl Backend for BlinkBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
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
        let stream = self.ctx.stream()?;
        let name = spec.name;
        let (kind, shape) = (spec.kind, spec.shape);
        self.blink(|me| {
            let module = Module::load(&me.ctx, &linked.cubin)?;
            let (share, entry) = me.kcheck(&name, &module, &linked.cubin, &shape, None)?;
            slots::prepare(&me.mailbox, slot, &name, &bindings)?;
            me.programs.push(Program { core: ProgramCore::new(name, slot, kind, shape, share), entry, stream });
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
        self.blink(|me| {
            let module = Module::load(&me.ctx, &linked.cubin)?;
            let shape = me.programs[i].core.shape;
            let (share, entry) = me.kcheck(name, &module, &linked.cubin, &shape, Some(name))?;
            let p = &mut me.programs[i];
            // The old module is unloaded here, with its last Function (its kernel is stopped, so the
            // unload does not wait).
            p.entry = entry;
            p.core.kind = kind;
            p.core.share = share;
            p.core.life.new_image();
            Ok(())
        })?;
        Ok(self.status_of(&self.programs[i]))
    }

    fn unload(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        let i = roster::index_of(&self.programs, name)?;
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
        let stuck: Vec<String> = self
            .programs
            .iter()
            .filter(|p| p.stream.state() == StreamState::Busy)
            .map(|p| p.core.name.clone())
            .collect();
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
            Err(BackendError::StopTimeout { programs: stuck, waited_ms: self.config.stop_deadline.as_millis() as u64 })
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
