//! The protocol between meshd (mesh-mps) and its MPS workers: one JSON line per command on the worker's
//! stdin, one JSON line per reply or event on its stdout; the first line a worker writes is its `ready` (or why not).
//!
//! Every message is an enum that serde encodes: a [`Command`], a [`Reply`] whose kernel state is a
//! [`KernelState`] and whose refusal carries a [`RefusalKind`], so neither side compares strings.
//!
//! **Events.** Besides one reply per command, a worker *pushes* an [`Event`] when its kernel ends
//! (returned, or failed with the driver's error), found by its own check of its stream (every
//! [`KERNEL_CHECK`] while a kernel runs), so that meshd never asks every worker in turn: a reader
//! thread per worker hands the events over and the backend takes them without waiting. [`decode`]
//! tells a line's kind by its key (`reply` or `event`) and says exactly what is wrong with one that is
//! neither; [`PROTOCOL`] travels in `ready` and a worker of another version is refused.
//!
//! **Liveness.** A worker also says [`Event::Alive`] every [`ALIVE_EVERY`], idle or not, from the
//! loop that checks its stream, so that meshd can tell a stopped or wedged worker (SIGSTOP, a hung
//! driver call) from a quiet one: a running kernel's heartbeats go on while its worker is stopped,
//! but then nobody can act on its fault, unload or stop. meshd counts any line as a sign of life.
//!
//! **Device channels** (MPS mode, opt-in): meshd owns each device ring's memory and hands a worker a
//! descriptor of it ([`Command::Map`]) over a second, inherited unix socket (`--fd-socket N`,
//! `SCM_RIGHTS`), sent just before the command; the worker maps it and gives programs the address.
//!
//! **Orphans** (`--orphan-grace-ms`, see [`orphan`]): a worker whose stdin ends while its kernel
//! runs (meshd died) keeps the kernel running and waits for a meshd at a rendezvous socket. A meshd
//! that connects says [`Command::Hello`] with its version; the worker answers [`Reply::Orphan`]
//! (what it runs) or a refusal naming both versions. meshd then says [`Command::Adopt`], with a
//! new fd socket riding on that line (`SCM_RIGHTS`): the worker takes commands on the rendezvous
//! socket from then on, as it did on stdin, and its kernel never stopped. Or meshd says
//! [`Command::Retire`], which stops its program in order and ends it.

pub mod fdpass;
pub mod orphan;

use mesh_cuda::{KernelFigures, KernelRun, StreamState};
use serde::{Deserialize, Serialize};

/// The protocol's version, said in `ready`; meshd refuses a worker that speaks another.
/// Version 3 added [`Event::Alive`] and `ready`'s `kernel_check_us`; version 4 the orphan's
/// rendezvous ([`Command::Hello`], [`Command::Retire`], [`Reply::Orphan`]); version 5 the
/// adoption ([`Command::Adopt`], and what [`Orphan`] says of its program).
pub const PROTOCOL: u32 = 5;

/// How often a worker checks its running kernel's stream (`cuStreamQuery`, a host-side read) by
/// default: the bound on how late meshd hears that a kernel ended or failed, whatever the number of
/// workers. `--kernel-check-us` changes it (meshd's `--mps-kernel-check-us`).
///
/// 5 ms: it adds at most 5 ms to a recovery (goal 500 ms) and to an MPS upgrade's wait for the old
/// kernel, while a 1 ms wait loop alone cost about 2% of a core per busy worker on the development
/// container (0.7% at 5 ms) — with 48 programs, a whole core.
pub const KERNEL_CHECK: std::time::Duration = std::time::Duration::from_millis(5);

/// The range `--kernel-check-us` accepts: below 50 µs the loop is a busy wait in all but name; above
/// a second a fault waits that long to be heard, and the loop would miss its [`ALIVE_EVERY`].
pub const KERNEL_CHECK_RANGE_US: std::ops::RangeInclusive<u64> = 50..=200_000;

