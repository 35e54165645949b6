//! A fan-in ring's memory: its ownership words, its LL slots with the sender and kind words, and the reads and stores every end makes of them.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::layout::{self, RingHeader};
use crate::ring::tag;

/// Words in front of every slot's body: the sender (word 0, the commit) and the kind (word 1).
#[allow(clippy::cast_possible_truncation, reason = "2")]
pub const HEADER_WORDS: usize = layout::FANIN_HEADER_WORDS as usize;
/// Word 1's payload for a message.
pub const KIND_DATA: u32 = 0;
/// Word 1's payload for a slot completed as a skip: it carries no message.
pub const KIND_SKIP: u32 = 1;

const STATE_SHIFT: u32 = 16;
const TICKET_SHIFT: u32 = 18;
pub(super) const TICKET_MASK: u64 = (1 << (64 - TICKET_SHIFT)) - 1;
pub(super) const LOW: u64 = 0xffff_ffff;

/// The state of a slot's reservation, in its ownership word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnState {
    /// Written and committed by its producer (final: the next lap may reserve the slot). Zero, so a
    /// zeroed table is a finished lap -1.
    Done = 0,
    /// Reserved; the producer has not begun to store into the slot (revocable while it lives).
    Reserved = 1,
    /// The producer stores into the slot (completable only once it is dead or has committed).
    Writing = 2,
    /// Completed as a skip by a completer (final).
    Skipped = 3,
}

impl OwnState {
    /// A state after which the producer stores nothing into the slot, and the next lap may take it.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Skipped)
    }
}

/// A decoded ownership word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// The slot's lap plus one, modulo 2^46.
    pub ticket: u64,
    /// Where the reservation stands.
    pub state: OwnState,
    /// The low 16 bits of the holder's sender id.
    pub owner: u16,
}

impl Ownership {
    /// The word stored in the owner table.
    pub fn word(self) -> u64 {
        (self.ticket & TICKET_MASK) << TICKET_SHIFT | (self.state as u64) << STATE_SHIFT | u64::from(self.owner)
    }

    /// Decodes a word of the owner table (every value decodes).
    #[allow(clippy::cast_possible_truncation, reason = "the owner is the word's low 16 bits, on purpose")]
    pub fn from_word(w: u64) -> Self {
        let state = match (w >> STATE_SHIFT) & 3 {
            0 => OwnState::Done,
            1 => OwnState::Reserved,
            2 => OwnState::Writing,
            _ => OwnState::Skipped,
        };
        Self { ticket: w >> TICKET_SHIFT, state, owner: w as u16 }
    }
}

/// The owner field a sender id is recorded under.
#[allow(clippy::cast_possible_truncation, reason = "the owner field keeps the sender's low 16 bits (its client slot)")]
pub const fn owner_of(sender: u32) -> u16 {
    sender as u16
}

/// What the ring holds cannot have been left by any producer or consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanInCorrupt {
    /// The reservation cursor is more than a ring ahead of the consumer.
    Indices {
        /// The cursor read.
        next: u64,
        /// The consumer's position read.
        tail: u64,
    },
    /// The slot the cursor points at was never reserved in its previous lap.
    Owner {
        /// The cursor read.
        seq: u64,
        /// The slot's ownership word.
        word: u64,
    },
    /// A slot whose header words carry the right tag has a kind no producer writes.
    Kind {
        /// The message's sequence number.
        seq: u64,
        /// Word 1's payload.
        kind: u32,
    },
}

/// A fan-in ring's memory: its header, owner table and slots.
#[derive(Debug, Clone, Copy)]
pub struct FanInMemory {
    pub(super) header: NonNull<RingHeader>,
    pub(super) owners: NonNull<AtomicU64>,
    pub(super) slots: NonNull<AtomicU64>,
    pub(super) msg_size: usize,
    pub(super) capacity: u64,
    cap_log: u32,
    /// Tickets count laps modulo 2^46, or modulo the number of laps in 2^64 messages when that is
    /// smaller (rings above 2^18 slots), so that the lap after the 64-bit wrap follows the last one.
    pub(super) ticket_mask: u64,
}

// SAFETY: the ring is shared memory by design; every access goes through atomics, and the protocol
// hands each slot to one writer at a time.
unsafe impl Send for FanInMemory {}
// SAFETY: as above; `&FanInMemory` exposes only the same atomic accesses.
unsafe impl Sync for FanInMemory {}

impl FanInMemory {
    /// Bytes of the owner table of a ring of `capacity` slots.
    pub const fn owner_bytes(capacity: u64) -> u64 {
        layout::fanin_owner_bytes(capacity)
    }

    /// Bytes of the slots of a ring of `capacity` messages of `msg_size` payload bytes.
    pub const fn slot_bytes(msg_size: u32, capacity: u64) -> u64 {
        layout::fanin_ll_bytes(msg_size, capacity)
    }

