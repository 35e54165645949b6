//! The daemon: `meshd run` claims the mailbox, prepares the backend and the socket, and serves.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Result;
use mesh_backend::{Backend, IsolationMode, cleanup};
use mesh_shm::{Mailbox, MailboxConfig};
use meshd::server::{Limits, Opened, Server};
use meshd::start::{self, DeviceId, Origin};
use meshd::state::{self, StateStore};

use crate::cli::RunArgs;

/// `meshd run`: the mailbox and its lock first (refusal and takeover happen before any GPU work),
/// then the backend on its own thread, then the socket; serves until shutdown or a signal.
pub fn run(mut args: RunArgs, socket: Option<PathBuf>, device: Option<String>) -> Result<()> {
    let mode: IsolationMode = args.isolation.parse()?;
    if mode == IsolationMode::Blink {
        let mps_only = mps_options_given(&args);
        if !mps_only.is_empty() {
            anyhow::bail!(
                "{} appl{} to MPS mode only, and this meshd would run in blink mode: add --isolation mps, or \
                 leave {} out",
                mps_only.join(", "),
                if mps_only.len() == 1 { "ies" } else { "y" },
                if mps_only.len() == 1 { "it" } else { "them" }
            );
        }
        // Blink programs are kernels of meshd's own context: nothing of them can outlive it.
        args.orphan_grace_ms = 0;
    }
    if args.client_stall_ms == 0 && args.client_stall_kill_ms.is_some() {
        anyhow::bail!(
            "--client-stall-kill-ms needs the stall watcher, which --client-stall-ms 0 turns off: give \
             --client-stall-ms above 0, or leave --client-stall-kill-ms out"
        );
    }
    let _cleanup = cleanup::RunOnDrop;
    let claimed = claim(args, socket, device)?;
    let (server, listener) = prepare(&claimed, mode)?;
    serve(claimed, mode, server, listener)
}

/// The MPS options given a value other than their default (blink mode refuses them rather than run
/// without what they ask for: there is no fallback between the modes, either way).
fn mps_options_given(args: &RunArgs) -> Vec<&'static str> {
    let defaults = <crate::cli::Cli as clap::Parser>::parse_from(["meshd", "run"]);
    let crate::cli::Command::Run(d) = defaults.command else { unreachable!("`meshd run` parses as Run") };
    let mut given = Vec::new();
    if args.mps_dir.is_some() {
        given.push("--mps-dir");
    }
    if args.pool != d.pool {
        given.push("--pool");
    }
    if args.pool_grow {
        given.push("--pool-grow");
    }
    if args.standby.is_some() {
        given.push("--standby");
    }
    if args.mps_kernel_check_us != d.mps_kernel_check_us {
        given.push("--mps-kernel-check-us");
    }
    if args.orphan_grace_ms != d.orphan_grace_ms {
        given.push("--orphan-grace-ms");
    }
    given
}

/// What `meshd run` holds once the mailbox is claimed.
struct Claimed {
    args: RunArgs,
    socket: PathBuf,
    shm: PathBuf,
    state_dir: PathBuf,
    mailbox: Mailbox,
    /// The mailbox was made now (not taken over).
    created: bool,
    /// The GPU `--device` named, found before the mailbox was claimed.
    device_id: Option<DeviceId>,
    /// The monitoring endpoint (`--metrics-addr`), bound before the mailbox was claimed.
    endpoint: Option<meshd::http::Endpoint>,
}

/// Resolves the paths (from the GPU's UUID with --device), checks the socket is free, claims the
/// mailbox and its lock, and clears what a dead meshd of this GPU left.
fn claim(mut args: RunArgs, socket: Option<PathBuf>, device: Option<String>) -> Result<Claimed> {
    // With --device the paths derive from the GPU's UUID, so the driver is asked first (no context).
    let uuid = device.as_deref().map(start::lookup_uuid).transpose()?;
    let device_id = uuid.clone().map(|uuid| DeviceId { selector: device.clone(), uuid });
    let defaults = start::default_paths(uuid.as_deref());
    let socket = socket.unwrap_or(defaults.socket);
    let shm = args.shm.take().unwrap_or(defaults.shm);
    args.mps_dir = args.mps_dir.take().or(defaults.mps_dir);
    if let Some(u) = &uuid {
        tracing::info!(
            "device {} = {u}: socket {}, mailbox {}",
            device.as_deref().unwrap_or_default(),
            socket.display(),
            shm.display()
        );
    }
    start::check_socket_free(&socket)?;
    // Bound before the GPU is touched: a taken port refuses the start at once.
    let endpoint = args.monitor.metrics_addr.as_deref().map(meshd::http::Endpoint::bind).transpose()?;
    let config = MailboxConfig { size: args.shm_size, slots: args.slots, channels: args.channels };
    let state_dir = args.state_dir.clone().unwrap_or_else(|| state::default_dir(&shm));
    // Before the mailbox is made: a directory of other files is refused with nothing made or removed.
    StateStore::check_dir(&state_dir)?;
    // Under an orphan grace (MPS mode only) the previous meshd's programs may run on: their slots
    // are left for the MPS backend, which adopts them or stops them before anything is relaunched.
    let claimed = if args.orphan_grace_ms > 0 {
        start::claim_mailbox_for_adoption(&shm, &config, args.fresh)?
    } else {
        start::claim_mailbox(&shm, &config, args.fresh)?
    };
    let (mailbox, origin) = (claimed.mailbox, claimed.origin);
    start::explain_bus_errors(&shm);
    let lock = claimed.lock;
    // What a dead meshd left in the MPS directory (workers still running their programs under an
    // orphan grace, its daemons, stale pipes) is the MPS backend's as it opens: the orphans that
    // run what the mailbox says are adopted with their daemon, the others retired and waited for
    // before any program is relaunched, and a daemon nothing is adopted from told to quit.
    // Registered first, so it runs last: the mailbox and state are gone before another meshd can lock.
    cleanup::register("mailbox lock", move || lock.remove());
    if args.fresh {
        StateStore::forget(&state_dir)?;
    }
    report_origin(&origin, &mailbox, &config);
    let created = origin == Origin::Created;
    Ok(Claimed { args, socket, shm, state_dir, mailbox, created, device_id, endpoint })
}

