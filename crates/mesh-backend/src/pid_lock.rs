//! A lock file a live meshd holds with an exclusive `flock` and writes its pid into: the mailbox's and the MPS directory's claims.
//!
//! The kernel drops an flock when the process dies, however it dies and in whatever PID namespace,
//! so "nobody holds the lock" proves the previous holder gone; the pid inside is only for messages.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;

/// An exclusive, close-on-exec flock on a file that holds the holder's pid.
#[derive(Debug)]
pub struct PidLock {
    file: File,
    path: PathBuf,
}

/// How long a start waits for an exiting holder ([`PidLock::take_from_exiting`]): the driver's
/// teardown of a killed context takes tens of ms, and seconds where other contexts of the GPU are
/// alive (the unit restarts meshd 100 ms after a crash).
pub const EXITING_HOLDER_WAIT: Duration = Duration::from_secs(10);

impl PidLock {
    /// Takes the lock at `path` without waiting; `Ok(None)` when another process holds it.
    pub fn try_take(path: &Path) -> io::Result<Option<Self>> {
        loop {
            // Close-on-exec (std's default): a child (an MPS worker) must not inherit the lock and
            // keep it after meshd dies.
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(|e| with_path(e, "opening", path))?;
            match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(with_path(e.into(), "flock of", path)),
            }
            // A holder that was exiting may have removed the file between our open and our flock:
            // then we hold a lock on a file nobody else will find. Retry on the one at the path.
            let same = std::fs::metadata(path)
                .ok()
                .zip(file.metadata().ok())
                .is_some_and(|(at_path, ours)| at_path.ino() == ours.ino() && at_path.dev() == ours.dev());
            if same {
                let mut lock = Self { file, path: path.to_path_buf() };
                lock.record_pid().map_err(|e| with_path(e, "writing our pid into", path))?;
                return Ok(Some(lock));
            }
        }
    }

    /// [`PidLock::try_take`], waiting up to `within` while the lock's holder is a process that is
    /// exiting (`exiting(pid)`, for the pid it wrote): a meshd killed a moment ago keeps its flock
    /// until the kernel has closed its files, which waits for the GPU driver to tear its contexts
    /// down (tens of ms, seconds with other contexts alive), and a restart that came sooner would be
    /// refused. A live holder refuses at once. Returns the lock (`None`: held) and how long it waited.
    pub fn take_from_exiting(
        path: &Path,
        within: Duration,
        exiting: impl Fn(u32) -> bool,
    ) -> io::Result<(Option<Self>, Duration)> {
        let began = Instant::now();
        loop {
            if let Some(lock) = Self::try_take(path)? {
                return Ok((Some(lock), began.elapsed()));
            }
            let holder_exiting = Self::holder(path).is_some_and(&exiting);
            if !holder_exiting || began.elapsed() >= within {
                return Ok((None, began.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The pid the holder of the lock at `path` wrote into it, if it is readable.
    pub fn holder(path: &Path) -> Option<u32> {
        let mut s = String::new();
        File::open(path).ok()?.read_to_string(&mut s).ok()?;
        s.trim().parse().ok()
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the lock file and releases the lock (at a clean exit). A process that opened the
    /// file just before sees, after its flock, that the path no longer names it, and retries.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }

    fn record_pid(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        writeln!(self.file, "{}", std::process::id())
    }
}

impl AsFd for PidLock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} lock file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn held_then_free_once_dropped_and_the_pid_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let lock = PidLock::try_take(&path).unwrap().expect("free");
        assert_eq!(PidLock::holder(&path), Some(std::process::id()));
        assert!(PidLock::try_take(&path).unwrap().is_none(), "held");
        drop(lock);
        assert!(PidLock::try_take(&path).unwrap().is_some(), "free again once its descriptor is closed");
    }

    #[test]
    fn the_lock_is_close_on_exec_so_a_new_image_of_meshd_can_take_it() {
        let dir = tempfile::tempdir().unwrap();
        let lock = PidLock::try_take(&dir.path().join("x.lock")).unwrap().expect("free");
        // SAFETY: reads the flags of a descriptor the lock owns.
        let flags = unsafe { libc::fcntl(lock.as_fd().as_raw_fd(), libc::F_GETFD) };
        assert!(flags >= 0 && flags & libc::FD_CLOEXEC != 0, "flags {flags:#x}");
    }

    #[test]
    fn a_holder_that_is_exiting_is_waited_for_and_a_live_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let lock = PidLock::try_take(&path).unwrap().expect("free");
        // The lock handed to a child that ends in 300 ms: its stdin shares the locked file's open
        // description, and so the flock, which our copy closed here leaves held.
        let mut child =
            std::process::Command::new("sleep").arg("0.3").stdin(lock.file.try_clone().unwrap()).spawn().unwrap();
        drop(lock);
        std::fs::write(&path, format!("{}\n", child.id())).unwrap();
        let (live, waited) = PidLock::take_from_exiting(&path, Duration::from_secs(10), |_| false).unwrap();
        assert!(live.is_none() && waited < Duration::from_millis(100), "a live holder refuses at once ({waited:?})");
        let child_pid = child.id();
        let (taken, waited) = PidLock::take_from_exiting(&path, Duration::from_secs(10), |p| p == child_pid).unwrap();
        assert!(taken.is_some(), "taken once the exiting holder is gone");
        assert!(waited >= Duration::from_millis(100), "it waited for the holder ({waited:?})");
        child.wait().unwrap();
        // A holder that outlasts the wait: refused after it.
        let lock = PidLock::try_take(&dir.path().join("y.lock")).unwrap().expect("free");
        let (held, waited) =
            PidLock::take_from_exiting(&dir.path().join("y.lock"), Duration::from_millis(50), |_| true).unwrap();
        assert!(held.is_none() && waited >= Duration::from_millis(50), "{waited:?}");
        drop(lock);
    }

    #[test]
    fn a_removed_lock_file_is_not_held_by_anyone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        PidLock::try_take(&path).unwrap().expect("free").remove();
        assert!(!path.exists());
        assert!(PidLock::try_take(&path).unwrap().is_some());
    }

    #[test]
    fn an_unwritable_place_is_an_error_naming_the_file() {
        let err = PidLock::try_take(Path::new("/nonexistent-dir/x.lock")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent-dir/x.lock"), "{err}");
    }
}
