//! `mesh-mps-worker --mailbox PATH [--sms N] [--device ORDINAL|UUID] [--fd-socket N] [--kernel-check-us N] [--orphan-grace-ms N --rendezvous-dir DIR]`: one MPS client of meshd's server, running one program at a time; or, with `--keep ROOT`, the keeper of an MPS directory.
//!
//! Started by meshd with `CUDA_MPS_PIPE_DIRECTORY` set to its private server. It creates its context
//! (checking that it really is an MPS client), maps and registers the mailbox, takes a green context
//! of N SMs if asked, says `ready`, then answers commands on stdin until `exit` or end of input (meshd
//! gone). While a kernel runs it checks its stream every [`KERNEL_CHECK`] (or `--kernel-check-us`)
//! between commands and says, once per launch, when the kernel ended or failed (an event meshd did
//! not ask for); idle or not, the same loop says `alive` every [`ALIVE_EVERY`]. Every failure is a
//! reply with its kind and reason, never a panic.
//!
//! With `--orphan-grace-ms N` (N > 0) an end of input while the kernel runs does not end the
//! worker: it waits up to N ms at its rendezvous for a meshd (see `mesh_mps_worker::orphan`), then
//! takes commands on that socket, or retires by itself when nobody came.

mod input;

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use mesh_cuda::CudaError;
use mesh_cuda::exported::ImportedMemory;
use mesh_cuda::{Context, Device, Function, LaunchShape, Module, RegisteredMailbox, Stream, StreamState};
use mesh_mps_worker::fdpass::{self, recv_fd};
use mesh_mps_worker::orphan::{self, Grace, KeepPlan, Kept};
use mesh_mps_worker::{
    ALIVE_EVERY, Command, Event, FdTag, FileId, KERNEL_CHECK, KERNEL_CHECK_RANGE_US, Loaded, Orphan, PROTOCOL, Probe,
    Ready, Refusal, RefusalKind, Reply, encode,
};

/// How long an orphan waits, after answering a hello, for the meshd to say adopt or retire: its
/// checks take a control command or two (tens of ms), well under this.
const ADOPT_DECISION: Duration = Duration::from_secs(10);
use mesh_shm::{Mailbox, ShmError};

/// The command line. Every error, usage included, is the first line on stdout as a refusal, since
/// that line is what meshd reads.
#[derive(Debug, Parser)]
#[command(
    name = "mesh-mps-worker",
    about = "One MPS client of meshd's server, running one program at a time",
    override_usage = "mesh-mps-worker --mailbox <PATH> [OPTIONS]\n       mesh-mps-worker --keep <ROOT> --pipe-dir <DIR>... [OPTIONS]"
)]
struct Args {
    /// The mailbox file to map and register.
    #[arg(long, value_name = "PATH", required_unless_present = "keep")]
    mailbox: Option<PathBuf>,
    /// A green context of this many SMs instead of the whole GPU.
    #[arg(long, value_name = "N")]
    sms: Option<u32>,
    /// The GPU: an ordinal among the devices this process sees, or a UUID (`GPU-…`, what meshd
    /// passes: an MPS client sees the server's devices renumbered). Default: device 0.
    #[arg(long, value_name = "ORDINAL|UUID", default_value = "0")]
    device: String,
    /// An inherited unix socket on which meshd sends device rings' descriptors (MPS device channels).
    #[arg(long, value_name = "N")]
    fd_socket: Option<i32>,
    /// How often a running kernel's stream is checked, µs: how soon meshd hears that it ended or
    /// failed, against this process's CPU use (one wake-up per check).
    #[arg(long, value_name = "N", default_value_t = KERNEL_CHECK.as_micros() as u64,
          value_parser = clap::value_parser!(u64).range(*KERNEL_CHECK_RANGE_US.start()..=*KERNEL_CHECK_RANGE_US.end()))]
    kernel_check_us: u64,
    /// At the end of input while a kernel runs (meshd died): keep it running and wait this long at
    /// the rendezvous for a meshd, then stop it in order and exit. 0: exit at once, as the kernel
    /// then dies with the process.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    orphan_grace_ms: u64,
    /// Where an orphan binds its rendezvous socket (`<DIR>/<pid>.sock`).
    #[arg(long, value_name = "DIR")]
    rendezvous_dir: Option<PathBuf>,
    /// How long an orphan's program gets to stop before the worker has the server cut it off.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    stop_deadline_ms: u64,
    /// `nvidia-cuda-mps-control`, for an orphan that must cut itself off and for the keeper.
    #[arg(long, value_name = "PATH", default_value = "nvidia-cuda-mps-control")]
    mps_control: PathBuf,
    /// Be the keeper of MPS directory ROOT instead of a worker: at the end of input (meshd died),
    /// wait until no worker of the `--pipe-dir`s lives, then quit their daemons.
    #[arg(long, value_name = "ROOT")]
    keep: Option<PathBuf>,
    /// The keeper's pipe directories (one per daemon).
    #[arg(long, value_name = "DIR", requires = "keep")]
    pipe_dir: Vec<PathBuf>,
    /// The keeper removes ROOT at the end (meshd made it).
    #[arg(long, requires = "keep")]
    remove_root: bool,
}

