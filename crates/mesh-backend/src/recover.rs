//! The one recovery from a GPU fault, for blink and MPS alike: note the fault, reset, name the
//! culprit (or search for it by halves, each half relaunched and watched), leave it stopped and
//! relaunch every other program. A backend supplies its operations through [`Recovery`].

use crate::life::Phase;
use crate::roster::ProgramCore;
use crate::watch::{self, Cause, Evidence, FaultNote, Verdict};

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
}

/// Recovers from the fault `error`, `verdict` naming its culprit from `evidence` (one entry per
/// program): notes the fault on every program that was on the GPU, resets, leaves the culprit
/// stopped and relaunches the others. Returns the culprit, if named, and why; fails only when a reset
/// failed (the process must then be replaced). Adds its findings to `log`.
pub fn recover<R: Recovery>(
    r: &mut R,
    verdict: &Verdict,
    error: &str,
    evidence: &[Evidence],
    log: &mut Vec<String>,
) -> Result<Option<(usize, String)>, R::Error> {
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
    let index = culprit.as_ref().map(|(i, _)| *i);
    let cause = index.map_or(Cause::NoneNamed, |i| Cause::Other(r.core(i).name.clone()));
    for i in (0..r.count()).filter(|&i| Some(i) != index) {
        if let Some(note) = &mut r.core(i).health.last_fault {
            if note.error == error && note.cause == Cause::Unknown {
                note.cause = cause.clone();
            }
        }
    }
    Ok(culprit)
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
) -> Result<Option<(usize, String)>, R::Error> {
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