/// The control plane's limits: the defaults, with the stall watcher `meshd run`'s options ask for.
fn limits(args: &RunArgs) -> Limits {
    Limits {
        client_stall: (args.client_stall_ms > 0).then(|| Duration::from_millis(args.client_stall_ms)),
        client_stall_kill: args.client_stall_kill_ms.map(Duration::from_millis),
        natives_outlive_meshd: args.orphan_grace_ms > 0,
        ..Limits::default()
    }
}

/// Opens the state directory (recreating the recorded channels), starts the backend on its thread
/// and binds the socket. On failure a mailbox made just now is removed again.
fn prepare(c: &Claimed, mode: IsolationMode) -> Result<(Server, UnixListener)> {
    let Claimed { args, socket, shm, state_dir, mailbox, created, device_id, .. } = c;
    let prepared = (|| {
        let mut store = StateStore::open(state_dir)?;
        let restored = store.restore_channels(mailbox)?;
        if restored > 0 {
            tracing::info!("{restored} recorded channels recreated in the new mailbox");
        }
        store.record_channels(mailbox)?;
        let backend_args = BackendArgs::from(args);
        // The backend learns the GPU's UUID when it opens; --device's lookup, where given, names it first.
        let found = Arc::new(OnceLock::new());
        let found_by_backend = found.clone();
        let server = Server::start(mailbox.clone(), limits(args), Some(store), move |mb| {
            open_backend(mode, &backend_args, mb, &found_by_backend)
        })?;
        if let Some(id) = device_id.clone().or_else(|| found.get().cloned()) {
            server.set_device(id);
        }
        let listener = start::bind_socket(socket)?;
        Ok::<_, anyhow::Error>((server, listener))
    })();
    if prepared.is_err() && *created {
        // A mailbox made just now holds nothing: leave nothing behind. One taken over holds
        // channels and messages: keep it, and its state, for the next start.
        let _ = std::fs::remove_file(shm);
        if StateStore::open(state_dir).is_ok_and(|s| s.recorded().programs.is_empty()) {
            let _ = StateStore::forget(state_dir);
        }
    }
    prepared
}

/// Registers what a clean exit removes, stops on SIGINT and SIGTERM, starts the monitoring
/// endpoint, and serves until shutdown (telling systemd when it is ready, live and stopping).
fn serve(c: Claimed, mode: IsolationMode, server: Server, listener: UnixListener) -> Result<()> {
    let Claimed { args, socket, shm, state_dir, endpoint, .. } = c;
    // A clean exit tears the mesh down: the recorded state goes with the mailbox (both kept with --keep-shm).
    if !args.keep_shm {
        let dir = state_dir.clone();
        cleanup::register("state directory", move || {
            let _ = StateStore::forget(&dir);
        });
    }
    start::remove_at_exit("mailbox", shm.clone(), args.keep_shm);
    start::remove_at_exit("control socket", socket.clone(), false);
    server.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let monitor = server.monitor();
    monitor.metrics().set_health(args.monitor.health());
    if let Some(endpoint) = endpoint {
        endpoint.serve(monitor.clone(), meshd::http::HttpLimits::default())?;
    }
    let (relaunched, failed) = server.relaunched;
    tracing::info!(
        "ready: {mode} mode, mailbox {}, socket {}, state {}{}",
        shm.display(),
        socket.display(),
        state_dir.display(),
        if relaunched + failed > 0 {
            format!(", {relaunched} programs relaunched, {failed} failed")
        } else {
            String::new()
        }
    );
    meshd::health::notify_ready();
    meshd::health::spawn_systemd_watchdog(move || monitor.live())?;
    let clean = server.run(listener)?;
    meshd::health::notify_stopping();
    if !clean {
        // A kernel that ignores its stop request keeps the context busy, and releasing the context
        // (or libcuda's exit handlers) would wait for it. Run the cleanup, then leave at once: the
        // kernel driver tears the context down, kernel included, when the process is gone.
        cleanup::run_all();
        tracing::warn!("exiting with programs still running on the GPU; process exit ends them");
        // SAFETY: _exit ends the process without running destructors or atexit handlers; the
        // cleanup registry (mailbox and socket removal) has already run.
        unsafe { libc::_exit(0) };
    }
    tracing::info!("stopped");
    Ok(())
}