    /// # Safety
    /// `header` must point to a [`RingHeader`]; `owners` to `capacity` 8-byte words; `slots` to
    /// [`FanInMemory::slot_bytes`] writable bytes, 16-byte aligned; all valid for as long as the
    /// returned value and its copies are used, and accessed by others only through this protocol.
    /// `capacity` must be a power of two below 2^31; `msg_size` a non-zero multiple of 8. Zeroed
    /// memory is an empty ring at position 0.
    pub unsafe fn new(
        header: NonNull<RingHeader>,
        owners: NonNull<AtomicU64>,
        slots: NonNull<AtomicU64>,
        msg_size: usize,
        capacity: u64,
    ) -> Self {
        debug_assert!(capacity.is_power_of_two() && capacity < 1 << 31);
        debug_assert!(msg_size > 0 && msg_size.is_multiple_of(8));
        let cap_log = capacity.trailing_zeros();
        let ticket_mask = TICKET_MASK >> cap_log.saturating_sub(TICKET_SHIFT);
        Self { header, owners, slots, msg_size, capacity, cap_log, ticket_mask }
    }

    /// Payload bytes per message.
    pub fn msg_size(&self) -> usize {
        self.msg_size
    }

    /// Messages the ring holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The capacity as an index bound.
    #[allow(clippy::cast_possible_truncation, reason = "capacity < 2^31 (see `new`): the slots are in memory")]
    pub(super) fn slot_count(&self) -> usize {
        self.capacity as usize
    }

    pub(super) fn header(&self) -> &RingHeader {
        // SAFETY: `new`'s contract keeps the header valid; it is only accessed through atomics.
        unsafe { self.header.as_ref() }
    }

    pub(super) fn cursor(&self) -> &AtomicU64 {
        &self.header().producer.head
    }

    /// The reservation cursor: every sequence number below it is reserved (it may lag by one: the
    /// winner of a reservation, or anyone after it, moves it on).
    pub fn next(&self) -> u64 {
        self.cursor().load(Ordering::Acquire)
    }

    /// The consumer's position as published (Acquire: its reads of the slots below it are done).
    pub fn tail(&self) -> u64 {
        self.header().consumer.tail.load(Ordering::Acquire)
    }

    #[allow(clippy::cast_possible_truncation, reason = "masked to capacity - 1, whose slots are in memory")]
    pub(super) fn index(&self, seq: u64) -> usize {
        (seq & (self.capacity - 1)) as usize
    }

    pub(super) fn ticket(&self, seq: u64) -> u64 {
        (seq >> self.cap_log).wrapping_add(1) & self.ticket_mask
    }

    /// The low bits of the sequence number that slot `i` holds in lap `ticket - 1`: exact in its low
    /// `46 + log2(capacity)` bits, which is more than the 31 bits a tag keeps.
    pub(super) fn seq_at(&self, i: usize, ticket: u64) -> u64 {
        (ticket.wrapping_sub(1) << self.cap_log) | i as u64
    }

    /// Slot `i`'s ownership word.
    pub(super) fn owner_word(&self, i: usize) -> &AtomicU64 {
        assert!((i as u64) < self.capacity);
        // SAFETY: `i < capacity` words lie in the table `new` promised; AtomicU64 has u64's layout.
        unsafe { &*self.owners.as_ptr().add(i) }
    }

    /// The ownership of slot `i` as it is now.
    pub fn ownership(&self, i: usize) -> Ownership {
        Ownership::from_word(self.owner_word(i).load(Ordering::Acquire))
    }

    /// The words of message `seq`'s slot: the two header words, then the body.
    pub(super) fn words(&self, seq: u64) -> &[AtomicU64] {
        let n = HEADER_WORDS + self.msg_size / 4;
        // SAFETY: the slot of `seq` is `n` words at `index(seq) * n`, inside the `capacity * n` words
        // `new` promised; every access to them is atomic.
        unsafe { core::slice::from_raw_parts(self.slots.as_ptr().add(self.index(seq) * n), n) }
    }

    /// Writes the skip header of message `seq` (word 1 first, word 0, the commit, last). Only the
    /// completer that moved the slot to Skipped (or [`repair`]) calls it, and no producer can store
    /// into the slot then: its owner's `begin` fails, and the next lap needs `tail` past `seq`,
    /// which needs this header.
    pub(super) fn write_skip(&self, seq: u64, sender: u32) {
        let w = self.words(seq);
        let t = u64::from(tag(seq)) << 32;
        w[1].store(t | u64::from(KIND_SKIP), Ordering::Relaxed);
        w[0].store(t | u64::from(sender), Ordering::Release);
    }

    /// Whether message `seq`'s commit word (word 0) carries its tag.
    pub(super) fn committed(&self, seq: u64) -> bool {
        (self.words(seq)[0].load(Ordering::Acquire) >> 32) as u32 == tag(seq)
    }
}