struct Worker {
    mailbox: Mailbox,
    registered: RegisteredMailbox,
    stream: Stream,
    ctx: Context,
    /// The loaded `mesh_main` (it keeps its module loaded) and the shape it was probed for.
    loaded: Option<(Function, LaunchShape)>,
    /// Launches so far (the events' numbering).
    launches: u64,
    /// Whether the last launch's end was said.
    reported: bool,
    /// Device channels' rings mapped here, by channel index.
    channels: HashMap<u32, ImportedMemory>,
    /// Where meshd sends their descriptors.
    fd_socket: Option<UnixStream>,
    /// The slot of the last launch.
    slot: Option<u32>,
    /// What it said at start, the `--sms` it was given and its mailbox file, for an orphan's hello.
    ready: Ready,
    asked_sms: Option<u32>,
    mailbox_file: FileId,
    /// The last load's probe (with `loaded`'s shape, what an orphan says it runs).
    probe: Option<Probe>,
}

/// What a connecting meshd asked of an orphan after its hello.
enum Greeting {
    /// It adopts the worker: the socket carries the protocol from now on.
    Adopted,
    /// It asked the worker to stop its program and leave.
    Retire,
    /// No hello of this version, or nothing sensible after it: the orphan waits on.
    Not,
}

/// Where the protocol's lines go: the descriptor that was stdout when the worker started, before
/// [`protect_protocol`] pointed stdout at stderr.
static PROTOCOL_OUT: std::sync::OnceLock<std::sync::Mutex<std::fs::File>> = std::sync::OnceLock::new();

/// Keeps the protocol's pipe for [`say`] alone: moves it off descriptor 1 and points descriptor 1
/// at stderr, so that whatever else writes to stdout (a kernel's `printf`, flushed by the driver at
/// a synchronisation; the driver; a library) lands in the log instead of breaking the worker with
/// a line meshd cannot read. On failure the protocol stays on stdout, as before.
fn protect_protocol() {
    let moved = rustix::io::fcntl_dupfd_cloexec(std::io::stdout(), 3).and_then(|fd| {
        rustix::stdio::dup2_stdout(std::io::stderr())?;
        Ok(fd)
    });
    if let Ok(fd) = moved {
        let _ = PROTOCOL_OUT.set(std::sync::Mutex::new(std::fs::File::from(fd)));
    }
}

fn say<T: serde::Serialize>(line: &T) {
    let text = format!("{}\n", encode(line));
    match PROTOCOL_OUT.get() {
        Some(out) => {
            let mut out = out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = out.write_all(text.as_bytes());
        }
        None => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    }
}

