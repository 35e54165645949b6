//! A group's memory: its header, its table of client slots (one line meshd writes, one the program writes), its reply rings, and the ids, snapshots and errors they give.

use core::mem::{offset_of, size_of};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::claim::Holder;
use crate::fanin::FanInCorrupt;
use crate::indices::Corrupt;
use crate::layout::{self, LINE, MAX_CAPACITY, MAX_MSG_SIZE, RingHeader};
use crate::ring::RingMemory;

/// The alignment of a group's memory: a line, so that each writer's words have lines of their own.
const ALIGN: usize = 128;
const _: () = assert!(ALIGN as u64 == LINE);

/// The most entries a group can have: the client id keeps the slot in 16 bits.
pub const MAX_ENTRIES: u32 = layout::MAX_GROUP_ENTRIES;

/// The group's header: one line, written by meshd only.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct GroupHeader {
    /// Entries (client slots) in the table; written once at creation.
    pub entries: u32,
    /// Payload bytes of a reply; written once.
    pub msg_size: u32,
    /// Replies each reply ring holds (a power of two); written once.
    pub capacity: u32,
    /// Zero.
    pub reserved: u32,
    /// Bytes from one reply ring's header to the next ([`GroupMemory::ring_stride`]); written once.
    pub ring_stride: u64,
    /// Bumped (Release) after every connect and every departure: the program polls this one word and
    /// scans the table only when it has moved.
    pub changes: AtomicU64,
}

/// meshd's line of an entry: host-written only.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct EntryMeshdLine {
    /// The epoch of the current or last client (low half) and the [`EntryState`] (high half): the
    /// design's `epoch u32, state u32`, adjacent, so that one 8-byte load reads both consistently.
    pub binding: AtomicU64,
    /// The bound client's [`Holder`] word (host only: for meshd's own checks after a restart).
    pub holder: AtomicU64,
    /// Offset of this entry's reply ring's [`RingHeader`] from the start of the file (or, over plain
    /// memory, from the offset given to [`GroupMemory::create`]); written once.
    pub reply_ring_offset: u64,
}

/// The program's line of an entry: its only writer is the program.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct EntryProgramLine {
    /// The last epoch whose departure the program has processed (Release: its reply ring's `head`
    /// was published exactly before). Equal to the entry's epoch: the entry may be handed out.
    pub acked_epoch: AtomicU32,
}

/// One client slot of the table: two lines, one writer each.
#[repr(C)]
#[derive(Debug)]
pub struct GroupEntry {
    /// meshd's line.
    pub meshd: EntryMeshdLine,
    /// The program's line.
    pub program: EntryProgramLine,
}

// The sizes `layout`'s formulas count the group by ([`layout::group_bytes`]).
const _: () = assert!(size_of::<GroupHeader>() as u64 == layout::GROUP_HEADER_BYTES);
const _: () = assert!(offset_of!(GroupHeader, changes) == 24);
const _: () = assert!(size_of::<GroupEntry>() as u64 == layout::GROUP_ENTRY_BYTES);
const _: () = assert!(offset_of!(GroupEntry, program) as u64 == LINE);
const _: () = assert!(offset_of!(EntryMeshdLine, holder) == 8 && offset_of!(EntryMeshdLine, reply_ring_offset) == 16);

/// Where an entry stands, in the high half of its binding word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Never handed out (zeroed memory).
    Free = 0,
    /// Bound to a client.
    Bound = 1,
    /// Its client has gone; reusable once the program acknowledges the epoch.
    Departed = 2,
}

pub(super) const fn binding(epoch: u32, state: EntryState) -> u64 {
    epoch as u64 | (state as u64) << 32
}

/// The epoch and state of a binding word; `None` for a state no meshd writes.
#[allow(clippy::cast_possible_truncation, reason = "the word packs the epoch in its low half")]
pub(super) fn decode(word: u64) -> Option<(u32, EntryState)> {
    let state = match word >> 32 {
        0 => EntryState::Free,
        1 => EntryState::Bound,
        2 => EntryState::Departed,
        _ => return None,
    };
    Some((word as u32, state))
}

