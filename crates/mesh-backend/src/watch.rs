//! The watchdog's reasoning, without a GPU: what each program's health record keeps (restarts, the
//! last fault and when, why it is stopped), how a fault's culprit is named from what the kernels and
//! their processes report, and the search by halves when it cannot be named.
//!
//! A GPU fault reaches more than the program that caused it: in blink mode it poisons the one context
//! (every stream fails), in MPS mode the server reports it to every client (gpu.md). NVIDIA's MPS
//! documentation says the server does not tell which client caused it, and the error text is the same
//! in every client. What can tell:
//!
//! * the **slots**: a kernel that had ended before the fault (slot STOPPED or EXITED) is innocent;
//!   one whose slot still says RUNNING (or IDLE: launched, not started) is a suspect;
//! * a **process**: an MPS worker that is gone while the others still answer died under its kernel;
//! * the **server's log**, when a line about the fault names exactly one worker;
//! * **recency**: a program whose image changed (load, upgrade) within [`FAULT_WINDOW`] of the fault,
//!   alone among the suspects, is named: that is how a bad new program shows;
//! * **heartbeats**: in MPS mode the fault reaches the other clients some 150 ms after it happens, so
//!   the culprit's heartbeat stops first. That is only a hint ([`Verdict::Search`]'s `likely`): a
//!   program may beat rarely by design. The search tests the others first, and the hint is confirmed
//!   when they run clean.
//!
//! When nothing names it, [`search_by_halves`] finds it over an oracle that relaunches a set and says
//! whether the fault came back; the sets it asks grow from the programs already cleared, so that the
//! healthy ones keep running between steps.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The watchdog's period: meshd calls [`crate::Backend::watch`] this often, so a fault is noticed
/// well within 100 ms of its report.
pub const TICK: Duration = Duration::from_millis(25);

/// An image that changed this shortly before a fault is taken for its cause.
pub const FAULT_WINDOW: Duration = Duration::from_millis(1500);

/// A fault a program saw (its own or another program's), with when meshd noticed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultNote {
    /// When meshd noticed it.
    pub at: SystemTime,
    /// The driver's error.
    pub error: String,
    /// Who caused it, as far as known.
    pub cause: Cause,
}

/// Who caused a fault, as a program's note says it. Rendered only for display: `ps` shows
/// `GPU fault: ERROR (caused by NAME)` and the like ([`FaultNote`]'s `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// Not known yet (the recovery is under way).
    Unknown,
    /// This program, named for the reason given.
    ThisProgram(String),
    /// Another program, by name.
    Other(String),
    /// The recovery named no one.
    NoneNamed,
    /// A culprit search by halves is under way.
    Searching,
}

impl std::fmt::Display for FaultNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&fault_text(&self.error, &self.cause))
    }
}

/// The one wording of a fault and its cause, for `ps` (and meshd's record of it across a
/// replacement of the process).
pub fn fault_text(error: &str, cause: &Cause) -> String {
    match cause {
        Cause::Unknown => format!("GPU fault: {error}"),
        Cause::ThisProgram(why) => format!("GPU fault: {error} (caused by this program: {why})"),
        Cause::Other(name) => format!("GPU fault: {error} (caused by {name})"),
        Cause::NoneNamed => format!("GPU fault: {error} (no culprit named)"),
        Cause::Searching => format!("GPU fault: {error} {SEARCHING}"),
    }
}

/// The end of a fault's text while its culprit is searched for ([`Cause::Searching`]).
pub const SEARCHING: &str = "(its culprit is being searched)";

impl FaultNote {
    /// A note of `error`, caused by `cause`, now.
    pub fn now(error: impl Into<String>, cause: Cause) -> Self {
        Self { at: SystemTime::now(), error: error.into(), cause }
    }

    /// Milliseconds since the Unix epoch (what `ps --json` shows).
    pub fn unix_ms(&self) -> u64 {
        self.at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// What the watchdog keeps about one program between its ticks.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Relaunches by the watchdog (after a fault), not counting blinks and upgrades.
    pub restarts: u32,
    /// The last fault that stopped this program.
    pub last_fault: Option<FaultNote>,
    /// When its image last changed (load, upgrade).
    pub image_at: Option<Instant>,
    /// The heartbeat seen at the last tick, and when it last changed (None: never seen changing
    /// since the last launch).
    pub beat: u64,
    /// When the heartbeat was last seen advancing.
    pub beat_at: Option<Instant>,
    /// The code of a `mesh_exit` already reported (reported once; the program is not relaunched).
    pub exited: Option<i32>,
}

impl Health {
    /// A program whose image just changed.
    pub fn new_image(&mut self, now: Instant) {
        self.image_at = Some(now);
        self.exited = None;
    }

