//! meshd's backend contract: what a backend (blink or MPS) is asked to do, what it reports, and how it refuses.
//!
//! * [`Backend`]: load / upgrade / unload / status / shutdown, and `host_atomics()`.
//! * [`ProgramSpec`], [`ProgramStatus`], [`IsolationMode`], [`ImageKind`], [`LaunchShape`].
//! * [`BackendError`]: one variant for each refusal the seed names, each carrying its numbers or log.
//! * What blink and MPS share, once: [`Life`] (a program's life as a state machine: loaded →
//!   running → stopping → stopped / faulted → relaunched), [`residency`] (kcheck's arithmetic, with
//!   the SM counts it divides by made explicit), [`roster`] (what each backend keeps about a
//!   program, and the look-ups over all of them).
//! * [`watch`]: the watchdog's reasoning (health records, naming a fault's culprit, the search by halves).
//! * [`recover`]: the one recovery from a GPU fault, driven through a backend's [`Recovery`].
//! * [`pid_lock`]: the flock-and-pid claim a live meshd holds on its mailbox and its MPS directory.
//! * [`cleanup`]: the process-wide registry of actions run once, newest first, at exit (meshd runs
//!   it on its own way out, signals included).

pub mod cleanup;
mod error;
pub mod event;
pub mod fds;
mod handover;
pub mod life;
pub mod pid_lock;
pub mod pool;
pub mod recover;
pub mod recovering;
pub mod residency;
pub mod roster;
mod spec;
pub mod watch;

pub use error::{BackendError, Result};
pub use event::{BackendEvent, RecoveryMethod, RecoveryOutcome};
pub use handover::Handover;
pub use life::{Life, Phase};
pub use recover::Recovery;
pub use recovering::{BoardView, InProgress, RecoveryBoard};
pub use residency::{KernelFigures, SmBudget, check_resident};
pub use roster::{HasCore, ProgramCore, SlotReading};
pub use spec::{ImageKind, IsolationMode, KernelRun, LaunchShape, ProgramSpec, ProgramState, ProgramStatus};
pub use watch::{Cause, Evidence, FaultNote, Health, Verdict};

/// Wakes meshd's backend thread (a backend calls it from any thread when it has news to act on).
pub type Waker = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A backend hosts resident GPU programs. All calls come from meshd's control thread.
pub trait Backend: Send {
    /// Which isolation the backend gives.
    fn mode(&self) -> IsolationMode;

    /// Compiles, checks and launches a new program. A refusal leaves every running program as it was.
    fn load(&mut self, spec: ProgramSpec) -> Result<ProgramStatus>;

    /// Replaces a running program's image, keeping its slot, channels and messages.
    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus>;

    /// Stops a program and frees its slot.
    fn unload(&mut self, name: &str) -> Result<()>;

    /// Every loaded program, in load order. Read-only: it never recovers or relaunches anything.
    fn status(&self) -> Vec<ProgramStatus>;

    /// The watchdog's tick (meshd calls it every few tens of milliseconds, with no request): polls
    /// what is cheap to poll (streams in blink mode, workers in MPS mode) and, when a program faulted
    /// or vanished, recovers: the culprit left stopped, the others relaunched. Returns what it saw and
    /// did, a line each for meshd's log; empty when nothing changed (else the caller publishes a fresh
    /// status at once). The default polls nothing.
    fn watch(&mut self) -> Vec<String> {
        Vec::new()
    }

    /// Gives the backend a way to wake meshd's backend thread, so that news a backend receives
    /// without being asked (MPS workers push their kernels' ends) is acted on at once rather than at
    /// the next tick. The default ignores it (blink mode polls its streams on the tick).
    fn set_waker(&mut self, _wake: Waker) {}

    /// Gives the backend meshd's [`RecoveryBoard`]: the backend marks a recovery in place as begun
    /// the moment it notices the fault or the death (before it takes its own lock or makes any GPU
    /// call), each program as it is relaunched, and the end; `ps`, `/readyz` and `/metrics` read the
    /// board without waiting for the backend. The default ignores it (a backend that never recovers
    /// in place).
    fn set_recovery_board(&mut self, _board: RecoveryBoard) {}

    /// The worker pool's figures (MPS mode), a handle meshd reads whenever `info` asks, without
    /// waiting for the backend. The default has no pool.
    fn pool(&self) -> Option<pool::PoolFigures> {
        None
    }

    /// The pending request to replace the process after a sticky fault, taken (so that it is acted
    /// on once; a later request replaces an earlier one not yet taken). The default has none.
    fn take_replacement(&mut self) -> Option<watch::Replacement> {
        None
    }

    /// Channel `index` of the mailbox was deleted (no program bound it): the backend lets go of
    /// what it held for it, a device ring's GPU memory, so that the memory is not held for ever and a
    /// channel created later at that index gets a ring of its own size. Called on meshd's control
    /// thread right after the mailbox unpublished the channel, before any later change. The default
    /// holds nothing per channel.
    fn channel_deleted(&mut self, _index: u32) {}

    /// Stops every program and releases the GPU; later calls are refused.
    fn shutdown(&mut self) -> Result<()>;

    /// Readies the programs for a new image of meshd that replaces this process (`meshd handoff`):
    /// later calls are refused. The default stops every program in order ([`Backend::shutdown`]),
    /// and the new image relaunches them from the state directory: one blink. A backend whose
    /// programs can outlive meshd's process lets them run on for the new image to adopt.
    fn hand_over(&mut self) -> Result<Handover> {
        self.shutdown()?;
        Ok(Handover::Stopped)
    }

    /// Whether host and device may share atomics on one word (`HOST_NATIVE_ATOMIC_SUPPORTED`).
    fn host_atomics(&self) -> bool;

    /// What the backend did since the last call that meshd's metrics count (blink pauses,
    /// recoveries in place), oldest first; each event is handed over once. The default has none.
    fn take_events(&mut self) -> Vec<BackendEvent> {
        Vec::new()
    }
}
