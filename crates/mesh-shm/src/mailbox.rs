//! The mailbox file: creation, validation on open, the channel table and the program slots.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;

use crate::error::{Result, ShmError};
use crate::layout::*;
pub use crate::protocol::Protocol;
use crate::ring::RingMemory;

/// What `create` builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxConfig {
    /// Total file size in bytes (header, tables and ring arena).
    pub size: u64,
    /// Program slots.
    pub slots: u32,
    /// Channel descriptors (the most channels the file can ever hold).
    pub channels: u32,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        Self { size: 64 << 20, slots: 64, channels: 256 }
    }
}

/// Whether `create` may overwrite an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// Refuse if the path exists.
    Exclusive,
    /// Remove whatever is there first.
    Replace,
}

/// The validated geometry of a mailbox, copied out of its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// File size.
    pub file_size: u64,
    /// Program slots.
    pub slot_count: u32,
    /// Offset of the slot table.
    pub slots_offset: u64,
    /// Channel descriptors.
    pub channel_count: u32,
    /// Offset of the descriptor table.
    pub channels_offset: u64,
    /// Offset of the ring arena.
    pub arena_offset: u64,
    /// Size of the ring arena.
    pub arena_size: u64,
}

impl Geometry {
    /// Lays out a new file, or says which parameter does not fit.
    pub fn plan(config: &MailboxConfig) -> Result<Self> {
        let cfg_err = |m: String| Err(ShmError::Config(m));
        if config.slots == 0 || config.slots > 4096 {
            return cfg_err(format!("{} program slots: must be 1 to 4096", config.slots));
        }
        if config.channels == 0 || config.channels > 65536 {
            return cfg_err(format!("{} channels: must be 1 to 65536", config.channels));
        }
        let slots_offset = HEADER_SIZE;
        let channels_offset = slots_offset + u64::from(config.slots) * size_of::<Slot>() as u64;
        let tables_end = channels_offset + u64::from(config.channels) * size_of::<ChannelDesc>() as u64;
        let arena_offset = tables_end.div_ceil(4096) * 4096;
        if config.size < arena_offset + 4096 || config.size > (1 << 40) {
            return cfg_err(format!(
                "size {} bytes: {} slots and {} channels need at least {} bytes (and at most 1 TiB)",
                config.size,
                config.slots,
                config.channels,
                arena_offset + 4096
            ));
        }
        let file_size = config.size.div_ceil(4096) * 4096;
        Ok(Self {
            file_size,
            slot_count: config.slots,
            slots_offset,
            channel_count: config.channels,
            channels_offset,
            arena_offset,
            arena_size: file_size - arena_offset,
        })
    }

