//! The control socket's protocol: one JSON request line (plus the image's raw bytes for load and upgrade),
//! one JSON response line.

use std::io::{BufRead, Read, Write};

use anyhow::{Context, Result, bail};
use mesh_backend::ProgramStatus;
use serde::{Deserialize, Serialize};

/// Largest image a client may send.
pub const MAX_IMAGE: usize = 256 << 20;

/// Longest request line, newline excluded: a request is a few names and numbers, so anything
/// longer is refused before it is read into memory.
pub const MAX_LINE: usize = 64 << 10;

/// A client's request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Load a program; `image_len` raw bytes follow the line.
    Load {
        /// Unique among loaded programs; `upgrade`, `unload` and `ps` name it by this.
        name: String,
        /// Raw image bytes that follow the line (at most [`MAX_IMAGE`]).
        image_len: usize,
        /// `mesh_main`'s grid, in blocks (x, y, z).
        grid: [u32; 3],
        /// `mesh_main`'s block, in threads (x, y, z).
        block: [u32; 3],
        /// Dynamic shared memory per block.
        shared_mem: u32,
        /// Channels, binding 0, 1, …
        bind: Vec<String>,
        /// SMs (MPS mode).
        sms: Option<u32>,
        /// `/readyz` does not count this program's heartbeat (one that beats rarely by design).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_readiness: bool,
    },
    /// Replace a program's image; `image_len` raw bytes follow.
    Upgrade {
        /// A loaded program's name.
        name: String,
        /// Raw image bytes that follow the line (at most [`MAX_IMAGE`]).
        image_len: usize,
    },
    /// Stop a program and free its slot.
    Unload {
        /// A loaded program's name.
        name: String,
    },
    /// Every program's status.
    Ps,
    /// Create a channel in the mailbox's channel table; refused if the name exists.
    ChannelCreate {
        /// Unique in the mailbox; programs bind the channel by this name.
        name: String,
        /// Bytes per message, fixed for the channel's life.
        msg_size: u32,
        /// Messages the ring holds before a producer must wait.
        capacity: u32,
        /// Where its slots live: `host` (the mailbox; absent means host) or `device` (GPU memory).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        placement: String,
        /// The slots' format: `ll` or `bulk` (absent: by the message size, bulk above 64 KiB).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        protocol: String,
        /// Parts each message is split into, for as many GPU blocks per end (bulk only; absent: 1, the
        /// format every channel had before parts existed, so older requests read unchanged).
        #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
        parts: u32,
    },
    /// Delete a channel: its descriptor freed and its ring's memory reused by the next creation (a
    /// device ring's GPU memory freed); the name can be created again at once, with any size.
    /// Refused, naming the holder, while a program binds it or a host process holds one of its ends,
    /// and while it holds messages unless `discard`. A service's two channels are deleted with the
    /// service ([`Request::ServiceDelete`]). The answer's [`Response::discarded`] counts the messages
    /// dropped.
    ChannelDelete {
        /// The channel's name.
        name: String,
        /// Drop the messages it holds instead of refusing (absent: false).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        discard: bool,
    },
    /// The daemon's mode, mailbox path and channels.
    Info,
    /// Stop every program and native worker, then exit (what SIGTERM does too).
    Shutdown,
    /// Replace meshd's process with a new build of meshd, its pid kept (an upgrade of meshd itself).
    /// `binary` (absent: the file meshd was started from, which a package upgrade replaces) is run
    /// with `--version` first: it must read this state directory's format and mailbox layout and,
    /// where programs run on for it, speak the MPS workers' protocol; else refused, nothing changed.
    /// Then the programs are handed over: in MPS mode under `--orphan-grace-ms` they run on and the
    /// new image adopts them; otherwise each is stopped in order and the new image relaunches it.
    /// Answered ([`Response::handoff`]) just before the process executes the new binary.
    Handoff {
        /// The new build, an absolute path (absent: the file meshd was started from).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        binary: Option<String>,
    },
    /// Start a native GPU worker (a process of its own, meshd's child); answered once it is ready or refused.
    Spawn {
        /// Its name in `ps`.
        name: String,
        /// Channels it is told about (`MESH_CHANNELS`), in order.
        bind: Vec<String>,
        /// The program and its arguments, run without a shell.
        command: Vec<String>,
        /// Milliseconds it may take to report ready.
        ready_timeout_ms: u64,
    },
    /// End a native GPU worker: SIGTERM, then SIGKILL after the grace period.
    Stop {
        /// The name it was spawned with.
        name: String,
    },
    /// The Prometheus exposition (`GET /metrics`'s text), from the snapshot.
    Metrics,
    /// Create a service: its fan-in channel `name` (requests from every client, with the
    /// sender's id) and its group `name.replies` (one reply ring per client slot). A program serves
    /// it by binding the two, in that order. Refused, naming the reason, before anything is made.
    ServiceCreate {
        /// The service's name, 1 to [`SERVICE_NAME_MAX`] bytes: its fan-in channel's name, and with
        /// [`REPLIES_SUFFIX`] its group's.
        name: String,
        /// Client slots: how many clients may be attached at once (1 to 65536).
        clients: u32,
        /// Bytes per request (a multiple of 8, 8 to 65536).
        msg_size: u32,
        /// Requests the fan-in ring holds, over all clients (a power of two; absent: 256).
        #[serde(default = "default_service_capacity")]
        capacity: u32,
        /// Bytes per reply (a multiple of 8, 8 to 65536; absent: `msg_size`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_size: Option<u32>,
        /// Replies each client's reply ring holds (a power of two; absent: 16).
        #[serde(default = "default_reply_capacity")]
        reply_capacity: u32,
        /// Shards of the fan-in channel (a power of two, 1 to 64; absent: 1, the one ring every
        /// service had before shards, so older clients' requests read unchanged): that many rings of
        /// `capacity` requests each, every one with its own cursor, a client sending into shard
        /// `slot % shards`.
        #[serde(default = "one_part", skip_serializing_if = "is_one")]
        shards: u32,
    },
    /// Delete a service: its fan-in channel and its group, as [`Request::ChannelDelete`] deletes a
    /// channel. Refused, naming the client's process, while a client is attached, and while a program
    /// binds either channel; refused while requests are queued unless `discard`. The answer's
    /// [`Response::discarded`] counts the requests and replies dropped.
    ServiceDelete {
        /// The service's name.
        name: String,
        /// Drop the requests and replies it holds instead of refusing (absent: false).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        discard: bool,
    },
    /// Attach to a service as a client: answered with the client's id and channel names
    /// ([`Response::client`]). The connection then stays open as the client's lease: meshd departs
    /// the client when it sends [`Request::Detach`], closes the connection or dies.
    ServiceAttach {
        /// The service's name.
        service: String,
    },
    /// Take back the lease of client `client` of service `service`, which this process attached
    /// under a previous meshd (a crash, a restart or a handoff ended that lease; the client stayed
    /// bound): answered as [`Request::ServiceAttach`] is, with the same client, and the connection
    /// then stays open as its lease. Refused unless that client is bound to the asking process and
    /// holds no lease of this meshd.
    ServiceResume {
        /// The service's name.
        service: String,
        /// The client's id, as its attach answered it.
        client: u32,
    },
    /// Leave the service this connection attached to (only on a `service_attach` or
    /// `service_resume` connection).
    Detach,
}

