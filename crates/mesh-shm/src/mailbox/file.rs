//! Creating the mailbox file (mode 0600, zeroed, its header written) and opening one (everything validated before use).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::MmapRaw;

use super::geometry::{Geometry, MailboxConfig};
use super::handle::{CreateMode, Mailbox, Mapped, u32_of};
use crate::error::{Result, ShmError};
use crate::layout::{ChannelDesc, HEADER_SIZE, Header, LAYOUT_VERSION, MAGIC, Slot};
use crate::wait::WaitConfig;

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
            Ok(mapped) => Ok(Self { inner: Arc::new(mapped), wait: WaitConfig::default() }),
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
        let mailbox = Self { inner: Arc::new(Mapped { map, path, geometry }), wait: WaitConfig::default() };
        mailbox.validate_tables()?;
        Ok(mailbox)
    }
}

/// `HEADER_SIZE` as the header's 32-bit field stores it.
#[allow(clippy::cast_possible_truncation, reason = "4096")]
const HEADER_SIZE_U32: u32 = HEADER_SIZE as u32;
