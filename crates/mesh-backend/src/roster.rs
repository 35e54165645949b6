//! What both backends keep about each loaded program, and the look-ups they make over all of them:
//! by name, a free mailbox slot, the share of the GPU the others hold, the status `ps` shows.
//!
//! mesh-backend depends on no other member, so nothing here names the mailbox: a backend reads a
//! slot into a [`SlotReading`] and resolves channel names itself (mesh-cuda's `slots` module does
//! both for blink and MPS alike).

use crate::error::{BackendError, Result};
use crate::life::Life;
use crate::spec::{ImageKind, KernelRun, LaunchShape, ProgramState, ProgramStatus};
use crate::watch::Health;

/// The part of a loaded program that does not depend on the backend.
#[derive(Debug, Clone)]
pub struct ProgramCore {
    /// The unique name.
    pub name: String,
    /// Its mailbox slot.
    pub slot: u32,
    /// The format of the image it was loaded from.
    pub kind: ImageKind,
    /// The launch of `mesh_main`.
    pub shape: LaunchShape,
    /// Fraction of the shared SMs its launch holds (kcheck's share).
    pub share: f64,
    /// Its phase and generation.
    pub life: Life,
    /// What the watchdog keeps: restarts, the last fault, heartbeat and image times.
    pub health: Health,
}

/// What a program's mailbox slot says, read by the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotReading {
    /// The kernel's heartbeat counter.
    pub heartbeat: u64,
    /// The code the kernel gave `mesh_exit`, when it exited by itself.
    pub exit_code: Option<i32>,
}

impl ProgramCore {
    /// A program just loaded in `slot` (never launched).
    pub fn new(name: impl Into<String>, slot: u32, kind: ImageKind, shape: LaunchShape, share: f64) -> Self {
        let mut health = Health::default();
        health.new_image(std::time::Instant::now());
        Self { name: name.into(), slot, kind, shape, share, life: Life::new(), health }
    }

    /// The status `ps` shows, from what the kernel is doing and what its slot says.
    pub fn status(
        &self,
        run: KernelRun,
        slot: SlotReading,
        worker_pid: Option<u32>,
        sms: Option<u32>,
    ) -> ProgramStatus {
        let state = self.life.state(run, slot.exit_code);
        let stopped_why = match &state {
            ProgramState::Running => None,
            ProgramState::Exited(code) => {
                Some(format!("ended by itself (mesh_exit({code})): reported, not relaunched"))
            }
            ProgramState::Faulted(why) => Some(why.clone()),
            ProgramState::Stopped => Some("stopped by meshd".into()),
        };
        let fault = self.health.last_fault.as_ref();
        ProgramStatus {
            name: self.name.clone(),
            slot: self.slot,
            state,
            generation: self.life.generation(),
            heartbeat: slot.heartbeat,
            worker_pid,
            sms,
            shape: self.shape,
            kind: self.kind,
            restarts: self.health.restarts,
            last_fault: fault.map(ToString::to_string),
            last_fault_unix_ms: fault.map(|f| f.unix_ms()),
            stopped_why,
            adopted: false,
        }
    }
}

/// A backend's program: gives access to its [`ProgramCore`].
pub trait HasCore {
    /// The backend-independent part.
    fn core(&self) -> &ProgramCore;
}

impl HasCore for ProgramCore {
    fn core(&self) -> &ProgramCore {
        self
    }
}

/// The index of the program called `name`, or the refusal that names it.
pub fn index_of<P: HasCore>(programs: &[P], name: &str) -> Result<usize> {
    programs.iter().position(|p| p.core().name == name).ok_or_else(|| BackendError::NoSuchProgram(name.to_string()))
}

/// Refuses a second program called `name`.
pub fn refuse_duplicate<P: HasCore>(programs: &[P], name: &str) -> Result<()> {
    if programs.iter().any(|p| p.core().name == name) {
        return Err(BackendError::AlreadyLoaded(name.to_string()));
    }
    Ok(())
}

/// The lowest slot of `slot_count` that no program holds.
pub fn free_slot<P: HasCore>(programs: &[P], slot_count: u32) -> Result<u32> {
    (0..slot_count).find(|s| programs.iter().all(|p| p.core().slot != *s)).ok_or_else(|| {
        BackendError::Mailbox(format!("all {slot_count} program slots are in use (create the mailbox with more slots)"))
    })
}

/// The share of the shared SMs that the resident programs hold, leaving out `replacing` (an upgrade
/// replaces it) and every program left stopped (its kernel holds no SM).
pub fn held_share<P: HasCore>(programs: &[P], replacing: Option<&str>) -> f64 {
    programs
        .iter()
        .map(HasCore::core)
        .filter(|p| Some(p.name.as_str()) != replacing && p.life.relaunchable())
        .map(|p| p.share)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ProgramState;

    fn program(name: &str, slot: u32, share: f64) -> ProgramCore {
        ProgramCore::new(name, slot, ImageKind::Ptx, LaunchShape::default(), share)
    }

    #[test]
    fn programs_are_found_by_name_and_never_twice() {
        let programs = [program("a", 0, 0.1), program("b", 1, 0.1)];
        assert_eq!(index_of(&programs, "b").unwrap(), 1);
        assert!(matches!(index_of(&programs, "c"), Err(BackendError::NoSuchProgram(n)) if n == "c"));
        assert!(refuse_duplicate(&programs, "c").is_ok());
        assert!(matches!(refuse_duplicate(&programs, "a"), Err(BackendError::AlreadyLoaded(n)) if n == "a"));
    }

    #[test]
    fn the_lowest_free_slot_is_taken_and_a_full_mailbox_says_so() {
        let programs = [program("a", 0, 0.0), program("b", 2, 0.0)];
        assert_eq!(free_slot(&programs, 4).unwrap(), 1);
        let err = free_slot(&programs[..1], 1).unwrap_err().to_string();
        assert!(err.contains("all 1 program slots are in use"), "{err}");
    }

    #[test]
    fn the_held_share_leaves_out_the_program_replaced_and_those_left_stopped() {
        let mut programs = [program("a", 0, 0.25), program("b", 1, 0.5), program("c", 2, 0.125)];
        assert!((held_share(&programs, None) - 0.875).abs() < 1e-12);
        assert!((held_share(&programs, Some("b")) - 0.375).abs() < 1e-12);
        programs[2].life.fault("left stopped");
        assert!((held_share(&programs, None) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn a_status_carries_the_slot_reading_and_the_phase() {
        let mut p = program("a", 3, 0.1);
        p.life.launch().unwrap();
        let s = p.status(KernelRun::Running, SlotReading { heartbeat: 7, exit_code: None }, Some(42), None);
        assert_eq!((s.name.as_str(), s.slot, s.generation, s.heartbeat), ("a", 3, 1, 7));
        assert_eq!((s.state, s.worker_pid), (ProgramState::Running, Some(42)));
    }
}