/// The longest service name: a channel name holds 48 bytes, and the group's adds [`REPLIES_SUFFIX`].
pub const SERVICE_NAME_MAX: usize = mesh_shm::layout::NAME_LEN - REPLIES_SUFFIX.len();

/// What a service's group adds to the service's name: service `kv` replies through group `kv.replies`.
pub const REPLIES_SUFFIX: &str = ".replies";

/// A `service_create` without `capacity`: 256 requests in flight over all clients.
pub fn default_service_capacity() -> u32 {
    256
}

/// The capacity of a channel created without one, for ll and index channels (and the most a bulk
/// channel gets by default).
pub const DEFAULT_CAPACITY: u32 = 1024;

/// The slot bytes a bulk channel created without a capacity is sized to: its capacity is as many
/// messages as fit in this, so that a default bulk ring fits a default (64 MiB) mailbox.
pub const BULK_CAPACITY_BUDGET: u64 = 16 << 20;

/// The capacity of a channel created without one (the CLI's `--capacity`, Python's and C's
/// `capacity` left out): [`DEFAULT_CAPACITY`] for ll and index; for bulk the largest power of two
/// at most `min(1024, max(2, BULK_CAPACITY_BUDGET / msg_size))`, so 2 messages of 16 MiB (32 MiB of
/// slots), 16 of 1 MiB, 1024 of 16 KiB or less. Two is the least that lets a producer fill one slot
/// while the consumer reads the other.
pub fn default_capacity(msg_size: u32, protocol: mesh_shm::Protocol) -> u32 {
    if protocol != mesh_shm::Protocol::Bulk {
        return DEFAULT_CAPACITY;
    }
    let fit = (BULK_CAPACITY_BUDGET / u64::from(msg_size.max(1))).clamp(2, u64::from(DEFAULT_CAPACITY));
    // `fit` is 2 to 1024: the shift keeps its highest bit, a power of two no larger.
    1 << (63 - fit.leading_zeros())
}

