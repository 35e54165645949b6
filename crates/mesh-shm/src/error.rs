//! The mailbox's errors: each names the file, channel or slot concerned and the reason, with the values.

use std::path::PathBuf;

/// Which end of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The sending side (writes `head`).
    Producer,
    /// The receiving side (writes `tail`).
    Consumer,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            End::Producer => "producer",
            End::Consumer => "consumer",
        })
    }
}

/// Everything the mailbox can refuse.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call on the file failed.
    #[error("mailbox {path}: {op}: {source}")]
    Io {
        /// The mailbox file's path.
        path: PathBuf,
        /// The step that failed: "open", "map", "set size", …
        op: &'static str,
        /// The OS error (errno), as `std::io` reports it.
        #[source]
        source: std::io::Error,
    },
    /// `create` found a file there and was not asked to replace it.
    #[error("mailbox {path}: already exists (CreateMode::Replace overwrites it)")]
    Exists {
        /// The path `create` would have taken.
        path: PathBuf,
    },
    /// `open` found a header field or table that does not describe a valid mailbox (or, for the arena
    /// cursor, a channel's creation found it overwritten since).
    #[error("mailbox {path}: invalid {field}: {reason}")]
    Invalid {
        /// The mailbox file's path.
        path: PathBuf,
        /// The field or table at fault.
        field: &'static str,
        /// The values and why they are wrong.
        reason: String,
    },
    /// A creation parameter is out of range.
    #[error("mailbox configuration: {0}")]
    Config(String),
    /// No live channel has that name.
    #[error("channel {0:?}: no such channel")]
    NoSuchChannel(String),
    /// A live channel already has that name.
    #[error("channel {0:?}: already exists")]
    ChannelExists(String),
    /// A channel's parameters are out of range.
    #[error("channel {name:?}: {reason}")]
    ChannelConfig {
        /// The name the channel was to be created with.
        name: String,
        /// Which parameter, its value and the allowed range.
        reason: String,
    },
    /// The channel table or the ring arena has no room for the channel: `reason` starts with "full:"
    /// when too little is left (descriptors, or bytes in all), with "fragmented:" when enough bytes
    /// are free in all but no free run is long enough.
    #[error("channel {name:?}: mailbox {reason}")]
    Full {
        /// The channel being created.
        name: String,
        /// What ran out, with the numbers.
        reason: String,
        /// The arena's refusal, with its figures; `None` when the channel table is what is full.
        room: Option<crate::arena::Refusal>,
    },
    /// No service of that name: neither its fan-in channel nor its group (`NAME.replies`) is live.
    #[error("service {0:?}: no such service (no fan-in channel {0:?} and no group \"{0}.replies\")")]
    NoSuchService(String),
    /// A service's deletion was refused (in use, messages queued, or not a service's channels).
    #[error("service {service:?}: {reason}")]
    ServiceRefused {
        /// The service's name.
        service: String,
        /// Who holds it, or what it holds, with the values.
        reason: String,
    },
    /// The channel was deleted, or deleted and replaced by another of its name, between the moment
    /// an end looked it up and the moment it took its claim: the claim was given back.
    #[error(
        "channel {channel:?}: deleted (or replaced by a new channel of that name) while its {end} end was \
         being claimed; nothing is held (claim it again to reach the channel of that name now)"
    )]
    Deleted {
        /// The channel's name.
        channel: String,
        /// The end that was being claimed.
        end: End,
    },
    /// A live process already holds that end.
    #[error("channel {channel:?}: {end} end already claimed by pid {pid}")]
    Claimed {
        /// The channel's name.
        channel: String,
        /// The end asked for: producer or consumer.
        end: End,
        /// The live process that holds it, from the end's claim word.
        pid: u32,
    },
    /// A message of the wrong size.
    #[error("channel {channel:?}: message of {got} bytes, the channel carries {size}-byte messages")]
    MessageSize {
        /// The channel's name.
        channel: String,
        /// The channel's message size, in bytes.
        size: usize,
        /// The bytes given (for a batch, the remainder past whole messages).
        got: usize,
    },
    /// A send or receive with a deadline ran out of time.
    #[error("channel {channel:?}: {op} timed out after {waited_ms} ms")]
    Timeout {
        /// The channel's name.
        channel: String,
        /// `send` or `recv`.
        op: &'static str,
        /// Milliseconds waited before giving up (the caller's timeout, in whole milliseconds).
        waited_ms: u128,
    },
    /// The ring's shared indices are impossible (a buggy writer or a corrupted file).
    #[error("channel {channel:?}: ring indices corrupt: head {head}, tail {tail}, capacity {capacity}")]
    Corrupt {
        /// The channel's name.
        channel: String,
        /// The producer's index as read (messages ever sent).
        head: u64,
        /// The consumer's index as read (messages ever received).
        tail: u64,
        /// Messages the ring holds: indices further apart than this, or a tail past the head, are impossible.
        capacity: u64,
    },
    /// A host process asked for an end of a channel whose ring is in GPU memory.
    #[error(
        "channel {channel:?}: its ring is in device memory (--placement device), so only GPU programs can \
         use its ends; a host process needs a channel created with --placement host"
    )]
    DevicePlacement {
        /// The channel's name.
        channel: String,
    },
    /// A host end of one protocol was asked for on a channel of another.
    #[error(
        "channel {channel:?}: its slots are in the {protocol} format; this end speaks {wanted} \
         (protocols ll and index: Producer/Consumer; protocol bulk: BulkProducer/BulkConsumer; protocol \
         fanin: FanInSender/FanInReceiver; protocol group: GroupServer/GroupClient, and ServiceOwner for meshd)"
    )]
    Protocol {
        /// The channel's name.
        channel: String,
        /// The channel's protocol.
        protocol: crate::protocol::Protocol,
        /// The protocol of the end asked for.
        wanted: crate::protocol::Protocol,
    },
    /// A GPU program was to bind a channel whose protocol only host processes speak.
    #[error(
        "channel {channel:?}: protocol {protocol} is for two host processes (the payload alone in each slot, \
         the producer's index saying what is whole), so a GPU program cannot bind it; create a channel \
         of protocol ll (or bulk) for a program's end"
    )]
    HostOnly {
        /// The channel's name.
        channel: String,
        /// The channel's protocol.
        protocol: crate::protocol::Protocol,
    },
    /// A kernel's context was asked for with a device channel whose ring this context has no address for.
    #[error(
        "channel {channel:?}: its ring is in device memory and the launching context has no address for it \
         (device channels work in blink mode; MPS mode does not share them yet)"
    )]
    NoDeviceRing {
        /// The channel's name.
        channel: String,
    },
    /// A bulk end's split calls out of order: a reserve, send or receive while a slot the end lent is
    /// still out (`lent`: that message's sequence number), or a publish, discard, release or unpeek
    /// with none out (`lent`: `None`).
    #[error("channel {channel:?}: {end} {op}: {}", lent_text(.lent))]
    SlotLent {
        /// The channel's name.
        channel: String,
        /// The end asked: producer or consumer.
        end: End,
        /// The call refused: `reserve`, `send`, `publish`, `discard`, `recv`, `release`, …
        op: &'static str,
        /// The message whose slot is still lent, if one is.
        lent: Option<u64>,
    },
    /// A fan-in ring holds what no producer or consumer can have left (a buggy writer or a corrupted
    /// file): reported, never followed.
    #[error("channel {channel:?}: fan-in ring corrupt: {corrupt:?}")]
    FanIn {
        /// The fan-in channel's name.
        channel: String,
        /// What was read, and where.
        corrupt: crate::fanin::FanInCorrupt,
    },
    /// A channel group (or the service over it) refused a call, or holds what no writer leaves.
    #[error("channel {channel:?}: {error}")]
    Group {
        /// The group's (or, for a fan-in fault met by the service, the fan-in channel's) name.
        channel: String,
        /// The refusal or the fault, with its values.
        #[source]
        error: crate::group::GroupError,
    },
    /// A slot index past the table.
    #[error("program slot {index}: no such slot (the mailbox has {count})")]
    NoSuchSlot {
        /// The slot index asked for.
        index: u32,
        /// Slots in the mailbox's table (valid indices are below it).
        count: u32,
    },
    /// Too many bindings for one program.
    #[error("program slot {index}: {count} channel bindings, at most {max}")]
    TooManyBindings {
        /// The program slot being bound.
        index: u32,
        /// Channel bindings asked for.
        count: usize,
        /// `MAX_BINDINGS`, what a slot and a `mesh_ctx` hold.
        max: usize,
    },
}

/// The reason of a [`ShmError::SlotLent`].
fn lent_text(lent: &Option<u64>) -> String {
    match lent {
        Some(seq) => format!(
            "message {seq}'s slot is still lent by this end (publish or discard a reserved slot, release or \
             unpeek a peeked message first)"
        ),
        None => "no slot is lent by this end (reserve or peek one first)".to_string(),
    }
}

/// The mailbox's result type.
pub type Result<T, E = ShmError> = std::result::Result<T, E>;
