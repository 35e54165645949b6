//! A service's channels in the mailbox: creating a fan-in channel and a channel group, deleting both, and the views of them that the service ends take.
//!
//! A service `NAME` is the fan-in channel `NAME` and the group `NAME.replies`, created in that
//! order by two calls. A deletion unpublishes them in the reverse order, group first, so that the
//! one half-state either leaves (a process killed between the two stores, or between the two
//! creations) is the same: a fan-in channel without its group, which
//! [`Mailbox::delete_service`] deletes. A group whose fan-in channel is gone is deleted by it too.

use std::sync::atomic::Ordering;

use super::channels::{TableLock, live_holder};
use super::crash::crash_point;
use super::handle::{ChannelInfo, Mailbox, Placement};
use crate::claim::Holder;
use crate::error::{Result, ShmError};
use crate::group::EntryState;
use crate::layout::group_bytes;
use crate::protocol::{Protocol, SERVICE_REPLIES_SUFFIX};

impl Mailbox {
    /// Creates a fan-in channel (protocol fanin, host placement): any number of host producers
    /// ([`crate::FanInSender`], each sending as the id meshd handed it), one consumer (a GPU program,
    /// or a host server's [`crate::FanInReceiver`]); `msg_size` a multiple of 8 from 8 to 64 KiB,
    /// `capacity` a power of two. Its ring is an empty ring at position 0.
    ///
    /// `shards` (a power of two from 1 to [`MAX_FANIN_SHARDS`](crate::layout::MAX_FANIN_SHARDS), in the descriptor's `parts` word)
    /// makes it that many whole rings of `capacity` slots each (`layout::fanin_shard_offset`), so
    /// that that many times as many senders go in parallel: each has its own cursor, and a client
    /// sends into shard `slot % shards`. One shard is the format of every fan-in channel before
    /// shards existed; a program or host end built before them refuses a channel of more.
    pub fn create_fanin(&self, name: &str, msg_size: u32, capacity: u32, shards: u32) -> Result<ChannelInfo> {
        self.create_ring(name, msg_size, capacity, Placement::Host, Protocol::FanIn, shards, |_, _| Ok(()))
    }

