//! Native GPU workers: ordinary processes that drive the GPU themselves and talk to the programs through the mailbox, started by `meshd spawn` as meshd's children.
//!
//! * **Spawn** (on the backend thread, which lives as long as meshd, so that `PR_SET_PDEATHSIG`
//!   ends the worker with meshd, `kill -9` included): the command runs in a process group of its
//!   own with [`ENV_MAILBOX`], [`ENV_CHANNELS`], [`ENV_READY_FD`], [`ENV_NAME`], [`ENV_ISOLATION`]
//!   and, in MPS mode, `CUDA_MPS_PIPE_DIRECTORY` (meshd's private server) in its environment.
//! * **Ready**: the worker writes `ready\n` to the descriptor [`ENV_READY_FD`] names (C:
//!   `dprintf(atoi(getenv("MESH_READY_FD")), "ready\n")`; Python:
//!   `os.write(int(os.environ["MESH_READY_FD"]), b"ready\n")`; any shell: `echo ready >&$MESH_READY_FD`
//!   (it is always descriptor [`READY_FD`], 3);
//!   mesh-shm-c: `mesh_shm_ready()`). In MPS mode meshd then checks that it is a client of *its*
//!   server ([`Membership`]); a worker that fails the check, exits first, or says nothing within
//!   its ready timeout is killed and refused with the reason. The wait runs on a thread of its own,
//!   so the backend thread goes on serving.
//! * **Stop**: SIGTERM to the group, then (after the grace period; in MPS mode after
//!   `terminate_client`) SIGKILL. A worker that has ended stays listed with its exit until it is
//!   stopped (removed) or a new one takes its name.
//! * **Outliving meshd** (`meshd run --orphan-grace-ms` > 0, MPS mode): workers are started in
//!   sessions of their own instead, with no death signal, and the desired state records each one's
//!   pid and start time. A restarted meshd adopts a recorded worker that still runs (the same pid
//!   with the same start time, a client of the adopted MPS server) instead of starting it again:
//!   it is held by a pidfd from then on, and its exit status, which goes to its new parent, shows
//!   as `exited`. One that fails a check is ended before a new one starts. A worker whose meshd does
//!   not come back is killed by the MPS directory's keeper once the grace has passed.

mod ready;

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_mps::process::Held;
use mesh_shm::Mailbox;
use parking_lot::Mutex;
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

use ready::{Why, ready_pipe, wait_for_ready};

/// The mailbox's path.
pub const ENV_MAILBOX: &str = "MESH_MAILBOX";
/// The worker's channels, comma-separated, in `--bind` order.
pub const ENV_CHANNELS: &str = "MESH_CHANNELS";
/// The variable naming the descriptor to write `ready\n` to.
pub const ENV_READY_FD: &str = "MESH_READY_FD";

/// The descriptor a worker inherits the ready pipe under (and [`ENV_READY_FD`] names): always 3,
/// a one-digit number every shell's redirection takes.
pub const READY_FD: i32 = 3;
/// The worker's name in `ps`.
pub const ENV_NAME: &str = "MESH_NATIVE_NAME";
/// `blink` or `mps`.
pub const ENV_ISOLATION: &str = "MESH_ISOLATION";
/// Where an MPS client finds its server (set in MPS mode only).
pub const ENV_MPS_PIPE: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// What `meshd spawn` waits for a worker to say, by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `meshd stop` waits after SIGTERM before SIGKILL, by default.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);
/// What blink mode means for a native worker, said by the README and by `meshd spawn`.
pub const BLINK_NOTE: &str = "blink mode: this worker's CUDA context time-slices with meshd's (no MPS), so the resident \
                              programs may stall for about 1.4 ms at a time while it runs kernels";

/// A native worker to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeSpec {
    /// Its name in `ps` (unique among native workers).
    pub name: String,
    /// The channels it is told about, in order.
    pub bind: Vec<String>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// How long it may take to say `ready`.
    pub ready_timeout: Duration,
}