    /// Validates a header read from a file of `actual_len` bytes. Pure: reads only `header`.
    pub fn validate(header: &[u8], actual_len: u64) -> std::result::Result<Self, (&'static str, String)> {
        if header.len() < size_of::<Header>() || actual_len < HEADER_SIZE {
            return Err(("file size", format!("{actual_len} bytes, shorter than the {HEADER_SIZE}-byte header")));
        }
        let u32_at = |o: usize| u32::from_le_bytes(header[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().expect("8 bytes"));
        use core::mem::offset_of as off;
        let magic = u64_at(off!(Header, magic));
        if magic != MAGIC {
            return Err(("magic", format!("{magic:#018x}, expected {MAGIC:#018x} (not a meshd mailbox)")));
        }
        let version = u32_at(off!(Header, version));
        if version != LAYOUT_VERSION {
            return Err(("layout version", format!("{version}, this build reads version {LAYOUT_VERSION}")));
        }
        let header_size = u32_at(off!(Header, header_size));
        if u64::from(header_size) != HEADER_SIZE {
            return Err(("header size", format!("{header_size}, expected {HEADER_SIZE}")));
        }
        let file_size = u64_at(off!(Header, file_size));
        if file_size != actual_len {
            return Err((
                "file size",
                format!("header says {file_size} bytes, the file has {actual_len} (truncated?)"),
            ));
        }
        let slot_size = u32_at(off!(Header, slot_size));
        if slot_size as usize != size_of::<Slot>() {
            return Err(("slot size", format!("{slot_size}, expected {}", size_of::<Slot>())));
        }
        let desc_size = u32_at(off!(Header, channel_desc_size));
        if desc_size as usize != size_of::<ChannelDesc>() {
            return Err(("channel descriptor size", format!("{desc_size}, expected {}", size_of::<ChannelDesc>())));
        }
        let g = Self {
            file_size,
            slot_count: u32_at(off!(Header, slot_count)),
            slots_offset: u64_at(off!(Header, slots_offset)),
            channel_count: u32_at(off!(Header, channel_count)),
            channels_offset: u64_at(off!(Header, channels_offset)),
            arena_offset: u64_at(off!(Header, arena_offset)),
            arena_size: u64_at(off!(Header, arena_size)),
        };
        // Each region must be aligned, inside the file, after the header, and disjoint from the others.
        let regions = [
            ("slot table", g.slots_offset, u64::from(g.slot_count).checked_mul(u64::from(slot_size))),
            ("channel table", g.channels_offset, u64::from(g.channel_count).checked_mul(u64::from(desc_size))),
            ("ring arena", g.arena_offset, Some(g.arena_size)),
        ];
        for (i, &(name, offset, len)) in regions.iter().enumerate() {
            let len = len.ok_or((name, "size overflows".to_string()))?;
            let end = offset.checked_add(len).ok_or((name, format!("offset {offset} + size {len} overflows")))?;
            if offset % LINE != 0 {
                return Err((name, format!("offset {offset} is not {LINE}-byte aligned")));
            }
            if offset < HEADER_SIZE || end > file_size {
                return Err((name, format!("bytes {offset}..{end} lie outside {HEADER_SIZE}..{file_size}")));
            }
            for &(other, o_off, o_len) in &regions[..i] {
                let o_end = o_off + o_len.unwrap_or(0);
                if offset < o_end && o_off < end {
                    return Err((name, format!("bytes {offset}..{end} overlap the {other} at {o_off}..{o_end}")));
                }
            }
        }
        if g.slot_count == 0 {
            return Err(("slot table", "0 slots".into()));
        }
        Ok(g)
    }
}

/// A mapped mailbox. Cheap to clone; channel ends keep the mapping alive.
#[derive(Debug, Clone)]
pub struct Mailbox {
    pub(crate) inner: Arc<Mapped>,
}

#[derive(Debug)]
pub(crate) struct Mapped {
    map: MmapRaw,
    path: PathBuf,
    geometry: Geometry,
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

/// A live descriptor's fields, checked.
#[derive(Debug, Clone)]
struct LiveDesc {
    name: String,
    msg_size: u32,
    capacity: u32,
    ring_offset: u64,
    placement: Placement,
    protocol: Protocol,
    parts: u32,
    slots_offset: u64,
    /// Where its ring ends (checked to lie in the arena).
    end: u64,
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
    /// Creates the file (mode 0600), sizes and zeroes it, writes the header, maps it shared.
    pub fn create(path: impl AsRef<Path>, config: &MailboxConfig, mode: CreateMode) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let g = Geometry::plan(config)?;
        let io = |op, source| ShmError::Io { path: path.clone(), op, source };
        if mode == CreateMode::Replace {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("remove the old file", e)),
            }
        }
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                ShmError::Exists { path: path.clone() }
            } else {
                io("create", e)
            }
        })?;
        let built = (|| {
            // set_len on a new file yields zeroes: every slot, descriptor and ring starts empty.
            file.set_len(g.file_size).map_err(|e| io("set size", e))?;
            let map = MmapRaw::map_raw(&file).map_err(|e| io("map", e))?;
            let header = map.as_mut_ptr().cast::<Header>();
            // SAFETY: the mapping is at least HEADER_SIZE bytes, page aligned, and not yet shared
            // with anyone (the file was just created exclusively).
            unsafe {
                header.write(Header {
                    magic: MAGIC,
                    version: LAYOUT_VERSION,
                    header_size: HEADER_SIZE_U32,
                    file_size: g.file_size,
                    slot_count: g.slot_count,
                    slot_size: u32_of(size_of::<Slot>()),
                    slots_offset: g.slots_offset,
                    channel_count: g.channel_count,
                    channel_desc_size: u32_of(size_of::<ChannelDesc>()),
                    channels_offset: g.channels_offset,
                    arena_offset: g.arena_offset,
                    arena_size: g.arena_size,
                    arena_used: AtomicU64::new(0),
                    table_lock: AtomicU32::new(0),
                    creator_pid: std::process::id(),
                    owner_pid: AtomicU32::new(0),
                })
            };
            Ok(Mapped { map, path: path.clone(), geometry: g })
        })();
        match built {
            Ok(mapped) => Ok(Self { inner: Arc::new(mapped) }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Maps an existing mailbox after validating its header and every live channel.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |op, source| ShmError::Io { path: path.clone(), op, source };
        let file: File = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| io("open", e))?;
        let len = file.metadata().map_err(|e| io("stat", e))?.len();
        let mut head = vec![0u8; size_of::<Header>()];
        if len >= HEADER_SIZE {
            use std::os::unix::fs::FileExt;
            file.read_exact_at(&mut head, 0).map_err(|e| io("read the header", e))?;
        }
        let geometry = Geometry::validate(&head, len).map_err(|(field, reason)| ShmError::Invalid {
            path: path.clone(),
            field,
            reason,
        })?;
        let map = MmapRaw::map_raw(&file).map_err(|e| io("map", e))?;
        if (map.len() as u64) < geometry.file_size {
            return Err(ShmError::Invalid { path, field: "file size", reason: "shrank while being opened".into() });
        }
        let mailbox = Self { inner: Arc::new(Mapped { map, path, geometry }) };
        mailbox.validate_tables()?;
        Ok(mailbox)
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

    fn base(&self) -> *mut u8 {
        self.inner.map.as_mut_ptr()
    }

    fn header(&self) -> &Header {
        // SAFETY: validated: the header lies at offset 0 of a mapping of at least HEADER_SIZE bytes.
        // Its host-only mutable words are atomics; the others are never written after creation.
        unsafe { &*self.base().cast::<Header>() }
    }

    pub(crate) fn desc(&self, index: u32) -> &ChannelDesc {
        assert!(index < self.inner.geometry.channel_count, "descriptor index checked by callers");
        let off = self.inner.geometry.channels_offset + u64::from(index) * size_of::<ChannelDesc>() as u64;
        // SAFETY: the validated table lies inside the mapping; fields other than `state` are written
        // only before `state` is published with Release, and read after an Acquire load of it.
        unsafe { &*self.base().add(in_map(off)).cast::<ChannelDesc>() }
    }

    /// A descriptor's fields if it is live and describes a ring inside the arena.
    fn live_desc(&self, index: u32) -> std::result::Result<Option<LiveDesc>, String> {
        let d = self.desc(index);
        if d.state.load(Ordering::Acquire) != 1 {
            return Ok(None);
        }
        let (msg_size, capacity, ring_offset, slots_offset) = (d.msg_size, d.capacity, d.ring_offset, d.slots_offset);
        let protocol = Protocol::from_code(d.protocol).ok_or_else(|| {
            format!(
                "protocol {}: must be {PROTOCOL_LL} (ll), {PROTOCOL_BULK} (bulk), {PROTOCOL_INDEX} (index), \
                 {PROTOCOL_FANIN} (fanin) or {PROTOCOL_GROUP} (group); this build does not know its format, so \
                 neither its size nor its bounds (a newer meshd's channel?)",
                d.protocol
            )
        })?;
        // A 0 is a descriptor written before the field existed: one part, the format it has.
        let parts = d.parts.max(1);
        check_channel_params(msg_size, capacity, protocol)?;
        check_parts(msg_size, protocol, parts)?;
        let placement = Placement::from_code(d.placement).ok_or_else(|| {
            format!("placement {}: must be {PLACEMENT_HOST} (host) or {PLACEMENT_DEVICE} (device)", d.placement)
        })?;
        check_placement(protocol, placement)?;
        let g = self.inner.geometry;
        if ring_offset > g.arena_offset + g.arena_size {
            return Err(format!("ring at {ring_offset} lies past the arena's end {}", g.arena_offset + g.arena_size));
        }
        let end = ring_bytes_at(ring_offset, msg_size, capacity, placement.code(), protocol.code(), parts)
            .and_then(|bytes| ring_offset.checked_add(bytes))
            .ok_or("ring end overflows")?;
        if ring_offset % LINE != 0 || ring_offset < g.arena_offset || end > g.arena_offset + g.arena_size {
            return Err(format!(
                "ring at {ring_offset}..{end} is not a {LINE}-aligned range of the arena {}..{}",
                g.arena_offset,
                g.arena_offset + g.arena_size
            ));
        }
        let expected_slots = match placement {
            Placement::Host => host_slots_offset(ring_offset),
            Placement::Device => 0,
        };
        if slots_offset != expected_slots {
            return Err(format!(
                "slots at {slots_offset}: a {placement} ring whose header is at {ring_offset} has them at {expected_slots}"
            ));
        }
        Ok(Some(LiveDesc {
            name: decode_name(&d.name),
            msg_size,
            capacity,
            ring_offset,
            placement,
            protocol,
            parts,
            slots_offset,
            end,
        }))
    }

    fn validate_tables(&self) -> Result<()> {
        let invalid = |field, reason| ShmError::Invalid { path: self.inner.path.clone(), field, reason };
        let used = self.header().arena_used.load(Ordering::Acquire);
        if let Some(reason) = self.cursor_past_arena(used) {
            return Err(invalid("arena cursor", reason));
        }
        let mut rings = Vec::new();
        for i in 0..self.inner.geometry.channel_count {
            match self.live_desc(i) {
                Ok(Some(d)) => rings.push((d.ring_offset, d.end, i)),
                Ok(None) => {}
                Err(reason) => return Err(self.bad_desc(i, &reason)),
            }
        }
        rings.sort_unstable();
        for pair in rings.windows(2) {
            if pair[1].0 < pair[0].1 {
                return Err(invalid(
                    "channel table",
                    format!("rings of channels {} and {} overlap", pair[0].2, pair[1].2),
                ));
            }
        }
        Ok(())
    }

    /// Creates a named channel of `capacity` messages (a power of two) of `msg_size` bytes (a multiple of
    /// 8), its slots in the mailbox.
    pub fn create_channel(&self, name: &str, msg_size: u32, capacity: u32) -> Result<ChannelInfo> {
        self.create_channel_placed(name, msg_size, capacity, Placement::Host)
    }

    /// Creates a channel as [`Mailbox::create_channel`] does, its slots where `placement` says: for
    /// [`Placement::Device`] the mailbox holds only the ring's header (indices and claims), and the
    /// process that launches the programs provides the slots (see [`Mailbox::mesh_ctx_with`]).
    /// The protocol is [`Protocol::default_for`] the message size: see [`Mailbox::create_channel_with`].
    pub fn create_channel_placed(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
    ) -> Result<ChannelInfo> {
        self.create_channel_with(name, msg_size, capacity, placement, Protocol::default_for(msg_size))
    }

    /// Creates a channel as [`Mailbox::create_channel_placed`] does, its slots in the format `protocol`
    /// names: [`Protocol::Ll`] for messages up to 64 KiB (multiples of 8), [`Protocol::Bulk`] for
    /// messages of 16 B to 16 MiB (multiples of 16), [`Protocol::Index`] for messages of 8 B to 64 KiB
    /// (multiples of 8) between two host processes (host placement only; no program may bind it).
    /// Host ends of LL and index channels are [`crate::Producer`] and [`crate::Consumer`], of a bulk
    /// channel [`crate::BulkProducer`] and [`crate::BulkConsumer`]; GPU programs use mesh.cuh's
    /// `mesh_chan_*` (LL) and `mesh_block_*` (bulk) calls.
    pub fn create_channel_with(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
        protocol: Protocol,
    ) -> Result<ChannelInfo> {
        self.create_channel_parts(name, msg_size, capacity, placement, protocol, 1)
    }

    /// Creates a channel as [`Mailbox::create_channel_with`] does, every message split into `parts`
    /// parts (protocol bulk: a power of two from 1 to [`MAX_BULK_PARTS`], `msg_size` a multiple of
    /// 16 × `parts`; any other protocol: 1), so that up to `parts` GPU blocks serve each end, block
    /// `p` moving part `p` of every message (mesh.cuh's `mesh_bulk_open_part`). One part is the
    /// format of [`Mailbox::create_channel_with`]. The host ends serve every part.
    ///
    /// [`Protocol::FanIn`] is taken here too (what [`Mailbox::create_fanin`] does); a
    /// [`Protocol::Group`] needs its number of client slots: [`Mailbox::create_group`].
    pub fn create_channel_parts(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
        protocol: Protocol,
        parts: u32,
    ) -> Result<ChannelInfo> {
        if protocol == Protocol::Group {
            return Err(ShmError::ChannelConfig {
                name: name.to_string(),
                reason: "protocol group: a channel group is created with its number of client slots \
                         (Mailbox::create_group)"
                    .into(),
            });
        }
        self.create_ring(name, msg_size, capacity, placement, protocol, parts, |_, _| Ok(()))
    }

    /// Creates a fan-in channel (protocol fanin, host placement): any number of host producers
    /// ([`crate::FanInSender`], each sending as the id meshd handed it), one consumer (a GPU program,
    /// or a host server's [`crate::FanInReceiver`]); `msg_size` a multiple of 8 from 8 to 64 KiB,
    /// `capacity` a power of two. Its ring is an empty ring at position 0.
    ///
    /// `shards` (a power of two from 1 to [`MAX_FANIN_SHARDS`], in the descriptor's `parts` word)
    /// makes it that many whole rings of `capacity` slots each (`layout::fanin_shard_offset`), so
    /// that that many times as many senders go in parallel: each has its own cursor, and a client
    /// sends into shard `slot % shards`. One shard is the format of every fan-in channel before
    /// shards existed; a program or host end built before them refuses a channel of more.
    pub fn create_fanin(&self, name: &str, msg_size: u32, capacity: u32, shards: u32) -> Result<ChannelInfo> {
        self.create_ring(name, msg_size, capacity, Placement::Host, Protocol::FanIn, shards, |_, _| Ok(()))
    }

    /// Creates a channel group (protocol group, host placement): `clients` entries (client slots, 1
    /// to 65536), each with its own reply ring of `capacity` replies (a power of two) of `msg_size`
    /// bytes (a multiple of 8 from 8 to 64 KiB). Every entry starts free at epoch 0, every ring empty.
    /// meshd's side is [`crate::ServiceOwner`], the replying server's [`crate::GroupServer`], a
    /// client's [`crate::GroupClient`].
    pub fn create_group(&self, name: &str, clients: u32, msg_size: u32, capacity: u32) -> Result<ChannelInfo> {
        self.create_ring(name, msg_size, capacity, Placement::Host, Protocol::Group, clients, |region, offset| {
            let len = group_bytes(clients, msg_size, capacity);
            // SAFETY: `create_ring` hands us the channel's zeroed slots region, `len` bytes at `offset`
            // (page aligned), inside the arena and shared with no one until the descriptor is published.
            unsafe { crate::group::GroupMemory::create(region, len, offset, clients, msg_size, capacity) }
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    /// Creates a channel of any protocol: checks, carves its ring out of the arena under the table
    /// lock, zeroes its header (and, for fan-in and group, its whole slots region: their formats say
    /// that zeroed memory is an empty ring and free entries), lets `init` lay out the slots region
    /// (its address and file offset), then publishes the descriptor.
    #[allow(clippy::too_many_arguments, reason = "the descriptor's fields, and the protocol's layout step")]
    fn create_ring(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
        protocol: Protocol,
        parts: u32,
        init: impl FnOnce(NonNull<u8>, u64) -> std::result::Result<(), String>,
    ) -> Result<ChannelInfo> {
        let cfg = |reason: String| ShmError::ChannelConfig { name: name.to_string(), reason };
        let encoded =
            encode_name(name).ok_or_else(|| cfg(format!("name must be 1 to {NAME_LEN} bytes without NUL")))?;
        // A name is printed in tables and log lines and listed in `--bind a,b`: no control characters,
        // no spaces, no commas (a channel cannot be deleted, so a bad name would stay).
        if let Some(c) = name.chars().find(|&c| c.is_control() || c.is_whitespace() || c == ',') {
            return Err(cfg(format!("name may not hold control characters, spaces or commas (it holds {c:?})")));
        }
        check_channel_params(msg_size, capacity, protocol).map_err(cfg)?;
        check_parts(msg_size, protocol, parts).map_err(cfg)?;
        check_placement(protocol, placement).map_err(cfg)?;
        let _lock = TableLock::take(&self.header().table_lock);
        if self.find_channel(name)?.is_some() {
            return Err(ShmError::ChannelExists(name.to_string()));
        }
        let g = self.inner.geometry;
        let index =
            (0..g.channel_count).find(|&i| self.desc(i).state.load(Ordering::Acquire) == 0).ok_or_else(|| {
                ShmError::Full {
                    name: name.into(),
                    reason: format!("all {} channel descriptors are in use", g.channel_count),
                }
            })?;
        let used = self.header().arena_used.load(Ordering::Acquire);
        self.check_arena_cursor(used)?;
        let ring_offset = g.arena_offset + used;
        let need = ring_bytes_at(ring_offset, msg_size, capacity, placement.code(), protocol.code(), parts)
            .ok_or_else(|| cfg(format!("protocol {protocol}: no size in this build's layout")))?;
        if need > g.arena_size - used {
            return Err(ShmError::Full {
                name: name.into(),
                reason: format!(
                    "its ring needs {need} bytes, {} of the {}-byte arena are free",
                    g.arena_size - used,
                    g.arena_size
                ),
            });
        }
        let slots_offset = match placement {
            Placement::Host => host_slots_offset(ring_offset),
            Placement::Device => 0,
        };
        // SAFETY: the range lies in the arena (checked above) and belongs to no ring yet; the table lock
        // keeps any other creator out. Zeroed so that a reused file starts with empty indices and claims.
        unsafe { std::ptr::write_bytes(self.base().add(in_map(ring_offset)), 0, size_of::<RingHeader>()) };
        if placement == Placement::Host {
            // SAFETY: the slots region lies in the range just carved out of the arena (`need` counts
            // it), which no one else reaches before the descriptor is published below.
            let region = unsafe { NonNull::new_unchecked(self.base().add(in_map(slots_offset))) };
            if matches!(protocol, Protocol::FanIn | Protocol::Group) {
                let len = slot_bytes_for(msg_size, capacity, protocol.code(), parts).unwrap_or(0);
                // SAFETY: as above; `len` bytes from the slots offset end inside `need`.
                unsafe { std::ptr::write_bytes(region.as_ptr(), 0, in_map(len)) };
            }
            init(region, slots_offset).map_err(cfg)?;
        }
        let d = self.desc(index);
        let d_ptr = std::ptr::from_ref(d).cast_mut();
        // SAFETY: the descriptor is free (state 0), so no reader looks at these fields until the
        // Release store of `state` below; the table lock excludes other writers.
        unsafe {
            (&raw mut (*d_ptr).msg_size).write(msg_size);
            (&raw mut (*d_ptr).capacity).write(capacity);
            (&raw mut (*d_ptr).ring_offset).write(ring_offset);
            (&raw mut (*d_ptr).placement).write(placement.code());
            (&raw mut (*d_ptr).protocol).write(protocol.code());
            (&raw mut (*d_ptr).parts).write(parts);
            (&raw mut (*d_ptr).slots_offset).write(slots_offset);
            (&raw mut (*d_ptr).name).write(encoded);
        }
        self.header().arena_used.store(used + need, Ordering::Release);
        d.state.store(1, Ordering::Release);
        self.channel_info_at(index).map(|i| i.expect("just published"))
    }

    /// Checks the arena cursor `used` (read under the table lock) before a ring is carved out at it.
    /// It is a word of the shared header that any process mapping the file can overwrite after
    /// `open` checked it, and a wrong one would make the new ring overlap a live channel's (zeroing
    /// its indices and claims), sit off a line (every later `open` refuses the whole file), or lie
    /// past the arena, outside the mapping. So it must lie in the arena, on a line, and at or past
    /// the end of every live ring (channels are never deleted: the used part of the arena ends where
    /// the furthest ring ends). A descriptor that fails validation is that channel's fault and not
    /// counted, as in `find_channel`.
    fn check_arena_cursor(&self, used: u64) -> Result<()> {
        let g = self.inner.geometry;
        let furthest = (0..g.channel_count)
            .filter_map(|i| self.live_desc(i).ok().flatten())
            .map(|d| d.end)
            .fold(g.arena_offset, u64::max);
        let reason = if let Some(reason) = self.cursor_past_arena(used) {
            reason
        } else if !used.is_multiple_of(LINE) {
            format!("{used} bytes used, not a multiple of the {LINE}-byte line every ring starts on")
        } else if g.arena_offset + used < furthest {
            format!(
                "{used} bytes used, but the live rings reach byte {} of the arena: a ring made there would overlap them",
                furthest - g.arena_offset
            )
        } else {
            return Ok(());
        };
        Err(ShmError::Invalid {
            path: self.inner.path.clone(),
            field: "arena cursor",
            reason: format!("{reason} (another process overwrote the header?); no channel can be created in this file"),
        })
    }

    /// Why the arena cursor `used` cannot be right whatever the rings: it lies past the arena. The
    /// check `open` makes and every channel's creation makes again.
    fn cursor_past_arena(&self, used: u64) -> Option<String> {
        let size = self.inner.geometry.arena_size;
        (used > size).then(|| format!("{used} bytes used of a {size}-byte arena"))
    }

    fn find_channel(&self, name: &str) -> Result<Option<u32>> {
        for i in 0..self.inner.geometry.channel_count {
            // Only the descriptor of that name is validated: another one that a peer damaged after the
            // open is that channel's fault, and must not make every other channel unreachable.
            let d = self.desc(i);
            if d.state.load(Ordering::Acquire) != 1 || decode_name(&d.name) != name {
                continue;
            }
            match self.live_desc(i) {
                Ok(Some(d)) if d.name == name => return Ok(Some(i)),
                Ok(_) => {}
                Err(reason) => return Err(self.bad_desc(i, &reason)),
            }
        }
        Ok(None)
    }

    /// Descriptor `index` fails validation for `reason`: the error names it, by index and name.
    fn bad_desc(&self, index: u32, reason: &str) -> ShmError {
        let name = decode_name(&self.desc(index).name);
        ShmError::Invalid {
            path: self.inner.path.clone(),
            field: "channel table",
            reason: format!("channel {index} {name:?}: {reason}"),
        }
    }

    fn channel_info_at(&self, index: u32) -> Result<Option<ChannelInfo>> {
        let Some(LiveDesc { name, msg_size, capacity, ring_offset, placement, protocol, parts, slots_offset, .. }) =
            self.live_desc(index).map_err(|reason| self.bad_desc(index, &reason))?
        else {
            return Ok(None);
        };
        let ring = self.ring_header(ring_offset);
        let holder = |w: &AtomicU64| crate::claim::Holder::from_word(w.load(Ordering::Acquire)).map(|h| h.pid);
        let (mut head, mut tail) =
            (ring.producer.head.load(Ordering::Acquire), ring.consumer.tail.load(Ordering::Acquire));
        if protocol == Protocol::Bulk && parts > 1 && placement == Placement::Host {
            // The parts' own lines, which a GPU end publishes on every message (the header's only
            // when it closes): the lower bounds over them.
            (head, tail) = self.bulk_part_bounds(slots_offset, capacity, parts);
        }
        if protocol == Protocol::FanIn && parts > 1 {
            // Every shard's cursor and tail, summed: what the channel took in and gave out.
            let shards = self.fanin_memory_at(ring_offset, slots_offset, msg_size, capacity, parts);
            (head, tail) = (shards.next(), shards.tail());
        }
        Ok(Some(ChannelInfo {
            index,
            name,
            msg_size,
            capacity,
            ring_offset,
            placement,
            protocol,
            parts,
            slots_offset,
            lost: self.desc(index).lost.load(Ordering::Acquire),
            head,
            tail,
            producer_pid: holder(&ring.claims.producer),
            consumer_pid: holder(&ring.claims.consumer),
        }))
    }

    /// The live channel called `name`.
    pub fn channel(&self, name: &str) -> Result<ChannelInfo> {
        let index = self.find_channel(name)?.ok_or_else(|| ShmError::NoSuchChannel(name.to_string()))?;
        self.channel_info_at(index)?.ok_or_else(|| ShmError::NoSuchChannel(name.to_string()))
    }

    /// Every live channel, in table order; the first descriptor that fails validation fails the whole.
    pub fn channels(&self) -> Result<Vec<ChannelInfo>> {
        self.channels_each().into_iter().collect()
    }

    /// Every live channel, in table order, each descriptor on its own: one that fails validation (a
    /// peer process can write any descriptor at any time) is an error naming it, and the others are
    /// listed all the same. What a server that lists channels for everyone (meshd's `info`) reads.
    pub fn channels_each(&self) -> Vec<Result<ChannelInfo>> {
        (0..self.inner.geometry.channel_count).filter_map(|i| self.channel_info_at(i).transpose()).collect()
    }

    /// The smallest head and tail over the parts of a host bulk channel of more than one part, read
    /// from its index lines (each the furthest-behind part's, on the wrapping sequence line).
    fn bulk_part_bounds(&self, slots_offset: u64, capacity: u32, parts: u32) -> (u64, u64) {
        let lines = slots_offset + crate::layout::bulk_lines_offset(capacity, parts);
        let word = |line: u64| {
            // SAFETY: `live_desc` checked that the ring's slots, whose index lines these are
            // (`2 × parts` of them after the flags), lie in the arena of this mapping; lines are
            // 128-byte aligned (page-aligned slots) and only accessed atomically.
            unsafe { &*self.base().add(in_map(lines + line * LINE)).cast::<AtomicU64>() }.load(Ordering::Acquire)
        };
        let lowest = |first: u64| {
            (0..u64::from(parts))
                .map(|p| word(2 * p + first))
                .reduce(|m, x| if (m.wrapping_sub(x) as i64) > 0 { x } else { m })
        };
        (lowest(0).unwrap_or(0), lowest(1).unwrap_or(0))
    }

    /// The shards of a fan-in channel whose descriptor `live_desc` validated (host placement).
    fn fanin_memory_at(
        &self,
        ring_offset: u64,
        slots_offset: u64,
        msg_size: u32,
        capacity: u32,
        shards: u32,
    ) -> crate::fanin::FanInShards {
        let header = NonNull::from(self.ring_header(ring_offset));
        // SAFETY: as in `fanin_memory`: the validated descriptor's region holds every shard in the
        // arena of this mapping, which outlives the value (used at once, then dropped).
        unsafe {
            let region = NonNull::new_unchecked(self.base().add(in_map(slots_offset)));
            crate::fanin::FanInShards::new(header, region, msg_size, capacity, shards)
        }
    }

    pub(crate) fn ring_header(&self, ring_offset: u64) -> &RingHeader {
        // SAFETY: callers pass the offset of a live descriptor, checked by `live_desc` to lie in the arena.
        // The ring header holds only atomics.
        unsafe { &*self.base().add(in_map(ring_offset)).cast::<RingHeader>() }
    }

    /// The header and slots of host channel `info`, whose protocol must be `wanted`; a device
    /// channel's slots are not in this process's reach.
    fn host_ring(&self, info: &ChannelInfo, wanted: Protocol) -> Result<(NonNull<RingHeader>, NonNull<u8>)> {
        if info.placement != Placement::Host {
            return Err(ShmError::DevicePlacement { channel: info.name.clone() });
        }
        if info.protocol != wanted {
            return Err(ShmError::Protocol { channel: info.name.clone(), protocol: info.protocol, wanted });
        }
        let header = NonNull::from(self.ring_header(info.ring_offset));
        // SAFETY: the slots offset was validated with the descriptor: page aligned, after the header,
        // its protocol's slot bytes inside the arena.
        let slots = unsafe { NonNull::new_unchecked(self.base().add(in_map(info.slots_offset))) };
        Ok((header, slots))
    }

    /// The ring of a host channel of protocol ll.
    pub(crate) fn ring_memory(&self, info: &ChannelInfo) -> Result<RingMemory> {
        let (header, slots) = self.host_ring(info, Protocol::Ll)?;
        // SAFETY: `info` came from a validated descriptor: the header and its slots lie in the
        // arena of this mapping, which the caller keeps alive (ends hold the `Arc`).
        Ok(unsafe { RingMemory::new(header, slots.cast(), info.msg_size as usize, u64::from(info.capacity)) })
    }

    /// The ring of a host channel of protocol bulk.
    pub(crate) fn bulk_memory(&self, info: &ChannelInfo) -> Result<crate::bulk::BulkMemory> {
        let (header, slots) = self.host_ring(info, Protocol::Bulk)?;
        // SAFETY: `info` came from a validated descriptor (capacity a power of two up to 2^24, message
        // size a multiple of 16): the header and its slots lie in the arena of this mapping, which the
        // caller keeps alive (ends hold the `Arc`).
        Ok(unsafe {
            crate::bulk::BulkMemory::new(header, slots, info.msg_size as usize, u64::from(info.capacity), info.parts)
        })
    }

    /// The ring of a host channel of protocol index.
    pub(crate) fn index_memory(&self, info: &ChannelInfo) -> Result<crate::index_ring::IndexMemory> {
        let (header, slots) = self.host_ring(info, Protocol::Index)?;
        // SAFETY: `info` came from a validated descriptor (capacity a power of two, message size a
        // multiple of 8, slots page aligned): the header and its slots lie in the arena of this
        // mapping, which the caller keeps alive (ends hold the `Arc`).
        Ok(unsafe {
            crate::index_ring::IndexMemory::new(header, slots, info.msg_size as usize, u64::from(info.capacity))
        })
    }

    /// The rings of a host channel of protocol fanin: the core's view of every shard's header, owner
    /// table and slots (see `fanin`, `layout::fanin_shard_offset`), all in this mapping.
    pub(crate) fn fanin_memory(&self, info: &ChannelInfo) -> Result<crate::fanin::FanInShards> {
        let (header, region) = self.host_ring(info, Protocol::FanIn)?;
        // SAFETY: `info` came from a validated descriptor: its slots region (page aligned) holds
        // `fanin_region_bytes` for its shard count (a power of two up to MAX_FANIN_SHARDS,
        // `check_parts`) in the arena of this mapping, which the caller keeps alive (ends hold the
        // `Arc`). Capacity is a power of two up to 2^24 (< 2^31), msg_size a non-zero multiple of 8
        // (`check_channel_params`).
        Ok(unsafe { crate::fanin::FanInShards::new(header, region, info.msg_size, info.capacity, info.parts) })
    }

    /// The group of a host channel of protocol group, opened by the core (which validates its header
    /// and every entry's ring offset) and checked against the descriptor.
    pub(crate) fn group_memory(&self, info: &ChannelInfo) -> Result<crate::group::GroupMemory> {
        let (_, region) = self.host_ring(info, Protocol::Group)?;
        let group_err = |error| ShmError::Group { channel: info.name.clone(), error };
        let len = group_bytes(info.parts, info.msg_size, info.capacity);
        // SAFETY: `info` came from a validated descriptor: its slots region (page aligned, so 128-byte
        // aligned) holds `len` bytes in the arena of this mapping, which the caller keeps alive (ends
        // hold the `Arc`); `create_group` laid it out before publishing the descriptor, and its
        // write-once words are not written since. `open` checks what it reads against `len`.
        let group = unsafe { crate::group::GroupMemory::open(region, len, info.slots_offset) }.map_err(group_err)?;
        let (entries, msg_size, capacity) = (group.entries(), group.msg_size(), group.capacity());
        if (entries, msg_size, capacity) != (info.parts, info.msg_size as usize, info.capacity) {
            return Err(group_err(crate::group::GroupError::Invalid {
                field: "header",
                reason: format!(
                    "{entries} entries of {capacity} replies of {msg_size} bytes, but the descriptor says {} of {} of {}",
                    info.parts, info.capacity, info.msg_size
                ),
            }));
        }
        Ok(group)
    }

    /// The live channel called `name`, for a GPU program to bind: refused, naming it and why, when
    /// its protocol is one no GPU program speaks ([`Protocol::Index`]). Backends resolve a load's
    /// bindings with it before they change anything.
    pub fn channel_for_program(&self, name: &str) -> Result<ChannelInfo> {
        let info = self.channel(name)?;
        if !info.protocol.gpu_bindable() {
            return Err(ShmError::HostOnly { channel: info.name, protocol: info.protocol });
        }
        Ok(info)
    }

    /// A device channel's ring got new, empty slots (meshd started, or its context was recreated after a
    /// fault): both indices move to the larger of the two, so that its ends resume on an empty ring.
    /// Returns how many messages the lost slots held by the published indices: `head - tail`, exact
    /// when both ends had closed their channels, a lower bound otherwise (a GPU end publishes its
    /// index in batches of half a ring). Call it only while no program bound to it runs.
    pub fn renew_device_ring(&self, info: &ChannelInfo) -> Result<u64> {
        if info.placement != Placement::Device {
            return Err(ShmError::ChannelConfig {
                name: info.name.clone(),
                reason: "only a device channel's slots can be renewed".into(),
            });
        }
        let ring = self.ring_header(info.ring_offset);
        let head = ring.producer.head.load(Ordering::Acquire);
        let tail = ring.consumer.tail.load(Ordering::Acquire);
        let lost = head.saturating_sub(tail);
        let at = head.max(tail);
        ring.producer.head.store(at, Ordering::Release);
        ring.consumer.tail.store(at, Ordering::Release);
        self.desc(info.index).lost.fetch_add(lost, Ordering::AcqRel);
        Ok(lost)
    }

    /// Program slot `index`.
    pub fn slot(&self, index: u32) -> Result<SlotRef<'_>> {
        let count = self.inner.geometry.slot_count;
        if index >= count {
            return Err(ShmError::NoSuchSlot { index, count });
        }
        Ok(SlotRef { mailbox: self, index })
    }

    /// Every live channel slot `index` binds (the channels its kernel's context will name).
    pub fn bound_channels(&self, index: u32) -> Result<Vec<ChannelInfo>> {
        let slot = self.slot(index)?;
        let mut out = Vec::new();
        for channel in slot.bindings() {
            if channel >= self.inner.geometry.channel_count {
                return Err(ShmError::NoSuchChannel(format!("#{channel}")));
            }
            out.push(self.channel_info_at(channel)?.ok_or_else(|| ShmError::NoSuchChannel(format!("#{channel}")))?);
        }
        Ok(out)
    }

    /// The kernel's argument for slot `index`, with `base` the mailbox's device address in the launching
    /// context. A binding to a device channel is refused: see [`Mailbox::mesh_ctx_with`].
    pub fn mesh_ctx(&self, index: u32, base: u64) -> Result<MeshCtx> {
        self.mesh_ctx_with(index, base, |_| None)
    }

    /// The kernel's argument for slot `index`, with `base` the mailbox's device address in the launching
    /// context and `device_slots` the device address, in that context, of a device channel's slots
    /// (`None`: this context has none, and the binding is refused).
    pub fn mesh_ctx_with(
        &self,
        index: u32,
        base: u64,
        device_slots: impl Fn(&ChannelInfo) -> Option<u64>,
    ) -> Result<MeshCtx> {
        let slot = self.slot(index)?;
        let mut ctx = MeshCtx { base, slot_offset: slot.offset(), slot: index, ..MeshCtx::default() };
        let bindings = slot.bindings();
        ctx.binding_count = u32_of(bindings.len());
        for (b, &channel) in ctx.bindings.iter_mut().zip(&bindings) {
            if channel >= self.inner.geometry.channel_count {
                return Err(ShmError::NoSuchChannel(format!("#{channel}")));
            }
            let info = self.channel_info_at(channel)?.ok_or_else(|| ShmError::NoSuchChannel(format!("#{channel}")))?;
            if !info.protocol.gpu_bindable() {
                return Err(ShmError::HostOnly { channel: info.name, protocol: info.protocol });
            }
            let slots = match info.placement {
                // A fan-in binding names its LL slots (the owner table before them is host only); a
                // group's names its header, from which a program reads the rest.
                Placement::Host if info.protocol == Protocol::FanIn => {
                    base + info.slots_offset + fanin_slots_offset(info.capacity)
                }
                Placement::Host => base + info.slots_offset,
                Placement::Device => {
                    device_slots(&info).ok_or_else(|| ShmError::NoDeviceRing { channel: info.name.clone() })?
                }
            };
            *b = MeshBinding {
                ring_offset: info.ring_offset,
                slots,
                msg_size: info.msg_size,
                capacity: info.capacity,
                placement: info.placement.code(),
                protocol: binding_protocol(info.protocol.code(), info.parts),
            };
        }
        Ok(ctx)
    }
}

/// Checks a channel's message size and capacity.
/// `HEADER_SIZE` as the header's 32-bit field stores it.
#[allow(clippy::cast_possible_truncation, reason = "4096")]
const HEADER_SIZE_U32: u32 = HEADER_SIZE as u32;

/// An offset or length inside the mapping, as a `usize`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "offsets and file_size are validated against the mapping, whose length is a usize"
)]
const fn in_map(off: u64) -> usize {
    off as usize
}

