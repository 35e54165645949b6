//! A worker process seen from meshd: started as an MPS client of our server, spoken to over its stdin and stdout.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use mesh_backend::{BackendError, LaunchShape};
use mesh_mps_worker::{Command as WorkerCommand, KernelState, Probe, Ready, Refusal, RefusalKind, Reply, encode};
use rustix::process::Signal;
use shared_child::SharedChild;

use crate::control::{LOG_ENV, MpsControl, PIPE_ENV};
use crate::process;

/// A worker's first answer may take this long: its context creation also starts the MPS server.
pub const WORKER_LOAD: Duration = Duration::from_millis(30_000);
/// A launch's answer.
pub const WORKER_LAUNCH: Duration = Duration::from_millis(2_000);

/// The worker binary: `MESH_MPS_WORKER`, beside the running executable, or on `PATH` (else the bare
/// name, so that the spawn's error names what was missing).
pub fn worker_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MESH_MPS_WORKER") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let c = dir.join("mesh-mps-worker");
            if c.is_file() {
                return c;
            }
        }
    }
    which::which("mesh-mps-worker").unwrap_or_else(|_| PathBuf::from("mesh-mps-worker"))
}

/// One worker process.
#[derive(Debug)]
pub struct Worker {
    child: SharedChild,
    stdin: ChildStdin,
    replies: Receiver<String>,
    /// What it said at start.
    pub ready: Ready,
    /// The MPS server it is a client of.
    pub server: u32,
}

impl Worker {
    /// The worker's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts a worker on `control`'s server, waits for `ready`, and checks that it is our client.
    pub fn start(
        control: &MpsControl,
        mailbox: &Path,
        sms: Option<u32>,
        timeout: Duration,
    ) -> Result<Self, BackendError> {
        Self::spawn(control, mailbox, sms)?.await_ready(control, timeout)
    }

