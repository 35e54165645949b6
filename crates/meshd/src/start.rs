//! `meshd run`'s first phase, before any GPU work: the default paths (per GPU with `--device`), the mailbox's lock,
//! the mailbox itself (taken over or created), the control socket.
//!
//! A live meshd holds an exclusive `flock` on `<mailbox>.lock`. The kernel drops it when the
//! process dies, however it dies and whatever PID namespace it runs in, so "nobody holds the lock"
//! is the proof that the previous meshd is gone, and its mailbox (channels, messages, counters) can
//! be taken over as it is. The pid in the mailbox header is only for messages.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mesh_backend::cleanup;
use mesh_backend::pid_lock::{EXITING_HOLDER_WAIT, PidLock};
use mesh_shm::{CreateMode, Mailbox, MailboxConfig, ShmError};

/// Why `meshd run` refuses to start. Each message names the flag that changes the outcome, spelled as the CLI spells it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another process holds the mailbox's lock.
    #[error(
        "mailbox {path}: in use by meshd pid {pid} (it holds {lock}); stop that one first (`meshd shutdown`), \
         or give this one another --shm"
    )]
    Held {
        /// The mailbox file's path (`--shm`).
        path: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// The holder's pid as it recorded it (in its own PID namespace), or "unknown".
        pid: String,
    },
    /// The file is a mailbox of another layout version.
    #[error(
        "mailbox {path}: {reason}; start with --fresh to replace it with an empty mailbox (its channels and \
         messages are lost), or give another --shm"
    )]
    OtherVersion {
        /// The mailbox file's path (`--shm`).
        path: PathBuf,
        /// The file's layout version against the one this meshd writes.
        reason: String,
    },
    /// The file is no valid mailbox.
    #[error("{error}; start with --fresh to replace it with an empty mailbox, or give another --shm")]
    Invalid {
        /// What `Mailbox::open` said: in the message, and not a source as well (a field named
        /// `source` is one, and `{:#}` then printed the reason twice).
        error: ShmError,
    },
    /// Anything else (a system call on the lock or the mailbox failed).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// The exclusive lock a live meshd holds on its mailbox (`<mailbox>.lock`): released by the kernel when the process dies.
#[derive(Debug)]
pub struct MailboxLock(PidLock);

impl MailboxLock {
    /// The lock file beside `mailbox`: `<mailbox>.lock`.
    pub fn path_for(mailbox: &Path) -> PathBuf {
        let mut name = mailbox.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Takes the lock without waiting; `Ok(None)` when another process holds it.
    pub fn try_take(mailbox: &Path) -> Result<Option<Self>> {
        Ok(PidLock::try_take(&Self::path_for(mailbox))?.map(Self))
    }

    /// Takes the lock, waiting up to [`EXITING_HOLDER_WAIT`] while its holder is a process that is
    /// exiting (a meshd killed a moment ago, whose flock goes only once the driver has torn its
    /// context down); `Ok(None)` when another process holds it. Says in the log how long it waited.
    pub fn take_from_exiting(mailbox: &Path) -> Result<Option<Self>> {
        let path = Self::path_for(mailbox);
        let (lock, waited) = PidLock::take_from_exiting(&path, EXITING_HOLDER_WAIT, mesh_shm::claim::process_dying)?;
        if lock.is_some() && waited >= std::time::Duration::from_millis(1) {
            tracing::info!(
                "waited {waited:.1?} for the previous meshd, which was exiting, to release the mailbox lock {}",
                path.display()
            );
        }
        Ok(lock.map(Self))
    }

    /// The pid a holder wrote into the lock file at `path`.
    fn recorded_pid(path: &Path) -> Option<u32> {
        PidLock::holder(path)
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Removes the lock file and releases the lock (at a clean exit). A meshd that opened the file
    /// just before sees, after its flock, that the path no longer names it, and retries.
    pub fn remove(self) {
        self.0.remove();
    }
}

/// How the mailbox was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A new, empty mailbox (none existed, or `--fresh`).
    Created,
    /// An existing mailbox nobody held, kept with every channel and message.
    TakenOver {
        /// The pid its last meshd recorded.
        previous_pid: Option<u32>,
        /// Channels it holds.
        channels: usize,
        /// Program slots the dead meshd left in use, now released.
        released_slots: Vec<u32>,
        /// Channels those programs bound whose consumer end no host process holds (so a GPU program
        /// may have consumed them), with the published consumer position and how many messages
        /// after it may be delivered again: a GPU consumer publishes its position in batches, so what
        /// it had taken since its last publication comes again after a crash (at-least-once).
        replay: Vec<Replay>,
    },
}

/// Messages of one channel that may be delivered again after a crash (see [`Origin::TakenOver`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The channel.
    pub channel: String,
    /// The consumer position published last: delivery resumes here.
    pub from: u64,
    /// Messages between it and the producer's published position: at most this many come again.
    pub at_most: u64,
}