/// MPS mode's checks of a native worker (the real one is [`MpsMembership`]; tests use stand-ins).
pub trait Membership: Send + Sync {
    /// The pipe directory a worker must be started with; `None`: no server to join (refused).
    fn pipe_dir(&self) -> Option<PathBuf>;
    /// Whether `pid` is a client of our server, and why not.
    fn check(&self, pid: u32) -> Result<(), String>;
    /// Cuts `pid` off the server before it is killed (best effort).
    fn terminate(&self, pid: u32);
}

/// The membership of meshd's own MPS backend (`mesh_mps::native_pipe_dir` / `check_native`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MpsMembership;

impl Membership for MpsMembership {
    fn pipe_dir(&self) -> Option<PathBuf> {
        mesh_mps::native_pipe_dir()
    }
    fn check(&self, pid: u32) -> Result<(), String> {
        mesh_mps::check_native(pid).map_err(|e| e.to_string())
    }
    fn terminate(&self, pid: u32) {
        if let Err(e) = mesh_mps::terminate_native(pid) {
            tracing::debug!(pid, "terminate_client of a native worker: {e}");
        }
    }
}

/// Why a native worker was refused, or could not be stopped.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs, reason = "each field is named in its variant's message")]
pub enum NativeError {
    /// A name `ps` could not show.
    #[error("native worker name {0:?}: 1 to 48 characters, no spaces")]
    BadName(String),
    /// `meshd spawn NAME` with nothing after `--`.
    #[error("native worker {0}: no command given (meshd spawn NAME -- CMD [ARGS...])")]
    NoCommand(String),
    /// A live worker holds the name.
    #[error("native worker {name} already runs (pid {pid}); `meshd stop {name}` first")]
    AlreadyRuns { name: String, pid: u32 },
    /// `MESH_CHANNELS` is comma-separated.
    #[error("channel {0:?}: a native worker's channel name may not hold a comma")]
    CommaInChannel(String),
    /// A channel to bind that the mailbox refused.
    #[error("native worker {name}: {source}")]
    Channel { name: String, source: mesh_shm::ShmError },
    /// The ready pipe could not be made.
    #[error("native worker {name}: a pipe: {source}")]
    Pipe { name: String, source: std::io::Error },
    /// MPS mode without a server to join.
    #[error("native worker {0}: meshd's MPS daemon has no pipe directory")]
    NoMpsPipe(String),
    /// The command could not be started.
    #[error("native worker {name}: starting {program:?}: {source}")]
    Start { name: String, program: String, source: std::io::Error },
    /// It became ready but its row is gone (stopped meanwhile).
    #[error("{0} vanished")]
    Vanished(String),
    /// It did not become ready (or is not our MPS server's client): it was killed.
    #[error("native worker {name} (pid {pid}) refused and killed: {why}")]
    Refused { name: String, pid: u32, why: String },
    /// `meshd stop` of a name no worker has.
    #[error("no native worker {0} (a resident program is ended with `meshd unload {0}`)")]
    Unknown(String),
    /// Another worker took the name while this one stopped.
    #[error("native worker {0} was replaced while stopping")]
    Replaced(String),
}

/// Whether `name` is one a worker may have: what `ps` can show in its column.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 48 && !name.contains(char::is_whitespace)
}

/// Where a native worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Starting,
    Running,
    Stopping,
    /// Ended, with its status when meshd is its parent (an adopted worker's goes elsewhere).
    Ended(Option<ExitStatus>),
}

fn describe_exit(s: Option<ExitStatus>) -> String {
    match s.map(|s| (s.code(), s.signal())) {
        Some((Some(c), _)) => format!("exited({c})"),
        Some((None, Some(sig))) => format!("killed(signal {sig})"),
        Some(_) => "ended".into(),
        None => "exited".into(),
    }
}

