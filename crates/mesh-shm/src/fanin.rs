//! The fan-in ring over raw memory: many host producers, one consumer (a GPU program or a host process), every message carrying its sender, a dead or stalled producer's reservation completed as a skip.
//!
//! The design, defended, is `docs/design/many-clients.md`; this is its CPU core. Kept free of files
//! and mappings so that Miri runs it over heap memory (`cargo +nightly miri test -p mesh-shm --lib
//! fanin::`). In the mailbox it is a channel of protocol fanin (layout version 4,
//! `layout::PROTOCOL_FANIN`; `Mailbox::create_fanin`), whose host ends are `service`'s; its GPU
//! consumer (mesh.cuh) and meshd's wiring come next.
//!
//! **Memory** (three regions, like the other rings: a [`RingHeader`], an owner table, the slots):
//!
//! * The header's `head` is the *reservation cursor* (host only: producers advance it with CAS; no
//!   consumer reads it); `tail` is the consumer's position, its only write (the GPU's one word, a
//!   plain store, as for every ring).
//! * The owner table: one 8-byte *ownership word* per slot, host only (producers and the completer
//!   CAS it; the GPU never reads it): `ticket << 18 | state << 16 | owner`. The ticket is the slot's
//!   lap plus one (46 bits), so an all-zero table is "lap -1 done" and a zeroed region is an empty
//!   ring at position 0. The state is [`OwnState`]; the owner is the low 16 bits of the sender id.
//!   **The reservation is this CAS**, from "previous lap, final" to "this lap, Reserved, me": the
//!   owner is recorded by the same atomic instruction that reserves the slot, so no death leaves a
//!   reserved slot without an owner.
//! * The slots, in the LL word format (`ring`): message `seq` takes `2 + msg_size / 4` 8-byte words,
//!   each `tag(seq) << 32 | 4 payload bytes`. Word 0 carries the sender id, word 1 the kind
//!   ([`KIND_DATA`] or [`KIND_SKIP`]), then the body. A producer stores the body, then word 1, then
//!   word 0 (Release): word 0 is the *commit*. A consumer, GPU or host, reads the slot alone: word 0
//!   not tagged `seq` = nothing yet; word 1 a skip = a skip, whatever the body holds; otherwise every
//!   word must carry the tag.
//!
//! **A send**: reserve (the CAS above, after checking `tail` for room), *begin* (CAS Reserved ->
//! Writing: the point after which the producer stores into the slot), the body, word 1, word 0, then
//! *finish* (CAS Writing -> Done, which lets the next lap reserve the slot). Every change of an
//! ownership word is a CAS that compares the whole word, ticket included: a producer that was
//! stopped and whose reservation was completed by someone else fails its next CAS and stores nothing
//! into the slot (its late `begin` or `finish` is harmless). The one window in which a stopped
//! producer cannot be completed is between `begin` and the commit (the copy of one message).
//!
//! **Completion** (meshd's, [`complete_dead`] and [`revoke_live`]; one completer at a time): a
//! Reserved slot is made Skipped (a CAS; the owner's `begin` then fails and its send retries) and
//! the skip header written; a Writing slot whose word 0 is committed is made Done; a Writing slot
//! not committed is made Skipped and given a skip header only when its owner is dead (its stores
//! are over). [`repair`] writes the skip headers a completer that died left unwritten. meshd's stall
//! watcher finds a live producer to revoke with [`hold_at_tail`]: the reservation that has held the
//! consumer's published position for its `T_stall`.
//!
//! **Shards** ([`FanInShards`]): a fan-in channel of P shards is P of these rings, sharing nothing
//! (where each lies: `layout::fanin_shard_offset`). A producer sends into shard `slot % P` alone
//! ([`FanInShards::producer`]), so every rule above holds per shard and a sender's order is kept; a
//! host consumer takes from the shards round-robin ([`ShardedConsumer`]); completion, repair and the
//! stall probe run over every shard.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::layout::{self, RingHeader};
use crate::ring::tag;

/// Words in front of every slot's body: the sender (word 0, the commit) and the kind (word 1).
pub const HEADER_WORDS: usize = 2;
/// Word 1's payload for a message.
pub const KIND_DATA: u32 = 0;
/// Word 1's payload for a slot completed as a skip: it carries no message.
pub const KIND_SKIP: u32 = 1;

const STATE_SHIFT: u32 = 16;
const TICKET_SHIFT: u32 = 18;
const TICKET_MASK: u64 = (1 << (64 - TICKET_SHIFT)) - 1;
const LOW: u64 = 0xffff_ffff;

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
    header: NonNull<RingHeader>,
    owners: NonNull<AtomicU64>,
    slots: NonNull<AtomicU64>,
    msg_size: usize,
    capacity: u64,
    cap_log: u32,
    /// Tickets count laps modulo 2^46, or modulo the number of laps in 2^64 messages when that is
    /// smaller (rings above 2^18 slots), so that the lap after the 64-bit wrap follows the last one.
    ticket_mask: u64,
}

// SAFETY: the ring is shared memory by design; every access goes through atomics, and the protocol
// hands each slot to one writer at a time.
unsafe impl Send for FanInMemory {}
// SAFETY: as above; `&FanInMemory` exposes only the same atomic accesses.
unsafe impl Sync for FanInMemory {}

impl FanInMemory {
    /// Bytes of the owner table of a ring of `capacity` slots.
    pub const fn owner_bytes(capacity: u64) -> u64 {
        8 * capacity
    }

    /// Bytes of the slots of a ring of `capacity` messages of `msg_size` payload bytes.
    pub const fn slot_bytes(msg_size: u32, capacity: u64) -> u64 {
        (8 * HEADER_WORDS as u64 + 2 * msg_size as u64) * capacity
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
    fn slot_count(&self) -> usize {
        self.capacity as usize
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: `new`'s contract keeps the header valid; it is only accessed through atomics.
        unsafe { self.header.as_ref() }
    }

    fn cursor(&self) -> &AtomicU64 {
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
    fn index(&self, seq: u64) -> usize {
        (seq & (self.capacity - 1)) as usize
    }

    fn ticket(&self, seq: u64) -> u64 {
        (seq >> self.cap_log).wrapping_add(1) & self.ticket_mask
    }

    /// The low bits of the sequence number that slot `i` holds in lap `ticket - 1`: exact in its low
    /// `46 + log2(capacity)` bits, which is more than the 31 bits a tag keeps.
    fn seq_at(&self, i: usize, ticket: u64) -> u64 {
        (ticket.wrapping_sub(1) << self.cap_log) | i as u64
    }

    /// Slot `i`'s ownership word.
    fn owner_word(&self, i: usize) -> &AtomicU64 {
        assert!((i as u64) < self.capacity);
        // SAFETY: `i < capacity` words lie in the table `new` promised; AtomicU64 has u64's layout.
        unsafe { &*self.owners.as_ptr().add(i) }
    }

    /// The ownership of slot `i` as it is now.
    pub fn ownership(&self, i: usize) -> Ownership {
        Ownership::from_word(self.owner_word(i).load(Ordering::Acquire))
    }

    /// The words of message `seq`'s slot: the two header words, then the body.
    fn words(&self, seq: u64) -> &[AtomicU64] {
        let n = HEADER_WORDS + self.msg_size / 4;
        // SAFETY: the slot of `seq` is `n` words at `index(seq) * n`, inside the `capacity * n` words
        // `new` promised; every access to them is atomic.
        unsafe { core::slice::from_raw_parts(self.slots.as_ptr().add(self.index(seq) * n), n) }
    }

    /// Writes the skip header of message `seq` (word 1 first, word 0, the commit, last). Only the
    /// completer that moved the slot to Skipped (or [`repair`]) calls it, and no producer can store
    /// into the slot then: its owner's `begin` fails, and the next lap needs `tail` past `seq`,
    /// which needs this header.
    fn write_skip(&self, seq: u64, sender: u32) {
        let w = self.words(seq);
        let t = u64::from(tag(seq)) << 32;
        w[1].store(t | u64::from(KIND_SKIP), Ordering::Relaxed);
        w[0].store(t | u64::from(sender), Ordering::Release);
    }

    /// Whether message `seq`'s commit word (word 0) carries its tag.
    fn committed(&self, seq: u64) -> bool {
        (self.words(seq)[0].load(Ordering::Acquire) >> 32) as u32 == tag(seq)
    }
}

/// Where one send stands: what [`FanInProducer::step`] does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Nothing reserved.
    Idle,
    /// Slot `seq` reserved (owner recorded); not yet begun.
    Reserved,
    /// Begun: the producer stores into the slot.
    Writing,
    /// The first half of the body stored.
    HalfBody,
    /// The whole body stored.
    Body,
    /// Word 1 (the kind) stored.
    Kind,
    /// Word 0 stored: the message is committed (the consumer may take it).
    Committed,
}

/// One send in progress, advanced one store or CAS at a time by [`FanInProducer::step`] (the model
/// test stops a producer after any of them; [`FanInProducer::try_send`] runs them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendOp {
    /// Where the send stands.
    pub stage: Stage,
    /// The message's sequence number once reserved.
    pub seq: u64,
}

impl Default for SendOp {
    fn default() -> Self {
        Self { stage: Stage::Idle, seq: 0 }
    }
}

/// What one step of a send did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// One step done; call again.
    Progress,
    /// No slot to reserve now (the ring is full, or the slot's previous lap is not finished yet).
    NoRoom,
    /// The reservation was completed as a skip before the send began: the op is Idle again, and
    /// the same message is sent anew on the next step (the consumer saw a skip from this sender).
    Revoked,
    /// The message is committed and its slot finished.
    Sent,
}

/// One host producer: its sender id and a cached copy of the consumer's position.
#[derive(Debug)]
pub struct FanInProducer {
    ring: FanInMemory,
    sender: u32,
    cached_tail: u64,
}

