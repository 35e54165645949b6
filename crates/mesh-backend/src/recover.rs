//! The one recovery from a GPU fault, for blink and MPS alike: note the fault, reset, name the
//! culprit (or search for it by halves, each half relaunched and watched), leave it stopped and
//! relaunch every other program. A backend supplies its operations through [`Recovery`].
//!
//! Each recovery is counted here, once, for meshd's metrics ([`Recovery::record`]): both modes run
//! this one algorithm, and only a recovery in place runs it (a replacement of the process is
//! counted by meshd's new image).

use std::time::Instant;

use crate::event::{BackendEvent, RecoveryMethod, RecoveryOutcome};
use crate::life::Phase;
use crate::roster::ProgramCore;
use crate::watch::{self, Cause, Evidence, FaultNote, Verdict};

/// The culprit a recovery named (its index), and why it is named.
pub type Culprit = Option<(usize, String)>;

/// What a recovery asks of a backend.
pub trait Recovery {
    /// Why a reset failed (then the process must be replaced).
    type Error;

    /// Ends every program's kernel and makes the GPU usable again (blink: the context is reset;
    /// MPS: every client is ended).
    fn reset(&mut self) -> Result<(), Self::Error>;

    /// Relaunches programs `which`, each restart counted; one that fails is left faulted, with why.
    fn relaunch(&mut self, which: &[usize]);

    /// Whether one of `running` faulted again within the backend's watch.
    fn faulted_within(&mut self, running: &[usize]) -> bool;

    /// Program `i`'s core.
    fn core(&mut self, i: usize) -> &mut ProgramCore;

    /// Whether program `i` is relaunched (not left stopped, not ended by itself).
    fn relaunchable(&self, i: usize) -> bool;

    /// How many programs there are.
    fn count(&self) -> usize;

    /// Keeps `event` for [`crate::Backend::take_events`].
    fn record(&mut self, event: BackendEvent);
}

/// Recovers from the fault `error`, `verdict` naming its culprit from `evidence` (one entry per
/// program): notes the fault on every program that was on the GPU, resets, leaves the culprit
/// stopped and relaunches the others. Returns the culprit, if named, and why; fails only when a reset
/// failed (the process must then be replaced). Adds its findings to `log`, and records the recovery
/// (from `noticed`, when the fault was seen; failed when a reset or a relaunch failed).
pub fn recover<R: Recovery>(
    r: &mut R,
    verdict: &Verdict,
    error: &str,
    evidence: &[Evidence],
    noticed: Instant,
    log: &mut Vec<String>,
) -> Result<Culprit, R::Error> {
    let result = in_place(r, verdict, error, evidence, log);
    let outcome = match &result {
        Ok((_, true)) => RecoveryOutcome::Recovered,
        Ok((_, false)) | Err(_) => RecoveryOutcome::Failed,
    };
    r.record(BackendEvent::Recovery { method: RecoveryMethod::InPlace, outcome, took: noticed.elapsed() });
    result.map(|(culprit, _)| culprit)
}

/// [`recover`]'s work; also says whether every program to relaunch runs again.
fn in_place<R: Recovery>(
    r: &mut R,
    verdict: &Verdict,
    error: &str,
    evidence: &[Evidence],
    log: &mut Vec<String>,
) -> Result<(Culprit, bool), R::Error> {
    for (i, e) in evidence.iter().enumerate() {
        if e.on_gpu {
            r.core(i).health.last_fault = Some(FaultNote::now(error, Cause::Unknown));
        }
    }
    r.reset()?;
    let candidates: Vec<usize> = (0..r.count()).filter(|&i| r.relaunchable(i) || evidence[i].on_gpu).collect();
    let culprit = match verdict {
        Verdict::Culprit { index, why } => Some((*index, why.clone())),
        Verdict::NoCulprit => None,
        Verdict::Search { suspects, likely } => search(r, &candidates, suspects, *likely, log)?,
    };
    if let Some((i, why)) = &culprit {
        let p = r.core(*i);
        p.life.returned();
        p.life.fault(format!("left stopped: it caused a GPU fault ({error}); named: {why}"));
        p.health.last_fault = Some(FaultNote::now(error, Cause::ThisProgram(why.clone())));
    }
    let rest: Vec<usize> = candidates
        .into_iter()
        .filter(|&i| r.relaunchable(i) && matches!(r.core(i).life.phase(), Phase::Loaded | Phase::Stopped))
        .collect();
    r.relaunch(&rest);
    let relaunched = rest.iter().all(|&i| r.core(i).life.faulted().is_none());
    let index = culprit.as_ref().map(|(i, _)| *i);
    let cause = index.map_or(Cause::NoneNamed, |i| Cause::Other(r.core(i).name.clone()));
    for i in (0..r.count()).filter(|&i| Some(i) != index) {
        if let Some(note) = &mut r.core(i).health.last_fault
            && note.error == error
            && note.cause == Cause::Unknown
        {
            note.cause = cause.clone();
        }
    }
    Ok((culprit, relaunched))
}

