//! A mailbox's geometry: where the slot table, the channel table and the ring arena lie, planned for a new file or validated from a header.

use crate::error::{Result, ShmError};
use crate::layout::{ChannelDesc, HEADER_SIZE, Header, LAYOUT_VERSION, LINE, MAGIC, Slot};

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