    /// A (re)launch: the heartbeat is watched afresh.
    pub fn launched(&mut self, beat: u64) {
        self.beat = beat;
        self.beat_at = None;
        self.exited = None;
    }

    /// One tick's heartbeat reading.
    pub fn observe_beat(&mut self, beat: u64, now: Instant) {
        if beat != self.beat {
            self.beat = beat;
            self.beat_at = Some(now);
        }
    }

    /// How long its image had been loaded at `now`.
    pub fn image_age(&self, now: Instant) -> Option<Duration> {
        self.image_at.map(|t| now.saturating_duration_since(t))
    }

    /// How long since its heartbeat was last seen advancing (None: not since its launch).
    pub fn beat_stale(&self, now: Instant) -> Option<Duration> {
        self.beat_at.map(|t| now.saturating_duration_since(t))
    }
}

/// What one program's kernel, slot and process said when the fault was noticed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evidence {
    /// Its kernel may have been on the GPU (slot RUNNING or IDLE, not left stopped): a suspect.
    pub on_gpu: bool,
    /// The MPS server's log names its process in a line about the fault.
    pub named_by_server: bool,
    /// Its process (MPS worker) died while its kernel ran without first saying that its kernel
    /// failed: killed from outside (the OOM killer, an operator) or crashed. Such a death is the
    /// fault's cause, not a program's: see [`name_culprit`].
    pub process_gone: bool,
    /// How long its image had been loaded.
    pub image_age: Option<Duration>,
    /// How long since its heartbeat last advanced (None: not since its launch).
    pub beat_stale: Option<Duration>,
}

/// Who caused a fault, as far as the evidence tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Named: left stopped, every other program relaunched at once.
    Culprit {
        /// Its index in the evidence.
        index: usize,
        /// Why it is named (for `ps` and the log).
        why: String,
    },
    /// Not named: search these (by halves); `likely` (a heartbeat hint) is tried first.
    Search {
        /// The programs whose kernels were on the GPU.
        suspects: Vec<usize>,
        /// The one whose heartbeat stopped first, if one did.
        likely: Option<usize>,
    },
    /// No program caused it: no program's kernel was on the GPU (the MPS server went away), or a
    /// worker died from outside (its death failed every client's kernel): relaunch every program.
    NoCulprit,
}

fn only<T: Copy>(mut it: impl Iterator<Item = T>) -> Option<T> {
    let first = it.next()?;
    it.next().is_none().then_some(first)
}

/// Names the culprit of a fault from `evidence` (one entry per program), or says whom to search.
/// `tick` is the watchdog's period: heartbeats are read once a tick.
pub fn name_culprit(evidence: &[Evidence], tick: Duration) -> Verdict {
    let suspects: Vec<usize> = (0..evidence.len()).filter(|&i| evidence[i].on_gpu).collect();
    if suspects.is_empty() {
        return Verdict::NoCulprit;
    }
    let e = |i: usize| &evidence[i];
    // A worker that died while its kernel ran, without first saying that its kernel failed, was
    // killed from outside or crashed; a SIGKILL of a busy MPS client fails every client's kernel (seen
    // on the H200), and the server's log then names the dead worker too. The death is the cause, not
    // a program: every program is relaunched, the dead worker's own too (its backend leaves it
    // stopped only after repeated deaths). Checked first: the only suspect, or the one the log
    // names, may be the one that was killed.
    if suspects.iter().any(|&i| e(i).process_gone) {
        return Verdict::NoCulprit;
    }
    if suspects.len() == 1 {
        return Verdict::Culprit { index: suspects[0], why: "the only program whose kernel was on the GPU".into() };
    }
    if let Some(i) = only(suspects.iter().copied().filter(|&i| e(i).named_by_server)) {
        return Verdict::Culprit { index: i, why: "the MPS server's log names its worker".into() };
    }
    if let Some(i) = only(suspects.iter().copied().filter(|&i| e(i).image_age.is_some_and(|a| a < FAULT_WINDOW))) {
        let ms = e(i).image_age.map_or(0, |a| a.as_millis());
        return Verdict::Culprit { index: i, why: format!("its image was loaded {ms} ms before the fault") };
    }
    // The heartbeat hint: one suspect stopped beating at least two ticks before every other one,
    // each of which was still seen beating within the last tick.
    let stale = |i: usize| e(i).beat_stale;
    let likely = only(suspects.iter().copied().filter(|&i| stale(i).is_some_and(|s| s > 2 * tick)))
        .filter(|&l| suspects.iter().filter(|&&i| i != l).all(|&i| stale(i).is_some_and(|s| s <= tick + tick / 2)));
    Verdict::Search { suspects, likely }
}

