//! The one place mesh-mps starts child processes: every child dies with meshd (`PR_SET_PDEATHSIG`).
//!
//! PDEATHSIG fires when the *thread* that spawned the child exits, so children are spawned from
//! meshd's control thread, which lives as long as the process. A child whose parent is already gone
//! by the time it runs `pre_exec` exits at once. Children are `shared_child::SharedChild`s: any
//! thread may kill one while another waits on it (with a timeout, woken by SIGCHLD rather than a
//! poll), and one that is reaped already is never signalled.

use std::io;
use std::process::Command;
use std::time::Duration;

use rustix::process::Signal;
use shared_child::SharedChild;

/// Spawns `cmd` so that it receives `signal` when this process dies (SIGKILL included).
pub fn spawn_tied(cmd: &mut Command, signal: Signal) -> io::Result<SharedChild> {
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
    SharedChild::spawn(cmd)
}

/// Makes `cmd`'s child inherit descriptor `fd` (close-on-exec here, as std opens everything, so no
/// other child gets it) as descriptor `at`: changed in the child only, after the fork. `at` equal
/// to `fd` keeps the number; another moves it there (`dup2`), replacing whatever the child had at
/// `at`, which was close-on-exec too and would have closed at exec anyway.
pub fn inherit_fd(cmd: &mut Command, fd: i32, at: i32) {
    use std::os::unix::process::CommandExt;
    let keep = move || {
        if fd == at {
            // SAFETY: `fd` is open in the child (the fork copied it); only its flags change.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            return rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).map_err(io::Error::from);
        }
        // SAFETY: dup2 on two descriptor numbers, `fd` open in the child; the copy has no close-on-exec.
        if unsafe { libc::dup2(fd, at) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: `keep` runs between fork and exec and makes one async-signal-safe call (fcntl or
    // dup2); it takes no lock and makes no allocation.
    unsafe { cmd.pre_exec(keep) };
}

/// Waits for `child` up to `timeout`; kills it (SIGKILL) and reaps it if it is still there.
/// Returns whether it left by itself.
pub fn wait_or_kill(child: &SharedChild, timeout: Duration) -> bool {
    if let Ok(Some(_)) = child.wait_timeout(timeout) {
        return true;
    }
    kill(child);
    false
}

/// SIGKILL and reap (a child already reaped is left alone).
pub fn kill(child: &SharedChild) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether the child still runs.
pub fn alive(child: &SharedChild) -> bool {
    child.try_wait().is_ok_and(|s| s.is_none())
}

/// Whether process `pid` is dying: the kernel began its exit (`PF_EXITING` in `/proc/PID/stat`'s
/// flags), a SIGKILL is pending for it (`SigPnd`/`ShdPnd` in `/proc/PID/status`: one sent while it
/// sat in an uninterruptible driver call), or it is gone. A SIGKILLed MPS client lingers in D state
/// while the driver tears its context down (up to 2 s on the H200), its output not yet closed, so
/// neither its pipe nor `waitpid` says it died: this does, at once.
pub fn dying(pid: u32) -> bool {
    mesh_shm::claim::process_dying(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_is_not_dying_a_killed_or_vanished_one_is() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(!dying(pid), "a sleeping child");
        assert!(!dying(std::process::id()), "this test itself");
        child.kill().unwrap();
        // A zombie until reaped: dying.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !dying(pid) {
            assert!(std::time::Instant::now() < deadline, "a SIGKILLed child never showed as dying");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(dying(pid), "a reaped child is gone");
    }
}
