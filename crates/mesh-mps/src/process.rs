//! The one place mesh-mps starts child processes: tied children die with meshd (`PR_SET_PDEATHSIG`); detached ones outlive it.
//!
//! Tied is the default. Under `--orphan-grace-ms` the MPS control daemons, the workers and the
//! keeper are *detached* instead ([`spawn_detached`]): no death signal, and a session of their own,
//! so that neither meshd's crash nor a signal to its process group (a terminal's Ctrl-C) reaches
//! them; an orderly exit still ends each of them itself.
//!
//! PDEATHSIG fires when the *thread* that spawned the child exits, so children are spawned from
//! meshd's control thread, which lives as long as the process. A child whose parent is already gone
//! by the time it runs `pre_exec` exits at once. Children are `shared_child::SharedChild`s: any
//! thread may kill one while another waits on it (with a timeout, woken by SIGCHLD rather than a
//! poll), and one that is reaped already is never signalled.
//!
//! Every child inherits only what it is handed: meshd's descriptors are made close-on-exec before
//! each spawn ([`mesh_backend::fds::close_on_exec_all`]). The driver opens its own without the
//! flag, and a daemon or worker that inherited them would keep meshd's context (its device rings'
//! memory, the context itself) alive after meshd died, for as long as that child runs.

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
    mesh_backend::fds::close_on_exec_all()?;
    SharedChild::spawn(cmd)
}

/// Spawns `cmd` in a session of its own, with no death signal: it outlives this process.
pub fn spawn_detached(cmd: &mut Command) -> io::Result<SharedChild> {
    use std::os::unix::process::CommandExt;
    let detach = || rustix::process::setsid().map(|_| ()).map_err(io::Error::from);
    // SAFETY: `detach` runs between fork and exec and makes one async-signal-safe system call
    // (setsid); it takes no lock and makes no allocation.
    unsafe { cmd.pre_exec(detach) };
    mesh_backend::fds::close_on_exec_all()?;
    SharedChild::spawn(cmd)
}

/// Spawns `cmd` tied (SIGKILL at meshd's death) or, with `detached`, as [`spawn_detached`].
pub fn spawn_child(cmd: &mut Command, detached: bool) -> io::Result<SharedChild> {
    if detached { spawn_detached(cmd) } else { spawn_tied(cmd, Signal::KILL) }
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

/// A worker's process as meshd holds it: its own child, or one adopted from a previous meshd. An
/// adopted one is not our child, so it is watched and signalled through a pidfd, which (unlike a
/// pid) can never name a process that took a recycled pid.
#[derive(Debug)]
pub enum Held {
    /// Started by this meshd.
    Child(SharedChild),
    /// Adopted: its pid, and a pidfd opened while it was checked to be the worker it claimed.
    Adopted {
        /// Its pid.
        pid: u32,
        /// Readable once it has exited.
        pidfd: std::os::fd::OwnedFd,
    },
}

impl Held {
    /// Holds process `pid`, not a child of this one, by a pidfd.
    pub fn adopt(pid: u32) -> io::Result<Self> {
        let p = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| io::Error::other(format!("{pid} is no pid")))?;
        let pidfd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())?;
        Ok(Self::Adopted { pid, pidfd })
    }

    /// Its pid.
    pub fn id(&self) -> u32 {
        match self {
            Self::Child(c) => c.id(),
            Self::Adopted { pid, .. } => *pid,
        }
    }

    /// Waits up to `within` (`None`: for as long as it runs) for its end: `Some` once it has ended,
    /// holding its exit status when it is our child (an adopted one's goes to its parent). Reaps
    /// nothing but our child.
    pub fn wait_for(&self, within: Option<Duration>) -> Option<Option<std::process::ExitStatus>> {
        match (self, within) {
            (Self::Child(c), None) => c.wait().ok().map(Some),
            (Self::Child(c), Some(d)) if d.is_zero() => c.try_wait().ok().flatten().map(Some),
            (Self::Child(c), Some(d)) => c.wait_timeout(d).ok().flatten().map(Some),
            (Self::Adopted { pidfd, .. }, Some(d)) => {
                let ended = pidfd_readable(pidfd, d);
                if ended {
                    reap_if_ours(pidfd);
                }
                ended.then_some(None)
            }
            (Self::Adopted { pidfd, .. }, None) => {
                while !pidfd_readable(pidfd, Duration::from_secs(3600)) {}
                reap_if_ours(pidfd);
                Some(None)
            }
        }
    }

    /// Whether it has exited within `within` (zero: now), without reaping anything but our child.
    pub fn exited_within(&self, within: Duration) -> bool {
        self.wait_for(Some(within)).is_some()
    }

    /// Whether it still runs.
    pub fn alive(&self) -> bool {
        !self.exited_within(Duration::ZERO)
    }

    /// How it ended, in words ("still running" while it runs).
    pub fn status(&self) -> String {
        match self {
            Self::Child(c) => c.try_wait().ok().flatten().map_or("still running".to_string(), |s| s.to_string()),
            Self::Adopted { .. } if self.alive() => "still running".to_string(),
            // Its status went to its parent (init, or a subreaper), not to us.
            Self::Adopted { .. } => "exited".to_string(),
        }
    }

    /// SIGKILL, without waiting.
    pub fn signal_kill(&self) {
        match self {
            Self::Child(c) => {
                let _ = c.kill();
            }
            Self::Adopted { pidfd, .. } => {
                let _ = rustix::process::pidfd_send_signal(pidfd, Signal::KILL);
            }
        }
    }

    /// SIGKILL and wait for its end (an adopted one: up to [`ADOPTED_KILL_WAIT`]).
    pub fn kill(&self) {
        match self {
            Self::Child(c) => kill(c),
            Self::Adopted { .. } => {
                self.signal_kill();
                let _ = self.exited_within(ADOPTED_KILL_WAIT);
            }
        }
    }

    /// Waits for its end up to `timeout`; kills it if it is still there. Whether it left by itself.
    pub fn wait_or_kill(&self, timeout: Duration) -> bool {
        if self.exited_within(timeout) {
            return true;
        }
        self.kill();
        false
    }
}

