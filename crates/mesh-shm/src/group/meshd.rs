//! meshd's side of a group: hands client slots out and takes them back once the program has acknowledged the departure.

use core::sync::atomic::Ordering;

use super::memory::{ClientId, EntryState, GroupError, GroupMemory, binding};
use crate::claim::Holder;

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
        for slot in 0..g.entries() {
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
            return Err(GroupError::AllBound { entries: g.entries() });
        }
        Err(GroupError::AwaitingAck { entries: g.entries(), bound, awaiting_ack })
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
        for slot in 0..self.group.entries() {
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
