//! meshd's private MPS control daemon: its directories, its process (a foreground child), its commands.
//!
//! Tied to meshd by default, its output piped into meshd's log. Under `--orphan-grace-ms` it is
//! detached instead (it must outlive a crash of meshd, for the orphans' kernels run on its server)
//! and writes its output to `log/control-daemon.log`, which meshd follows; an orderly exit still
//! quits it. A start first clears what a previous meshd left there ([`crate::orphans::clear_previous`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_backend::BackendError;
use parking_lot::Mutex;
use rustix::process::Signal;
use shared_child::SharedChild;

use crate::mps_dir::{DirClaim, PREVIOUS_TEARDOWN, remove_stale_pipes, wait_for_previous_processes};
use crate::orphans::{Greeted, OrphanPolicy};
use crate::process::{self, Held};
use mesh_mps_worker::orphan::pids;

/// The detached daemon's output, in its log directory.
pub const DAEMON_OUTPUT: &str = "control-daemon.log";

/// The control binary's name (its home is [`crate::mps_dir`]).
pub use crate::mps_dir::MPS_CONTROL;
/// The variable naming the pipe directory of an MPS server (its home is [`crate::mps_dir`]).
pub use crate::mps_dir::PIPE_ENV;
/// The variable naming its log directory.
pub const LOG_ENV: &str = "CUDA_MPS_LOG_DIRECTORY";
/// How long one control command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the control binary is looked for: `MESH_MPS_CONTROL` alone when set (an explicit choice
/// that is wrong is an error, not a reason to take another binary), else `PATH`, then the usual places.
pub fn find_control() -> Result<PathBuf, BackendError> {
    if let Some(p) = std::env::var_os("MESH_MPS_CONTROL") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(BackendError::MpsDaemon(format!("{MPS_CONTROL} not found at {} (MESH_MPS_CONTROL)", p.display())))
        };
    }
    let mut looked = Vec::new();
    // `which` takes PATH as the shell does (empty entries, executability); then the usual places.
    if let Ok(found) = which::which(MPS_CONTROL) {
        return Ok(found);
    }
    if let Some(path) = std::env::var_os("PATH") {
        looked.extend(std::env::split_paths(&path).map(|d| d.join(MPS_CONTROL).display().to_string()));
    }
    for dir in ["/usr/local/nvidia/bin", "/usr/bin", "/usr/local/cuda/bin", "/usr/sbin"] {
        let c = Path::new(dir).join(MPS_CONTROL);
        if c.is_file() {
            return Ok(c);
        }
        looked.push(c.display().to_string());
    }
    Err(BackendError::MpsDaemon(format!("{MPS_CONTROL} not found; looked at {}", looked.join(", "))))
}

/// The private control daemon. Quit (and waited for) by [`MpsControl::quit`].
#[derive(Debug)]
pub struct MpsControl {
    binary: PathBuf,
    /// Its own directory (pipe and log directories): the MPS directory or its `standby/`.
    root: PathBuf,
    /// The MPS directory (`--mps-dir`): both daemons' directories, the rendezvous, the keeper.
    mps_dir: PathBuf,
    /// Whether meshd made the MPS directory (removed at quit by the daemon that runs in it).
    owned_root: bool,
    child: Mutex<Option<Held>>,
    /// The previous meshd's orphans greeted for adoption when this daemon was adopted from it
    /// ([`MpsControl::take_greeted`]).
    greeted: Mutex<Vec<Greeted>>,
    /// This meshd's claim on the MPS directory (an flock the kernel drops when meshd dies), held
    /// while either daemon runs.
    _claim: Arc<DirClaim>,
    /// Pids our servers have logged as connected clients (from the daemon's own output), so that a
    /// client that has already exited can still be told apart from a stranger.
    connected: std::sync::Arc<Mutex<std::collections::HashSet<u32>>>,
    /// The GPU every worker opens, by UUID ([`MpsControl::with_device`]).
    device: Option<String>,
    /// How often every worker checks its running kernel ([`MpsControl::with_kernel_check`]).
    kernel_check: Duration,
    /// How its workers outlive meshd, if they do (`--orphan-grace-ms`).
    orphans: Option<OrphanPolicy>,
    /// Tells the thread following a detached daemon's output file to stop.
    following: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn mkdir_private(dir: &Path) -> Result<(), BackendError> {
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| BackendError::MpsDaemon(format!("directory {}: {e}", dir.display())))
}

