//! A backend without a GPU: programs kept in a list, each bound to a real mailbox slot, for testing the control plane and host clients anywhere.
//!
//! meshd's CPU tests and the Python package's Rust peer serve the real control socket and mailbox
//! over it: every request meshd answers (channels, load, upgrade, unload, `ps`, metrics) takes its
//! real path, and only the kernels are missing (a "running" program never moves a message).
//! A [`RecoveryKnob`] makes its `watch` act out a long recovery in place, as the MPS backend's
//! is: the board marked first, then one long call, each program relaunched, the board cleared.
//! A [`DeletedChannels`] list records every deleted channel meshd tells the backend of (where a
//! real backend frees a device ring's GPU memory). [`StandInBackend::adopting`] models MPS mode
//! under an orphan grace: the programs a killed meshd left in their slots run on, and the
//! relaunch takes each over by name in its slot at its generation, without a launch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_backend::{
    Backend, BackendError, BackendEvent, IsolationMode, ProgramSpec, ProgramState, ProgramStatus, RecoveryBoard,
};
use mesh_shm::Mailbox;
use parking_lot::{Condvar, Mutex};

/// Programs in a list, each bound to a free mailbox slot as a real backend binds it (its channels
/// named in the slot, the slot armed at generation 1). Blink mode, no host atomics.
#[derive(Debug)]
pub struct StandInBackend {
    mailbox: Mailbox,
    programs: Vec<ProgramStatus>,
    /// meshd's board ([`Backend::set_recovery_board`]); a private one until meshd gives its own.
    board: RecoveryBoard,
    knob: RecoveryKnob,
    deleted: DeletedChannels,
    /// Programs a previous meshd left running in their slots that no relaunch has claimed yet
    /// ([`StandInBackend::adopting`]).
    orphans: Vec<Orphan>,
    /// Adoptions for meshd's metrics ([`Backend::take_events`]).
    events: Vec<BackendEvent>,
}

/// A program a previous meshd left in its slot: its name, slot and generation as the slot says.
#[derive(Debug)]
struct Orphan {
    name: String,
    slot: u32,
    generation: u32,
}

/// The channels meshd told the stand-in were deleted ([`Backend::channel_deleted`]), by table index,
/// in order. Cheap to clone; a test keeps one to see what the backend was told.
#[derive(Debug, Clone, Default)]
pub struct DeletedChannels(Arc<Mutex<Vec<u32>>>);

impl DeletedChannels {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// The indices recorded so far, oldest first.
    pub fn indices(&self) -> Vec<u32> {
        self.0.lock().clone()
    }
}

/// What a test arms for the stand-in's next `watch`: a recovery in place that holds the backend
/// thread, as a real one does for up to seconds. Cheap to clone; the test keeps one.
#[derive(Debug, Clone, Default)]
pub struct RecoveryKnob(Arc<(Mutex<Knob>, Condvar)>);

#[derive(Debug, Default)]
struct Knob {
    /// The next recovery's reason and how long it may hold each program at most.
    armed: Option<(String, Duration)>,
    /// Relaunches the test allowed before their time ([`RecoveryKnob::step`]).
    steps: u32,
}

impl RecoveryKnob {
    /// A knob with nothing armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `watch` begins a recovery in place from `reason` (the board marked for every
    /// program), then relaunches the programs one at a time, in load order, each at a
    /// [`step`](Self::step) or once `hold` has passed since the recovery began, whichever is first;
    /// then it ends the recovery. The backend thread is inside that one call throughout.
    pub fn fault(&self, reason: impl Into<String>, hold: Duration) {
        let (knob, _) = &*self.0;
        let mut k = knob.lock();
        k.armed = Some((reason.into(), hold));
        k.steps = 0;
    }

    /// Lets the recovery under way relaunch its next program now.
    pub fn step(&self) {
        let (knob, woken) = &*self.0;
        knob.lock().steps += 1;
        woken.notify_all();
    }