/// A client's id as it travels in the fan-in ring's sender word: `slot | epoch << 16`, the epoch
/// kept to its low 16 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u32);

impl ClientId {
    /// The id of the client bound to entry `slot` at `epoch`.
    pub const fn new(slot: u16, epoch: u32) -> Self {
        Self(slot as u32 | (epoch & 0xffff) << 16)
    }

    /// Its entry.
    #[allow(clippy::cast_possible_truncation, reason = "the slot is the low 16 bits")]
    pub const fn slot(self) -> u16 {
        self.0 as u16
    }

    /// The low 16 bits of its epoch.
    #[allow(clippy::cast_possible_truncation, reason = "the epoch is the high 16 bits")]
    pub const fn epoch16(self) -> u16 {
        (self.0 >> 16) as u16
    }
}

/// A departure the program has not yet acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Departed {
    /// The entry.
    pub slot: u16,
    /// The departed client's epoch (all 32 bits: what the acknowledgement stores).
    pub epoch: u32,
}

impl Departed {
    /// The departed client's id.
    pub const fn id(self) -> ClientId {
        ClientId::new(self.slot, self.epoch)
    }
}

/// What became of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replied {
    /// In the client's reply ring.
    Sent,
    /// The client's reply ring is full (the client is slow): nothing written; the program decides
    /// whether to retry or drop.
    Full,
    /// The client has gone (or the id's epoch is not the entry's bound one): dropped.
    Gone,
}

/// An entry as it stands (for meshd's `ps` and the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntrySnapshot {
    /// The epoch of the current or last client.
    pub epoch: u32,
    /// Where the entry stands.
    pub state: EntryState,
    /// The last epoch the program acknowledged.
    pub acked_epoch: u32,
    /// The current or last client.
    pub holder: Option<Holder>,
}

/// What the group (or the service over it) refuses or finds wrong. Words a peer process can write
/// are reported here, never followed or panicked on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// Connect refused: every entry is bound to a client.
    #[error("service group: all {entries} entries are bound to clients")]
    AllBound {
        /// Entries in the table.
        entries: u32,
    },
    /// Connect refused: no entry is free, and some wait for the program to acknowledge their last
    /// client's departure (a program that is not running, or that ignores departures, keeps them).
    #[error(
        "service group: no free entry: {bound} of {entries} bound, {awaiting_ack} departed and not yet \
         acknowledged by the program (is it running, and does it handle departures?)"
    )]
    AwaitingAck {
        /// Entries in the table.
        entries: u32,
        /// Entries bound to clients.
        bound: u32,
        /// Entries whose departure the program has not acknowledged.
        awaiting_ack: u32,
    },
    /// A field of the header or of an entry does not describe a valid group.
    #[error("service group: invalid {field}: {reason}")]
    Invalid {
        /// The field at fault.
        field: &'static str,
        /// The values and why they are wrong.
        reason: String,
    },
    /// An entry's binding word holds a state no meshd writes.
    #[error("service group: entry {slot}: binding word {word:#x} has state {}, not 0 free, 1 bound or 2 departed", word >> 32)]
    BadState {
        /// The entry.
        slot: u16,
        /// Its binding word.
        word: u64,
    },
    /// A client id names an entry beyond the table (a forged or corrupt sender word).
    #[error("service group: client id {id:#x} names entry {}, beyond the group's {entries}", id & 0xffff)]
    UnknownClient {
        /// The id.
        id: u32,
        /// Entries in the table.
        entries: u32,
    },
    /// meshd was asked to depart a client that is not the entry's bound one.
    #[error("service group: client {id:#x} is not bound (its entry holds epoch {epoch}, {state:?})")]
    NotBound {
        /// The id.
        id: u32,
        /// The entry's epoch.
        epoch: u32,
        /// The entry's state.
        state: EntryState,
    },
    /// A reply ring's indices are impossible.
    #[error("service group: reply ring {slot}: head {} is more than a ring ahead of tail {}", corrupt.head, corrupt.tail)]
    Ring {
        /// The entry.
        slot: u16,
        /// The indices read.
        corrupt: Corrupt,
    },
    /// The fan-in ring holds what no producer or consumer can have left.
    #[error("service fan-in ring: {0:?}")]
    FanIn(FanInCorrupt),
    /// A live client that detaches is between the begin and the commit of a send: its fan-in slot
    /// cannot be completed while it lives, so its entry is not departed yet.
    #[error("service group: client {id:#x} detached in the middle of a send ({stuck} slot(s)); its entry stays bound")]
    StillSending {
        /// The id.
        id: u32,
        /// Its fan-in slots between begin and commit.
        stuck: u32,
    },
    /// A message longer than the ring's message size.
    #[error("message of {len} bytes, longer than the {msg_size} bytes of the ring")]
    TooLong {
        /// The message's length.
        len: usize,
        /// The ring's message size.
        msg_size: usize,
    },
    /// A receive buffer that is not one message long.
    #[error("buffer of {len} bytes; a message is {msg_size}")]
    BadBuffer {
        /// The buffer's length.
        len: usize,
        /// The ring's message size.
        msg_size: usize,
    },
    /// A blocking call's timeout passed.
    #[error("timed out")]
    Timeout,
}

