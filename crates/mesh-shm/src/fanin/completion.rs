//! Completion of a dead or stalled producer's reservations as skips, the stall probe, and the repair of a completer cut off mid-way.

use core::sync::atomic::Ordering;

use super::memory::{FanInMemory, OwnState, Ownership, owner_of};

/// What a completer did to one producer's reservations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion {
    /// Slots completed as skips (the consumer will take a [`Taken::Skipped`](super::Taken::Skipped) for each).
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
