//! Replacing meshd's process after a sticky GPU fault: the decision (pure functions: whom to leave
//! stopped, the search by halves across processes, the bound on replacements) and the exec itself.
//!
//! After a sticky fault no CUDA call of the process works again (NVIDIA: "the process must be
//! terminated and relaunched"). So the blink backend names the culprit and asks for a replacement
//! ([`mesh_backend::watch::Replacement`]); meshd records in the state directory what the new
//! process needs (the culprit's mark, restarts, the search, the time of the fault, the linked
//! images), marks every descriptor close-on-exec (the mailbox lock, the socket, the driver's) and
//! executes `/proc/self/exe` with its own arguments (`--fresh` left out): same pid, so whatever
//! waits on it (systemd, a test harness) sees nothing. The new image takes the unheld mailbox
//! over (channels and messages kept), relaunches every recorded program but the culprit, and binds
//! the socket again.
//!
//! When the evidence names no culprit, it is searched by halves **across processes**
//! ([`Search`]): each question relaunches the innocent programs and a set of suspects, watched for
//! [`QUESTION_WATCH`]; a clean answer lets the same process relaunch the next set, a fault replaces
//! the process again and the new one asks the next question. The answers are recorded, and the
//! next question is found by replaying them through [`mesh_backend::watch::search_by_halves`].
//!
//! The bound: at most [`MAX_REEXECS`] replacements within [`REEXEC_WINDOW`]; past it the new
//! process relaunches nothing (every program stopped, with the reason), so an immediate fault
//! cannot loop.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use mesh_backend::watch::{self, Verdict};
use serde::{Deserialize, Serialize};

/// At most this many replacements of the process within [`REEXEC_WINDOW`] relaunch programs.
/// (A search among 64 programs takes at most 8.)
pub const MAX_REEXECS: usize = 8;

/// The window of [`MAX_REEXECS`].
pub const REEXEC_WINDOW: Duration = Duration::from_secs(60);

/// How long a question of the search (a set relaunched) is watched for the fault to come back
/// (the blink backend's own search watches as long).
pub const QUESTION_WATCH: Duration = Duration::from_millis(250);

/// The replacements in `history` (ms since the Unix epoch) that fall within the window before `now_ms`.
pub fn recent(history: &[u64], now_ms: u64) -> Vec<u64> {
    let window = u64::try_from(REEXEC_WINDOW.as_millis()).unwrap_or(u64::MAX);
    history.iter().copied().filter(|&t| t <= now_ms && now_ms - t < window).collect()
}

/// Whether one more replacement may relaunch programs: fewer than [`MAX_REEXECS`] within the window.
pub fn reexec_allowed(history: &[u64], now_ms: u64) -> bool {
    recent(history, now_ms).len() < MAX_REEXECS
}

/// A search by halves for a culprit the evidence did not name, carried across processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Search {
    /// The fault that started it.
    pub error: String,
    /// The programs whose kernels were on the GPU.
    pub suspects: Vec<String>,
    /// The one a heartbeat hint names, tried first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub likely: Option<String>,
    /// The answers so far, in order: whether the set asked faulted.
    pub answers: Vec<bool>,
    /// When the first fault was noticed, `CLOCK_MONOTONIC` ns (the recovery's time counts from it).
    pub noticed_mono_ns: u64,
}

/// What the search does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Relaunch these suspects (beside every innocent program) and watch them.
    Ask(Vec<String>),
    /// Found.
    Found(String),
    /// No suspect at all.
    Nobody,
}

impl Search {
    /// The next step: the answers replayed through [`watch::search_by_halves`], whose first
    /// unanswered question is the next one.
    pub fn step(&self) -> Step {
        let indices: Vec<usize> = (0..self.suspects.len()).collect();
        let likely = self.likely.as_ref().and_then(|l| self.suspects.iter().position(|s| s == l));
        let mut asked = 0;
        let mut next: Option<Vec<usize>> = None;
        let found = watch::search_by_halves(&indices, likely, |set| {
            if let Some(&answer) = self.answers.get(asked) {
                asked += 1;
                return answer;
            }
            next.get_or_insert_with(|| set.to_vec());
            true
        });
        let name = |i: usize| self.suspects[i].clone();
        match (next, found) {
            (Some(set), _) => Step::Ask(set.into_iter().map(name).collect()),
            (None, Some(i)) => Step::Found(name(i)),
            (None, None) => Step::Nobody,
        }
    }
}

/// What the new process runs after a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The culprit and why it is named: left stopped.
    pub culprit: Option<(String, String)>,
    /// A search under way: its next question is relaunched.
    pub search: Option<Search>,
    /// Past the bound: nothing is relaunched, for this reason.
    pub halted: Option<String>,
}