/// A slot or descriptor size, or a binding count, as the layout's 32-bit fields store it.
#[allow(
    clippy::cast_possible_truncation,
    reason = "layout sizes are at most 4096 and binding counts at most MAX_BINDINGS"
)]
const fn u32_of(n: usize) -> u32 {
    n as u32
}

fn check_channel_params(msg_size: u32, capacity: u32, protocol: Protocol) -> std::result::Result<(), String> {
    match protocol {
        Protocol::Ll | Protocol::Index | Protocol::FanIn | Protocol::Group
            if msg_size == 0 || !msg_size.is_multiple_of(8) || msg_size > MAX_MSG_SIZE =>
        {
            return Err(format!(
                "message size {msg_size}: must be a multiple of 8 from 8 to {MAX_MSG_SIZE} for protocol {protocol} \
                 (protocol bulk carries up to {MAX_BULK_MSG_SIZE})"
            ));
        }
        Protocol::Bulk if msg_size == 0 || !msg_size.is_multiple_of(BULK_MSG_ALIGN) || msg_size > MAX_BULK_MSG_SIZE => {
            return Err(format!(
                "message size {msg_size}: must be a multiple of {BULK_MSG_ALIGN} from {BULK_MSG_ALIGN} to \
                 {MAX_BULK_MSG_SIZE} (16 MiB) for protocol bulk"
            ));
        }
        _ => {}
    }
    if !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
        return Err(format!("capacity {capacity}: must be a power of two up to {MAX_CAPACITY}"));
    }
    Ok(())
}