impl From<FanInCorrupt> for GroupError {
    fn from(c: FanInCorrupt) -> Self {
        Self::FanIn(c)
    }
}

/// A group's memory and geometry (read once, at creation or open).
#[derive(Debug, Clone, Copy)]
pub struct GroupMemory {
    base: NonNull<u8>,
    entries: u32,
    msg_size: u32,
    capacity: u32,
    ring_stride: u64,
    offset: u64,
}

// SAFETY: the group is shared memory by design; after creation every access goes through atomics
// (the write-once fields were copied at creation or open), and the protocol gives each word one writer.
unsafe impl Send for GroupMemory {}
// SAFETY: as above; `&GroupMemory` exposes only the same atomic accesses.
unsafe impl Sync for GroupMemory {}

/// Why a geometry is refused, if it is.
fn check_geometry(entries: u32, msg_size: u32, capacity: u32) -> Result<(), GroupError> {
    let invalid = |field, reason: String| Err(GroupError::Invalid { field, reason });
    if entries == 0 || entries > MAX_ENTRIES {
        return invalid("entries", format!("{entries}: must be 1 to {MAX_ENTRIES} (the id keeps 16 bits of slot)"));
    }
    if msg_size == 0 || !msg_size.is_multiple_of(8) || msg_size > MAX_MSG_SIZE {
        return invalid("msg_size", format!("{msg_size}: must be a non-zero multiple of 8, at most {MAX_MSG_SIZE}"));
    }
    if !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
        return invalid("capacity", format!("{capacity}: must be a power of two, at most {MAX_CAPACITY}"));
    }
    Ok(())
}

impl GroupMemory {
    /// Bytes from one reply ring to the next: its header and its LL slots, rounded up to a line.
    pub const fn ring_stride(msg_size: u32, capacity: u32) -> u64 {
        layout::group_ring_stride(msg_size, capacity)
    }

    /// Offset of entry `slot`'s reply ring from the group's header.
    const fn ring_position(entries: u32, msg_size: u32, capacity: u32, slot: u32) -> u64 {
        layout::group_ring_position(entries, msg_size, capacity, slot)
    }

    /// Bytes of a whole group: header, table, reply rings.
    pub const fn bytes(entries: u32, msg_size: u32, capacity: u32) -> u64 {
        layout::group_bytes(entries, msg_size, capacity)
    }