/// The start time of process `pid` (`/proc/PID/stat`'s 22nd field, clock ticks after boot), unless
/// it is gone or a zombie: with the pid, what names one process for good.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` begins at the 3rd field (the state).
    if matches!(fields.first(), Some(&"Z" | &"X")) {
        return None;
    }
    fields.get(22 - 3)?.parse().ok()
}

impl std::fmt::Display for Life {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Life::Starting => f.write_str("starting"),
            Life::Running => f.write_str("running"),
            Life::Stopping => f.write_str("stopping"),
            Life::Ended(s) => f.write_str(&describe_exit(*s)),
        }
    }
}

/// A native worker's row in `ps`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NativeRow {
    /// Name.
    pub name: String,
    /// Process id.
    pub pid: u32,
    /// starting, running, stopping, exited(N), killed(signal N).
    pub state: String,
    /// Its channels, in order.
    pub bind: Vec<String>,
    /// The command line.
    pub command: String,
    /// blink or mps.
    pub isolation: String,
}

struct Entry {
    /// What it was started from: what a restarted meshd starts again.
    spec: NativeSpec,
    child: Arc<Held>,
    life: Life,
    bind: Vec<String>,
    command: String,
    isolation: String,
}

type Table = Arc<Mutex<BTreeMap<String, Entry>>>;

/// meshd's native workers. Cheap to clone; every clone sees the same table.
#[derive(Clone)]
pub struct Natives {
    mailbox: Mailbox,
    table: Table,
    membership: Arc<Mutex<Option<Arc<dyn Membership>>>>,
    grace: Duration,
    /// Started detached and adopted by a restarted meshd ([`Natives::outliving_meshd`]).
    outlive: bool,
}

impl std::fmt::Debug for Natives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Natives({} workers)", self.table.lock().len())
    }
}

/// Signals the worker's process group while its leader runs (so that the group id is still its),
/// then the leader itself through its handle.
fn signal_group(child: &Held, sig: Signal) {
    // The group is the worker's own (process_group(0), or its own session, at spawn) and its
    // leader still runs, so the id is not reused.
    if child.alive()
        && let Some(group) = i32::try_from(child.id()).ok().and_then(Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(group, sig);
    }
    if sig == Signal::KILL {
        child.signal_kill();
    }
}

impl Natives {
    /// No workers yet; blink mode until [`Natives::set_membership`].
    pub fn new(mailbox: &Mailbox) -> Self {
        Self {
            mailbox: mailbox.clone(),
            table: Arc::default(),
            membership: Arc::new(Mutex::new(None)),
            grace: DEFAULT_STOP_GRACE,
            outlive: false,
        }
    }

    /// With `outlive`, workers are started in sessions of their own (no death signal: they
    /// outlive a crash of meshd) and a restarted meshd may [`Natives::adopt`] them.
    #[must_use]
    pub fn outliving_meshd(mut self, outlive: bool) -> Self {
        self.outlive = outlive;
        self
    }

    /// Whether workers outlive meshd.
    pub fn outlive(&self) -> bool {
        self.outlive
    }

    /// How long a stop waits between SIGTERM and SIGKILL.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// MPS mode: workers join `m`'s server and must pass its check.
    pub fn set_membership(&self, m: Arc<dyn Membership>) {
        *self.membership.lock() = Some(m);
    }

    /// Every worker, by name.
    pub fn rows(&self) -> Vec<NativeRow> {
        self.table
            .lock()
            .iter()
            .map(|(name, e)| NativeRow {
                name: name.clone(),
                pid: e.child.id(),
                state: e.life.to_string(),
                bind: e.bind.clone(),
                command: e.command.clone(),
                isolation: e.isolation.clone(),
            })
            .collect()
    }

    /// The workers meshd wants running (starting or running, not stopping or ended), as they were
    /// started: the desired state a restarted meshd starts again.
    pub fn wanted(&self) -> Vec<NativeSpec> {
        self.table
            .lock()
            .values()
            .filter(|e| matches!(e.life, Life::Starting | Life::Running))
            .map(|e| e.spec.clone())
            .collect()
    }

