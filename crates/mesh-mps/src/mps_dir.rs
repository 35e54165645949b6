//! Taking over an `--mps-dir` whatever way the last meshd on it ended: a claim, the dead one's processes, stale pipes.
//!
//! The MPS control daemon leaves `control`, `control_lock` and `control_privileged` in its pipe
//! directory when it quits or dies, and a client started against an old `control` pipe silently runs
//! as a plain context (gpu.md). So a start claims the directory (an flock the kernel drops when meshd
//! dies, so a crash never leaves it claimed), waits for the processes of a dead meshd that the driver
//! is still tearing down (up to about 2 s after a kill -9), and removes what they left.

use std::path::Path;
use std::time::{Duration, Instant};

use mesh_backend::BackendError;
use mesh_backend::pid_lock::{EXITING_HOLDER_WAIT, PidLock};

/// The variable naming the pipe directory of an MPS server.
pub const PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// The control binary's name.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// The file in an MPS directory whose flock says which meshd holds the directory; it holds that pid.
pub const CLAIM_FILE: &str = "meshd.lock";

/// How long a start waits for a previous meshd's MPS processes to be torn down by the driver.
pub const PREVIOUS_TEARDOWN: Duration = Duration::from_secs(10);

/// This meshd's hold on an MPS directory: a [`PidLock`] on [`CLAIM_FILE`], released by the kernel
/// when the file closes, which a crash does too.
#[derive(Debug)]
pub struct DirClaim {
    _lock: PidLock,
}

impl DirClaim {
    /// Claims `root`, or refuses naming the pid of the meshd that holds it; a holder that is
    /// exiting (a meshd killed a moment ago) is waited for, up to [`EXITING_HOLDER_WAIT`].
    pub fn take(root: &Path) -> Result<Self, BackendError> {
        let path = root.join(CLAIM_FILE);
        match PidLock::take_from_exiting(&path, EXITING_HOLDER_WAIT, crate::process::dying) {
            Ok((Some(lock), waited)) => {
                if waited >= Duration::from_millis(1) {
                    tracing::info!(
                        "waited {waited:.1?} for the previous meshd, which was exiting, to release MPS directory {}",
                        root.display()
                    );
                }
                Ok(Self { _lock: lock })
            }
            Ok((None, _)) => Err(BackendError::MpsDaemon(format!(
                "MPS directory {} is in use by the meshd with pid {} (it holds {}): stop that meshd or give another --mps-dir",
                root.display(),
                PidLock::holder(&path).map_or_else(|| "unknown".to_string(), |p| p.to_string()),
                path.display()
            ))),
            Err(e) => Err(BackendError::MpsDaemon(format!("claiming MPS directory {}: {e}", root.display()))),
        }
    }
}

/// Processes other than this one whose environment names a pipe directory as theirs: a daemon,
/// server or client of that directory. `(pid, command name)`.
pub use mesh_mps_worker::orphan::processes_using;

/// The default `--mps-dir` of a meshd serving `mailbox`: `/tmp/meshd-mps-<uid>-<hash>`, where the
/// hash (FNV-1a, 64 bits, fixed by its definition so that every build of meshd computes the same)
/// is of the mailbox's path. Stable across restarts, so that a meshd started again with the same
/// arguments finds what the previous one left running; removed at an orderly exit.
pub fn default_root(mailbox: &Path) -> std::path::PathBuf {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in mailbox.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    std::path::PathBuf::from(format!("/tmp/meshd-mps-{}-{hash:016x}", rustix::process::getuid().as_raw()))
}