/// The inherited fd socket `--fd-socket N`, checked to be a socket before it is owned.
fn fd_socket(n: i32) -> Result<UnixStream, StartError> {
    let bad = |why: String| StartError::FdSocket { n, why };
    if n < 3 {
        return Err(bad("descriptors 0 to 2 are the command pipes".into()));
    }
    // SAFETY: only inspected: fstat on a descriptor number, which fails with EBADF if it is not open.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(n) };
    let st = rustix::fs::fstat(borrowed).map_err(|e| bad(e.to_string()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Socket {
        return Err(bad("not a socket".into()));
    }
    // SAFETY: meshd passed this open socket for this process alone to own (checked open and a socket).
    Ok(unsafe { UnixStream::from_raw_fd(n) })
}

/// Why the worker could not start (told to meshd as a refusal).
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("device {selector}: {source}")]
    Device { selector: String, source: CudaError },
    #[error("creating the context: {0}")]
    Context(CudaError),
    #[error(
        "not an MPS client (CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 0): was the worker started with meshd's \
         CUDA_MPS_PIPE_DIRECTORY?"
    )]
    NotMpsClient,
    #[error("{0}")]
    Cuda(#[from] CudaError),
    #[error("{0}")]
    Mailbox(#[from] ShmError),
    #[error("--fd-socket {n}: {why}")]
    FdSocket { n: i32, why: String },
}

fn start(args: &Args) -> Result<(Worker, Ready), StartError> {
    let (mailbox_path, sms, selector) =
        (args.mailbox.as_deref().unwrap_or(Path::new("")), args.sms, args.device.as_str());
    let fd_socket = args.fd_socket.map(fd_socket).transpose()?;
    let device = Device::find(selector).map_err(|source| StartError::Device { selector: selector.into(), source })?;
    let started = Instant::now();
    let ctx = match sms {
        Some(n) => Context::green(&device, n),
        None => Context::primary(&device),
    }
    .map_err(StartError::Context)?;
    let context_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    // Read after the context exists: only then has the driver connected to (or missed) the MPS server.
    let device = Device::find(selector)?;
    if !device.mps_enabled {
        return Err(StartError::NotMpsClient);
    }
    let mailbox = Mailbox::open(mailbox_path)?;
    let mailbox_file = FileId::of(mailbox_path)
        .map_err(|e| StartError::Mailbox(ShmError::Io { path: mailbox_path.to_path_buf(), op: "stat", source: e }))?;
    let registered = RegisteredMailbox::register(&ctx, &mailbox)?;
    let stream = ctx.stream()?;
    let ready = Ready {
        protocol: PROTOCOL,
        pid: std::process::id(),
        device: device.name.clone(),
        mps_enabled: device.mps_enabled,
        sms: ctx.sms(),
        context_ms,
        kernel_check_us: args.kernel_check_us,
    };
    let worker = Worker {
        mailbox,
        registered,
        stream,
        ctx,
        loaded: None,
        launches: 0,
        reported: true,
        channels: HashMap::new(),
        fd_socket,
        slot: None,
        ready: ready.clone(),
        asked_sms: sms,
        mailbox_file,
        probe: None,
    };
    Ok((worker, ready))
}

impl Worker {
    fn handle(&mut self, cmd: Command, pulse: &mut Pulse) -> Reply {
        let answer = match cmd {
            Command::Load { cubin, grid, block, shared_mem } => {
                self.load(Path::new(&cubin), LaunchShape { grid, block, shared_mem }).map(Reply::Loaded)
            }
            Command::Launch { slot } => self.launch(slot).map(|()| Reply::Done),
            Command::Wait { timeout_ms } => Ok(Reply::State { state: self.wait(timeout_ms, pulse).into() }),
            Command::Unload => self.unload().map(|()| Reply::Done),
            Command::Map { channel, bytes, zero } => self.map(channel, bytes, zero).map(|()| Reply::Done),
            Command::Export { channel, bytes } => self.export(channel, bytes).map(|()| Reply::Done),
            Command::Exit | Command::Retire => Ok(Reply::Done),
            Command::Hello { .. } | Command::Adopt => {
                Err(Refusal::new(RefusalKind::Malformed, "hello and adopt are said on a rendezvous only"))
            }
        };
        answer.unwrap_or_else(Reply::Refused)
    }

    fn idle(&self, doing: &str) -> Result<(), Refusal> {
        if self.stream.state() == StreamState::Busy {
            return Err(Refusal::new(
                RefusalKind::Busy,
                format!("the kernel is still running: stop it before {doing}"),
            ));
        }
        Ok(())
    }

    /// Loads the cubin and probes its `mesh_main` for `shape` (kcheck's figures, the context's SMs).
    fn load(&mut self, cubin: &Path, shape: LaunchShape) -> Result<Probe, Refusal> {
        self.idle("loading another module")?;
        let image = std::fs::read(cubin)
            .map_err(|e| Refusal::new(RefusalKind::Failed, format!("cubin {}: {e}", cubin.display())))?;
        let failed = |e: mesh_cuda::CudaError| Refusal::new(RefusalKind::Failed, e);
        let module = Module::load(&self.ctx, &image).map_err(failed)?;
        let func = module.function("mesh_main").map_err(|e| Refusal::new(RefusalKind::NoEntry, e))?;
        let f = func.figures(&shape).map_err(failed)?;
        let probe = Probe {
            registers: f.registers,
            shared_bytes: f.shared_bytes,
            max_threads_per_block: f.max_threads_per_block,
            per_sm: f.per_sm,
            sms: self.ctx.sms(),
        };
        self.loaded = Some((func, shape));
        self.probe = Some(probe);
        Ok(probe)
    }

    /// Launches the loaded `mesh_main` for `slot` (meshd armed the slot).
    fn launch(&mut self, slot: u32) -> Result<(), Refusal> {
        let Some((func, shape)) = &self.loaded else {
            return Err(Refusal::new(RefusalKind::NotLoaded, "no module loaded"));
        };
        let failed = |e: &dyn std::fmt::Display| Refusal::new(RefusalKind::Failed, e);
        let channels = &self.channels;
        let ctx = self
            .mailbox
            .mesh_ctx_with(slot, self.registered.device_address(), |info| {
                channels.get(&info.index).map(|m| m.address())
            })
            .map_err(|e| failed(&e))?;
        func.launch(shape, &self.stream, &ctx).map_err(|e| failed(&e))?;
        self.slot = Some(slot);
        self.launches += 1;
        self.reported = false;
        Ok(())
    }

    /// Says once, when the last launch's kernel is no longer running, how it ended.
    fn check_kernel(&mut self) {
        if self.reported {
            return;
        }
        let state = self.stream.state();
        if state != StreamState::Busy {
            self.reported = true;
            let seen_unix_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            say(&Event::KernelEnded { launch: self.launches, state: state.into(), seen_unix_ns });
        }
    }

    /// Maps device channel `channel`'s ring from the descriptor meshd sent just before the command,
    /// and zeroes it when meshd says so (a new or renewed ring; no kernel uses it yet).
    fn map(&mut self, channel: u32, bytes: u64, zero: bool) -> Result<(), Refusal> {
        self.idle("mapping a device channel")?;
        let failed = |e: &dyn std::fmt::Display| Refusal::new(RefusalKind::Failed, format!("channel #{channel}: {e}"));
        let socket = self.fd_socket.as_ref().ok_or_else(|| failed(&"the worker was started without --fd-socket"))?;
        let fd = recv_fd(socket.as_fd(), FdTag { channel, bytes }).map_err(|e| failed(&e))?;
        let len = usize::try_from(bytes).map_err(|e| failed(&e))?;
        // A mapping this one replaces is unmapped first (no kernel runs: checked above).
        self.channels.remove(&channel);
        let mapped = ImportedMemory::import(&self.ctx, fd, len).map_err(|e| failed(&e))?;
        if zero {
            mapped.zero(&self.stream).map_err(|e| failed(&format!("zeroing its ring: {e}")))?;
        }
        self.channels.insert(channel, mapped);
        Ok(())
    }

    /// Sends meshd a new descriptor of device channel `channel`'s ring as mapped here (the kernel
    /// may run: the ring is not touched).
    fn export(&self, channel: u32, bytes: u64) -> Result<(), Refusal> {
        let failed = |e: &dyn std::fmt::Display| Refusal::new(RefusalKind::Failed, format!("channel #{channel}: {e}"));
        let mapped = self.channels.get(&channel).ok_or_else(|| failed(&"its ring is not mapped in this worker"))?;
        if mapped.bytes() as u64 != bytes {
            return Err(failed(&format!("its ring is mapped as {} bytes here, not {bytes}", mapped.bytes())));
        }
        let socket = self.fd_socket.as_ref().ok_or_else(|| failed(&"the worker has no fd socket"))?;
        let fd = mapped.export_fd().map_err(|e| failed(&e))?;
        fdpass::send_fd(socket, fd.as_fd(), FdTag { channel, bytes }).map_err(|e| failed(&e))
    }

    /// The stream's state once the kernel returned, or after `timeout_ms` (0: at once). Says
    /// `alive` meanwhile: a wait for a stop may outlast meshd's silence bound.
    fn wait(&self, timeout_ms: u64, pulse: &mut Pulse) -> StreamState {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let s = self.stream.state();
            if s != StreamState::Busy || Instant::now() >= deadline {
                return s;
            }
            pulse.beat(Instant::now());
            std::thread::yield_now();
        }
    }

    /// Unloads the module (its kernel must have returned).
    fn unload(&mut self) -> Result<(), Refusal> {
        self.idle("unloading")?;
        self.loaded = None;
        self.channels.clear();
        Ok(())
    }

    /// What it runs, as an orphan answers a hello.
    fn orphan_state(&self, grace: &Grace, grace_ms: u64) -> Orphan {
        let generation = self.slot.and_then(|i| self.mailbox.slot(i).ok()).map(|s| s.generation());
        Orphan {
            protocol: PROTOCOL,
            pid: std::process::id(),
            slot: self.slot,
            generation,
            launches: self.launches,
            kernel: self.stream.state().into(),
            orphaned_ms: u64::try_from(grace.orphaned(Instant::now()).as_millis()).unwrap_or(u64::MAX),
            grace_ms,
            ready: self.ready.clone(),
            asked_sms: self.asked_sms,
            mailbox: self.mailbox_file,
            loaded: self.loaded.as_ref().zip(self.probe).map(|((_, shape), probe)| Loaded {
                grid: shape.grid,
                block: shape.block,
                shared_mem: shape.shared_mem,
                probe,
            }),
            mapped: {
                let mut m: Vec<u32> = self.channels.keys().copied().collect();
                m.sort_unstable();
                m
            },
        }
    }

    /// meshd is gone and the kernel runs: waits at the rendezvous for a meshd, up to the grace.
    /// Returns once one said a hello of this version (its socket is then stdin and the protocol's
    /// output); retires, which exits, when the grace passes or the kernel ends by itself.
    fn orphan(&mut self, dir: &Path, args: &Args) {
        let grace = Grace::new(Instant::now(), Duration::from_millis(args.orphan_grace_ms));
        let path = orphan::rendezvous(dir, std::process::id());
        let listener = match orphan::bind_rendezvous(dir, &path) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("mesh-mps-worker {}: rendezvous {}: {e}", std::process::id(), path.display());
                self.retire(args, "its rendezvous could not be made");
            }
        };
        eprintln!(
            "mesh-mps-worker {}: meshd is gone; the kernel runs on, waiting up to {} ms for a meshd at {}",
            std::process::id(),
            args.orphan_grace_ms,
            path.display()
        );
        loop {
            let now = Instant::now();
            if grace.passed(now) {
                self.retire(args, "no meshd came within the grace");
            }
            if self.stream.state() != StreamState::Busy {
                self.retire(args, "its kernel ended");
            }
            let wait = grace.left(now).min(Duration::from_millis(50));
            let mut fds = [rustix::event::PollFd::new(&listener, rustix::event::PollFlags::IN)];
            let timeout = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: i64::try_from(wait.as_nanos()).unwrap_or(999_999_999).min(999_999_999),
            };
            if !matches!(rustix::event::poll(&mut fds, Some(&timeout)), Ok(n) if n > 0) {
                continue;
            }
            let Ok((stream, _)) = listener.accept() else { continue };
            let greeting = self.greet(&stream, &grace, args.orphan_grace_ms);
            if matches!(greeting, Greeting::Not) {
                continue;
            }
            // The socket stands in for the pipes from now on (the rendezvous is no longer needed).
            let _ = std::fs::remove_file(&path);
            let _ = rustix::stdio::dup2_stdin(&stream);
            match rustix::io::fcntl_dupfd_cloexec(&stream, 3) {
                Ok(fd) => speak_on(fd),
                Err(e) => eprintln!("mesh-mps-worker: the rendezvous socket as output: {e}"),
            }
            if matches!(greeting, Greeting::Retire) {
                self.retire(args, "the connecting meshd asked");
            }
            eprintln!(
                "mesh-mps-worker {}: adopted by the meshd that connected after {:?}; the kernel ran on",
                std::process::id(),
                grace.orphaned(Instant::now())
            );
            return;
        }
    }

    /// Reads a connecting meshd's first line (within 2 s) and answers it: its state after a hello
    /// of this version, a refusal naming both versions, or a refusal of anything else. After its
    /// state, the meshd's next line says what it wants: `adopt` (with the new fd socket riding on
    /// it; answered `done` here) or `retire` (answered by the retire itself).
    fn greet(&mut self, stream: &UnixStream, grace: &Grace, grace_ms: u64) -> Greeting {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let answer = |reply: &Reply| {
            let mut s = stream;
            let _ = writeln!(s, "{}", encode(reply));
        };
        let Ok((line, _)) = fdpass::recv_line_with_fd(stream, 4096) else { return Greeting::Not };
        match serde_json::from_str::<Command>(&line) {
            Ok(Command::Hello { protocol }) => {
                if let Err(why) = orphan::check_hello(protocol) {
                    answer(&Reply::refused(RefusalKind::Version, why));
                    return Greeting::Not;
                }
                answer(&Reply::Orphan(self.orphan_state(grace, grace_ms)));
            }
            _ => {
                answer(&Reply::refused(
                    RefusalKind::Malformed,
                    format!("the first line at a rendezvous must be a hello: {line:?}"),
                ));
                return Greeting::Not;
            }
        }
        // meshd checks what this worker said (its server's client list, the mailbox's slot) first.
        let _ = stream.set_read_timeout(Some(ADOPT_DECISION));
        let next = fdpass::recv_line_with_fd(stream, 4096);
        let _ = stream.set_read_timeout(None);
        match next.map(|(line, fds)| (serde_json::from_str::<Command>(&line), line, fds)) {
            Ok((Ok(Command::Adopt), _, fds)) => {
                match fds.into_iter().next() {
                    Some(fd) => self.fd_socket = Some(UnixStream::from(fd)),
                    None => eprintln!(
                        "mesh-mps-worker {}: adopted without a new fd socket: device channels cannot be mapped",
                        std::process::id()
                    ),
                }
                answer(&Reply::Done);
                Greeting::Adopted
            }
            Ok((Ok(Command::Retire), _, _)) => Greeting::Retire,
            Ok((_, line, _)) => {
                answer(&Reply::refused(
                    RefusalKind::Malformed,
                    format!("after a hello a rendezvous takes adopt or retire: {line:?}"),
                ));
                Greeting::Not
            }
            Err(e) => {
                eprintln!("mesh-mps-worker {}: a meshd said hello, then: {e}", std::process::id());
                Greeting::Not
            }
        }
    }

    /// Stops the program in order and exits: its stop asked through its slot (once), the stop
    /// deadline given, else this client cut off its server (so that its exit cannot fail the other
    /// clients' kernels); then `done` on the protocol's output and the exit.
    fn retire(&mut self, args: &Args, why: &str) -> ! {
        let pid = std::process::id();
        let mut ended = "no kernel ran".to_string();
        if self.stream.state() == StreamState::Busy {
            if let Some(slot) = self.slot.and_then(|i| self.mailbox.slot(i).ok()) {
                slot.request_stop();
            }
            let deadline = Instant::now() + Duration::from_millis(args.stop_deadline_ms);
            while self.stream.state() == StreamState::Busy && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            ended = match self.stream.state() {
                StreamState::Busy => {
                    orphan::cut_off_self(&args.mps_control, pid);
                    format!("its kernel did not stop within {} ms and was cut off", args.stop_deadline_ms)
                }
                StreamState::Idle => "its kernel stopped".to_string(),
                StreamState::Failed(e) => format!("its kernel failed ({e})"),
            };
        }
        if let Some(dir) = &args.rendezvous_dir {
            let _ = std::fs::remove_file(orphan::rendezvous(dir, pid));
        }
        eprintln!("mesh-mps-worker {pid}: retires ({why}): {ended}");
        say(&Reply::Done);
        std::process::exit(0)
    }
}