    /// The workers meshd wants running, each with its pid and start time once it runs, when workers
    /// outlive meshd (what a restarted meshd checks before it adopts one).
    pub fn wanted_with_process(&self) -> Vec<(NativeSpec, Option<(u32, u64)>)> {
        self.table
            .lock()
            .values()
            .filter(|e| matches!(e.life, Life::Starting | Life::Running))
            .map(|e| {
                let running = self.outlive && e.life == Life::Running;
                let process = running.then(|| start_ticks(e.child.id()).map(|t| (e.child.id(), t))).flatten();
                (e.spec.clone(), process)
            })
            .collect()
    }

    /// Adopts worker `spec` that a previous meshd started as `pid` at `ticks` (see
    /// [`start_ticks`]) and that still runs: checked to be that process (and in MPS mode a client
    /// of meshd's server), then held by a pidfd, running. A process that is not that one is left
    /// alone; one that is, but fails the server's check, is ended. Either way the caller starts
    /// the worker anew, and the reason is returned.
    pub fn adopt(&self, spec: &NativeSpec, pid: u32, ticks: u64) -> Result<NativeRow, String> {
        let name = &spec.name;
        self.check(spec).map_err(|e| e.to_string())?;
        if start_ticks(pid) != Some(ticks) {
            return Err(format!("its recorded process {pid} is gone (or the pid names another process now)"));
        }
        let held = Held::adopt(pid).map_err(|e| format!("holding its process {pid}: {e}"))?;
        // The pidfd first: from here on the pid cannot come to name another process.
        if start_ticks(pid) != Some(ticks) {
            return Err(format!("its recorded process {pid} ended meanwhile"));
        }
        let child = Arc::new(held);
        let membership = self.membership.lock().clone();
        if let Some(m) = &membership
            && let Err(why) = m.check(pid)
        {
            self.end(&child, self.grace);
            return Err(format!("process {pid} is not a client of meshd's MPS server ({why}): ended"));
        }
        self.table.lock().insert(
            name.clone(),
            Entry {
                spec: spec.clone(),
                child: child.clone(),
                life: Life::Running,
                bind: spec.bind.clone(),
                command: spec.command.join(" "),
                isolation: if membership.is_some() { "mps" } else { "blink" }.into(),
            },
        );
        self.reap_in_background(name.clone(), child);
        tracing::info!(native = %name, pid, "native worker adopted from the previous meshd: it ran on");
        self.rows().into_iter().find(|r| &r.name == name).ok_or_else(|| format!("{name} vanished"))
    }

    /// Starts `spec` (call on the thread that lives as long as meshd: PDEATHSIG watches it) and
    /// hands the outcome to `reply` from a thread of its own once the worker is ready or refused.
    pub fn spawn(&self, spec: NativeSpec, reply: impl FnOnce(Result<NativeRow, NativeError>) + Send + 'static) {
        match self.start(&spec) {
            Ok((child, read_end)) => {
                let this = self.clone();
                let spawned = std::thread::Builder::new()
                    .name("meshd-native".into())
                    .spawn(move || reply(this.await_ready(&spec, &child, read_end)));
                if let Err(e) = spawned {
                    tracing::error!("no thread to wait for a native worker: {e}");
                }
            }
            Err(e) => reply(Err(e)),
        }
    }

