//! A worker process seen from meshd: started as an MPS client of our server, spoken to over its stdin and stdout.
//!
//! A reader thread per worker reads its stdout: replies go to the command in flight, events (its
//! kernel ended or failed, found by the worker's own check) and news of a worker that went silent
//! for good (end of output, a garbled line) go to one [`NewsSender`] shared by every worker, which
//! the backend drains without waiting and which wakes meshd's backend thread. So nothing asks every
//! worker in turn; a worker's state here is what it last said ([`Worker::kernel`]). A worker whose
//! line is garbled, or that misses a reply's deadline, is *broken*: it is no longer spoken to (a
//! late reply would be taken for the next command's) and its kernel counts as failed, naming it.
//!
//! **Liveness.** Every worker says `alive` every [`ALIVE_EVERY`]; its reader notes when it last
//! heard any line ([`Worker::silent_for`]) and does nothing else for it: no news, no wake-up, so
//! that N workers cost the backend nothing between its ticks. The watchdog asks each worker it holds
//! ([`Worker::check_silence`]) and a worker silent past the bound is broken like a garbled one.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use mesh_backend::{BackendError, LaunchShape};
use mesh_mps_worker::fdpass::send_fd;
use mesh_mps_worker::{
    ALIVE_EVERY, Command as WorkerCommand, FdTag, KERNEL_CHECK, KernelState, PROTOCOL, Probe, Ready, Refusal,
    RefusalKind, Reply, encode,
};

use crate::control::{LOG_ENV, MpsControl, PIPE_ENV};
use crate::news::{Heard, read_output};
pub use crate::news::{News, NewsSender, OnFailure, SilenceClock, Wake, WorkerNews};
pub use crate::process::worker_binary;
use crate::process::{self, Held};

/// A worker's first answer may take this long: its context creation also starts the MPS server.
pub const WORKER_LOAD: Duration = Duration::from_millis(30_000);
/// A launch's answer.
pub const WORKER_LAUNCH: Duration = Duration::from_millis(2_000);