/// Waits until no process uses `pipe_dir` (those of a meshd that died, which the driver may take
/// seconds to tear down), saying so in the log; refuses, naming them, if some are still there after `within`.
pub fn wait_for_previous_processes(pipe_dir: &Path, within: Duration) -> Result<(), BackendError> {
    let start = Instant::now();
    let mut lingering = processes_using(pipe_dir);
    if lingering.is_empty() {
        return Ok(());
    }
    tracing::info!(
        "waiting up to {} s for {} MPS process(es) of a previous meshd on {} to end: {}",
        within.as_secs(),
        lingering.len(),
        pipe_dir.display(),
        describe(&lingering)
    );
    while !lingering.is_empty() {
        if start.elapsed() >= within {
            return Err(BackendError::MpsDaemon(format!(
                "MPS pipe directory {} is still in use after {} s by {}: another MPS daemon or client lives there; stop it or give another --mps-dir",
                pipe_dir.display(),
                within.as_secs(),
                describe(&lingering)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
        lingering = processes_using(pipe_dir);
    }
    tracing::info!("the previous meshd's MPS processes ended after {} ms", start.elapsed().as_millis());
    Ok(())
}

/// Removes whatever a previous daemon left in `pipe_dir`; with nothing alive there, all of it is stale.
pub fn remove_stale_pipes(pipe_dir: &Path) -> Result<(), BackendError> {
    let entries = std::fs::read_dir(pipe_dir)
        .map_err(|e| BackendError::MpsDaemon(format!("reading {}: {e}", pipe_dir.display())))?;
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let gone = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        gone.map_err(|e| BackendError::MpsDaemon(format!("removing the stale {}: {e}", path.display())))?;
        removed.push(entry.file_name().to_string_lossy().into_owned());
    }
    if !removed.is_empty() {
        removed.sort();
        tracing::info!("removed what a previous MPS daemon left in {}: {}", pipe_dir.display(), removed.join(", "));
    }
    Ok(())
}

fn describe(procs: &[(u32, String)]) -> String {
    procs.iter().map(|(pid, comm)| format!("{pid} ({comm})")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_directory_is_refused_naming_the_holder_and_free_again_once_released() {
        let root = tempfile::tempdir().unwrap();
        let claim = DirClaim::take(root.path()).unwrap();
        let err = DirClaim::take(root.path()).unwrap_err().to_string();
        assert!(err.contains(&format!("in use by the meshd with pid {}", std::process::id())), "{err}");
        assert!(err.contains("--mps-dir"), "{err}");
        drop(claim);
        // A child another test thread forks in the moment the lock file is open shares its open file
        // description (and so the flock) until that child execs and the close-on-exec descriptor
        // closes: allow that moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Err(e) = DirClaim::take(root.path()) {
            assert!(Instant::now() < deadline, "a released claim (as after a crash) can be taken again: {e}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_default_directory_is_stable_per_mailbox_and_user() {
        let a = default_root(Path::new("/dev/shm/meshd.mailbox"));
        assert_eq!(a, default_root(Path::new("/dev/shm/meshd.mailbox")), "the same every start");
        assert_ne!(a, default_root(Path::new("/dev/shm/other.mailbox")));
        let name = a.file_name().unwrap().to_str().unwrap().to_string();
        let uid = rustix::process::getuid().as_raw();
        assert!(
            name.starts_with(&format!("meshd-mps-{uid}-")) && name.len() == format!("meshd-mps-{uid}-").len() + 16,
            "{name}"
        );
        // FNV-1a of the empty path is its offset basis: the definition, not this build's hasher.
        assert!(default_root(Path::new("")).ends_with(format!("meshd-mps-{uid}-cbf29ce484222325")));
    }

    #[test]
    fn stale_pipe_files_are_removed_and_logs_elsewhere_untouched() {
        let root = tempfile::tempdir().unwrap();
        let pipe = root.path().join("pipe");
        std::fs::create_dir(&pipe).unwrap();
        for f in ["control", "control_lock", "control_privileged"] {
            std::fs::write(pipe.join(f), b"").unwrap();
        }
        std::fs::create_dir(pipe.join("server-dir")).unwrap();
        std::fs::write(root.path().join("keep.log"), b"x").unwrap();
        remove_stale_pipes(&pipe).unwrap();
        assert_eq!(std::fs::read_dir(&pipe).unwrap().count(), 0);
        assert!(root.path().join("keep.log").exists());
    }

    #[test]
    fn a_process_living_on_the_pipe_directory_is_found_waited_for_and_named() {
        let root = tempfile::tempdir().unwrap();
        let pipe = root.path().join("pipe");
        std::fs::create_dir(&pipe).unwrap();
        assert!(processes_using(&pipe).is_empty());
        // An absolute path: another test of this binary points PATH elsewhere.
        let mut child = std::process::Command::new("/bin/sleep").arg("30").env(PIPE_ENV, &pipe).spawn().unwrap();
        let pid = child.id();
        // Until it has exec'd, the forked child still carries this process's environment.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !processes_using(&pipe).iter().any(|(p, comm)| *p == pid && comm == "sleep") {
            assert!(Instant::now() < deadline, "pid {pid} with {PIPE_ENV} set was not found");
            std::thread::sleep(Duration::from_millis(5));
        }
        let err = wait_for_previous_processes(&pipe, Duration::from_millis(200)).unwrap_err().to_string();
        assert!(err.contains(&format!("{pid} (sleep)")) && err.contains("still in use"), "{err}");
        // One that ends while the start waits is waited for, not refused.
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            child.kill().unwrap();
            child.wait().unwrap();
        });
        wait_for_previous_processes(&pipe, Duration::from_secs(10)).unwrap();
        killer.join().unwrap();
    }
}