/// Whether pidfd `pidfd` turns readable (its process exited) within `within`.
fn pidfd_readable(pidfd: &std::os::fd::OwnedFd, within: Duration) -> bool {
    let mut fds = [rustix::event::PollFd::new(pidfd, rustix::event::PollFlags::IN)];
    let t = rustix::event::Timespec {
        tv_sec: i64::try_from(within.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(within.subsec_nanos()),
    };
    matches!(rustix::event::poll(&mut fds, Some(&t)), Ok(n) if n > 0)
}

/// Reaps the ended process `pidfd` holds when it is our child after all: meshd handed over to a
/// new image of itself (`meshd handoff` executes it in the same process), so the workers it adopts
/// back are its children, which would otherwise stay zombies. Another process's child is not ours
/// to reap, and the call says so (ECHILD).
fn reap_if_ours(pidfd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsFd;
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
    );
}

/// How long [`Held::kill`] waits for an adopted process: a SIGKILLed MPS client lingers while the
/// driver tears its context down (up to 2 s seen on the H200).
pub const ADOPTED_KILL_WAIT: Duration = Duration::from_secs(5);

/// Whether process `pid` is dying: the kernel began its exit (`PF_EXITING` in `/proc/PID/stat`'s
/// flags), a SIGKILL is pending for it (`SigPnd`/`ShdPnd` in `/proc/PID/status`: one sent while it
/// sat in an uninterruptible driver call), or it is gone. A SIGKILLed MPS client lingers in D state
/// while the driver tears its context down (up to 2 s on the H200), its output not yet closed, so
/// neither its pipe nor `waitpid` says it died: this does, at once.
pub fn dying(pid: u32) -> bool {
    mesh_shm::claim::process_dying(pid)
}

/// The worker binary: `MESH_MPS_WORKER`, beside the running executable, or on `PATH` (else the bare
/// name, so that the spawn's error names what was missing).
pub fn worker_binary() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("MESH_MPS_WORKER") {
        return std::path::PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let c = dir.join("mesh-mps-worker");
            if c.is_file() {
                return c;
            }
        }
    }
    which::which("mesh-mps-worker").unwrap_or_else(|_| std::path::PathBuf::from("mesh-mps-worker"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_child_leads_its_own_session_and_a_tied_one_does_not() {
        let sid = |pid: u32| -> String {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            // After the command name: state, ppid, pgrp, session.
            stat.rsplit_once(')').unwrap().1.split_whitespace().nth(3).unwrap().to_string()
        };
        let detached = spawn_detached(Command::new("/bin/sleep").arg("30")).unwrap();
        let tied = spawn_tied(Command::new("/bin/sleep").arg("30"), Signal::KILL).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sid(detached.id()) != detached.id().to_string() {
            assert!(std::time::Instant::now() < deadline, "the detached child never led a session");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_ne!(sid(tied.id()), tied.id().to_string(), "a tied child stays in meshd's session");
        kill(&detached);
        kill(&tied);
    }

    #[test]
    fn an_adopted_process_is_watched_and_killed_through_its_pidfd() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let held = Held::adopt(child.id()).unwrap();
        assert_eq!(held.id(), child.id());
        assert!(held.alive());
        assert_eq!(held.status(), "still running");
        assert!(!held.exited_within(Duration::from_millis(20)), "a sleeping process does not exit");
        held.signal_kill();
        // Our own child here (as workers are after a handoff): the pidfd is readable once it is a
        // zombie, and the watch reaps it.
        assert!(held.exited_within(Duration::from_secs(5)), "killed through the pidfd");
        assert!(!held.alive());
        assert_eq!(held.status(), "exited");
        assert!(child.wait().is_err(), "reaped through the pidfd: no zombie is left for us to wait for");
        assert!(Held::adopt(4_000_000).is_err(), "no such process");
        let tied = Held::Child(spawn_tied(Command::new("/bin/sleep").arg("30"), Signal::KILL).unwrap());
        assert!(!tied.wait_or_kill(Duration::from_millis(20)), "it did not leave by itself");
        assert!(!tied.alive());
    }

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