    /// Lays a group out over zeroed memory (every entry free, every ring empty at position 0): writes
    /// the header's geometry and each entry's reply ring offset (`offset` plus its position).
    ///
    /// # Safety
    /// `base` must point to `len` writable bytes, zeroed, valid for as long as the returned value and
    /// its copies are used, not yet shared with anyone, and accessed by others afterwards only
    /// through this protocol.
    pub unsafe fn create(
        base: NonNull<u8>,
        len: u64,
        offset: u64,
        entries: u32,
        msg_size: u32,
        capacity: u32,
    ) -> Result<Self, GroupError> {
        check_geometry(entries, msg_size, capacity)?;
        Self::check_region(base, len, entries, msg_size, capacity)?;
        let h = base.as_ptr().cast::<GroupHeader>();
        // SAFETY: `h` is 128-aligned and the region holds the whole group (checked above); nobody else
        // accesses it yet (the contract), so plain writes of the write-once fields race with nothing.
        unsafe {
            (&raw mut (*h).entries).write(entries);
            (&raw mut (*h).msg_size).write(msg_size);
            (&raw mut (*h).capacity).write(capacity);
            (&raw mut (*h).ring_stride).write(Self::ring_stride(msg_size, capacity));
        }
        for slot in 0..entries {
            let at = Self::ring_position(entries, msg_size, capacity, slot) + offset;
            // SAFETY: as above; entry `slot` lies inside the region, after the header.
            unsafe {
                let e = base.as_ptr().add(size_of::<GroupHeader>() + slot as usize * size_of::<GroupEntry>());
                (&raw mut (*e.cast::<GroupEntry>()).meshd.reply_ring_offset).write(at);
            }
        }
        let ring_stride = Self::ring_stride(msg_size, capacity);
        Ok(Self { base, entries, msg_size, capacity, ring_stride, offset })
    }

    /// Opens a group laid out by [`GroupMemory::create`], validating its header and every entry's
    /// reply ring offset first (`offset` as given to `create`).
    ///
    /// # Safety
    /// `base` must point to `len` bytes laid out by `create` (or by meshd in a mailbox), valid for as
    /// long as the returned value and its copies are used, whose write-once fields nobody writes
    /// any more, and accessed by others only through this protocol.
    pub unsafe fn open(base: NonNull<u8>, len: u64, offset: u64) -> Result<Self, GroupError> {
        if !base.as_ptr().addr().is_multiple_of(ALIGN) || len < LINE {
            return Err(GroupError::Invalid {
                field: "region",
                reason: format!("{len} bytes at {:p}: must hold a 128-byte aligned header", base.as_ptr()),
            });
        }
        // SAFETY: the header's 128 bytes are in the region (checked above), laid out by `create` (the
        // contract), and its write-once fields are no longer written, so plain reads race with nothing.
        let (entries, msg_size, capacity, ring_stride) = unsafe {
            let h = base.as_ptr().cast::<GroupHeader>();
            ((*h).entries, (*h).msg_size, (*h).capacity, (*h).ring_stride)
        };
        check_geometry(entries, msg_size, capacity)?;
        if ring_stride != Self::ring_stride(msg_size, capacity) {
            return Err(GroupError::Invalid {
                field: "ring_stride",
                reason: format!(
                    "{ring_stride}, but rings of {capacity} messages of {msg_size} bytes are {} apart",
                    Self::ring_stride(msg_size, capacity)
                ),
            });
        }
        Self::check_region(base, len, entries, msg_size, capacity)?;
        let group = Self { base, entries, msg_size, capacity, ring_stride, offset };
        for slot in 0..entries {
            let want = Self::ring_position(entries, msg_size, capacity, slot) + offset;
            #[allow(clippy::cast_possible_truncation, reason = "slot < entries <= 2^16")]
            let got = group.entry(slot as u16).map_or(0, |e| e.meshd.reply_ring_offset);
            if got != want {
                return Err(GroupError::Invalid {
                    field: "reply_ring_offset",
                    reason: format!("entry {slot}: {got:#x}, but its ring is at {want:#x}"),
                });
            }
        }
        Ok(group)
    }