/// Finds the culprit among `suspects` (at least one of which faults) with `faults`, which relaunches
/// a set of programs and says whether the fault came back. Each set asked is the programs cleared so
/// far plus a half of those left, so the healthy ones run on between steps; `likely` is tried first
/// by asking for every other suspect. Returns the culprit (None: no suspect).
pub fn search_by_halves(
    suspects: &[usize],
    likely: Option<usize>,
    mut faults: impl FnMut(&[usize]) -> bool,
) -> Option<usize> {
    let mut left: Vec<usize> = suspects.to_vec();
    let mut cleared: Vec<usize> = Vec::new();
    if let Some(l) = likely.filter(|l| left.contains(l) && left.len() > 1) {
        let others: Vec<usize> = left.iter().copied().filter(|&i| i != l).collect();
        if !faults(&others) {
            return Some(l);
        }
        left = others;
    }
    while left.len() > 1 {
        let rest = left.split_off(left.len().div_ceil(2));
        let mut run = cleared.clone();
        run.extend_from_slice(&left);
        if faults(&run) {
            // The culprit is in this half (the cleared ones ran clean before).
        } else {
            cleared.extend(left);
            left = rest;
        }
    }
    left.pop()
}

// ---- A fault that needs a new process ----

/// A backend's request that meshd replace its process: the fault left the process unable to use
/// the GPU again (a *sticky* error: NVIDIA documents that "the process must be terminated and
/// relaunched"), so no in-place recovery can work. It carries what the backend saw, so that the
/// new process can relaunch the others at once and leave the culprit stopped.
///
/// The backend keeps it from [`crate::Backend::watch`] or any call that met the fault, and meshd
/// takes it with [`crate::Backend::take_replacement`] after every backend call.
#[derive(Debug, Clone)]
pub struct Replacement {
    /// The driver's error.
    pub error: String,
    /// The programs, in the backend's order: the indices of `verdict` point into this.
    pub programs: Vec<String>,
    /// Who caused it, from the evidence ([`name_culprit`]).
    pub verdict: Verdict,
    /// When the backend noticed the fault.
    pub noticed: Instant,
    /// Each program's loadable image as the backend linked it (name, image), so that the new
    /// process loads it without linking again.
    pub linked: Vec<(String, std::sync::Arc<Vec<u8>>)>,
    /// The GPU's architecture those images were linked for (`sm_90`).
    pub arch: String,
}

/// Where a backend keeps its request to replace the process until meshd takes it: a later request
/// replaces an earlier one not yet taken, and a request is taken once.
#[derive(Debug, Default)]
pub struct ReplacementSlot(Option<Replacement>);

impl ReplacementSlot {
    /// Asks meshd to replace the process.
    pub fn ask(&mut self, r: Replacement) {
        self.0 = Some(r);
    }

    /// The pending request, taken.
    pub fn take(&mut self) -> Option<Replacement> {
        self.0.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(50);

    fn suspect() -> Evidence {
        Evidence { on_gpu: true, image_age: Some(Duration::from_secs(60)), ..Evidence::default() }
    }

    #[test]
    fn a_program_loaded_just_before_the_fault_is_named() {
        let mut ev = vec![suspect(); 9];
        ev[8].image_age = Some(Duration::from_millis(40));
        let v = name_culprit(&ev, TICK);
        assert!(matches!(&v, Verdict::Culprit { index: 8, why } if why.contains("loaded 40 ms")), "{v:?}");
        // Two fresh images: recency cannot tell.
        ev[3].image_age = Some(Duration::from_millis(100));
        assert!(
            matches!(name_culprit(&ev, TICK), Verdict::Search { ref suspects, likely: None } if suspects.len() == 9)
        );
    }

    #[test]
    fn programs_whose_kernel_had_ended_are_innocent() {
        let mut ev = vec![suspect(); 4];
        for e in &mut ev[..3] {
            e.on_gpu = false;
        }
        assert!(matches!(name_culprit(&ev, TICK), Verdict::Culprit { index: 3, .. }));
        ev[3].on_gpu = false;
        assert_eq!(name_culprit(&ev, TICK), Verdict::NoCulprit);
    }

    #[test]
    fn a_worker_killed_from_outside_names_no_culprit_and_the_servers_log_names_one() {
        let mut ev = vec![suspect(); 3];
        ev[2].named_by_server = true;
        assert!(matches!(name_culprit(&ev, TICK), Verdict::Culprit { index: 2, ref why } if why.contains("log")));
        // A death: the fault is the death's, whatever the log says of the dead worker.
        ev[1].process_gone = true;
        ev[1].named_by_server = true;
        ev[2].named_by_server = false;
        assert_eq!(name_culprit(&ev, TICK), Verdict::NoCulprit);
        // The only program on the GPU, killed: not named either.
        let mut one = vec![suspect()];
        one[0].process_gone = true;
        assert_eq!(name_culprit(&one, TICK), Verdict::NoCulprit);
        for e in &mut ev {
            e.process_gone = true;
        }
        assert_eq!(name_culprit(&ev, TICK), Verdict::NoCulprit, "all gone: the server went away");
    }

    #[test]
    fn a_heartbeat_that_stopped_first_is_only_a_hint() {
        let mut ev = vec![suspect(); 4];
        for e in &mut ev {
            e.beat_stale = Some(Duration::from_millis(20));
        }
        ev[2].beat_stale = Some(Duration::from_millis(180));
        assert_eq!(name_culprit(&ev, TICK), Verdict::Search { suspects: vec![0, 1, 2, 3], likely: Some(2) });
        // Another program not seen beating lately: no hint.
        ev[0].beat_stale = None;
        assert_eq!(name_culprit(&ev, TICK), Verdict::Search { suspects: vec![0, 1, 2, 3], likely: None });
    }

    /// The oracle of a deterministic culprit: a set faults when it holds it. Counts the questions.
    fn oracle(culprit: usize, asked: &mut Vec<Vec<usize>>) -> impl FnMut(&[usize]) -> bool + '_ {
        move |set| {
            asked.push(set.to_vec());
            set.contains(&culprit)
        }
    }