/// Sends the protocol's lines to `fd` from now on (an adopting meshd's socket).
fn speak_on(fd: std::os::fd::OwnedFd) {
    match PROTOCOL_OUT.get() {
        Some(out) => *out.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = std::fs::File::from(fd),
        None => {
            let _ = PROTOCOL_OUT.set(std::sync::Mutex::new(std::fs::File::from(fd)));
        }
    }
}

/// `--keep ROOT`: the keeper of an MPS directory (see `mesh_mps_worker::orphan::keep`).
fn keeper(root: &Path, args: &Args) {
    let plan = KeepPlan {
        root: root.to_path_buf(),
        pipe_dirs: args.pipe_dir.clone(),
        control: args.mps_control.clone(),
        wedged_after: Duration::from_millis(args.orphan_grace_ms.saturating_add(args.stop_deadline_ms))
            + orphan::WEDGED_AFTER,
        remove_root: args.remove_root,
        every: Duration::from_millis(100),
    };
    match orphan::keep(&plan, std::io::stdin()) {
        Kept::Released => {}
        Kept::Reaped(lines) => {
            for line in lines {
                eprintln!("mesh-mps-worker keeper of {}: {line}", root.display());
            }
        }
    }
}

fn main() {
    protect_protocol();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version: printed as usual
        Err(e) => {
            say(&Reply::refused(RefusalKind::Usage, e.render()));
            std::process::exit(2);
        }
    };
    if let Some(root) = &args.keep {
        keeper(root, &args);
        return;
    }
    let (mut worker, ready) = match start(&args) {
        Ok(w) => w,
        Err(e) => {
            say(&Reply::refused(RefusalKind::Start, e));
            std::process::exit(1);
        }
    };
    let check = Duration::from_micros(args.kernel_check_us);
    // On stderr, which meshd's log takes: the period this worker runs with.
    eprintln!(
        "mesh-mps-worker {}: checks a running kernel's stream every {} µs, says alive every {} ms",
        std::process::id(),
        args.kernel_check_us,
        ALIVE_EVERY.as_millis()
    );
    say(&Reply::Ready(ready));
    let mut commands = input::Lines::default();
    let mut pulse = Pulse::new(Instant::now());
    loop {
        worker.check_kernel();
        let now = Instant::now();
        pulse.beat(now);
        // While a kernel runs, the stream is checked every `check` between commands; idle, the
        // loop wakes only to say alive.
        let wait = if worker.reported { pulse.until_due(now) } else { check.min(pulse.until_due(now)) };
        let line = match commands.next(Some(wait)) {
            input::Next::Line(line) => line,
            input::Next::Quiet => continue,
            input::Next::End if args.orphan_grace_ms > 0 && !worker.reported => {
                // meshd is gone while the kernel runs: keep it for a meshd to come.
                if let Some(dir) = &args.rendezvous_dir {
                    worker.orphan(dir, &args);
                    commands = input::Lines::default();
                    continue;
                }
                break;
            }
            // meshd died while this worker was idle (under a grace): nothing to keep. Leave at once,
            // the context to the driver's teardown at exit: a restarting meshd then sees an exiting
            // process and need not wait for it (a drop, or the driver library's exit handlers,
            // would tear the context down with the process alive). No work is in flight.
            input::Next::End if args.orphan_grace_ms > 0 => {
                std::mem::forget(worker);
                // SAFETY: _exit skips destructors and exit handlers, which nothing here needs (every
                // reply was written whole, unbuffered).
                unsafe { libc::_exit(0) }
            }
            input::Next::End => break,
        };
        let reply = match serde_json::from_str::<Command>(&line) {
            Ok(Command::Exit) => break,
            Ok(Command::Retire) => worker.retire(&args, "meshd asked"),
            Ok(cmd) => worker.handle(cmd, &mut pulse),
            Err(e) => Reply::refused(RefusalKind::Malformed, format!("malformed command: {e}")),
        };
        say(&reply);
    }
    // End of input: meshd asked us to leave, or is gone. A kernel still running is left to process exit.
    if worker.stream.state() == StreamState::Busy {
        std::mem::forget(worker);
    }
}