/// Checks a channel's parts word: for protocol bulk its parts, a power of two from 1 to
/// [`MAX_BULK_PARTS`], the message size a multiple of 16 × parts (every part a whole number of the
/// 16-byte vector copies); for protocol fanin its shards, a power of two from 1 to
/// [`MAX_FANIN_SHARDS`]; for a group its entries; 1 for ll and index.
fn check_parts(msg_size: u32, protocol: Protocol, parts: u32) -> std::result::Result<(), String> {
    if protocol == Protocol::Group {
        // A group's word is its entry count.
        let max = crate::group::MAX_ENTRIES;
        if parts == 0 || parts > max {
            return Err(format!("{parts} client slots: a group has 1 to {max} (a client id keeps 16 bits of slot)"));
        }
        return Ok(());
    }
    if parts == 1 {
        return Ok(());
    }
    if protocol == Protocol::FanIn {
        // A fan-in channel's word is its shard count: whole rings, so any message size goes.
        if !parts.is_power_of_two() || parts > MAX_FANIN_SHARDS {
            return Err(format!(
                "{parts} shards: a fan-in channel has a power of two from 1 to {MAX_FANIN_SHARDS} shards"
            ));
        }
        return Ok(());
    }
    if protocol != Protocol::Bulk {
        return Err(format!(
            "parts {parts}: only a channel of protocol bulk splits its messages into parts (and only a fan-in \
             channel has shards; this one is protocol {protocol}); leave parts at 1"
        ));
    }
    if !parts.is_power_of_two() || parts > MAX_BULK_PARTS {
        return Err(format!("parts {parts}: must be a power of two from 1 to {MAX_BULK_PARTS}"));
    }
    if !msg_size.is_multiple_of(BULK_MSG_ALIGN * parts) {
        return Err(format!(
            "message size {msg_size}: with {parts} parts it must be a multiple of {} ({BULK_MSG_ALIGN} × parts), so \
             that every part is a whole number of 16-byte units",
            BULK_MSG_ALIGN * parts
        ));
    }
    Ok(())
}

