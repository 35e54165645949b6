//! The process-wide cleanup registry: actions run once, newest first, whenever the process ends.
//!
//! The MPS backend registers "kill the workers, quit the daemon" here, the
//! daemon "remove the mailbox": whatever way meshd ends short of SIGKILL,
//! they run, exactly once. meshd runs the registry on its way out ([`RunOnDrop`], [`run_all`]),
//! from the signal handling it installs itself (it turns SIGINT / SIGTERM into an orderly stop).
//! (For SIGKILL, children carry `PR_SET_PDEATHSIG`.)

use parking_lot::{Mutex, MutexGuard};

type Action = Box<dyn FnOnce() + Send>;

struct Registry {
    actions: Vec<(u64, &'static str, Action)>,
    next_id: u64,
}

fn registry() -> MutexGuard<'static, Registry> {
    // parking_lot's lock is never poisoned: an action that panicked (it runs unlocked anyway)
    // leaves the list consistent.
    static REGISTRY: Mutex<Registry> = Mutex::new(Registry { actions: Vec::new(), next_id: 1 });
    REGISTRY.lock()
}

/// Identifies a registered action, to run or drop it early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupId(u64);

/// Registers `action` under `name` (used in logs); it runs once, after every action registered later.
pub fn register(name: &'static str, action: impl FnOnce() + Send + 'static) -> CleanupId {
    let mut r = registry();
    let id = r.next_id;
    r.next_id += 1;
    r.actions.push((id, name, Box::new(action)));
    CleanupId(id)
}

/// Runs one action now (if it has not run), e.g. when the resource it guards is released normally.
pub fn run_one(id: CleanupId) {
    let action = {
        let mut r = registry();
        let pos = r.actions.iter().position(|(i, ..)| *i == id.0);
        pos.map(|p| r.actions.remove(p))
    };
    if let Some((_, _, action)) = action {
        action();
    }
}

/// Forgets an action without running it.
pub fn cancel(id: CleanupId) {
    registry().actions.retain(|(i, ..)| *i != id.0);
}

/// Runs every pending action, newest first; each runs once even if this is called again or concurrently.
/// Returns the names of the actions run, in order.
pub fn run_all() -> Vec<&'static str> {
    let mut ran = Vec::new();
    loop {
        // Take one at a time, without holding the lock while it runs: an action may register or cancel.
        let Some((_, name, action)) = registry().actions.pop() else { return ran };
        action();
        ran.push(name);
    }
}

/// Runs the registry when dropped: hold one in `main` for normal exit and unwinding.
#[derive(Debug)]
#[must_use = "the registry runs when this guard is dropped"]
pub struct RunOnDrop;

impl Drop for RunOnDrop {
    fn drop(&mut self) {
        run_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::Mutex as StdMutex;

    // One test only touches the global registry, so that parallel tests cannot interleave with it.
    #[test]
    fn actions_run_once_newest_first_and_can_be_run_or_cancelled_early() {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let push = |tag: &'static str| {
            let log = log.clone();
            move || log.lock().unwrap().push(tag)
        };
        register("first", push("first"));
        let early = register("early", push("early"));
        let dropped = register("dropped", push("dropped"));
        register("last", push("last"));
        run_one(early);
        run_one(early);
        cancel(dropped);
        assert_eq!(run_all(), ["last", "first"]);
        assert!(run_all().is_empty(), "nothing runs twice");
        assert_eq!(*log.lock().unwrap(), ["early", "last", "first"]);
    }
}