/// The channels a crash may replay: bound by a slot still in use, consumer end held by no host process.
fn replay_windows(mailbox: &Mailbox) -> Vec<Replay> {
    let mut bound = std::collections::BTreeSet::new();
    for i in 0..mailbox.geometry().slot_count {
        if let Ok(slot) = mailbox.slot(i)
            && slot.in_use()
        {
            bound.extend(slot.bindings());
        }
    }
    // Each descriptor on its own: a damaged one (a peer process can write any) hides only itself.
    mailbox
        .channels_each()
        .into_iter()
        .filter_map(Result::ok)
        .filter(|c| bound.contains(&c.index) && c.consumer_pid.is_none() && c.head > c.tail)
        .map(|c| Replay { channel: c.name, from: c.tail, at_most: c.head - c.tail })
        .collect()
}

/// The mailbox, locked, and how it was obtained.
#[derive(Debug)]
pub struct Claimed {
    /// The mailbox, its header naming this process as owner.
    pub mailbox: Mailbox,
    /// The lock; hold it for as long as the mailbox is served.
    pub lock: MailboxLock,
    /// Created or taken over.
    pub origin: Origin,
}

/// Takes the mailbox at `path`: refused while another meshd holds its lock (one that is exiting is
/// waited for, up to [`EXITING_HOLDER_WAIT`]); else an existing valid
/// mailbox is taken over as it is (`config` is then ignored: the file's geometry wins), a missing
/// one created, and with `fresh` whatever is there replaced by an empty one.
pub fn claim_mailbox(path: &Path, config: &MailboxConfig, fresh: bool) -> Result<Claimed, StartError> {
    claim(path, config, fresh, true)
}

/// [`claim_mailbox`] for a meshd that may adopt its predecessor's programs (MPS mode under an
/// orphan grace): a mailbox taken over keeps its slots as they are, for the MPS backend frees
/// those of programs it does not adopt once it has retired their workers.
pub fn claim_mailbox_for_adoption(path: &Path, config: &MailboxConfig, fresh: bool) -> Result<Claimed, StartError> {
    claim(path, config, fresh, false)
}

fn claim(path: &Path, config: &MailboxConfig, fresh: bool, release: bool) -> Result<Claimed, StartError> {
    let Some(lock) = MailboxLock::take_from_exiting(path)? else {
        // The header's pid first (what the holder serves), the lock file's as a fallback.
        let pid = Mailbox::open(path)
            .ok()
            .and_then(|m| m.owner_pid())
            .or_else(|| MailboxLock::recorded_pid(&MailboxLock::path_for(path)));
        return Err(StartError::Held {
            path: path.to_path_buf(),
            lock: MailboxLock::path_for(path),
            pid: pid.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        });
    };
    let exists = path.symlink_metadata().is_ok();
    let (mailbox, origin) = if fresh || !exists {
        let mode = if fresh { CreateMode::Replace } else { CreateMode::Exclusive };
        let mailbox = Mailbox::create(path, config, mode).map_err(anyhow::Error::from)?;
        (mailbox, Origin::Created)
    } else {
        let mailbox = Mailbox::open(path).map_err(|e| match e {
            ShmError::Invalid { path, field: "layout version", reason } => {
                StartError::OtherVersion { path, reason: format!("layout version {reason}") }
            }
            error => StartError::Invalid { error },
        })?;
        let previous_pid = mailbox.owner_pid();
        let channels = mailbox.channels().map_err(|error| StartError::Invalid { error })?.len();
        let replay = replay_windows(&mailbox);
        let released_slots = if release { release_slots(&mailbox) } else { Vec::new() };
        (mailbox, Origin::TakenOver { previous_pid, channels, released_slots, replay })
    };
    mailbox.set_owner_pid(std::process::id());
    Ok(Claimed { mailbox, lock, origin })
}

/// Frees every slot a dead meshd left in use: its kernels died with it (blink: its context; MPS:
/// its workers, by PR_SET_PDEATHSIG), and the backend that starts now knows none of them. (Under an
/// orphan grace, [`claim_mailbox_for_adoption`] leaves them to the MPS backend instead.)
fn release_slots(mailbox: &Mailbox) -> Vec<u32> {
    let mut released = Vec::new();
    for i in 0..mailbox.geometry().slot_count {
        let Ok(slot) = mailbox.slot(i) else { continue };
        if slot.in_use() {
            slot.request_stop();
            slot.release();
            released.push(i);
        }
    }
    released
}

