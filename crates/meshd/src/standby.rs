//! The blink standby (`meshd run --standby 1` in blink mode): a second meshd process, warm, that
//! waits on the mailbox lock and takes over the moment the active process dies.
//!
//! Blink programs are kernels of meshd's own context, so they stop when meshd dies; what a restart
//! costs is the new process's start (its CUDA context alone takes about 200 ms). The standby pays
//! that before it is needed: started by the active meshd once it serves, it makes its context,
//! links every recorded image into the state directory's `linked/` store, and then tries the
//! mailbox lock every millisecond. The kernel releases the lock when the active process's files
//! close, after its kernels have stopped: on an H100 a killed meshd's kernel ran its last
//! iteration 9-10 ms after the SIGKILL and its lock came free at 20-32 ms (`restart.rs`,
//! `a_killed_blink_meshd_frees_its_lock_and_its_kernels_stop`), so no two generations of a program
//! run at once. Holding the lock, the standby goes the way of any meshd start (the mailbox taken
//! over, every recorded program relaunched at its next generation, the socket bound), and starts a
//! standby of its own.
//!
//! The standby inherits none of the active's descriptors: the driver's are not close-on-exec, and a
//! process holding them keeps the dead process's context, kernels and all, alive.
//!
//! The active meshd stops its standby (SIGTERM, waited for) before anything that releases the lock
//! in order: an orderly exit, and the exec of a handoff or of a replacement after a sticky fault,
//! whose new image starts a new standby. A standby that dies is started again after a second.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The option naming a standby's active meshd (hidden from `--help`).
pub const FLAG: &str = "--standby-for";

/// How long a stopped standby gets to leave before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// How long after a standby died another is started.
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// The running standby: its pid and the channel its watcher answers on once it has exited.
struct Running {
    pid: u32,
    exited: mpsc::Receiver<()>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);
static STOPPING: AtomicBool = AtomicBool::new(false);

/// The arguments of the standby of this process: its own as a new image of it gets them
/// ([`crate::replace::reexec_args`]: without `--fresh` or a `--standby-for`), then
/// `--standby-for <this pid>`.
pub fn standby_args(args: impl IntoIterator<Item = OsString>, active: u32) -> Vec<OsString> {
    let mut out = crate::replace::reexec_args(args);
    out.push(FLAG.into());
    out.push(active.to_string().into());
    out
}

/// Starts the standby of this meshd (this binary, [`standby_args`]), in a process group of its
/// own and without a death signal (it must outlive this process), and watches it: one that exits
/// while this meshd still serves is started again after [`RESTART_AFTER`]. Returns its pid.
pub fn start() -> std::io::Result<u32> {
    STOPPING.store(false, Ordering::SeqCst);
    let child = spawn()?;
    let pid = child.id();
    watch(child);
    Ok(pid)
}

fn spawn() -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    // The driver's descriptors are not close-on-exec: a standby that inherited them would hold this
    // process's context, and with it its kernels, alive after this process died.
    if let Err(e) = crate::replace::close_on_exec_all() {
        tracing::warn!("marking descriptors close-on-exec before the standby starts: {e}");
    }
    let args = standby_args(std::env::args_os(), std::process::id());
    let mut cmd = Command::new("/proc/self/exe");
    cmd.args(args.iter().skip(1)).stdin(Stdio::null()).process_group(0);
    cmd.spawn()
}

/// Waits for `child` on a thread of its own: records it as the running standby, and when it exits
/// unasked, starts another.
fn watch(mut child: Child) {
    let (tx, rx) = mpsc::channel();
    *RUNNING.lock() = Some(Running { pid: child.id(), exited: rx });
    let _ = std::thread::Builder::new().name("meshd-standby".into()).spawn(move || {
        let status = child.wait();
        let _ = tx.send(());
        if STOPPING.load(Ordering::SeqCst) {
            return;
        }
        tracing::warn!(
            "the standby meshd {} exited ({}); another starts in {} s",
            child.id(),
            status.map_or_else(|e| e.to_string(), |s| s.to_string()),
            RESTART_AFTER.as_secs()
        );
        std::thread::sleep(RESTART_AFTER);
        if STOPPING.load(Ordering::SeqCst) {
            return;
        }
        match spawn() {
            Ok(next) => {
                tracing::info!("standby meshd {} started", next.id());
                watch(next);
            }
            Err(e) => tracing::error!("starting a standby meshd: {e}; this meshd runs without one"),
        }
    });
}

