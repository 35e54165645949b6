//! meshd's command line: `meshd run` starts the daemon; every other subcommand is a client of its control socket.
//!
//! Exit codes a script can rely on: 0 done; 1 refused (meshd's reason on stderr); 2 bad usage;
//! 3 meshd not reachable; 4 a send or receive timed out.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::{Args, Parser, Subcommand};
use mesh_backend::{IsolationMode, LaunchShape, cleanup};
use mesh_shm::{Consumer, Mailbox, MailboxConfig, Producer, ShmError};
use meshd::protocol::{Request, Response, read_response, write_request};
use meshd::server::{Limits, Opened, Server};
use meshd::start::{self, Origin};
use meshd::state::{self, StateStore};

#[derive(Parser, Debug)]
#[command(
    name = "meshd",
    version,
    about = "Hosts GPU programs as resident kernels that talk through a shared-memory mailbox"
)]
struct Cli {
    /// The control socket (default /tmp/meshd.sock; with --device, /tmp/meshd-<GPU UUID>.sock).
    #[arg(long, global = true, env = "MESHD_SOCKET")]
    socket: Option<PathBuf>,
    /// The GPU: an ordinal as `nvidia-smi -L` numbers them, or its UUID (GPU-…). meshd and all it
    /// starts use that GPU alone, and its default socket, mailbox, MPS directory and state directory
    /// derive from the GPU's UUID; a client given the same --device reaches that meshd.
    #[arg(long, global = true, env = "MESHD_DEVICE", value_name = "N|UUID")]
    device: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the daemon.
    Run(RunArgs),
    /// Load a program: IMAGE is PTX, cubin, fatbin or LTO-IR whose mesh_main runs resident.
    Load {
        /// Unique program name.
        name: String,
        /// The image file.
        image: PathBuf,
        /// Grid dimensions, `X[,Y[,Z]]`.
        #[arg(long, default_value = "1", value_parser = parse_dim3)]
        grid: [u32; 3],
        /// Block dimensions, `X[,Y[,Z]]`.
        #[arg(long, default_value = "32", value_parser = parse_dim3)]
        block: [u32; 3],
        /// Dynamic shared memory per block, bytes.
        #[arg(long, default_value_t = 0)]
        shared_mem: u32,
        /// A channel to bind (repeat: binding 0, 1, …).
        #[arg(long = "bind")]
        bind: Vec<String>,
        /// SMs for this program (MPS mode).
        #[arg(long)]
        sms: Option<u32>,
    },
    /// Replace a program's image; its slot, channels and messages are kept.
    Upgrade {
        /// Program name.
        name: String,
        /// The new image.
        image: PathBuf,
    },
    /// Stop a program and free its slot.
    Unload {
        /// Program name.
        name: String,
    },
    /// List the programs.
    Ps {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Channels of the mailbox.
    #[command(subcommand)]
    Channel(ChannelCommand),
    /// Send messages on a channel (claims its producer end for the duration).
    Send {
        /// Channel name.
        channel: String,
        /// Messages, as text (zero-padded to the channel's message size).
        #[arg(required = true)]
        messages: Vec<String>,
        /// The messages are hex.
        #[arg(long)]
        hex: bool,
        /// Give up after this long, ms.
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
    /// Receive messages from a channel (claims its consumer end for the duration).
    Recv {
        /// Channel name.
        channel: String,
        /// Messages to wait for.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Print hex instead of text.
        #[arg(long)]
        hex: bool,
        /// Give up after this long, ms.
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
    /// Start a native GPU worker: CMD runs as meshd's child with the mailbox and its channels in its
    /// environment (MESH_MAILBOX, MESH_CHANNELS, MESH_READY_FD, MESH_NATIVE_NAME, MESH_ISOLATION, and in
    /// MPS mode CUDA_MPS_PIPE_DIRECTORY) and must write "ready\n" to the descriptor MESH_READY_FD names.
    Spawn {
        /// Its name in `ps`.
        name: String,
        /// A channel to tell it about (repeat: MESH_CHANNELS lists them in this order).
        #[arg(long = "bind")]
        bind: Vec<String>,
        /// Seconds it may take to report ready before it is killed and refused.
        #[arg(long, default_value_t = 30.0)]
        ready_timeout: f64,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// End a native GPU worker: SIGTERM, then SIGKILL after a grace period of 5 s.
    Stop {
        /// Its name.
        name: String,
    },
    /// The daemon's mode, device, mailbox and channels.
    Info,
    /// Stop every program and the daemon.
    Shutdown,
}

#[derive(Subcommand, Debug)]
enum ChannelCommand {
    /// Create a channel.
    Create {
        /// Channel name.
        name: String,
        /// Payload bytes per message (a multiple of 8, at most 65536). The ring takes twice this per
        /// message: each 8-byte word carries 4 payload bytes and a sequence tag.
        #[arg(long, default_value_t = 64)]
        msg_size: u32,
        /// Messages the ring holds (a power of two, at most 2^24).
        #[arg(long, default_value_t = 1024)]
        capacity: u32,
        /// Where the ring's slots live: host (the mailbox: host processes and GPU programs) or device
        /// (GPU memory that meshd owns: between GPU programs only, blink mode).
        #[arg(long, default_value = "host", value_parser = clap::builder::PossibleValuesParser::new(["host", "device"]))]
        placement: String,
    },
}

#[derive(Args, Debug)]
struct RunArgs {
    /// blink (default): one context, loads stop and relaunch every program; mps: one MPS client per program.
    #[arg(long, default_value = "blink", value_parser = clap::builder::PossibleValuesParser::new(["blink", "mps"]))]
    isolation: String,
    /// SMs for a green context (blink: all programs; mps: per worker).
    #[arg(long)]
    sms: Option<u32>,
    /// MPS pipe and log directories (default /tmp/meshd-mps.PID, removed at exit; with --device, /tmp/meshd-mps-<GPU UUID>).
    #[arg(long)]
    mps_dir: Option<PathBuf>,
    /// MPS workers started before any program runs. A load or upgrade that finds none idle is
    /// refused (creating an MPS client stalls every running program), unless --pool-grow.
    #[arg(long, default_value_t = 2)]
    pool: u32,
    /// Let a load or upgrade past the pool create an MPS client, and discarded workers be replaced:
    /// every running program then stalls once, counted in info and ps and said in the reply.
    #[arg(long)]
    pool_grow: bool,
    /// The mailbox file (default /dev/shm/meshd.mailbox; with --device, /dev/shm/meshd-<GPU UUID>.mailbox).
    #[arg(long)]
    shm: Option<PathBuf>,
    /// Mailbox size, bytes (K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    shm_size: u64,
    /// Program slots in the mailbox.
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Channel descriptors in the mailbox.
    #[arg(long, default_value_t = 256)]
    channels: u32,
    /// Start empty: replace the mailbox (its channels and messages are lost) and forget the recorded
    /// programs. Without it, a mailbox no live meshd holds is taken over as it is, and the programs
    /// recorded in the state directory are relaunched. (`--replace-shm` is an old name for it.)
    #[arg(long, alias = "replace-shm")]
    fresh: bool,
    /// Where meshd records what it runs (default: /var/lib/meshd/<mailbox path> where writable, else <mailbox>.state).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Leave the mailbox file and the state directory at exit.
    #[arg(long)]
    keep_shm: bool,
    /// How long a blink waits for programs to stop, ms.
    #[arg(long, default_value_t = 2000)]
    stop_timeout_ms: u64,
}

fn parse_dim3(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(format!("{s:?}: expected X, X,Y or X,Y,Z"));
    }
    let mut out = [1u32; 3];
    for (o, p) in out.iter_mut().zip(&parts) {
        *o = p.trim().parse().map_err(|_| format!("{s:?}: {p:?} is not a number"))?;
    }
    Ok(out)
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?}: expected a size such as 64M"))
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
struct Exit(u8, anyhow::Error);

fn refused(e: impl Into<anyhow::Error>) -> Exit {
    Exit(1, e.into())
}

fn main() -> ExitCode {
    meshd::replace::mark_process_start();
    let cli = Cli::parse();
    // SAFETY: nothing but this thread runs yet (clap spawns none), and the driver is not loaded.
    unsafe { start::select_device_env(cli.device.as_deref()) };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MESHD_LOG").unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Exit(code, e)) => {
            eprintln!("meshd: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// A client's socket: --socket or MESHD_SOCKET; else, with --device, the GPU's (a whole UUID names
/// it without the driver; an ordinal or a prefix is looked up: cuInit, cuDeviceGet, cuDeviceGetUuid,
/// no context); else /tmp/meshd.sock.
fn client_socket(socket: Option<PathBuf>, device: Option<&str>) -> Result<PathBuf, Exit> {
    if let Some(s) = socket {
        return Ok(s);
    }
    let uuid = match device {
        None => None,
        Some(d) => Some(match start::whole_uuid(d) {
            Some(u) => u,
            None => start::lookup_uuid(d).map_err(|e| {
                Exit(2, anyhow!("{e:#}; or give --socket, MESHD_SOCKET or the GPU's whole UUID (GPU-…)"))
            })?,
        }),
    };
    Ok(start::default_paths(uuid.as_deref()).socket)
}

fn dispatch(cli: Cli) -> Result<(), Exit> {
    if let Command::Run(args) = cli.command {
        return run(args, cli.socket, cli.device).map_err(refused);
    }
    let socket = client_socket(cli.socket, cli.device.as_deref())?;
    match cli.command {
        Command::Run(_) => unreachable!("handled above"),
        Command::Load { name, image, grid, block, shared_mem, bind, sms } => {
            load(&socket, name, &image, LaunchShape { grid, block, shared_mem }, bind, sms)
        }
        Command::Upgrade { name, image } => upgrade(&socket, name, &image),
        Command::Unload { name } => unload(&socket, &name),
        Command::Ps { json } => ps(&socket, json),
        Command::Channel(ChannelCommand::Create { name, msg_size, capacity, placement }) => {
            channel_create(&socket, &name, msg_size, capacity, placement)
        }
        Command::Send { channel, messages, hex, timeout_ms } => send(&socket, &channel, &messages, hex, timeout_ms),
        Command::Recv { channel, count, hex, timeout_ms } => recv(&socket, &channel, count, hex, timeout_ms),
        Command::Spawn { name, bind, ready_timeout, command } => spawn(&socket, name, bind, ready_timeout, command),
        Command::Stop { name } => stop(&socket, &name),
        Command::Info => info(&socket),
        Command::Shutdown => {
            call(&socket, &Request::Shutdown, &[])?;
            println!("meshd is shutting down");
            Ok(())
        }
    }
}

/// ` (backend 0.125 ms)` when meshd said how long its backend took.
fn backend_time(resp: &Response) -> String {
    resp.backend_us.map_or_else(String::new, |us| format!(" (backend {:.3} ms)", us as f64 / 1000.0))
}

fn load(
    socket: &Path,
    name: String,
    image: &Path,
    shape: LaunchShape,
    bind: Vec<String>,
    sms: Option<u32>,
) -> Result<(), Exit> {
    let bytes = read_image(image)?;
    let LaunchShape { grid, block, shared_mem } = shape;
    let req = Request::Load { name, image_len: bytes.len(), grid, block, shared_mem, bind, sms };
    let since = unix_ms();
    let resp = call(socket, &req, &bytes)?;
    for p in resp.programs.as_deref().unwrap_or_default() {
        let took = backend_time(&resp);
        println!("loaded {} (slot {}, generation {}, {}){took}", p.name, p.slot, p.generation, p.state);
        print_stalls(socket, &p.name, since);
    }
    Ok(())
}

fn upgrade(socket: &Path, name: String, image: &Path) -> Result<(), Exit> {
    let bytes = read_image(image)?;
    let since = unix_ms();
    let resp = call(socket, &Request::Upgrade { name, image_len: bytes.len() }, &bytes)?;
    for p in resp.programs.as_deref().unwrap_or_default() {
        let took = backend_time(&resp);
        println!("upgraded {} (slot {}, generation {}, {}){took}", p.name, p.slot, p.generation, p.state);
        print_stalls(socket, &p.name, since);
    }
    Ok(())
}

fn unload(socket: &Path, name: &str) -> Result<(), Exit> {
    let since = unix_ms();
    let resp = call(socket, &Request::Unload { name: name.to_string() }, &[])?;
    println!("unloaded {name}{}", backend_time(&resp));
    print_stalls(socket, name, since);
    Ok(())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// MPS mode: the client creations this request of `program` caused (the pool was empty and
/// --pool-grow let meshd create one), each of which stalled every running program. Read from `info`,
/// which records every such creation with its program and time.
fn print_stalls(socket: &Path, program: &str, since_ms: u64) {
    let Ok(Some(info)) = call(socket, &Request::Info, &[]).map(|r| r.info) else { return };
    let Some(pool) = info.extra.pool else { return };
    for g in pool.recent.iter().filter(|g| g.program == program && g.unix_ms >= since_ms) {
        let why = if g.op == "refill" {
            "a discarded worker was replaced to keep --pool (--pool-grow): meshd created an MPS client".to_string()
        } else {
            format!("the MPS pool had no idle worker: meshd created an MPS client for this {} (--pool-grow)", g.op)
        };
        println!(
            "note: {why}, which stalled {} running program(s) (stall #{} of {} since start)",
            g.stalled, g.seq, pool.stalls
        );
    }
}

/// `ps`'s last line in MPS mode: the pool, and how often it grew while programs ran.
fn print_pool(pool: &meshd::protocol::PoolRow) {
    println!(
        "MPS pool: {} idle, {} in use (--pool {}; limit {} clients: {}); growth {}; {} MPS client creation(s) stalled \
         the running programs since start",
        pool.idle,
        pool.in_use,
        pool.size,
        pool.client_limit,
        pool.client_limit_source,
        if pool.grow { "allowed (--pool-grow)" } else { "refused (no --pool-grow)" },
        pool.stalls
    );
}

fn ps(socket: &Path, json: bool) -> Result<(), Exit> {
    let resp = call(socket, &Request::Ps, &[])?;
    let natives = resp.natives.clone().unwrap_or_default();
    let rows = resp.programs.unwrap_or_default();
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).map_err(refused)?);
        return Ok(());
    }
    println!(
        "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {:<10} {:<10} {:>8} NOTE",
        "NAME", "SLOT", "STATE", "GEN", "HEARTBEAT", "SMS", "WORKER", "KIND", "GRID", "BLOCK", "RESTARTS"
    );
    let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    for p in rows {
        println!(
            "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {:<10} {:<10} {:>8} {}",
            p.name,
            if p.slot == meshd::server::HELD_SLOT { "-".to_string() } else { p.slot.to_string() },
            p.state,
            p.generation,
            p.heartbeat,
            opt(p.sms),
            opt(p.worker_pid),
            p.kind,
            dims(p.grid),
            dims(p.block),
            p.restarts,
            ps_note(&p)
        );
    }
    print_natives(&natives);
    if let Ok(Some(pool)) = call(socket, &Request::Info, &[]).map(|r| r.info.and_then(|i| i.extra.pool)) {
        print_pool(&pool);
    }
    Ok(())
}

/// `ps`'s last column: why a program is stopped, else its last fault and when (seconds ago).
fn ps_note(p: &meshd::protocol::ProgramRow) -> String {
    if let Some(why) = &p.stopped_why {
        return why.clone();
    }
    match (&p.last_fault, p.last_fault_unix_ms) {
        (Some(f), Some(at)) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
            format!("last fault {:.1} s ago: {f}", now.saturating_sub(u128::from(at)) as f64 / 1000.0)
        }
        (Some(f), None) => format!("last fault: {f}"),
        _ => "-".into(),
    }
}

fn channel_create(socket: &Path, name: &str, msg_size: u32, capacity: u32, placement: String) -> Result<(), Exit> {
    let req = Request::ChannelCreate { name: name.to_string(), msg_size, capacity, placement: placement.clone() };
    call(socket, &req, &[])?;
    println!("created channel {name} ({capacity} messages of {msg_size} bytes, in {placement} memory)");
    Ok(())
}

fn send(socket: &Path, channel: &str, messages: &[String], hex: bool, timeout_ms: u64) -> Result<(), Exit> {
    let mailbox = open_mailbox(socket)?;
    let mut tx = Producer::claim(&mailbox, channel).map_err(refused)?;
    for m in messages {
        let bytes = if hex { decode_hex(m).map_err(refused)? } else { m.as_bytes().to_vec() };
        tx.send(&bytes, Duration::from_millis(timeout_ms)).map_err(shm_exit)?;
    }
    Ok(())
}

fn recv(socket: &Path, channel: &str, count: usize, hex: bool, timeout_ms: u64) -> Result<(), Exit> {
    let mailbox = open_mailbox(socket)?;
    let mut rx = Consumer::claim(&mailbox, channel).map_err(refused)?;
    let mut buf = vec![0u8; rx.info().msg_size as usize];
    let stdout = std::io::stdout();
    for _ in 0..count {
        rx.recv(&mut buf, Duration::from_millis(timeout_ms)).map_err(shm_exit)?;
        let line = if hex {
            hex::encode(&buf)
        } else {
            let end = buf.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            String::from_utf8_lossy(&buf[..end]).into_owned()
        };
        writeln!(stdout.lock(), "{line}").map_err(refused)?;
    }
    Ok(())
}

fn info(socket: &Path) -> Result<(), Exit> {
    let info = call(socket, &Request::Info, &[])?.info.ok_or_else(|| refused(anyhow!("meshd sent no info")))?;
    println!("{}", serde_json::to_string_pretty(&info).map_err(refused)?);
    Ok(())
}

fn shm_exit(e: ShmError) -> Exit {
    match e {
        ShmError::Timeout { .. } => Exit(4, e.into()),
        e => refused(e),
    }
}

fn decode_hex(s: &str) -> Result<Vec<u8>> {
    hex::decode(s).map_err(|e| anyhow!("{s:?} is not an even number of hex digits ({e})"))
}

fn read_image(path: &Path) -> Result<Vec<u8>, Exit> {
    std::fs::read(path).with_context(|| format!("image {}", path.display())).map_err(refused)
}

/// One request to the daemon; a refusal becomes exit 1, an unreachable daemon exit 3.
fn call(socket: &Path, req: &Request, image: &[u8]) -> Result<Response, Exit> {
    let conn = UnixStream::connect(socket)
        .with_context(|| format!("cannot reach meshd at {} (is `meshd run` running?)", socket.display()))
        .map_err(|e| Exit(3, e))?;
    let mut writer = conn.try_clone().map_err(|e| Exit(3, e.into()))?;
    // meshd may refuse before reading everything (a peer it does not serve, a line too long) and
    // close: then the write fails, but its answer is there to read, and it says why.
    let written = write_request(&mut writer, req, image);
    let resp = match (read_response(&mut BufReader::new(conn)), written) {
        (Ok(resp), _) => resp,
        (Err(_), Err(e)) | (Err(e), Ok(())) => return Err(Exit(3, e)),
    };
    if !resp.ok {
        return Err(refused(anyhow!(resp.error.unwrap_or_else(|| "refused".into()))));
    }
    Ok(resp)
}

fn open_mailbox(socket: &Path) -> Result<Mailbox, Exit> {
    let info = call(socket, &Request::Info, &[])?.info.ok_or_else(|| refused(anyhow!("meshd sent no info")))?;
    Mailbox::open(&info.mailbox).map_err(refused)
}

/// `meshd run`: the mailbox and its lock first (refusal and takeover happen before any GPU work),
/// then the backend on its own thread, then the socket; serves until shutdown or a signal.
fn run(mut args: RunArgs, socket: Option<PathBuf>, device: Option<String>) -> Result<()> {
    let mode: IsolationMode = args.isolation.parse()?;
    let _cleanup = cleanup::RunOnDrop;
    // With --device the paths derive from the GPU's UUID, so the driver is asked first (no context).
    let uuid = device.as_deref().map(start::lookup_uuid).transpose()?;
    if let Some(u) = &uuid {
        start::set_device(start::DeviceId { selector: device.clone(), uuid: u.clone() });
    }
    let defaults = start::default_paths(uuid.as_deref());
    let derived_mps_dir = args.shm.is_none() && args.mps_dir.is_none() && defaults.mps_dir.is_some();
    let socket = socket.unwrap_or(defaults.socket);
    let socket = socket.as_path();
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
    start::check_socket_free(socket)?;
    let config = MailboxConfig { size: args.shm_size, slots: args.slots, channels: args.channels };
    let claimed = start::claim_mailbox(&shm, &config, args.fresh)?;
    let (mailbox, origin) = (claimed.mailbox, claimed.origin);
    let lock = claimed.lock;
    if derived_mps_dir && mode == IsolationMode::Mps {
        // Ours alone while we hold this GPU's mailbox lock: what is there a dead meshd left (a stale
        // control pipe would pass for a live daemon).
        if let Some(dir) = args.mps_dir.as_ref().filter(|d| d.exists()) {
            tracing::info!("removing {} left by a previous meshd of this GPU", dir.display());
            if let Err(e) = std::fs::remove_dir_all(dir) {
                tracing::warn!("removing the stale MPS directory {}: {e}", dir.display());
            }
        }
    }
    // Registered first, so it runs last: the mailbox and state are gone before another meshd can lock.
    cleanup::register("mailbox lock", move || lock.remove());
    let state_dir = args.state_dir.clone().unwrap_or_else(|| state::default_dir(&shm));
    if args.fresh {
        StateStore::forget(&state_dir)?;
    }
    report_origin(&origin, &mailbox, &config);
    let created = origin == Origin::Created;
    let prepared = (|| {
        let mut store = StateStore::open(&state_dir)?;
        let restored = store.restore_channels(&mailbox)?;
        if restored > 0 {
            tracing::info!("{restored} recorded channels recreated in the new mailbox");
        }
        store.record_channels(&mailbox)?;
        let backend_args = BackendArgs::from(&args);
        let server = Server::start(mailbox.clone(), Limits::default(), Some(store), move |mb| {
            open_backend(mode, &backend_args, mb)
        })?;
        let listener = start::bind_socket(socket)?;
        Ok::<_, anyhow::Error>((server, listener))
    })();
    let (server, listener) = match prepared {
        Ok(p) => p,
        Err(e) => {
            // A mailbox made just now holds nothing: leave nothing behind. One taken over holds
            // channels and messages: keep it, and its state, for the next start.
            if created {
                let _ = std::fs::remove_file(&shm);
                if StateStore::open(&state_dir).is_ok_and(|s| s.recorded().programs.is_empty()) {
                    let _ = StateStore::forget(&state_dir);
                }
            }
            return Err(e);
        }
    };
    // A clean exit tears the mesh down: the recorded state goes with the mailbox (both kept with --keep-shm).
    if !args.keep_shm {
        let dir = state_dir.clone();
        cleanup::register("state directory", move || {
            let _ = StateStore::forget(&dir);
        });
    }
    start::remove_at_exit("mailbox", shm.clone(), args.keep_shm);
    start::remove_at_exit("control socket", socket.to_path_buf(), false);
    server.stop_on_signals(&[signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
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
    if !server.run(listener)? {
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
            if let Ok(want) = mesh_shm::Geometry::plan(asked) {
                if (want.file_size, want.slot_count, want.channel_count) != (g.file_size, g.slot_count, g.channel_count)
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
}

/// What the backend thread needs from the command line.
#[derive(Debug, Clone)]
struct BackendArgs {
    sms: Option<u32>,
    mps_dir: Option<PathBuf>,
    pool: u32,
    pool_grow: bool,
    stop_deadline: Duration,
}

impl From<&RunArgs> for BackendArgs {
    fn from(a: &RunArgs) -> Self {
        Self {
            sms: a.sms,
            mps_dir: a.mps_dir.clone(),
            pool: a.pool,
            pool_grow: a.pool_grow,
            stop_deadline: Duration::from_millis(a.stop_timeout_ms),
        }
    }
}

/// Opens the chosen backend; runs on the backend thread, which owns it until meshd ends.
/// No fallback between the modes: whatever the chosen one lacks is an error.
fn open_backend(mode: IsolationMode, args: &BackendArgs, mailbox: &Mailbox) -> Result<Opened> {
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
            };
            let b = mesh_mps::MpsBackend::open(mailbox, config)?;
            let pool = mesh_mps::pool::snapshot().unwrap_or_default();
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
            start::set_device(start::DeviceId { selector: None, uuid });
        }
        Err(e) => tracing::info!("device {} ({}); its UUID: {e}", device.name, device.arch()),
    }
    Ok(Opened { backend, device: device.name.clone(), arch: Some(device.arch().to_string()) })
}

// ---- Native GPU workers: `spawn`, `stop`, and their rows in `ps` ----

fn spawn(socket: &Path, name: String, bind: Vec<String>, ready_timeout: f64, command: Vec<String>) -> Result<(), Exit> {
    if !(ready_timeout.is_finite() && ready_timeout > 0.0) {
        return Err(Exit(2, anyhow!("--ready-timeout {ready_timeout}: expected a positive number of seconds")));
    }
    let ready_timeout_ms = (ready_timeout * 1000.0).ceil() as u64;
    let resp = call(socket, &Request::Spawn { name, bind, command, ready_timeout_ms }, &[])?;
    for n in resp.natives.as_deref().unwrap_or_default() {
        println!("spawned {} (pid {}, {} mode, channels [{}]): ready", n.name, n.pid, n.isolation, n.bind.join(", "));
        if n.isolation == "blink" {
            println!("note: {}", meshd::native::BLINK_NOTE);
        }
    }
    Ok(())
}

fn stop(socket: &Path, name: &str) -> Result<(), Exit> {
    let resp = call(socket, &Request::Stop { name: name.to_string() }, &[])?;
    for n in resp.natives.as_deref().unwrap_or_default() {
        println!("stopped {} (pid {}): {}", n.name, n.pid, n.state);
    }
    Ok(())
}

/// Native workers under `ps`'s programs, in the same columns (KIND `native`, WORKER its pid), then the command.
fn print_natives(natives: &[meshd::native::NativeRow]) {
    for n in natives {
        println!(
            "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {}",
            n.name, "-", n.state, "-", "-", "-", n.pid, "native", n.command
        );
    }
}
