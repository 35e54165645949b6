//! The channel group over raw memory: one SPSC reply ring per client slot, handed out by meshd and taken back only once the program has acknowledged the last client's departure; and the service core that pairs it with a fan-in ring.
//!
//! The design, defended, is `docs/design/many-clients.md` ("The reply side: the channel group");
//! this is its CPU core. Like `fanin`, it is kept free of files and mappings so that Miri runs it
//! over heap memory (`cargo +nightly miri test -p mesh-shm --lib group::`). In the mailbox a group is
//! a channel of protocol group (layout version 4, `layout::PROTOCOL_GROUP`; `Mailbox::create_group`),
//! laid out in its channel's slots region, whose host ends are `service`'s.
//!
//! **Memory** (one region, 128-byte aligned, zeroed before [`GroupMemory::create`]):
//!
//! * a [`GroupHeader`] (one line, meshd's): the geometry, written once, and `changes`, bumped on
//!   every connect and departure so that the program polls one word rather than the table;
//! * `entries` × [`GroupEntry`] (two lines each): meshd's line (the epoch and state *in one 8-byte
//!   word*, the holder, the reply ring's offset) and the program's line (`acked_epoch`, the one word
//!   of the table the GPU writes);
//! * `entries` reply rings, [`GroupMemory::ring_stride`] bytes apart: a [`RingHeader`] and the LL
//!   slots of `ring` (producer: the program; consumer: the client bound to the entry).
//!
//! **Protocol.** meshd's [`GroupMeshd::connect`] takes an entry that is not bound and whose
//! `acked_epoch` equals its `epoch` (the program has dropped the last client and published its
//! ring's exact `head`), sets the ring's `tail` to that `head` (every unread reply to the last client
//! is discarded), then `epoch + 1` and `bound` (one store), then `changes` (Release). The client's
//! id is `slot | epoch << 16` ([`ClientId`]). [`GroupMeshd::depart`] marks the entry departed and
//! bumps `changes`. The program ([`GroupProgram`]) notices `changes` move, scans, and acknowledges
//! each departed entry with `acked_epoch := epoch` (Release) after its last reply to that client;
//! its [`GroupProgram::reply`] refuses ([`Replied::Gone`]) an id whose epoch is not the entry's bound
//! epoch. That check is not only a second line of defence: requests of a departed client can still
//! sit in the fan-in ring after the program acknowledged its departure, and replying to them must
//! not reach the entry's next client.
//!
//! **Why epoch and state share a word.** A GPU's two loads of host memory are unordered (fact 3 of
//! the design). Read as two words, a reply's check could see the new client's `bound` with the old
//! client's epoch and pass for a departed id; one 8-byte load (single-copy atomic) cannot.

use core::mem::{offset_of, size_of};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::claim::Holder;
use crate::fanin::{Completion, FanInCorrupt, FanInProducer, FanInShards, ShardedConsumer, Taken};
use crate::indices::Corrupt;
use crate::layout::{LINE, MAX_CAPACITY, MAX_MSG_SIZE, RingHeader};
use crate::ring::{ConsumerCore, ProducerCore, RingMemory, WIRE_FACTOR};

/// The alignment of a group's memory: a line, so that each writer's words have lines of their own.
const ALIGN: usize = 128;
const _: () = assert!(ALIGN as u64 == LINE);

/// The most entries a group can have: the client id keeps the slot in 16 bits.
pub const MAX_ENTRIES: u32 = 1 << 16;

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

const _: () = assert!(size_of::<GroupHeader>() as u64 == LINE);
const _: () = assert!(offset_of!(GroupHeader, changes) == 24);
const _: () = assert!(size_of::<GroupEntry>() as u64 == 2 * LINE);
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

const fn binding(epoch: u32, state: EntryState) -> u64 {
    epoch as u64 | (state as u64) << 32
}

