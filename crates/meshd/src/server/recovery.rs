//! Recovery from GPU faults on the backend thread: the relaunch of what the state directory
//! records, the culprit search by halves, and the replacement of the process after a sticky fault.

use std::time::{Duration, Instant};

use mesh_backend::watch::{Cause, Replacement};
use mesh_backend::{ProgramState, RecoveryMethod, RecoveryOutcome};

use super::worker::{BackendWorker, ms_between, plain, unix_ms};
use crate::replace::{self, Plan, QUESTION_WATCH, Step, mono_ns};
use crate::state::{HeldMark, Pending};

/// Why a program stays stopped while a culprit search asks about others.
const SEARCH_HELD: &str = "held back while the culprit of a GPU fault is searched by halves";

/// `ps`'s `stopped_why` of a culprit named `why`.
fn culprit_why(why: &str) -> String {
    format!("caused a GPU fault: left stopped; upgrade or reload it to run it again (named: {why})")
}
impl BackendWorker<'_> {
    /// Loads every program the state directory records, as it was recorded, but those left stopped
    /// and those a culprit search holds back; after a replacement of the process, logs how long the
    /// recovery took. Returns (relaunched, failed).
    pub(super) fn relaunch(&mut self) -> (usize, usize) {
        let Some(state) = &self.state else { return (0, 0) };
        let started = mono_ns();
        let rec = state.recorded().clone();
        let pending = rec.recovery.pending.clone();
        let question = rec.recovery.search.clone().and_then(|s| match s.step() {
            Step::Ask(set) => Some((s, set)),
            _ => None,
        });
        let (mut ok, mut failed) = (0, 0);
        let mut relaunched = Vec::new();
        for p in &rec.programs {
            if let Some(mark) = rec.carried.get(&p.name).and_then(|c| c.held.as_ref()) {
                tracing::warn!(program = %p.name, "not relaunched: {}", mark.why);
                self.hold(p, mark.why.clone(), mark.culprit);
                continue;
            }
            if let Some((s, set)) = &question
                && s.suspects.contains(&p.name)
                && !set.contains(&p.name)
            {
                tracing::info!(program = %p.name, "{SEARCH_HELD}");
                self.hold(p, SEARCH_HELD.into(), false);
                continue;
            }
            match self.load_recorded(p) {
                Ok(status) => {
                    tracing::info!(program = %p.name, slot = status.slot, "relaunched");
                    relaunched.push(p.name.clone());
                    ok += 1;
                }
                Err(e) => {
                    tracing::error!(program = %p.name, "relaunch refused: {}", plain(&e));
                    failed += 1;
                }
            }
        }
        self.publish();
        if ok + failed > 0 {
            tracing::info!("relaunched {ok} of {} recorded programs", ok + failed);
        }
        if let Some(pending) = pending {
            self.finish_replacement(&pending, &relaunched, failed, started, question.is_some());
        }
        if let Some((s, set)) = question {
            tracing::warn!(
                target: "watchdog",
                "culprit search, question {}: {} relaunched beside the innocent programs; watching {} ms",
                s.answers.len() + 1,
                set.join(", "),
                QUESTION_WATCH.as_millis()
            );
            self.search = Some((s, Instant::now()));
        }
        (ok, failed)
    }

    /// The first relaunch after a replacement of the process (`failed`: relaunches refused): counts
    /// the restarts, clears the pending fault, logs where the recovery's time went, and counts the
    /// recovery unless a culprit search goes on (then it ends with the search, in [`Self::search_tick`]).
    fn finish_replacement(
        &mut self,
        pending: &Pending,
        relaunched: &[String],
        failed: usize,
        started: u64,
        searching: bool,
    ) {
        let ok = relaunched.len();
        self.count_restarts(relaunched);
        self.record(|s| s.update(|st| st.recovery.pending = None));
        self.publish();
        let done = mono_ns();
        let same = pending.from_pid == std::process::id();
        let main = replace::process_start().unwrap_or(started);
        tracing::info!(
            "after the replacement of pid {} ({}): exec {:.1} ms after the fault, this image's main {:.1} ms after \
             the exec, backend open {:.1} ms later, {ok} program(s) relaunched in {:.1} ms",
            pending.from_pid,
            if same { "an exec of this process" } else { "a crash came in between" },
            ms_between(pending.noticed_mono_ns, pending.exec_mono_ns),
            ms_between(pending.exec_mono_ns, main),
            ms_between(main, self.opened_mono_ns),
            ms_between(started, done),
        );
        if !searching {
            let outcome = if failed == 0 { RecoveryOutcome::Recovered } else { RecoveryOutcome::Failed };
            self.count_replacement(outcome, pending.noticed_mono_ns, done);
        }
        let culprit = match (&pending.culprit, searching) {
            (Some(c), _) => c.clone(),
            (None, true) => "being searched".into(),
            (None, false) => "none".into(),
        };
        tracing::warn!(
            target: "watchdog",
            "watchdog blink: recovered in {:.1} ms by replacing the process (pid {}): culprit {culprit}; {ok} \
             program(s) running, {} held back; fault {}",
            ms_between(pending.noticed_mono_ns, done),
            std::process::id(),
            self.held.len(),
            pending.error
        );
    }

    /// The watched question of a culprit search ran clean for [`QUESTION_WATCH`]: records the
    /// answer and relaunches the next set, or leaves the culprit found stopped and relaunches the rest.
    pub(super) fn search_tick(&mut self) {
        let Some((s, since)) = &self.search else { return };
        if since.elapsed() < QUESTION_WATCH {
            return;
        }
        let mut s = s.clone();
        s.answers.push(false);
        let step = s.step();
        let (to_run, culprit) = match &step {
            Step::Ask(set) => (set.clone(), None),
            Step::Found(name) => {
                let rest = self.held.iter().filter(|h| !h.culprit && &h.name != name).map(|h| h.name.clone());
                (rest.collect(), Some(name.clone()))
            }
            Step::Nobody => (self.held.iter().filter(|h| !h.culprit).map(|h| h.name.clone()).collect(), None),
        };
        let to_run: Vec<String> = to_run.into_iter().filter(|n| self.is_held(n)).collect();
        tracing::info!(target: "watchdog", "culprit search, question {} ran clean", s.answers.len());
        if let Some(name) = &culprit {
            let why = format!("found by halves in {} relaunch(es) of {} suspects", s.answers.len(), s.suspects.len());
            let error = s.error.clone();
            self.mark_culprit(name, &error, &why);
        }
        self.relaunch_held(&to_run);
        match step {
            Step::Ask(set) => {
                tracing::warn!(
                    target: "watchdog",
                    "culprit search, question {}: {} relaunched beside the cleared programs; watching {} ms",
                    s.answers.len() + 1,
                    set.join(", "),
                    QUESTION_WATCH.as_millis()
                );
                let recorded = s.clone();
                self.record(|st| st.update(|d| d.recovery.search = Some(recorded)));
                self.search = Some((s, Instant::now()));
            }
            Step::Found(_) | Step::Nobody => {
                self.search = None;
                self.record(|st| st.update(|d| d.recovery.search = None));
                let running = self.backend.status().iter().filter(|p| p.state == ProgramState::Running).count();
                self.count_replacement(RecoveryOutcome::Recovered, s.noticed_mono_ns, mono_ns());
                tracing::warn!(
                    target: "watchdog",
                    "watchdog blink: recovered in {:.1} ms (from the fault, by replacing the process and searching by \
                     halves in {} question(s)): culprit {}; {running} program(s) running",
                    ms_between(s.noticed_mono_ns, mono_ns()),
                    s.answers.len(),
                    culprit.as_deref().unwrap_or("none")
                );
            }
        }
        self.publish();
    }

    /// Counts a recovery by replacing the process in the metrics: from the fault the old image
    /// noticed (`noticed`) to `done` (both `CLOCK_MONOTONIC` ns, which an exec keeps).
    fn count_replacement(&self, outcome: RecoveryOutcome, noticed: u64, done: u64) {
        let took = Duration::from_nanos(done.saturating_sub(noticed));
        self.shared.metrics.recovery(self.backend.mode(), RecoveryMethod::ProcessReplacement, outcome, took);
    }

    /// Relaunches the held programs `names` (a search's next set, or the innocent after it ends);
    /// one that fails is held again with why.
    fn relaunch_held(&mut self, names: &[String]) {
        let mut relaunched = Vec::new();
        for name in names {
            let Some(p) = self.state.as_ref().and_then(|st| st.program(name).cloned()) else { continue };
            self.unhold(name);
            match self.load_recorded(&p) {
                Ok(_) => relaunched.push(name.clone()),
                Err(e) => {
                    tracing::error!(program = %name, "relaunch refused: {}", plain(&e));
                    self.hold(&p, format!("relaunch after a GPU fault failed: {}", plain(&e)), false);
                }
            }
        }
        self.count_restarts(&relaunched);
    }

    /// Records `name` as the culprit of the fault `error` (named: `why`), holds it back, and names
    /// it in the others' last fault.
    fn mark_culprit(&mut self, name: &str, error: &str, why: &str) {
        let stopped = culprit_why(why);
        let at = unix_ms();
        self.record(|s| {
            s.update(|st| {
                for (n, c) in st.carried.iter_mut() {
                    if n != name {
                        c.culprit_found(name);
                    }
                }
                let c = st.carried.entry(name.to_string()).or_default();
                c.held = Some(HeldMark { why: stopped.clone(), culprit: true });
                c.set_fault(error, &Cause::ThisProgram(why.to_string()), at);
            })
        });
        if let Some(p) = self.state.as_ref().and_then(|s| s.program(name).cloned()) {
            self.hold(&p, stopped, true);
        }
    }

    /// Acts on a pending request to replace the process, if the backend made one.
    pub(super) fn check_replacement(&mut self) {
        if let Some(r) = self.backend.take_replacement() {
            self.replace(r);
        }
    }

    /// Replaces the process after a sticky fault: decides whom the new image leaves stopped (or
    /// which question of a search it asks), records that with restarts, last faults, the time of
    /// the fault and the linked images in the state directory, and executes meshd again. Returns
    /// only when that could not be done (the backend then refuses every change, as before).
    fn replace(&mut self, r: Replacement) {
        let noticed = mono_ns().saturating_sub(u64::try_from(r.noticed.elapsed().as_nanos()).unwrap_or(u64::MAX));
        if self.state.is_none() {
            tracing::error!(
                "a sticky GPU fault ({}) needs a new process, but there is no state directory to \
                             relaunch from: restart meshd",
                r.error
            );
            return;
        }
        let now = unix_ms();
        let plan = self.plan(&r, noticed, now);
        if let Err(e) = self.record_plan(&plan, &r.error, noticed, now) {
            tracing::error!(
                "a sticky GPU fault ({}) needs a new process, but recording the state failed: {e:#}; \
                             restart meshd",
                r.error
            );
            return;
        }
        let stored = self.store_linked(&r);
        self.exec(&plan, &r.error, noticed, stored);
    }

    /// Whom the new image leaves stopped, or which question of a search it asks.
    fn plan(&mut self, r: &Replacement, noticed: u64, now: u64) -> Plan {
        let history = self.state.as_ref().map(|s| s.recorded().recovery.reexecs_unix_ms.clone()).unwrap_or_default();
        let asking = self.search.take().map(|(s, _)| s);
        if let Some(s) = &asking {
            tracing::warn!(target: "watchdog", "culprit search, question {}: the fault came back", s.answers.len() + 1);
        }
        replace::plan(&r.programs, &r.verdict, &r.error, noticed, asking, &history, now)
    }

    /// Records the plan in the state directory: per program its restarts, last fault and whether it
    /// is held back; the re-execution, and the fault pending the new image's log.
    fn record_plan(&mut self, plan: &Plan, error: &str, noticed: u64, now: u64) -> anyhow::Result<()> {
        let shown = self.statuses();
        let Some(state) = self.state.as_mut() else { return Ok(()) };
        let history = state.recorded().recovery.reexecs_unix_ms.clone();
        let Plan { culprit, search, halted } = plan;
        state.update(|st| {
            let names: Vec<String> = st.programs.iter().map(|p| p.name.clone()).collect();
            for name in names {
                let c = st.carried.entry(name.clone()).or_default();
                if let Some(row) = shown.iter().find(|r| r.name == name) {
                    c.restarts = row.restarts;
                }
                match &culprit {
                    Some((n, why)) if *n == name => {
                        c.held = Some(HeldMark { why: culprit_why(why), culprit: true });
                        c.set_fault(error, &Cause::ThisProgram(why.to_string()), now);
                        continue;
                    }
                    _ => {}
                }
                if c.held.is_some() {
                    continue;
                }
                let cause = match &culprit {
                    Some((n, _)) => Cause::Other(n.clone()),
                    None if search.is_some() => Cause::Searching,
                    None => Cause::NoneNamed,
                };
                c.set_fault(error, &cause, now);
                if let Some(h) = &halted {
                    c.held = Some(HeldMark { why: h.clone(), culprit: false });
                }
            }
            let mut reexecs = replace::recent(&history, now);
            reexecs.push(now);
            st.recovery = crate::state::Recovery {
                reexecs_unix_ms: reexecs,
                search: search.clone(),
                pending: Some(Pending {
                    from_pid: std::process::id(),
                    error: error.to_string(),
                    noticed_mono_ns: noticed,
                    exec_mono_ns: 0,
                    culprit: culprit.as_ref().map(|c| c.0.clone()),
                }),
            };
        })
    }

    /// Stores the linked images the backend handed over, so that the new image need not link them
    /// again; returns how many were stored.
    fn store_linked(&self, r: &Replacement) -> usize {
        let mut stored = 0;
        if let Some(state) = &self.state {
            for (name, image) in &r.linked {
                let Some(p) = state.program(name) else { continue };
                match state.store_linked(&p.image_sha256, &r.arch, image) {
                    Ok(()) => stored += 1,
                    Err(e) => tracing::warn!(program = %name, "storing its linked image: {e:#}"),
                }
            }
        }
        stored
    }

    /// Ends the native workers, records when, and executes meshd again; returns when that failed.
    fn exec(&mut self, plan: &Plan, error: &str, noticed: u64, stored: usize) {
        if !self.shared.natives.rows().is_empty() {
            tracing::warn!("ending the native GPU workers before the process is replaced");
            self.shared.natives.stop_all();
        }
        let what = match (&plan.culprit, &plan.search, &plan.halted) {
            (_, _, Some(h)) => format!("the bound is reached, nothing will be relaunched ({h})"),
            (Some((c, why)), _, _) => format!("culprit {c} ({why}) left stopped, every other program relaunched"),
            (None, Some(s), _) => match s.step() {
                Step::Ask(set) => format!("culprit unknown: searching by halves, next {}", set.join(", ")),
                _ => "culprit unknown".into(),
            },
            (None, None, _) => "no culprit named: every program relaunched".into(),
        };
        let exec_at = mono_ns();
        self.record(|s| {
            s.update(|st| {
                if let Some(p) = &mut st.recovery.pending {
                    p.exec_mono_ns = exec_at;
                }
            })
        });
        tracing::warn!(
            target: "watchdog",
            "replacing the process (pid {}) {:.1} ms after the fault ({error}): {what}; {stored} linked image(s) stored; \
             exec /proc/self/exe",
            std::process::id(),
            ms_between(noticed, mono_ns())
        );
        let e = (self.replacer)(None);
        tracing::error!("replacing the process failed: {e}; every change is refused: restart meshd");
    }
}