impl FanInProducer {
    /// A producer that sends as `sender` (meshd hands it out; its low 16 bits, [`owner_of`], name
    /// the producer in the owner table and must be unique among the ring's live producers).
    pub fn new(ring: FanInMemory, sender: u32) -> Self {
        Self { ring, sender, cached_tail: ring.tail() }
    }

    /// The sender id this producer writes into word 0.
    pub fn sender(&self) -> u32 {
        self.sender
    }

    /// Reserves the next slot: `Ok(Some(seq))`, or `Ok(None)` when there is no room now.
    fn reserve(&mut self) -> Result<Option<u64>, FanInCorrupt> {
        let ring = self.ring;
        let me = owner_of(self.sender);
        loop {
            let seq = ring.cursor().load(Ordering::Acquire);
            let word = ring.owner_word(ring.index(seq));
            let cur = word.load(Ordering::Acquire);
            let own = Ownership::from_word(cur);
            let want = ring.ticket(seq);
            if own.ticket == want {
                // `seq` is taken (its winner died or is slow to move the cursor): move it on for them.
                let _ = ring.cursor().compare_exchange(seq, seq.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed);
                continue;
            }
            // Room: message `seq - capacity` must be consumed. The Acquire load of `tail` orders the
            // consumer's reads of that message before our stores into the slot.
            let mut ahead = seq.wrapping_sub(self.cached_tail);
            if (ahead as i64) < 0 || ahead >= ring.capacity {
                self.cached_tail = ring.tail();
                ahead = seq.wrapping_sub(self.cached_tail);
                if (ahead as i64) < 0 {
                    // The consumer passed `seq`: our reads are stale, so the cursor or the slot's word
                    // has moved since (a slot revoked between its reservation and the cursor's move
                    // was taken as a skip: its word moved). Neither moving is a cursor behind the
                    // consumer, which no producer leaves (a peer wrote it): an error, not a loop that
                    // would read the same words forever.
                    if ring.cursor().load(Ordering::Acquire) == seq && word.load(Ordering::Acquire) == cur {
                        return Err(FanInCorrupt::Indices { next: seq, tail: self.cached_tail });
                    }
                    continue;
                }
                if ahead > ring.capacity {
                    return Err(FanInCorrupt::Indices { next: seq, tail: self.cached_tail });
                }
                if ahead == ring.capacity {
                    return Ok(None);
                }
            }
            let prev = want.wrapping_sub(1) & ring.ticket_mask;
            if own.ticket != prev {
                // A later lap holds the slot: our cursor read is stale. An earlier one cannot: the
                // cursor at `seq` means `seq - capacity` was reserved, and tickets only grow.
                if prev.wrapping_sub(own.ticket) & ring.ticket_mask <= ring.ticket_mask / 2 {
                    return Err(FanInCorrupt::Owner { seq, word: cur });
                }
                // A later lap was reserved only after the cursor passed `seq`: a cursor still there
                // with a later lap in its slot is a word a peer wrote (an error, as above, not a spin).
                if ring.cursor().load(Ordering::Acquire) == seq && word.load(Ordering::Acquire) == cur {
                    return Err(FanInCorrupt::Owner { seq, word: cur });
                }
                continue;
            }
            if !own.state.is_final() {
                // The previous lap was consumed but its producer has not finished (it is between its
                // commit and its finish, or stopped there): the slot is not free yet.
                return Ok(None);
            }
            let mine = Ownership { ticket: want, state: OwnState::Reserved, owner: me }.word();
            // The reservation and the owner's record in one CAS, compared against the whole previous
            // word, so a stale `seq` (a lap behind) can never win.
            if word.compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                let _ = ring.cursor().compare_exchange(seq, seq.wrapping_add(1), Ordering::AcqRel, Ordering::Relaxed);
                return Ok(Some(seq));
            }
        }
    }

    /// Moves slot `seq` from `from` to `to` if it still holds this producer's reservation in state
    /// `from` (a completer may have taken it: then nothing changes, and the caller stores nothing).
    fn transition(&self, seq: u64, from: OwnState, to: OwnState) -> bool {
        let ring = self.ring;
        let (ticket, owner) = (ring.ticket(seq), owner_of(self.sender));
        let old = Ownership { ticket, state: from, owner }.word();
        let new = Ownership { ticket, state: to, owner }.word();
        ring.owner_word(ring.index(seq)).compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Stores body words `range` of message `op.seq` from `msg` (zero-padded past its end).
    fn store_body(&self, seq: u64, msg: &[u8], range: core::ops::Range<usize>) {
        let t = u64::from(tag(seq)) << 32;
        let body = &self.ring.words(seq)[HEADER_WORDS..];
        for k in range {
            let mut b = [0u8; 4];
            let src = msg.get(4 * k..).unwrap_or(&[]);
            let n = src.len().min(4);
            b[..n].copy_from_slice(&src[..n]);
            body[k].store(t | u64::from(u32::from_le_bytes(b)), Ordering::Relaxed);
        }
    }

    /// Advances `op` by one reservation, CAS or store (see [`Stage`]), sending `msg` (at most the
    /// message size; shorter is zero-padded). The same `msg` must be passed until [`Step::Sent`].
    pub fn step(&mut self, op: &mut SendOp, msg: &[u8]) -> Result<Step, FanInCorrupt> {
        debug_assert!(msg.len() <= self.ring.msg_size);
        let words = self.ring.msg_size / 4;
        let t = u64::from(tag(op.seq)) << 32;
        match op.stage {
            Stage::Idle => match self.reserve()? {
                Some(seq) => *op = SendOp { stage: Stage::Reserved, seq },
                None => return Ok(Step::NoRoom),
            },
            Stage::Reserved => {
                if !self.transition(op.seq, OwnState::Reserved, OwnState::Writing) {
                    // Revoked while we were stopped: the slot is a skip now and we never stored into it.
                    *op = SendOp::default();
                    return Ok(Step::Revoked);
                }
                op.stage = Stage::Writing;
            }
            Stage::Writing => {
                self.store_body(op.seq, msg, 0..words / 2);
                op.stage = Stage::HalfBody;
            }
            Stage::HalfBody => {
                self.store_body(op.seq, msg, words / 2..words);
                op.stage = Stage::Body;
            }
            Stage::Body => {
                self.ring.words(op.seq)[1].store(t | u64::from(KIND_DATA), Ordering::Relaxed);
                op.stage = Stage::Kind;
            }
            Stage::Kind => {
                // The commit: Release, so a host consumer's Acquire load of word 0 sees every word above.
                self.ring.words(op.seq)[0].store(t | u64::from(self.sender), Ordering::Release);
                op.stage = Stage::Committed;
            }
            Stage::Committed => {
                // A CAS, not a store: a completer may already have finished the slot (we were stopped
                // after the commit) and the next lap may hold it; then this fails and changes nothing.
                let _ = self.transition(op.seq, OwnState::Writing, OwnState::Done);
                *op = SendOp::default();
                return Ok(Step::Sent);
            }
        }
        Ok(Step::Progress)
    }

    /// Sends one message (shorter ones are zero-padded); `false` when there is no room now. A
    /// reservation revoked under it (the process was stopped long enough for meshd to skip it) is
    /// retried, so a `true` means the message is committed exactly once.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool, FanInCorrupt> {
        assert!(msg.len() <= self.ring.msg_size, "a message longer than the ring's message size");
        let mut op = SendOp::default();
        loop {
            match self.step(&mut op, msg)? {
                Step::Progress | Step::Revoked => {}
                Step::NoRoom => return Ok(false),
                Step::Sent => return Ok(true),
            }
        }
    }
}

/// What the consumer took from a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A message from this sender, copied into the caller's buffer.
    Message {
        /// The sender id its producer wrote.
        sender: u32,
    },
    /// A slot completed as a skip: it carries nothing (the sender's send was cut off by its death,
    /// or revoked and sent again later). The buffer is untouched.
    Skipped {
        /// The sender whose reservation it was.
        sender: u32,
    },
}

/// The single consumer's private state (a host consumer; the GPU's is in `mesh.cuh`, same rules).
#[derive(Debug)]
pub struct FanInConsumer {
    ring: FanInMemory,
    tail: u64,
}

impl FanInConsumer {
    /// Takes over the consumer end at the published `tail` (a consumer that died after taking a
    /// message and before publishing gives it again: a host consumer publishes on every take).
    pub fn new(ring: FanInMemory) -> Self {
        Self { ring, tail: ring.tail() }
    }

    /// The sequence number of the next slot to take.
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// Takes the next slot: a message (copied into `out`, exactly the message size) with its
    /// sender, a skip, or `None` when the slot is not committed yet. Publishes `tail`.
    pub fn try_take(&mut self, out: &mut [u8]) -> Result<Option<Taken>, FanInCorrupt> {
        assert_eq!(out.len(), self.ring.msg_size, "the buffer must be one message");
        let seq = self.tail;
        let w = self.ring.words(seq);
        let t = tag(seq);
        // Acquire on the commit word: a host producer's Release store of it covers every other word.
        let w0 = w[0].load(Ordering::Acquire);
        if (w0 >> 32) as u32 != t {
            return Ok(None);
        }
        let w1 = w[1].load(Ordering::Relaxed);
        if (w1 >> 32) as u32 != t {
            return Ok(None); // still arriving (a GPU-side reader can see word 0 first)
        }
        #[allow(clippy::cast_possible_truncation, reason = "a word's payload is its low half")]
        let (sender, kind) = ((w0 & LOW) as u32, (w1 & LOW) as u32);
        let taken = match kind {
            KIND_SKIP => Taken::Skipped { sender },
            KIND_DATA => {
                // Every word checked, as the GPU does: the protocol does not need it on the host
                // (the Acquire above does), but a slot that fails it is a bug we want to see, not read.
                let mut whole = true;
                for (word, o) in w[HEADER_WORDS..].iter().zip(out.chunks_exact_mut(4)) {
                    let v = word.load(Ordering::Relaxed);
                    whole &= (v >> 32) as u32 == t;
                    #[allow(clippy::cast_possible_truncation, reason = "a word's payload is its low half")]
                    o.copy_from_slice(&(v as u32).to_le_bytes());
                }
                if !whole {
                    return Ok(None);
                }
                Taken::Message { sender }
            }
            kind => return Err(FanInCorrupt::Kind { seq, kind }),
        };
        self.tail = seq.wrapping_add(1);
        // Release: our reads of the slot happen before any producer's Acquire of this `tail` and its
        // stores into the slot's next lap.
        self.ring.header().consumer.tail.store(self.tail, Ordering::Release);
        Ok(Some(taken))
    }
}

