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
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// `create` found a file there and was not asked to replace it.
    #[error("mailbox {path}: already exists (CreateMode::Replace overwrites it)")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// `open` found a header field or table that does not describe a valid mailbox.
    #[error("mailbox {path}: invalid {field}: {reason}")]
    Invalid {
        /// The file.
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
        /// The channel.
        name: String,
        /// Why.
        reason: String,
    },
    /// The channel table or the ring arena has no room left.
    #[error("channel {name:?}: mailbox full: {reason}")]
    Full {
        /// The channel being created.
        name: String,
        /// What ran out, with the numbers.
        reason: String,
    },
    /// A live process already holds that end.
    #[error("channel {channel:?}: {end} end already claimed by pid {pid}")]
    Claimed {
        /// The channel.
        channel: String,
        /// The end.
        end: End,
        /// The holder.
        pid: u32,
    },
    /// A message of the wrong size.
    #[error("channel {channel:?}: message of {got} bytes, the channel carries {size}-byte messages")]
    MessageSize {
        /// The channel.
        channel: String,
        /// The channel's message size.
        size: usize,
        /// What was given.
        got: usize,
    },
    /// A send or receive with a deadline ran out of time.
    #[error("channel {channel:?}: {op} timed out after {waited_ms} ms")]
    Timeout {
        /// The channel.
        channel: String,
        /// `send` or `recv`.
        op: &'static str,
        /// How long it waited.
        waited_ms: u128,
    },
    /// The ring's shared indices are impossible (a buggy writer or a corrupted file).
    #[error("channel {channel:?}: ring indices corrupt: head {head}, tail {tail}, capacity {capacity}")]
    Corrupt {
        /// The channel.
        channel: String,
        /// Producer index read.
        head: u64,
        /// Consumer index read.
        tail: u64,
        /// Ring capacity.
        capacity: u64,
    },
    /// A host process asked for an end of a channel whose ring is in GPU memory.
    #[error(
        "channel {channel:?}: its ring is in device memory (--placement device), so only GPU programs can \
         use its ends; a host process needs a channel created with --placement host"
    )]
    DevicePlacement {
        /// The channel.
        channel: String,
    },
    /// A kernel's context was asked for with a device channel whose ring this context has no address for.
    #[error(
        "channel {channel:?}: its ring is in device memory and the launching context has no address for it \
         (device channels work in blink mode; MPS mode does not share them yet)"
    )]
    NoDeviceRing {
        /// The channel.
        channel: String,
    },
    /// A slot index past the table.
    #[error("program slot {index}: no such slot (the mailbox has {count})")]
    NoSuchSlot {
        /// The index asked for.
        index: u32,
        /// Slots in the file.
        count: u32,
    },
    /// Too many bindings for one program.
    #[error("program slot {index}: {count} channel bindings, at most {max}")]
    TooManyBindings {
        /// The slot.
        index: u32,
        /// Bindings asked for.
        count: usize,
        /// The limit.
        max: usize,
    },
}

/// The mailbox's result type.
pub type Result<T, E = ShmError> = std::result::Result<T, E>;