    /// Creates a channel group (protocol group, host placement): `clients` entries (client slots, 1
    /// to 65536), each with its own reply ring of `capacity` replies (a power of two) of `msg_size`
    /// bytes (a multiple of 8 from 8 to 64 KiB). Every entry starts free at epoch 0, every ring empty.
    /// meshd's side is [`crate::ServiceOwner`], the replying server's [`crate::GroupServer`], a
    /// client's [`crate::GroupClient`].
    pub fn create_group(&self, name: &str, clients: u32, msg_size: u32, capacity: u32) -> Result<ChannelInfo> {
        self.create_ring(name, msg_size, capacity, Placement::Host, Protocol::Group, clients, |region, offset| {
            let len = group_bytes(clients, msg_size, capacity);
            // SAFETY: `create_ring` hands us the channel's zeroed slots region, `len` bytes at `offset`
            // (page aligned), inside the arena and shared with no one until the descriptor is published.
            unsafe { crate::group::GroupMemory::create(region, len, offset, clients, msg_size, capacity) }
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    /// Deletes service `name`: its group `name.replies` is unpublished, then its fan-in channel
    /// `name` (each one store, under the table lock), and their rings' bytes are free. A service
    /// left half there (a fan-in channel without its group, or the reverse) is finished: what is
    /// left is deleted. Returns the messages discarded: requests in the fan-in channel (reserved or
    /// committed, not yet taken) and replies not yet read in the reply rings of bound clients.
    ///
    /// Refused ([`ShmError::ServiceRefused`]), naming the holder, while a program slot in use binds
    /// either channel, a live process holds an end (the server's request or reply end, a client's
    /// reply ring), a group entry is bound to a live client, or a live client's reservation holds a
    /// fan-in shard; refused while requests or replies are queued unless `discard`. meshd checks its
    /// clients' leases first; these are the mailbox's own words, what a client that meshd no longer
    /// knows (a previous meshd's) leaves. [`ShmError::NoSuchService`] when neither channel exists; a
    /// channel of that name that is not a service's is refused, pointing to a channel delete.
    pub fn delete_service(&self, name: &str, discard: bool) -> Result<u64> {
        let refuse = |reason: String| ShmError::ServiceRefused { service: name.to_string(), reason };
        let group_name = format!("{name}{SERVICE_REPLIES_SUFFIX}");
        let _lock = TableLock::take(&self.header().table_lock);
        let fanin = self.find_channel(name)?.map(|i| self.channel_info_at(i)).transpose()?.flatten();
        let group = self.find_channel(&group_name)?.map(|i| self.channel_info_at(i)).transpose()?.flatten();
        if fanin.is_none() && group.is_none() {
            return Err(ShmError::NoSuchService(name.to_string()));
        }
        for (info, wanted, what) in [(&fanin, Protocol::FanIn, "fan-in channel"), (&group, Protocol::Group, "group")] {
            if let Some(info) = info.as_ref().filter(|i| i.protocol != wanted) {
                return Err(refuse(format!(
                    "channel {:?} is of protocol {}, not a service's {what} (protocol {wanted}): delete it with \
                     channel delete",
                    info.name, info.protocol
                )));
            }
        }
        let indices: Vec<u32> = fanin.iter().chain(&group).map(|i| i.index).collect();
        if let Some(slot) = self.binding_slot(&indices)? {
            return Err(refuse(format!("in use: the program in slot {slot} binds it (unload the program first)")));
        }
        let mut queued = 0u64;
        if let Some(info) = &group {
            queued += self.group_in_use(info).map_err(refuse)?;
        }
        if let Some(info) = &fanin {
            queued += self.fanin_in_use(info, group.as_ref()).map_err(refuse)?;
        }
        if queued > 0 && !discard {
            return Err(refuse(format!(
                "it holds {queued} request(s) and unread reply(ies): delete it with discard to drop them"
            )));
        }
        crash_point("service-delete:checked");
        if let Some(info) = &group {
            self.desc(info.index).state.store(0, Ordering::SeqCst);
        }
        crash_point("service-delete:group-unpublished");
        if let Some(info) = &fanin {
            self.desc(info.index).state.store(0, Ordering::SeqCst);
        }
        crash_point("service-delete:fanin-unpublished");
        Ok(queued)
    }

    /// A service's group as a delete sees it: `Err` naming a live holder (its reply end, a client's
    /// reply ring, an entry bound to a live client), else the unread replies of bound entries
    /// (departed and free entries' replies are dropped by the group already, at the next connect).
    fn group_in_use(&self, info: &ChannelInfo) -> std::result::Result<u64, String> {
        if let Some((end, pid)) = live_holder(self.ring_header(info.ring_offset)) {
            let role = if end == "producer" { "the server's reply end" } else { "its group's consumer end" };
            return Err(format!("in use: pid {pid} holds {role} ({})", info.name));
        }
        let group = self.group_memory(info).map_err(|e| e.to_string())?;
        let mut replies = 0u64;
        for slot in 0..group.entries() {
            let slot = u16::try_from(slot).map_err(|_| format!("group {}: entry {slot} past 16 bits", info.name))?;
            let entry = group.snapshot(slot).map_err(|e| format!("group {}: {e}", info.name))?;
            let offset = group.reply_ring_offset(slot).unwrap_or(info.ring_offset);
            let ring = self.ring_header(offset);
            if let Some((_, pid)) = live_holder(ring) {
                return Err(format!("in use: pid {pid} holds the reply ring of client slot {slot}"));
            }
            if entry.state == EntryState::Bound {
                if let Some(h) = entry.holder.filter(|h| h.alive()) {
                    return Err(format!(
                        "in use: client slot {slot} is bound to pid {}, which is alive (detach it first)",
                        h.pid
                    ));
                }
                let (head, tail) =
                    (ring.producer.head.load(Ordering::Acquire), ring.consumer.tail.load(Ordering::Acquire));
                replies += head.saturating_sub(tail);
            }
        }
        Ok(replies)
    }

    /// A service's fan-in channel as a delete sees it: `Err` naming a live holder (the server's
    /// request end, a live client's reservation at a shard's head, whose client is found in
    /// `group`), else the requests reserved and not yet taken in all its shards.
    fn fanin_in_use(&self, info: &ChannelInfo, group: Option<&ChannelInfo>) -> std::result::Result<u64, String> {
        if let Some((end, pid)) = live_holder(self.ring_header(info.ring_offset)) {
            let role = if end == "consumer" { "the server's request end" } else { "its producer end" };
            return Err(format!("in use: pid {pid} holds {role} ({})", info.name));
        }
        let shards = self.fanin_memory(info).map_err(|e| e.to_string())?;
        let group = group.map(|g| self.group_memory(g)).transpose().map_err(|e| e.to_string())?;
        for (shard, hold) in shards.holds() {
            let holder: Option<Holder> =
                group.and_then(|g| g.snapshot(hold.owner).ok()).and_then(|e| e.holder).filter(|h| h.alive());
            if let Some(h) = holder {
                return Err(format!(
                    "in use: pid {} (client slot {}) holds shard {shard} of its requests in the middle of a send",
                    h.pid, hold.owner
                ));
            }
        }
        Ok(shards.iter().map(|ring| ring.next().wrapping_sub(ring.tail())).fold(0u64, u64::saturating_add))
    }

    /// The rings of a host channel of protocol fanin: the core's view of every shard's header, owner
    /// table and slots (see `fanin`, `layout::fanin_shard_offset`), all in this mapping.
    pub(crate) fn fanin_memory(&self, info: &ChannelInfo) -> Result<crate::fanin::FanInShards> {
        let (header, region) = self.host_ring(info, Protocol::FanIn)?;
        // SAFETY: `info` came from a validated descriptor: its slots region (page aligned) holds
        // `fanin_region_bytes` for its shard count (a power of two up to MAX_FANIN_SHARDS,
        // `check_parts`) in the arena of this mapping, which the caller keeps alive (ends hold the
        // `Arc`). Capacity is a power of two up to 2^24 (< 2^31), msg_size a non-zero multiple of 8
        // (`check_channel_params`).
        Ok(unsafe { crate::fanin::FanInShards::new(header, region, info.msg_size, info.capacity, info.parts) })
    }

    /// The group of a host channel of protocol group, opened by the core (which validates its header
    /// and every entry's ring offset) and checked against the descriptor.
    pub(crate) fn group_memory(&self, info: &ChannelInfo) -> Result<crate::group::GroupMemory> {
        let (_, region) = self.host_ring(info, Protocol::Group)?;
        let group_err = |error| ShmError::Group { channel: info.name.clone(), error };
        let len = group_bytes(info.parts, info.msg_size, info.capacity);
        // SAFETY: `info` came from a validated descriptor: its slots region (page aligned, so 128-byte
        // aligned) holds `len` bytes in the arena of this mapping, which the caller keeps alive (ends
        // hold the `Arc`); `create_group` laid it out before publishing the descriptor, and its
        // write-once words are not written since. `open` checks what it reads against `len`.
        let group = unsafe { crate::group::GroupMemory::open(region, len, info.slots_offset) }.map_err(group_err)?;
        let (entries, msg_size, capacity) = (group.entries(), group.msg_size(), group.capacity());
        if (entries, msg_size, capacity) != (info.parts, info.msg_size as usize, info.capacity) {
            return Err(group_err(crate::group::GroupError::Invalid {
                field: "header",
                reason: format!(
                    "{entries} entries of {capacity} replies of {msg_size} bytes, but the descriptor says {} of {} of {}",
                    info.parts, info.capacity, info.msg_size
                ),
            }));
        }
        Ok(group)
    }
}
