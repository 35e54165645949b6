//! A service's channels in the mailbox: creating a fan-in channel and a channel group, and the views of them that the service ends take.

use super::handle::{ChannelInfo, Mailbox, Placement};
use crate::error::{Result, ShmError};
use crate::layout::group_bytes;
use crate::protocol::Protocol;

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