/// A `service_create` without `reply_capacity`: 16 replies per client.
pub fn default_reply_capacity() -> u32 {
    16
}

/// What `service_attach` answers: the client's id and its two channels.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AttachedClient {
    /// The client's id, `slot | epoch << 16`: every request it sends carries it, and the serving
    /// program replies to it.
    pub id: u32,
    /// The fan-in channel the client sends its requests on (the service's name).
    pub requests: String,
    /// The group whose reply ring `slot` (the id's low 16 bits) is the client's.
    pub replies: String,
}

/// The slot `ps` shows for a program held back (recorded, not in the backend: it holds no slot).
pub const HELD_SLOT: u32 = u32::MAX;

/// A program's row in `ps`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramRow {
    /// As given at load.
    pub name: String,
    /// Index of its slot in the mailbox's slot table (what `mesh_ctx` points the kernel at).
    pub slot: u32,
    /// running, recovering, stopped, exited(N), faulted: …; `recovering` while a recovery in place
    /// has stopped it and not yet relaunched it (then `recovery` says from what, and for how long).
    pub state: String,
    /// Launches so far, bumped by every relaunch (blink, upgrade, recovery), and counted on by a
    /// restarted meshd that relaunches it into its slot.
    pub generation: u32,
    /// The counter the kernel advances on every iteration of its loop; a still value means a stall.
    pub heartbeat: u64,
    /// Worker process (MPS mode).
    pub worker_pid: Option<u32>,
    /// SMs held (None: whole GPU).
    pub sms: Option<u32>,
    /// The image format it was loaded from: `ptx`, `cubin`, `fatbin` or `ltoir`.
    pub kind: String,
    /// Its launch grid, in blocks (x, y, z).
    pub grid: [u32; 3],
    /// Its launch block, in threads (x, y, z).
    pub block: [u32; 3],
    /// Relaunches by the watchdog after faults.
    #[serde(default)]
    pub restarts: u32,
    /// The last fault that stopped it (the driver's error, and the culprit where known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<String>,
    /// When meshd noticed that fault, milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault_unix_ms: Option<u64>,
    /// Why it is not running: left stopped after a fault (and why it was named), or ended by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_why: Option<String>,
    /// The recovery in place under way that holds it (state `recovering`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryRow>,
    /// Its user words: the [`USER_WORDS`] words its kernel stores with `mesh_user_store` (0 where it
    /// stored none), read from its slot when `ps` answered. Absent for a program held back (it has
    /// no slot), in the answers to `load` and `upgrade`, and from a meshd before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user: Vec<u32>,
    /// Its kernel runs as the previous meshd launched it: this one adopted it without a launch (MPS
    /// mode under `--orphan-grace-ms`, after a crash or a handoff). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

/// How many user words a program slot holds (mesh.cuh's `MESH_SLOT_USER_WORDS`).
pub const USER_WORDS: usize = 32;

