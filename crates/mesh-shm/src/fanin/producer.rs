//! A host producer of a fan-in ring: the reservation CAS, then a send one store or CAS at a time.

use core::sync::atomic::Ordering;

use super::memory::{FanInCorrupt, FanInMemory, HEADER_WORDS, KIND_DATA, OwnState, Ownership, owner_of};
use crate::ring::tag;

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
