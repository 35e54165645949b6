//! Waiting on sockets and processes: `poll` over a set of descriptors, and a process's pidfd (readable once it exits).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

/// A pidfd for `pid`, readable once the process has exited; `None` where the kernel has none (the
/// waits then poll the process's liveness every 100 ms instead).
pub(super) fn open_pidfd(pid: u32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Waits until one of `fds` is readable (or hung up), or `timeout` passes; which were. A pidfd among
/// them is readable once its process has exited.
pub(super) fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Vec<bool> {
    let mut polled: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(fd, PollFlags::IN)).collect();
    let spec = timeout.map(|t| rustix::time::Timespec {
        tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    match rustix::event::poll(&mut polled, spec.as_ref()) {
        Ok(_) => polled.iter().map(|p| !p.revents().is_empty()).collect(),
        // EINTR and the like: nothing is known ready; the caller looks again (after a pause, so that
        // an error that repeats never spins).
        Err(_) => {
            std::thread::sleep(Duration::from_millis(1));
            vec![false; fds.len()]
        }
    }
}