/// The epoch and state of a binding word; `None` for a state no meshd writes.
#[allow(clippy::cast_possible_truncation, reason = "the word packs the epoch in its low half")]
fn decode(word: u64) -> Option<(u32, EntryState)> {
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
        let slots = msg_size as u64 * WIRE_FACTOR as u64 * capacity as u64;
        size_of::<RingHeader>() as u64 + slots.div_ceil(LINE) * LINE
    }

    /// Offset of entry `slot`'s reply ring from the group's header.
    const fn ring_position(entries: u32, msg_size: u32, capacity: u32, slot: u32) -> u64 {
        LINE + entries as u64 * size_of::<GroupEntry>() as u64 + slot as u64 * Self::ring_stride(msg_size, capacity)
    }

    /// Bytes of a whole group: header, table, reply rings.
    pub const fn bytes(entries: u32, msg_size: u32, capacity: u32) -> u64 {
        Self::ring_position(entries, msg_size, capacity, entries)
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

    fn header(&self) -> &GroupHeader {
        // SAFETY: `create`/`open` checked that the header is in the region, which their contract keeps
        // valid; only its atomic `changes` is written after creation.
        unsafe { self.base.cast::<GroupHeader>().as_ref() }
    }

    /// The header's `changes` word as it stands (Acquire: the entries' changes it counts are visible).
    pub fn changes(&self) -> u64 {
        self.header().changes.load(Ordering::Acquire)
    }

    /// Entry `slot`, or `None` beyond the table.
    fn entry(&self, slot: u16) -> Option<&GroupEntry> {
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
    fn binding_of(&self, slot: u16, order: Ordering) -> Result<(&GroupEntry, u32, EntryState), GroupError> {
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
    fn ring(&self, slot: u16) -> RingMemory {
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

/// meshd's side of a group: the only writer of the header and of the entries' meshd lines (one meshd
/// per mailbox, by its `flock`; `&mut self` keeps one writer within it).
#[derive(Debug)]
pub struct GroupMeshd {
    group: GroupMemory,
}

impl GroupMeshd {
    /// meshd's handle on a group (after a restart too: everything it needs is in the memory).
    pub fn new(group: GroupMemory) -> Self {
        Self { group }
    }

    /// The group.
    pub fn group(&self) -> &GroupMemory {
        &self.group
    }

    fn bump_changes(&self) {
        let c = &self.group.header().changes;
        // Release: the entry's new binding (and, for a connect, the ring's reset) is visible to a
        // program that sees this count. meshd is its only writer, so a load and a store suffice.
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// Binds a new client to an entry that is free, or departed and acknowledged by the program:
    /// its reply ring is emptied of the last client's replies, its epoch moves on. Refused, with the
    /// reason, when no entry qualifies; an entry whose state word is corrupt is passed over (and
    /// reported when nothing else was found).
    pub fn connect(&mut self, holder: Holder) -> Result<ClientId, GroupError> {
        let g = self.group;
        let (mut bound, mut awaiting_ack, mut corrupt) = (0, 0, None);
        for slot in 0..g.entries {
            #[allow(clippy::cast_possible_truncation, reason = "slot < entries <= 2^16")]
            let slot = slot as u16;
            // Relaxed: meshd is the binding's only writer.
            let (e, epoch, state) = match g.binding_of(slot, Ordering::Relaxed) {
                Ok(b) => b,
                Err(err) => {
                    corrupt.get_or_insert(err);
                    continue;
                }
            };
            if state == EntryState::Bound {
                bound += 1;
                continue;
            }
            // Acquire: pairs with the program's Release ack, so the `head` it published before is
            // what we read below. Compared with `!=`, not `<`: epochs wrap.
            if e.program.acked_epoch.load(Ordering::Acquire) != epoch {
                awaiting_ack += 1;
                continue;
            }
            let ring = g.ring(slot);
            let indices = ring.indices();
            let head = indices.head();
            // The consumer's word, written here by meshd: the last client is gone (its claim with it)
            // and the next one is not told of the ring before the binding below. Every reply to the
            // last client lies below `head` (the program published it exactly before acking), so all
            // are discarded. Release: the next client's Acquire of `tail` (at its claim) sees it.
            indices.header().consumer.tail.store(head, Ordering::Release);
            e.meshd.holder.store(holder.word(), Ordering::Relaxed);
            let epoch = epoch.wrapping_add(1);
            // One store for epoch and state (see the module's notes); Release orders the reset above.
            e.meshd.binding.store(binding(epoch, EntryState::Bound), Ordering::Release);
            self.bump_changes();
            return Ok(ClientId::new(slot, epoch));
        }
        if let Some(err) = corrupt {
            return Err(err);
        }
        if awaiting_ack == 0 {
            return Err(GroupError::AllBound { entries: g.entries });
        }
        Err(GroupError::AwaitingAck { entries: g.entries, bound, awaiting_ack })
    }

    /// Marks client `id`'s entry departed (after meshd completed its fan-in slots: the entry must not
    /// be reused while a slot may still carry its owner). Refuses an id that is not the entry's bound
    /// client, so that a late or repeated departure cannot evict the entry's next client.
    pub fn depart(&mut self, id: ClientId) -> Result<(), GroupError> {
        let (e, epoch, state) = self.group.binding_of(id.slot(), Ordering::Relaxed).map_err(|err| match err {
            GroupError::UnknownClient { entries, .. } => GroupError::UnknownClient { id: id.0, entries },
            err => err,
        })?;
        if state != EntryState::Bound || ClientId::new(id.slot(), epoch) != id {
            return Err(GroupError::NotBound { id: id.0, epoch, state });
        }
        e.meshd.binding.store(binding(epoch, EntryState::Departed), Ordering::Release);
        self.bump_changes();
        Ok(())
    }

    /// The bound clients and their holders: what a restarted meshd checks for liveness (and departs
    /// the dead of, after completing their fan-in slots).
    pub fn bound(&self) -> Result<Vec<(ClientId, Option<Holder>)>, GroupError> {
        let (bound, mut corrupt) = self.bound_each();
        match corrupt.drain(..).next() {
            Some(e) => Err(e),
            None => Ok(bound),
        }
    }

    /// [`GroupMeshd::bound`], entry by entry: the bound clients of the entries that could be read, and
    /// an error for each that could not (a binding word in no state meshd writes: a peer process
    /// wrote it), so that one damaged entry hides no other client.
    pub fn bound_each(&self) -> (Vec<(ClientId, Option<Holder>)>, Vec<GroupError>) {
        let (mut out, mut corrupt) = (Vec::new(), Vec::new());
        for slot in 0..self.group.entries {
            #[allow(clippy::cast_possible_truncation, reason = "slot < entries <= 2^16")]
            let slot = slot as u16;
            match self.group.binding_of(slot, Ordering::Relaxed) {
                Ok((e, epoch, EntryState::Bound)) => {
                    out.push((ClientId::new(slot, epoch), Holder::from_word(e.meshd.holder.load(Ordering::Relaxed))));
                }
                Ok(_) => {}
                Err(err) => corrupt.push(err),
            }
        }
        (out, corrupt)
    }
}

/// The program's side of a group, as the GPU does it (here for a host program and for the tests):
/// the producer of every reply ring and the only writer of `acked_epoch`. Replies and
/// acknowledgements go through one `&mut self`, in program order: that order is what makes an
/// acknowledgement cover every reply to the departed client.
#[derive(Debug)]
pub struct GroupProgram {
    group: GroupMemory,
    replies: Vec<ProducerCore>,
    /// `changes` as of the last full [`GroupProgram::departures`]; `None` for a program that has not
    /// scanned yet, so that a restarted one acknowledges what its predecessor had not.
    seen_changes: Option<u64>,
}

impl GroupProgram {
    /// Takes over the program's side (a new launch resumes each reply ring where the last left it).
    pub fn new(group: GroupMemory) -> Self {
        let replies = (0..group.entries)
            .map(|slot| {
                #[allow(clippy::cast_possible_truncation, reason = "slot < entries <= 2^16")]
                let slot = slot as u16;
                ProducerCore::new(group.ring(slot))
            })
            .collect();
        Self { group, replies, seen_changes: None }
    }

    /// The group.
    pub fn group(&self) -> &GroupMemory {
        &self.group
    }

    /// Replies to client `to` (zero-padded to the message size), unless its entry is no longer bound
    /// to that epoch ([`Replied::Gone`]) or its ring is full ([`Replied::Full`]). An id beyond the
    /// table is an error: sender ids come from peers.
    pub fn reply(&mut self, to: ClientId, msg: &[u8]) -> Result<Replied, GroupError> {
        if msg.len() > self.group.msg_size() {
            return Err(GroupError::TooLong { len: msg.len(), msg_size: self.group.msg_size() });
        }
        let slot = to.slot();
        // One load for epoch and state: both from the same binding. Acquire: a new binding's ring
        // reset happened before our writes into the ring.
        let (_, epoch, state) = self.group.binding_of(slot, Ordering::Acquire).map_err(|err| match err {
            GroupError::UnknownClient { entries, .. } => GroupError::UnknownClient { id: to.0, entries },
            err => err,
        })?;
        if state != EntryState::Bound || ClientId::new(slot, epoch) != to {
            return Ok(Replied::Gone);
        }
        let ring = &mut self.replies[usize::from(slot)];
        match ring.try_push(msg) {
            Ok(true) => Ok(Replied::Sent),
            Ok(false) => Ok(Replied::Full),
            Err(corrupt) => Err(GroupError::Ring { slot, corrupt }),
        }
    }

    /// Every departed entry whose departure is not acknowledged, in slot order (a full scan, whatever
    /// `changes` says); the first entry whose binding word is in no state meshd writes is an error.
    pub fn scan(&self) -> Result<Vec<Departed>, GroupError> {
        let (found, mut corrupt) = self.scan_each();
        match corrupt.drain(..).next() {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    /// [`GroupProgram::scan`], entry by entry: the departures of the entries that could be read, and
    /// an error for each that could not.
    fn scan_each(&self) -> (Vec<Departed>, Vec<GroupError>) {
        let (mut out, mut corrupt) = (Vec::new(), Vec::new());
        for slot in 0..self.group.entries {
            #[allow(clippy::cast_possible_truncation, reason = "slot < entries <= 2^16")]
            let slot = slot as u16;
            match self.group.binding_of(slot, Ordering::Acquire) {
                // Relaxed: the program is the ack's only writer.
                Ok((e, epoch, EntryState::Departed)) if e.program.acked_epoch.load(Ordering::Relaxed) != epoch => {
                    out.push(Departed { slot, epoch });
                }
                Ok(_) => {}
                Err(err) => corrupt.push(err),
            }
        }
        (out, corrupt)
    }

    /// Acknowledges a departure: the caller has dropped the client's state and will send it nothing
    /// more. `false` when the entry no longer holds that departure (already acknowledged, and maybe
    /// reused).
    pub fn ack(&mut self, d: Departed) -> Result<bool, GroupError> {
        let (e, epoch, state) = self.group.binding_of(d.slot, Ordering::Acquire)?;
        if state != EntryState::Departed || epoch != d.epoch {
            return Ok(false);
        }
        // The ring's `head` must be exact before the ack: a host producer publishes it on every
        // reply, so it is (a GPU program flushes it here). Release: that publication, and every reply
        // before it, happen before meshd's Acquire of the ack and its reset of the ring.
        e.program.acked_epoch.store(epoch, Ordering::Release);
        Ok(true)
    }

    /// The departures since the last call, each acknowledged as it is returned (the caller drops the
    /// client's state). Reads `changes` first and scans only when it has moved; a restarted program's
    /// first call scans, and so acknowledges what the last launch had not. An entry whose binding word
    /// is in no state meshd writes (a peer process wrote it) is passed over, as mesh.cuh's
    /// mesh_group_departed passes it over, so that it holds back no other departure;
    /// [`GroupProgram::scan`] names it.
    pub fn departures(&mut self) -> Result<Vec<ClientId>, GroupError> {
        // Acquire: every entry change this count covers is visible to the scan. A change made after
        // this read bumps the count again and is caught by the next call.
        let changes = self.group.changes();
        if self.seen_changes == Some(changes) {
            return Ok(Vec::new());
        }
        let (found, _) = self.scan_each();
        for &d in &found {
            self.ack(d)?;
        }
        self.seen_changes = Some(changes);
        Ok(found.into_iter().map(Departed::id).collect())
    }
}

/// A client's end of its reply ring (its consumer; claiming the end is the client library's, through
/// the ring header's claim word).
#[derive(Debug)]
pub struct ReplyReceiver {
    id: ClientId,
    rx: ConsumerCore,
}

impl ReplyReceiver {
    /// The receiving end of client `id`'s reply ring, at its `tail` (which meshd reset at connect).
    pub fn new(group: &GroupMemory, id: ClientId) -> Result<Self, GroupError> {
        if u32::from(id.slot()) >= group.entries {
            return Err(GroupError::UnknownClient { id: id.0, entries: group.entries });
        }
        let rx = ConsumerCore::new(group.ring(id.slot()))
            .map_err(|corrupt| GroupError::Ring { slot: id.slot(), corrupt })?;
        Ok(Self { id, rx })
    }

    /// The client's id.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// Receives one reply into `out` (exactly the message size); `false` when there is none.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool, GroupError> {
        let msg_size = self.rx.ring().msg_size();
        if out.len() != msg_size {
            return Err(GroupError::BadBuffer { len: out.len(), msg_size });
        }
        Ok(self.rx.try_pop(out))
    }
}

/// A service's two objects: the fan-in ring of requests and the group of reply rings.
#[derive(Debug, Clone, Copy)]
pub struct ServiceMemory {
    /// The requests: any number of clients, one consumer (the program), over one or more shards.
    pub fanin: FanInShards,
    /// The replies: one ring per client slot.
    pub group: GroupMemory,
}

/// meshd's side of a service: connect, and departures with the completion of the client's fan-in
/// slots first (the entry is departed, and so reusable, only once no fan-in slot is the client's).
#[derive(Debug)]
pub struct ServiceMeshd {
    svc: ServiceMemory,
    group: GroupMeshd,
}

impl ServiceMeshd {
    /// meshd's handle on a service.
    pub fn new(svc: ServiceMemory) -> Self {
        Self { svc, group: GroupMeshd::new(svc.group) }
    }

    /// Binds a new client (see [`GroupMeshd::connect`]).
    pub fn connect(&mut self, holder: Holder) -> Result<ClientId, GroupError> {
        self.group.connect(holder)
    }

    /// A dead client (its pidfd readable): completes its fan-in slots, then departs its entry.
    pub fn depart_dead(&mut self, id: ClientId) -> Result<Completion, GroupError> {
        self.check_bound(id)?;
        let done = self.svc.fanin.complete_dead(id.0);
        self.group.depart(id)?;
        Ok(done)
    }

    /// A live client that detached (said goodbye, or closed its socket): revokes what it may still
    /// hold, then departs its entry; refused while it is between the begin and the commit of a send.
    pub fn detach(&mut self, id: ClientId) -> Result<Completion, GroupError> {
        self.check_bound(id)?;
        let done = self.svc.fanin.revoke_live(id.0);
        if done.stuck > 0 {
            return Err(GroupError::StillSending { id: id.0, stuck: done.stuck });
        }
        self.group.depart(id)?;
        Ok(done)
    }

    /// A live client that holds the fan-in ring (meshd's stall watcher found it stalled): revokes
    /// what can be revoked while it lives ([`crate::fanin::revoke_live`], over every shard: a
    /// reservation not begun becomes a skip, a committed slot is finished; one between begin and
    /// commit is counted in `stuck`). Its entry stays bound: the client goes on, and sends a revoked
    /// request again.
    pub fn revoke(&mut self, id: ClientId) -> Result<Completion, GroupError> {
        self.check_bound(id)?;
        Ok(self.svc.fanin.revoke_live(id.0))
    }

    fn check_bound(&self, id: ClientId) -> Result<(), GroupError> {
        let (_, epoch, state) = self.svc.group.binding_of(id.slot(), Ordering::Relaxed).map_err(|err| match err {
            GroupError::UnknownClient { entries, .. } => GroupError::UnknownClient { id: id.0, entries },
            err => err,
        })?;
        if state != EntryState::Bound || ClientId::new(id.slot(), epoch) != id {
            return Err(GroupError::NotBound { id: id.0, epoch, state });
        }
        Ok(())
    }

    /// The group's side (for a restarted meshd's checks).
    pub fn group(&self) -> &GroupMeshd {
        &self.group
    }
}

/// A client of a service: its fan-in producer (sending as its id) and its own reply ring.
#[derive(Debug)]
pub struct ServiceClient {
    fanin: FanInShards,
    tx: FanInProducer,
    rx: ReplyReceiver,
}

/// Waits for `f` to say yes, yielding between tries, until `timeout`.
fn wait(timeout: Duration, mut f: impl FnMut() -> Result<bool, GroupError>) -> Result<(), GroupError> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(GroupError::Timeout);
        }
        std::thread::yield_now();
    }
}

impl ServiceClient {
    /// The client meshd bound as `id`.
    pub fn new(svc: &ServiceMemory, id: ClientId) -> Result<Self, GroupError> {
        Ok(Self { fanin: svc.fanin, tx: svc.fanin.producer(id.0), rx: ReplyReceiver::new(&svc.group, id)? })
    }

    /// Its id.
    pub fn id(&self) -> ClientId {
        self.rx.id()
    }

    /// Sends one request (shorter ones are zero-padded); `false` when the fan-in ring has no room.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool, GroupError> {
        let msg_size = self.fanin.msg_size();
        if msg.len() > msg_size {
            return Err(GroupError::TooLong { len: msg.len(), msg_size });
        }
        Ok(self.tx.try_send(msg)?)
    }

    /// Sends one request, waiting for room up to `timeout`.
    pub fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<(), GroupError> {
        wait(timeout, || self.try_send(msg))
    }

    /// Receives one reply (`out`: exactly the reply size); `false` when there is none yet.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool, GroupError> {
        self.rx.try_recv(out)
    }

    /// Receives one reply, waiting up to `timeout`.
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<(), GroupError> {
        wait(timeout, || self.rx.try_recv(out))
    }
}

/// A host server of a service (the program's role): the fan-in consumer and the group's program side.
#[derive(Debug)]
pub struct ServiceServer {
    fanin: FanInShards,
    rx: ShardedConsumer,
    group: GroupProgram,
}

impl ServiceServer {
    /// Takes over the server's side (at the fan-in ring's published `tail`, each reply ring where the
    /// last server left it).
    pub fn new(svc: &ServiceMemory) -> Self {
        Self { fanin: svc.fanin, rx: ShardedConsumer::new(&svc.fanin), group: GroupProgram::new(svc.group) }
    }

    /// Takes the next request (into `out`, exactly the request size) with its sender, or a skip (a
    /// sender cut off by its death or revoked), or `None`.
    pub fn try_take(&mut self, out: &mut [u8]) -> Result<Option<Taken>, GroupError> {
        let msg_size = self.fanin.msg_size();
        if out.len() != msg_size {
            return Err(GroupError::BadBuffer { len: out.len(), msg_size });
        }
        Ok(self.rx.try_take(out).map_err(|(_, c)| c)?.map(|(_, t)| t))
    }

    /// Replies to `sender` (the id a taken request carried). See [`GroupProgram::reply`].
    pub fn reply(&mut self, sender: u32, msg: &[u8]) -> Result<Replied, GroupError> {
        self.group.reply(ClientId(sender), msg)
    }

    /// The clients that left since the last call, acknowledged (see [`GroupProgram::departures`]).
    pub fn departures(&mut self) -> Result<Vec<ClientId>, GroupError> {
        self.group.departures()
    }

    /// The group's program side, for step-by-step use.
    pub fn group(&mut self) -> &mut GroupProgram {
        &mut self.group
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test counts, ids and sizes are small")]
mod tests {
    use super::*;
    use crate::fanin::{SendOp, Stage, Step};
    use proptest::prelude::*;
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::Mutex;
    use std::sync::atomic::AtomicBool;

    /// Zeroed heap memory, 128-byte aligned, freed on drop (what Miri runs the protocol on).
    struct Heap {
        ptr: NonNull<u8>,
        layout: Layout,
    }

    impl Heap {
        fn zeroed(bytes: usize) -> Self {
            let layout = Layout::from_size_align(bytes, 128).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            Self { ptr, layout }
        }

        fn len(&self) -> u64 {
            self.layout.size() as u64
        }
    }

    impl Drop for Heap {
        fn drop(&mut self) {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    fn heap_group(entries: u32, msg_size: u32, capacity: u32) -> (Heap, GroupMemory) {
        let heap = Heap::zeroed(GroupMemory::bytes(entries, msg_size, capacity) as usize);
        // SAFETY: the allocation is zeroed, large enough, 128-aligned, outlives the group (the tests
        // keep `heap` alive while they use it) and is shared only through the protocol.
        let group = unsafe { GroupMemory::create(heap.ptr, heap.len(), 0, entries, msg_size, capacity) }.unwrap();
        (heap, group)
    }

    fn heap_fanin(msg_size: usize, capacity: u64, shards: u32) -> (Heap, FanInShards) {
        let header = size_of::<RingHeader>();
        let (m, c) = (msg_size as u32, capacity as u32);
        let heap = Heap::zeroed(header + crate::layout::fanin_region_bytes(m, c, shards) as usize);
        let at = |off: usize| NonNull::new(heap.ptr.as_ptr().wrapping_add(off)).unwrap();
        // SAFETY: the allocation holds shard 0's header, then the shards' region (128-aligned after
        // the 384-byte header), zeroed (empty rings), and outlives every use in the test that made it.
        let ring = unsafe { FanInShards::new(heap.ptr.cast(), at(header), m, c, shards) };
        (heap, ring)
    }

    /// A service over heap memory: requests and replies of `msg_size` bytes.
    struct HeapService {
        _group: Heap,
        _fanin: Heap,
        svc: ServiceMemory,
    }

    fn heap_service(entries: u32, msg_size: u32, requests: u64, replies: u32) -> HeapService {
        heap_service_shards(entries, msg_size, requests, replies, 1)
    }

    /// A service whose fan-in channel has `shards` shards of `requests` slots each.
    fn heap_service_shards(entries: u32, msg_size: u32, requests: u64, replies: u32, shards: u32) -> HeapService {
        let (_group, group) = heap_group(entries, msg_size, replies);
        let (_fanin, fanin) = heap_fanin(msg_size as usize, requests, shards);
        HeapService { _group, _fanin, svc: ServiceMemory { fanin, group } }
    }

    /// A client process as meshd records it (never checked for liveness here: Miri has no /proc).
    fn holder(n: u32) -> Holder {
        Holder { pid: 1000 + n, start: 1 }
    }

    /// An 8-byte reply: who it is for, and its number.
    fn short(id: ClientId, n: u32) -> [u8; 8] {
        let mut m = [0u8; 8];
        m[..4].copy_from_slice(&id.0.to_le_bytes());
        m[4..].copy_from_slice(&n.to_le_bytes());
        m
    }

    fn recv8(rx: &mut ReplyReceiver) -> Option<(ClientId, u32)> {
        let mut out = [0u8; 8];
        rx.try_recv(&mut out).unwrap().then(|| {
            (
                ClientId(u32::from_le_bytes(out[..4].try_into().unwrap())),
                u32::from_le_bytes(out[4..].try_into().unwrap()),
            )
        })
    }

    #[test]
    fn the_lines_and_sizes_are_as_documented() {
        assert_eq!(size_of::<GroupHeader>(), 128);
        assert_eq!(size_of::<GroupEntry>(), 256);
        assert_eq!(offset_of!(GroupEntry, program), 128);
        assert_eq!(GroupMemory::ring_stride(8, 4), 384 + 128, "64 bytes of slots, rounded up to a line");
        assert_eq!(GroupMemory::ring_stride(64, 8), 384 + 1024);
        assert_eq!(GroupMemory::bytes(3, 8, 4), 128 + 3 * 256 + 3 * 512);
        let heap = Heap::zeroed(GroupMemory::bytes(3, 8, 4) as usize);
        // SAFETY: as in `heap_group`.
        let g = unsafe { GroupMemory::create(heap.ptr, heap.len(), 4096, 3, 8, 4) }.unwrap();
        assert_eq!(g.reply_ring_offset(2), Some(4096 + 128 + 768 + 2 * 512));
        assert_eq!(g.reply_ring_offset(3), None);
        // SAFETY: as above; laid out by `create` just now.
        let again = unsafe { GroupMemory::open(heap.ptr, heap.len(), 4096) }.unwrap();
        assert_eq!((again.entries(), again.msg_size(), again.capacity()), (3, 8, 4));
        for slot in 0..3 {
            let e = g.snapshot(slot).unwrap();
            assert_eq!(e, EntrySnapshot { epoch: 0, state: EntryState::Free, acked_epoch: 0, holder: None });
        }
        // Epoch in the low half, state in the high half: the design's `epoch u32, state u32`.
        assert_eq!(binding(7, EntryState::Departed), 0x2_0000_0007);
        assert_eq!(ClientId::new(3, 0x1_0005), ClientId(0x0005_0003));
    }

    #[test]
    fn a_zeroed_group_binds_every_entry_then_refuses() {
        let (_heap, g) = heap_group(2, 8, 2);
        let mut meshd = GroupMeshd::new(g);
        assert_eq!(meshd.connect(holder(1)), Ok(ClientId::new(0, 1)));
        assert_eq!(meshd.connect(holder(2)), Ok(ClientId::new(1, 1)));
        assert_eq!(meshd.connect(holder(3)), Err(GroupError::AllBound { entries: 2 }));
        assert_eq!(g.changes(), 2);
        assert_eq!(g.snapshot(1).unwrap().holder, Some(holder(2)));
        assert_eq!(
            meshd.bound().unwrap(),
            [(ClientId::new(0, 1), Some(holder(1))), (ClientId::new(1, 1), Some(holder(2)))]
        );
    }

    #[test]
    fn an_entry_is_reused_only_after_the_ack_and_the_last_clients_replies_never_reach_the_next() {
        let (_heap, g) = heap_group(1, 8, 4);
        let mut meshd = GroupMeshd::new(g);
        let mut prog = GroupProgram::new(g);
        let a = meshd.connect(holder(1)).unwrap();
        {
            let mut rx = ReplyReceiver::new(&g, a).unwrap();
            for n in 0..3 {
                assert_eq!(prog.reply(a, &short(a, n)), Ok(Replied::Sent));
            }
            assert_eq!(recv8(&mut rx), Some((a, 0)));
        }
        meshd.depart(a).unwrap();
        assert_eq!(meshd.depart(a), Err(GroupError::NotBound { id: a.0, epoch: 1, state: EntryState::Departed }));
        let err = meshd.connect(holder(2)).unwrap_err();
        assert_eq!(err, GroupError::AwaitingAck { entries: 1, bound: 0, awaiting_ack: 1 });
        assert!(err.to_string().contains("not yet acknowledged by the program"), "{err}");
        assert_eq!(prog.reply(a, &short(a, 3)), Ok(Replied::Gone), "departed: dropped at the source");
        assert_eq!(prog.departures(), Ok(vec![a]));
        assert_eq!(prog.departures(), Ok(vec![]), "acknowledged once");
        let b = meshd.connect(holder(2)).unwrap();
        assert_eq!(b, ClientId::new(0, 2));
        let mut rx = ReplyReceiver::new(&g, b).unwrap();
        assert_eq!(recv8(&mut rx), None, "a's two unread replies were discarded at connect");
        // A request of `a` still in the fan-in ring after its ack: its reply must not reach `b`.
        assert_eq!(prog.reply(a, &short(a, 4)), Ok(Replied::Gone));
        assert_eq!(prog.reply(b, &short(b, 0)), Ok(Replied::Sent));
        assert_eq!(recv8(&mut rx), Some((b, 0)));
        assert_eq!(recv8(&mut rx), None);
    }

    #[test]
    fn a_restarted_program_acks_what_the_old_one_had_not() {
        let (_heap, g) = heap_group(2, 8, 2);
        let mut meshd = GroupMeshd::new(g);
        let mut old = GroupProgram::new(g);
        let (a, b) = (meshd.connect(holder(1)).unwrap(), meshd.connect(holder(2)).unwrap());
        assert_eq!(old.reply(b, &short(b, 0)), Ok(Replied::Sent));
        meshd.depart(a).unwrap();
        meshd.depart(b).unwrap();
        let found = old.scan().unwrap();
        assert_eq!(found, [Departed { slot: 0, epoch: 1 }, Departed { slot: 1, epoch: 1 }]);
        assert_eq!(old.ack(found[0]), Ok(true));
        drop(old); // dies before acking b
        assert_eq!(meshd.connect(holder(3)), Ok(ClientId::new(0, 2)));
        assert_eq!(meshd.connect(holder(4)), Err(GroupError::AwaitingAck { entries: 2, bound: 1, awaiting_ack: 1 }));
        let mut new = GroupProgram::new(g);
        assert_eq!(new.departures(), Ok(vec![b]), "its first call scans, whatever `changes` says");
        assert_eq!(new.ack(found[1]), Ok(true), "acking again is harmless while the entry waits");
        let c = meshd.connect(holder(4)).unwrap();
        assert_eq!(c, ClientId::new(1, 2));
        assert_eq!(new.ack(found[1]), Ok(false), "the entry is c's now");
        let mut rx = ReplyReceiver::new(&g, c).unwrap();
        assert_eq!(recv8(&mut rx), None, "b's reply, written by the old launch, was discarded");
        assert_eq!(
            new.reply(c, &short(c, 0)),
            Ok(Replied::Sent),
            "the new launch resumed the ring where the old left it"
        );
        assert_eq!(recv8(&mut rx), Some((c, 0)));
    }

    #[test]
    fn departures_scans_only_when_changes_moved() {
        let (_heap, g) = heap_group(2, 8, 2);
        let mut meshd = GroupMeshd::new(g);
        let mut prog = GroupProgram::new(g);
        let a = meshd.connect(holder(1)).unwrap();
        assert_eq!(prog.departures(), Ok(vec![]));
        // An entry departed behind the program's back, without `changes`: not seen until it moves.
        g.entry(0).unwrap().meshd.binding.store(binding(1, EntryState::Departed), Ordering::Release);
        assert_eq!(prog.departures(), Ok(vec![]));
        assert_eq!(prog.scan(), Ok(vec![Departed { slot: 0, epoch: 1 }]), "a full scan sees it");
        g.header().changes.fetch_add(1, Ordering::Release);
        assert_eq!(prog.departures(), Ok(vec![a]));
    }

    #[test]
    fn a_full_reply_ring_says_full_and_the_program_goes_on() {
        let (_heap, g) = heap_group(2, 8, 2);
        let mut meshd = GroupMeshd::new(g);
        let mut prog = GroupProgram::new(g);
        let (a, b) = (meshd.connect(holder(1)).unwrap(), meshd.connect(holder(2)).unwrap());
        let mut rx = ReplyReceiver::new(&g, a).unwrap();
        assert_eq!(prog.reply(a, &short(a, 0)), Ok(Replied::Sent));
        assert_eq!(prog.reply(a, &short(a, 1)), Ok(Replied::Sent));
        assert_eq!(prog.reply(a, &short(a, 2)), Ok(Replied::Full));
        assert_eq!(prog.reply(b, &short(b, 0)), Ok(Replied::Sent), "a slow client holds no one else");
        assert_eq!(recv8(&mut rx), Some((a, 0)));
        assert_eq!(prog.reply(a, &short(a, 2)), Ok(Replied::Sent));
        assert_eq!(prog.reply(a, &[0; 9]), Err(GroupError::TooLong { len: 9, msg_size: 8 }));
        assert_eq!(rx.try_recv(&mut [0; 4]), Err(GroupError::BadBuffer { len: 4, msg_size: 8 }));
    }

    #[test]
    fn corrupt_words_are_reported_not_followed() {
        let (heap, g) = heap_group(2, 8, 4);
        let open = || {
            // SAFETY: `heap` holds a group laid out by `create`; its write-once fields change only by
            // `poke`, on this thread, between the opens.
            unsafe { GroupMemory::open(heap.ptr, heap.len(), 0) }
        };
        let poke = |f: &dyn Fn(&mut GroupHeader, &mut [GroupEntry])| {
            // SAFETY: the header and the two entries lie at the start of `heap` (laid out by `create`);
            // no other reference to them is alive while `f` runs, on this thread alone.
            let (h, e) = unsafe {
                let h = heap.ptr.cast::<GroupHeader>().as_ptr();
                (&mut *h, core::slice::from_raw_parts_mut(h.add(1).cast::<GroupEntry>(), 2))
            };
            f(h, e);
        };
        let field = |e: GroupError| match e {
            GroupError::Invalid { field, .. } => field,
            e => panic!("{e}"),
        };
        poke(&|h, _| h.entries = 0);
        assert_eq!(field(open().unwrap_err()), "entries");
        poke(&|h, _| (h.entries, h.msg_size) = (2, 12));
        assert_eq!(field(open().unwrap_err()), "msg_size");
        poke(&|h, _| (h.msg_size, h.capacity) = (8, 3));
        assert_eq!(field(open().unwrap_err()), "capacity");
        poke(&|h, _| (h.capacity, h.ring_stride) = (4, 1));
        assert_eq!(field(open().unwrap_err()), "ring_stride");
        poke(&|h, _| (h.ring_stride, h.entries) = (GroupMemory::ring_stride(8, 4), 1000));
        let e = open().unwrap_err();
        assert!(e.to_string().contains("need"), "{e}");
        assert_eq!(field(e), "region");
        poke(&|h, e| (h.entries, e[1].meshd.reply_ring_offset) = (2, e[1].meshd.reply_ring_offset + 8));
        let e = open().unwrap_err();
        assert!(e.to_string().contains("entry 1"), "{e}");
        assert_eq!(field(e), "reply_ring_offset");
        poke(&|_, e| e[1].meshd.reply_ring_offset -= 8);
        let g2 = open().unwrap();

        let mut meshd = GroupMeshd::new(g);
        let mut prog = GroupProgram::new(g2);
        let bad = 7 << 32 | 1;
        g.entry(0).unwrap().meshd.binding.store(bad, Ordering::Release);
        assert_eq!(prog.scan(), Err(GroupError::BadState { slot: 0, word: bad }));
        assert_eq!(prog.reply(ClientId::new(0, 1), &[0; 8]), Err(GroupError::BadState { slot: 0, word: bad }));
        let a = meshd.connect(holder(1)).unwrap();
        assert_eq!(a, ClientId::new(1, 1), "the corrupt entry is passed over");
        let e = meshd.connect(holder(2)).unwrap_err();
        assert_eq!(e, GroupError::BadState { slot: 0, word: bad }, "and named when nothing else is left");
        assert!(e.to_string().contains("entry 0") && e.to_string().contains("state 7"), "{e}");
        assert_eq!(prog.reply(ClientId(5), &[0; 8]), Err(GroupError::UnknownClient { id: 5, entries: 2 }));
        assert_eq!(ReplyReceiver::new(&g, ClientId(2)).unwrap_err(), GroupError::UnknownClient { id: 2, entries: 2 });
        assert_eq!(meshd.depart(ClientId(0x10_0009)), Err(GroupError::UnknownClient { id: 0x10_0009, entries: 2 }));
        assert_eq!(
            meshd.depart(ClientId::new(1, 2)),
            Err(GroupError::NotBound { id: ClientId::new(1, 2).0, epoch: 1, state: EntryState::Bound }),
            "a stale or forged id never evicts the bound client"
        );
        // A reply ring whose head a peer moved far ahead of its tail.
        g.ring(1).indices().header().producer.head.store(1000, Ordering::Release);
        let mut prog = GroupProgram::new(g2);
        assert_eq!(prog.reply(a, &[0; 8]), Err(GroupError::Ring { slot: 1, corrupt: Corrupt { head: 1000, tail: 0 } }));
        assert!(ReplyReceiver::new(&g, a).is_err());
        // The corrupt entry holds back no other departure: scan names it, departures passes it over.
        meshd.depart(a).unwrap();
        assert_eq!(prog.scan(), Err(GroupError::BadState { slot: 0, word: bad }));
        assert_eq!(prog.departures(), Ok(vec![a]), "entry 1's departure acknowledged past entry 0");
        assert_eq!(g.entry(1).unwrap().program.acked_epoch.load(Ordering::Acquire), a.epoch16().into());
    }

    #[test]
    fn a_service_round_trip_and_a_client_dead_mid_send() {
        let heap = heap_service(2, 16, 4, 2);
        let svc = heap.svc;
        let mut meshd = ServiceMeshd::new(svc);
        let mut srv = ServiceServer::new(&svc);
        let a = meshd.connect(holder(1)).unwrap();
        let b = meshd.connect(holder(2)).unwrap();
        let mut ca = ServiceClient::new(&svc, a).unwrap();
        ca.send(&request(a, 0), Duration::from_secs(1)).unwrap();
        // b dies after storing its body, before the commit.
        let mut pb = svc.fanin.producer(b.0);
        let (m, mut op) = (request(b, 0), SendOp::default());
        while op.stage != Stage::Body {
            assert_eq!(pb.step(&mut op, &m).unwrap(), Step::Progress);
        }
        ca.send(&request(a, 1), Duration::from_secs(1)).unwrap();
        let mut req = [0u8; 16];
        assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: a.0 })));
        assert_eq!(srv.reply(a.0, &reply(a, 0)), Ok(Replied::Sent));
        assert_eq!(srv.try_take(&mut req), Ok(None), "b's slot holds the consumer until meshd completes it");
        assert_eq!(meshd.depart_dead(b), Ok(Completion { skipped: 1, ..Completion::default() }));
        assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Skipped { sender: b.0 })));
        assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: a.0 })));
        assert_eq!(req, request(a, 1));
        assert_eq!(srv.reply(a.0, &reply(a, 1)), Ok(Replied::Sent));
        assert_eq!(srv.reply(b.0, &reply(b, 0)), Ok(Replied::Gone));
        assert_eq!(srv.departures(), Ok(vec![b]));
        let mut out = [0u8; 16];
        for k in 0..2 {
            ca.recv(&mut out, Duration::from_secs(1)).unwrap();
            assert_eq!(out, reply(a, k));
        }
        assert_eq!(ca.recv(&mut out, Duration::ZERO), Err(GroupError::Timeout));
        assert_eq!(meshd.depart_dead(b), Err(GroupError::NotBound { id: b.0, epoch: 1, state: EntryState::Departed }));
        let c = meshd.connect(holder(3)).unwrap();
        assert_eq!(c.slot(), b.slot(), "b's entry, reused after the ack");
        assert_eq!(ca.try_send(&[0; 17]), Err(GroupError::TooLong { len: 17, msg_size: 16 }));
    }

    #[test]
    fn a_client_that_detaches_mid_send_keeps_its_entry() {
        let heap = heap_service(1, 8, 2, 2);
        let svc = heap.svc;
        let mut meshd = ServiceMeshd::new(svc);
        let a = meshd.connect(holder(1)).unwrap();
        let mut p = svc.fanin.producer(a.0);
        let (m, mut op) = ([1u8; 8], SendOp::default());
        while op.stage != Stage::Writing {
            p.step(&mut op, &m).unwrap();
        }
        assert_eq!(meshd.detach(a), Err(GroupError::StillSending { id: a.0, stuck: 1 }));
        assert_eq!(svc.group.snapshot(0).unwrap().state, EntryState::Bound);
        while p.step(&mut op, &m).unwrap() != Step::Sent {}
        assert_eq!(meshd.detach(a), Ok(Completion::default()));
        assert_eq!(svc.group.snapshot(0).unwrap().state, EntryState::Departed);
    }

    #[test]
    fn a_service_of_two_shards_flows_past_a_client_dead_mid_send_in_the_other() {
        let heap = heap_service_shards(4, 16, 2, 4, 2);
        let svc = heap.svc;
        let mut meshd = ServiceMeshd::new(svc);
        let mut srv = ServiceServer::new(&svc);
        let a = meshd.connect(holder(1)).unwrap(); // slot 0: shard 0
        let b = meshd.connect(holder(2)).unwrap(); // slot 1: shard 1
        assert_eq!((svc.fanin.shard_of(a.0), svc.fanin.shard_of(b.0)), (0, 1));
        let mut ca = ServiceClient::new(&svc, a).unwrap();
        // b dies with its reservation taken, in shard 1.
        let mut pb = svc.fanin.producer(b.0);
        let (m, mut op) = (request(b, 0), SendOp::default());
        while op.stage != Stage::Reserved {
            assert_eq!(pb.step(&mut op, &m).unwrap(), Step::Progress);
        }
        // a's requests go on, laps past shard 0's capacity, each answered.
        let mut req = [0u8; 16];
        let mut out = [0u8; 16];
        for k in 0..5 {
            ca.send(&request(a, k), Duration::from_secs(1)).unwrap();
            assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: a.0 })));
            assert_eq!(req, request(a, k));
            assert_eq!(srv.reply(a.0, &reply(a, k)), Ok(Replied::Sent));
            ca.recv(&mut out, Duration::from_secs(1)).unwrap();
            assert_eq!(out, reply(a, k));
        }
        assert_eq!(srv.try_take(&mut req), Ok(None), "shard 1 waits for b");
        assert_eq!(meshd.depart_dead(b), Ok(Completion { skipped: 1, ..Completion::default() }));
        assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Skipped { sender: b.0 })));
        assert_eq!(srv.departures(), Ok(vec![b]));
        // Its slot's next client sends into the same shard.
        let c = meshd.connect(holder(3)).unwrap();
        assert_eq!((c.slot(), svc.fanin.shard_of(c.0)), (1, 1));
        let mut cc = ServiceClient::new(&svc, c).unwrap();
        cc.send(&request(c, 0), Duration::from_secs(1)).unwrap();
        assert_eq!(srv.try_take(&mut req), Ok(Some(Taken::Message { sender: c.0 })));
        assert_eq!(meshd.revoke(c), Ok(Completion::default()));
    }

    // ---- The model test: meshd, the program (step by step) and the clients, against a model ----

    #[derive(Debug, Clone)]
    enum Op {
        /// meshd binds a new client.
        Connect,
        /// meshd departs the `i`th bound client (its receiver is dropped).
        Depart(usize),
        /// The program replies to the `i`th id ever bound (its request may outlive its client).
        Reply(usize),
        /// The `i`th bound client receives one reply.
        Recv(usize),
        /// The program scans for departures (without acknowledging).
        Scan,
        /// The program acknowledges the `i`th departure of its last scan.
        Ack(usize),
        /// The program's `departures()`: poll `changes`, scan, acknowledge.
        Departures,
        /// The program is relaunched (its scan and its rings' producer state lost).
        RestartProgram,
    }

    fn model_op() -> impl Strategy<Value = Op> {
        let i = || any::<u8>().prop_map(usize::from);
        prop_oneof![
            3 => Just(Op::Connect),
            2 => i().prop_map(Op::Depart),
            5 => i().prop_map(Op::Reply),
            4 => i().prop_map(Op::Recv),
            2 => Just(Op::Scan),
            2 => i().prop_map(Op::Ack),
            2 => Just(Op::Departures),
            1 => Just(Op::RestartProgram),
        ]
    }

    /// An entry as the model sees it, with the replies in its ring since the last connect.
    #[derive(Default)]
    struct ModelEntry {
        epoch: u32,
        bound: bool,
        departed: bool,
        acked: u32,
        queue: VecDeque<(ClientId, u32)>,
    }

    impl ModelEntry {
        fn waits_for_ack(&self) -> bool {
            self.departed && self.acked != self.epoch
        }
    }

    fn run_model(entries: u32, cap_log: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let capacity = 1u32 << cap_log;
        let (_heap, g) = heap_group(entries, 8, capacity);
        let mut meshd = GroupMeshd::new(g);
        let mut prog = GroupProgram::new(g);
        let mut model: Vec<ModelEntry> = (0..entries).map(|_| ModelEntry::default()).collect();
        let mut clients: Vec<ReplyReceiver> = Vec::new();
        let mut known: Vec<ClientId> = Vec::new();
        let mut pending: Vec<Departed> = Vec::new();
        let (mut changes, mut seen, mut n, mut holders) = (0u64, None, 0u32, 0u32);
        let expect_departed = |model: &[ModelEntry]| -> Vec<Departed> {
            (0..entries as u16)
                .filter(|&s| model[usize::from(s)].waits_for_ack())
                .map(|s| Departed { slot: s, epoch: model[usize::from(s)].epoch })
                .collect()
        };
        for op in ops {
            match op {
                Op::Connect => {
                    holders += 1;
                    let got = meshd.connect(holder(holders));
                    match model.iter().position(|e| !e.bound && e.acked == e.epoch) {
                        Some(slot) => {
                            let e = &mut model[slot];
                            e.epoch += 1;
                            (e.bound, e.departed) = (true, false);
                            e.queue.clear();
                            changes += 1;
                            let id = ClientId::new(slot as u16, e.epoch);
                            prop_assert_eq!(got, Ok(id));
                            clients.push(ReplyReceiver::new(&g, id).unwrap());
                            known.push(id);
                        }
                        None => {
                            let bound = model.iter().filter(|e| e.bound).count() as u32;
                            let want = if bound == entries {
                                GroupError::AllBound { entries }
                            } else {
                                GroupError::AwaitingAck { entries, bound, awaiting_ack: entries - bound }
                            };
                            prop_assert_eq!(got, Err(want), "refused, with the reason");
                        }
                    }
                }
                Op::Depart(i) if !clients.is_empty() => {
                    let id = clients.remove(i % clients.len()).id();
                    prop_assert_eq!(meshd.depart(id), Ok(()));
                    let e = &mut model[usize::from(id.slot())];
                    (e.bound, e.departed) = (false, true);
                    changes += 1;
                }
                Op::Reply(i) if !known.is_empty() => {
                    let id = known[i % known.len()];
                    let got = prog.reply(id, &short(id, n));
                    let e = &mut model[usize::from(id.slot())];
                    let want = if !e.bound || ClientId::new(id.slot(), e.epoch) != id {
                        Replied::Gone
                    } else if e.queue.len() == capacity as usize {
                        Replied::Full
                    } else {
                        e.queue.push_back((id, n));
                        Replied::Sent
                    };
                    prop_assert_eq!(got, Ok(want), "reply {} to {:x}", n, id.0);
                    n += 1;
                }
                Op::Recv(i) if !clients.is_empty() => {
                    let i = i % clients.len();
                    let me = clients[i].id();
                    let got = recv8(&mut clients[i]);
                    if let Some((to, _)) = got {
                        prop_assert_eq!(to, me, "a reply meant for another client reached {:x}", me.0);
                    }
                    prop_assert_eq!(got, model[usize::from(me.slot())].queue.pop_front());
                }
                Op::Scan => {
                    pending = prog.scan().unwrap();
                    prop_assert_eq!(&pending, &expect_departed(&model));
                }
                Op::Ack(i) if !pending.is_empty() => {
                    let d = pending[i % pending.len()];
                    let e = &mut model[usize::from(d.slot)];
                    let want = e.departed && e.epoch == d.epoch;
                    prop_assert_eq!(prog.ack(d), Ok(want));
                    if want {
                        e.acked = e.epoch;
                    }
                }
                Op::Departures => {
                    let got = prog.departures().unwrap();
                    let want: Vec<ClientId> = if seen == Some(changes) {
                        Vec::new()
                    } else {
                        let found = expect_departed(&model);
                        for d in &found {
                            model[usize::from(d.slot)].acked = d.epoch;
                        }
                        seen = Some(changes);
                        found.into_iter().map(Departed::id).collect()
                    };
                    prop_assert_eq!(got, want);
                }
                Op::RestartProgram => {
                    prog = GroupProgram::new(g);
                    pending.clear();
                    seen = None;
                }
                Op::Depart(_) | Op::Reply(_) | Op::Recv(_) | Op::Ack(_) => {}
            }
            for (slot, e) in model.iter().enumerate() {
                let s = g.snapshot(slot as u16).unwrap();
                prop_assert_eq!((s.epoch, s.acked_epoch), (e.epoch, e.acked), "entry {}", slot);
            }
        }
        // Everyone leaves; the program's next `departures` acknowledges every entry, and each is bound
        // again, with nothing of its last clients in its ring.
        for rx in clients.drain(..) {
            prop_assert_eq!(meshd.depart(rx.id()), Ok(()));
        }
        prog.departures().unwrap();
        for slot in 0..entries as u16 {
            let s = g.snapshot(slot).unwrap();
            prop_assert_eq!(s.acked_epoch, s.epoch, "entry {} acknowledged", slot);
        }
        let mut slots = Vec::new();
        for k in 0..entries {
            let id = meshd.connect(holder(10_000 + k)).unwrap();
            slots.push(id.slot());
            let mut rx = ReplyReceiver::new(&g, id).unwrap();
            prop_assert_eq!(recv8(&mut rx), None, "entry {}: a reply to an earlier client", id.slot());
            prop_assert_eq!(prog.reply(id, &short(id, 0)), Ok(Replied::Sent));
            prop_assert_eq!(recv8(&mut rx), Some((id, 0)));
        }
        slots.sort_unstable();
        prop_assert_eq!(slots, (0..entries as u16).collect::<Vec<_>>(), "every entry reused");
        prop_assert_eq!(meshd.connect(holder(1)), Err(GroupError::AllBound { entries }));
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 512 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Any interleaving of connects, departures, replies (to bound and to departed ids), receives,
        /// and the program's scans, acknowledgements and relaunches: a reply reaches only the client
        /// it was meant for, in order, and never the next client of a departed one's entry; connect
        /// takes an entry exactly when one is acknowledged, and otherwise says why not; a relaunched
        /// program acknowledges what the last launch had not; at the end every entry is reused.
        #[test]
        fn connect_depart_ack_and_replies_match_the_model(
            entries in 1u32..5,
            cap_log in 0u32..3,
            ops in proptest::collection::vec(model_op(), 1..if cfg!(miri) { 40 } else { 200 }),
        ) {
            run_model(entries, cap_log, ops)?;
        }
    }

    // ---- Threads: clients, meshd and the program at once (what Miri checks for races) ----

    /// Request `k` of client `id`: the two numbers, then a pattern.
    fn request(id: ClientId, k: u32) -> [u8; 16] {
        let mut m = [0u8; 16];
        m[..4].copy_from_slice(&id.0.to_le_bytes());
        m[4..8].copy_from_slice(&k.to_le_bytes());
        m[8..].copy_from_slice(&(u64::from(k) << 32 | u64::from(!id.0)).to_le_bytes());
        m
    }

    /// `f(client, k)`: the reply to request `k` of client `id`.
    fn reply(id: ClientId, k: u32) -> [u8; 16] {
        let mut m = [0u8; 16];
        m[..4].copy_from_slice(&id.0.to_le_bytes());
        m[4..8].copy_from_slice(&k.to_le_bytes());
        m[8..].copy_from_slice(&(u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(id.0)).to_le_bytes());
        m
    }

    /// Set by whichever thread of the test panics, so that the others stop waiting and the test fails
    /// instead of hanging; and a deadline, so that a wait that never ends (an entry never acknowledged)
    /// fails too. Not under Miri, whose clock runs with the interpreter.
    struct Abort(AtomicBool, Instant);

    impl Abort {
        fn new() -> Self {
            Self(AtomicBool::new(false), Instant::now())
        }

        /// Yields, or gives up if another thread has failed or the test has run far too long.
        fn pause(&self) {
            assert!(!self.0.load(Ordering::Relaxed), "another thread of the test failed");
            assert!(cfg!(miri) || self.1.elapsed() < Duration::from_secs(60), "stuck: no progress in 60 s");
            std::thread::yield_now();
        }

        /// Sets the flag if the thread holding the guard panics.
        fn guard(&self) -> AbortOnPanic<'_> {
            AbortOnPanic(self)
        }
    }

    struct AbortOnPanic<'a>(&'a Abort);

    impl Drop for AbortOnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.0.store(true, Ordering::Relaxed);
            }
        }
    }

    /// A client's stream: sends `count` requests (at most `window` unanswered), checks that the
    /// replies are `f(id, k)` in order, and stops after `receive` of them. Returns how many it sent.
    fn stream(svc: &ServiceMemory, id: ClientId, count: u32, receive: u32, window: u32, abort: &Abort) -> u32 {
        let mut c = ServiceClient::new(svc, id).unwrap();
        let (mut sent, mut got) = (0, 0);
        let mut out = [0u8; 16];
        while got < receive {
            if sent < count && sent - got < window && c.try_send(&request(id, sent)).unwrap() {
                sent += 1;
                continue;
            }
            if c.try_recv(&mut out).unwrap() {
                assert_eq!(
                    out,
                    reply(id, got),
                    "client {:x}: reply {got} lost, repeated, reordered or not its own",
                    id.0
                );
                got += 1;
            } else {
                abort.pause();
            }
        }
        sent
    }

    /// meshd's connect for a client that arrives while the table may be full (it waits for a
    /// departure and its acknowledgement, as a client library would retry).
    fn connect_when_free(meshd: &Mutex<ServiceMeshd>, h: Holder, abort: &Abort) -> ClientId {
        loop {
            match meshd.lock().unwrap().connect(h) {
                Ok(id) => return id,
                Err(GroupError::AllBound { .. } | GroupError::AwaitingAck { .. }) => abort.pause(),
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// What the program saw: each sender's next expected request, the skips, the replies dropped.
    #[derive(Debug, Default)]
    struct Served {
        next: BTreeMap<u32, u32>,
        skips: Vec<u32>,
        gone: u32,
    }

    /// The program: takes requests, replies `f(client, k)` (keeping a backlog per client while its
    /// ring is full), drops the state of departed clients, until `stop` and nothing left to take.
    fn serve(svc: &ServiceMemory, stop: &AtomicBool, abort: &Abort) -> Served {
        let mut srv = ServiceServer::new(svc);
        let mut seen = Served::default();
        let mut backlog: BTreeMap<u32, VecDeque<[u8; 16]>> = BTreeMap::new();
        let mut req = [0u8; 16];
        loop {
            for gone in srv.departures().unwrap() {
                if let Some(q) = backlog.remove(&gone.0) {
                    seen.gone += q.len() as u32;
                }
            }
            let mut idle = true;
            match srv.try_take(&mut req).unwrap() {
                Some(Taken::Message { sender }) => {
                    let next = seen.next.entry(sender).or_default();
                    assert_eq!(req, request(ClientId(sender), *next), "sender {sender:x}: lost, repeated or reordered");
                    backlog.entry(sender).or_default().push_back(reply(ClientId(sender), *next));
                    *next += 1;
                    idle = false;
                }
                Some(Taken::Skipped { sender }) => {
                    seen.skips.push(sender);
                    idle = false;
                }
                None => {}
            }
            backlog.retain(|&sender, q| {
                while let Some(m) = q.front() {
                    match srv.reply(sender, m).unwrap() {
                        Replied::Sent => {
                            q.pop_front();
                            idle = false;
                        }
                        Replied::Full => return true,
                        Replied::Gone => {
                            seen.gone += q.len() as u32;
                            return false;
                        }
                    }
                }
                false
            });
            if idle {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                abort.pause();
            }
        }
        srv.departures().unwrap();
        seen
    }

    #[test]
    fn clients_come_go_and_die_while_each_gets_its_own_replies_in_order() {
        let (count, window, requests, replies): (u32, u32, u64, u32) =
            if cfg!(miri) { (4, 2, 4, 2) } else { (3_000, 6, 8, 4) };
        let entries = 4;
        let heap = heap_service(entries, 16, requests, replies);
        let svc = heap.svc;
        let meshd = Mutex::new(ServiceMeshd::new(svc));
        // meshd binds the first four (every entry): the two that join later must reuse an entry.
        let ids: Vec<ClientId> = (0..4).map(|n| meshd.lock().unwrap().connect(holder(n)).unwrap()).collect();
        let (survivors, leaver, dying) = (&ids[..2], ids[2], ids[3]);
        let (left, died, stop) = (AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false));
        let abort = Abort::new();
        let (meshd, left, died, stop, abort) = (&meshd, &left, &died, &stop, &abort);
        let served = std::thread::scope(|s| {
            let _guard = abort.guard();
            let program = s.spawn(move || {
                let _guard = abort.guard();
                serve(&svc, stop, abort)
            });
            let mut clients = Vec::new();
            for &id in survivors {
                clients.push(s.spawn(move || {
                    let _guard = abort.guard();
                    assert_eq!(stream(&svc, id, count, count, window, abort), count);
                    meshd.lock().unwrap().detach(id).unwrap();
                    (id, count)
                }));
            }
            // Leaves with requests unanswered and replies unread (its client dropped first, as a
            // process closes its ends before it says goodbye).
            clients.push(s.spawn(move || {
                let _guard = abort.guard();
                let sent = stream(&svc, leaver, count, count / 2, window, abort);
                assert_eq!(meshd.lock().unwrap().detach(leaver), Ok(Completion::default()));
                left.store(true, Ordering::Release);
                (leaver, sent)
            }));
            // Two join once an entry has been given back, and must see only their own replies.
            for (n, gate) in [(10, left), (11, died)] {
                clients.push(s.spawn(move || {
                    let _guard = abort.guard();
                    while !gate.load(Ordering::Acquire) {
                        abort.pause();
                    }
                    let id = connect_when_free(meshd, holder(n), abort);
                    assert_eq!(stream(&svc, id, count, count, window, abort), count);
                    meshd.lock().unwrap().detach(id).unwrap();
                    (id, count)
                }));
            }
            // Dies: two requests sent whole, the third cut off after its body.
            let dying_thread = s.spawn(move || {
                let _guard = abort.guard();
                let mut p = svc.fanin.producer(dying.0);
                for k in 0..2 {
                    while !p.try_send(&request(dying, k)).unwrap() {
                        abort.pause();
                    }
                }
                let (m, mut op) = (request(dying, 2), SendOp::default());
                while op.stage != Stage::Body {
                    if p.step(&mut op, &m).unwrap() == Step::NoRoom {
                        abort.pause();
                    }
                }
            });
            // meshd: the process is gone (the join orders all its stores before ours, fact 4).
            dying_thread.join().unwrap();
            let done = meshd.lock().unwrap().depart_dead(dying).unwrap();
            assert_eq!(done, Completion { skipped: 1, ..Completion::default() });
            died.store(true, Ordering::Release);
            let sent: Vec<(ClientId, u32)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
            stop.store(true, Ordering::Release);
            let served = program.join().unwrap();
            (sent, served)
        });
        let (sent, served) = served;
        for &(id, n) in &sent {
            assert_eq!(served.next.get(&id.0), Some(&n), "client {:x}: every request taken once, in order", id.0);
        }
        assert_eq!(served.next.get(&dying.0), Some(&2), "the dead client's whole requests");
        assert_eq!(served.skips, [dying.0], "one skip, for the send its death cut off");
        let joined: Vec<ClientId> = sent[3..].iter().map(|&(id, _)| id).collect();
        assert!(joined.iter().all(|id| id.epoch16() >= 2), "the joiners reused entries: {joined:?}");
        // Every departure was acknowledged: the table binds all its entries again, rings empty.
        let mut meshd = ServiceMeshd::new(svc);
        for n in 0..entries {
            let id = meshd.connect(holder(100 + n)).unwrap();
            let mut c = ServiceClient::new(&svc, id).unwrap();
            assert!(!c.try_recv(&mut [0; 16]).unwrap(), "entry {}: a reply left for an earlier client", id.slot());
        }
        assert_eq!(meshd.connect(holder(200)), Err(GroupError::AllBound { entries }));
    }
}
