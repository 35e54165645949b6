//! The change worker: the backend thread, which opens the backend, applies changes one at a
//! time in arrival order and, between them, runs the watchdog.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mesh_backend::{Backend, ImageKind, IsolationMode, LaunchShape, ProgramSpec, ProgramState, ProgramStatus};
use mesh_shm::Mailbox;

use super::jobs::{Change, Job};
use super::natives::native_spawn;
use super::services;
use super::shared::{Shared, Snapshot};
use crate::protocol::{HELD_SLOT, ProgramRow, Response};
pub(super) use crate::replace::unix_ms;
use crate::replace::{Search, mono_ns};
use crate::state::{Recorded, RecordedNative, StateStore};

/// What replaces the process: with `None` a new image of this binary ([`crate::replace::exec_self`],
/// after a sticky fault), with a path that binary ([`crate::replace::exec`], `meshd handoff`).
/// Returns only when that failed, with why.
pub type Replacer = Box<dyn FnMut(Option<&std::path::Path>) -> std::io::Error + Send>;

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

pub(super) type Ready = mpsc::SyncSender<Result<(usize, usize)>>;

/// The backend thread: open, relaunch what is recorded, then apply changes until shutdown.
/// Returns whether every program stopped.
pub(super) fn backend_thread<F>(
    shared: &Shared,
    open: F,
    state: Option<StateStore>,
    replacer: Replacer,
    jobs: &mpsc::Receiver<Job>,
    wake_jobs: std::sync::Weak<mpsc::Sender<Job>>,
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
    // At once, before the relaunch of the recorded programs (a fault during it is a recovery too).
    backend.set_recovery_board(shared.board.clone());
    {
        let mut s = shared.snapshot.lock();
        *s = Arc::new(Snapshot {
            programs: backend.status(),
            mode: backend.mode(),
            device,
            host_atomics: backend.host_atomics(),
            pool: backend.pool(),
        });
    }
    if backend.mode() == IsolationMode::Mps {
        shared.natives.set_membership(Arc::new(crate::native::MpsMembership));
    }
    // One Wake in the queue at a time: news that comes while one waits is seen by the watchdog pass
    // it brings (the pass clears the flag before it looks), so a burst of news during a long load
    // does not queue one full pass per piece.
    let wake_pending = Arc::new(AtomicBool::new(false));
    let pending = wake_pending.clone();
    backend.set_waker(Arc::new(move || {
        if !pending.swap(true, Ordering::AcqRel)
            && let Some(jobs) = wake_jobs.upgrade()
        {
            let _ = jobs.send(Job::Wake);
        }
    }));
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
        natives_restarted: false,
        wake_pending,
        handed_over: None,
    };
    // Read before the relaunch, whose publishing records the (still empty) table of native workers.
    let natives = worker.state.as_ref().map(|s| s.recorded().natives.clone()).unwrap_or_default();
    let relaunched = worker.relaunch();
    worker.respawn_natives(natives);
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
pub(super) struct Held {
    pub(super) name: String,
    pub(super) why: String,
    /// It caused a GPU fault (`ps`: faulted); else only stopped.
    pub(super) culprit: bool,
    pub(super) kind: ImageKind,
}

pub(super) struct BackendWorker<'a> {
    pub(super) backend: &'a mut dyn Backend,
    pub(super) shared: &'a Shared,
    pub(super) state: Option<StateStore>,
    /// The key of the stored linked images.
    pub(super) arch: Option<String>,
    /// Recorded programs not in the backend, in record order.
    pub(super) held: Vec<Held>,
    /// The image kind `ps` shows for programs relaunched from a stored linked image (the backend
    /// was given the cubin).
    pub(super) kinds: HashMap<String, ImageKind>,
    /// A culprit search's question being watched, since when.
    pub(super) search: Option<(Search, Instant)>,
    pub(super) replacer: Replacer,
    /// When the backend was open (`CLOCK_MONOTONIC` ns), for the recovery's log.
    pub(super) opened_mono_ns: u64,
    /// The recorded native workers have been started again: until then the table is not yet the
    /// desired state, and recording it would forget them (a crash during the relaunch).
    pub(super) natives_restarted: bool,
    /// A Wake is queued (set by the backend's waker, cleared by the pass it brings).
    pub(super) wake_pending: Arc<AtomicBool>,
    /// The programs were handed over to a new image that could not be executed: why every change
    /// is refused from then on.
    pub(super) handed_over: Option<String>,
}

pub(super) fn ms_between(from_ns: u64, to_ns: u64) -> f64 {
    to_ns.saturating_sub(from_ns) as f64 / 1e6
}

