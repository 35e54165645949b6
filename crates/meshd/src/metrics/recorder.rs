//! The recorder: what the backend thread, the connection threads and the HTTP listener hand [`Metrics`] between scrapes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_backend::{BackendEvent, IsolationMode, ProgramStatus, RecoveryMethod, RecoveryOutcome};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::observe::HealthConfig;

/// A series' labels (besides the registry's constant `gpu` and `UUID`).
pub(super) type Labels = Vec<(&'static str, String)>;

/// The heartbeat of one program's current launch as last seen, and when it last moved.
#[derive(Debug, Clone, Copy)]
struct Beat {
    generation: u32,
    value: u64,
    /// When `value` last changed, or when this launch was first seen.
    moved: Instant,
}

/// What meshd records between scrapes: durations and counts of what completed, heartbeats seen,
/// the backend thread's last pass (liveness), and which programs readiness leaves out.
/// Shared by the backend thread, the connection threads and the HTTP listener.
#[derive(Debug)]
pub struct Metrics {
    pub(super) changes: Family<Labels, Histogram>,
    pub(super) recoveries: Family<Labels, Counter>,
    pub(super) recovery_seconds: Family<Labels, Histogram>,
    pub(super) blink_pauses: Histogram,
    /// Programs of a previous meshd taken over by outcome (`adopted`, `stopped`).
    pub(super) adoptions: Family<Labels, Counter>,
    /// Relaunches by blinks, by program (only programs still present are shown).
    pub(super) blink_relaunches: Mutex<HashMap<String, u64>>,
    beats: Mutex<HashMap<String, Beat>>,
    exempt: Mutex<HashSet<String>>,
    /// Nanoseconds after `origin` of the backend thread's last pass; 0: none yet (still opening).
    last_pass_ns: AtomicU64,
    origin: Instant,
    health: Mutex<HealthConfig>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// An empty recorder.
    pub fn new() -> Self {
        // Loads link in tens of ms and hit the cache in a fraction of one; recoveries take from a
        // few ms (in place) to seconds (a search by halves); a blink pauses for tens of µs to ms.
        // Decimal 1-2.5-5 steps: bucket bounds an operator reads as they are.
        fn changes() -> Histogram {
            Histogram::new(steps(1e-4, 30.0))
        }
        fn recoveries() -> Histogram {
            Histogram::new(steps(1e-3, 60.0))
        }
        Self {
            changes: Family::new_with_constructor(changes),
            recoveries: Family::default(),
            recovery_seconds: Family::new_with_constructor(recoveries),
            blink_pauses: Histogram::new(steps(1e-5, 2.5)),
            adoptions: Family::default(),
            blink_relaunches: Mutex::new(HashMap::new()),
            beats: Mutex::new(HashMap::new()),
            exempt: Mutex::new(HashSet::new()),
            last_pass_ns: AtomicU64::new(0),
            origin: Instant::now(),
            health: Mutex::new(HealthConfig::default()),
        }
    }

    // ---- Recorded by the backend thread ----

    /// The backend thread is alive and between jobs (the liveness probe's evidence).
    pub fn backend_pass(&self) {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
        self.last_pass_ns.store(ns, Ordering::Release);
    }

    /// How long ago the backend thread last passed between jobs; `None` before its first pass.
    pub fn since_backend_pass(&self) -> Option<Duration> {
        match self.last_pass_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.origin.elapsed().saturating_sub(Duration::from_nanos(ns))),
        }
    }

    /// A change (`op`, the server's label for it) was applied (`ok`) or refused, in `took` on the backend.
    pub fn change_done(&self, op: Option<&'static str>, ok: bool, took: Duration) {
        let Some(op) = op else { return };
        let result = if ok { "ok" } else { "refused" };
        self.changes.get_or_create(&vec![("op", op.to_string()), ("result", result.to_string())]).observe(secs(took));
    }

    /// What the backend reported since the last call: blink pauses and recoveries in place.
    pub fn backend_events(&self, mode: IsolationMode, events: Vec<BackendEvent>) {
        for e in events {
            match e {
                BackendEvent::BlinkPause { took, relaunched } => {
                    self.blink_pauses.observe(secs(took));
                    let mut counts = self.blink_relaunches.lock();
                    for name in relaunched {
                        *counts.entry(name).or_default() += 1;
                    }
                }
                BackendEvent::Recovery { method, outcome, took } => self.recovery(mode, method, outcome, took),
                BackendEvent::Adoption { adopted, .. } => {
                    let outcome = if adopted { "adopted" } else { "stopped" };
                    self.adoptions.get_or_create(&vec![("outcome", outcome.to_string())]).inc();
                }
            }
        }
    }

    /// A recovery from a GPU fault ended (in place, or by replacing the process: then counted by
    /// the new image, `took` measured from the fault the old one noticed).
    pub fn recovery(&self, mode: IsolationMode, method: RecoveryMethod, outcome: RecoveryOutcome, took: Duration) {
        let labels = vec![
            ("mode", mode.to_string()),
            ("method", method.as_str().to_string()),
            ("outcome", outcome.as_str().to_string()),
        ];
        self.recoveries.get_or_create(&labels).inc();
        self.recovery_seconds.get_or_create(&labels).observe(secs(took));
    }

    /// Heartbeats as they are now (the snapshot's programs, read fresh from their slots).
    pub fn observe_heartbeats<'a>(&self, programs: impl IntoIterator<Item = (&'a str, u32, u64)>) {
        let now = Instant::now();
        let mut beats = self.beats.lock();
        let mut present = HashSet::new();
        for (name, generation, value) in programs {
            present.insert(name);
            let b = beats.entry(name.to_string()).or_insert(Beat { generation, value, moved: now });
            if b.generation != generation || b.value != value {
                *b = Beat { generation, value, moved: now };
            }
        }
        beats.retain(|n, _| present.contains(n.as_str()));
    }

    /// The programs whose heartbeat readiness leaves out (loaded with `--no-readiness`).
    pub fn set_exempt<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let names: HashSet<String> = names.into_iter().map(str::to_string).collect();
        let mut exempt = self.exempt.lock();
        if *exempt != names {
            *exempt = names;
        }
    }

    // ---- Read by a scrape, a health probe ----

    /// How long ago `name`'s heartbeat last moved (or its launch was first seen).
    pub fn heartbeat_age(&self, name: &str) -> Option<Duration> {
        self.beats.lock().get(name).map(|b| b.moved.elapsed())
    }

    /// Whether readiness leaves `name` out.
    pub fn is_exempt(&self, name: &str) -> bool {
        self.exempt.lock().contains(name)
    }

    /// The health probes' thresholds.
    pub fn health(&self) -> HealthConfig {
        *self.health.lock()
    }

    /// Sets the health probes' thresholds (`--health-max-heartbeat-age`, `--health-live-deadline`).
    pub fn set_health(&self, config: HealthConfig) {
        *self.health.lock() = config;
    }
}

