//! A blink standby's life before it takes over (`meshd run … --standby-for PID`, started by the
//! active meshd): warm up, then wait for the mailbox lock ([`meshd::standby`] says why).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use meshd::start::{self, MailboxLock};

use crate::cli::RunArgs;

/// How often the standby reads the state directory for images loaded since it last looked.
const RESCAN: Duration = Duration::from_millis(250);

/// Warms this process up as the standby of meshd `active` (its CUDA context made and kept, every
/// recorded image linked into the state directory) and waits for the mailbox lock. Returns the
/// lock once the active meshd is gone, or `None` once asked to stop (SIGTERM, SIGINT).
pub fn wait(args: &RunArgs, socket: Option<&Path>, device: Option<&str>, active: u32) -> Result<Option<MailboxLock>> {
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("the standby's signal handlers")?;
    }
    let uuid = device.map(start::lookup_uuid).transpose()?;
    let defaults = start::default_paths(uuid.as_deref());
    let shm = args.shm.clone().unwrap_or(defaults.shm);
    let state_dir = args.state_dir.clone().unwrap_or_else(|| meshd::state::default_dir(&shm));
    let device = mesh_cuda::Device::get(0)?;
    let arch = device.arch().to_string();
    // The context a takeover's backend opens: the primary one, retained here so that it exists by
    // then (creating it takes about 200 ms). A green context (--sms) is made at the takeover.
    let _primary = match args.sms {
        None => Some(mesh_cuda::Context::primary(&device)?),
        Some(_) => None,
    };
    let jit = mesh_cuda::Jit::start(&arch)?;
    let mut tried = HashSet::new();
    let mut prelink = || {
        let mut link = |spec: &mesh_backend::ProgramSpec| match jit.link(&spec.name, spec.image.clone(), spec.kind) {
            Ok(linked) => Some(linked.cubin.to_vec()),
            Err(e) => {
                tracing::warn!("standby: linking {}: {e}", spec.name);
                None
            }
        };
        let n = meshd::standby::prelink(&state_dir, &arch, &mut link, &mut tried);
        if n > 0 {
            tracing::info!("standby: {n} image(s) linked into {}/linked", state_dir.display());
        }
    };
    prelink();
    tracing::info!(
        "standby of meshd {active} ready in {:?}: {} warm, waiting for the mailbox lock of {} (socket {})",
        started.elapsed(),
        device.name,
        shm.display(),
        socket.map_or_else(|| "default".into(), |s| s.display().to_string())
    );
    let lock = meshd::standby::wait_for_lock(&shm, &stop, RESCAN, &mut prelink)?;
    match &lock {
        Some(_) => {
            tracing::warn!("standby: meshd {active} is gone (its mailbox lock came free); taking over");
            // Kept for the life of the process: the backend's own context and JIT find the primary
            // context made and nvJitLink loaded instead of paying for both now.
            std::mem::forget(_primary);
            std::mem::forget(jit);
        }
        None => tracing::info!("standby of meshd {active}: asked to stop"),
    }
    Ok(lock)
}
