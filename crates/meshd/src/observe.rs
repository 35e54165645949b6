//! What a scrape and a health probe read, in one home: [`Scrape`], its [`Source`], the probes' [`HealthConfig`] and [`state_name`].
//!
//! These types were spread over `metrics`, `health` and `server`, which then imported each other
//! (metrics ↔ health ↔ server). They live here so that imports go one way: this module imports
//! none of those; `metrics` (the recorder and the text) imports it, `health` (the probes) imports
//! both, `monitor` (what the HTTP listener serves) imports all three, and the server sits on top.

use std::time::Duration;

use crate::native::NativeRow;
use crate::protocol::{Info, ProgramRow};

/// What a scrape reads: the rows `ps` and `info` answer with, taken at once.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// `ps`'s programs (heartbeats read fresh from the slots).
    pub programs: Vec<ProgramRow>,
    /// `ps`'s native GPU workers.
    pub natives: Vec<NativeRow>,
    /// `info`; `Err` with why when it could not be read (the mailbox's channel table).
    pub info: Result<Info, String>,
    /// meshd is shutting down.
    pub stopping: bool,
}

/// Where a scrape's snapshot comes from: the control plane (the server implements it).
pub trait Source: Send + Sync {
    /// The rows `ps` and `info` would answer with now.
    fn scrape(&self) -> Scrape;
}

/// The health probes' thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// A running program whose heartbeat has not moved for longer is not ready.
    pub max_heartbeat_age: Duration,
    /// The backend thread must pass between jobs at least this often to be live.
    pub live_deadline: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self { max_heartbeat_age: Duration::from_secs(5), live_deadline: Duration::from_secs(30) }
    }
}

/// A program's state without its detail: `exited(3)` → `exited`, `faulted: …` → `faulted`.
pub fn state_name(state: &str) -> &str {
    let end = state.find(['(', ':', ' ']).unwrap_or(state.len());
    &state[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_loses_its_detail() {
        assert_eq!(state_name("running"), "running");
        assert_eq!(state_name("exited(3)"), "exited");
        assert_eq!(state_name("faulted: CUDA_ERROR_ILLEGAL_ADDRESS"), "faulted");
        assert_eq!(state_name("killed(signal 9)"), "killed");
        assert_eq!(state_name(""), "");
    }
}