/// Checks that a channel of `protocol` can live where `placement` says: an index channel's two ends
/// are host processes, so its slots are in host memory.
fn check_placement(protocol: Protocol, placement: Placement) -> std::result::Result<(), String> {
    if matches!(protocol, Protocol::FanIn | Protocol::Group) && placement != Placement::Host {
        return Err(format!(
            "placement {placement}: protocol {protocol} has host processes at one end (the clients), and its \
             host-only words (owner table, entry holders) must be in the mailbox: host placement only"
        ));
    }
    if protocol == Protocol::Index && placement != Placement::Host {
        return Err(format!(
            "placement {placement}: protocol index is for two host processes, so its slots must be in host memory \
             (--placement host); a device ring is for GPU programs (protocol ll or bulk)"
        ));
    }
    Ok(())
}

/// The host-only spin lock over the channel table; a holder that died leaves it taken for 1 s at most.
struct TableLock<'a>(&'a AtomicU32);

impl<'a> TableLock<'a> {
    fn take(word: &'a AtomicU32) -> Self {
        let me = std::process::id();
        let start = std::time::Instant::now();
        loop {
            match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Self(word),
                Err(holder) => {
                    let dead = crate::claim::pid_of(holder)
                        .is_none_or(|p| rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH));
                    if (dead || start.elapsed().as_secs() >= 1)
                        && word.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
                    {
                        return Self(word);
                    }
                    std::thread::yield_now();
                }
            }
        }
    }
}

