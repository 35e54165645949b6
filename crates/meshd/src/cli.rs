//! The command line's types: what clap parses.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "meshd",
    version = meshd::handoff::version_line(),
    about = "Hosts GPU programs as resident kernels that talk through a shared-memory mailbox"
)]
pub struct Cli {
    /// The control socket (default /tmp/meshd.sock; with --device, /tmp/meshd-<GPU UUID>.sock). A
    /// --device flag outranks MESHD_SOCKET from the environment (not a --socket flag).
    #[arg(long, global = true, env = "MESHD_SOCKET")]
    pub socket: Option<PathBuf>,
    /// The GPU: an ordinal as `nvidia-smi -L` numbers them, or its UUID (GPU-…). meshd and all it
    /// starts use that GPU alone, and its default socket, mailbox, MPS directory and state directory
    /// derive from the GPU's UUID; a client given the same --device reaches that meshd.
    #[arg(long, global = true, env = "MESHD_DEVICE", value_name = "N|UUID")]
    pub device: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start the daemon.
    #[command(after_help = "Logs go to stderr at level info; MESHD_LOG sets the filter (e.g. MESHD_LOG=debug, or \
                            MESHD_LOG=meshd=debug,mesh_mps=trace).")]
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
        /// /readyz does not count this program's heartbeat (one that beats rarely by design).
        #[arg(long)]
        no_readiness: bool,
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
    /// Print a program's user words: the 32 words its kernel stores with mesh_user_store (0 where it
    /// stored none), read from its slot now, one `INDEX VALUE` line each (`ps --json` has them too).
    User {
        /// Program name.
        name: String,
        /// A JSON array of the 32 words instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Channels of the mailbox.
    #[command(subcommand)]
    Channel(ChannelCommand),
    /// Services: one program answering requests from many host processes, each its own client.
    #[command(subcommand)]
    Service(ServiceCommand),
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
    /// The daemon's mode, device, mailbox, channels and services (with their attached clients).
    Info,
    /// Prometheus metrics in the text format (what `--metrics-addr` serves at /metrics), e.g. for
    /// node_exporter's textfile collector.
    Metrics,
    /// Stop every program and the daemon.
    Shutdown,
    /// Replace meshd's process with a new build of meshd, keeping its pid: an upgrade of meshd
    /// itself (systemd's `systemctl reload meshd@N`). The new binary is checked first (it must run
    /// and read this state directory and mailbox; else refused, nothing changed). In MPS mode (under
    /// an orphan grace, the default) the programs run on and the new image adopts them; in blink
    /// mode, or MPS with --orphan-grace-ms 0, each program is stopped in order and relaunched by the
    /// new image (one blink). Waits until it answers.
    Handoff {
        /// The new build (default: the file meshd was started from, which a package upgrade replaces).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// How long to wait for the new image to answer, ms.
        #[arg(long, default_value_t = 120_000)]
        timeout_ms: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum ChannelCommand {
    /// Create a channel.
    Create {
        /// Channel name.
        name: String,
        /// Payload bytes per message: protocol ll, a multiple of 8 up to 65536 (the ring takes twice
        /// this per message: each 8-byte word carries 4 payload bytes and a sequence tag); protocol
        /// bulk, a multiple of 16 up to 16777216 (16 MiB; the ring takes this plus an 8-byte flag);
        /// protocol index, a multiple of 8 up to 65536 (the ring takes this alone).
        #[arg(long, default_value_t = 64)]
        msg_size: u32,
        /// Messages the ring holds (a power of two, at most 2^24). Default: 1024 for ll and index; for
        /// bulk, as many as fit in 16 MiB of slots, rounded down to a power of two, 2 to 1024 (2 of
        /// 16 MiB, 16 of 1 MiB, 1024 of 16 KiB).
        #[arg(long)]
        capacity: Option<u32>,
        /// Where the ring's slots live: host (the mailbox: host processes and GPU programs) or device
        /// (GPU memory that meshd owns: between GPU programs only, blink mode).
        #[arg(long, default_value = "host", value_parser = clap::builder::PossibleValuesParser::new(["host", "device"]))]
        placement: String,
        /// The slots' format: ll (a tag in every word: GPU programs use mesh.cuh's mesh_chan_* and warp
        /// calls) or bulk (payload, then one flag per message, for large messages: mesh_bulk_* and
        /// mesh_block_* calls, moved by a whole thread block; host processes use mesh-shm's
        /// BulkProducer/BulkConsumer) or index (the payload alone, the producer's index saying what is
        /// whole, as rtrb: both ends host processes; the fastest host-to-host; GPU programs cannot bind
        /// it, and a load that binds it is refused; host placement only). Default: ll up to 64 KiB,
        /// bulk above.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["ll", "bulk", "index"]))]
        protocol: Option<String>,
        /// Protocol bulk: split every message into this many equal parts (a power of two, 1 to 32;
        /// --msg-size a multiple of 16 × parts), each with its own flag per slot and its own head and
        /// tail, so that up to this many GPU blocks serve each end of the one channel (block p moves
        /// part p: mesh.cuh's mesh_bulk_open_part). Host ends serve every part. 1: one part, moved
        /// whole.
        #[arg(long, default_value_t = 1)]
        parts: u32,
    },
    /// Delete a channel: its ring's memory is reused by the next channel created (a device ring's GPU
    /// memory is freed), and its name can be created again at once, with any size.
    ///
    /// Refused, naming the holder, while a program binds it (unload the program first) or a host
    /// process holds one of its ends (`meshd send`, `meshd recv`, a Producer or Consumer). Refused
    /// while it holds messages, unless --discard. A service's two channels are deleted with the
    /// service (`meshd service delete`).
    #[command(after_help = "Example:\n  meshd unload echo\n  meshd channel delete to-gpu --discard")]
    Delete {
        /// Channel name.
        name: String,
        /// Drop the messages it holds (the output counts them) instead of refusing.
        #[arg(long)]
        discard: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ServiceCommand {
    /// Create a service: one program answering requests from many host processes.
    ///
    /// A service is two channels: NAME, a fan-in channel into which every client sends its
    /// requests (each carrying the client's id), and NAME.replies, a group holding one reply ring
    /// per client. The program binds both, in that order (`meshd load … --bind NAME --bind
    /// NAME.replies`; mesh.cuh's mesh_fanin_peek, mesh_reply_many and mesh_fanin_consume, as
    /// tests/programs/service.cu, or the one-at-a-time mesh_fanin_take_deferred, mesh_reply and
    /// mesh_fanin_commit, which lose no reply at a stop). Clients
    /// attach through the control socket (Rust: meshd::ServiceClient; Python: meshd.Service; C:
    /// mesh_service_connect): each gets a slot of its own until it detaches or its process ends,
    /// kill -9 included.
    #[command(after_help = "Example:\n  meshd service create kv --clients 8 --msg-size 64\n  \
                            meshd load kv-server kv_server.ptx --bind kv --bind kv.replies")]
    Create {
        /// The service's name, at most 40 bytes (its reply group's channel is NAME.replies).
        name: String,
        /// How many clients may be attached at once (client slots, 1 to 65536). A slot a client
        /// left is reused once the serving program has acknowledged the departure. While every slot
        /// is taken, a client that replaces one that died may be refused until meshd has noticed the
        /// death (it watches each client's process, so this is brief): such a client should retry.
        #[arg(long)]
        clients: u32,
        /// Bytes per request: a multiple of 8 from 8 to 65536 (a shorter request is zero-padded).
        #[arg(long)]
        msg_size: u32,
        /// Requests the fan-in ring holds (a power of two). With --shards S each shard is a ring of
        /// its own with this many slots, so the service holds S × this many requests in flight over
        /// all its clients, and the clients of one shard share that shard's slots.
        #[arg(long, default_value_t = 256)]
        capacity: u32,
        /// Bytes per reply: a multiple of 8 from 8 to 65536 (default: --msg-size).
        #[arg(long)]
        reply_size: Option<u32>,
        /// Replies each client's ring holds (a power of two): also each client's window, the requests
        /// it may have unanswered at once (the client APIs refuse a send past it; past it the
        /// program's reply would find the ring full).
        #[arg(long, default_value_t = 16)]
        reply_capacity: u32,
        /// Fan-in shards, for more clients sending in parallel: the request channel becomes this
        /// many rings (a power of two, 1 to 64) of --capacity requests each, every one with its own
        /// cursor, and each client sends into shard (its slot mod shards), so clients contend only
        /// with the clients of their shard (one shared cursor limits how fast many senders go), and a
        /// program can serve the shards with a warp each (tests/programs/service.cu loaded with
        /// --block 256 serves 8; BENCHMARKS.md has the figures). A client's requests stay in order;
        /// across clients of different shards there is no order. 1: one ring. One GPU warp serves at
        /// most 32 shards, so 64 need two serving warps or more. A program, meshd or client built
        /// before shards existed refuses the binding (an unknown protocol).
        #[arg(long, default_value_t = 1)]
        shards: u32,
    },
    /// Send requests to a service as one of its clients, printing each reply (a way to try a
    /// service from the shell).
    ///
    /// Attaches to the service (a client slot, as meshd::ServiceClient does), sends each MESSAGE in
    /// turn and prints its reply on a line of its own (text with trailing zero bytes cut, or hex),
    /// then detaches. A request is zero-padded to the service's request size.
    #[command(
        after_help = "Examples:\n  meshd service request kv hello world\n  meshd service request kv --hex 0000000029000000"
    )]
    Request {
        /// The service's name.
        name: String,
        /// Requests, as text (or hex with --hex), at most the service's request size each.
        #[arg(required = true)]
        messages: Vec<String>,
        /// The requests are hex, and the replies are printed as hex.
        #[arg(long)]
        hex: bool,
        /// Give up on a request's reply after this long, ms (exit code 4).
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
    /// Delete a service: its request channel NAME and its reply group NAME.replies, whose memory is
    /// reused by the next channel or service created; its name can be created again at once.
    ///
    /// Refused, naming the client's process, while a client is attached (it detaches, or exits), and
    /// while a program binds either channel (unload the program first). Refused while requests or
    /// replies are queued, unless --discard.
    #[command(after_help = "Example:\n  meshd unload kv-server\n  meshd service delete kv")]
    Delete {
        /// The service's name.
        name: String,
        /// Drop the requests and replies it holds (the output counts them) instead of refusing.
        #[arg(long)]
        discard: bool,
    },
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// blink (default): one context, loads stop and relaunch every program; mps: one MPS client per program.
    #[arg(long, default_value = "blink", value_parser = clap::builder::PossibleValuesParser::new(["blink", "mps"]))]
    pub isolation: String,
    /// SMs for a green context (blink: all programs; mps: per worker).
    #[arg(long)]
    pub sms: Option<u32>,
    /// MPS pipe and log directories (default /tmp/meshd-mps-<uid>-<hash of the mailbox path>, removed at exit; with --device, /tmp/meshd-mps-<GPU UUID>).
    #[arg(long)]
    pub mps_dir: Option<PathBuf>,
    /// MPS workers started before any program runs. A load or upgrade that finds none idle is
    /// refused (creating an MPS client stalls every running program), unless --pool-grow. After a
    /// restart that adopted running programs, their workers count as the pool's, and the rest is
    /// made while meshd serves.
    #[arg(long, default_value_t = 2)]
    pub pool: u32,
    /// Let a load or upgrade past the pool create an MPS client, and discarded workers be replaced:
    /// every running program then stalls once, counted in info and ps and said in the reply.
    #[arg(long)]
    pub pool_grow: bool,
    /// MPS: idle workers of a standby MPS server, made at start beside the pool, that take the
    /// programs over after a GPU fault, so that the other programs stall for milliseconds rather
    /// than seconds (BENCHMARKS.md has the figures). Default: as many as --pool (one per program
    /// the pool can hold). 0 turns it off, and every GPU fault then stalls every program until the
    /// faulted server has torn its clients down. The pool and the standby together must fit the
    /// device's MPS client limit.
    #[arg(long, value_name = "N")]
    pub standby: Option<u32>,
    /// MPS: how often each worker checks its running kernel's stream, µs (50 to 200000): the trade
    /// between how soon a fault is noticed (this bounds the detection part of a recovery) and each
    /// worker's CPU use (a worker with a running kernel wakes once per check). Default 5000: at most
    /// 5 ms added to a recovery, for a small fraction of a core per worker.
    #[arg(long, value_name = "US", default_value_t = 5000,
          value_parser = clap::value_parser!(u64)
              .range(*mesh_mps::KERNEL_CHECK_RANGE_US.start()..=*mesh_mps::KERNEL_CHECK_RANGE_US.end()))]
    pub mps_kernel_check_us: u64,
    /// MPS: after a crash of meshd, how long each program's worker keeps its kernel running and
    /// waits for a meshd before it stops the program in order and exits, ms; the MPS daemons are
    /// then quit. A meshd started again meanwhile (systemd's restart, `meshd handoff`) adopts the
    /// programs, which never stop; one it cannot adopt is stopped first, naming why, then
    /// relaunched. 0: every worker and the daemons die with meshd. An orderly stop (`meshd
    /// shutdown`, SIGTERM) ends everything whatever this says.
    #[arg(long, value_name = "MS", default_value_t = mesh_mps::DEFAULT_ORPHAN_GRACE.as_millis() as u64)]
    pub orphan_grace_ms: u64,
    /// The mailbox file (default /dev/shm/meshd.mailbox; with --device, /dev/shm/meshd-<GPU UUID>.mailbox).
    #[arg(long)]
    pub shm: Option<PathBuf>,
    /// Mailbox size, bytes (K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub shm_size: u64,
    /// Program slots in the mailbox.
    #[arg(long, default_value_t = 64)]
    pub slots: u32,
    /// Channel descriptors in the mailbox.
    #[arg(long, default_value_t = 256)]
    pub channels: u32,
    /// Start empty: replace the mailbox (its channels and messages are lost) and forget the recorded
    /// programs. Without it, a mailbox no live meshd holds is taken over as it is, and the programs
    /// recorded in the state directory are relaunched. (`--replace-shm` is an old name for it.)
    #[arg(long, alias = "replace-shm")]
    pub fresh: bool,
    /// Where meshd records what it runs (default: /var/lib/meshd/<mailbox path> where writable, else <mailbox>.state).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Leave the mailbox file and the state directory at exit.
    #[arg(long)]
    pub keep_shm: bool,
    /// How long a blink waits for programs to stop, ms (at least 10: a program sees a stop within
    /// about two MESH_STOP_PERIOD_NS, 100 µs each, and a PCIe read).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..))]
    pub stop_timeout_ms: u64,
    /// Services: how long a client may hold its service's request ring, ms, before meshd acts. A
    /// client stopped (SIGSTOP) or descheduled after reserving a request slot and before writing it
    /// is revoked: the program takes a skip from it, and it sends the request again when it runs. One
    /// stopped in the middle of writing a request cannot be revoked while it lives: meshd logs it and
    /// shows it in `ps` and `info` (see --client-stall-kill-ms). 0 turns the watcher off.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub client_stall_ms: u64,
    /// Services: kill (SIGKILL) a client that has held its service's request ring this long, ms,
    /// stopped in the middle of writing a request (what --client-stall-ms cannot revoke); its death
    /// turns the request into a skip and frees the ring. Off unless given; needs --client-stall-ms
    /// above 0.
    #[arg(long, value_name = "MS")]
    pub client_stall_kill_ms: Option<u64>,
    #[command(flatten)]
    pub monitor: meshd::http::MonitorArgs,
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
