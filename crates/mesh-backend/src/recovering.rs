//! The recovery board: a backend says "a recovery in place begins" the moment it notices a fault, before it takes any lock, and meshd's `ps`, `/readyz` and `/metrics` read it without waiting for the backend.
//!
//! Why a board and not the snapshot: meshd publishes its `ps` snapshot after each backend call, and
//! a recovery is one long call (an MPS recovery that ends its clients, starts new ones and searches
//! by halves can take seconds). Until the board existed, everything a monitor could see said
//! `running` throughout. The board is a small mutex-guarded record that the backend writes at the
//! start and end of a recovery, and when each program is relaunched, and that readers copy out: no
//! reader ever waits for the backend's own lock or for a GPU call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// A recovery in place that has begun and not yet ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InProgress {
    /// Why: the fault or the death that started it, as the log says it.
    pub reason: String,
    /// The programs it stops and relaunches (every program on the GPU, the culprit included), by
    /// name; they show `recovering` in `ps` until the recovery ends or they are relaunched.
    pub programs: Vec<String>,
    /// When it began (meshd's monotonic clock).
    pub since: Instant,
    /// When it began, ns since the Unix epoch (for `ps`/metrics readers in other processes).
    pub since_unix_ns: u64,
}

impl InProgress {
    /// How long it has run so far.
    pub fn elapsed(&self) -> Duration {
        self.since.elapsed()
    }
}

#[derive(Debug, Default)]
struct Board {
    current: Option<InProgress>,
    /// Recoveries begun since meshd started (ended or not).
    begun: u64,
    /// Relaunches by program, counted as each one happens (a recovery's, a silent worker's).
    restarts: BTreeMap<String, u64>,
}

/// A shared handle on the board: the backend writes, meshd's readers copy. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct RecoveryBoard(Arc<Mutex<Board>>);

/// What a reader copies out of the board at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoardView {
    /// The recovery under way, if any.
    pub current: Option<InProgress>,
    /// Recoveries begun since meshd started.
    pub begun: u64,
    /// Relaunches by program, counted when they happen.
    pub restarts: BTreeMap<String, u64>,
}

impl BoardView {
    /// Whether `program` is being recovered now (and not yet relaunched).
    pub fn recovering(&self, program: &str) -> bool {
        self.current.as_ref().is_some_and(|c| c.programs.iter().any(|p| p == program))
    }
}

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl RecoveryBoard {
    /// A board with nothing under way.
    pub fn new() -> Self {
        Self::default()
    }

    /// A recovery in place begins: `programs` show as recovering from now on. A recovery already
    /// under way (a search by halves' next fault) keeps its start and gains the programs named.
    /// Returns whether this began a new one (false: one was under way).
    pub fn begin(&self, reason: impl Into<String>, programs: impl IntoIterator<Item = String>) -> bool {
        let mut b = self.0.lock();
        match b.current.as_mut() {
            Some(c) => {
                for p in programs {
                    if !c.programs.contains(&p) {
                        c.programs.push(p);
                    }
                }
                false
            }
            None => {
                b.begun += 1;
                b.current = Some(InProgress {
                    reason: reason.into(),
                    programs: programs.into_iter().collect(),
                    since: Instant::now(),
                    since_unix_ns: unix_ns(),
                });
                true
            }
        }
    }

    /// `program` was relaunched: counted at once, and it shows its own state again.
    pub fn relaunched(&self, program: &str) {
        let mut b = self.0.lock();
        *b.restarts.entry(program.to_string()).or_default() += 1;
        if let Some(c) = b.current.as_mut() {
            c.programs.retain(|p| p != program);
        }
    }

    /// The recovery under way ended (relaunched, or left stopped with a reason `ps` shows).
    pub fn end(&self) {
        self.0.lock().current = None;
    }

    /// Ends the recovery under way if it began before `t`: the watchdog, finding no failure to
    /// recover from at a tick that started at `t`, clears what a reader thread marked earlier
    /// (a failure no recovery followed), but not what was marked since.
    pub fn end_if_begun_before(&self, t: Instant) {
        let mut b = self.0.lock();
        if b.current.as_ref().is_some_and(|c| c.since < t) {
            b.current = None;
        }
    }

    /// A program that left (unloaded) takes its restart count with it.
    pub fn forget(&self, program: &str) {
        let mut b = self.0.lock();
        b.restarts.remove(program);
        if let Some(c) = b.current.as_mut() {
            c.programs.retain(|p| p != program);
        }
    }

    /// A copy of the board as it is now; never waits for anything but the board's own short lock.
    pub fn view(&self) -> BoardView {
        let b = self.0.lock();
        BoardView { current: b.current.clone(), begun: b.begun, restarts: b.restarts.clone() }
    }

    /// Whether a recovery is under way.
    pub fn in_progress(&self) -> bool {
        self.0.lock().current.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovery_shows_from_its_start_until_each_program_is_relaunched_or_it_ends() {
        let board = RecoveryBoard::new();
        assert!(!board.in_progress());
        board.begin("GPU fault (illegal address)", ["a".to_string(), "b".to_string()]);
        let v = board.view();
        assert!(v.recovering("a") && v.recovering("b") && !v.recovering("c"));
        assert_eq!(v.begun, 1);
        assert_eq!(v.current.as_ref().map(|c| c.reason.as_str()), Some("GPU fault (illegal address)"));
        board.relaunched("a");
        let v = board.view();
        assert!(!v.recovering("a") && v.recovering("b"));
        assert_eq!(v.restarts.get("a"), Some(&1));
        // A second fault during the search: the same recovery, one more program, one begun.
        board.begin("again", ["c".to_string()]);
        let v = board.view();
        assert_eq!(v.begun, 1);
        assert!(v.recovering("c"));
        assert_eq!(v.current.as_ref().map(|c| c.reason.as_str()), Some("GPU fault (illegal address)"));
        board.end();
        assert!(!board.in_progress());
        board.begin("next", ["a".to_string()]);
        assert_eq!(board.view().begun, 2);
        board.forget("a");
        assert!(!board.view().recovering("a"));
        assert_eq!(board.view().restarts.get("a"), None);
    }
}