impl BackendWorker<'_> {
    pub(super) fn publish(&mut self) {
        if let Some(s) = &self.state {
            let exempt = s.recorded().programs.iter().filter(|p| p.no_readiness);
            self.shared.metrics.set_exempt(exempt.map(|p| p.name.as_str()));
        }
        self.shared.publish(self.statuses());
        self.record_natives();
    }

    /// Keeps the native workers meshd wants running in the desired state, so that a restart (after
    /// a crash, or a clean stop with the state kept) starts them again. Not while stopping: a
    /// shutdown ends them, and what was wanted before it is what a later start wants.
    fn record_natives(&mut self) {
        if self.shared.stopping.load(Ordering::Acquire) || !self.natives_restarted {
            return;
        }
        let mut wanted: Vec<RecordedNative> = self
            .shared
            .natives
            .wanted_with_process()
            .iter()
            .map(|(spec, process)| RecordedNative::running(spec, *process))
            .collect();
        wanted.sort_by(|a, b| a.name.cmp(&b.name));
        self.record(|s| s.record_natives(wanted));
    }

    /// Starts again the native workers the desired state lists (after the programs are relaunched,
    /// so that their channels' GPU ends run); each outcome goes to the log.
    fn respawn_natives(&mut self, recorded: Vec<RecordedNative>) {
        for n in recorded {
            // Outliving meshd, one that still runs is adopted rather than started twice.
            if let Some((pid, ticks)) = n.process.filter(|_| self.shared.natives.outlive()) {
                match self.shared.natives.adopt(&n.spec(), pid, ticks) {
                    Ok(_) => continue,
                    Err(why) => {
                        tracing::warn!(native = %n.name, "native worker not adopted: {why}; started again")
                    }
                }
            }
            let (reply, outcome) = mpsc::sync_channel(1);
            native_spawn(self.shared, n.spec(), reply);
            let name = n.name.clone();
            let logged =
                std::thread::Builder::new().name("meshd-native-restart".into()).spawn(move || match outcome.recv() {
                    Ok(r) if r.ok => {
                        tracing::info!(native = %name, "native worker started again from the desired state")
                    }
                    Ok(r) => tracing::error!(
                        native = %name,
                        "native worker from the desired state not started again: {}",
                        r.error.unwrap_or_default()
                    ),
                    Err(_) => {}
                });
            if let Err(e) = logged {
                tracing::warn!("no thread to log a native worker's restart: {e}");
            }
        }
        // Each is in the table now (starting): from here on the table is the desired state.
        self.natives_restarted = true;
        self.record_natives();
    }

    /// What `ps` shows: the backend's programs with what the state carries across replacements
    /// (restarts added, the last fault where the backend saw none), then the programs held back.
    pub(super) fn statuses(&self) -> Vec<ProgramStatus> {
        let recorded = self.state.as_ref().map(StateStore::recorded);
        let carried = |name: &str| recorded.and_then(|r| r.carried.get(name));
        let mut rows = self.backend.status();
        for r in &mut rows {
            if let Some(kind) = self.kinds.get(&r.name) {
                r.kind = *kind;
            }
            if let Some(c) = carried(&r.name) {
                // Saturating: the carried count comes from `state.json`, which may hold any u32.
                r.restarts = r.restarts.saturating_add(c.restarts);
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
                adopted: false,
            });
        }
        rows
    }

    pub(super) fn is_held(&self, name: &str) -> bool {
        self.held.iter().any(|h| h.name == name)
    }

    pub(super) fn unhold(&mut self, name: &str) {
        self.held.retain(|h| h.name != name);
    }

    /// Holds `p` back (not loaded), with `why`.
    pub(super) fn hold(&mut self, p: &Recorded, why: String, culprit: bool) {
        let kind = self.state.as_ref().and_then(|s| s.spec_of(p).ok()).map_or(ImageKind::Ptx, |s| s.kind);
        self.unhold(&p.name);
        self.held.push(Held { name: p.name.clone(), why, culprit, kind });
    }

    /// Loads the recorded `p`: from its stored linked image where there is one for this GPU (no
    /// link), else from its image.
    pub(super) fn load_recorded(&mut self, p: &Recorded) -> Result<ProgramStatus> {
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
    pub(super) fn count_restarts(&mut self, names: &[String]) {
        self.record(|s| {
            s.update(|st| {
                for n in names {
                    // Saturating, as `statuses` adds it: the count was read from `state.json`.
                    let c = st.carried.entry(n.clone()).or_default();
                    c.restarts = c.restarts.saturating_add(1);
                }
            })
        });
    }

    /// Applies changes in arrival order until a shutdown, and between them runs the watchdog every
    /// [`Limits::watch`] (publishing at once when it changed something, else every
    /// [`Limits::refresh`]); returns whether every program stopped.
    fn serve(&mut self, jobs: &mpsc::Receiver<Job>) -> bool {
        let limits = self.shared.limits;
        let tick = limits.watch.min(Duration::from_millis(50));
        let mut next_publish = Instant::now() + limits.refresh;
        loop {
            self.shared.metrics.backend_pass();
            let job = jobs.recv_timeout(tick);
            if !matches!(job, Err(mpsc::RecvTimeoutError::Timeout) | Ok(Job::Wake)) {
                next_publish = Instant::now() + limits.refresh;
            }
            match job {
                Ok(Job::Spawn { spec, reply }) => native_spawn(self.shared, spec, reply),
                Ok(Job::RecordNatives { done }) => {
                    self.record_natives();
                    let _ = done.send(());
                }
                Ok(Job::Change { change, image, reply }) => {
                    let response = if self.shared.stopping.load(Ordering::Acquire) {
                        Response::error("meshd is shutting down")
                    } else if let Some(why) = &self.handed_over {
                        Response::error(why)
                    } else if let Some((s, _)) = &self.search {
                        Response::error(format!(
                            "meshd is searching the culprit of a GPU fault by halves (question {}); try again in a \
                             moment",
                            s.answers.len() + 1
                        ))
                    } else {
                        self.change(change, image)
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
                Ok(Job::Handoff { binary, reply }) => self.handoff(binary, &reply),
                Ok(Job::Wake) => self.wake_pending.store(false, Ordering::Release),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.shutdown(),
            }
            let stopping = self.shared.stopping.load(Ordering::Acquire);
            let seen = if stopping { Vec::new() } else { self.backend.watch() };
            for line in &seen {
                tracing::warn!(target: "watchdog", "{line}");
            }
            self.shared.metrics.backend_events(self.backend.mode(), self.backend.take_events());
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
    fn change(&mut self, change: Change, image: Vec<u8>) -> Response {
        let (what, op) = (describe(&change), change.op());
        let started = Instant::now();
        let result = self.apply(change, image);
        let backend_us = Some(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
        self.shared.metrics.change_done(Some(op), result.is_ok(), started.elapsed());
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

    fn apply(&mut self, change: Change, image: Vec<u8>) -> Result<Response> {
        match change {
            Change::Load { name, grid, block, shared_mem, bind, sms, no_readiness } => {
                let mut spec = ProgramSpec::new(&name, image)?;
                spec.shape = LaunchShape { grid, block, shared_mem };
                spec.bindings = bind;
                spec.sms = sms;
                let record = Recorded { no_readiness, ..Recorded::of(&spec) };
                let status = self.backend.load(spec.clone())?;
                tracing::info!(program = %name, slot = status.slot, "loaded");
                self.record(|s| s.record_load(record, &spec.image));
                // A program left stopped of that name is replaced by this one.
                self.unhold(&name);
                self.kinds.remove(&name);
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Change::Upgrade { name } if self.is_held(&name) => {
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
            Change::Unload { name } if self.is_held(&name) => {
                tracing::info!(program = %name, "unloaded (it was left stopped)");
                self.record(|s| s.record_unload(&name));
                self.unhold(&name);
                self.shared.board.forget(&name);
                Ok(Response::ok())
            }
            Change::Upgrade { name } => {
                self.kinds.remove(&name);
                let status = self.backend.upgrade(&name, image.clone())?;
                tracing::info!(program = %name, generation = status.generation, "upgraded");
                self.record(|s| s.record_upgrade(&name, &image));
                Ok(Response { ok: true, programs: Some(vec![ProgramRow::from(&status)]), ..Response::default() })
            }
            Change::Unload { name } => {
                self.kinds.remove(&name);
                self.backend.unload(&name)?;
                // Its restarts leave with it: a later program of that name starts from 0.
                self.shared.board.forget(&name);
                tracing::info!(program = %name, "unloaded");
                self.record(|s| s.record_unload(&name));
                Ok(Response::ok())
            }
            Change::ChannelCreate { name, msg_size, capacity, placement, protocol, parts } => {
                let placement = crate::placement::parse(&placement, self.backend.mode())?;
                let protocol = crate::placement::protocol(&protocol, msg_size)?;
                self.shared.mailbox.create_channel_parts(&name, msg_size, capacity, placement, protocol, parts)?;
                tracing::info!(channel = %name, msg_size, capacity, %placement, %protocol, parts, "channel created");
                let mailbox = self.shared.mailbox.clone();
                self.record(move |s| s.record_channels(&mailbox));
                Ok(Response::ok())
            }
            Change::ServiceCreate(spec) => {
                let made = services::create(&self.shared.mailbox, &spec);
                // Recorded whatever the outcome: a group that failed after its fan-in channel was
                // made leaves that channel, which the desired state must list like any other.
                let mailbox = self.shared.mailbox.clone();
                self.record(move |s| s.record_channels(&mailbox));
                made?;
                Ok(Response::ok())
            }
            Change::ChannelDelete { name, discard } => {
                self.refuse_unseen_binders(&name)?;
                let index = self.shared.mailbox.channel(&name)?.index;
                let discarded = self.shared.mailbox.delete_channel(&name, discard)?;
                // Before any later change: a channel created at that index gets a ring of its own.
                self.backend.channel_deleted(index);
                tracing::info!(channel = %name, discarded, "channel deleted");
                let mailbox = self.shared.mailbox.clone();
                self.record(move |s| s.record_channels(&mailbox));
                Ok(Response { ok: true, discarded: Some(discarded), ..Response::default() })
            }
            Change::ServiceDelete { name, discard } => {
                for part in [name.clone(), services::replies_name(&name)] {
                    self.refuse_unseen_binders(&part)?;
                }
                let indices: Vec<u32> = [name.clone(), services::replies_name(&name)]
                    .iter()
                    .filter_map(|c| self.shared.mailbox.channel(c).ok().map(|c| c.index))
                    .collect();
                let deleted = self.shared.services.delete(&name, discard);
                // Recorded whatever the outcome, as a creation is: the desired state lists what the
                // mailbox holds.
                let mailbox = self.shared.mailbox.clone();
                self.record(move |s| s.record_channels(&mailbox));
                let discarded = deleted?;
                for index in indices {
                    self.backend.channel_deleted(index);
                }
                tracing::info!(service = %name, discarded, "service deleted");
                Ok(Response { ok: true, discarded: Some(discarded), ..Response::default() })
            }
        }
    }

    /// Refuses to delete channel `name` while something meshd runs names it that no mailbox slot
    /// shows: a program left stopped (recorded, not in the backend: its relaunch would find the
    /// channel gone), or a native worker told of it (`MESH_CHANNELS`), which may not have claimed
    /// its end yet. A program in the backend binds it in its slot, which the mailbox checks.
    fn refuse_unseen_binders(&self, name: &str) -> Result<()> {
        let recorded = self.state.as_ref().map(|s| &s.recorded().programs);
        let binds = |program: &str| {
            recorded
                .and_then(|r| r.iter().find(|p| p.name == program))
                .is_some_and(|p| p.bindings.iter().any(|b| b == name))
        };
        if let Some(h) = self.held.iter().find(|h| binds(&h.name)) {
            anyhow::bail!(
                "channel {name:?}: in use: program {:?}, left stopped, binds it (unload the program first)",
                h.name
            );
        }
        if let Some(n) = self.shared.natives.wanted().into_iter().find(|n| n.bind.iter().any(|b| b == name)) {
            anyhow::bail!(
                "channel {name:?}: in use: native worker {:?} was started bound to it (`meshd stop {}` first)",
                n.name,
                n.name
            );
        }
        Ok(())
    }

    /// Writes a change to the state directory; a failure is logged, the change stands (the GPU has it).
    pub(super) fn record(&mut self, f: impl FnOnce(&mut StateStore) -> Result<()>) {
        if let Some(state) = &mut self.state
            && let Err(e) = f(state)
        {
            tracing::error!("recording the desired state in {}: {e:#}", state.dir().display());
        }
    }
}

/// How a request is named in the log.
fn describe(change: &Change) -> String {
    match change {
        Change::Load { name, .. } => format!("load {name:?}"),
        Change::Upgrade { name } => format!("upgrade {name:?}"),
        Change::Unload { name } => format!("unload {name:?}"),
        Change::ChannelCreate { name, .. } => format!("channel create {name:?}"),
        Change::ServiceCreate(spec) => format!("service create {:?}", spec.name),
        Change::ChannelDelete { name, .. } => format!("channel delete {name:?}"),
        Change::ServiceDelete { name, .. } => format!("service delete {name:?}"),
    }
}

/// An error's text without a leading "refused: ": the answer is a refusal already, and the log line
/// and the CLI say so once (some backend errors carry the word in their own text).
pub(super) fn plain(e: &dyn std::fmt::Display) -> String {
    let text = format!("{e:#}");
    match text.strip_prefix("refused: ") {
        Some(rest) => rest.to_string(),
        None => text,
    }
}