/// One worker process.
#[derive(Debug)]
pub struct Worker {
    child: Held,
    stdin: Input,
    replies: Receiver<Result<Reply, String>>,
    /// Its news, as its reader handed it over.
    events: Receiver<News>,
    /// meshd's end of the fd socket (device rings' descriptors).
    fds: UnixStream,
    /// What it said at start.
    pub ready: Ready,
    /// The MPS server it is a client of.
    pub server: u32,
    /// The `--sms` it was started with (None: the whole GPU). A worker is matched to a program by
    /// what was asked, not by `ready.sms`: a green context rounds SMs up to its granularity, and a
    /// program loaded with its own `--sms` must keep it across upgrades and recoveries.
    pub asked_sms: Option<u32>,
    /// Launches acknowledged (events of older ones are stale).
    launches: u64,
    /// Its kernel as it last said.
    kernel: KernelState,
    /// Why it is no longer spoken to.
    broken: Option<String>,
    /// Its output ended (it exited, was killed, or is being torn down by the driver): a process in
    /// that state may still show as alive (D or Z state) for up to 2 s after a SIGKILL.
    output_ended: bool,
    /// When it saw its current launch's kernel fail (ns since the Unix epoch).
    failed_at: Option<u64>,
    /// Device channels whose ring it has mapped.
    mapped: BTreeSet<u32>,
    /// When its reader last heard a line.
    heard: Heard,
    /// How long it had been silent when it was broken off for that (see [`Worker::check_silence`]).
    silenced: Option<Duration>,
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
        news: &NewsSender,
        timeout: Duration,
    ) -> Result<Self, BackendError> {
        Self::spawn(control, mailbox, sms, news)?.await_ready(control, timeout)
    }

    /// Starts the worker process without waiting for it: several spawned at once create their MPS
    /// clients side by side (a recovery's workers), then each is awaited with [`Worker::await_ready`].
    /// Call it on the thread that lives as long as meshd (PDEATHSIG, see `process`).
    pub fn spawn(
        control: &MpsControl,
        mailbox: &Path,
        sms: Option<u32>,
        news: &NewsSender,
    ) -> Result<Self, BackendError> {
        let binary = worker_binary();
        let mut cmd = Command::new(&binary);
        cmd.arg("--mailbox").arg(mailbox).env(PIPE_ENV, control.pipe_dir()).env(LOG_ENV, control.log_dir());
        if let Some(n) = sms {
            cmd.arg("--sms").arg(n.to_string());
        }
        // Only when not the default: the command line of every worker so far stays as it was.
        let check = control.kernel_check();
        if check != KERNEL_CHECK {
            cmd.arg("--kernel-check-us").arg(check.as_micros().to_string());
        }
        // NVIDIA: CUDA_VISIBLE_DEVICES must not be set in an MPS client's environment (the server's
        // own, inherited from meshd, already picked the GPU); the worker finds it by UUID instead.
        cmd.env_remove("CUDA_VISIBLE_DEVICES");
        if let Some(uuid) = control.device() {
            cmd.arg("--device").arg(uuid);
        }
        let detached = control.orphans().is_some();
        if let Some(o) = control.orphans() {
            cmd.arg("--orphan-grace-ms")
                .arg(o.grace.as_millis().to_string())
                .arg("--rendezvous-dir")
                .arg(&o.rendezvous_dir)
                .arg("--stop-deadline-ms")
                .arg(o.stop_deadline.as_millis().to_string())
                .arg("--mps-control")
                .arg(&o.control);
        }
        let mut worker = Self::spawn_command_with(&mut cmd, news, detached)
            .map_err(|e| BackendError::Worker { pid: 0, detail: format!("starting {}: {e}", binary.display()) })?;
        worker.asked_sms = sms;
        Ok(worker)
    }

    /// Spawns `cmd` as a worker (a real one from [`Worker::spawn`], or a stand-in speaking the
    /// protocol, in tests): `--fd-socket N` appended, stdin and stdout piped, its reader started.
    pub fn spawn_command(cmd: &mut Command, news: &NewsSender) -> std::io::Result<Self> {
        Self::spawn_command_with(cmd, news, false)
    }

    /// [`Worker::spawn_command`], the child tied to meshd (it dies with meshd) or, with `detached`,
    /// in a session of its own that outlives meshd (an orphan grace).
    pub fn spawn_command_with(cmd: &mut Command, news: &NewsSender, detached: bool) -> std::io::Result<Self> {
        let (fds, child_end) = UnixStream::pair()?;
        // At 3 or above: the child's stdio setup overwrites 0 to 2 (which a daemon started with
        // stdin closed could have handed the socket).
        let child_end = rustix::io::fcntl_dupfd_cloexec(&child_end, 3)?;
        let n = child_end.as_raw_fd();
        cmd.arg("--fd-socket").arg(n.to_string());
        // The child keeps its end across exec (std made it close-on-exec, as every descriptor, so
        // that no other child inherits it); changed in the child only, after the fork.
        process::inherit_fd(cmd, n, n);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        // Tied, a worker does not outlive meshd (SIGKILL is only reached when meshd itself is gone);
        // detached, it keeps its kernel for the orphan grace.
        let child = process::spawn_child(cmd, detached)?;
        drop(child_end);
        let pid = child.id();
        let (Some(stdin), Some(stdout)) = (child.take_stdin(), child.take_stdout()) else {
            process::kill(&child);
            return Err(std::io::Error::other("the child's pipes were not made"));
        };
        let (tx, replies) = crossbeam_channel::unbounded();
        let (own, events) = crossbeam_channel::unbounded();
        let news = news.clone();
        let heard = Heard::now();
        let heard_by_reader = heard.clone();
        let reader = std::thread::Builder::new()
            .name(format!("mps-worker-{pid}"))
            .spawn(move || read_output(pid, stdout, &tx, &own, &news, &heard_by_reader));
        if let Err(e) = reader {
            process::kill(&child);
            return Err(e);
        }
        Ok(Self {
            child: Held::Child(child),
            stdin: Input::Pipe(stdin),
            replies,
            events,
            fds,
            ready: Ready {
                protocol: PROTOCOL,
                pid,
                device: String::new(),
                mps_enabled: false,
                sms: 0,
                context_ms: 0,
                kernel_check_us: 0,
            },
            server: 0,
            asked_sms: None,
            launches: 0,
            kernel: KernelState::Idle,
            broken: None,
            output_ended: false,
            failed_at: None,
            mapped: BTreeSet::new(),
            heard,
            silenced: None,
        })
    }

    /// Adopts an orphan of a previous meshd, greeted on `stream` (its hello answered with `orphan`)
    /// and checked by the caller to be `held` (a pidfd opened before the checks) and a client of
    /// `server`: its reader started on the socket, then `adopt` said with a new fd socket riding
    /// on the line, and its `done` awaited. Its kernel runs on throughout; from then on it is
    /// spoken to like any worker.
    pub fn adopt(
        stream: UnixStream,
        held: Held,
        orphan: &mesh_mps_worker::Orphan,
        server: u32,
        news: &NewsSender,
    ) -> Result<Self, BackendError> {
        let pid = held.id();
        let err = |detail: String| BackendError::Worker { pid, detail };
        let (fds, worker_end) = UnixStream::pair().map_err(|e| err(format!("a new fd socket: {e}")))?;
        // Before the reader starts: a read timeout is the socket's, which the reader's clone shares,
        // and the reader waits on it for as long as the worker lives.
        stream.set_read_timeout(None).map_err(|e| err(format!("its socket: {e}")))?;
        let out = stream.try_clone().map_err(|e| err(format!("its socket: {e}")))?;
        let (tx, replies) = crossbeam_channel::unbounded();
        let (own, events) = crossbeam_channel::unbounded();
        let news = news.clone();
        let heard = Heard::now();
        let heard_by_reader = heard.clone();
        std::thread::Builder::new()
            .name(format!("mps-worker-{pid}"))
            .spawn(move || read_output(pid, out, &tx, &own, &news, &heard_by_reader))
            .map_err(|e| err(format!("its reader: {e}")))?;
        mesh_mps_worker::fdpass::send_line_with_fd(&stream, &encode(&WorkerCommand::Adopt), worker_end.as_fd())
            .map_err(|e| err(format!("saying adopt: {e}")))?;
        drop(worker_end);
        let mut worker = Self {
            child: held,
            stdin: Input::Socket(stream),
            replies,
            events,
            fds,
            ready: orphan.ready.clone(),
            server,
            asked_sms: orphan.asked_sms,
            launches: orphan.launches,
            kernel: orphan.kernel.clone(),
            broken: None,
            output_ended: false,
            failed_at: None,
            mapped: orphan.mapped.iter().copied().collect(),
            heard,
            silenced: None,
        };
        match worker.read(WORKER_LAUNCH)? {
            Reply::Done => Ok(worker),
            Reply::Refused(r) => Err(refused(pid, r)),
            other => Err(worker.break_off(unexpected("done", &other))),
        }
    }

    /// Waits for a spawned worker's `ready` and checks that it is our client; kills it if not.
    pub fn await_ready(self, control: &MpsControl, timeout: Duration) -> Result<Self, BackendError> {
        let mut worker = self.handshake(timeout)?;
        match control.check_client(worker.pid()) {
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

    /// Waits for a spawned worker's first line: a `ready` of this protocol's version, else an error
    /// naming the worker and what it said (and the worker killed).
    pub fn handshake(mut self, timeout: Duration) -> Result<Self, BackendError> {
        let pid = self.pid();
        let first = self.read(timeout).and_then(|first| first_line(pid, first));
        match first {
            Ok(r) => {
                self.ready = r;
                Ok(self)
            }
            Err(e) => {
                self.kill();
                Err(e)
            }
        }
    }

    /// The spawned worker's first line if it has come, without waiting: `None` while it starts;
    /// else its `ready` taken (`Ok`), or why not (`Err`: the caller kills it).
    pub fn try_handshake(&mut self) -> Option<Result<(), BackendError>> {
        let pid = self.pid();
        let first = match self.replies.try_recv() {
            Err(crossbeam_channel::TryRecvError::Empty) => return None,
            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                Err(self.break_off("the worker is gone before its ready".into()))
            }
            Ok(Err(garbled)) => Err(self.break_off(garbled)),
            Ok(Ok(reply)) => first_line(pid, reply),
        };
        Some(first.map(|r| self.ready = r))
    }

    /// Whether the process has exited (and been reaped).
    pub fn exited(&self) -> bool {
        !self.child.alive()
    }

    /// Marks the worker broken (no longer spoken to; its kernel counts as failed) and returns the error.
    fn break_off(&mut self, detail: String) -> BackendError {
        let pid = self.pid();
        self.broken.get_or_insert(detail.clone());
        BackendError::Worker { pid, detail }
    }

    fn read(&mut self, timeout: Duration) -> Result<Reply, BackendError> {
        match self.replies.recv_timeout(timeout) {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(garbled)) => Err(self.break_off(garbled)),
            Err(RecvTimeoutError::Timeout) => {
                Err(self.break_off(format!("no answer within {} ms", timeout.as_millis())))
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.status();
                Err(self.break_off(format!("the worker is gone ({status})")))
            }
        }
    }

    /// Sends one command and waits up to `timeout` for its reply, whatever it is.
    fn exchange(&mut self, cmd: &WorkerCommand, timeout: Duration) -> Result<Reply, BackendError> {
        let pid = self.pid();
        if let Some(why) = &self.broken {
            return Err(BackendError::Worker { pid, detail: format!("not spoken to any more: {why}") });
        }
        if let Err(e) = writeln!(self.stdin, "{}", encode(cmd)).and_then(|()| self.stdin.flush()) {
            return Err(self.break_off(format!("sending {cmd:?}: {e}")));
        }
        self.read(timeout)
    }

    /// Takes in what its reader handed over since the last call, without waiting.
    pub fn refresh(&mut self) {
        while let Ok(n) = self.events.try_recv() {
            self.note(n);
        }
    }

    /// Takes in one piece of news of this worker.
    fn note(&mut self, news: News) {
        let pid = self.pid();
        self.output_ended |= matches!(news, News::Gone(_));
        match news {
            News::KernelEnded { launch, state, seen_unix_ns } if launch == self.launches => {
                if matches!(state, KernelState::Failed { .. }) {
                    self.failed_at = Some(seen_unix_ns);
                }
                self.kernel = state;
            }
            // A launch before the current one: stale.
            News::KernelEnded { .. } => {}
            News::Garbled(why) | News::Gone(why) => {
                self.broken.get_or_insert(why.clone());
                self.kernel = KernelState::Failed { reason: format!("worker {pid}: {why}") };
            }
        }
    }

    /// Its kernel as it last said (as of the last [`Worker::refresh`]): `busy` from a launch until it says otherwise; `failed` once it is
    /// broken or gone, with the reason naming it.
    pub fn kernel(&self) -> KernelState {
        match &self.broken {
            Some(why) => KernelState::Failed { reason: format!("worker {}: {why}", self.pid()) },
            None => self.kernel.clone(),
        }
    }

    /// When it saw its current launch's kernel fail (ns since the Unix epoch), if it said so.
    pub fn failed_at(&self) -> Option<u64> {
        self.failed_at
    }

    /// Whether its output ended (as of the last [`Worker::refresh`]): it died or is dying, whatever
    /// `alive` says while the driver tears its context down.
    pub fn output_ended(&self) -> bool {
        self.output_ended
    }

    /// Whether it died without first saying that its kernel failed: killed from outside (the OOM
    /// killer, an operator) or crashed, not a program that faulted. Its output ended, or the kernel
    /// says it is exiting or has a SIGKILL pending ([`crate::process::dying`]): a SIGKILLed client
    /// lingers while the driver tears its context down, and the other clients report the fault its
    /// death caused before its pipe closes (seen on the H200: a search by halves then followed).
    pub fn died_unreported(&self) -> bool {
        self.failed_at.is_none() && (self.output_ended || crate::process::dying(self.pid()))
    }

    /// Whether it said its kernel failed or died: nothing of it runs on.
    pub fn failed_or_dead(&self) -> bool {
        matches!(self.kernel(), KernelState::Failed { .. }) || self.died_unreported()
    }

    /// Why it is no longer spoken to, if it is not.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// How long before `now` its reader last heard a line from it (its `ready`, a reply, an event,
    /// an `alive`); from its spawn if none yet.
    pub fn silent_for(&self, now: Instant) -> Duration {
        self.heard.silent_for(now)
    }

    /// Breaks the worker off if it has said nothing for more than `limit` before `now` (it says
    /// `alive` every [`ALIVE_EVERY`]: it is stopped or wedged, and cannot act on a fault, an unload
    /// or a stop), unless it is broken already. Returns how long it was silent when it is broken now.
    pub fn check_silence(&mut self, now: Instant, limit: Duration) -> Option<Duration> {
        if self.broken.is_some() {
            return None;
        }
        let silent = self.silent_for(now);
        if silent <= limit {
            return None;
        }
        self.silenced = Some(silent);
        let _ = self.break_off(format!(
            "silent for {} ms (it says alive every {} ms; the bound is {} ms): stopped or wedged",
            silent.as_millis(),
            ALIVE_EVERY.as_millis(),
            limit.as_millis()
        ));
        Some(silent)
    }

    /// How long it had been silent, if it was broken off for its silence (not for a garbled line, a
    /// missed deadline or its end).
    pub fn silenced(&self) -> Option<Duration> {
        self.silenced
    }

    /// Maps device channel `channel`'s ring (`fd`, `bytes`) in the worker, zeroed there first when
    /// `zero`: the descriptor on the fd socket, then the command naming it.
    pub fn map(&mut self, channel: u32, fd: &OwnedFd, bytes: usize, zero: bool) -> Result<(), BackendError> {
        let bytes = bytes as u64;
        if let Err(e) = send_fd(&self.fds, fd.as_fd(), FdTag { channel, bytes }) {
            return Err(self.break_off(format!("sending channel #{channel}'s descriptor: {e}")));
        }
        self.done(&WorkerCommand::Map { channel, bytes, zero }, WORKER_LAUNCH)?;
        self.mapped.insert(channel);
        Ok(())
    }

    /// A new descriptor of device channel `channel`'s ring as the worker maps it (`bytes` long):
    /// the command, then the descriptor it sent before its `done`, checked against the tag.
    pub fn export_ring(&mut self, channel: u32, bytes: usize) -> Result<OwnedFd, BackendError> {
        let bytes = bytes as u64;
        self.done(&WorkerCommand::Export { channel, bytes }, WORKER_LAUNCH)?;
        mesh_mps_worker::fdpass::recv_fd(&self.fds, FdTag { channel, bytes })
            .map_err(|e| self.break_off(format!("channel #{channel}'s descriptor from the worker: {e}")))
    }

    /// Whether device channel `channel`'s ring is mapped in the worker.
    pub fn has_mapped(&self, channel: u32) -> bool {
        self.mapped.contains(&channel)
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
            other => Err(self.break_off(unexpected("load", &other))),
        }
    }

    /// Launches the loaded `mesh_main` for `slot` (armed by the caller).
    pub fn launch(&mut self, slot: u32) -> Result<(), BackendError> {
        self.done(&WorkerCommand::Launch { slot }, WORKER_LAUNCH)?;
        self.launches += 1;
        self.kernel = KernelState::Busy;
        self.failed_at = None;
        Ok(())
    }

    /// Unloads the module (its kernel must have returned) and unmaps every device channel.
    pub fn unload(&mut self) -> Result<(), BackendError> {
        self.done(&WorkerCommand::Unload, WORKER_LAUNCH)?;
        self.mapped.clear();
        Ok(())
    }

    fn done(&mut self, cmd: &WorkerCommand, timeout: Duration) -> Result<(), BackendError> {
        match self.exchange(cmd, timeout)? {
            Reply::Done => Ok(()),
            Reply::Refused(r) => Err(refused(self.pid(), r)),
            other => Err(self.break_off(unexpected("done", &other))),
        }
    }

    /// Waits up to `wait` for the kernel to return (the worker answers within `wait` + `slack`).
    pub fn wait(&mut self, wait: Duration, slack: Duration) -> Result<KernelState, BackendError> {
        match self.exchange(
            &WorkerCommand::Wait { timeout_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX) },
            wait + slack,
        )? {
            Reply::State { state } => {
                if state != KernelState::Busy {
                    self.kernel = state.clone();
                }
                Ok(state)
            }
            Reply::Refused(r) => Err(refused(self.pid(), r)),
            other => Err(self.break_off(unexpected("state", &other))),
        }
    }

    /// Whether the process still runs.
    pub fn alive(&self) -> bool {
        self.child.alive()
    }

    /// Asks the worker to leave; kills it if it does not within a second.
    pub fn exit(mut self) {
        let _ = writeln!(self.stdin, "{}", encode(&WorkerCommand::Exit));
        let _ = self.stdin.flush();
        self.child.wait_or_kill(Duration::from_secs(1));
    }

    /// Asks the worker to stop its kernel in order and leave (`retire`: the stop through its slot,
    /// its stop deadline, else it cuts itself off its server); kills it if it is not gone within
    /// `within`. Whether it left by itself.
    pub fn retire(mut self, within: Duration) -> bool {
        let _ = writeln!(self.stdin, "{}", encode(&WorkerCommand::Retire));
        let _ = self.stdin.flush();
        self.child.wait_or_kill(within)
    }

    /// SIGKILL without reaping (many workers are signalled first, then reaped by [`Worker::kill`],
    /// so that the driver tears their contexts down side by side). Same caveat as `kill`.
    pub fn signal_kill(&self) {
        self.child.signal_kill();
    }

    /// SIGKILL and reap. Only for a worker whose kernel is not running, or that was cut off first
    /// (`terminate_client`): on the H200 a SIGKILL of a busy client failed every other client's kernel.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Whether this meshd adopted the worker from a previous one (it is not our child).
    pub fn adopted(&self) -> bool {
        matches!(self.child, Held::Adopted { .. })
    }
}

