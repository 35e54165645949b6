//! The mailbox handle (a shared mapping), what creating one takes, and the values it hands out: where a channel's slots live and what a channel is.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use memmap2::MmapRaw;

use super::geometry::Geometry;
use crate::layout::{Header, PLACEMENT_DEVICE, PLACEMENT_HOST};
use crate::protocol::Protocol;
use crate::wait::WaitConfig;

/// Whether `create` may overwrite an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// Refuse if the path exists.
    Exclusive,
    /// Remove whatever is there first.
    Replace,
}

/// A mapped mailbox. Cheap to clone; channel ends keep the mapping alive.
///
/// A handle also carries the [`WaitConfig`] that the ends claimed through it start with (the
/// process's default unless [`set_wait_config`](Mailbox::set_wait_config) changed it); a clone
/// carries a copy of it, and changing it changes no end already claimed.
#[derive(Debug, Clone)]
pub struct Mailbox {
    pub(super) inner: Arc<Mapped>,
    pub(super) wait: WaitConfig,
}

#[derive(Debug)]
pub(super) struct Mapped {
    pub(super) map: MmapRaw,
    pub(super) path: PathBuf,
    pub(super) geometry: Geometry,
}

/// Where a channel's message slots live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// In the mailbox, host memory mapped into every context: host processes and GPU programs alike.
    #[default]
    Host,
    /// In GPU memory that meshd owns: between GPU programs only, never crossing PCIe.
    Device,
}

impl Placement {
    /// The descriptor's value ([`PLACEMENT_HOST`] or [`PLACEMENT_DEVICE`]).
    pub fn code(self) -> u32 {
        match self {
            Placement::Host => PLACEMENT_HOST,
            Placement::Device => PLACEMENT_DEVICE,
        }
    }

    /// The placement a descriptor's value names, `None` for any other value.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            PLACEMENT_HOST => Some(Placement::Host),
            PLACEMENT_DEVICE => Some(Placement::Device),
            _ => None,
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::Host => "host",
            Placement::Device => "device",
        })
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "host" => Ok(Placement::Host),
            "device" => Ok(Placement::Device),
            other => Err(format!("placement {other:?}: must be host or device")),
        }
    }
}

/// A channel as the table describes it, with a snapshot of its indices and claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelInfo {
    /// Index in the descriptor table (what a program slot binds).
    pub index: u32,
    /// The name.
    pub name: String,
    /// Bytes per message.
    pub msg_size: u32,
    /// Messages the ring holds.
    pub capacity: u32,
    /// Offset of the ring's header (its indices and claims) from the file's start.
    pub ring_offset: u64,
    /// Where its message slots live.
    pub placement: Placement,
    /// The format of its slots.
    pub protocol: Protocol,
    /// Parts each message is split into (bulk; see `bulk`): 1 for every other protocol, and for a
    /// bulk channel in the format before parts existed. For a group: its entries (client slots), the
    /// descriptor's same word (see [`ChannelInfo::clients`]). For a fan-in channel: its shards (see
    /// [`ChannelInfo::shards`]).
    pub parts: u32,
    /// Offset of its message slots from the file's start (host placement; 0 for a device channel).
    pub slots_offset: u64,
    /// Messages lost with a device ring's slots over every renewal (always 0 for a host channel).
    pub lost: u64,
    /// Messages ever sent (for a bulk channel of more than one part, a lower bound over the parts;
    /// for a fan-in channel of shards, the sum of their cursors, modulo 2^64).
    pub head: u64,
    /// Messages ever received (for a bulk channel of more than one part, a lower bound over the parts;
    /// for a fan-in channel of shards, the sum of their tails, modulo 2^64).
    pub tail: u64,
    /// Pid holding the producer end, if any.
    pub producer_pid: Option<u32>,
    /// Pid holding the consumer end, if any.
    pub consumer_pid: Option<u32>,
}

impl ChannelInfo {
    /// A group's entries (client slots); `None` for a channel of any other protocol.
    pub fn clients(&self) -> Option<u32> {
        (self.protocol == Protocol::Group).then_some(self.parts)
    }

    /// A fan-in channel's shards (1: one ring, the format before shards existed); `None` for a
    /// channel of any other protocol.
    pub fn shards(&self) -> Option<u32> {
        (self.protocol == Protocol::FanIn).then_some(self.parts)
    }
}

impl Mailbox {
    /// How the ends claimed through this handle wait in their blocking calls (see [`WaitConfig`]).
    pub fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Sets how the ends claimed through this handle from now on wait in their blocking calls (each
    /// end can still be given its own afterwards).
    pub fn set_wait_config(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    /// This handle with `wait` as its ends' wait setting ([`Mailbox::set_wait_config`]).
    #[must_use]
    pub fn with_wait_config(mut self, wait: WaitConfig) -> Self {
        self.wait = wait;
        self
    }

    /// Records `pid` as the process serving this mailbox (0: none). Only for messages: whether an
    /// owner is alive is told by its lock on the file, not by this pid.
    pub fn set_owner_pid(&self, pid: u32) {
        self.header().owner_pid.store(pid, Ordering::Release);
    }

    /// The pid recorded by [`Mailbox::set_owner_pid`], `None` when none is recorded.
    pub fn owner_pid(&self) -> Option<u32> {
        Some(self.header().owner_pid.load(Ordering::Acquire)).filter(|&p| p != 0)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The validated geometry.
    pub fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    /// The mapping's host address and length (what a CUDA context registers).
    pub fn as_raw_parts(&self) -> (*mut u8, usize) {
        (self.inner.map.as_mut_ptr(), in_map(self.inner.geometry.file_size))
    }

    pub(super) fn base(&self) -> *mut u8 {
        self.inner.map.as_mut_ptr()
    }

    pub(super) fn header(&self) -> &Header {
        // SAFETY: validated: the header lies at offset 0 of a mapping of at least HEADER_SIZE bytes.
        // Its host-only mutable words are atomics; the others are never written after creation.
        unsafe { &*self.base().cast::<Header>() }
    }
}

/// An offset or length inside the mapping, as a `usize`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "offsets and file_size are validated against the mapping, whose length is a usize"
)]
pub(super) const fn in_map(off: u64) -> usize {
    off as usize
}

/// A slot or descriptor size, or a binding count, as the layout's 32-bit fields store it.
#[allow(
    clippy::cast_possible_truncation,
    reason = "layout sizes are at most 4096 and binding counts at most MAX_BINDINGS"
)]
pub(super) const fn u32_of(n: usize) -> u32 {
    n as u32
}