/// How often a worker says [`Event::Alive`]: often enough that a few missed ones fit well within
/// meshd's silence bound (mesh-mps's `SILENCE_LIMIT`, seconds), rarely enough to cost nothing (an
/// idle worker wakes 4 times a second for it).
pub const ALIVE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// What meshd asks a worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Load the cubin at `cubin` and probe its `mesh_main` for this launch shape.
    Load {
        /// A file meshd wrote (the worker reads it once).
        cubin: String,
        /// `mesh_main`'s grid, in blocks (x, y, z), as meshd's load request gave it.
        grid: [u32; 3],
        /// `mesh_main`'s block, in threads (x, y, z).
        block: [u32; 3],
        /// Dynamic shared memory per block.
        shared_mem: u32,
    },
    /// Launch the loaded `mesh_main` for mailbox slot `slot` (meshd has armed the slot).
    Launch {
        /// The program's slot.
        slot: u32,
    },
    /// Wait up to `timeout_ms` for the kernel to return; answers the stream's state.
    Wait {
        /// How long; 0 answers at once.
        timeout_ms: u64,
    },
    /// Unload the module (the kernel must have returned); unmaps every device channel too.
    Unload,
    /// Map device channel `channel`'s ring, whose descriptor meshd has just sent on the fd socket
    /// with [`FdTag`] `{channel, bytes}`; a program launched afterwards finds its slots there.
    Map {
        /// The channel's index in the mailbox.
        channel: u32,
        /// The allocation's size (granularity-rounded), as the descriptor's tag says too.
        bytes: u64,
        /// Zero the ring before answering (it is new, or was renewed after a recovery): done on
        /// the worker's stream, inside the MPS server, so that meshd's own context runs no GPU work.
        zero: bool,
    },
    /// Leave.
    Exit,
    /// The first line on an orphan's rendezvous socket: the connecting meshd's protocol version.
    /// Answered with [`Reply::Orphan`], or refused naming both versions when they differ.
    Hello {
        /// The version meshd speaks ([`PROTOCOL`]).
        protocol: u32,
    },
    /// Stop the program in order and leave: the stop asked through its slot, the kernel given the
    /// stop deadline, else the worker cut off its server; answered with `done` just before the exit.
    Retire,
    /// Send a new descriptor of device channel `channel`'s ring, as mapped here, on the fd socket
    /// (worker to meshd, with [`FdTag`] `{channel, bytes}`), then answer `done`: how a meshd that
    /// adopted this worker comes to hold the ring, and the messages in it.
    Export {
        /// The channel's index.
        channel: u32,
        /// The mapping's size, as meshd's `map` gave it.
        bytes: u64,
    },
    /// Said after a hello: the connecting meshd adopts this orphan. The line carries the worker's
    /// new fd socket (`SCM_RIGHTS`, [`fdpass::send_line_with_fd`]); answered with `done`, after
    /// which the rendezvous socket carries the protocol and the kernel runs on, untouched.
    Adopt,
}

/// What travels with a descriptor on the fd socket (16 bytes, little-endian): which channel's ring it
/// is and its size, checked by the worker against the [`Command::Map`] that follows, so that a
/// descriptor is never taken for another channel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdTag {
    /// The channel's index.
    pub channel: u32,
    /// The allocation's size.
    pub bytes: u64,
}

impl FdTag {
    /// Its wire form.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.channel.to_le_bytes());
        b[8..].copy_from_slice(&self.bytes.to_le_bytes());
        b
    }

    /// Reads one; `None` unless it is exactly 16 bytes.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; 16] = b.try_into().ok()?;
        let channel = u32::from_le_bytes(b[..4].try_into().ok()?);
        let bytes = u64::from_le_bytes(b[8..].try_into().ok()?);
        Some(Self { channel, bytes })
    }
}