    #[test]
    fn the_search_by_halves_finds_every_culprit_in_log2_questions() {
        for n in 1..=17usize {
            let suspects: Vec<usize> = (0..n).collect();
            for culprit in 0..n {
                let mut asked = Vec::new();
                let found = search_by_halves(&suspects, None, oracle(culprit, &mut asked));
                assert_eq!(found, Some(culprit), "n {n}");
                let bound = n.next_power_of_two().ilog2() as usize;
                assert!(asked.len() <= bound, "n {n} culprit {culprit}: {} questions {asked:?}", asked.len());
                // Every set asked holds every program cleared before it: the healthy ones run on.
                for pair in asked.windows(2) {
                    if !pair[0].contains(&culprit) {
                        assert!(pair[0].iter().all(|i| pair[1].contains(i)), "{asked:?}");
                    }
                }
            }
        }
        assert_eq!(search_by_halves(&[], None, |_| true), None);
    }

    #[test]
    fn a_fault_note_says_the_error_and_who_caused_it() {
        let note = |cause| FaultNote::now("CUDA_ERROR_ILLEGAL_ADDRESS", cause).to_string();
        assert_eq!(note(Cause::Unknown), "GPU fault: CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(note(Cause::Other("bad".into())), "GPU fault: CUDA_ERROR_ILLEGAL_ADDRESS (caused by bad)");
        assert_eq!(
            note(Cause::ThisProgram("loaded 40 ms before".into())),
            "GPU fault: CUDA_ERROR_ILLEGAL_ADDRESS (caused by this program: loaded 40 ms before)"
        );
        assert!(note(Cause::Searching).ends_with(SEARCHING));
        assert!(note(Cause::NoneNamed).ends_with("(no culprit named)"));
    }

    #[test]
    fn a_replacement_is_taken_once() {
        let r = Replacement {
            error: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            programs: vec!["a".into(), "b".into()],
            verdict: Verdict::Culprit { index: 1, why: "test".into() },
            noticed: Instant::now(),
            linked: Vec::new(),
            arch: "sm_90".into(),
        };
        let mut slot = ReplacementSlot::default();
        slot.ask(r);
        let taken = slot.take().expect("asked");
        assert_eq!((taken.programs.len(), taken.arch.as_str()), (2, "sm_90"));
        assert!(slot.take().is_none(), "taken once");
    }

    #[test]
    fn a_right_hint_costs_one_question_and_a_wrong_one_two_more_at_most() {
        let suspects: Vec<usize> = (0..8).collect();
        let mut asked = Vec::new();
        assert_eq!(search_by_halves(&suspects, Some(5), oracle(5, &mut asked)), Some(5));
        assert_eq!(asked, [vec![0, 1, 2, 3, 4, 6, 7]]);
        let mut asked = Vec::new();
        assert_eq!(search_by_halves(&suspects, Some(5), oracle(1, &mut asked)), Some(1));
        assert!(asked.len() <= 4, "{asked:?}");
    }
}