/// Stops the standby, if one runs: SIGTERM, then waited for (SIGKILL past [`STOP_WITHIN`]). Called
/// before this process releases the mailbox lock in order, so that the standby never takes an
/// orderly exit for a death.
pub fn stop() {
    STOPPING.store(true, Ordering::SeqCst);
    let Some(running) = RUNNING.lock().take() else { return };
    let signal = |sig| {
        if let Some(pid) = rustix::process::Pid::from_raw(running.pid.cast_signed()) {
            let _ = rustix::process::kill_process(pid, sig);
        }
    };
    signal(rustix::process::Signal::TERM);
    if running.exited.recv_timeout(STOP_WITHIN).is_err() {
        tracing::warn!("the standby meshd {} did not stop within {STOP_WITHIN:?}: killed", running.pid);
        signal(rustix::process::Signal::KILL);
        let _ = running.exited.recv_timeout(STOP_WITHIN);
    }
}

/// The pid of the running standby, if any.
pub fn pid() -> Option<u32> {
    RUNNING.lock().as_ref().map(|r| r.pid)
}

/// Every recorded program's image linked for `arch` into the state directory `state_dir`'s
/// `linked/` store (which a start loads instead of linking), once each: `tried` holds the hashes
/// done. Returns how many were linked now. Errors are logged, not fatal: the takeover links what
/// is missing itself.
pub fn prelink(
    state_dir: &Path,
    arch: &str,
    link: &mut dyn FnMut(&mesh_backend::ProgramSpec) -> Option<Vec<u8>>,
    tried: &mut std::collections::HashSet<String>,
) -> usize {
    let Ok(store) = crate::state::StateStore::open(state_dir) else { return 0 };
    let mut linked = 0;
    for p in &store.recorded().programs {
        if !tried.insert(p.image_sha256.clone()) || store.linked(&p.image_sha256, arch).is_some() {
            continue;
        }
        let Ok(spec) = store.spec_of(p) else { continue };
        if let Some(image) = link(&spec) {
            match store.store_linked(&p.image_sha256, arch, &image) {
                Ok(()) => linked += 1,
                Err(e) => tracing::warn!("standby: storing {}'s linked image: {e:#}", p.name),
            }
        }
    }
    linked
}

/// Waits, trying every millisecond, until the mailbox lock of `mailbox` is free and takes it, or
/// until `stop` is set (`None`). Every `rescan` it calls `idle` (the standby's pre-linking).
pub fn wait_for_lock(
    mailbox: &Path,
    stop: &AtomicBool,
    rescan: Duration,
    mut idle: impl FnMut(),
) -> anyhow::Result<Option<crate::start::MailboxLock>> {
    let mut next_scan = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        if let Some(lock) = crate::start::MailboxLock::try_take(mailbox)? {
            return Ok(Some(lock));
        }
        if Instant::now() >= next_scan {
            idle();
            next_scan = Instant::now() + rescan;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_standby_gets_its_actives_arguments_without_fresh_and_names_its_active() {
        let args = os(&["meshd", "--socket", "/s", "run", "--fresh", "--standby", "1", "--keep-shm"]);
        assert_eq!(
            standby_args(args, 42),
            os(&["meshd", "--socket", "/s", "run", "--standby", "1", "--keep-shm", FLAG, "42"])
        );
        // A standby that took over starts its own: the old active's pid is not passed on.
        let args = os(&["meshd", "run", FLAG, "7", "--keep-shm", "--standby-for=9"]);
        assert_eq!(standby_args(args, 8), os(&["meshd", "run", "--keep-shm", FLAG, "8"]));
    }

    #[test]
    fn waiting_for_the_lock_takes_it_once_its_holder_lets_go_and_stops_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mailbox = dir.path().join("mb");
        let held = crate::start::MailboxLock::try_take(&mailbox).unwrap().unwrap();
        let stop = AtomicBool::new(false);
        let mut scans = 0;
        std::thread::scope(|s| {
            let waiter = s.spawn(|| wait_for_lock(&mailbox, &stop, Duration::from_millis(5), || scans += 1));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!waiter.is_finished(), "it waits while the lock is held");
            drop(held);
            let lock = waiter.join().unwrap().unwrap();
            assert!(lock.is_some(), "taken once free");
        });
        assert!(scans >= 2, "idle work ran while it waited: {scans}");
        // Told to stop, a waiter returns without the lock.
        stop.store(true, Ordering::SeqCst);
        assert!(wait_for_lock(&mailbox, &stop, Duration::from_secs(1), || {}).unwrap().is_none());
    }
}