/// Refuses early (before any GPU work) a path that cannot be a control socket (too long, in a
/// missing directory, naming something other than a socket), or when a live meshd answers on `path`.
pub fn check_socket_free(path: &Path) -> Result<()> {
    check_socket_path(path)?;
    if path.exists() && UnixStream::connect(path).is_ok() {
        bail!("control socket {}: another meshd is listening there (give this one another --socket)", path.display());
    }
    Ok(())
}

/// Refuses, before anything else is done, a control socket path that cannot be bound or whose
/// file must not be replaced: too long for a Unix socket, in a directory that is not there, or
/// naming something other than a socket (a file, a directory, a FIFO, a device, a symbolic link),
/// which [`bind_socket`] would otherwise remove as a stale socket.
fn check_socket_path(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    // `sockaddr_un.sun_path`: 108 bytes, the terminating NUL included.
    const MAX_SOCKET_PATH: usize = 107;
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        bail!(
            "control socket {}: a path of {len} bytes, and a Unix socket's path holds at most {MAX_SOCKET_PATH}; \
             give a shorter --socket",
            path.display()
        );
    }
    if let Ok(meta) = path.symlink_metadata()
        && !meta.file_type().is_socket()
    {
        bail!(
            "control socket {}: {} is there, not a socket (meshd replaces only a stale socket); remove it or give \
             another --socket",
            path.display(),
            crate::state::kind_of(&meta.file_type())
        );
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!("control socket {}: its directory {} does not exist", path.display(), dir.display());
    }
    Ok(())
}