impl MpsControl {
    /// Starts `nvidia-cuda-mps-control -f` as this process's child, with pipe and log directories
    /// (mode 0700) under `root` (default `/tmp/meshd-mps.PID`, removed at quit).
    ///
    /// A directory a previous daemon used is taken over whatever way that daemon ended (quit, kill -9,
    /// power loss): another meshd holding it is refused naming its pid; processes of a dead meshd that
    /// the driver is still tearing down are waited for; the stale pipe files are removed (an old
    /// `control` pipe would pass for a live daemon, and a client started against it runs as a plain
    /// context); and the daemon counts as ready only once it answers a command.
    pub fn start(root: Option<&Path>) -> Result<Self, BackendError> {
        let owned = root.is_none();
        let root =
            root.map_or_else(|| PathBuf::from(format!("/tmp/meshd-mps.{}", std::process::id())), Path::to_path_buf);
        Self::start_in(root, owned, None)
    }

    /// [`MpsControl::start`] in MPS directory `mps_dir`, removed at quit when `owned`; with
    /// `orphans`, the daemon is detached (it outlives a crash of meshd) and its workers become
    /// orphans rather than die.
    ///
    /// Under an orphan grace, the daemon a previous meshd's programs run on is adopted with them
    /// ([`MpsControl::take_greeted`]): that of `mps_dir`, or of its `standby/` when a GPU fault had
    /// moved them to the standby server (this control's [`MpsControl::root`] is then that nested
    /// directory, and [`MpsControl::start_standby`] makes the standby in `mps_dir`). Else, or when
    /// that daemon cannot be held, everything of the previous meshd is cleared.
    pub fn start_in(mps_dir: PathBuf, owned_root: bool, orphans: Option<OrphanPolicy>) -> Result<Self, BackendError> {
        let binary = find_control()?;
        mkdir_private(&mps_dir)?;
        let claim = Arc::new(DirClaim::take(&mps_dir)?);
        let stop_deadline = orphans.as_ref().map_or(Duration::from_secs(2), |o| o.stop_deadline);
        let mut log = Vec::new();
        let mut previous =
            orphans.as_ref().and_then(|_| crate::orphans::greet_previous(&mps_dir, &binary, stop_deadline, &mut log));
        let adopted_daemon = previous.as_ref().map(|p| Held::adopt(p.daemon));
        if let Some(Err(e)) = &adopted_daemon {
            let pipe_dirs = crate::orphans::pipe_dirs(&mps_dir);
            for g in previous.take().map(|p| p.greeted).unwrap_or_default() {
                log.push(g.retire(&binary, &pipe_dirs, stop_deadline, &format!("its MPS daemon cannot be held ({e})")));
            }
        }
        if previous.is_none() {
            log.extend(crate::orphans::clear_previous(&mps_dir, &binary, stop_deadline));
        }
        for line in log {
            tracing::info!("{}: {line}", mps_dir.display());
        }
        let root = previous.as_ref().map_or_else(|| mps_dir.clone(), |p| p.dir.clone());
        let control = Self::unstarted(binary, root, mps_dir, owned_root, claim, orphans);
        if let (Some(previous), Some(Ok(daemon))) = (previous, adopted_daemon) {
            let out_path = control.log_dir().join(DAEMON_OUTPUT);
            let from = std::fs::read_to_string(&out_path).map_or(0, |text| {
                // The clients our server logged before this meshd came count as ours.
                control.connected.lock().extend(text.lines().filter_map(connected_client));
                text.len() as u64
            });
            control.follow_log(out_path, from);
            tracing::info!(
                "adopted the previous meshd's MPS control daemon {} of {}",
                daemon.id(),
                control.root.display()
            );
            *control.child.lock() = Some(daemon);
            *control.greeted.lock() = previous.greeted;
            return Ok(control);
        }
        control.launch()
    }

    /// A second daemon in the other directory of this one's MPS directory (its `standby/`, or the
    /// MPS directory itself when this one was adopted there), for the standby server: the same
    /// device, kernel check and orphan policy, under the same claim. Whatever a previous meshd ran
    /// there was cleared or adopted by [`MpsControl::start_in`].
    pub fn start_standby(&self) -> Result<Self, BackendError> {
        let nested = self.mps_dir.join("standby");
        let root = if self.root == nested { self.mps_dir.clone() } else { nested };
        mkdir_private(&root)?;
        let binary = self.binary.clone();
        let (mps_dir, claim, orphans) = (self.mps_dir.clone(), self._claim.clone(), self.orphans.clone());
        Self::unstarted(binary, root, mps_dir, self.owned_root, claim, orphans)
            .with_device(self.device.clone())
            .with_kernel_check(self.kernel_check)
            .launch()
    }

