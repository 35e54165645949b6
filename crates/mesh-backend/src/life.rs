//! A program's life as one state machine that both backends drive: loaded → running → stopping →
//! stopped → relaunched, or faulted (left stopped with the reason) until a new image revives it.
//!
//! The machine records what meshd *did* (launched, asked to stop, saw it stop, gave up on it); what
//! the kernel is doing right now comes from the backend ([`KernelRun`]), and [`Life::state`]
//! combines the two into what `ps` shows. Keeping it in one place means blink and MPS agree on when
//! a generation is bumped and which programs a relaunch skips.

use std::fmt;

use crate::spec::{KernelRun, ProgramState};

/// Where a program stands in meshd's hands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Its image is loaded and its slot prepared; never launched.
    Loaded,
    /// Launched (its generation is the launch's); meshd has not asked it to stop.
    Running,
    /// Asked to stop through its slot; its kernel may still run (a blink's stuck program stays here).
    Stopping,
    /// Its kernel is known to be off the GPU; the next relaunch starts it again.
    Stopped,
    /// Left stopped after an error, with the reason: no relaunch starts it until a new image does.
    Faulted(String),
}

/// A transition the machine refuses: a bug in the backend, reported rather than acted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {event} a program that is {from}")]
pub struct IllegalTransition {
    /// What was asked.
    pub event: &'static str,
    /// The phase it was asked in.
    pub from: Phase,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Loaded => f.write_str("loaded"),
            Phase::Running => f.write_str("running"),
            Phase::Stopping => f.write_str("stopping"),
            Phase::Stopped => f.write_str("stopped"),
            Phase::Faulted(why) => write!(f, "faulted ({why})"),
        }
    }
}

/// A program's phase and launch count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Life {
    phase: Phase,
    generation: u32,
}

impl Default for Life {
    fn default() -> Self {
        Self::new()
    }
}

impl Life {
    /// A program just loaded: never launched, generation 0.
    pub fn new() -> Self {
        Self { phase: Phase::Loaded, generation: 0 }
    }

    /// A program just loaded whose launches go on from `generation` (its slot's, when a restarted
    /// meshd relaunches it): never launched by this process; the next launch is `generation + 1`.
    pub fn after(generation: u32) -> Self {
        Self { phase: Phase::Loaded, generation }
    }

    /// A program whose kernel a previous meshd launched as `generation` and which runs on: adopted
    /// by this one without a launch (running; the next launch is `generation + 1`).
    pub fn adopted(generation: u32) -> Self {
        Self { phase: Phase::Running, generation }
    }

    /// The phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Launches so far; the slot is armed with this before each launch.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Why the program was left stopped, if it was.
    pub fn faulted(&self) -> Option<&str> {
        match &self.phase {
            Phase::Faulted(why) => Some(why),
            _ => None,
        }
    }

    /// Whether a relaunch of every program starts this one (it is not left stopped).
    pub fn relaunchable(&self) -> bool {
        self.faulted().is_none()
    }

    /// (Re)launch: loaded or stopped → running, the generation bumped. Returns the generation to arm
    /// the slot with. A running or stopping kernel would then run twice in one slot, and a faulted
    /// program needs a new image first: both refused.
    pub fn launch(&mut self) -> Result<u32, IllegalTransition> {
        match self.phase {
            Phase::Loaded | Phase::Stopped => {
                self.generation += 1;
                self.phase = Phase::Running;
                Ok(self.generation)
            }
            _ => Err(IllegalTransition { event: "launch", from: self.phase.clone() }),
        }
    }

    /// A stop request was written to the slot: running → stopping (other phases stay).
    pub fn request_stop(&mut self) {
        if self.phase == Phase::Running {
            self.phase = Phase::Stopping;
        }
    }

    /// The kernel is off the GPU (it returned, or its worker is gone): running or stopping → stopped.
    /// A faulted program stays faulted; a loaded one was never launched and stays loaded.
    pub fn returned(&mut self) {
        if matches!(self.phase, Phase::Running | Phase::Stopping) {
            self.phase = Phase::Stopped;
        }
    }

    /// Leaves the program stopped with `why` (a failed relaunch, the culprit of a GPU fault).
    pub fn fault(&mut self, why: impl Into<String>) {
        self.phase = Phase::Faulted(why.into());
    }

    /// A new image replaced the old one, whose kernel is stopped: a faulted program may run again.
    pub fn new_image(&mut self) {
        if self.faulted().is_some() {
            self.phase = Phase::Stopped;
        }
    }

    /// What `ps` shows, given what the kernel is doing and the exit code it left in its slot.
    pub fn state(&self, run: KernelRun, exit_code: Option<i32>) -> ProgramState {
        ProgramState::of_kernel(run, self.faulted(), exit_code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_loaded_launched_stopped_and_relaunched_with_its_generation_bumped() {
        let mut life = Life::new();
        assert_eq!((life.phase(), life.generation()), (&Phase::Loaded, 0));
        assert_eq!(life.launch(), Ok(1));
        life.request_stop();
        assert_eq!(life.phase(), &Phase::Stopping);
        life.returned();
        assert_eq!(life.phase(), &Phase::Stopped);
        assert_eq!(life.launch(), Ok(2));
        assert_eq!(life.phase(), &Phase::Running);
        // A worker that died under a running kernel: stopped without a stop request.
        life.returned();
        assert_eq!(life.launch(), Ok(3));
    }

    #[test]
    fn a_running_or_stopping_kernel_is_never_launched_twice() {
        let mut life = Life::new();
        life.launch().unwrap();
        let err = life.launch().unwrap_err();
        assert_eq!(err.to_string(), "cannot launch a program that is running");
        life.request_stop();
        assert!(life.launch().is_err(), "still stopping: its kernel may run");
        assert_eq!(life.generation(), 1, "a refused launch bumps nothing");
        let mut adopted = Life::adopted(7);
        assert_eq!((adopted.phase(), adopted.generation()), (&Phase::Running, 7));
        assert!(adopted.launch().is_err(), "an adopted kernel runs: no second launch in its slot");
        adopted.request_stop();
        adopted.returned();
        assert_eq!(adopted.launch(), Ok(8), "its next launch follows the previous meshd's generation");
    }

    #[test]
    fn a_faulted_program_is_skipped_until_a_new_image_revives_it() {
        let mut life = Life::new();
        life.launch().unwrap();
        life.returned();
        life.fault("relaunch failed");
        assert!(!life.relaunchable());
        assert_eq!(life.faulted(), Some("relaunch failed"));
        life.returned();
        life.request_stop();
        assert_eq!(life.faulted(), Some("relaunch failed"), "stop and return leave a fault as it is");
        assert!(life.launch().is_err());
        life.new_image();
        assert_eq!(life.launch(), Ok(2));
        assert!(life.relaunchable());
    }

    #[test]
    fn the_state_shown_combines_the_phase_and_the_kernel() {
        let mut life = Life::new();
        life.launch().unwrap();
        assert_eq!(life.state(KernelRun::Running, None), ProgramState::Running);
        assert_eq!(life.state(KernelRun::Returned, Some(3)), ProgramState::Exited(3));
        assert_eq!(life.state(KernelRun::Failed("bad".into()), None), ProgramState::Faulted("bad".into()));
        life.fault("left stopped");
        assert_eq!(life.state(KernelRun::Returned, Some(3)), ProgramState::Faulted("left stopped".into()));
    }
}