/// Binds the control socket with mode 0600, replacing a stale one, refusing when a live meshd answers there.
pub fn bind_socket(path: &Path) -> Result<UnixListener> {
    check_socket_free(path)?;
    if path.symlink_metadata().is_ok() {
        std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    // The socket is created with the process umask: tighten it for the bind so that no other user can connect in between.
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound.with_context(|| format!("control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Registers removal of `path` at exit, unless `keep`.
pub fn remove_at_exit(what: &'static str, path: PathBuf, keep: bool) {
    if !keep {
        cleanup::register(what, move || {
            let _ = std::fs::remove_file(&path);
        });
    }
}

/// Makes a bus error (SIGBUS) name its likely cause before meshd dies of it. The mailbox is a
/// mapped file: when another process shrinks it (`truncate`, a copy over it), meshd's next access past
/// the new end faults, and the default death prints nothing a user can act on. The action writes a
/// message prepared here, naming `mailbox`, then ends meshd with SIGBUS as before (exit status,
/// core dump and all): nothing can be recovered once the shared pages are gone. A registration that
/// fails is only logged: meshd runs as it would have without the message.
pub fn explain_bus_errors(mailbox: &Path) {
    static MESSAGE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let message = format!(
        "meshd: bus error (SIGBUS): a mapped file was shrunk under meshd, most likely the mailbox {} \
         (truncated or rewritten by another process while meshd ran: a mailbox must keep its size); \
         meshd stops, and its programs with it\n",
        mailbox.display()
    );
    if MESSAGE.set(message.into_bytes()).is_err() {
        return; // registered once per process: the first mailbox's message stands
    }
    let action = || {
        if let Some(m) = MESSAGE.get() {
            // SAFETY: write(2) on stderr with a buffer that lives for the whole process; it is
            // async-signal-safe, and a failed write changes nothing (the signal still ends meshd).
            let _ = unsafe { libc::write(libc::STDERR_FILENO, m.as_ptr().cast(), m.len()) };
        }
        // Back to the default action and raised again: meshd ends by SIGBUS, as it would have.
        let _ = signal_hook::low_level::emulate_default_handler(signal_hook::consts::SIGBUS);
    };
    // SAFETY: the action only reads a set-once buffer, calls write(2), and re-raises with the
    // default action (sigaction, sigprocmask, raise): all async-signal-safe, no allocation, no lock.
    if let Err(e) = unsafe { signal_hook::low_level::register(signal_hook::consts::SIGBUS, action) } {
        tracing::warn!("a bus error will end meshd without naming the mailbox: registering its message: {e}");
    }
}

// ---- One meshd per GPU: `--device` and the paths derived from the GPU's UUID ----

/// The default socket, mailbox and MPS directory of a meshd (every explicit flag overrides its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultPaths {
    /// The control socket.
    pub socket: PathBuf,
    /// The mailbox (its lock is `<mailbox>.lock`, its default state directory derives from it).
    pub shm: PathBuf,
    /// The MPS pipe and log directories; `None`: the MPS backend's default for the mailbox
    /// (`/tmp/meshd-mps-<uid>-<hash of its path>`), removed at exit.
    pub mps_dir: Option<PathBuf>,
}

/// The defaults for the GPU whose UUID is `uuid` (`GPU-…`, any case), or today's single-GPU
/// defaults without `--device`: `/tmp/meshd.sock`, `/dev/shm/meshd.mailbox`. A pure function of
/// the UUID, so one GPU gets the same paths whether `--device` named it by ordinal or by UUID.
pub fn default_paths(uuid: Option<&str>) -> DefaultPaths {
    match uuid {
        None => DefaultPaths {
            socket: PathBuf::from("/tmp/meshd.sock"),
            shm: PathBuf::from("/dev/shm/meshd.mailbox"),
            mps_dir: None,
        },
        Some(u) => {
            let u = mesh_cuda::device::normalize_uuid_prefix(u).unwrap_or_else(|| u.to_string());
            DefaultPaths {
                socket: PathBuf::from(format!("/tmp/meshd-{u}.sock")),
                shm: PathBuf::from(format!("/dev/shm/meshd-{u}.mailbox")),
                mps_dir: Some(PathBuf::from(format!("/tmp/meshd-mps-{u}"))),
            }
        }
    }
}

/// `selector` as a whole GPU UUID in `nvidia-smi -L`'s form, when it is one (a client then needs no driver).
pub fn whole_uuid(selector: &str) -> Option<String> {
    mesh_shm::paths::whole_uuid(selector)
}

/// Sets, for this process and every child, `CUDA_DEVICE_ORDER=PCI_BUS_ID` (ordinals then match
/// `nvidia-smi -L`) and, with `--device`, `CUDA_VISIBLE_DEVICES` to it: the driver then shows meshd
/// that one GPU as device 0, and the MPS control daemon, which inherits it, runs its server on that
/// GPU alone. Both take effect only before `cuInit`.
///
/// # Safety
/// Call at process start, before any other thread exists (it changes the environment).
pub unsafe fn select_device_env(device: Option<&str>) {
    // SAFETY: the caller guarantees no other thread runs, so nothing reads the environment meanwhile.
    unsafe {
        std::env::set_var("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
        if let Some(d) = device {
            std::env::set_var("CUDA_VISIBLE_DEVICES", d.trim());
        }
    }
}

/// The GPU this meshd serves, for `info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceId {
    /// `--device` as given.
    pub selector: Option<String>,
    /// Its UUID.
    pub uuid: String,
}

/// The UUID of the GPU `--device` named (after [`select_device_env`]: the one device the driver
/// shows). `cuInit`, `cuDeviceGet` and `cuDeviceGetUuid` only: no context, so no MPS client, no stall.
pub fn lookup_uuid(selector: &str) -> Result<String> {
    let device = mesh_cuda::Device::get(0)
        .and_then(|d| d.uuid())
        .with_context(|| format!("--device {selector}: the GPU could not be found (`nvidia-smi -L` lists them)"))?;
    if let Some(prefix) = mesh_cuda::device::normalize_uuid_prefix(selector.trim())
        && !device.starts_with(&prefix)
    {
        bail!("--device {selector}: the driver shows {device} instead");
    }
    Ok(device)
}

#[cfg(test)]
mod device_tests {
    use super::*;

    const UUID: &str = "GPU-5f3a0011-2233-4455-6677-8899aabbccdd";

    #[test]
    fn paths_derive_from_the_uuid_alone() {
        let p = default_paths(Some(UUID));
        assert_eq!(p.socket, PathBuf::from(format!("/tmp/meshd-{UUID}.sock")));
        assert_eq!(p.shm, PathBuf::from(format!("/dev/shm/meshd-{UUID}.mailbox")));
        assert_eq!(p.mps_dir, Some(PathBuf::from(format!("/tmp/meshd-mps-{UUID}"))));
        // However it is written, one GPU gets one set of paths.
        assert_eq!(default_paths(Some(&UUID.to_uppercase())), p);
        assert_ne!(default_paths(Some("GPU-00000000-2233-4455-6677-8899aabbccdd")), p);
        // Without --device: today's defaults.
        let d = default_paths(None);
        assert_eq!(
            (d.socket.to_str(), d.shm.to_str(), d.mps_dir),
            (Some("/tmp/meshd.sock"), Some("/dev/shm/meshd.mailbox"), None)
        );
    }

    #[test]
    fn only_a_whole_uuid_needs_no_driver() {
        assert_eq!(whole_uuid(&UUID.to_uppercase()).as_deref(), Some(UUID));
        assert_eq!(whole_uuid(" gpu-5f3a0011-2233-4455-6677-8899aabbccdd ").as_deref(), Some(UUID));
        for partial in
            ["0", "1", "GPU-5f3a", "GPU-5f3a00112233445566778899aabbccdd", "MIG-5f3a0011-2233-4455-6677-8899aabbccdd"]
        {
            assert_eq!(whole_uuid(partial), None, "{partial}");
        }
    }
}