/// Decides what the new process runs after a fault whose `verdict` indexes `programs`: the culprit
/// named, a search begun or continued (`asking`: the search whose question was being watched when
/// the fault came, which answers it), or, past the bound, nothing relaunched.
pub fn plan(
    programs: &[String],
    verdict: &Verdict,
    error: &str,
    noticed_mono_ns: u64,
    asking: Option<Search>,
    history: &[u64],
    now_ms: u64,
) -> Plan {
    let from_search = |s: Search| match s.step() {
        Step::Found(name) => Plan {
            culprit: Some((
                name,
                format!("found by halves in {} relaunch(es) of {} suspects", s.answers.len(), s.suspects.len()),
            )),
            search: None,
            halted: None,
        },
        Step::Ask(_) => Plan { culprit: None, search: Some(s), halted: None },
        Step::Nobody => Plan { culprit: None, search: None, halted: None },
    };
    let mut plan = match (asking, verdict) {
        (Some(mut s), _) => {
            s.answers.push(true);
            from_search(s)
        }
        (None, Verdict::Culprit { index, why }) => match programs.get(*index) {
            Some(name) => Plan { culprit: Some((name.clone(), why.clone())), search: None, halted: None },
            None => Plan { culprit: None, search: None, halted: None },
        },
        (None, Verdict::Search { suspects, likely }) => from_search(Search {
            error: error.to_string(),
            suspects: suspects.iter().filter_map(|&i| programs.get(i).cloned()).collect(),
            likely: likely.and_then(|i| programs.get(i).cloned()),
            answers: Vec::new(),
            noticed_mono_ns,
        }),
        (None, Verdict::NoCulprit) => Plan { culprit: None, search: None, halted: None },
    };
    if !reexec_allowed(history, now_ms) {
        plan.search = None;
        plan.halted = Some(format!(
            "not relaunched: meshd replaced its process {} times within {} s after GPU faults (the last: {error}); \
             upgrade or reload it to run it again",
            recent(history, now_ms).len(),
            REEXEC_WINDOW.as_secs()
        ));
    }
    plan
}

/// `args` (this process's, `argv[0]` first) for the new image: the same, without `--fresh` (or its
/// old name `--replace-shm`), which would forget the mailbox and the programs being recovered.
pub fn reexec_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter().filter(|a| a != "--fresh" && a != "--replace-shm").collect()
}

