//! The channel group over raw memory: one SPSC reply ring per client slot, handed out by meshd and taken back only once the program has acknowledged the last client's departure; and the service core that pairs it with a fan-in ring.
//!
//! The design, defended, is `docs/explanation/services.md` ("The reply side");
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
//! * `entries` reply rings, [`GroupMemory::ring_stride`] bytes apart: a [`RingHeader`](crate::layout::RingHeader) and the LL
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

mod memory;
mod meshd;
mod program;
mod service;
#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test counts, ids and sizes are small")]
mod tests;

pub use memory::{
    ClientId, Departed, EntryMeshdLine, EntryProgramLine, EntrySnapshot, EntryState, GroupEntry, GroupError,
    GroupHeader, GroupMemory, MAX_ENTRIES, Replied,
};
pub use meshd::GroupMeshd;
pub use program::{GroupProgram, ReplyReceiver};
pub use service::{ServiceClient, ServiceMemory, ServiceMeshd, ServiceServer};
