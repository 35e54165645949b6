//! What a backend did that meshd counts for its metrics (blink pauses, recoveries from GPU faults, programs adopted from a previous meshd), handed over once through [`crate::Backend::take_events`].

use std::time::Duration;

/// One thing a backend did that a monitoring stack wants counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendEvent {
    /// Blink mode: every running program was stopped and relaunched around a module change.
    BlinkPause {
        /// From the first stop request to the last relaunch: the gap every program felt.
        took: Duration,
        /// The programs that were paused and run again (the changed one included), by name.
        relaunched: Vec<String>,
    },
    /// The watchdog recovered from a GPU fault inside this process (or tried to).
    Recovery {
        /// How it recovered.
        method: RecoveryMethod,
        /// Whether every program that should run runs again.
        outcome: RecoveryOutcome,
        /// From the fault noticed to the programs relaunched.
        took: Duration,
    },
    /// A program a previous meshd had launched, still running, was taken over by this one
    /// (`adopted`), or stopped because it could not be (`adopted` false), without a new launch.
    Adoption {
        /// The program's name.
        program: String,
        /// Whether it was adopted.
        adopted: bool,
    },
}

/// How a recovery from a GPU fault was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecoveryMethod {
    /// In the same process: the context reset (blink) or the MPS clients ended and relaunched.
    InPlace,
    /// The process was replaced (a sticky fault, or a failed reset): counted by the new image.
    ProcessReplacement,
}

impl RecoveryMethod {
    /// Its name in metrics' labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InPlace => "in_place",
            Self::ProcessReplacement => "process_replacement",
        }
    }
}

/// How a recovery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecoveryOutcome {
    /// The programs that should run were relaunched (the culprit, if named, left stopped).
    Recovered,
    /// It did not complete (a reset failed, a relaunch was refused).
    Failed,
}

impl RecoveryOutcome {
    /// Its name in metrics' labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recovered => "recovered",
            Self::Failed => "failed",
        }
    }
}
