//! Named points between the stores of a channel's creation and deletion, where a test build (feature `crash-points`) kills its own process.
//!
//! A creation or a deletion is a few stores under the table lock, and the mailbox must be whole
//! after a process killed between any two of them. `tests/crash_steps.rs` proves it by killing a
//! child at every point listed in [`CRASH_STEPS`] and taking the mailbox over after it. The list is
//! the one record of the points: the code calls [`crash_point`] only with a name from it (a build
//! with the feature panics on any other), and the test checks that each name in the source is in
//! the list and that each point of the list is reached. A store added to these paths without a
//! point of its own is a step the test cannot see, so one is added with it.
//!
//! Without the feature [`crash_point`] is empty and inlined away.

/// Every crash point, in the order an operation reaches them: a creation (of any protocol or
/// placement), a channel's deletion, a service's deletion.
#[cfg(feature = "crash-points")]
pub const CRASH_STEPS: &[&str] = &[
    "create:locked",
    "create:header-zeroed",
    "create:slots-zeroed",
    "create:slots-laid-out",
    "create:descriptor-written",
    "create:high-water-stored",
    "create:published",
    "delete:checked",
    "delete:unpublished",
    "service-delete:checked",
    "service-delete:group-unpublished",
    "service-delete:fanin-unpublished",
];

/// Kills this process with SIGKILL (nothing runs after it: no unwinding, no destructor, no lock
/// released) when the environment variable `MESH_CRASH_AT` names `step`, or names it as `step@N`
/// and this is the `N`th time this process reaches it (so that a test can kill the second of two
/// creations).
#[cfg(feature = "crash-points")]
pub(crate) fn crash_point(step: &'static str) {
    use std::sync::Mutex;
    static HITS: Mutex<Vec<(&str, u32)>> = Mutex::new(Vec::new());
    assert!(CRASH_STEPS.contains(&step), "crash point {step:?} is not in CRASH_STEPS");
    let Some(wanted) = std::env::var_os("MESH_CRASH_AT") else { return };
    let wanted = wanted.to_string_lossy();
    let (name, nth) = match wanted.split_once('@') {
        Some((name, n)) => (name, n.parse::<u32>().unwrap_or(1)),
        None => (&*wanted, 1),
    };
    if name != step {
        return;
    }
    let mut hits = HITS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let count = match hits.iter_mut().find(|(s, _)| *s == step) {
        Some((_, n)) => {
            *n += 1;
            *n
        }
        None => {
            hits.push((step, 1));
            1
        }
    };
    if count == nth {
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL to oneself is delivered before the call returns; should it not be, nothing after
        // this point may run either.
        loop {
            std::thread::park();
        }
    }
}

/// Without the feature, no point does anything.
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub(crate) fn crash_point(_step: &'static str) {}
