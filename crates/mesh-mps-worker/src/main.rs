//! `mesh-mps-worker --mailbox PATH [--sms N]`: one MPS client of meshd's server, running one program at a time.
//!
//! Started by meshd with `CUDA_MPS_PIPE_DIRECTORY` set to its private server. It creates its context
//! (checking that it really is an MPS client), maps and registers the mailbox, takes a green context
//! of N SMs if asked, says `ready`, then answers commands on stdin until `exit` or end of input (meshd
//! gone). Every failure is a reply with the reason, never a panic.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use mesh_cuda::{Context, Device, LaunchShape, Module, RegisteredMailbox, StreamState};
use mesh_mps_worker::{Command, Probe, Ready, Reply, encode};
use mesh_shm::Mailbox;

struct Worker {
    mailbox: Mailbox,
    registered: RegisteredMailbox,
    stream: mesh_cuda::Stream,
    ctx: Context,
    module: Option<(Module, LaunchShape)>,
}

fn say(reply: &Reply) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", encode(reply));
    let _ = out.flush();
}

fn start(mailbox_path: &str, sms: Option<u32>) -> Result<(Worker, Ready), String> {
    let device = Device::get(0).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let ctx = match sms {
        Some(n) => Context::green(&device, n),
        None => Context::primary(&device),
    }
    .map_err(|e| format!("creating the context: {e}"))?;
    let context_ms = started.elapsed().as_millis() as u64;
    // Read after the context exists: only then has the driver connected to (or missed) the MPS server.
    let device = Device::get(0).map_err(|e| e.to_string())?;
    if !device.mps_enabled {
        return Err("not an MPS client (CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 0): was the worker started with meshd's CUDA_MPS_PIPE_DIRECTORY?".into());
    }
    let mailbox = Mailbox::open(mailbox_path).map_err(|e| e.to_string())?;
    let registered = RegisteredMailbox::register(&ctx, &mailbox).map_err(|e| e.to_string())?;
    let stream = ctx.stream().map_err(|e| e.to_string())?;
    let ready = Ready {
        pid: std::process::id(),
        device: device.name.clone(),
        mps_enabled: device.mps_enabled,
        sms: ctx.sms(),
        context_ms,
    };
    Ok((Worker { mailbox, registered, stream, ctx, module: None }, ready))
}

impl Worker {
    fn handle(&mut self, cmd: Command) -> Reply {
        match cmd {
            Command::Load { cubin, grid, block, shared_mem } => {
                if self.stream.state() == StreamState::Busy {
                    return Reply::error("a kernel is still running in this worker");
                }
                let image = match std::fs::read(&cubin) {
                    Ok(b) => b,
                    Err(e) => return Reply::error(format!("cubin {cubin}: {e}")),
                };
                let shape = LaunchShape { grid, block, shared_mem };
                let probe = (|| {
                    let module = Module::load(&self.ctx, &image)?;
                    let func = module.function("mesh_main").map_err(|e| mesh_cuda::BackendError::NoEntry {
                        program: cubin.clone(),
                        detail: e.to_string(),
                    })?;
                    let a = func.attributes()?;
                    let per_sm = func.max_active_blocks_per_sm(&shape)?;
                    let probe = Probe {
                        registers: a.registers,
                        shared_bytes: a.shared_bytes,
                        max_threads_per_block: a.max_threads_per_block,
                        per_sm,
                        sms: self.ctx.sms(),
                    };
                    Ok::<_, mesh_cuda::BackendError>((module, probe))
                })();
                match probe {
                    Ok((module, probe)) => {
                        self.module = Some((module, shape));
                        Reply { ok: true, probe: Some(probe), ..Reply::default() }
                    }
                    Err(e) => Reply::error(e),
                }
            }
            Command::Launch { slot } => {
                let Some((module, shape)) = &self.module else { return Reply::error("no module loaded") };
                let launched =
                    self.mailbox.mesh_ctx(slot, self.registered.device_address()).map_err(|e| e.to_string()).and_then(
                        |ctx| {
                            module
                                .function("mesh_main")
                                .and_then(|f| f.launch(shape, &self.stream, &ctx))
                                .map_err(|e| e.to_string())
                        },
                    );
                match launched {
                    Ok(()) => Reply { ok: true, ..Reply::default() },
                    Err(e) => Reply::error(e),
                }
            }
            Command::Wait { timeout_ms } => {
                let deadline = Instant::now() + Duration::from_millis(timeout_ms);
                let state = loop {
                    let s = self.stream.state();
                    if s != StreamState::Busy || Instant::now() >= deadline {
                        break s;
                    }
                    std::thread::yield_now();
                };
                let state = match state {
                    StreamState::Idle => "idle".to_string(),
                    StreamState::Busy => "busy".to_string(),
                    StreamState::Failed(why) => format!("failed: {why}"),
                };
                Reply { ok: true, state: Some(state), ..Reply::default() }
            }
            Command::Unload => {
                if self.stream.state() == StreamState::Busy {
                    return Reply::error("the kernel is still running: stop it before unloading");
                }
                self.module = None;
                Reply { ok: true, ..Reply::default() }
            }
            Command::Exit => Reply { ok: true, ..Reply::default() },
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut mailbox = None;
    let mut sms = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--mailbox" => mailbox = it.next().cloned(),
            "--sms" => sms = it.next().and_then(|s| s.parse().ok()),
            other => {
                say(&Reply::error(format!(
                    "unknown argument {other:?}; usage: mesh-mps-worker --mailbox PATH [--sms N]"
                )));
                std::process::exit(2);
            }
        }
    }
    let Some(mailbox) = mailbox else {
        say(&Reply::error("usage: mesh-mps-worker --mailbox PATH [--sms N]"));
        std::process::exit(2);
    };
    let (mut worker, ready) = match start(&mailbox, sms) {
        Ok(w) => w,
        Err(e) => {
            say(&Reply::error(e));
            std::process::exit(1);
        }
    };
    say(&Reply { ok: true, ready: Some(ready), ..Reply::default() });
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = match serde_json::from_str::<Command>(&line) {
            Ok(Command::Exit) => break,
            Ok(cmd) => worker.handle(cmd),
            Err(e) => Reply::error(format!("malformed command: {e}")),
        };
        say(&reply);
    }
    // End of input: meshd asked us to leave, or is gone. A kernel still running is left to process exit.
    if worker.stream.state() == StreamState::Busy {
        std::mem::forget(worker);
    }
}
