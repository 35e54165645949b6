//! The program's side of a group (replies, acknowledgements of departures) and a client's end of its reply ring.

use core::sync::atomic::Ordering;

use super::memory::{ClientId, Departed, EntryState, GroupError, GroupMemory, Replied};
use crate::ring::{ConsumerCore, ProducerCore};

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
        let replies = (0..group.entries())
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
        for slot in 0..self.group.entries() {
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
        if u32::from(id.slot()) >= group.entries() {
            return Err(GroupError::UnknownClient { id: id.0, entries: group.entries() });
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