    fn check_region(base: NonNull<u8>, len: u64, entries: u32, msg_size: u32, capacity: u32) -> Result<(), GroupError> {
        let need = Self::bytes(entries, msg_size, capacity);
        if !base.as_ptr().addr().is_multiple_of(ALIGN) || len < need {
            return Err(GroupError::Invalid {
                field: "region",
                reason: format!(
                    "{len} bytes at {:p}: {entries} entries of {capacity} replies of {msg_size} bytes need {need}, 128-byte aligned",
                    base.as_ptr()
                ),
            });
        }
        Ok(())
    }

    /// Entries (client slots) in the table.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Payload bytes of a reply.
    pub fn msg_size(&self) -> usize {
        self.msg_size as usize
    }

    /// Replies each reply ring holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub(super) fn header(&self) -> &GroupHeader {
        // SAFETY: `create`/`open` checked that the header is in the region, which their contract keeps
        // valid; only its atomic `changes` is written after creation.
        unsafe { self.base.cast::<GroupHeader>().as_ref() }
    }

    /// The header's `changes` word as it stands (Acquire: the entries' changes it counts are visible).
    pub fn changes(&self) -> u64 {
        self.header().changes.load(Ordering::Acquire)
    }

    /// Entry `slot`, or `None` beyond the table.
    pub(super) fn entry(&self, slot: u16) -> Option<&GroupEntry> {
        if u32::from(slot) >= self.entries {
            return None;
        }
        // SAFETY: `slot < entries`, so the entry lies inside the region `create`/`open` checked; its
        // words are atomics, or the write-once `reply_ring_offset`.
        Some(unsafe {
            &*self.base.as_ptr().add(size_of::<GroupHeader>() + usize::from(slot) * size_of::<GroupEntry>()).cast()
        })
    }

    /// Entry `slot`'s entry and decoded binding, or what is wrong with them.
    pub(super) fn binding_of(&self, slot: u16, order: Ordering) -> Result<(&GroupEntry, u32, EntryState), GroupError> {
        let e = self.entry(slot).ok_or(GroupError::UnknownClient { id: u32::from(slot), entries: self.entries })?;
        let word = e.meshd.binding.load(order);
        let (epoch, state) = decode(word).ok_or(GroupError::BadState { slot, word })?;
        Ok((e, epoch, state))
    }

    /// Entry `slot` as it stands.
    pub fn snapshot(&self, slot: u16) -> Result<EntrySnapshot, GroupError> {
        let (e, epoch, state) = self.binding_of(slot, Ordering::Acquire)?;
        let acked_epoch = e.program.acked_epoch.load(Ordering::Acquire);
        let holder = Holder::from_word(e.meshd.holder.load(Ordering::Acquire));
        Ok(EntrySnapshot { epoch, state, acked_epoch, holder })
    }

    /// Entry `slot`'s reply ring (the caller checked `slot < entries`).
    pub(super) fn ring(&self, slot: u16) -> RingMemory {
        assert!(u32::from(slot) < self.entries);
        let at = LINE + u64::from(self.entries) * size_of::<GroupEntry>() as u64 + u64::from(slot) * self.ring_stride;
        #[allow(clippy::cast_possible_truncation, reason = "inside the region, which is in memory")]
        let at = at as usize;
        // SAFETY: the ring's header (128-aligned: the region is, and every position is a multiple of
        // 128) and its slots lie inside the region `create`/`open` checked; msg_size is a non-zero
        // multiple of 8 and capacity a power of two (`check_geometry`).
        unsafe {
            let header = self.base.add(at);
            let slots = header.add(size_of::<RingHeader>());
            RingMemory::new(header.cast(), slots.cast(), self.msg_size as usize, u64::from(self.capacity))
        }
    }

    /// Offset of entry `slot`'s reply ring as meshd hands it to a client (the file's offset).
    pub fn reply_ring_offset(&self, slot: u16) -> Option<u64> {
        self.entry(slot)
            .map(|_| Self::ring_position(self.entries, self.msg_size, self.capacity, u32::from(slot)) + self.offset)
    }
}