/// When to say `alive` next: every [`ALIVE_EVERY`], from the loop that checks the stream (so a
/// line proves that loop runs, not merely that some thread of the process does).
struct Pulse {
    next: Instant,
}

impl Pulse {
    fn new(now: Instant) -> Self {
        Self { next: now + ALIVE_EVERY }
    }

    /// Says `alive` if it is due at `now`.
    fn beat(&mut self, now: Instant) {
        if self.due(now) {
            say(&Event::Alive);
        }
    }

    /// Whether `alive` is due at `now` (then the next one is counted from `now`).
    fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        // From now, not from the missed time: a loop that was held up says it once, not in a burst.
        self.next = now + ALIVE_EVERY;
        true
    }

    /// How long from `now` until the next `alive` is due (at least 1 ms, so a late loop does not spin).
    fn until_due(&self, now: Instant) -> Duration {
        self.next.saturating_duration_since(now).max(Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_parse_and_bad_ones_are_refused() {
        let a = Args::try_parse_from(["mesh-mps-worker", "--mailbox", "/dev/shm/m", "--sms", "16"]).unwrap();
        assert_eq!((a.mailbox, a.sms, a.device.as_str()), (Some(PathBuf::from("/dev/shm/m")), Some(16), "0"));
        assert_eq!(a.orphan_grace_ms, 0, "no orphan by default");
        let b = Args::try_parse_from(["mesh-mps-worker", "--mailbox", "m", "--device", "GPU-5f3a0011"]).unwrap();
        assert_eq!(b.device, "GPU-5f3a0011");
        assert!(Args::try_parse_from(["mesh-mps-worker"]).is_err(), "--mailbox is required");
        let k = Args::try_parse_from(["mesh-mps-worker", "--keep", "/tmp/r", "--pipe-dir", "/tmp/r/pipe"]).unwrap();
        assert_eq!(
            (k.keep, k.pipe_dir.len(), k.mailbox),
            (Some(PathBuf::from("/tmp/r")), 1, None),
            "a keeper needs no mailbox"
        );
        assert!(
            Args::try_parse_from(["mesh-mps-worker", "--mailbox", "m", "--pipe-dir", "p"]).is_err(),
            "--pipe-dir is the keeper's"
        );
        assert!(Args::try_parse_from(["mesh-mps-worker", "--mailbox", "m", "--sms", "many"]).is_err());
        assert_eq!(a.kernel_check_us, 5000, "the default period is KERNEL_CHECK");
        let c = Args::try_parse_from(["mesh-mps-worker", "--mailbox", "m", "--kernel-check-us", "1000"]).unwrap();
        assert_eq!(c.kernel_check_us, 1000);
        for bad in ["0", "49", "200001", "1ms"] {
            let e = Args::try_parse_from(["mesh-mps-worker", "--mailbox", "m", "--kernel-check-us", bad]);
            assert!(e.is_err(), "--kernel-check-us {bad} is refused");
        }
    }

    #[test]
    fn alive_is_due_every_period_and_once_after_a_stall() {
        let t0 = Instant::now();
        let mut p = Pulse::new(t0);
        assert_eq!(p.until_due(t0), ALIVE_EVERY);
        assert!(!p.due(t0 + ALIVE_EVERY / 2), "not due yet");
        assert!(p.due(t0 + ALIVE_EVERY), "due after one period");
        assert!(!p.due(t0 + ALIVE_EVERY + Duration::from_millis(1)), "once per period");
        // Held up for ten periods: one line, then the next a whole period later.
        let late = t0 + ALIVE_EVERY * 11;
        assert!(p.due(late));
        assert!(!p.due(late + ALIVE_EVERY / 2));
        assert_eq!(p.until_due(late + ALIVE_EVERY * 3), Duration::from_millis(1), "overdue: a short wait, not zero");
    }
}