impl Drop for TableLock<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

/// A consistent-enough snapshot of a slot's kernel-written status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotStatusSnapshot {
    /// The kernel's loop counter.
    pub heartbeat: u64,
    /// One of the `STATE_*` values.
    pub state: u32,
    /// The code passed to mesh_exit.
    pub exit_code: i32,
    /// The generation the kernel saw at start.
    pub generation: u32,
}

/// A program slot: meshd's side writes control, reads status.
#[derive(Debug, Clone, Copy)]
pub struct SlotRef<'a> {
    mailbox: &'a Mailbox,
    index: u32,
}

impl SlotRef<'_> {
    /// The slot's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Offset of the slot from the file's start.
    pub fn offset(&self) -> u64 {
        self.mailbox.inner.geometry.slots_offset + u64::from(self.index) * size_of::<Slot>() as u64
    }

    fn ptr(&self) -> *mut Slot {
        // SAFETY: `index` was checked against the validated slot table, which lies in the mapping.
        unsafe { self.mailbox.base().add(in_map(self.offset())).cast::<Slot>() }
    }

    /// One 32-bit word of this slot as an atomic.
    ///
    /// # Safety
    /// `field` must point at a 4-aligned `u32` inside this slot (a field projected from
    /// [`SlotRef::ptr`]), which the host accesses only atomically (the GPU's accesses are outside
    /// Rust's model).
    unsafe fn word32(&self, field: *mut u32) -> &AtomicU32 {
        // SAFETY: the caller's contract: the word lies in the mapping, which outlives `&self`.
        unsafe { AtomicU32::from_ptr(field) }
    }

    /// Asks the kernel to stop (`mesh_should_stop` becomes true).
    pub fn request_stop(&self) {
        // SAFETY: the slot pointer is valid and `control.stop` a 4-aligned u32 of it, used only
        // atomically by the host; `&raw mut` takes the field's address without a reference.
        unsafe { self.word32(&raw mut (*self.ptr()).control.stop) }.store(1, Ordering::Release);
    }

    /// Whether a stop is requested.
    pub fn stop_requested(&self) -> bool {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.stop) }.load(Ordering::Acquire) != 0
    }

    /// Prepares a (re)launch: clears the stop request, sets the generation, marks the kernel idle.
    /// The heartbeat and user words are kept, so that a program's counters continue across blinks.
    /// Only call while no kernel runs in this slot (the status words have no other writer then).
    pub fn arm(&self, generation: u32) {
        let p = self.ptr();
        // SAFETY: the slot is valid; with no kernel running meshd is the only writer of every word.
        unsafe {
            self.word32(&raw mut (*p).control.generation).store(generation, Ordering::Relaxed);
            self.word32(&raw mut (*p).control.stop).store(0, Ordering::Relaxed);
            self.word32(&raw mut (*p).status.state).store(STATE_IDLE, Ordering::Relaxed);
            self.word32((&raw mut (*p).status.exit_code).cast()).store(0, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Zeroes the kernel-written status and user words, for a program new to the slot.
    /// Only call while no kernel runs in this slot.
    pub fn reset_status(&self) {
        let p = self.ptr();
        // SAFETY: the slot is valid; with no kernel running meshd is the only writer of every word.
        unsafe {
            AtomicU64::from_ptr(&raw mut (*p).status.heartbeat).store(0, Ordering::Relaxed);
            self.word32(&raw mut (*p).status.generation).store(0, Ordering::Relaxed);
            for w in 0..32 {
                self.word32((&raw mut (*p).user.words).cast::<u32>().add(w)).store(0, Ordering::Relaxed);
            }
        }
        self.arm(0);
    }

    /// Takes the slot for a program: name and channel bindings (indices in the channel table).
    pub fn bind(&self, name: &str, bindings: &[u32]) -> Result<()> {
        if bindings.len() > MAX_BINDINGS {
            return Err(ShmError::TooManyBindings { index: self.index, count: bindings.len(), max: MAX_BINDINGS });
        }
        let p = self.ptr();
        let mut name_field = [0u8; NAME_LEN];
        let n = name.len().min(NAME_LEN);
        name_field[..n].copy_from_slice(&name.as_bytes()[..n]);
        // SAFETY: meshd is the only writer of the control line; the kernel is not running while a slot is bound.
        unsafe {
            for (i, w) in name_field.chunks_exact(4).enumerate() {
                let word = u32::from_ne_bytes(w.try_into().expect("4 bytes"));
                self.word32((&raw mut (*p).control.name).cast::<u32>().add(i)).store(word, Ordering::Relaxed);
            }
            for i in 0..MAX_BINDINGS {
                let v = bindings.get(i).copied().unwrap_or(NO_CHANNEL);
                self.word32((&raw mut (*p).control.bindings).cast::<u32>().add(i)).store(v, Ordering::Relaxed);
            }
            self.word32(&raw mut (*p).control.binding_count).store(u32_of(bindings.len()), Ordering::Relaxed);
            self.word32(&raw mut (*p).control.in_use).store(1, Ordering::Release);
        }
        Ok(())
    }

    /// Frees the slot.
    pub fn release(&self) {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.in_use) }.store(0, Ordering::Release);
    }

    /// Whether a program owns the slot.
    pub fn in_use(&self) -> bool {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.in_use) }.load(Ordering::Acquire) != 0
    }

    /// The generation meshd last armed.
    pub fn generation(&self) -> u32 {
        // SAFETY: as in `request_stop`.
        unsafe { self.word32(&raw mut (*self.ptr()).control.generation) }.load(Ordering::Acquire)
    }

    /// The channel indices bound to the slot.
    pub fn bindings(&self) -> Vec<u32> {
        let p = self.ptr();
        // SAFETY: as in `request_stop`.
        let count = unsafe { self.word32(&raw mut (*p).control.binding_count) }.load(Ordering::Acquire) as usize;
        (0..count.min(MAX_BINDINGS))
            .map(|i| {
                // SAFETY: `i < MAX_BINDINGS`, inside the array.
                unsafe { self.word32((&raw mut (*p).control.bindings).cast::<u32>().add(i)) }.load(Ordering::Relaxed)
            })
            .collect()
    }

    /// The kernel-written status.
    pub fn status(&self) -> SlotStatusSnapshot {
        let p = self.ptr();
        // SAFETY: the slot is valid; host reads of kernel-written words are atomic loads.
        unsafe {
            SlotStatusSnapshot {
                heartbeat: AtomicU64::from_ptr(&raw mut (*p).status.heartbeat).load(Ordering::Acquire),
                state: self.word32(&raw mut (*p).status.state).load(Ordering::Acquire),
                exit_code: self.word32((&raw mut (*p).status.exit_code).cast()).load(Ordering::Acquire) as i32,
                generation: self.word32(&raw mut (*p).status.generation).load(Ordering::Acquire),
            }
        }
    }

    /// The kernel-written user words.
    pub fn user_words(&self) -> [u32; 32] {
        let p = self.ptr();
        let mut out = [0u32; 32];
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: `i < 32`, inside the user line.
            *o = unsafe { self.word32((&raw mut (*p).user.words).cast::<u32>().add(i)) }.load(Ordering::Acquire);
        }
        out
    }
}