    /// A control of directory `root` whose daemon is not started (nor adopted) yet: the default
    /// device and kernel check, no client heard of.
    fn unstarted(
        binary: PathBuf,
        root: PathBuf,
        mps_dir: PathBuf,
        owned_root: bool,
        claim: Arc<DirClaim>,
        orphans: Option<OrphanPolicy>,
    ) -> Self {
        Self {
            binary,
            root,
            mps_dir,
            owned_root,
            child: Mutex::new(None),
            greeted: Mutex::new(Vec::new()),
            _claim: claim,
            connected: Default::default(),
            device: None,
            kernel_check: mesh_mps_worker::KERNEL_CHECK,
            orphans,
            following: Default::default(),
        }
    }

    /// Starts a new daemon in its directory, once the previous processes there are gone and the
    /// stale pipes removed; ready once it answers.
    fn launch(self) -> Result<Self, BackendError> {
        let control = self;
        mkdir_private(&control.pipe_dir())?;
        mkdir_private(&control.log_dir())?;
        wait_for_previous_processes(&control.pipe_dir(), PREVIOUS_TEARDOWN)?;
        remove_stale_pipes(&control.pipe_dir())?;
        let mut cmd = Command::new(&control.binary);
        cmd.arg("-f").env(PIPE_ENV, control.pipe_dir()).env(LOG_ENV, control.log_dir()).stdin(Stdio::null());
        let spawned = if control.orphans.is_some() {
            let out_path = control.log_dir().join(DAEMON_OUTPUT);
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&out_path)
                .map_err(|e| BackendError::MpsDaemon(format!("{}: {e}", out_path.display())))?;
            let from = out.metadata().map_or(0, |m| m.len());
            let err = out.try_clone().map_err(|e| BackendError::MpsDaemon(format!("{}: {e}", out_path.display())))?;
            cmd.stdout(out).stderr(err);
            let child = process::spawn_detached(&mut cmd);
            if child.is_ok() {
                control.follow_log(out_path, from);
            }
            child
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            // SIGTERM, not SIGKILL: the daemon then shuts its server down, which a SIGKILL would orphan.
            let child = process::spawn_tied(&mut cmd, Signal::TERM);
            if let Ok(c) = &child {
                control.forward_log(c);
            }
            child
        };
        let child =
            spawned.map_err(|e| BackendError::MpsDaemon(format!("starting {}: {e}", control.binary.display())))?;
        *control.child.lock() = Some(Held::Child(child));
        if let Err(e) = control.wait_ready(Duration::from_secs(10)) {
            control.quit();
            return Err(e);
        }
        Ok(control)
    }

    /// A detached daemon writes to a file: follow it from `from` into meshd's log, noting the
    /// clients our servers report as connected, until [`MpsControl::quit`].
    fn follow_log(&self, path: PathBuf, from: u64) {
        let connected = self.connected.clone();
        let stop = self.following.clone();
        let _ = std::thread::Builder::new().name("mps-control-log".into()).spawn(move || {
            use std::io::{Seek, SeekFrom};
            let Ok(mut file) = std::fs::File::open(&path) else { return };
            if file.seek(SeekFrom::Start(from)).is_err() {
                return;
            }
            let mut reader = BufReader::new(file);
            let mut line = String::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match reader.read_line(&mut line) {
                    Ok(n) if n > 0 && line.ends_with('\n') => {
                        let text = line.trim_end();
                        if let Some(pid) = connected_client(text) {
                            connected.lock().insert(pid);
                        }
                        tracing::info!(target: "mps-control", "{text}");
                        line.clear();
                    }
                    // At the end for now (a part of a line stays in `line` until the rest comes).
                    Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                    Err(_) => return,
                }
            }
        });
    }

    /// How its workers outlive meshd, if they do.
    pub fn orphans(&self) -> Option<&OrphanPolicy> {
        self.orphans.as_ref()
    }

    /// In the foreground the daemon logs to its standard output: forward it to meshd's log, noting
    /// the clients our servers report as connected.
    fn forward_log(&self, child: &SharedChild) {
        for stream in [
            child.take_stdout().map(|s| Box::new(s) as Box<dyn Read + Send>),
            child.take_stderr().map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let connected = self.connected.clone();
            let _ = std::thread::Builder::new().name("mps-control-log".into()).spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Some(pid) = connected_client(&line) {
                        connected.lock().insert(pid);
                    }
                    tracing::info!(target: "mps-control", "{line}");
                }
            });
        }
    }

    /// Ready means answering: the control pipe exists (the stale one was removed before the start, so
    /// this one is the new daemon's) and a `get_server_list` comes back.
    fn wait_ready(&self, within: Duration) -> Result<(), BackendError> {
        let deadline = Instant::now() + within;
        let mut last = String::from("no control pipe yet");
        loop {
            if let Some(status) = self.exited() {
                return Err(BackendError::MpsDaemon(format!(
                    "{} -f exited at start ({status}); see meshd's log",
                    self.binary.display()
                )));
            }
            if self.pipe_dir().join("control").exists() {
                match self.command_within("get_server_list", Duration::from_secs(2)) {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() >= deadline {
                return Err(BackendError::MpsDaemon(format!(
                    "{} -f did not answer within {} s (last: {last})",
                    self.binary.display(),
                    within.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn exited(&self) -> Option<String> {
        self.child.lock().as_ref().filter(|c| !c.alive()).map(Held::status)
    }

    /// The previous meshd's orphans greeted when its daemon was adopted (taken once): the backend
    /// adopts each that its mailbox confirms, and retires the others.
    pub fn take_greeted(&self) -> Vec<Greeted> {
        std::mem::take(&mut *self.greeted.lock())
    }

    /// Whether this daemon was adopted from a previous meshd.
    pub fn adopted(&self) -> bool {
        matches!(*self.child.lock(), Some(Held::Adopted { .. }))
    }

    /// Names the GPU (its UUID) that every worker started from now on opens. A worker looks it up by
    /// UUID among the devices it sees: an MPS client sees the server's devices, renumbered from 0 when
    /// the server was started with `CUDA_VISIBLE_DEVICES`, so an ordinal would not do.
    #[must_use]
    pub fn with_device(mut self, uuid: Option<String>) -> Self {
        self.device = uuid;
        self
    }

    /// The GPU's UUID the workers open, if named.
    pub fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// How often every worker started from now on checks its running kernel's stream (the
    /// worker's `--kernel-check-us`; default `KERNEL_CHECK`, 5 ms).
    #[must_use]
    pub fn with_kernel_check(mut self, every: Duration) -> Self {
        self.kernel_check = every;
        self
    }

    /// How often the workers check their running kernel's stream.
    pub fn kernel_check(&self) -> Duration {
        self.kernel_check
    }

    /// Whether the daemon process still runs.
    pub fn alive(&self) -> bool {
        self.child.lock().as_ref().is_some_and(Held::alive)
    }

    /// The daemon's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().as_ref().map(Held::id)
    }

    /// The directory holding the control pipe: what a client's `CUDA_MPS_PIPE_DIRECTORY` must be.
    pub fn pipe_dir(&self) -> PathBuf {
        self.root.join("pipe")
    }

    /// The directory of the server's logs.
    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    /// Its own directory: the `--mps-dir`, or its `standby/` for the other daemon of it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The `--mps-dir` (both daemons', the rendezvous and the keeper's).
    pub fn mps_dir(&self) -> &Path {
        &self.mps_dir
    }

    /// Runs one control command (`get_server_list`, …) and returns its output, within [`COMMAND_TIMEOUT`].
    pub fn command(&self, line: &str) -> Result<String, BackendError> {
        self.command_within(line, COMMAND_TIMEOUT)
    }

    fn command_within(&self, line: &str, timeout: Duration) -> Result<String, BackendError> {
        let err = |m: String| BackendError::MpsDaemon(format!("{line:?}: {m}"));
        let mut cmd = Command::new(&self.binary);
        cmd.env(PIPE_ENV, self.pipe_dir())
            .env(LOG_ENV, self.log_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A command lasts a moment; tied all the same, so that none outlives meshd.
        let child = process::spawn_tied(&mut cmd, Signal::KILL).map_err(|e| err(e.to_string()))?;
        if let Some(mut stdin) = child.take_stdin() {
            let _ = writeln!(stdin, "{line}");
        }
        let mut stdout = child.take_stdout().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        if !process::wait_or_kill(&child, timeout) {
            return Err(err(format!("no answer within {} ms", timeout.as_millis())));
        }
        let out = reader.join().unwrap_or_default();
        let status = child.wait().map_err(|e| err(e.to_string()))?;
        if !status.success() {
            let mut e = String::new();
            if let Some(mut s) = child.take_stderr() {
                let _ = s.read_to_string(&mut e);
            }
            return Err(err(format!("{status}: {}{}", out.trim(), e.trim())));
        }
        Ok(out)
    }

    /// Pids of the MPS servers this daemon runs.
    pub fn servers(&self) -> Result<Vec<u32>, BackendError> {
        Ok(pids(&self.command("get_server_list")?))
    }

    /// Pids of the clients of `server`.
    pub fn clients(&self, server: u32) -> Result<Vec<u32>, BackendError> {
        Ok(pids(&self.command(&format!("get_client_list {server}"))?))
    }

    /// Refuses `pid` unless it is a client of one of this daemon's servers: the only proof, since the
    /// driver silently runs a process that cannot reach the server as a plain context.
    pub fn check_client(&self, pid: u32) -> Result<u32, BackendError> {
        let servers = self.servers()?;
        for &server in &servers {
            if self.clients(server)?.contains(&pid) {
                return Ok(server);
            }
        }
        // Gone from the lists, but our server logged it as its client: a worker that finished (and
        // exited) before this check ran was ours all the same.
        if self.connected.lock().contains(&pid) {
            return Ok(servers.first().copied().unwrap_or(0));
        }
        Err(BackendError::NotOurClient {
            pid,
            detail: if servers.is_empty() {
                "meshd's MPS daemon runs no server".into()
            } else {
                format!(
                    "not in the client lists of server(s) {servers:?} (pipe directory {})",
                    self.pipe_dir().display()
                )
            },
        })
    }

    /// Cuts client `pid` off its server (its calls fail from then on; the other clients go on),
    /// waiting at most `within` for the control daemon's answer: a server busy with a fault can hold
    /// the command for the daemon's whole [`COMMAND_TIMEOUT`], and the caller signals the worker
    /// anyway.
    pub fn terminate_client(&self, server: u32, pid: u32, within: Duration) -> Result<(), BackendError> {
        self.command_within(&format!("terminate_client {server} {pid}"), within).map(|_| ())
    }

    /// Cuts every `(server, pid)` client off at once, one control command each side by side, each
    /// bounded by `within`: the whole takes about `within` at most, however many clients. Returns
    /// the clients whose cut-off failed or was not answered in time, with why.
    pub fn terminate_clients(&self, clients: &[(u32, u32)], within: Duration) -> Vec<(u32, BackendError)> {
        std::thread::scope(|scope| {
            let asked: Vec<_> = clients
                .iter()
                .map(|&(server, pid)| (pid, scope.spawn(move || self.terminate_client(server, pid, within))))
                .collect();
            asked
                .into_iter()
                .filter_map(|(pid, h)| match h.join() {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some((pid, e)),
                    Err(_) => {
                        Some((pid, BackendError::MpsDaemon(format!("terminate_client {pid}: the thread panicked"))))
                    }
                })
                .collect()
        })
    }

    /// Quits the daemon (and with it its server), waits for it, removes the directory if meshd made it.
    /// Whether it left when asked (false: it ignored the quit and was killed).
    pub fn quit(&self) -> bool {
        let mut guard = self.child.lock();
        let mut left = true;
        if let Some(child) = guard.take()
            && child.alive()
        {
            let _ = self.command("quit");
            left = child.wait_or_kill(Duration::from_secs(10));
            if !left {
                tracing::warn!("the MPS control daemon ignored quit and was killed");
            }
        }
        self.following.store(true, std::sync::atomic::Ordering::Relaxed);
        if self.owned_root && self.root == self.mps_dir {
            let _ = std::fs::remove_dir_all(&self.root);
        }
        left
    }
}

/// The client pid of a server log line `... Client {PID: 18807, Context ID: 0} connected`, else `None`.
fn connected_client(line: &str) -> Option<u32> {
    let rest = &line[line.find("Client {PID: ")? + "Client {PID: ".len()..];
    let (pid, tail) = rest.split_once(',')?;
    tail.trim_end().ends_with("} connected").then(|| pid.trim().parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_connected_line_names_its_client() {
        let line = "[2026-12-02 18:49:23.060 Server 18663] Client {PID: 18807, Context ID: 0} connected";
        assert_eq!(connected_client(line), Some(18807));
        assert_eq!(connected_client("[..] Client process 18807 disconnected"), None);
        assert_eq!(connected_client("[..] Received new client request for {PID: 18807, Context ID: 0}"), None);
        assert_eq!(connected_client("[..] Status of client {PID: 18807, Context ID: 1} is ACTIVE"), None);
        assert_eq!(connected_client("[..] Client {PID: x, Context ID: 0} connected"), None);
    }

    #[test]
    fn pid_lists_take_only_lines_that_are_pids() {
        assert_eq!(pids("123\n456\n"), [123, 456]);
        assert_eq!(pids(" 7 \n"), [7]);
        assert_eq!(pids(""), Vec::<u32>::new());
        assert_eq!(pids("Server 12 not found\n"), Vec::<u32>::new(), "an error line names no client");
    }
}
