//! meshd's command line: `meshd run` starts the daemon; every other subcommand is a client of its control socket.
//!
//! Exit codes a script can rely on: 0 done; 1 refused (meshd's reason on stderr); 2 bad usage;
//! 3 meshd not reachable; 4 a send or receive timed out.

mod daemon;
mod protocol;

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use mesh_backend::{IsolationMode, cleanup};
use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Producer, ShmError};

use crate::protocol::{Request, Response, read_response, write_request};

#[derive(Parser, Debug)]
#[command(
    name = "meshd",
    version,
    about = "Hosts GPU programs as resident kernels that talk through a shared-memory mailbox"
)]
struct Cli {
    /// The control socket.
    #[arg(long, global = true, env = "MESHD_SOCKET", default_value = "/tmp/meshd.sock")]
    socket: PathBuf,
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
        /// Bytes per message (a multiple of 8).
        #[arg(long, default_value_t = 64)]
        msg_size: u32,
        /// Messages the ring holds (a power of two).
        #[arg(long, default_value_t = 1024)]
        capacity: u32,
    },
}

#[derive(Args, Debug)]
struct RunArgs {
    /// blink (default): one context, loads stop and relaunch every program; mps: one MPS client per program.
    #[arg(long, default_value = "blink")]
    isolation: String,
    /// SMs for a green context (blink: all programs; mps: per worker).
    #[arg(long)]
    sms: Option<u32>,
    /// MPS pipe and log directories (default /tmp/meshd-mps.PID).
    #[arg(long)]
    mps_dir: Option<PathBuf>,
    /// MPS workers started before any program runs.
    #[arg(long, default_value_t = 2)]
    pool: u32,
    /// The mailbox file.
    #[arg(long, default_value = "/dev/shm/meshd.mailbox")]
    shm: PathBuf,
    /// Mailbox size, bytes (K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    shm_size: u64,
    /// Program slots in the mailbox.
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Channel descriptors in the mailbox.
    #[arg(long, default_value_t = 256)]
    channels: u32,
    /// Overwrite an existing mailbox file (left by a meshd that was killed).
    #[arg(long)]
    replace_shm: bool,
    /// Leave the mailbox file at exit.
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
    let cli = Cli::parse();
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

fn dispatch(cli: Cli) -> Result<(), Exit> {
    let socket = cli.socket;
    match cli.command {
        Command::Run(args) => run(args, &socket).map_err(refused),
        Command::Load { name, image, grid, block, shared_mem, bind, sms } => {
            let bytes = read_image(&image)?;
            let req = Request::Load { name, image_len: bytes.len(), grid, block, shared_mem, bind, sms };
            let resp = call(&socket, &req, &bytes)?;
            for p in resp.programs.unwrap_or_default() {
                println!("loaded {} (slot {}, generation {}, {})", p.name, p.slot, p.generation, p.state);
            }
            Ok(())
        }
        Command::Upgrade { name, image } => {
            let bytes = read_image(&image)?;
            let resp = call(&socket, &Request::Upgrade { name, image_len: bytes.len() }, &bytes)?;
            for p in resp.programs.unwrap_or_default() {
                println!("upgraded {} (slot {}, generation {}, {})", p.name, p.slot, p.generation, p.state);
            }
            Ok(())
        }
        Command::Unload { name } => {
            call(&socket, &Request::Unload { name: name.clone() }, &[])?;
            println!("unloaded {name}");
            Ok(())
        }
        Command::Ps { json } => {
            let rows = call(&socket, &Request::Ps, &[])?.programs.unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&rows).map_err(refused)?);
            } else {
                println!(
                    "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {:<10} {:<10}",
                    "NAME", "SLOT", "STATE", "GEN", "HEARTBEAT", "SMS", "WORKER", "KIND", "GRID", "BLOCK"
                );
                for p in rows {
                    let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
                    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
                    println!(
                        "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {:<10} {:<10}",
                        p.name,
                        p.slot,
                        p.state,
                        p.generation,
                        p.heartbeat,
                        opt(p.sms),
                        opt(p.worker_pid),
                        p.kind,
                        dims(p.grid),
                        dims(p.block)
                    );
                }
            }
            Ok(())
        }
        Command::Channel(ChannelCommand::Create { name, msg_size, capacity }) => {
            call(&socket, &Request::ChannelCreate { name: name.clone(), msg_size, capacity }, &[])?;
            println!("created channel {name} ({capacity} messages of {msg_size} bytes)");
            Ok(())
        }
        Command::Send { channel, messages, hex, timeout_ms } => {
            let mailbox = open_mailbox(&socket)?;
            let mut tx = Producer::claim(&mailbox, &channel).map_err(refused)?;
            for m in &messages {
                let bytes = if hex { decode_hex(m).map_err(refused)? } else { m.as_bytes().to_vec() };
                tx.send(&bytes, Duration::from_millis(timeout_ms)).map_err(shm_exit)?;
            }
            Ok(())
        }
        Command::Recv { channel, count, hex, timeout_ms } => {
            let mailbox = open_mailbox(&socket)?;
            let mut rx = Consumer::claim(&mailbox, &channel).map_err(refused)?;
            let mut buf = vec![0u8; rx.info().msg_size as usize];
            let stdout = std::io::stdout();
            for _ in 0..count {
                rx.recv(&mut buf, Duration::from_millis(timeout_ms)).map_err(shm_exit)?;
                let line = if hex {
                    buf.iter().map(|b| format!("{b:02x}")).collect::<String>()
                } else {
                    let end = buf.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                    String::from_utf8_lossy(&buf[..end]).into_owned()
                };
                writeln!(stdout.lock(), "{line}").map_err(refused)?;
            }
            Ok(())
        }
        Command::Info => {
            let info =
                call(&socket, &Request::Info, &[])?.info.ok_or_else(|| refused(anyhow!("meshd sent no info")))?;
            println!("{}", serde_json::to_string_pretty(&info).map_err(refused)?);
            Ok(())
        }
        Command::Shutdown => {
            call(&socket, &Request::Shutdown, &[])?;
            println!("meshd is shutting down");
            Ok(())
        }
    }
}