/// The search by halves: each question relaunches the innocent programs and one half of the
/// suspects (after a reset when the last question faulted) and watches them. Returns the culprit
/// found and why it is named.
fn search<R: Recovery>(
    r: &mut R,
    candidates: &[usize],
    suspects: &[usize],
    likely: Option<usize>,
    log: &mut Vec<String>,
) -> Result<Culprit, R::Error> {
    let mut poisoned = false;
    let mut running: Vec<usize> = Vec::new();
    let mut failure = None;
    let mut questions = 0;
    // Programs whose kernels were off the GPU are innocent: they run with every question.
    let innocent: Vec<usize> = candidates.iter().copied().filter(|i| !suspects.contains(i)).collect();
    let found = watch::search_by_halves(suspects, likely, |half| {
        questions += 1;
        if poisoned {
            if let Err(e) = r.reset() {
                failure.get_or_insert(e);
                return false;
            }
            running.clear();
        }
        let set: Vec<usize> = innocent.iter().chain(half).copied().collect();
        let new: Vec<usize> = set.iter().copied().filter(|i| !running.contains(i)).collect();
        r.relaunch(&new);
        running = set;
        poisoned = r.faulted_within(&running);
        poisoned
    });
    if let Some(e) = failure {
        return Err(e);
    }
    log.push(format!("the culprit was searched by halves: {questions} relaunch(es) watched"));
    if poisoned {
        r.reset()?;
    }
    Ok(found.map(|i| (i, format!("found by halves in {questions} relaunch(es) of {}", suspects.len()))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ImageKind, LaunchShape};

    /// Programs that run once relaunched, but those named in `refuse`; a reset fails when asked to.
    struct Fake {
        cores: Vec<ProgramCore>,
        refuse: Vec<usize>,
        reset_fails: bool,
        events: Vec<BackendEvent>,
    }

    impl Fake {
        fn running(n: usize) -> Self {
            let cores = (0..n)
                .map(|i| {
                    let mut c = ProgramCore::new(format!("p{i}"), 0, ImageKind::Ptx, LaunchShape::default(), 0.1);
                    c.life.launch().unwrap();
                    c
                })
                .collect();
            Self { cores, refuse: Vec::new(), reset_fails: false, events: Vec::new() }
        }
    }

    impl Recovery for Fake {
        type Error = &'static str;

        fn reset(&mut self) -> Result<(), Self::Error> {
            if self.reset_fails {
                return Err("reset failed");
            }
            for c in &mut self.cores {
                c.life.returned();
            }
            Ok(())
        }

        fn relaunch(&mut self, which: &[usize]) {
            for &i in which {
                if self.refuse.contains(&i) {
                    self.cores[i].life.fault("relaunch refused");
                } else {
                    self.cores[i].life.launch().unwrap();
                }
            }
        }

        fn faulted_within(&mut self, _running: &[usize]) -> bool {
            false
        }

        fn core(&mut self, i: usize) -> &mut ProgramCore {
            &mut self.cores[i]
        }

        fn relaunchable(&self, i: usize) -> bool {
            self.cores[i].life.relaunchable()
        }

        fn count(&self) -> usize {
            self.cores.len()
        }

        fn record(&mut self, event: BackendEvent) {
            self.events.push(event);
        }
    }

    /// Runs one recovery of `fake` (program 0 named the culprit) and returns the outcomes recorded.
    fn outcomes(fake: &mut Fake) -> Vec<(RecoveryMethod, RecoveryOutcome)> {
        let evidence = vec![Evidence { on_gpu: true, ..Evidence::default() }; fake.count()];
        let verdict = Verdict::Culprit { index: 0, why: "test".into() };
        let _ = recover(fake, &verdict, "CUDA_ERROR_ILLEGAL_ADDRESS", &evidence, Instant::now(), &mut Vec::new());
        fake.events
            .iter()
            .map(|e| match e {
                BackendEvent::Recovery { method, outcome, .. } => (*method, *outcome),
                other => panic!("a recovery records only recoveries, not {other:?}"),
            })
            .collect()
    }

    #[test]
    fn each_recovery_is_recorded_once_failed_when_a_reset_or_a_relaunch_fails() {
        let mut clean = Fake::running(3);
        assert_eq!(outcomes(&mut clean), [(RecoveryMethod::InPlace, RecoveryOutcome::Recovered)]);
        assert!(clean.cores[0].life.faulted().is_some(), "the culprit is left stopped");
        assert_eq!(clean.cores[1].life.phase(), &Phase::Running);

        let mut refused = Fake::running(3);
        refused.refuse = vec![2];
        assert_eq!(outcomes(&mut refused), [(RecoveryMethod::InPlace, RecoveryOutcome::Failed)]);

        let mut broken = Fake::running(2);
        broken.reset_fails = true;
        assert_eq!(outcomes(&mut broken), [(RecoveryMethod::InPlace, RecoveryOutcome::Failed)]);
    }
}