/// What the worker says once started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ready {
    /// The protocol it speaks ([`PROTOCOL`]).
    pub protocol: u32,
    /// The worker's pid.
    pub pid: u32,
    /// The GPU's name.
    pub device: String,
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` seen from inside the worker.
    pub mps_enabled: bool,
    /// SMs of the worker's context.
    pub sms: u32,
    /// Milliseconds its context creation took (the first client also starts the MPS server).
    pub context_ms: u64,
    /// How often it checks a running kernel's stream, µs (0 from a worker before version 3, whose
    /// `ready` is then refused for its version, not for this field).
    #[serde(default)]
    pub kernel_check_us: u64,
}

/// kcheck's figures for a loaded `mesh_main`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Probe {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block.
    pub shared_bytes: u32,
    /// Largest block.
    pub max_threads_per_block: u32,
    /// Blocks of the asked shape resident per SM.
    pub per_sm: u32,
    /// SMs of the worker's context.
    pub sms: u32,
}

impl Probe {
    /// kcheck's figures for the shape the load asked about.
    pub fn figures(&self) -> KernelFigures {
        KernelFigures {
            registers: self.registers,
            shared_bytes: self.shared_bytes,
            max_threads_per_block: self.max_threads_per_block,
            per_sm: self.per_sm,
        }
    }
}

/// What the worker's kernel is doing, answered to `wait`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KernelState {
    /// Nothing runs: the kernel returned, or none was launched.
    Idle,
    /// The kernel still runs.
    Busy,
    /// The kernel failed (or the worker cannot tell: it is gone, it did not answer).
    Failed {
        /// The driver's error, or what went wrong reaching the worker.
        reason: String,
    },
}

impl From<KernelState> for KernelRun {
    fn from(s: KernelState) -> Self {
        match s {
            KernelState::Idle => KernelRun::Returned,
            KernelState::Busy => KernelRun::Running,
            KernelState::Failed { reason } => KernelRun::Failed(reason),
        }
    }
}

impl From<StreamState> for KernelState {
    fn from(s: StreamState) -> Self {
        match s {
            StreamState::Idle => KernelState::Idle,
            StreamState::Busy => KernelState::Busy,
            StreamState::Failed(reason) => KernelState::Failed { reason },
        }
    }
}

/// Why a worker refused, as a kind meshd acts on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// Bad command-line arguments (the first line; the worker then exits with status 2).
    Usage,
    /// The worker could not start: no driver, not an MPS client, the mailbox (exits with status 1).
    Start,
    /// A line that is no command.
    Malformed,
    /// A command that needs the kernel stopped while it runs.
    Busy,
    /// A launch with no module loaded.
    NotLoaded,
    /// The image has no `mesh_main`.
    NoEntry,
    /// Anything else the driver or the file system refused.
    Failed,
    /// A hello of another protocol version (both named in the message).
    Version,
}

/// A refusal: its kind and the reason in words.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refusal {
    /// What kind of refusal.
    pub kind: RefusalKind,
    /// Why, with the driver's message where there is one.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind` saying `message`.
    pub fn new(kind: RefusalKind, message: impl std::fmt::Display) -> Self {
        Self { kind, message: message.to_string() }
    }
}

/// A worker's answer: one per command, and the first line it writes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The first line: started, registered, an MPS client.
    Ready(Ready),
    /// After `load`: the module is loaded, with kcheck's figures.
    Loaded(Probe),
    /// After `wait`.
    State {
        /// Idle (returned or never launched), busy, or failed with the driver's error.
        state: KernelState,
    },
    /// After `launch`, `unload` and `exit`.
    Done,
    /// The command, or the start, failed.
    Refused(Refusal),
    /// An orphan's answer to [`Command::Hello`]: what it runs.
    Orphan(Orphan),
}

/// What an orphaned worker runs, as it answers a meshd's [`Command::Hello`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Orphan {
    /// The protocol it speaks ([`PROTOCOL`]).
    pub protocol: u32,
    /// Its pid.
    pub pid: u32,
    /// The slot of its last launch, if it launched one.
    pub slot: Option<u32>,
    /// That slot's generation as the mailbox says now.
    pub generation: Option<u32>,
    /// Launches so far.
    pub launches: u64,
    /// Its kernel now.
    pub kernel: KernelState,
    /// How long it has been without a meshd, ms.
    pub orphaned_ms: u64,
    /// How long it waits in all before it retires by itself, ms.
    pub grace_ms: u64,
    /// What it said when it started (its SMs, its device).
    pub ready: Ready,
    /// The `--sms` it was started with (`None`: the whole GPU).
    pub asked_sms: Option<u32>,
    /// The mailbox file it maps, by identity: a meshd adopts only the orphans of its own mailbox.
    pub mailbox: FileId,
    /// The module it has loaded, with the shape it was probed for and kcheck's figures.
    pub loaded: Option<Loaded>,
    /// Device channels whose rings it has mapped, by index.
    pub mapped: Vec<u32>,
}

/// A loaded module, as an orphan describes it: the launch shape and kcheck's figures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Loaded {
    /// `mesh_main`'s grid, in blocks.
    pub grid: [u32; 3],
    /// `mesh_main`'s block, in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block.
    pub shared_mem: u32,
    /// What the load's probe said.
    pub probe: Probe,
}

/// A file's identity: its device and inode numbers.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// The identity of the file at `path` (symbolic links followed).
    pub fn of(path: &std::path::Path) -> std::io::Result<Self> {
        let st = rustix::fs::stat(path)?;
        Ok(Self { dev: st.st_dev, ino: st.st_ino })
    }
}

impl Reply {
    /// A refusal of `kind`.
    pub fn refused(kind: RefusalKind, message: impl std::fmt::Display) -> Self {
        Self::Refused(Refusal::new(kind, message))
    }
}