fn shm_exit(e: ShmError) -> Exit {
    match e {
        ShmError::Timeout { .. } => Exit(4, e.into()),
        e => refused(e),
    }
}

fn decode_hex(s: &str) -> Result<Vec<u8>> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("{s:?} is not an even number of hex digits");
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(Into::into)).collect()
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
    write_request(&mut writer, req, image).map_err(|e| Exit(3, e))?;
    let resp = read_response(&mut BufReader::new(conn)).map_err(|e| Exit(3, e))?;
    if !resp.ok {
        return Err(refused(anyhow!(resp.error.unwrap_or_else(|| "refused".into()))));
    }
    Ok(resp)
}

fn open_mailbox(socket: &Path) -> Result<Mailbox, Exit> {
    let info = call(socket, &Request::Info, &[])?.info.ok_or_else(|| refused(anyhow!("meshd sent no info")))?;
    Mailbox::open(&info.mailbox).map_err(refused)
}

fn run(args: RunArgs, socket: &Path) -> Result<()> {
    let mode: IsolationMode = args.isolation.parse()?;
    // Fail at once, before creating anything, when there is no driver or GPU.
    let device = mesh_cuda::Device::get(0)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let _cleanup = cleanup::RunOnDrop;
    let config = MailboxConfig { size: args.shm_size, slots: args.slots, channels: args.channels };
    let create = if args.replace_shm { CreateMode::Replace } else { CreateMode::Exclusive };
    let listener = daemon::bind_socket(socket)?;
    daemon::remove_at_exit("control socket", socket.to_path_buf(), false);
    let mailbox = Mailbox::create(&args.shm, &config, create)?;
    daemon::remove_at_exit("mailbox", args.shm.clone(), args.keep_shm);
    let stop_deadline = Duration::from_millis(args.stop_timeout_ms);
    // No fallback between the modes: whatever the chosen one lacks is an error.
    let backend: Box<dyn mesh_backend::Backend> = match mode {
        IsolationMode::Blink => {
            let b = mesh_cuda::BlinkBackend::open(&mailbox, mesh_cuda::BlinkConfig { sms: args.sms, stop_deadline })?;
            tracing::info!(
                "blink mode: one context of {} SMs{}",
                b.context().sms(),
                if b.context().is_green() { " (green)" } else { "" }
            );
            Box::new(b)
        }
        IsolationMode::Mps => {
            let config =
                mesh_mps::MpsConfig { sms: args.sms, mps_dir: args.mps_dir.clone(), pool: args.pool, stop_deadline };
            let b = mesh_mps::MpsBackend::open(&mailbox, config)?;
            tracing::info!(
                "MPS mode: private daemon with pipe directory {}, {} pool workers {:?}",
                b.pipe_dir().map(|p| p.display().to_string()).unwrap_or_default(),
                b.idle_workers().len(),
                b.idle_workers()
            );
            Box::new(b)
        }
    };
    tracing::info!(
        "ready: {mode} mode on {} ({}), mailbox {}, socket {}",
        device.name,
        device.arch(),
        args.shm.display(),
        socket.display()
    );
    let mut d = daemon::Daemon { backend, mailbox, device: device.name.clone() };
    if !d.serve(&listener, &stop)? {
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
