//! The blink backend: every program a resident kernel of one context; a load, upgrade or unload stops them all,
//! changes the modules, and relaunches them all.
//!
//! Why blink: `cuModuleLoadData` and `cuModuleUnload` in a context wait until every kernel running
//! in it has finished (measured on the H200: a load waited 1.9 s for a running kernel). So the JIT
//! links while everything runs, and only the module change itself happens with the kernels stopped.
//! Channel contents and slot state live in the mailbox and survive a blink untouched.

use std::time::{Duration, Instant};

use mesh_backend::{
    Backend, BackendError, ImageKind, IsolationMode, LaunchShape, ProgramSpec, ProgramState, ProgramStatus, Result,
};
use mesh_shm::Mailbox;
use mesh_shm::layout::STATE_EXITED;

use crate::context::{Context, Stream, StreamState};
use crate::device::Device;
use crate::jit::Jit;
use crate::memory::RegisteredMailbox;
use crate::module::{FunctionAttributes, Module};
use std::sync::Arc;

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

/// A loaded program.
#[derive(Debug)]
struct Program {
    name: String,
    slot: u32,
    kind: ImageKind,
    shape: LaunchShape,
    module: Module,
    /// `mesh_main` of `module`, looked up once (a relaunch is on every program's pause).
    entry: cudarc::driver::sys::CUfunction,
    stream: Stream,
    generation: u32,
    /// Share of the context's resident-block capacity the launch takes (blocks / (per-SM × SMs)).
    share: f64,
    /// Left stopped after an error (its kernel is not relaunched).
    parked: Option<String>,
}