/// Logs how the mailbox was obtained; warns when an existing one differs from the asked geometry.
fn report_origin(origin: &Origin, mailbox: &Mailbox, asked: &MailboxConfig) {
    match origin {
        Origin::Created => tracing::info!("mailbox {} created", mailbox.path().display()),
        Origin::TakenOver { previous_pid, channels, released_slots, replay } => {
            tracing::info!(
                "mailbox {} taken over from meshd pid {} (it holds no lock any more), with its {channels} channels \
                 and their messages; {} program slots it left in use released",
                mailbox.path().display(),
                previous_pid.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
                released_slots.len()
            );
            for r in replay {
                tracing::warn!(
                    "channel {}: a GPU consumer may receive again up to {} message(s) from position {} (it had \
                     published its position up to there when meshd died: at-least-once after a crash)",
                    r.channel,
                    r.at_most,
                    r.from
                );
            }
            let g = mailbox.geometry();
            if let Ok(want) = mesh_shm::Geometry::plan(asked)
                && (want.file_size, want.slot_count, want.channel_count) != (g.file_size, g.slot_count, g.channel_count)
            {
                tracing::warn!(
                    "keeping the existing mailbox's geometry ({} bytes, {} slots, {} channels), not the one asked \
                         for ({} bytes, {} slots, {} channels); start with --fresh to make a new one",
                    g.file_size,
                    g.slot_count,
                    g.channel_count,
                    want.file_size,
                    want.slot_count,
                    want.channel_count
                );
            }
        }
    }
}

/// What the backend thread needs from the command line.
#[derive(Debug, Clone)]
struct BackendArgs {
    sms: Option<u32>,
    mps_dir: Option<PathBuf>,
    pool: u32,
    pool_grow: bool,
    standby: Option<u32>,
    stop_deadline: Duration,
    kernel_check: Duration,
    orphan_grace: Duration,
}

impl From<&RunArgs> for BackendArgs {
    fn from(a: &RunArgs) -> Self {
        Self {
            sms: a.sms,
            mps_dir: a.mps_dir.clone(),
            pool: a.pool,
            pool_grow: a.pool_grow,
            standby: a.standby,
            stop_deadline: Duration::from_millis(a.stop_timeout_ms),
            kernel_check: Duration::from_micros(a.mps_kernel_check_us),
            orphan_grace: Duration::from_millis(a.orphan_grace_ms),
        }
    }
}

/// Opens the chosen backend; runs on the backend thread, which owns it until meshd ends.
/// No fallback between the modes: whatever the chosen one lacks is an error.
fn open_backend(
    mode: IsolationMode,
    args: &BackendArgs,
    mailbox: &Mailbox,
    found: &OnceLock<DeviceId>,
) -> Result<Opened> {
    let device = mesh_cuda::Device::get(0)?;
    let backend: Box<dyn mesh_backend::Backend> = match mode {
        IsolationMode::Blink => {
            let config = mesh_cuda::BlinkConfig { sms: args.sms, stop_deadline: args.stop_deadline };
            let b = mesh_cuda::BlinkBackend::open(mailbox, config)?;
            tracing::info!(
                "blink mode: one context of {} SMs{}",
                b.context().sms(),
                if b.context().is_green() { " (green)" } else { "" }
            );
            Box::new(b)
        }
        IsolationMode::Mps => {
            let config = mesh_mps::MpsConfig {
                sms: args.sms,
                mps_dir: args.mps_dir.clone(),
                pool: args.pool,
                pool_grow: args.pool_grow,
                stop_deadline: args.stop_deadline,
                kernel_check: args.kernel_check,
                standby: args.standby,
                orphan_grace: args.orphan_grace,
            };
            let b = mesh_mps::MpsBackend::open(mailbox, config)?;
            let pool = b.pool().and_then(|p| p.snapshot()).unwrap_or_default();
            tracing::info!(
                "MPS mode: private daemon with pipe directory {}; pool of {} workers {:?} (limit {} clients: {}); {}",
                b.pipe_dir().map(|p| p.display().to_string()).unwrap_or_default(),
                b.idle_workers().len(),
                b.idle_workers(),
                pool.limit,
                pool.limit_source,
                if args.pool_grow {
                    "--pool-grow: a load past the pool creates a client, stalling the running programs (counted)"
                } else {
                    "a load that finds the pool empty is refused (--pool-grow allows growth)"
                }
            );
            Box::new(b)
        }
    };
    match device.uuid() {
        Ok(uuid) => {
            tracing::info!("device {} ({}), {uuid}", device.name, device.arch());
            let _ = found.set(DeviceId { selector: None, uuid });
        }
        Err(e) => tracing::info!("device {} ({}); its UUID: {e}", device.name, device.arch()),
    }
    Ok(Opened { backend, device: device.name.clone(), arch: Some(device.arch().to_string()) })
}