    fn take(&self) -> Option<(String, Duration)> {
        self.0.0.lock().armed.take()
    }

    /// Waits for a step (taking it) or for `deadline`.
    fn next(&self, deadline: Instant) {
        let (knob, woken) = &*self.0;
        let mut k = knob.lock();
        while k.steps == 0 {
            if woken.wait_until(&mut k, deadline).timed_out() {
                return;
            }
        }
        k.steps -= 1;
    }
}

impl StandInBackend {
    /// A stand-in binding programs in `mailbox`.
    pub fn new(mailbox: &Mailbox) -> Self {
        Self {
            mailbox: mailbox.clone(),
            programs: Vec::new(),
            board: RecoveryBoard::new(),
            knob: RecoveryKnob::new(),
            deleted: DeletedChannels::new(),
            orphans: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Adopting what a killed meshd left (the mailbox claimed for adoption, its slots as they
    /// were): every slot in use with a program's name and no stop asked runs on. The relaunch's
    /// load of that name takes it over in its slot at its generation (`adopted` in `ps`, no launch);
    /// the first watch after it stops those no load claimed and frees their slots.
    pub fn adopting(mut self) -> Self {
        let slots = self.mailbox.geometry().slot_count;
        self.orphans = (0..slots)
            .filter_map(|slot| {
                let s = self.mailbox.slot(slot).ok()?;
                let name = s.name();
                (s.in_use() && !name.is_empty() && !s.stop_requested() && s.generation() > 0).then(|| Orphan {
                    name,
                    slot,
                    generation: s.generation(),
                })
            })
            .collect();
        self
    }

    /// With `deleted`, which a test keeps to see the channels meshd said were deleted.
    pub fn with_deleted_channels(mut self, deleted: DeletedChannels) -> Self {
        self.deleted = deleted;
        self
    }

    /// With `knob`, which a test keeps to act out a long recovery in place in `watch`.
    pub fn with_recovery_knob(mut self, knob: RecoveryKnob) -> Self {
        self.knob = knob;
        self
    }

    /// The programs' statuses, to change as a backend's recovery would (tests of the watchdog).
    pub fn programs_mut(&mut self) -> &mut [ProgramStatus] {
        &mut self.programs
    }

    /// Takes `orphan` over for `spec` (its relaunch): its slot and generation as they are.
    fn adopt(&mut self, orphan: Orphan, spec: ProgramSpec) -> ProgramStatus {
        tracing::info!(
            "stand-in: program {} adopted from the previous meshd: slot {}, generation {}",
            orphan.name,
            orphan.slot,
            orphan.generation
        );
        self.events.push(BackendEvent::Adoption { program: orphan.name.clone(), adopted: true });
        self.run(spec, orphan.slot, orphan.generation, true)
    }

    /// `spec` running in `slot` at `generation` (`adopted`, or launched here), added to the list.
    fn run(&mut self, spec: ProgramSpec, slot: u32, generation: u32, adopted: bool) -> ProgramStatus {
        let status = ProgramStatus {
            name: spec.name,
            slot,
            state: ProgramState::Running,
            generation,
            heartbeat: 0,
            worker_pid: None,
            sms: None,
            shape: spec.shape,
            kind: spec.kind,
            restarts: 0,
            last_fault: None,
            last_fault_unix_ms: None,
            stopped_why: None,
            adopted,
        };
        self.programs.push(status.clone());
        status
    }

    fn release(&self, slot: u32) {
        if let Ok(s) = self.mailbox.slot(slot) {
            s.release();
        }
    }

    /// The recovery the knob armed, if any: what a real backend does, minus the GPU.
    fn recover(&mut self, reason: String, hold: Duration) -> Vec<String> {
        let started = Instant::now();
        // Marked first, as a real backend marks it before it takes any lock or makes any GPU call.
        self.board.begin(reason.clone(), self.programs.iter().map(|p| p.name.clone()));
        let deadline = started + hold;
        for p in &mut self.programs {
            self.knob.next(deadline);
            p.generation += 1;
            p.restarts += 1;
            p.state = ProgramState::Running;
            if let Ok(s) = self.mailbox.slot(p.slot) {
                s.reset_status();
                s.arm(p.generation);
            }
            self.board.relaunched(&p.name);
        }
        self.board.end();
        vec![format!(
            "stand-in: recovered in place from {reason}: {} program(s) relaunched in {:.1} ms",
            self.programs.len(),
            started.elapsed().as_secs_f64() * 1e3
        )]
    }
}

fn mailbox_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Mailbox(e.to_string())
}

impl Backend for StandInBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
    }

    fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
        spec.validate()?;
        if self.programs.iter().any(|p| p.name == spec.name) {
            return Err(BackendError::AlreadyLoaded(spec.name));
        }
        if let Some(at) = self.orphans.iter().position(|o| o.name == spec.name) {
            let orphan = self.orphans.swap_remove(at);
            return Ok(self.adopt(orphan, spec));
        }
        let taken: Vec<u32> = self.programs.iter().map(|p| p.slot).chain(self.orphans.iter().map(|o| o.slot)).collect();
        let Some(slot) = (0..self.mailbox.geometry().slot_count).find(|s| !taken.contains(s)) else {
            return Err(BackendError::Mailbox("all program slots are in use".into()));
        };
        let bindings = spec
            .bindings
            .iter()
            .map(|c| self.mailbox.channel_for_program(c).map(|c| c.index).map_err(mailbox_err))
            .collect::<Result<Vec<_>, _>>()?;
        let s = self.mailbox.slot(slot).map_err(mailbox_err)?;
        // As the GPU backends do: a program relaunched into its slot goes on from its generation.
        let generation = if s.name() == spec.name { s.generation() } else { 0 } + 1;
        s.bind(&spec.name, &bindings).map_err(mailbox_err)?;
        s.reset_status();
        s.arm(generation);
        Ok(self.run(spec, slot, generation, false))
    }

    fn upgrade(&mut self, name: &str, _image: Vec<u8>) -> mesh_backend::Result<ProgramStatus> {
        let p = self
            .programs
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| BackendError::NoSuchProgram(name.into()))?;
        // As the GPU backends do: the new image runs at the next generation of its slot.
        p.generation += 1;
        if let Ok(s) = self.mailbox.slot(p.slot) {
            s.reset_status();
            s.arm(p.generation);
        }
        Ok(p.clone())
    }

    fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
        let at = self
            .programs
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| BackendError::NoSuchProgram(name.into()))?;
        let p = self.programs.remove(at);
        self.release(p.slot);
        Ok(())
    }

    fn status(&self) -> Vec<ProgramStatus> {
        self.programs.clone()
    }

    fn watch(&mut self) -> Vec<String> {
        // The relaunch is over by the first watch: an orphan it did not claim stops now.
        let unclaimed: Vec<String> = std::mem::take(&mut self.orphans)
            .into_iter()
            .map(|o| {
                self.release(o.slot);
                self.events.push(BackendEvent::Adoption { program: o.name.clone(), adopted: false });
                format!("stand-in: program {} in slot {} not adopted: no recorded program claimed it", o.name, o.slot)
            })
            .collect();
        if !unclaimed.is_empty() {
            return unclaimed;
        }
        match self.knob.take() {
            Some((reason, hold)) => self.recover(reason, hold),
            None => Vec::new(),
        }
    }

    fn set_recovery_board(&mut self, board: RecoveryBoard) {
        self.board = board;
    }

    fn shutdown(&mut self) -> mesh_backend::Result<()> {
        for p in std::mem::take(&mut self.programs) {
            self.release(p.slot);
        }
        Ok(())
    }

    fn host_atomics(&self) -> bool {
        false
    }

    fn channel_deleted(&mut self, index: u32) {
        self.deleted.0.lock().push(index);
    }

    fn take_events(&mut self) -> Vec<BackendEvent> {
        std::mem::take(&mut self.events)
    }
}