/// Bucket bounds 1, 2.5, 5 × 10^k from `from` up to `to` (both included), as short decimals.
fn steps(from: f64, to: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = from;
    while decade <= to * 1.0001 {
        for m in [1.0, 2.5, 5.0] {
            // Rounded to 6 significant digits, so that 2.5e-5 prints as 0.000025, not 2.5000000000000004e-5.
            let v: f64 = format!("{:.5e}", decade * m).parse().unwrap_or(decade * m);
            if v <= to * 1.0001 {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

pub(super) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Helpers for the server's call sites: the programs of a published status as
/// `(name, generation, heartbeat)`.
pub fn beats_of(programs: &[ProgramStatus]) -> impl Iterator<Item = (&str, u32, u64)> {
    programs.iter().map(|p| (p.name.as_str(), p.generation, p.heartbeat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_step_by_1_2_5_and_print_short() {
        assert_eq!(
            steps(1e-5, 2.5),
            [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
        );
        assert_eq!(steps(1e-3, 60.0).last(), Some(&50.0));
        let all = [steps(1e-5, 2.5), steps(1e-4, 30.0), steps(1e-3, 60.0)].concat();
        assert!(all.iter().all(|b| b.to_string().len() <= 8), "no float noise such as 2.5000000000000004e-5: {all:?}");
    }

    #[test]
    fn a_heartbeat_ages_until_it_moves_and_a_relaunch_starts_afresh() {
        let m = Metrics::new();
        m.observe_heartbeats([("a", 1, 5)]);
        let first = m.beats.lock()["a"].moved;
        m.observe_heartbeats([("a", 1, 5)]);
        assert_eq!(m.beats.lock()["a"].moved, first, "an unchanged heartbeat keeps its age");
        m.observe_heartbeats([("a", 1, 6)]);
        assert!(m.beats.lock()["a"].moved >= first);
        m.observe_heartbeats([("a", 2, 6)]);
        assert_eq!(m.beats.lock()["a"].generation, 2, "a new launch is tracked from its own first sight");
        m.observe_heartbeats([]);
        assert!(m.heartbeat_age("a").is_none(), "an unloaded program is forgotten");
    }
}
