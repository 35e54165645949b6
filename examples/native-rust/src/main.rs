//! mesh-native-rust: a native GPU worker in Rust, the twin of examples/native-cuda. Started by meshd:
//!
//! ```sh
//! meshd spawn nat --bind to-echo --bind from-echo -- mesh-native-rust 100000 result.txt
//! ```
//!
//! it opens the mailbox (`MESH_MAILBOX`) with mesh-shm, claims the producer end of its first channel
//! and the consumer end of its second (`MESH_CHANNELS`: its kernel drives them), creates its CUDA
//! context with cudarc (an MPS client of meshd's server under `--isolation mps`), registers the whole
//! mailbox mapping in it (`cuMemHostRegister`, `DEVICEMAP`) and builds the kernel's `mesh_ctx` from the
//! device pointer (no program slot), loads the embedded PTX of `native_exchange`
//! (examples/native-cuda/native_kernel.cuh: one warp sends COUNT sequence-numbered 16-byte messages
//! and checks each one coming back through a resident echo program such as tests/programs/echo_warp),
//! launches it, says `ready` (`MESH_READY_FD`), waits for it, and prints, and writes to RESULT if given,
//! `messages=N errors=E ms=T sent=S first_bad=B timed_out=0|1`.
//!
//! Exit status: 0 when all COUNT came back in order, 2 when not, 1 on any error (a variable missing,
//! a bad mailbox, no such channel, a CUDA failure), said on stderr.

mod gpu;
mod setup;

use std::io::Write;
use std::os::fd::FromRawFd;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cudarc::driver::DevicePtr;
use cudarc::driver::sys::CUevent_flags;
use mesh_shm::{End, EndClaim, Mailbox};

use crate::gpu::{Cuda, Kernel, Registered};
use crate::setup::{Args, OUTCOME_WORDS, Outcome, WorkerEnv};

/// How long the kernel keeps trying before it gives up (it then reports `timed_out=1`).
const KERNEL_TIMEOUT_NS: u64 = 60_000_000_000;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("mesh-native-rust: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Waits for the stream on drop: an error after the launch returns through it, so the kernel has
/// ended before its module, its result buffer and the mailbox registration go away.
struct Drain<'a>(&'a cudarc::driver::CudaStream);

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        let _ = self.0.synchronize();
    }
}

/// Writes `ready\n` to `fd`, leaving it open (what mesh-shm-c's `mesh_shm_ready` does).
fn say_ready(fd: i32) -> Result<()> {
    // SAFETY: the File is never dropped (ManuallyDrop), so the descriptor is only written, never
    // closed; a descriptor that is not open makes the write fail with EBADF.
    let mut file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    file.write_all(b"ready\n").with_context(|| format!("writing ready to {} {fd}", setup::ENV_READY_FD))
}

fn run() -> Result<bool> {
    let args = Args::parse(std::env::args_os().skip(1))?;
    let env = WorkerEnv::from_lookup(|k| std::env::var_os(k))?;
    let mailbox = Mailbox::open(&env.mailbox).context("opening the mailbox MESH_MAILBOX names")?;
    let (to, from) = (&env.channels[0], &env.channels[1]);
    setup::channel(&mailbox, to)?;
    setup::channel(&mailbox, from)?;
    // This process's kernel drives these ends; the claims keep anyone else off them until we exit.
    let _tx = EndClaim::take(&mailbox, to, End::Producer)?;
    let _rx = EndClaim::take(&mailbox, from, End::Consumer)?;

    let cuda = gpu::context()?;
    let stream = cuda.default_stream();
    let registered = Registered::new(&cuda, &mailbox)?;
    let ctx = setup::mesh_ctx(&mailbox, registered.device, &env.channels)?;
    let kernel = Kernel::load(&cuda)?;
    let out = stream.alloc_zeros::<u64>(OUTCOME_WORDS).cuda()?;
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let t0 = stream.record_event(timing).cuda()?;
    let _drain = Drain(&stream);
    {
        let (out_ptr, _sync) = out.device_ptr(&stream);
        // SAFETY: `ctx` describes the mailbox registered in this context by `registered`, which stays
        // alive (and `mailbox` mapped) until the stream is synchronized (below, or by `_drain`, which
        // drops before them on every path); `out` is five u64s of this context, freed only after that too.
        unsafe { kernel.launch(&stream, ctx, args.count, KERNEL_TIMEOUT_NS, out_ptr) }?;
    }
    let t1 = stream.record_event(timing).cuda()?;
    // meshd checks MPS membership now: the context exists and the kernel is queued.
    say_ready(env.ready_fd)?;

    t1.synchronize().cuda().context("waiting for the kernel")?;
    let ms = t0.elapsed_ms(&t1).cuda()?;
    let words = stream.clone_dtoh(&out).cuda()?;
    let words: [u64; OUTCOME_WORDS] = words.try_into().map_err(|_| anyhow::anyhow!("the result is not 5 words"))?;
    let outcome = Outcome::from_words(words);
    let line = outcome.line(ms);
    println!("{line}");
    if let Some(path) = &args.result {
        std::fs::write(path, format!("{line}\n"))
            .with_context(|| format!("writing the result to {}", path.display()))?;
    }
    Ok(outcome.ok(args.count))
}
