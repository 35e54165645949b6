//! `mesh-mps-worker --mailbox PATH [--sms N] [--device ORDINAL|UUID]`: one MPS client of meshd's server, running one program at a time.
//!
//! Started by meshd with `CUDA_MPS_PIPE_DIRECTORY` set to its private server. It creates its context
//! (checking that it really is an MPS client), maps and registers the mailbox, takes a green context
//! of N SMs if asked, says `ready`, then answers commands on stdin until `exit` or end of input (meshd
//! gone). Every failure is a reply with its kind and reason, never a panic.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use mesh_cuda::CudaError;
use mesh_cuda::{Context, Device, Function, LaunchShape, Module, RegisteredMailbox, Stream, StreamState};
use mesh_mps_worker::{Command, Probe, Ready, Refusal, RefusalKind, Reply, encode};
use mesh_shm::{Mailbox, ShmError};

/// The command line. Every error, usage included, is the first line on stdout as a refusal, since
/// that line is what meshd reads.
#[derive(Debug, Parser)]
#[command(name = "mesh-mps-worker", about = "One MPS client of meshd's server, running one program at a time")]
struct Args {
    /// The mailbox file to map and register.
    #[arg(long, value_name = "PATH")]
    mailbox: PathBuf,
    /// A green context of this many SMs instead of the whole GPU.
    #[arg(long, value_name = "N")]
    sms: Option<u32>,
    /// The GPU: an ordinal among the devices this process sees, or a UUID (`GPU-…`, what meshd
    /// passes: an MPS client sees the server's devices renumbered). Default: device 0.
    #[arg(long, value_name = "ORDINAL|UUID", default_value = "0")]
    device: String,
}

struct Worker {
    mailbox: Mailbox,
    registered: RegisteredMailbox,
    stream: Stream,
    ctx: Context,
    /// The loaded `mesh_main` (it keeps its module loaded) and the shape it was probed for.
    loaded: Option<(Function, LaunchShape)>,
}

fn say(reply: &Reply) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", encode(reply));
    let _ = out.flush();
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
}

fn start(mailbox_path: &Path, sms: Option<u32>, selector: &str) -> Result<(Worker, Ready), StartError> {
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
    let registered = RegisteredMailbox::register(&ctx, &mailbox)?;
    let stream = ctx.stream()?;
    let ready = Ready {
        pid: std::process::id(),
        device: device.name.clone(),
        mps_enabled: device.mps_enabled,
        sms: ctx.sms(),
        context_ms,
    };
    Ok((Worker { mailbox, registered, stream, ctx, loaded: None }, ready))
}

impl Worker {
    fn handle(&mut self, cmd: Command) -> Reply {
        let answer = match cmd {
            Command::Load { cubin, grid, block, shared_mem } => {
                self.load(Path::new(&cubin), LaunchShape { grid, block, shared_mem }).map(Reply::Loaded)
            }
            Command::Launch { slot } => self.launch(slot).map(|()| Reply::Done),
            Command::Wait { timeout_ms } => Ok(Reply::State { state: self.wait(timeout_ms).into() }),
            Command::Unload => self.unload().map(|()| Reply::Done),
            Command::Exit => Ok(Reply::Done),
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
        Ok(probe)
    }

    /// Launches the loaded `mesh_main` for `slot` (meshd armed the slot).
    fn launch(&mut self, slot: u32) -> Result<(), Refusal> {
        let Some((func, shape)) = &self.loaded else {
            return Err(Refusal::new(RefusalKind::NotLoaded, "no module loaded"));
        };
        let failed = |e: &dyn std::fmt::Display| Refusal::new(RefusalKind::Failed, e);
        let ctx = self.mailbox.mesh_ctx(slot, self.registered.device_address()).map_err(|e| failed(&e))?;
        func.launch(shape, &self.stream, &ctx).map_err(|e| failed(&e))
    }

    /// The stream's state once the kernel returned, or after `timeout_ms` (0: at once).
    fn wait(&self, timeout_ms: u64) -> StreamState {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let s = self.stream.state();
            if s != StreamState::Busy || Instant::now() >= deadline {
                return s;
            }
            std::thread::yield_now();
        }
    }

    /// Unloads the module (its kernel must have returned).
    fn unload(&mut self) -> Result<(), Refusal> {
        self.idle("unloading")?;
        self.loaded = None;
        Ok(())
    }
}

fn main() {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version: printed as usual
        Err(e) => {
            say(&Reply::refused(RefusalKind::Usage, e.render()));
            std::process::exit(2);
        }
    };
    let (mut worker, ready) = match start(&args.mailbox, args.sms, &args.device) {
        Ok(w) => w,
        Err(e) => {
            say(&Reply::refused(RefusalKind::Start, e));
            std::process::exit(1);
        }
    };
    say(&Reply::Ready(ready));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = match serde_json::from_str::<Command>(&line) {
            Ok(Command::Exit) => break,
            Ok(cmd) => worker.handle(cmd),
            Err(e) => Reply::refused(RefusalKind::Malformed, format!("malformed command: {e}")),
        };
        say(&reply);
    }
    // End of input: meshd asked us to leave, or is gone. A kernel still running is left to process exit.
    if worker.stream.state() == StreamState::Busy {
        std::mem::forget(worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_parse_and_bad_ones_are_refused() {
        let a = Args::try_parse_from(["mesh-mps-worker", "--mailbox", "/dev/shm/m", "--sms", "16"]).unwrap();
        assert_eq!((a.mailbox, a.sms, a.device.as_str()), (PathBuf::from("/dev/shm/m"), Some(16), "0"));
        let b = Args::try_parse_from(["mesh-mps-worker", "--mailbox", "m", "--device", "GPU-5f3a0011"]).unwrap();
        assert_eq!(b.device, "GPU-5f3a0011");
        assert!(Args::try_parse_from(["mesh-mps-worker"]).is_err(), "--mailbox is required");
        assert!(Args::try_parse_from(["mesh-mps-worker", "--mailbox", "m", "--sms", "many"]).is_err());
    }
}