    /// Checks `spec`, spawns the worker and records it as starting; returns it and the ready pipe's read end.
    fn start(&self, spec: &NativeSpec) -> Result<(Arc<Held>, OwnedFd), NativeError> {
        let program = self.check(spec)?;
        let name = &spec.name;
        let membership = self.membership.lock().clone();
        let (read_end, write_end) = ready_pipe().map_err(|source| NativeError::Pipe { name: name.clone(), source })?;
        let fd = write_end.as_raw_fd();
        let mut cmd = Command::new(program);
        cmd.args(&spec.command[1..])
            .env(ENV_MAILBOX, self.mailbox.path())
            .env(ENV_CHANNELS, spec.bind.join(","))
            .env(ENV_READY_FD, READY_FD.to_string())
            .env(ENV_NAME, name)
            .stdin(Stdio::null());
        // A group of its own, so that a stop reaches its children too; outliving meshd, a session
        // of its own (which makes it a group leader: setsid refuses a process that already is one).
        if !self.outlive {
            cmd.process_group(0);
        }
        let isolation = match &membership {
            Some(m) => {
                let dir = m.pipe_dir().ok_or_else(|| NativeError::NoMpsPipe(name.clone()))?;
                // An MPS client must not have CUDA_VISIBLE_DEVICES (NVIDIA's rule, as for our workers):
                // the server already sees only meshd's GPU.
                cmd.env(ENV_MPS_PIPE, dir).env(ENV_ISOLATION, "mps").env_remove("CUDA_VISIBLE_DEVICES");
                "mps"
            }
            None => {
                cmd.env(ENV_ISOLATION, "blink");
                "blink"
            }
        };
        // Descriptor READY_FD in the worker, whatever its number here: a one-digit number that every
        // shell's `>&3` takes (dash reads `>&10` as descriptor 1 and `0`).
        mesh_mps::process::inherit_fd(&mut cmd, fd, READY_FD);
        let spawned = if self.outlive {
            mesh_mps::process::spawn_detached(&mut cmd)
        } else {
            mesh_mps::process::spawn_tied(&mut cmd, rustix::process::Signal::KILL)
        };
        let child =
            spawned.map_err(|source| NativeError::Start { name: name.clone(), program: program.clone(), source })?;
        // Only the worker holds the write end now: its exit closes the pipe.
        drop(write_end);
        let child = Arc::new(Held::Child(child));
        tracing::info!(native = %name, pid = child.id(), "native worker started: {}", spec.command.join(" "));
        self.table.lock().insert(
            name.clone(),
            Entry {
                spec: spec.clone(),
                child: child.clone(),
                life: Life::Starting,
                bind: spec.bind.clone(),
                command: spec.command.join(" "),
                isolation: isolation.into(),
            },
        );
        self.reap_in_background(name.clone(), child.clone());
        Ok((child, read_end))
    }