/// What a completer did to one producer's reservations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion {
    /// Slots completed as skips (the consumer will take a [`Taken::Skipped`] for each).
    pub skipped: u32,
    /// Slots whose message was committed and that were finished on the producer's behalf.
    pub finished: u32,
    /// Slots left alone: the producer is alive and between its begin and its commit.
    pub stuck: u32,
}

fn complete(ring: &FanInMemory, sender: u32, dead: bool) -> Completion {
    let mut done = Completion::default();
    let owner = owner_of(sender);
    for i in 0..ring.slot_count() {
        let word = ring.owner_word(i);
        let cur = word.load(Ordering::Acquire);
        let own = Ownership::from_word(cur);
        if own.owner != owner || own.state.is_final() {
            continue;
        }
        let seq = ring.seq_at(i, own.ticket);
        let to = |state| Ownership { state, ..own }.word();
        match own.state {
            OwnState::Reserved => {
                // The CAS arbitrates with the owner's `begin`: whoever wins, the other stores nothing.
                if word.compare_exchange(cur, to(OwnState::Skipped), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    ring.write_skip(seq, sender);
                    done.skipped += 1;
                } else if !dead {
                    done.stuck += u32::from(ring.ownership(i).state == OwnState::Writing);
                }
            }
            OwnState::Writing if ring.committed(seq) => {
                // The message is whole (its commit is its last store): finish it. A live owner's own
                // finish CAS then fails, harmlessly.
                if word.compare_exchange(cur, to(OwnState::Done), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    done.finished += 1;
                }
            }
            OwnState::Writing if dead => {
                // Cut off before its commit and never to store again: a skip. The header overwrites
                // its word 1; its body words are left, and a consumer ignores a skip's body.
                if word.compare_exchange(cur, to(OwnState::Skipped), Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    ring.write_skip(seq, sender);
                    done.skipped += 1;
                }
            }
            _ => done.stuck += 1,
        }
    }
    done
}

/// Completes every reservation `sender`'s producer holds, once its process is dead (meshd knows:
/// its pidfd is readable, or its claim names a process that no longer runs). Not `unsafe` (it only
/// uses atomics) but a protocol contract: called for a live producer, it may skip a slot the
/// producer is still storing into, and the consumer could then take a skip whose slot the producer
/// overwrites later. Call [`revoke_live`] for a producer that may be alive.
pub fn complete_dead(ring: &FanInMemory, sender: u32) -> Completion {
    complete(ring, sender, true)
}

/// Completes what can be completed of a producer that may be alive (stopped, or just slow): its
/// Reserved slots become skips (its `begin` then fails and it sends again), its committed Writing
/// slots are finished. A slot between begin and commit is left and counted in `stuck`.
pub fn revoke_live(ring: &FanInMemory, sender: u32) -> Completion {
    complete(ring, sender, false)
}

/// What holds a ring's consumer at its published position: a reservation of the slot there that is
/// not final. meshd's stall watcher reads it every few ms (three words: `tail`, one ownership word,
/// and word 0 when the slot is being written) and acts through [`revoke_live`] once the same hold has
/// lasted its `T_stall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The consumer's published position.
    pub tail: u64,
    /// The message whose reservation holds the ring: `tail` itself (the consumer waits for it), or
    /// `tail - capacity`, the slot's last lap (taken, but its producer never finished it, so no
    /// producer can reserve `tail`: the ring is stopped there though the consumer has taken
    /// everything).
    pub seq: u64,
    /// The slot's ownership word as read. Once `tail` stays put, a slot's word only moves forward
    /// (Reserved, Writing, Done, then the next lap), never back to a word it held: the same word read
    /// twice is the same reservation, unmoved in between.
    pub word: u64,
    /// The holder's owner field (the low 16 bits of its sender id: its client slot).
    pub owner: u16,
    /// Reserved (revocable) or Writing.
    pub state: OwnState,
    /// Whether message `seq`'s commit word carries its tag (Writing and committed: only its finish is
    /// missing, which a completer may do for it).
    pub committed: bool,
}

/// The reservation that holds the consumer at its published position, if one does (see [`Hold`]).
/// Reads only: safe at any time, from any process. `None` when the slot at `tail` is final (an idle
/// ring, or one whose consumer is simply behind), or holds a lap `tail` cannot explain (`tail` moved
/// on between the two reads).
pub fn hold_at_tail(ring: &FanInMemory) -> Option<Hold> {
    let tail = ring.tail();
    let word = ring.owner_word(ring.index(tail)).load(Ordering::Acquire);
    let own = Ownership::from_word(word);
    if own.state.is_final() {
        return None;
    }
    let last_lap = tail.wrapping_sub(ring.capacity);
    let seq = if own.ticket == ring.ticket(tail) {
        tail
    } else if own.ticket == ring.ticket(last_lap) {
        last_lap
    } else {
        return None;
    };
    let committed = own.state == OwnState::Writing && ring.committed(seq);
    Some(Hold { tail, seq, word, owner: own.owner, state: own.state, committed })
}

/// Writes the skip header of every Skipped slot that lacks it (a completer that died between its
/// CAS and its header, e.g. meshd killed; run by the next one before anything else). Returns how
/// many it wrote. Only one completer may run at a time.
pub fn repair(ring: &FanInMemory) -> u32 {
    let mut written = 0;
    for i in 0..ring.slot_count() {
        let word = ring.owner_word(i);
        let cur = word.load(Ordering::Acquire);
        let own = Ownership::from_word(cur);
        if own.state != OwnState::Skipped {
            continue;
        }
        let seq = ring.seq_at(i, own.ticket);
        if ring.committed(seq) {
            continue;
        }
        // Word 0 lacks the tag. If the slot still is Skipped for this lap after that read (the
        // Acquire load of word 0 keeps this load after it), the header was never written: no other
        // completer writes it, so the consumer cannot pass `seq`, and no producer can reuse the slot
        // before we write it. Were the slot reused in between, the word would have changed.
        if word.load(Ordering::Acquire) != cur {
            continue;
        }
        // The skip's sender: the owner field keeps 16 bits; the full id is meshd's (its client table).
        ring.write_skip(seq, u32::from(own.owner));
        written += 1;
    }
    written
}

impl core::ops::AddAssign for Completion {
    fn add_assign(&mut self, o: Self) {
        self.skipped += o.skipped;
        self.finished += o.finished;
        self.stuck += o.stuck;
    }
}

// ---- Shards ----

/// A fan-in channel's shards: P whole fan-in rings (P a power of two, 1 to
/// [`layout::MAX_FANIN_SHARDS`]), each with its own cursor, tail, owner table and slots, sharing
/// nothing, so that senders contend only with the senders of their shard (one cursor line that every
/// sender writes caps one ring near 3 M sends/s; see `docs/design/many-clients.md`). Where each lies
/// is `layout`'s to say ([`layout::fanin_shard_offset`]); one shard is exactly the one ring of a
/// fan-in channel before shards existed.
///
/// A sender sends into shard [`FanInShards::shard_of`] its id (its client slot modulo P) and no
/// other, so its messages stay in order in one ring; a consumer takes from every shard
/// ([`ShardedConsumer`]); a completer and the stall watcher look at every shard.
#[derive(Debug, Clone, Copy)]
pub struct FanInShards {
    first: FanInMemory,
    region: NonNull<u8>,
    msg_size: u32,
    capacity: u32,
    count: u32,
}

// SAFETY: as for `FanInMemory`: shared memory by design, every access atomic.
unsafe impl Send for FanInShards {}
// SAFETY: as above; `&FanInShards` only hands out `FanInMemory` views of the same memory.
unsafe impl Sync for FanInShards {}

impl FanInShards {
    /// # Safety
    /// `header` must point to shard 0's [`RingHeader`]; `region` to the channel's slots region,
    /// [`layout::fanin_region_bytes`]`(msg_size, capacity, count)` writable bytes, 128-byte aligned
    /// (every shard's header is then line aligned, its owner table and slots page aligned from it);
    /// all valid for as long as the returned value and its copies are used, and accessed by others
    /// only through this protocol. `count` must be a power of two from 1 to
    /// [`layout::MAX_FANIN_SHARDS`]; `capacity` a power of two below 2^31; `msg_size` a non-zero
    /// multiple of 8. Zeroed memory is every shard empty at position 0.
    pub unsafe fn new(
        header: NonNull<RingHeader>,
        region: NonNull<u8>,
        msg_size: u32,
        capacity: u32,
        count: u32,
    ) -> Self {
        debug_assert!(count.is_power_of_two() && count <= layout::MAX_FANIN_SHARDS);
        // SAFETY: the caller's contract: shard 0's owner table starts the region, its slots
        // `fanin_slots_offset` after it, inside the region's bytes.
        let first = unsafe {
            let slots = region.add(in_region(layout::fanin_slots_offset(capacity)));
            FanInMemory::new(header, region.cast(), slots.cast(), msg_size as usize, u64::from(capacity))
        };
        Self { first, region, msg_size, capacity, count }
    }

    /// How many shards.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Payload bytes per message (every shard's).
    pub fn msg_size(&self) -> usize {
        self.first.msg_size()
    }

    /// Messages each shard holds.
    pub fn capacity(&self) -> u64 {
        self.first.capacity()
    }

