//! The fan-in ring over raw memory: many host producers, one consumer (a GPU program or a host process), every message carrying its sender, a dead or stalled producer's reservation completed as a skip.
//!
//! The design, defended, is `docs/explanation/services.md`; this is its CPU core. Kept free of files
//! and mappings so that Miri runs it over heap memory (`cargo +nightly miri test -p mesh-shm --lib
//! fanin::`). In the mailbox it is a channel of protocol fanin (layout version 4,
//! `layout::PROTOCOL_FANIN`; `Mailbox::create_fanin`), whose host ends are `service`'s and whose GPU
//! consumer is mesh.cuh's.
//!
//! **Memory** (three regions, like the other rings: a [`RingHeader`](crate::layout::RingHeader), an owner table, the slots):
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

mod completion;
mod consumer;
mod memory;
mod producer;
mod shards;
#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test counts, ids and sizes are small")]
mod tests;

pub use completion::{Completion, Hold, complete_dead, hold_at_tail, repair, revoke_live};
pub use consumer::{FanInConsumer, ShardedConsumer, Taken};
pub use memory::{FanInCorrupt, FanInMemory, HEADER_WORDS, KIND_DATA, KIND_SKIP, OwnState, Ownership, owner_of};
pub use producer::{FanInProducer, SendOp, Stage, Step};
pub use shards::FanInShards;