    /// Starts the worker process without waiting for it: several spawned at once create their MPS
    /// clients side by side (a recovery's workers), then each is awaited with [`Worker::await_ready`].
    /// Call it on the thread that lives as long as meshd (PDEATHSIG, see `process`).
    pub fn spawn(control: &MpsControl, mailbox: &Path, sms: Option<u32>) -> Result<Self, BackendError> {
        let binary = worker_binary();
        let mut cmd = Command::new(&binary);
        cmd.arg("--mailbox").arg(mailbox).env(PIPE_ENV, control.pipe_dir()).env(LOG_ENV, control.log_dir());
        if let Some(n) = sms {
            cmd.arg("--sms").arg(n.to_string());
        }
        // NVIDIA: CUDA_VISIBLE_DEVICES must not be set in an MPS client's environment (the server's
        // own, inherited from meshd, already picked the GPU); the worker finds it by UUID instead.
        cmd.env_remove("CUDA_VISIBLE_DEVICES");
        if let Some(uuid) = control.device() {
            cmd.arg("--device").arg(uuid);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        // A worker must not outlive meshd; SIGKILL is only reached when meshd itself is gone.
        let child = process::spawn_tied(&mut cmd, Signal::KILL)
            .map_err(|e| BackendError::Worker { pid: 0, detail: format!("starting {}: {e}", binary.display()) })?;
        let pid = child.id();
        let stdin = child.take_stdin().expect("piped");
        let stdout = child.take_stdout().expect("piped");
        let (tx, replies) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name(format!("mps-worker-{pid}"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| BackendError::Worker { pid, detail: e.to_string() })?;
        Ok(Self {
            child,
            stdin,
            replies,
            ready: Ready { pid, device: String::new(), mps_enabled: false, sms: 0, context_ms: 0 },
            server: 0,
        })
    }

    /// Waits for a spawned worker's `ready` and checks that it is our client; kills it if not.
    pub fn await_ready(self, control: &MpsControl, timeout: Duration) -> Result<Self, BackendError> {
        let pid = self.pid();
        let mut worker = self;
        let checked = worker.read(timeout).and_then(|first| match first {
            Reply::Ready(r) => {
                worker.ready = r;
                control.check_client(pid)
            }
            Reply::Refused(r) => Err(refused(pid, r)),
            other => Err(unexpected(pid, "ready", &other)),
        });
        match checked {
            Ok(server) => {
                worker.server = server;
                Ok(worker)
            }
            Err(e) => {
                worker.kill();
                Err(e)
            }
        }
    }

    fn read(&mut self, timeout: Duration) -> Result<Reply, BackendError> {
        let pid = self.pid();
        match self.replies.recv_timeout(timeout) {
            Ok(line) => serde_json::from_str(&line)
                .map_err(|e| BackendError::Worker { pid, detail: format!("unreadable reply {line:?}: {e}") }),
            Err(RecvTimeoutError::Timeout) => {
                Err(BackendError::Worker { pid, detail: format!("no answer within {} ms", timeout.as_millis()) })
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status =
                    self.child.try_wait().ok().flatten().map_or("still running".to_string(), |s| s.to_string());
                Err(BackendError::Worker { pid, detail: format!("the worker is gone ({status})") })
            }
        }
    }

    /// Sends one command and waits up to `timeout` for its reply, whatever it is.
    fn exchange(&mut self, cmd: &WorkerCommand, timeout: Duration) -> Result<Reply, BackendError> {
        let pid = self.pid();
        writeln!(self.stdin, "{}", encode(cmd))
            .and_then(|()| self.stdin.flush())
            .map_err(|e| BackendError::Worker { pid, detail: format!("sending {cmd:?}: {e}") })?;
        self.read(timeout)
    }

    /// Has the worker load the cubin at `cubin` and probe program `program`'s `mesh_main` for `shape`.
    pub fn load(&mut self, cubin: &Path, shape: &LaunchShape, program: &str) -> Result<Probe, BackendError> {
        let cmd = WorkerCommand::Load {
            cubin: cubin.display().to_string(),
            grid: shape.grid,
            block: shape.block,
            shared_mem: shape.shared_mem,
        };
        match self.exchange(&cmd, WORKER_LOAD)? {
            Reply::Loaded(probe) => Ok(probe),
            Reply::Refused(Refusal { kind: RefusalKind::NoEntry, message }) => {
                Err(BackendError::NoEntry { program: program.to_string(), detail: message })
            }
            Reply::Refused(r) => Err(refused(self.pid(), r)),
            other => Err(unexpected(self.pid(), "load", &other)),
        }
    }

    /// Launches the loaded `mesh_main` for `slot` (armed by the caller).
    pub fn launch(&mut self, slot: u32) -> Result<(), BackendError> {
        self.done(&WorkerCommand::Launch { slot }, WORKER_LAUNCH)
    }

    /// Unloads the module (its kernel must have returned).
    pub fn unload(&mut self) -> Result<(), BackendError> {
        self.done(&WorkerCommand::Unload, WORKER_LAUNCH)
    }

    fn done(&mut self, cmd: &WorkerCommand, timeout: Duration) -> Result<(), BackendError> {
        match self.exchange(cmd, timeout)? {
            Reply::Done => Ok(()),
            Reply::Refused(r) => Err(refused(self.pid(), r)),
            other => Err(unexpected(self.pid(), "done", &other)),
        }
    }

    /// Waits up to `wait` for the kernel to return (the worker answers within `wait` + `slack`).
    pub fn wait(&mut self, wait: Duration, slack: Duration) -> Result<KernelState, BackendError> {
        match self.exchange(
            &WorkerCommand::Wait { timeout_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX) },
            wait + slack,
        )? {
            Reply::State { state } => Ok(state),
            Reply::Refused(r) => Err(refused(self.pid(), r)),
            other => Err(unexpected(self.pid(), "state", &other)),
        }
    }

    /// The kernel's state now; a worker that is gone or does not answer counts as failed.
    pub fn poll(&mut self) -> KernelState {
        if !self.alive() {
            return KernelState::Failed { reason: "the worker process is gone".into() };
        }
        self.wait(Duration::ZERO, WORKER_LAUNCH).unwrap_or_else(|e| KernelState::Failed { reason: e.to_string() })
    }

    /// Whether the process still runs.
    pub fn alive(&self) -> bool {
        process::alive(&self.child)
    }

    /// Asks the worker to leave; kills it if it does not within a second.
    pub fn exit(mut self) {
        let _ = writeln!(self.stdin, "{}", encode(&WorkerCommand::Exit));
        let _ = self.stdin.flush();
        process::wait_or_kill(&self.child, Duration::from_secs(1));
    }

    /// SIGKILL without reaping (many workers are signalled first, then reaped by [`Worker::kill`],
    /// so that the driver tears their contexts down side by side). Same caveat as `kill`.
    pub fn signal_kill(&self) {
        let _ = self.child.kill();
    }

    /// SIGKILL and reap. Only for a worker whose kernel is not running, or that was cut off first
    /// (`terminate_client`): on the H200 a SIGKILL of a busy client failed every other client's kernel.
    pub fn kill(&mut self) {
        process::kill(&self.child);
    }
}

fn refused(pid: u32, r: Refusal) -> BackendError {
    BackendError::Worker { pid, detail: r.message }
}

fn unexpected(pid: u32, wanted: &str, got: &Reply) -> BackendError {
    BackendError::Worker { pid, detail: format!("answered {got:?} where a {wanted} reply was due") }
}