    /// Shard `k` (below [`FanInShards::count`]; a caller's bug otherwise, never a file's: the count
    /// is checked when the channel is opened).
    pub fn shard(&self, k: u32) -> FanInMemory {
        assert!(k < self.count, "shard {k} of a fan-in channel of {} shards", self.count);
        if k == 0 {
            return self.first;
        }
        let (m, c) = (self.msg_size, self.capacity);
        // SAFETY: shard k's header, owner table and slots lie in the region `new`'s contract promised
        // (`fanin_region_bytes` counts them), at the offsets `layout` defines; its header is
        // page aligned from the region's start, its owner table and slots page aligned after it.
        unsafe {
            let at = |off: u64| self.region.add(in_region(off));
            FanInMemory::new(
                at(layout::fanin_shard_offset(k, m, c)).cast(),
                at(layout::fanin_shard_owners_offset(k, m, c)).cast(),
                at(layout::fanin_shard_slots_offset(k, m, c)).cast(),
                m as usize,
                u64::from(c),
            )
        }
    }

    /// Every shard, in order.
    pub fn iter(&self) -> impl Iterator<Item = FanInMemory> + '_ {
        (0..self.count).map(|k| self.shard(k))
    }

    /// The shard `sender` sends into: its client slot (the id's low 16 bits) modulo the count.
    pub fn shard_of(&self, sender: u32) -> u32 {
        layout::fanin_shard_of(sender, self.count)
    }

    /// The producer of `sender`, on its shard.
    pub fn producer(&self, sender: u32) -> FanInProducer {
        FanInProducer::new(self.shard(self.shard_of(sender)), sender)
    }

    /// [`complete_dead`] over every shard (a sender only ever reserves in its own, but a completer
    /// that looks at all of them cannot miss one).
    pub fn complete_dead(&self, sender: u32) -> Completion {
        self.iter().fold(Completion::default(), |mut done, ring| {
            done += complete_dead(&ring, sender);
            done
        })
    }

    /// [`revoke_live`] over every shard.
    pub fn revoke_live(&self, sender: u32) -> Completion {
        self.iter().fold(Completion::default(), |mut done, ring| {
            done += revoke_live(&ring, sender);
            done
        })
    }

    /// [`repair`] over every shard: how many skip headers it wrote.
    pub fn repair(&self) -> u32 {
        self.iter().map(|ring| repair(&ring)).sum()
    }

    /// [`hold_at_tail`] of every shard that is held, with the shard's index.
    pub fn holds(&self) -> Vec<(u32, Hold)> {
        (0..self.count).filter_map(|k| hold_at_tail(&self.shard(k)).map(|h| (k, h))).collect()
    }

    /// The sum of every shard's reservation cursor: messages reserved over the channel's life,
    /// modulo 2^64 (for one shard, its cursor).
    pub fn next(&self) -> u64 {
        self.iter().fold(0u64, |n, ring| n.wrapping_add(ring.next()))
    }

    /// The sum of every shard's published consumer position: messages (and skips) taken over the
    /// channel's life, modulo 2^64 (for one shard, its `tail`).
    pub fn tail(&self) -> u64 {
        self.iter().fold(0u64, |n, ring| n.wrapping_add(ring.tail()))
    }
}

/// An offset inside a region the caller's contract says is in memory, as a `usize`.
#[allow(clippy::cast_possible_truncation, reason = "an offset inside memory that exists fits a usize")]
const fn in_region(off: u64) -> usize {
    off as usize
}

/// The consumer of every shard of a fan-in channel (a host server's): one [`FanInConsumer`] per
/// shard, taken from round-robin, one message or skip at a time from the next shard that has one, so
/// that no shard's senders wait behind another's. Order holds within a shard (so for every sender),
/// not across shards.
#[derive(Debug)]
pub struct ShardedConsumer {
    shards: Vec<FanInConsumer>,
    next: usize,
}

impl ShardedConsumer {
    /// Takes over every shard's consumer end at its published `tail` (see [`FanInConsumer::new`]);
    /// the round-robin starts at shard 0.
    pub fn new(shards: &FanInShards) -> Self {
        Self { shards: shards.iter().map(FanInConsumer::new).collect(), next: 0 }
    }

    /// How many shards.
    pub fn count(&self) -> u32 {
        u32::try_from(self.shards.len()).unwrap_or(u32::MAX)
    }

    /// Each shard's next sequence number to take.
    pub fn positions(&self) -> Vec<u64> {
        self.shards.iter().map(FanInConsumer::position).collect()
    }

    /// The sum of the shards' positions: slots taken over the channel's life, modulo 2^64. For one
    /// shard, exactly the sequence number of its next slot ([`FanInConsumer::position`]).
    pub fn position(&self) -> u64 {
        self.shards.iter().fold(0u64, |n, c| n.wrapping_add(c.position()))
    }

