//! The one place mesh-mps starts child processes: every child dies with meshd (`PR_SET_PDEATHSIG`).
//!
//! PDEATHSIG fires when the *thread* that spawned the child exits, so children are spawned from
//! meshd's control thread, which lives as long as the process. A child whose parent is already gone
//! by the time it runs `pre_exec` exits at once.

use std::io;
use std::process::{Child, Command};

use rustix::process::Signal;

/// Spawns `cmd` so that it receives `signal` when this process dies (SIGKILL included).
pub fn spawn_tied(cmd: &mut Command, signal: Signal) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let parent = rustix::process::getpid();
    let tie = move || {
        rustix::process::set_parent_process_death_signal(Some(signal)).map_err(io::Error::from)?;
        if rustix::process::getppid() != Some(parent) {
            // The parent died before the death signal was armed.
            // SAFETY: _exit is async-signal-safe and ends the forked child at once.
            unsafe { libc::_exit(1) };
        }
        Ok(())
    };
    // SAFETY: `tie` runs between fork and exec; it makes only async-signal-safe system calls
    // (prctl, getppid, _exit) and takes no lock and makes no allocation.
    unsafe { cmd.pre_exec(tie) };
    cmd.spawn()
}

/// Sends `signal` to a child that has not been reaped (callers reap in one place, after this).
pub fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Waits for `child` up to `timeout`; kills it (SIGKILL) if it is still there. Returns whether it left by itself.
pub fn wait_or_kill(child: &mut Child, timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}