/// What a worker pushes without being asked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The kernel of launch number `launch` (counted from 1 in this worker) is no longer running:
    /// `idle` (it returned) or `failed` with the driver's error. Said once per launch.
    KernelEnded {
        /// Which launch.
        launch: u64,
        /// `idle` or `failed`.
        state: KernelState,
        /// When the worker saw it (`CLOCK_REALTIME`, ns since the Unix epoch): how late meshd heard
        /// of a fault, in its recovery's breakdown, comparable with a GPU's `%globaltimer`.
        seen_unix_ns: u64,
    },
    /// Said every [`ALIVE_EVERY`] by the loop that checks the stream: the worker runs and reads its
    /// commands. meshd notes the time and nothing else (no wake-up, no watchdog pass).
    Alive,
}

/// One line from a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// An answer to the command in flight (or the first line).
    Reply(Reply),
    /// News nobody asked for.
    Event(Event),
}

/// Why a worker's line could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Not JSON, or not a JSON object.
    #[error("not a JSON object ({reason}): {line:?}")]
    NotJson {
        /// The line, cut to 200 characters.
        line: String,
        /// serde's words.
        reason: String,
    },
    /// An object with neither a `reply` nor an `event` key.
    #[error("neither a reply nor an event (no \"reply\" or \"event\" key): {line:?}")]
    NoKind {
        /// The line, cut.
        line: String,
    },
    /// A reply or event whose fields do not fit.
    #[error("a malformed {kind}: {reason}: {line:?}")]
    Fields {
        /// `reply` or `event`.
        kind: &'static str,
        /// serde's words.
        reason: String,
        /// The line, cut.
        line: String,
    },
}

fn cut(line: &str) -> String {
    line.chars().take(200).collect()
}

/// Reads one line a worker wrote: a reply or an event, told apart by its key.
pub fn decode(line: &str) -> Result<Incoming, ProtocolError> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| ProtocolError::NotJson { line: cut(line), reason: e.to_string() })?;
    let Some(object) = value.as_object() else {
        return Err(ProtocolError::NotJson { line: cut(line), reason: "a JSON value that is no object".into() });
    };
    let fields = |kind: &'static str| {
        move |e: serde_json::Error| ProtocolError::Fields { kind, reason: e.to_string(), line: cut(line) }
    };
    if object.contains_key("reply") {
        serde_json::from_value(value).map(Incoming::Reply).map_err(fields("reply"))
    } else if object.contains_key("event") {
        serde_json::from_value(value).map(Incoming::Event).map_err(fields("event"))
    } else {
        Err(ProtocolError::NoKind { line: cut(line) })
    }
}