/// Program `name`'s user words from `ps`'s `rows`; refused, saying why, when no row has that name,
/// or when its row carries none (a program held back has no slot, and a meshd before user words
/// does not send them).
pub fn user_words<'a>(rows: &'a [ProgramRow], name: &str) -> Result<&'a [u32]> {
    let Some(row) = rows.iter().find(|p| p.name == name) else {
        let known: Vec<&str> = rows.iter().map(|p| p.name.as_str()).collect();
        bail!(
            "program {name:?}: not loaded (loaded: {})",
            if known.is_empty() { "none".into() } else { known.join(", ") }
        );
    };
    if row.user.is_empty() {
        if row.slot == HELD_SLOT {
            bail!("program {name:?}: held back, it holds no slot and so no user words");
        }
        bail!("program {name:?}: meshd sent no user words (a meshd older than `meshd user`)");
    }
    Ok(&row.user)
}

/// A recovery in place as `ps` shows it on each program it holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecoveryRow {
    /// What started it: the fault or the death, as the log says it.
    pub reason: String,
    /// When it began, milliseconds since the Unix epoch.
    pub since_unix_ms: u64,
    /// How long it has run so far, in milliseconds, when `ps` answered.
    pub elapsed_ms: u64,
}

impl From<&ProgramStatus> for ProgramRow {
    fn from(s: &ProgramStatus) -> Self {
        Self {
            name: s.name.clone(),
            slot: s.slot,
            state: s.state.to_string(),
            generation: s.generation,
            heartbeat: s.heartbeat,
            worker_pid: s.worker_pid,
            sms: s.sms,
            kind: s.kind.to_string(),
            grid: s.shape.grid,
            block: s.shape.block,
            restarts: s.restarts,
            last_fault: s.last_fault.clone(),
            last_fault_unix_ms: s.last_fault_unix_ms,
            stopped_why: s.stopped_why.clone(),
            recovery: None,
            user: Vec::new(),
            adopted: s.adopted,
        }
    }
}

mod defaults;
mod info;
pub use defaults::{is_one, is_one_part, is_zero, one_part};
pub use info::{
    ArenaRow, ChannelRow, GrowthRow, HandoffRow, Info, InfoExtra, PoolRow, ServiceClientRow, ServiceEvents,
    ServiceHold, ServiceRow,
};

/// The daemon's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Response {
    /// Whether the request succeeded; when false, `error` says why and the other fields are absent.
    pub ok: bool,
    /// What was refused and why; absent on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Programs (load, upgrade, ps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub programs: Option<Vec<ProgramRow>>,
    /// The daemon (info).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<Info>,
    /// Native GPU workers (ps, spawn), beside the programs: `ps` shows them with kind `native`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub natives: Option<Vec<crate::native::NativeRow>>,
    /// Microseconds the backend spent on the request (load, upgrade, unload, a channel's or a
    /// service's create or delete),
    /// queueing excluded: what the control plane adds is the client's round trip minus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_us: Option<u64>,
    /// The Prometheus exposition (metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// The client a `service_attach` bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<AttachedClient>,
    /// Messages a `channel_delete` or `service_delete` dropped (0 when the channels were empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded: Option<u64>,
    /// `handoff`: the binary executed next and what it is handed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffRow>,
}

impl Response {
    /// A refusal carrying `e`'s message.
    pub fn error(e: impl std::fmt::Display) -> Self {
        Self { ok: false, error: Some(e.to_string()), ..Self::default() }
    }

    /// A success with no rows (unload, shutdown, a channel's or a service's create).
    pub fn ok() -> Self {
        Self { ok: true, ..Self::default() }
    }
}

/// Why a request could not be read. Every variant's message says what the client did wrong.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The client closed the connection before its request line ended (or sent nothing at all).
    #[error("the client closed the connection before sending a whole request line")]
    Closed,
    /// The client sent nothing for the idle limit.
    #[error("no data from the client for {0:?}; connection dropped")]
    Idle(std::time::Duration),
    /// The request line exceeds [`MAX_LINE`] (the rest is not read).
    #[error("request line longer than {max} bytes; connection closed")]
    LineTooLong {
        /// [`MAX_LINE`], in bytes.
        max: usize,
    },
    /// The line is not a request: not JSON, an unknown `op`, or a field missing; the text is serde's.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The announced image exceeds [`MAX_IMAGE`].
    #[error("image of {len} bytes, at most {MAX_IMAGE}")]
    ImageTooLarge {
        /// The `image_len` the request announced.
        len: usize,
    },
    /// Fewer image bytes arrived than announced.
    #[error("reading the {len}-byte image: the client closed the connection after {got} bytes")]
    ImageTruncated {
        /// The `image_len` the request announced.
        len: usize,
        /// Bytes that arrived before the client closed.
        got: usize,
    },
    /// Reading the socket failed for another reason than the client's.
    #[error("reading the request: {0}")]
    Io(std::io::Error),
}