    /// Takes the next slot of the first shard, from the one after the last taken from, that has one:
    /// the shard's index and what it held (as [`FanInConsumer::try_take`]), or `None` when no shard
    /// has a committed slot at its position. An impossible state comes with its shard's index.
    pub fn try_take(&mut self, out: &mut [u8]) -> Result<Option<(u32, Taken)>, (u32, FanInCorrupt)> {
        let n = self.shards.len();
        for i in 0..n {
            let k = (self.next + i) % n;
            #[allow(clippy::cast_possible_truncation, reason = "at most MAX_FANIN_SHARDS shards")]
            let shard = k as u32;
            if let Some(t) = self.shards[k].try_take(out).map_err(|c| (shard, c))? {
                self.next = (k + 1) % n;
                return Ok(Some((shard, t)));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test counts, ids and sizes are small")]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::collections::{BTreeMap, VecDeque};

    /// A fan-in ring over zeroed heap memory, freed on drop (what Miri runs the protocol on).
    struct HeapFanIn {
        ptr: NonNull<u8>,
        layout: Layout,
        ring: FanInMemory,
    }

    impl HeapFanIn {
        fn new(msg_size: usize, capacity: u64) -> Self {
            let header = core::mem::size_of::<RingHeader>();
            let owners = FanInMemory::owner_bytes(capacity) as usize;
            let slots = FanInMemory::slot_bytes(msg_size as u32, capacity) as usize;
            let layout = Layout::from_size_align(header + owners + slots, 128).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            let at = |off: usize| NonNull::new(ptr.as_ptr().wrapping_add(off)).unwrap();
            // SAFETY: the allocation holds the header, the table (8-aligned after 384 bytes) and the
            // slots (16-aligned: 384 + 8 * capacity), zeroed (an empty ring), living as long as `self`.
            let ring = unsafe {
                FanInMemory::new(ptr.cast(), at(header).cast(), at(header + owners).cast(), msg_size, capacity)
            };
            Self { ptr, layout, ring }
        }

        /// Puts the ring at position `start` (cursor and tail), every slot's last lap done.
        fn start_at(&self, start: u64) {
            start_ring_at(&self.ring, start);
        }
    }

    impl Drop for HeapFanIn {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    /// A fan-in channel of `count` shards over zeroed heap memory laid out as in a mailbox: shard 0's
    /// header, then the slots region at the offsets `layout` defines (`fanin_shard_offset`).
    struct HeapShards {
        ptr: NonNull<u8>,
        layout: Layout,
        shards: FanInShards,
    }

    impl HeapShards {
        const HEADER: usize = core::mem::size_of::<RingHeader>();

        fn new(msg_size: u32, capacity: u32, count: u32) -> Self {
            let region = layout::fanin_region_bytes(msg_size, capacity, count) as usize;
            let layout = Layout::from_size_align(Self::HEADER + region, 128).unwrap();
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            let region = NonNull::new(ptr.as_ptr().wrapping_add(Self::HEADER)).unwrap();
            // SAFETY: the allocation holds shard 0's header and, 128-aligned after it (384 bytes), the
            // region of `count` shards, zeroed (every shard empty at 0), living as long as `self`.
            let shards = unsafe { FanInShards::new(ptr.cast(), region, msg_size, capacity, count) };
            Self { ptr, layout, shards }
        }

        /// The address of byte `off` of the slots region.
        fn region_at(&self, off: u64) -> usize {
            self.ptr.as_ptr() as usize + Self::HEADER + off as usize
        }

        /// Puts every shard at position `start`.
        fn start_at(&self, start: u64) {
            for ring in self.shards.iter() {
                start_ring_at(&ring, start);
            }
        }
    }

    impl Drop for HeapShards {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    /// Puts `r` at position `start` (cursor and tail), every slot's last lap done.
    fn start_ring_at(r: &FanInMemory, start: u64) {
        r.cursor().store(start, Ordering::Relaxed);
        r.header().consumer.tail.store(start, Ordering::Relaxed);
        for k in 0..r.capacity {
            let prev = start.wrapping_add(k).wrapping_sub(r.capacity);
            let own = Ownership { ticket: r.ticket(prev), state: OwnState::Done, owner: 0 };
            r.owner_word(r.index(prev)).store(own.word(), Ordering::Relaxed);
        }
    }

    /// Message `k` of sender `s`: the two numbers, then a pattern.
    fn msg(size: usize, s: u32, k: u32) -> Vec<u8> {
        let mut m: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(37) ^ (k as u8)).collect();
        m[..4].copy_from_slice(&s.to_le_bytes());
        m[4..8].copy_from_slice(&k.to_le_bytes());
        m
    }

    fn take(c: &mut FanInConsumer, size: usize) -> Option<(Taken, Vec<u8>)> {
        let mut out = vec![0u8; size];
        c.try_take(&mut out).unwrap().map(|t| (t, out))
    }

    #[test]
    fn ownership_words_round_trip_and_zero_is_a_finished_lap() {
        let own = Ownership { ticket: TICKET_MASK, state: OwnState::Writing, owner: 0xbeef };
        assert_eq!(Ownership::from_word(own.word()), own);
        assert_eq!(Ownership::from_word(0), Ownership { ticket: 0, state: OwnState::Done, owner: 0 });
    }

    #[test]
    fn many_senders_are_taken_in_order_with_their_ids() {
        let heap = HeapFanIn::new(16, 4);
        let mut ps: Vec<FanInProducer> = (0..3).map(|s| FanInProducer::new(heap.ring, 0x1_0000 | s)).collect();
        let mut c = FanInConsumer::new(heap.ring);
        for round in 0..5u32 {
            for (s, p) in ps.iter_mut().enumerate() {
                assert!(p.try_send(&msg(16, s as u32, round)).unwrap());
            }
            for s in 0..3u32 {
                let (t, out) = take(&mut c, 16).unwrap();
                assert_eq!(t, Taken::Message { sender: 0x1_0000 | s });
                assert_eq!(out, msg(16, s, round));
            }
        }
        assert!(take(&mut c, 16).is_none());
        for k in 0..4 {
            assert!(ps[0].try_send(&msg(16, 0, k)).unwrap());
        }
        assert!(!ps[1].try_send(&[1]).unwrap(), "a full ring refuses every producer");
        assert_eq!((heap.ring.next(), heap.ring.tail()), (19, 15));
    }

    #[test]
    fn a_slot_is_sender_kind_then_the_ll_body() {
        let heap = HeapFanIn::new(8, 2);
        let mut p = FanInProducer::new(heap.ring, 7);
        assert!(p.try_send(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap());
        let words: Vec<u64> = heap.ring.words(0).iter().map(|w| w.load(Ordering::Relaxed)).collect();
        assert_eq!(words, [0x8000_0000_0000_0007, 0x8000_0000_0000_0000, 0x8000_0000_0403_0201, 0x8000_0000_0807_0605]);
        assert_eq!(heap.ring.ownership(0), Ownership { ticket: 1, state: OwnState::Done, owner: 7 });
    }

    /// Runs a send of sender `s` to `stage` (that many steps), returning the op.
    fn send_to(p: &mut FanInProducer, m: &[u8], stage: Stage) -> SendOp {
        let mut op = SendOp::default();
        while op.stage != stage {
            assert_eq!(p.step(&mut op, m).unwrap(), Step::Progress);
        }
        op
    }

    #[test]
    fn a_producer_dead_at_every_step_is_completed_and_the_ring_goes_on() {
        let stages = [Stage::Reserved, Stage::Writing, Stage::HalfBody, Stage::Body, Stage::Kind, Stage::Committed];
        for (n, &stage) in stages.iter().enumerate() {
            let heap = HeapFanIn::new(16, 2);
            let mut c = FanInConsumer::new(heap.ring);
            let mut dying = FanInProducer::new(heap.ring, 1);
            let mut other = FanInProducer::new(heap.ring, 2);
            let _ = send_to(&mut dying, &msg(16, 1, 0), stage);
            assert!(other.try_send(&msg(16, 2, 0)).unwrap());
            if stage == Stage::Committed {
                // Committed: the message is whole and taken; completion only finishes its slot.
                assert_eq!(take(&mut c, 16).unwrap(), (Taken::Message { sender: 1 }, msg(16, 1, 0)));
                assert_eq!(complete_dead(&heap.ring, 1), Completion { finished: 1, ..Completion::default() });
            } else {
                assert!(take(&mut c, 16).is_none(), "stage {stage:?}: the dead slot holds the consumer");
                let done = complete_dead(&heap.ring, 1);
                assert_eq!(done, Completion { skipped: 1, ..Completion::default() }, "stage {n}");
                assert_eq!(take(&mut c, 16).unwrap().0, Taken::Skipped { sender: 1 });
            }
            assert_eq!(take(&mut c, 16).unwrap(), (Taken::Message { sender: 2 }, msg(16, 2, 0)));
            // Laps later, the slots are reused as ever, and a new client in the dead one's place works.
            let mut again = FanInProducer::new(heap.ring, 1 | 1 << 16);
            for k in 1..6 {
                assert!(again.try_send(&msg(16, 1, k)).unwrap());
                assert_eq!(take(&mut c, 16).unwrap(), (Taken::Message { sender: 1 | 1 << 16 }, msg(16, 1, k)));
            }
            assert_eq!(complete_dead(&heap.ring, 1), Completion::default(), "nothing left to complete");
        }
    }

    #[test]
    fn a_stopped_reservation_is_revoked_and_its_late_begin_stores_nothing() {
        let heap = HeapFanIn::new(8, 2);
        let mut c = FanInConsumer::new(heap.ring);
        let mut stopped = FanInProducer::new(heap.ring, 3);
        let m = msg(8, 3, 0);
        let mut op = send_to(&mut stopped, &m, Stage::Reserved);
        assert_eq!(revoke_live(&heap.ring, 3), Completion { skipped: 1, ..Completion::default() });
        assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 3 });
        // Another producer takes the slot's next lap while the first is still stopped.
        let mut q = FanInProducer::new(heap.ring, 4);
        assert!(q.try_send(&msg(8, 4, 0)).unwrap());
        assert!(q.try_send(&msg(8, 4, 1)).unwrap());
        // The stopped producer resumes: its begin fails, it stored nothing, and it sends anew.
        assert_eq!(stopped.step(&mut op, &m).unwrap(), Step::Revoked);
        assert_eq!(op, SendOp::default());
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 4 }, msg(8, 4, 0)));
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 4 }, msg(8, 4, 1)));
        assert!(stopped.try_send(&m).unwrap());
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 3 }, m));
    }

    #[test]
    fn a_producer_stopped_while_writing_holds_its_slot_and_one_stopped_after_its_commit_does_not() {
        let heap = HeapFanIn::new(8, 2);
        let mut c = FanInConsumer::new(heap.ring);
        let mut p = FanInProducer::new(heap.ring, 5);
        let m = msg(8, 5, 0);
        let mut op = send_to(&mut p, &m, Stage::HalfBody);
        assert_eq!(revoke_live(&heap.ring, 5), Completion { stuck: 1, ..Completion::default() });
        assert!(take(&mut c, 8).is_none(), "between begin and commit: the consumer waits");
        while op.stage != Stage::Committed {
            p.step(&mut op, &m).unwrap();
        }
        // Stopped between its commit and its finish: the message is taken, the slot finished for it.
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 5 }, m.clone()));
        assert_eq!(revoke_live(&heap.ring, 5), Completion { finished: 1, ..Completion::default() });
        let mut q = FanInProducer::new(heap.ring, 6);
        assert!(q.try_send(&msg(8, 6, 0)).unwrap());
        assert!(q.try_send(&msg(8, 6, 1)).unwrap(), "the slot's next lap");
        // The late finish fails and changes nothing (the slot is q's now).
        assert_eq!(p.step(&mut op, &m).unwrap(), Step::Sent);
        assert_eq!(heap.ring.ownership(0), Ownership { ticket: 2, state: OwnState::Done, owner: 6 });
        assert_eq!(take(&mut c, 8).unwrap().0, Taken::Message { sender: 6 });
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 6 }, msg(8, 6, 1)));
    }

    #[test]
    fn the_hold_at_tail_names_the_reservation_the_consumer_waits_for_and_revoking_it_frees_the_ring() {
        let heap = HeapFanIn::new(8, 2);
        let ring = &heap.ring;
        let mut c = FanInConsumer::new(heap.ring);
        assert_eq!(hold_at_tail(ring), None, "an empty ring holds nothing");
        let mut p = FanInProducer::new(heap.ring, 0x2_0005);
        let m = msg(8, 5, 0);
        // Reserved, not begun: the consumer waits at seq 0 for owner 5.
        let mut op = send_to(&mut p, &m, Stage::Reserved);
        let h = hold_at_tail(ring).unwrap();
        assert_eq!((h.tail, h.seq, h.owner, h.state, h.committed), (0, 0, 5, OwnState::Reserved, false));
        assert_eq!(h.word, ring.owner_word(0).load(Ordering::Relaxed));
        assert_eq!(hold_at_tail(ring), Some(h), "unmoved: the same word");
        // Writing, not committed: another hold (another word) at the same place.
        assert_eq!(p.step(&mut op, &m).unwrap(), Step::Progress);
        let h = hold_at_tail(ring).unwrap();
        assert_eq!((h.seq, h.state, h.committed), (0, OwnState::Writing, false));
        // Committed, not finished: the consumer takes it; the hold moves to the slot's next lap,
        // which no producer can reserve until the last lap is finished.
        while op.stage != Stage::Committed {
            p.step(&mut op, &m).unwrap();
        }
        assert_eq!(hold_at_tail(ring).map(|h| (h.seq, h.committed)), Some((0, true)));
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 0x2_0005 }, m.clone()));
        assert_eq!(hold_at_tail(ring), None, "seq 1's slot is free: the ring is not held");
        let mut q = FanInProducer::new(heap.ring, 6);
        assert!(q.try_send(&msg(8, 6, 0)).unwrap());
        assert_eq!(take(&mut c, 8).unwrap().0, Taken::Message { sender: 6 });
        assert!(!q.try_send(&msg(8, 6, 1)).unwrap(), "seq 2 needs seq 0's slot, never finished");
        let h = hold_at_tail(ring).unwrap();
        assert_eq!((h.tail, h.seq, h.owner, h.state, h.committed), (2, 0, 5, OwnState::Writing, true));
        // The watcher's rule: revoke_live finishes it, and the ring goes on.
        assert_eq!(revoke_live(ring, 0x2_0005), Completion { finished: 1, ..Completion::default() });
        assert_eq!(hold_at_tail(ring), None);
        assert!(q.try_send(&msg(8, 6, 1)).unwrap());
        // A reservation revoked at the tail: a skip, then nothing holds the ring.
        assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 6 }, msg(8, 6, 1)));
        let _ = send_to(&mut p, &m, Stage::Reserved);
        let h = hold_at_tail(ring).unwrap();
        assert_eq!((h.tail, h.seq, h.state), (3, 3, OwnState::Reserved));
        assert_eq!(revoke_live(ring, 0x2_0005), Completion { skipped: 1, ..Completion::default() });
        assert_eq!(hold_at_tail(ring), None);
        assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 0x2_0005 });
    }

    #[test]
    fn repair_writes_the_header_a_dead_completer_left_out() {
        let heap = HeapFanIn::new(8, 4);
        let mut c = FanInConsumer::new(heap.ring);
        let mut p = FanInProducer::new(heap.ring, 9);
        let _ = send_to(&mut p, &msg(8, 9, 0), Stage::Reserved);
        // A completer's CAS, then its death before the header.
        let own = heap.ring.ownership(0);
        heap.ring.owner_word(0).store(Ownership { state: OwnState::Skipped, ..own }.word(), Ordering::Release);
        assert!(take(&mut c, 8).is_none());
        assert_eq!(repair(&heap.ring), 1);
        assert_eq!(repair(&heap.ring), 0, "idempotent");
        assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 9 });
    }

    #[test]
    fn the_consumer_restarts_at_the_published_tail_and_impossible_state_is_reported() {
        let heap = HeapFanIn::new(8, 4);
        heap.start_at(u64::MAX - 1);
        let mut p = FanInProducer::new(heap.ring, 1);
        for k in 0..3 {
            assert!(p.try_send(&msg(8, 1, k)).unwrap());
        }
        let mut c = FanInConsumer::new(heap.ring);
        assert_eq!(take(&mut c, 8).unwrap().1, msg(8, 1, 0));
        let mut c = FanInConsumer::new(heap.ring);
        assert_eq!(c.position(), u64::MAX);
        assert_eq!(take(&mut c, 8).unwrap().1, msg(8, 1, 1), "across the 64-bit wrap");
        assert_eq!(take(&mut c, 8).unwrap().1, msg(8, 1, 2));
        heap.ring.cursor().store(100, Ordering::Relaxed);
        assert_eq!(p.try_send(&[1]), Err(FanInCorrupt::Indices { next: 100, tail: 1 }));
        heap.ring.cursor().store(2, Ordering::Relaxed);
        let behind = Ownership { ticket: TICKET_MASK, state: OwnState::Done, owner: 0 }.word();
        heap.ring.owner_word(2).store(behind, Ordering::Relaxed);
        let refused = p.try_send(&[1]);
        assert_eq!(refused, Err(FanInCorrupt::Owner { seq: 2, word: behind }), "seq 2's slot missed a lap");
        heap.ring.words(1)[0].store(u64::from(tag(1)) << 32, Ordering::Relaxed);
        heap.ring.words(1)[1].store(u64::from(tag(1)) << 32 | 7, Ordering::Relaxed);
        let mut out = [0u8; 8];
        assert_eq!(c.try_take(&mut out), Err(FanInCorrupt::Kind { seq: 1, kind: 7 }));
    }

    // ---- The model test ----

    /// One step of the model test.
    #[derive(Debug, Clone)]
    enum Op {
        /// Producer `p` takes one step of its current send (starting a new one if idle).
        Step(usize),
        /// Producer `p` runs its current send to the end (or until no room).
        Send(usize),
        /// Producer `p`'s process dies where it stands; meshd completes it and a new client takes
        /// its place (same slot, next epoch).
        Die(usize),
        /// meshd finds producer `p` stopped and revokes what it can.
        Revoke(usize),
        /// The consumer takes one slot.
        Take,
        /// The consumer's process dies and a new one takes the end over.
        RestartConsumer,
    }

    fn model_op(producers: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..producers).prop_map(Op::Step),
            2 => (0..producers).prop_map(Op::Send),
            1 => (0..producers).prop_map(Op::Die),
            1 => (0..producers).prop_map(Op::Revoke),
            5 => Just(Op::Take),
            1 => Just(Op::RestartConsumer),
        ]
    }

    /// A producer of the model: its core, its send in progress, its counter.
    struct Client {
        core: FanInProducer,
        op: SendOp,
        epoch: u32,
        next_k: u32,
        /// meshd revoked its reservation and it has not stepped since.
        revoked: bool,
    }

    impl Client {
        fn sender(slot: usize, epoch: u32) -> u32 {
            slot as u32 | epoch << 16
        }
    }

    /// What the model expects: every committed message taken once, in each sender's order; one skip
    /// per revoked reservation and per death before a commit.
    struct Expect {
        committed: BTreeMap<u32, VecDeque<u32>>,
        skips: BTreeMap<u32, u32>,
    }

    fn check_take(t: Taken, out: &[u8], expect: &mut Expect, size: usize) -> Result<(), TestCaseError> {
        match t {
            Taken::Message { sender } => {
                let k = u32::from_le_bytes(out[4..8].try_into().unwrap());
                let queue = expect.committed.get_mut(&sender).expect("a sender the model knows");
                prop_assert_eq!(queue.pop_front(), Some(k), "sender {:x}: lost, repeated or reordered", sender);
                prop_assert_eq!(out, &msg(size, sender, k)[..], "torn");
            }
            Taken::Skipped { sender } => {
                let n = expect.skips.entry(sender).or_default();
                prop_assert!(*n > 0, "an unexpected skip from {:x}", sender);
                *n -= 1;
            }
        }
        Ok(())
    }

    /// The model over a channel of `shards` shards: client `s` sends into shard `s % shards`, the
    /// consumer takes round-robin, meshd completes and revokes over every shard.
    fn run_model(producers: usize, cap_log: u32, start: u64, shards: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let size = 16;
        let heap = HeapShards::new(size as u32, 1 << cap_log, shards);
        heap.start_at(start);
        let ring = heap.shards;
        let mut clients: Vec<Client> = (0..producers)
            .map(|s| Client {
                core: ring.producer(Client::sender(s, 0)),
                op: SendOp::default(),
                epoch: 0,
                next_k: 0,
                revoked: false,
            })
            .collect();
        let mut c = ShardedConsumer::new(&ring);
        let mut expect = Expect { committed: BTreeMap::new(), skips: BTreeMap::new() };
        // A take, its shard checked against its sender's.
        let take_one = |c: &mut ShardedConsumer, out: &mut [u8]| -> Result<Option<Taken>, TestCaseError> {
            let Some((shard, t)) = c.try_take(out).unwrap() else { return Ok(None) };
            let (Taken::Message { sender } | Taken::Skipped { sender }) = t;
            prop_assert_eq!(shard, ring.shard_of(sender), "sender {:x} taken from another shard", sender);
            Ok(Some(t))
        };
        for s in 0..producers {
            expect.committed.insert(Client::sender(s, 0), VecDeque::new());
        }
        // One step of client `s`, recording what it committed or had revoked.
        let step = |cl: &mut Client, expect: &mut Expect| -> Result<Step, TestCaseError> {
            let sender = cl.core.sender();
            let m = msg(size, sender, cl.next_k);
            let was = cl.op.stage;
            let r = cl.core.step(&mut cl.op, &m).unwrap();
            if was == Stage::Kind {
                expect.committed.get_mut(&sender).unwrap().push_back(cl.next_k);
            }
            if r == Step::Sent {
                cl.next_k += 1;
            }
            // A revocation's skip was counted when meshd made it (Op::Revoke).
            prop_assert_eq!(r == Step::Revoked, cl.revoked, "a revoked reservation is seen at the next step");
            cl.revoked = false;
            Ok(r)
        };
        let mut out = vec![0u8; size];
        for op in ops {
            match op {
                Op::Step(s) => {
                    step(&mut clients[s], &mut expect)?;
                }
                Op::Send(s) => while !matches!(step(&mut clients[s], &mut expect)?, Step::Sent | Step::NoRoom) {},
                Op::Die(s) => {
                    let cl = &mut clients[s];
                    let sender = cl.core.sender();
                    let done = ring.complete_dead(sender);
                    let held = cl.op.stage != Stage::Idle && !cl.revoked;
                    let committed = cl.op.stage == Stage::Committed;
                    prop_assert_eq!(done.skipped, u32::from(held && !committed));
                    prop_assert_eq!(done.stuck, 0);
                    prop_assert!(done.finished <= u32::from(committed), "a revocation may have finished it already");
                    *expect.skips.entry(sender).or_default() += done.skipped;
                    cl.epoch += 1;
                    let sender = Client::sender(s, cl.epoch);
                    *cl = Client {
                        core: ring.producer(sender),
                        op: SendOp::default(),
                        epoch: cl.epoch,
                        next_k: 0,
                        revoked: false,
                    };
                    expect.committed.insert(sender, VecDeque::new());
                }
                Op::Revoke(s) => {
                    let cl = &mut clients[s];
                    let sender = cl.core.sender();
                    let done = ring.revoke_live(sender);
                    let reserved = cl.op.stage == Stage::Reserved && !cl.revoked;
                    prop_assert_eq!(done.skipped, u32::from(reserved));
                    let writing = !matches!(cl.op.stage, Stage::Idle | Stage::Reserved | Stage::Committed);
                    prop_assert_eq!(done.stuck, u32::from(writing), "between begin and commit: left alone");
                    *expect.skips.entry(sender).or_default() += done.skipped;
                    cl.revoked |= done.skipped == 1;
                }
                Op::Take => {
                    if let Some(t) = take_one(&mut c, &mut out)? {
                        check_take(t, &out, &mut expect, size)?;
                    }
                }
                Op::RestartConsumer => c = ShardedConsumer::new(&ring),
            }
        }
        // Drain: every send in progress finished, then everything taken.
        loop {
            let mut moved = false;
            for cl in clients.iter_mut().filter(|cl| cl.op.stage != Stage::Idle) {
                moved |= step(cl, &mut expect)? != Step::NoRoom;
            }
            while let Some(t) = take_one(&mut c, &mut out)? {
                check_take(t, &out, &mut expect, size)?;
                moved = true;
            }
            if !moved {
                break;
            }
        }
        for (sender, queue) in &expect.committed {
            prop_assert!(queue.is_empty(), "sender {:x}: committed and never taken: {:?}", sender, queue);
        }
        for (sender, n) in &expect.skips {
            prop_assert_eq!(*n, 0, "sender {:x}: skips not reported", sender);
        }
        for (k, shard) in ring.iter().enumerate() {
            prop_assert_eq!(shard.next(), shard.tail(), "shard {}: every reservation taken", k);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any interleaving of the steps of several producers' sends, deaths at any step (completed
        /// by meshd), revocations of stopped producers and consumer restarts, over 1, 2 or 4 shards:
        /// every committed message is taken exactly once, from its sender's shard, in its sender's
        /// order, whole; every death before a commit and every revocation is one skip attributed to
        /// its sender; nothing else is taken.
        #[test]
        #[cfg_attr(miri, ignore = "proptest is slow under Miri; the unit and thread tests cover the protocol there")]
        fn many_producers_dying_and_revoked_match_the_model(
            producers in 1usize..7,
            cap_log in 0u32..4,
            start in prop_oneof![Just(0u64), Just(u64::MAX - 3), any::<u32>().prop_map(u64::from)],
            shards in prop_oneof![Just(1u32), Just(2), Just(4)],
            ops in proptest::collection::vec(model_op(6), 1..200),
        ) {
            let ops = ops
                .into_iter()
                .map(|op| match op {
                    Op::Step(s) => Op::Step(s % producers),
                    Op::Send(s) => Op::Send(s % producers),
                    Op::Die(s) => Op::Die(s % producers),
                    Op::Revoke(s) => Op::Revoke(s % producers),
                    op => op,
                })
                .collect();
            run_model(producers, cap_log, start, shards, ops)?;
        }
    }

    // ---- Shards ----

    /// A take from a sharded consumer: its shard, what it was, the message.
    fn take_sharded(c: &mut ShardedConsumer, size: usize) -> Option<(u32, Taken, Vec<u8>)> {
        let mut out = vec![0u8; size];
        c.try_take(&mut out).unwrap().map(|(k, t)| (k, t, out))
    }

    #[test]
    fn shards_lie_where_the_layout_says_and_one_shard_is_todays_ring() {
        let (m, cap) = (16u32, 4u32);
        let heap = HeapShards::new(m, cap, 4);
        let span = layout::fanin_shard_span(m, cap);
        assert_eq!(span, 8192, "a page of owner table, 4 slots of 48 bytes, page-rounded");
        for k in 0..4 {
            let r = heap.shards.shard(k);
            let base = if k == 0 { None } else { Some(span + u64::from(k - 1) * (4096 + span)) };
            if let Some(base) = base {
                assert_eq!(layout::fanin_shard_offset(k, m, cap), base);
                assert_eq!(r.header.as_ptr() as usize, heap.region_at(base), "shard {k}'s header");
            } else {
                assert_eq!(r.header.as_ptr() as usize, heap.ptr.as_ptr() as usize, "shard 0's is the channel's");
            }
            let owners = base.map_or(0, |b| b + 4096);
            assert_eq!(r.owners.as_ptr() as usize, heap.region_at(owners), "shard {k}'s owner table");
            assert_eq!(r.slots.as_ptr() as usize, heap.region_at(owners + 4096), "shard {k}'s slots");
            assert_eq!(layout::fanin_shard_slots_offset(k, m, cap), owners + 4096);
        }
        assert_eq!(layout::fanin_region_bytes(m, cap, 4), span + 3 * (4096 + span));
        assert_eq!(layout::fanin_region_bytes(m, cap, 1), layout::fanin_slot_bytes(m, cap), "one shard: today's bytes");
        // One shard: the owner table at the region's start, the slots a page on, as always.
        let one = HeapShards::new(m, cap, 1);
        let r = one.shards.shard(0);
        assert_eq!(r.owners.as_ptr() as usize, one.region_at(0));
        assert_eq!(r.slots.as_ptr() as usize, one.region_at(layout::fanin_slots_offset(cap)));
    }

    #[test]
    fn senders_stay_in_their_shard_and_the_consumer_takes_round_robin() {
        let heap = HeapShards::new(16, 4, 4);
        let shards = heap.shards;
        // Eight clients (slots 0..8, epoch 1): slot s sends into shard s % 4, two clients a shard.
        let ids: Vec<u32> = (0..8).map(|s| s | 1 << 16).collect();
        let mut ps: Vec<FanInProducer> = ids.iter().map(|&id| shards.producer(id)).collect();
        for (s, p) in ps.iter_mut().enumerate().rev() {
            assert!(p.try_send(&msg(16, s as u32, 0)).unwrap());
        }
        for k in 0..4 {
            assert_eq!(shards.shard(k).next(), 2, "shard {k}: its two clients' sends, no other's");
        }
        assert_eq!((shards.next(), shards.tail()), (8, 0));
        let mut c = ShardedConsumer::new(&shards);
        let mut order = Vec::new();
        while let Some((k, t, out)) = take_sharded(&mut c, 16) {
            let Taken::Message { sender } = t else { panic!("a skip from nowhere") };
            assert_eq!(k, shards.shard_of(sender));
            assert_eq!(out, msg(16, sender & 0xffff, 0));
            order.push((k, sender & 0xffff));
        }
        // One from each shard in turn (each shard's in its reservation order: slot 4+k before k).
        assert_eq!(order, [(0, 4), (1, 5), (2, 6), (3, 7), (0, 0), (1, 1), (2, 2), (3, 3)]);
        assert_eq!((c.position(), c.positions()), (8, vec![2, 2, 2, 2]));
        // A full shard refuses its senders only.
        for k in 1..5 {
            assert!(ps[1].try_send(&msg(16, 1, k)).unwrap());
        }
        assert!(!ps[5].try_send(&[1]).unwrap(), "shard 1 is full");
        assert!(ps[2].try_send(&[1]).unwrap(), "shard 2 is not");
    }

    #[test]
    fn a_producer_dead_at_every_step_holds_its_shard_alone_and_is_completed() {
        let stages = [Stage::Reserved, Stage::Writing, Stage::HalfBody, Stage::Body, Stage::Kind, Stage::Committed];
        for &stage in &stages {
            let heap = HeapShards::new(16, 2, 2);
            let shards = heap.shards;
            let mut c = ShardedConsumer::new(&shards);
            let mut dying = shards.producer(1); // shard 1
            let mut other = shards.producer(2); // shard 0
            let _ = send_to(&mut dying, &msg(16, 1, 0), stage);
            if stage == Stage::Committed {
                // Committed, not finished: the message is whole, and taken.
                assert_eq!(take_sharded(&mut c, 16).unwrap(), (1, Taken::Message { sender: 1 }, msg(16, 1, 0)));
            }
            // Shard 0 flows past the dead sender's held shard, laps over.
            for k in 0..5 {
                assert!(other.try_send(&msg(16, 2, k)).unwrap());
                let (shard, t, out) = take_sharded(&mut c, 16).unwrap();
                assert_eq!((shard, t, out), (0, Taken::Message { sender: 2 }, msg(16, 2, k)), "stage {stage:?}");
            }
            let holds = shards.holds();
            if stage == Stage::Committed {
                assert_eq!(holds, [], "its slot's next lap is not the tail's yet");
                assert_eq!(shards.complete_dead(1), Completion { finished: 1, ..Completion::default() });
            } else {
                assert_eq!(holds.iter().map(|(k, h)| (*k, h.owner, h.seq)).collect::<Vec<_>>(), [(1, 1, 0)]);
                assert!(take_sharded(&mut c, 16).is_none(), "stage {stage:?}: shard 1 waits, shard 0 is empty");
                assert_eq!(shards.complete_dead(1), Completion { skipped: 1, ..Completion::default() });
                let (k, t, _) = take_sharded(&mut c, 16).unwrap();
                assert_eq!((k, t), (1, Taken::Skipped { sender: 1 }));
            }
            assert_eq!(shards.holds(), [], "stage {stage:?}: nothing holds any shard");
            // A new client in the dead one's slot: the same shard, which goes on.
            let mut again = shards.producer(1 | 1 << 16);
            for k in 1..4 {
                assert!(again.try_send(&msg(16, 1, k)).unwrap());
                let (shard, t, out) = take_sharded(&mut c, 16).unwrap();
                assert_eq!((shard, t, out), (1, Taken::Message { sender: 1 | 1 << 16 }, msg(16, 1, k)));
            }
            assert_eq!(shards.complete_dead(1), Completion::default(), "nothing left to complete");
        }
    }

    #[test]
    fn the_probe_revocation_and_repair_cover_every_shard() {
        let heap = HeapShards::new(8, 4, 4);
        let shards = heap.shards;
        let mut c = ShardedConsumer::new(&shards);
        // Shard 2: a client stopped after its reservation; shard 3: one stopped mid-copy.
        let mut stopped = shards.producer(2);
        let m = msg(8, 2, 0);
        let mut op = send_to(&mut stopped, &m, Stage::Reserved);
        let mut writing = shards.producer(3);
        let w = msg(8, 3, 0);
        let mut wop = send_to(&mut writing, &w, Stage::HalfBody);
        let holds = shards.holds();
        let seen: Vec<_> = holds.iter().map(|(k, h)| (*k, h.owner, h.state)).collect();
        assert_eq!(seen, [(2, 2, OwnState::Reserved), (3, 3, OwnState::Writing)]);
        // The watcher's rule, shard by shard: the reservation is revoked, the copy left alone.
        assert_eq!(shards.revoke_live(2), Completion { skipped: 1, ..Completion::default() });
        assert_eq!(shards.revoke_live(3), Completion { stuck: 1, ..Completion::default() });
        let (k, t, _) = take_sharded(&mut c, 8).unwrap();
        assert_eq!((k, t), (2, Taken::Skipped { sender: 2 }), "shard 2's skip");
        assert_eq!(shards.holds().iter().map(|(k, _)| *k).collect::<Vec<_>>(), [3]);
        assert_eq!(stopped.step(&mut op, &m).unwrap(), Step::Revoked);
        assert!(stopped.try_send(&m).unwrap());
        while writing.step(&mut wop, &w).unwrap() != Step::Sent {}
        let mut got: Vec<_> = (0..2).map(|_| take_sharded(&mut c, 8).unwrap()).collect();
        got.sort_by_key(|g| g.0);
        assert_eq!(got, [(2, Taken::Message { sender: 2 }, m), (3, Taken::Message { sender: 3 }, w)]);
        // A completer that died between its CAS and its header, in shard 1: repair finds it.
        let mut p = shards.producer(5);
        let _ = send_to(&mut p, &msg(8, 5, 0), Stage::Reserved);
        let r1 = shards.shard(1);
        let own = r1.ownership(0);
        r1.owner_word(0).store(Ownership { state: OwnState::Skipped, ..own }.word(), Ordering::Release);
        assert!(take_sharded(&mut c, 8).is_none());
        assert_eq!(shards.repair(), 1);
        assert_eq!(shards.repair(), 0, "idempotent");
        let (k, t, _) = take_sharded(&mut c, 8).unwrap();
        assert_eq!((k, t), (1, Taken::Skipped { sender: 5 }));
    }

    #[test]
    fn a_sharded_consumer_restarts_at_every_shards_published_tail() {
        let heap = HeapShards::new(8, 4, 2);
        heap.start_at(u64::MAX - 1);
        let shards = heap.shards;
        let mut ps: Vec<_> = (0..2).map(|s| shards.producer(s)).collect();
        for k in 0..3 {
            for (s, p) in ps.iter_mut().enumerate() {
                assert!(p.try_send(&msg(8, s as u32, k)).unwrap());
            }
        }
        let mut c = ShardedConsumer::new(&shards);
        assert_eq!(take_sharded(&mut c, 8).unwrap(), (0, Taken::Message { sender: 0 }, msg(8, 0, 0)));
        assert_eq!(take_sharded(&mut c, 8).unwrap(), (1, Taken::Message { sender: 1 }, msg(8, 1, 0)));
        assert_eq!(take_sharded(&mut c, 8).unwrap(), (0, Taken::Message { sender: 0 }, msg(8, 0, 1)));
        // A new consumer: each shard where the last one published it, across the 64-bit wrap.
        let mut c = ShardedConsumer::new(&shards);
        assert_eq!(c.positions(), [0, u64::MAX], "shard 0 took two, shard 1 one, from 2^64 - 2");
        let mut next = [2u32, 1];
        while let Some((k, t, out)) = take_sharded(&mut c, 8) {
            assert_eq!((t, out), (Taken::Message { sender: k }, msg(8, k, next[k as usize])));
            next[k as usize] += 1;
        }
        assert_eq!(next, [3, 3]);
        // An impossible state names its shard.
        shards.shard(1).cursor().store(100, Ordering::Relaxed);
        assert!(matches!(ps[1].try_send(&[1]), Err(FanInCorrupt::Indices { next: 100, .. })));
        let r1 = shards.shard(1);
        let seq = r1.tail();
        r1.words(seq)[0].store(u64::from(tag(seq)) << 32, Ordering::Relaxed);
        r1.words(seq)[1].store(u64::from(tag(seq)) << 32 | 7, Ordering::Relaxed);
        let mut out = [0u8; 8];
        assert_eq!(c.try_take(&mut out), Err((1, FanInCorrupt::Kind { seq, kind: 7 })));
    }

    #[test]
    fn threads_over_shards_are_taken_in_each_senders_order() {
        let (senders, count, count_shards): (u32, u32, u32) = if cfg!(miri) { (4, 6, 2) } else { (8, 10_000, 4) };
        let heap = HeapShards::new(16, 4, count_shards);
        let shards = heap.shards;
        std::thread::scope(|s| {
            for id in 0..senders {
                s.spawn(move || {
                    let mut p = shards.producer(id);
                    for k in 0..count {
                        while !p.try_send(&msg(16, id, k)).unwrap() {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            let mut c = ShardedConsumer::new(&shards);
            let mut next = vec![0u32; senders as usize];
            let mut out = [0u8; 16];
            let mut left = senders * count;
            while left > 0 {
                match c.try_take(&mut out).unwrap() {
                    Some((shard, Taken::Message { sender })) => {
                        assert_eq!(shard, sender % count_shards);
                        let k = u32::from_le_bytes(out[4..8].try_into().unwrap());
                        assert_eq!(k, next[sender as usize], "sender {sender}: lost, repeated or reordered");
                        assert_eq!(out[..], msg(16, sender, k)[..], "torn");
                        next[sender as usize] += 1;
                        left -= 1;
                    }
                    Some((_, Taken::Skipped { sender })) => panic!("no producer died, yet a skip from {sender}"),
                    None => std::thread::yield_now(),
                }
            }
        });
    }

    // ---- Threads (what Miri checks for races and weak-memory bugs) ----

    #[test]
    fn threads_send_and_one_takes_in_each_senders_order() {
        let (senders, count): (u32, u32) = if cfg!(miri) { (3, 12) } else { (4, 20_000) };
        let heap = HeapFanIn::new(16, 4);
        let ring = heap.ring;
        std::thread::scope(|s| {
            for id in 0..senders {
                s.spawn(move || {
                    let mut p = FanInProducer::new(ring, id);
                    for k in 0..count {
                        while !p.try_send(&msg(16, id, k)).unwrap() {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            let mut c = FanInConsumer::new(ring);
            let mut next = vec![0u32; senders as usize];
            let mut out = [0u8; 16];
            let mut left = senders * count;
            while left > 0 {
                match c.try_take(&mut out).unwrap() {
                    Some(Taken::Message { sender }) => {
                        let k = u32::from_le_bytes(out[4..8].try_into().unwrap());
                        assert_eq!(k, next[sender as usize], "sender {sender}: lost, repeated or reordered");
                        assert_eq!(out[..], msg(16, sender, k)[..], "torn");
                        next[sender as usize] += 1;
                        left -= 1;
                    }
                    Some(Taken::Skipped { sender }) => panic!("no producer died, yet a skip from {sender}"),
                    None => std::thread::yield_now(),
                }
            }
        });
    }

    #[test]
    fn a_revocation_racing_the_begin_delivers_once_either_way() {
        let rounds = if cfg!(miri) { 6 } else { 2_000 };
        for _ in 0..rounds {
            let heap = HeapFanIn::new(8, 2);
            let ring = heap.ring;
            let mut p = FanInProducer::new(ring, 1);
            let m = msg(8, 1, 0);
            let mut op = send_to(&mut p, &m, Stage::Reserved);
            let revoked = std::thread::scope(|s| {
                let meshd = s.spawn(move || revoke_live(&ring, 1));
                let mut revoked = 0;
                loop {
                    match p.step(&mut op, &m).unwrap() {
                        Step::Sent => break,
                        Step::Revoked => revoked += 1,
                        Step::Progress | Step::NoRoom => {}
                    }
                }
                let done = meshd.join().unwrap();
                assert_eq!(done.skipped, revoked);
                revoked
            });
            let mut c = FanInConsumer::new(ring);
            if revoked == 1 {
                assert_eq!(take(&mut c, 8).unwrap().0, Taken::Skipped { sender: 1 });
            }
            assert_eq!(take(&mut c, 8).unwrap(), (Taken::Message { sender: 1 }, m));
            assert!(take(&mut c, 8).is_none());
        }
    }

    #[test]
    fn a_producer_thread_that_dies_mid_send_is_skipped_while_others_go_on() {
        let count: u32 = if cfg!(miri) { 8 } else { 5_000 };
        let heap = HeapFanIn::new(16, 4);
        let ring = heap.ring;
        std::thread::scope(|s| {
            // The dying client: one message sent, then a second cut off after its body.
            let dying_thread = s.spawn(move || {
                let mut p = FanInProducer::new(ring, 7);
                while !p.try_send(&msg(16, 7, 0)).unwrap() {
                    std::thread::yield_now();
                }
                let m = msg(16, 7, 1);
                let mut op = SendOp::default();
                while op.stage != Stage::Body {
                    if p.step(&mut op, &m).unwrap() == Step::NoRoom {
                        std::thread::yield_now();
                    }
                }
            });
            let other = s.spawn(move || {
                let mut p = FanInProducer::new(ring, 2);
                for k in 0..count {
                    while !p.try_send(&msg(16, 2, k)).unwrap() {
                        std::thread::yield_now();
                    }
                }
            });
            let mut c = FanInConsumer::new(ring);
            let (mut got7, mut next2, mut skips) = (0, 0, 0);
            let mut out = [0u8; 16];
            let mut dying = Some(dying_thread);
            while next2 < count || got7 + skips < 2 {
                if dying.as_ref().is_some_and(|h| h.is_finished()) {
                    // meshd: the process is gone; the join orders all its stores before ours.
                    dying.take().unwrap().join().unwrap();
                    assert_eq!(complete_dead(&ring, 7), Completion { skipped: 1, ..Completion::default() });
                }
                match c.try_take(&mut out).unwrap() {
                    Some(Taken::Message { sender: 7 }) => got7 += 1,
                    Some(Taken::Message { sender }) => {
                        assert_eq!(sender, 2);
                        assert_eq!(out[..], msg(16, 2, next2)[..]);
                        next2 += 1;
                    }
                    Some(Taken::Skipped { sender }) => {
                        assert_eq!(sender, 7);
                        skips += 1;
                    }
                    None => std::thread::yield_now(),
                }
            }
            other.join().unwrap();
            assert_eq!((got7, skips), (1, 1));
        });
    }
}