/// The worker's JSON for one line (no newline).
pub fn encode<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("protocol types serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_replies_round_trip() {
        let c = Command::Load { cubin: "/x".into(), grid: [1, 2, 3], block: [32, 1, 1], shared_mem: 0 };
        assert_eq!(serde_json::from_str::<Command>(&encode(&c)).unwrap(), c);
        assert_eq!(encode(&Command::Wait { timeout_ms: 5 }), r#"{"op":"wait","timeout_ms":5}"#);
        let replies = [
            Reply::State { state: KernelState::Idle },
            Reply::State { state: KernelState::Failed { reason: "CUDA_ERROR_ILLEGAL_ADDRESS".into() } },
            Reply::Done,
            Reply::refused(RefusalKind::NoEntry, "cuModuleGetFunction failed"),
            Reply::Loaded(Probe { registers: 8, shared_bytes: 0, max_threads_per_block: 1024, per_sm: 16, sms: 132 }),
            Reply::Ready(Ready {
                protocol: PROTOCOL,
                pid: 7,
                device: "H200".into(),
                mps_enabled: true,
                sms: 132,
                context_ms: 3,
                kernel_check_us: 1000,
            }),
        ];
        for r in replies {
            assert_eq!(serde_json::from_str::<Reply>(&encode(&r)).unwrap(), r);
        }
        assert_eq!(encode(&Reply::State { state: KernelState::Busy }), r#"{"reply":"state","state":"busy"}"#);
        assert!(serde_json::from_str::<Command>(r#"{"op":"dance"}"#).is_err());
        assert_eq!(encode(&Command::Hello { protocol: 4 }), r#"{"op":"hello","protocol":4}"#);
        assert_eq!(encode(&Command::Retire), r#"{"op":"retire"}"#);
        assert_eq!(encode(&Command::Adopt), r#"{"op":"adopt"}"#);
        assert_eq!(
            encode(&Command::Export { channel: 3, bytes: 2 << 20 }),
            r#"{"op":"export","channel":3,"bytes":2097152}"#
        );
        let orphan = Reply::Orphan(sample_orphan());
        assert_eq!(decode(&encode(&orphan)).unwrap(), Incoming::Reply(orphan));
    }

    /// An orphan running a loaded program in slot 2.
    fn sample_orphan() -> Orphan {
        Orphan {
            protocol: PROTOCOL,
            pid: 9,
            slot: Some(2),
            generation: Some(5),
            launches: 1,
            kernel: KernelState::Busy,
            orphaned_ms: 120,
            grace_ms: 60_000,
            ready: Ready {
                protocol: PROTOCOL,
                pid: 9,
                device: "H100".into(),
                mps_enabled: true,
                sms: 132,
                context_ms: 40,
                kernel_check_us: 5000,
            },
            asked_sms: None,
            mailbox: FileId { dev: 64, ino: 1234 },
            loaded: Some(Loaded {
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_mem: 0,
                probe: Probe { registers: 16, shared_bytes: 0, max_threads_per_block: 1024, per_sm: 32, sms: 132 },
            }),
            mapped: vec![3],
        }
    }

    #[test]
    fn a_files_identity_tells_two_files_apart_and_follows_the_same_one() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"x").unwrap();
        assert_eq!(FileId::of(&a).unwrap(), FileId::of(&a).unwrap());
        assert_ne!(FileId::of(&a).unwrap(), FileId::of(&b).unwrap());
        std::fs::rename(&b, &a).unwrap();
        assert_ne!(FileId::of(&a).unwrap().ino, 0);
        assert!(FileId::of(&dir.path().join("gone")).is_err());
    }

    #[test]
    fn lines_are_told_apart_and_bad_ones_say_why() {
        let ended = Event::KernelEnded {
            launch: 3,
            state: KernelState::Failed { reason: "ILLEGAL_ADDRESS".into() },
            seen_unix_ns: 1_764_700_000_000_000_000,
        };
        assert_eq!(decode(&encode(&ended)).unwrap(), Incoming::Event(ended));
        assert_eq!(decode(r#"{"reply":"done"}"#).unwrap(), Incoming::Reply(Reply::Done));
        assert_eq!(encode(&Event::Alive), r#"{"event":"alive"}"#);
        assert_eq!(decode(r#"{"event":"alive"}"#).unwrap(), Incoming::Event(Event::Alive));
        // An older worker's ready (no kernel_check_us) still reads, so that its version is what is refused.
        let old = r#"{"reply":"ready","protocol":2,"pid":1,"device":"d","mps_enabled":true,"sms":1,"context_ms":0}"#;
        assert!(matches!(decode(old).unwrap(), Incoming::Reply(Reply::Ready(Ready { protocol: 2, .. }))));
        let e = decode("hello").unwrap_err().to_string();
        assert!(e.starts_with("not a JSON object") && e.contains("\"hello\""), "{e}");
        let e = decode("[1]").unwrap_err().to_string();
        assert!(e.contains("no object"), "{e}");
        let e = decode(r#"{"op":"load"}"#).unwrap_err().to_string();
        assert!(e.contains("neither a reply nor an event"), "{e}");
        let e = decode(r#"{"event":"kernel_ended","launch":"x"}"#).unwrap_err().to_string();
        assert!(e.starts_with("a malformed event") && e.contains("launch"), "{e}");
        let e = decode(r#"{"reply":"ready","pid":1}"#).unwrap_err().to_string();
        assert!(e.starts_with("a malformed reply") && e.contains("protocol"), "a ready without its version: {e}");
        let long = format!("{{\"x\":\"{}\"}}", "a".repeat(1000));
        assert!(decode(&long).unwrap_err().to_string().len() < 400, "a long line is cut");
    }

    #[test]
    fn a_descriptors_tag_round_trips_and_only_16_bytes_are_one() {
        let t = FdTag { channel: 7, bytes: 2 << 20 };
        assert_eq!(FdTag::decode(&t.encode()), Some(t));
        assert_eq!(FdTag::decode(&[0; 15]), None);
        assert_eq!(FdTag::decode(&[0; 17]), None);
        let c = Command::Map { channel: 7, bytes: 2 << 20, zero: true };
        assert_eq!(encode(&c), r#"{"op":"map","channel":7,"bytes":2097152,"zero":true}"#);
    }

    #[test]
    fn a_kernel_state_maps_to_the_contracts_kernel_run() {
        assert_eq!(KernelRun::from(KernelState::Busy), KernelRun::Running);
        assert_eq!(KernelRun::from(KernelState::Idle), KernelRun::Returned);
        assert_eq!(KernelRun::from(KernelState::Failed { reason: "x".into() }), KernelRun::Failed("x".into()));
    }
}