impl RequestError {
    /// Maps a read error; a receive timeout (SO_RCVTIMEO) is the client's silence.
    fn from_io(e: std::io::Error, idle: Option<std::time::Duration>) -> Self {
        match (e.kind(), idle) {
            (std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut, Some(idle)) => Self::Idle(idle),
            _ => Self::Io(e),
        }
    }
}

/// Parses one request line (without or with its newline). Never panics, whatever the bytes.
pub fn parse_request(line: &[u8]) -> Result<Request, RequestError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let req: Request = serde_json::from_slice(line).map_err(|e| RequestError::Malformed(e.to_string()))?;
    match &req {
        Request::Load { image_len, .. } | Request::Upgrade { image_len, .. } if *image_len > MAX_IMAGE => {
            Err(RequestError::ImageTooLarge { len: *image_len })
        }
        _ => Ok(req),
    }
}

/// Bytes of image a request announces.
pub fn image_len(req: &Request) -> usize {
    match req {
        Request::Load { image_len, .. } | Request::Upgrade { image_len, .. } => *image_len,
        _ => 0,
    }
}

/// Reads one request and the image bytes that follow it, if any. Memory grows only with what the
/// client sends: the line is read through a [`MAX_LINE`]-byte window, the image as it arrives.
/// `idle` is the socket's receive timeout, if one is set, so that a timeout reads as the client's silence.
pub fn read_request_within(
    r: &mut impl BufRead,
    idle: Option<std::time::Duration>,
) -> Result<(Request, Vec<u8>), RequestError> {
    let mut line = Vec::new();
    // One byte past the limit tells a line of exactly MAX_LINE bytes (plus newline) from a longer one.
    let window = (MAX_LINE + 2) as u64;
    r.by_ref().take(window).read_until(b'\n', &mut line).map_err(|e| RequestError::from_io(e, idle))?;
    if !line.ends_with(b"\n") {
        return Err(if line.len() > MAX_LINE {
            RequestError::LineTooLong { max: MAX_LINE }
        } else {
            RequestError::Closed
        });
    }
    if line.len() > MAX_LINE + 1 {
        return Err(RequestError::LineTooLong { max: MAX_LINE });
    }
    let req = parse_request(&line)?;
    let len = image_len(&req);
    // Grow with the bytes received, not with the length announced: a client that announces 256 MiB
    // and sends nothing costs nothing.
    let mut image = Vec::with_capacity(len.min(1 << 20));
    r.by_ref().take(len as u64).read_to_end(&mut image).map_err(|e| RequestError::from_io(e, idle))?;
    if image.len() < len {
        return Err(RequestError::ImageTruncated { len, got: image.len() });
    }
    Ok((req, image))
}

/// [`read_request_within`] for a reader without a receive timeout.
pub fn read_request(r: &mut impl BufRead) -> Result<(Request, Vec<u8>), RequestError> {
    read_request_within(r, None)
}

/// Writes one request and its image.
pub fn write_request(w: &mut impl Write, req: &Request, image: &[u8]) -> Result<()> {
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.write_all(image)?;
    w.flush()?;
    Ok(())
}

/// Writes one response line.
pub fn write_response(w: &mut impl Write, resp: &Response) -> Result<()> {
    let mut line = serde_json::to_vec(resp)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()?;
    Ok(())
}

/// Reads one response line (a response carries at most a program list: bounded by 64 MiB, so that
/// a broken peer cannot make a client grow without end).
pub fn read_response(r: &mut impl BufRead) -> Result<Response> {
    let mut line = Vec::new();
    if r.by_ref().take(64 << 20).read_until(b'\n', &mut line)? == 0 {
        bail!("meshd closed the connection without answering");
    }
    serde_json::from_slice(line.trim_ascii_end()).context("malformed response from meshd")
}

#[cfg(test)]
mod tests;
