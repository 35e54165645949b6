//! The process-wide cleanup registry: actions run once, newest first, at normal exit and on SIGINT / SIGTERM.
//!
//! The MPS backend registers "kill the workers, quit the daemon" here, the
//! daemon "remove the mailbox": whatever way meshd ends short of SIGKILL,
//! they run, exactly once. (For SIGKILL, children carry `PR_SET_PDEATHSIG`.)

use std::sync::{Mutex, MutexGuard, OnceLock};

type Action = Box<dyn FnOnce() + Send>;

struct Registry {
    actions: Vec<(u64, &'static str, Action)>,
    next_id: u64,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    let lock = REGISTRY.get_or_init(|| Mutex::new(Registry { actions: Vec::new(), next_id: 1 }));
    // An action that panicked poisons nothing we rely on: the list stays consistent.
    lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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

/// Installs SIGINT and SIGTERM handling: on either, a dedicated thread runs the registry, then the
/// process dies of that signal (default disposition), so the parent sees the usual status.
pub fn install_signal_handlers() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new().name("mesh-cleanup-signals".into()).spawn(move || {
        if let Some(sig) = signals.forever().next() {
            run_all();
            let _ = signal_hook::low_level::emulate_default_handler(sig);
            std::process::exit(128 + sig);
        }
    })?;
    Ok(())
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