// SAFETY: a program's handles are driver objects usable from any thread with the context current;
// the backend is driven from one thread at a time (`&mut self`).
unsafe impl Send for Program {}

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
    probes: std::collections::HashMap<(usize, LaunchShape), (FunctionAttributes, u32)>,
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
            probes: std::collections::HashMap::new(),
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
            .retain(|name| self.programs.iter().any(|p| &p.name == name && p.stream.state() == StreamState::Busy));
        // A fault is sticky: every later call in the context fails, so nothing but status and shutdown can work.
        let faulted: Vec<String> = self
            .programs
            .iter()
            .filter_map(|p| match p.stream.state() {
                StreamState::Failed(why) => Some(format!("{} ({why})", p.name)),
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

    fn index_of(&self, name: &str) -> Result<usize> {
        self.programs.iter().position(|p| p.name == name).ok_or_else(|| BackendError::NoSuchProgram(name.to_string()))
    }

    /// Asks every running program to stop and waits for all, up to the deadline.
    /// On timeout, relaunches those that did stop, records the others as stuck, and refuses.
    fn stop_all(&mut self, started: Instant) -> Result<()> {
        for p in &self.programs {
            if p.parked.is_none() {
                self.mailbox.slot(p.slot).map_err(mb)?.request_stop();
            }
        }
        let deadline = started + self.config.stop_deadline;
        loop {
            let busy: Vec<usize> =
                (0..self.programs.len()).filter(|&i| self.programs[i].stream.state() == StreamState::Busy).collect();
            if busy.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let names: Vec<String> = busy.iter().map(|&i| self.programs[i].name.clone()).collect();
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

    /// Relaunches every program not in `skip` and not parked, each with its generation bumped.
    fn relaunch_all(&mut self, skip: &[usize]) -> Result<()> {
        let base = self.device_base();
        self.ctx.bind()?;
        let mut first_err = None;
        for i in 0..self.programs.len() {
            if skip.contains(&i) || self.programs[i].parked.is_some() {
                continue;
            }
            if let Err(e) = self.launch(i, base) {
                self.programs[i].parked = Some(e.to_string());
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn launch(&mut self, i: usize, base: u64) -> Result<()> {
        let p = &mut self.programs[i];
        p.generation += 1;
        let slot = self.mailbox.slot(p.slot).map_err(mb)?;
        slot.arm(p.generation);
        let ctx = self.mailbox.mesh_ctx(p.slot, base).map_err(mb)?;
        // SAFETY: `entry` is mesh_main of `p.module`, which `p` keeps loaded; `relaunch_all` made
        // the backend's context, which is also the stream's, current on this thread.
        unsafe { crate::module::launch_raw(p.entry, &p.shape, &p.stream, &ctx) }
    }

    /// kcheck: the module's `mesh_main` and how much of the GPU the launch would hold resident.
    fn probe(
        &mut self,
        name: &str,
        module: &Module,
        cubin: &Arc<Vec<u8>>,
        shape: &LaunchShape,
        replacing: Option<usize>,
    ) -> Result<(f64, cudarc::driver::sys::CUfunction)> {
        let func = module
            .function("mesh_main")
            .map_err(|e| BackendError::NoEntry { program: name.to_string(), detail: e.to_string() })?;
        // The JIT's cache keeps each cubin alive, so its address identifies it for as long as it is cached.
        let key = (Arc::as_ptr(cubin) as usize, *shape);
        let (attrs, per_sm) = match self.probes.get(&key) {
            Some(&hit) => hit,
            None => {
                let figures = (func.attributes()?, func.max_active_blocks_per_sm(shape)?);
                self.probes.insert(key, figures);
                figures
            }
        };
        if shape.threads_per_block() > u64::from(attrs.max_threads_per_block) {
            return Err(BackendError::NotResident {
                program: name.to_string(),
                detail: format!(
                    "{} threads per block, mesh_main allows {} ({} registers per thread)",
                    shape.threads_per_block(),
                    attrs.max_threads_per_block,
                    attrs.registers
                ),
            });
        }
        let sms = self.ctx.sms();
        let capacity = u64::from(per_sm) * u64::from(sms);
        let held: f64 = self
            .programs
            .iter()
            .enumerate()
            .filter(|(i, p)| Some(*i) != replacing && p.parked.is_none())
            .map(|(_, p)| p.share)
            .sum();
        let share = if capacity == 0 { f64::INFINITY } else { shape.blocks() as f64 / capacity as f64 };
        if held + share > 1.0 + 1e-9 {
            return Err(BackendError::NotResident {
                program: name.to_string(),
                detail: format!(
                    "{} blocks of {} threads ({} registers, {} B static + {} B dynamic shared memory each): {per_sm} fit per SM, {capacity} on the context's {sms} SMs, so the launch needs {:.1}% of the GPU while the resident programs hold {:.1}%",
                    shape.blocks(),
                    shape.threads_per_block(),
                    attrs.registers,
                    attrs.shared_bytes,
                    shape.shared_mem,
                    share * 100.0,
                    held * 100.0
                ),
            });
        }
        Ok((share, func.raw()))
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
        let slot = self.mailbox.slot(p.slot).ok();
        let snapshot = slot.map(|s| s.status());
        let exit_code = snapshot.filter(|s| s.state == STATE_EXITED).map(|s| s.exit_code);
        let state = ProgramState::of_kernel(p.stream.state().into(), p.parked.as_deref(), exit_code);
        ProgramStatus {
            name: p.name.clone(),
            slot: p.slot,
            state,
            generation: p.generation,
            heartbeat: snapshot.map_or(0, |s| s.heartbeat),
            worker_pid: None,
            sms: self.ctx.is_green().then(|| self.ctx.sms()),
            shape: p.shape,
            kind: p.kind,
        }
    }
}

fn mb(e: mesh_shm::ShmError) -> BackendError {
    BackendError::Mailbox(e.to_string())
}

impl Backend for BlinkBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
    }

    fn load(&mut self, spec: ProgramSpec) -> Result<ProgramStatus> {
        self.ready()?;
        spec.validate()?;
        if self.programs.iter().any(|p| p.name == spec.name) {
            return Err(BackendError::AlreadyLoaded(spec.name));
        }
        if spec.sms.is_some_and(|n| Some(n) != self.config.sms) {
            return Err(BackendError::Invalid {
                what: format!("program {:?}", spec.name),
                reason: "a per-program SM count needs --isolation mps; in blink mode --sms applies to all programs"
                    .into(),
            });
        }
        let mut bindings = Vec::with_capacity(spec.bindings.len());
        for channel in &spec.bindings {
            bindings.push(self.mailbox.channel(channel).map_err(mb)?.index);
        }
        let taken: Vec<u32> = self.programs.iter().map(|p| p.slot).collect();
        let count = self.mailbox.geometry().slot_count;
        let slot = (0..count).find(|s| !taken.contains(s)).ok_or_else(|| {
            BackendError::Mailbox(format!("all {count} program slots are in use (create the mailbox with more slots)"))
        })?;
        // Link while everything runs; only the module load happens inside the blink.
        let linked = self.jit.link(&spec.name, spec.image, spec.kind)?;
        let stream = self.ctx.stream()?;
        let name = spec.name.clone();
        let shape = spec.shape;
        let status = self.blink(|me| {
            let module = Module::load(&me.ctx, &linked.cubin)?;
            let (share, entry) = me.probe(&name, &module, &linked.cubin, &shape, None)?;
            let s = me.mailbox.slot(slot).map_err(mb)?;
            s.bind(&name, &bindings).map_err(mb)?;
            s.reset_status();
            me.programs.push(Program {
                name: name.clone(),
                slot,
                kind: spec.kind,
                shape,
                module,
                entry,
                stream,
                generation: 0,
                share,
                parked: None,
            });
            Ok(())
        });
        status?;
        let p = self.programs.last().expect("just pushed");
        Ok(self.status_of(p))
    }

    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus> {
        self.ready()?;
        let i = self.index_of(name)?;
        let kind = ImageKind::detect_for(name, &image)?;
        let linked = self.jit.link(name, image, kind)?;
        self.blink(|me| {
            let module = Module::load(&me.ctx, &linked.cubin)?;
            let shape = me.programs[i].shape;
            let (share, entry) = me.probe(name, &module, &linked.cubin, &shape, Some(i))?;
            let p = &mut me.programs[i];
            p.entry = entry;
            // The old module is unloaded here (its kernel is stopped, so the unload does not wait).
            p.module = module;
            p.kind = kind;
            p.share = share;
            p.parked = None;
            Ok(())
        })?;
        Ok(self.status_of(&self.programs[i]))
    }

    fn unload(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        let i = self.index_of(name)?;
        self.blink(|me| {
            let p = me.programs.remove(i);
            me.mailbox.slot(p.slot).map_err(mb)?.release();
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
            if let Ok(s) = self.mailbox.slot(p.slot) {
                s.request_stop();
            }
        }
        let deadline = Instant::now() + self.config.stop_deadline;
        while Instant::now() < deadline && self.programs.iter().any(|p| p.stream.state() == StreamState::Busy) {
            std::thread::sleep(Duration::from_micros(50));
        }
        let stuck: Vec<String> =
            self.programs.iter().filter(|p| p.stream.state() == StreamState::Busy).map(|p| p.name.clone()).collect();
        for p in self.programs.drain(..) {
            if let Ok(s) = self.mailbox.slot(p.slot) {
                s.release();
            }
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