/// Where commands to a worker go: its stdin pipe, or an adopted orphan's rendezvous socket.
#[derive(Debug)]
enum Input {
    Pipe(ChildStdin),
    Socket(UnixStream),
}

impl Write for Input {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Pipe(p) => p.write(buf),
            Self::Socket(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Pipe(p) => p.flush(),
            Self::Socket(s) => s.flush(),
        }
    }
}

fn refused(pid: u32, r: Refusal) -> BackendError {
    BackendError::Worker { pid, detail: r.message }
}

/// A worker's first line: its `ready`, of this protocol's version, else why not.
fn first_line(pid: u32, first: Reply) -> Result<Ready, BackendError> {
    match first {
        Reply::Ready(r) if r.protocol == PROTOCOL => Ok(r),
        Reply::Ready(r) => Err(BackendError::Worker {
            pid,
            detail: format!(
                "speaks protocol {} where meshd speaks {PROTOCOL}: the worker binary ({}) is not this meshd's",
                r.protocol,
                worker_binary().display()
            ),
        }),
        Reply::Refused(r) => Err(refused(pid, r)),
        other => Err(BackendError::Worker { pid, detail: unexpected("ready", &other) }),
    }
}

fn unexpected(wanted: &str, got: &Reply) -> String {
    format!("answered {got:?} where a {wanted} reply was due")
}
