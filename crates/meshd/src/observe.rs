//! What a scrape and a health probe read, in one home: [`Scrape`], its [`Source`], the probes' [`HealthConfig`], [`state_name`], and the recovery board's overlay on `ps` ([`overlay_recovery`]).
//!
//! These types were spread over `metrics`, `health` and `server`, which then imported each other
//! (metrics ↔ health ↔ server). They live here so that imports go one way: this module imports
//! none of those; `metrics` (the recorder and the text) imports it, `health` (the probes) imports
//! both, `monitor` (what the HTTP listener serves) imports all three, and the server sits on top.

use std::time::Duration;

use mesh_backend::BoardView;

use crate::native::NativeRow;
use crate::protocol::{Info, ProgramRow, RecoveryRow};

/// The state `ps` shows for a program a recovery in place holds (stopped, not yet relaunched).
pub const RECOVERING: &str = "recovering";

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
    /// The recovery board as it was when `programs` were overlaid with it.
    pub recovery: BoardView,
}

/// Where a scrape's snapshot comes from: the control plane (the server implements it).
pub trait Source: Send + Sync {
    /// The rows `ps` and `info` would answer with now.
    fn scrape(&self) -> Scrape;

    /// The recovery board alone: what `/readyz` reads first, without the snapshot, so that it says
    /// "recovering" from the moment the backend marks the board.
    fn recovery(&self) -> BoardView;
}

/// `ps`'s rows as the board says: a program the recovery under way holds shows `recovering` (with
/// the reason and how long so far) instead of the state of the last snapshot, which the backend
/// thread publishes only after its long `watch` call; restarts are the larger of the snapshot's
/// (carried across replacements of the process) and the board's (counted as each relaunch happens).
pub fn overlay_recovery(rows: &mut [ProgramRow], view: &BoardView) {
    for row in rows {
        if let Some(&n) = view.restarts.get(&row.name) {
            row.restarts = row.restarts.max(u32::try_from(n).unwrap_or(u32::MAX));
        }
        let Some(current) = view.current.as_ref().filter(|_| view.recovering(&row.name)) else { continue };
        row.state = RECOVERING.to_string();
        row.recovery = Some(RecoveryRow {
            reason: current.reason.clone(),
            since_unix_ms: current.since_unix_ns / 1_000_000,
            elapsed_ms: u64::try_from(current.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
    }
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
        assert_eq!(state_name(RECOVERING), "recovering");
    }

    fn row(name: &str, restarts: u32) -> ProgramRow {
        ProgramRow {
            name: name.into(),
            slot: 0,
            state: "running".into(),
            generation: 1,
            heartbeat: 0,
            worker_pid: None,
            sms: None,
            kind: "ptx".into(),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            restarts,
            last_fault: None,
            last_fault_unix_ms: None,
            stopped_why: None,
            recovery: None,
            user: Vec::new(),
            adopted: false,
        }
    }

    #[test]
    fn the_board_overlays_recovering_and_the_larger_restart_count() {
        let board = mesh_backend::RecoveryBoard::new();
        let mut rows = vec![row("a", 0), row("b", 4), row("c", 0)];
        overlay_recovery(&mut rows, &board.view());
        assert!(rows.iter().all(|r| r.state == "running" && r.recovery.is_none()), "nothing under way: as it was");
        board.begin("GPU fault (CUDA_ERROR_ILLEGAL_ADDRESS)", ["a".to_string(), "b".to_string()]);
        board.relaunched("b");
        board.relaunched("c");
        let mut rows = vec![row("a", 0), row("b", 4), row("c", 0)];
        overlay_recovery(&mut rows, &board.view());
        assert_eq!(rows[0].state, "recovering");
        let r = rows[0].recovery.as_ref().unwrap();
        assert_eq!(r.reason, "GPU fault (CUDA_ERROR_ILLEGAL_ADDRESS)");
        assert!(r.since_unix_ms > 1_700_000_000_000, "{r:?}");
        assert_eq!(
            (rows[1].state.as_str(), rows[1].restarts),
            ("running", 4),
            "relaunched; the carried count is larger"
        );
        assert_eq!((rows[2].state.as_str(), rows[2].restarts), ("running", 1), "counted when it happened");
    }
}
