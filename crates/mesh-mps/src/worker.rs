//! A worker process seen from meshd: started as an MPS client of our server, spoken to over its stdin and stdout.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use mesh_backend::BackendError;
use mesh_mps_worker::{Command as WorkerCommand, Ready, Reply, encode};
use rustix::process::Signal;

use crate::control::{LOG_ENV, MpsControl, PIPE_ENV};
use crate::process;

/// A worker's first answer may take this long: its context creation also starts the MPS server.
pub const WORKER_LOAD: Duration = Duration::from_millis(30_000);
/// A launch's answer.
pub const WORKER_LAUNCH: Duration = Duration::from_millis(2_000);

/// The worker binary: `MESH_MPS_WORKER`, beside the running executable, or on `PATH`.
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
    PathBuf::from("mesh-mps-worker")
}

/// One worker process.
#[derive(Debug)]
pub struct Worker {
    child: Child,
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
        let binary = worker_binary();
        let mut cmd = Command::new(&binary);
        cmd.arg("--mailbox").arg(mailbox).env(PIPE_ENV, control.pipe_dir()).env(LOG_ENV, control.log_dir());
        if let Some(n) = sms {
            cmd.arg("--sms").arg(n.to_string());
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        // A worker must not outlive meshd; SIGKILL is only reached when meshd itself is gone.
        let mut child = process::spawn_tied(&mut cmd, Signal::KILL)
            .map_err(|e| BackendError::Worker { pid: 0, detail: format!("starting {}: {e}", binary.display()) })?;
        let pid = child.id();
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
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
        let mut worker = Self {
            child,
            stdin,
            replies,
            ready: Ready { pid, device: String::new(), mps_enabled: false, sms: 0, context_ms: 0 },
            server: 0,
        };
        let first = worker.read(timeout);
        let ready = match first {
            Ok(Reply { ok: true, ready: Some(r), .. }) => r,
            Ok(r) => {
                worker.kill();
                return Err(BackendError::Worker { pid, detail: r.error.unwrap_or_else(|| "no ready line".into()) });
            }
            Err(e) => {
                worker.kill();
                return Err(e);
            }
        };
        worker.ready = ready;
        match control.check_client(pid) {
            Ok(server) => worker.server = server,
            Err(e) => {
                worker.kill();
                return Err(e);
            }
        }
        Ok(worker)
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

    /// Sends one command and waits up to `timeout` for its reply; a refusal becomes an error.
    pub fn request(&mut self, cmd: &WorkerCommand, timeout: Duration) -> Result<Reply, BackendError> {
        let pid = self.pid();
        writeln!(self.stdin, "{}", encode(cmd))
            .and_then(|()| self.stdin.flush())
            .map_err(|e| BackendError::Worker { pid, detail: format!("sending {cmd:?}: {e}") })?;
        let reply = self.read(timeout)?;
        if !reply.ok {
            return Err(BackendError::Worker { pid, detail: reply.error.unwrap_or_else(|| "refused".into()) });
        }
        Ok(reply)
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().is_ok_and(|s| s.is_none())
    }

    /// Asks the worker to leave; kills it if it does not within a second.
    pub fn exit(mut self) {
        let _ = writeln!(self.stdin, "{}", encode(&WorkerCommand::Exit));
        let _ = self.stdin.flush();
        process::wait_or_kill(&mut self.child, Duration::from_secs(1));
    }

    /// SIGKILL and reap. Only for a worker whose kernel is not running, or that was cut off first
    /// (`terminate_client`): on the H200 a SIGKILL of a busy client failed every other client's kernel.
    pub fn kill(&mut self) {
        process::signal(&self.child, Signal::KILL);
        let _ = self.child.wait();
    }
}