    /// Checks `spec`'s name, command and channels; returns the program to run.
    fn check<'s>(&self, spec: &'s NativeSpec) -> Result<&'s String, NativeError> {
        let name = &spec.name;
        if !valid_name(name) {
            return Err(NativeError::BadName(name.clone()));
        }
        let Some(program) = spec.command.first() else {
            return Err(NativeError::NoCommand(name.clone()));
        };
        if let Some(e) = self.table.lock().get(name).filter(|e| !matches!(e.life, Life::Ended(_))) {
            return Err(NativeError::AlreadyRuns { name: name.clone(), pid: e.child.id() });
        }
        for c in &spec.bind {
            if c.contains(',') {
                return Err(NativeError::CommaInChannel(c.clone()));
            }
            self.mailbox.channel(c).map_err(|source| NativeError::Channel { name: name.clone(), source })?;
        }
        Ok(program)
    }

    /// One thread per worker waits for its exit and records it (the one place it is reaped).
    fn reap_in_background(&self, name: String, child: Arc<Held>) {
        let table = self.table.clone();
        let spawned = std::thread::Builder::new().name("meshd-native-reap".into()).spawn(move || {
            if let Some(status) = child.wait_for(None) {
                tracing::info!(native = %name, pid = child.id(), "native worker {}", describe_exit(status));
                if let Some(e) = table.lock().get_mut(&name).filter(|e| Arc::ptr_eq(&e.child, &child)) {
                    e.life = Life::Ended(status);
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!("no thread to reap a native worker: {e}");
        }
    }

    /// Waits for `ready\n` on `read_end` until the spec's timeout; in MPS mode checks membership.
    fn await_ready(&self, spec: &NativeSpec, child: &Arc<Held>, read_end: OwnedFd) -> Result<NativeRow, NativeError> {
        let (name, pid) = (&spec.name, child.id());
        let outcome =
            wait_for_ready(&read_end, spec.ready_timeout).and_then(|()| match self.membership.lock().clone() {
                Some(m) => m.check(pid).map_err(|why| Why::Other(format!("not a client of meshd's MPS server: {why}"))),
                None => Ok(()),
            });
        let refused = match outcome {
            Ok(()) => {
                let mut table = self.table.lock();
                if let Some(e) = table.get_mut(name).filter(|e| Arc::ptr_eq(&e.child, child))
                    && e.life == Life::Starting
                {
                    e.life = Life::Running;
                }
                drop(table);
                tracing::info!(native = %name, pid, "native worker ready");
                return self
                    .rows()
                    .into_iter()
                    .find(|r| &r.name == name)
                    .ok_or_else(|| NativeError::Vanished(name.clone()));
            }
            Err(Why::Eof) => match child.wait_for(Some(Duration::from_secs(2))) {
                Some(s) => format!("{} before it reported ready", describe_exit(s)),
                None => "closed its ready descriptor without reporting ready".to_string(),
            },
            Err(Why::Timeout) => format!(
                "did not report ready within {:.1} s (it must write \"ready\\n\" to the descriptor {ENV_READY_FD} names)",
                spec.ready_timeout.as_secs_f64()
            ),
            Err(Why::Said(other)) => format!("said {other:?} instead of \"ready\""),
            Err(Why::Other(e)) => e,
        };
        self.end(child, Duration::ZERO);
        self.table.lock().remove(name);
        let why = NativeError::Refused { name: name.clone(), pid, why: refused };
        tracing::warn!("{why}");
        Err(why)
    }

    /// SIGTERM to the worker's group; SIGKILL after `grace` (MPS: after cutting it off the server).
    fn end(&self, child: &Held, grace: Duration) {
        if !grace.is_zero() {
            signal_group(child, Signal::TERM);
            if child.wait_for(Some(grace)).is_some() {
                return;
            }
        }
        if let Some(m) = self.membership.lock().clone()
            && child.alive()
        {
            m.terminate(child.id());
        }
        signal_group(child, Signal::KILL);
        let _ = child.wait_for(Some(Duration::from_secs(10)));
    }

    /// Ends worker `name` (SIGTERM, SIGKILL after the grace period) and forgets it; returns its last
    /// row, whose state says how it ended.
    pub fn stop(&self, name: &str) -> Result<NativeRow, NativeError> {
        // A name no worker can have says why (an empty one otherwise read "no native worker  (…
        // `meshd unload `)").
        if !valid_name(name) {
            return Err(NativeError::BadName(name.to_string()));
        }
        let child = {
            let mut table = self.table.lock();
            let Some(e) = table.get_mut(name) else {
                return Err(NativeError::Unknown(name.to_string()));
            };
            if !matches!(e.life, Life::Ended(_)) {
                e.life = Life::Stopping;
            }
            e.child.clone()
        };
        let started = Instant::now();
        self.end(&child, self.grace);
        let how = child.wait_for(Some(Duration::ZERO)).map_or_else(|| "ended".to_string(), describe_exit);
        let mut row = self.rows().into_iter().find(|r| r.name == name);
        let mut table = self.table.lock();
        if table.get(name).is_some_and(|e| Arc::ptr_eq(&e.child, &child)) {
            table.remove(name);
        }
        drop(table);
        tracing::info!(native = %name, "native worker stopped: {how} after {:.3} s", started.elapsed().as_secs_f64());
        let mut row = row.take().ok_or_else(|| NativeError::Replaced(name.to_string()))?;
        row.state = how;
        Ok(row)
    }

    /// Ends every worker (meshd's shutdown), each with the grace period, all at once.
    pub fn stop_all(&self) {
        let names: Vec<String> = self.table.lock().keys().cloned().collect();
        std::thread::scope(|s| {
            for n in &names {
                s.spawn(move || {
                    let _ = self.stop(n);
                });
            }
        });
    }
}