/// `CLOCK_MONOTONIC` now, ns: one clock for the old image and the new one.
pub fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Now, ms since the Unix epoch (0 before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

static PROCESS_START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
static PROCESS_START_UNIX_MS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Records when this process image started (`main` calls it first), for the recovery's log and
/// `info` (which tells a new image from the one it replaced by it: the pid is the same).
pub fn mark_process_start() {
    PROCESS_START.get_or_init(mono_ns);
    PROCESS_START_UNIX_MS.get_or_init(unix_ms);
}

/// When this process image started (`CLOCK_MONOTONIC` ns), if `main` said.
pub fn process_start() -> Option<u64> {
    PROCESS_START.get().copied()
}

/// When this process image started, ms since the Unix epoch, if `main` said.
pub fn process_start_unix_ms() -> Option<u64> {
    PROCESS_START_UNIX_MS.get().copied()
}

/// Marks every descriptor above stderr close-on-exec, so that the new image inherits none: the
/// mailbox lock, the control socket, and the driver's (which libcuda opens without the flag).
pub use mesh_backend::fds::close_on_exec_all;

/// Replaces this process with a new image of meshd: `/proc/self/exe` with [`reexec_args`]. Returns
/// only when the exec failed, with its error.
pub fn exec_self() -> std::io::Error {
    exec(std::path::Path::new("/proc/self/exe"))
}

/// Replaces this process with `binary`, given this process's arguments ([`reexec_args`]) and
/// environment: what `meshd handoff` executes. Returns only when the exec failed, with its error.
pub fn exec(binary: &std::path::Path) -> std::io::Error {
    if let Err(e) = close_on_exec_all() {
        tracing::warn!("marking descriptors close-on-exec: {e}");
    }
    let args = reexec_args(std::env::args_os());
    let mut cmd = std::process::Command::new(binary);
    if let Some(arg0) = args.first() {
        cmd.arg0(arg0);
    }
    cmd.args(args.iter().skip(1));
    cmd.exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("p{i}")).collect()
    }

    #[test]
    fn the_bound_counts_only_replacements_within_the_window() {
        let now = 1_000_000;
        let window = u64::try_from(REEXEC_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let mut history: Vec<u64> = (0..MAX_REEXECS as u64 - 1).map(|i| now - i * 1000).collect();
        assert!(reexec_allowed(&history, now), "{} within the window", history.len());
        history.push(now - 5);
        assert!(!reexec_allowed(&history, now), "the bound reached");
        // The same ones, later: all out of the window.
        assert!(reexec_allowed(&history, now + window));
        assert_eq!(recent(&[now - window, now - window + 1], now), [now - window + 1]);
    }

    #[test]
    fn a_named_culprit_is_left_stopped_and_past_the_bound_nothing_runs() {
        let programs = names(3);
        let named = Verdict::Culprit { index: 2, why: "its image was loaded 40 ms before the fault".into() };
        let p = plan(&programs, &named, "E", 1, None, &[], 10);
        assert_eq!(p.culprit.as_ref().map(|c| c.0.as_str()), Some("p2"));
        assert_eq!((p.search, p.halted), (None, None));
        let full: Vec<u64> = vec![10; MAX_REEXECS];
        let p = plan(&programs, &named, "E", 1, None, &full, 10);
        assert_eq!(p.culprit.as_ref().map(|c| c.0.as_str()), Some("p2"), "still named");
        assert!(p.halted.as_deref().is_some_and(|h| h.contains("not relaunched") && h.contains("8 times")), "{p:?}");
        assert_eq!(plan(&programs, &Verdict::NoCulprit, "E", 1, None, &[], 10).culprit, None);
    }

    /// Plays a whole search across processes: each faulting question is a new [`plan`], each clean
    /// one an answer the same process records; counts the processes.
    fn play(n: usize, culprit: usize, likely: Option<usize>) -> (String, usize, usize) {
        let programs = names(n);
        let verdict = Verdict::Search { suspects: (0..n).collect(), likely };
        let mut p = plan(&programs, &verdict, "E", 1, None, &[], 10);
        let (mut processes, mut questions) = (1, 0);
        loop {
            if let Some((name, why)) = p.culprit {
                assert!(why.contains("found by halves"), "{why}");
                return (name, processes, questions);
            }
            let mut search = p.search.clone().expect("a search");
            match search.step() {
                Step::Ask(set) => {
                    questions += 1;
                    assert!(!set.is_empty());
                    if set.contains(&programs[culprit]) {
                        processes += 1;
                        p = plan(&programs, &verdict, "E", 1, Some(search), &[], 10);
                    } else {
                        search.answers.push(false);
                        match search.step() {
                            Step::Found(name) => return (name, processes, questions),
                            _ => p = Plan { culprit: None, search: Some(search), halted: None },
                        }
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_search_by_halves_across_processes_finds_every_culprit() {
        for n in 2..=9usize {
            for culprit in 0..n {
                let (found, processes, questions) = play(n, culprit, None);
                assert_eq!(found, format!("p{culprit}"), "n {n}");
                let bound = n.next_power_of_two().ilog2() as usize;
                assert!(questions <= bound, "n {n} culprit {culprit}: {questions} questions");
                assert!(processes <= bound + 1, "n {n} culprit {culprit}: {processes} processes");
            }
        }
        // A right hint: one clean question, no second process.
        assert_eq!(play(8, 5, Some(5)), ("p5".into(), 1, 1));
    }

    #[test]
    fn the_answers_replay_to_the_next_question() {
        let s = Search { error: "E".into(), suspects: names(4), likely: None, answers: Vec::new(), noticed_mono_ns: 0 };
        assert_eq!(s.step(), Step::Ask(vec!["p0".into(), "p1".into()]));
        let s = Search { answers: vec![false], ..s };
        assert_eq!(s.step(), Step::Ask(vec!["p0".into(), "p1".into(), "p2".into()]), "the cleared ones run on");
        let s = Search { answers: vec![false, true], ..s };
        assert_eq!(s.step(), Step::Found("p2".into()));
        let none = Search { suspects: Vec::new(), ..s };
        assert_eq!(none.step(), Step::Nobody);
    }

    #[test]
    fn the_new_image_gets_the_same_arguments_without_fresh() {
        let args = ["meshd", "--socket", "/s", "run", "--fresh", "--shm", "/m", "--replace-shm"].map(OsString::from);
        let want = ["meshd", "--socket", "/s", "run", "--shm", "/m"].map(OsString::from);
        assert_eq!(reexec_args(args), want);
    }

    #[test]
    fn every_descriptor_is_left_close_on_exec() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("x")).unwrap();
        // SAFETY: dup of a descriptor this test owns; the copy is closed below.
        let dup = unsafe { libc::dup(f.as_raw_fd()) };
        assert!(dup > 2);
        // SAFETY: reads the flags of the descriptor just made.
        assert_eq!(unsafe { libc::fcntl(dup, libc::F_GETFD) } & libc::FD_CLOEXEC, 0, "dup clears it");
        close_on_exec_all().unwrap();
        // SAFETY: as above.
        assert_ne!(unsafe { libc::fcntl(dup, libc::F_GETFD) } & libc::FD_CLOEXEC, 0);
        // SAFETY: closes the copy this test made.
        unsafe { libc::close(dup) };
    }
}
