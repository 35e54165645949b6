//! The channel table: every descriptor checked before it is believed, channels found by name, and what each one holds.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::handle::{ChannelInfo, Mailbox, Placement, in_map};
use crate::error::{Result, ShmError};
use crate::layout::*;
use crate::protocol::Protocol;

/// A live descriptor's fields, checked.
#[derive(Debug, Clone)]
pub(super) struct LiveDesc {
    pub(super) name: String,
    pub(super) msg_size: u32,
    pub(super) capacity: u32,
    pub(super) ring_offset: u64,
    pub(super) placement: Placement,
    pub(super) protocol: Protocol,
    pub(super) parts: u32,
    pub(super) slots_offset: u64,
    /// Where its ring ends (checked to lie in the arena).
    pub(super) end: u64,
}

impl Mailbox {
    pub(crate) fn desc(&self, index: u32) -> &ChannelDesc {
        assert!(index < self.inner.geometry.channel_count, "descriptor index checked by callers");
        let off = self.inner.geometry.channels_offset + u64::from(index) * size_of::<ChannelDesc>() as u64;
        // SAFETY: the validated table lies inside the mapping; fields other than `state` are written
        // only before `state` is published with Release, and read after an Acquire load of it.
        unsafe { &*self.base().add(in_map(off)).cast::<ChannelDesc>() }
    }

    /// A descriptor's fields if it is live and describes a ring inside the arena.
    pub(super) fn live_desc(&self, index: u32) -> std::result::Result<Option<LiveDesc>, String> {
        let d = self.desc(index);
        if d.state.load(Ordering::Acquire) != 1 {
            return Ok(None);
        }
        let (msg_size, capacity, ring_offset, slots_offset) = (d.msg_size, d.capacity, d.ring_offset, d.slots_offset);
        let protocol = Protocol::from_code(d.protocol).ok_or_else(|| {
            format!(
                "protocol {}: must be {PROTOCOL_LL} (ll), {PROTOCOL_BULK} (bulk), {PROTOCOL_INDEX} (index), \
                 {PROTOCOL_FANIN} (fanin) or {PROTOCOL_GROUP} (group); this build does not know its format, so \
                 neither its size nor its bounds (a newer meshd's channel?)",
                d.protocol
            )
        })?;
        // A 0 is a descriptor written before the field existed: one part, the format it has.
        let parts = d.parts.max(1);
        check_channel_params(msg_size, capacity, protocol)?;
        check_parts(msg_size, protocol, parts)?;
        let placement = Placement::from_code(d.placement).ok_or_else(|| {
            format!("placement {}: must be {PLACEMENT_HOST} (host) or {PLACEMENT_DEVICE} (device)", d.placement)
        })?;
        check_placement(protocol, placement)?;
        let g = self.inner.geometry;
        if ring_offset > g.arena_offset + g.arena_size {
            return Err(format!("ring at {ring_offset} lies past the arena's end {}", g.arena_offset + g.arena_size));
        }
        let end = ring_bytes_at(ring_offset, msg_size, capacity, placement.code(), protocol.code(), parts)
            .and_then(|bytes| ring_offset.checked_add(bytes))
            .ok_or("ring end overflows")?;
        if ring_offset % LINE != 0 || ring_offset < g.arena_offset || end > g.arena_offset + g.arena_size {
            return Err(format!(
                "ring at {ring_offset}..{end} is not a {LINE}-aligned range of the arena {}..{}",
                g.arena_offset,
                g.arena_offset + g.arena_size
            ));
        }
        let expected_slots = match placement {
            Placement::Host => host_slots_offset(ring_offset),
            Placement::Device => 0,
        };
        if slots_offset != expected_slots {
            return Err(format!(
                "slots at {slots_offset}: a {placement} ring whose header is at {ring_offset} has them at {expected_slots}"
            ));
        }
        Ok(Some(LiveDesc {
            name: decode_name(&d.name),
            msg_size,
            capacity,
            ring_offset,
            placement,
            protocol,
            parts,
            slots_offset,
            end,
        }))
    }

    pub(super) fn validate_tables(&self) -> Result<()> {
        let invalid = |field, reason| ShmError::Invalid { path: self.inner.path.clone(), field, reason };
        let used = self.header().arena_used.load(Ordering::Acquire);
        if let Some(reason) = self.cursor_past_arena(used) {
            return Err(invalid("arena cursor", reason));
        }
        let mut rings = Vec::new();
        for i in 0..self.inner.geometry.channel_count {
            match self.live_desc(i) {
                Ok(Some(d)) => rings.push((d.ring_offset, d.end, i)),
                Ok(None) => {}
                Err(reason) => return Err(self.bad_desc(i, &reason)),
            }
        }
        rings.sort_unstable();
        for pair in rings.windows(2) {
            if pair[1].0 < pair[0].1 {
                return Err(invalid(
                    "channel table",
                    format!("rings of channels {} and {} overlap", pair[0].2, pair[1].2),
                ));
            }
        }
        Ok(())
    }

    /// Why the arena cursor `used` cannot be right whatever the rings: it lies past the arena. The
    /// check `open` makes and every channel's creation makes again.
    pub(super) fn cursor_past_arena(&self, used: u64) -> Option<String> {
        let size = self.inner.geometry.arena_size;
        (used > size).then(|| format!("{used} bytes used of a {size}-byte arena"))
    }

    pub(super) fn find_channel(&self, name: &str) -> Result<Option<u32>> {
        for i in 0..self.inner.geometry.channel_count {
            // Only the descriptor of that name is validated: another one that a peer damaged after the
            // open is that channel's fault, and must not make every other channel unreachable.
            let d = self.desc(i);
            if d.state.load(Ordering::Acquire) != 1 || decode_name(&d.name) != name {
                continue;
            }
            match self.live_desc(i) {
                Ok(Some(d)) if d.name == name => return Ok(Some(i)),
                Ok(_) => {}
                Err(reason) => return Err(self.bad_desc(i, &reason)),
            }
        }
        Ok(None)
    }

    /// Descriptor `index` fails validation for `reason`: the error names it, by index and name.
    pub(super) fn bad_desc(&self, index: u32, reason: &str) -> ShmError {
        let name = decode_name(&self.desc(index).name);
        ShmError::Invalid {
            path: self.inner.path.clone(),
            field: "channel table",
            reason: format!("channel {index} {name:?}: {reason}"),
        }
    }

    pub(super) fn channel_info_at(&self, index: u32) -> Result<Option<ChannelInfo>> {
        let Some(LiveDesc { name, msg_size, capacity, ring_offset, placement, protocol, parts, slots_offset, .. }) =
            self.live_desc(index).map_err(|reason| self.bad_desc(index, &reason))?
        else {
            return Ok(None);
        };
        let ring = self.ring_header(ring_offset);
        let holder = |w: &AtomicU64| crate::claim::Holder::from_word(w.load(Ordering::Acquire)).map(|h| h.pid);
        let (mut head, mut tail) =
            (ring.producer.head.load(Ordering::Acquire), ring.consumer.tail.load(Ordering::Acquire));
        if protocol == Protocol::Bulk && parts > 1 && placement == Placement::Host {
            // The parts' own lines, which a GPU end publishes on every message (the header's only
            // when it closes): the lower bounds over them.
            (head, tail) = self.bulk_part_bounds(slots_offset, capacity, parts);
        }
        if protocol == Protocol::FanIn && parts > 1 {
            // Every shard's cursor and tail, summed: what the channel took in and gave out.
            let shards = self.fanin_memory_at(ring_offset, slots_offset, msg_size, capacity, parts);
            (head, tail) = (shards.next(), shards.tail());
        }
        Ok(Some(ChannelInfo {
            index,
            name,
            msg_size,
            capacity,
            ring_offset,
            placement,
            protocol,
            parts,
            slots_offset,
            lost: self.desc(index).lost.load(Ordering::Acquire),
            head,
            tail,
            producer_pid: holder(&ring.claims.producer),
            consumer_pid: holder(&ring.claims.consumer),
        }))
    }

    /// The live channel called `name`.
    pub fn channel(&self, name: &str) -> Result<ChannelInfo> {
        let index = self.find_channel(name)?.ok_or_else(|| ShmError::NoSuchChannel(name.to_string()))?;
        // Read without the table lock: the channel found can be deleted and its descriptor given to
        // another name between the two reads.
        self.channel_info_at(index)?
            .filter(|info| info.name == name)
            .ok_or_else(|| ShmError::NoSuchChannel(name.to_string()))
    }

    /// Every live channel, in table order; the first descriptor that fails validation fails the whole.
    pub fn channels(&self) -> Result<Vec<ChannelInfo>> {
        self.channels_each().into_iter().collect()
    }

    /// Every live channel, in table order, each descriptor on its own: one that fails validation (a
    /// peer process can write any descriptor at any time) is an error naming it, and the others are
    /// listed all the same. What a server that lists channels for everyone (meshd's `info`) reads.
    pub fn channels_each(&self) -> Vec<Result<ChannelInfo>> {
        (0..self.inner.geometry.channel_count).filter_map(|i| self.channel_info_at(i).transpose()).collect()
    }

    /// The smallest head and tail over the parts of a host bulk channel of more than one part, read
    /// from its index lines (each the furthest-behind part's, on the wrapping sequence line).
    pub(super) fn bulk_part_bounds(&self, slots_offset: u64, capacity: u32, parts: u32) -> (u64, u64) {
        let lines = slots_offset + crate::layout::bulk_lines_offset(capacity, parts);
        let word = |line: u64| {
            // SAFETY: `live_desc` checked that the ring's slots, whose index lines these are
            // (`2 × parts` of them after the flags), lie in the arena of this mapping; lines are
            // 128-byte aligned (page-aligned slots) and only accessed atomically.
            unsafe { &*self.base().add(in_map(lines + line * LINE)).cast::<AtomicU64>() }.load(Ordering::Acquire)
        };
        let lowest = |first: u64| {
            (0..u64::from(parts))
                .map(|p| word(2 * p + first))
                .reduce(|m, x| if (m.wrapping_sub(x) as i64) > 0 { x } else { m })
        };
        (lowest(0).unwrap_or(0), lowest(1).unwrap_or(0))
    }

    /// The shards of a fan-in channel whose descriptor `live_desc` validated (host placement).
    pub(super) fn fanin_memory_at(
        &self,
        ring_offset: u64,
        slots_offset: u64,
        msg_size: u32,
        capacity: u32,
        shards: u32,
    ) -> crate::fanin::FanInShards {
        let header = NonNull::from(self.ring_header(ring_offset));
        // SAFETY: as in `fanin_memory`: the validated descriptor's region holds every shard in the
        // arena of this mapping, which outlives the value (used at once, then dropped).
        unsafe {
            let region = NonNull::new_unchecked(self.base().add(in_map(slots_offset)));
            crate::fanin::FanInShards::new(header, region, msg_size, capacity, shards)
        }
    }

    /// The live channel called `name`, for a GPU program to bind: refused, naming it and why, when
    /// its protocol is one no GPU program speaks ([`Protocol::Index`]). Backends resolve a load's
    /// bindings with it before they change anything.
    pub fn channel_for_program(&self, name: &str) -> Result<ChannelInfo> {
        let info = self.channel(name)?;
        if !info.protocol.gpu_bindable() {
            return Err(ShmError::HostOnly { channel: info.name, protocol: info.protocol });
        }
        Ok(info)
    }
}

/// Checks a channel's message size and capacity.
pub(super) fn check_channel_params(
    msg_size: u32,
    capacity: u32,
    protocol: Protocol,
) -> std::result::Result<(), String> {
    match protocol {
        Protocol::Ll | Protocol::Index | Protocol::FanIn | Protocol::Group
            if msg_size == 0 || !msg_size.is_multiple_of(8) || msg_size > MAX_MSG_SIZE =>
        {
            return Err(format!(
                "message size {msg_size}: must be a multiple of 8 from 8 to {MAX_MSG_SIZE} for protocol {protocol} \
                 (protocol bulk carries up to {MAX_BULK_MSG_SIZE})"
            ));
        }
        Protocol::Bulk if msg_size == 0 || !msg_size.is_multiple_of(BULK_MSG_ALIGN) || msg_size > MAX_BULK_MSG_SIZE => {
            return Err(format!(
                "message size {msg_size}: must be a multiple of {BULK_MSG_ALIGN} from {BULK_MSG_ALIGN} to \
                 {MAX_BULK_MSG_SIZE} (16 MiB) for protocol bulk"
            ));
        }
        _ => {}
    }
    if !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
        return Err(format!("capacity {capacity}: must be a power of two up to {MAX_CAPACITY}"));
    }
    Ok(())
}

/// Checks a channel's parts word: for protocol bulk its parts, a power of two from 1 to
/// [`MAX_BULK_PARTS`], the message size a multiple of 16 × parts (every part a whole number of the
/// 16-byte vector copies); for protocol fanin its shards, a power of two from 1 to
/// [`MAX_FANIN_SHARDS`]; for a group its entries; 1 for ll and index.
pub(super) fn check_parts(msg_size: u32, protocol: Protocol, parts: u32) -> std::result::Result<(), String> {
    if protocol == Protocol::Group {
        // A group's word is its entry count.
        let max = crate::group::MAX_ENTRIES;
        if parts == 0 || parts > max {
            return Err(format!("{parts} client slots: a group has 1 to {max} (a client id keeps 16 bits of slot)"));
        }
        return Ok(());
    }
    if parts == 1 {
        return Ok(());
    }
    if protocol == Protocol::FanIn {
        // A fan-in channel's word is its shard count: whole rings, so any message size goes.
        if !parts.is_power_of_two() || parts > MAX_FANIN_SHARDS {
            return Err(format!(
                "{parts} shards: a fan-in channel has a power of two from 1 to {MAX_FANIN_SHARDS} shards"
            ));
        }
        return Ok(());
    }
    if protocol != Protocol::Bulk {
        return Err(format!(
            "parts {parts}: only a channel of protocol bulk splits its messages into parts (and only a fan-in \
             channel has shards; this one is protocol {protocol}); leave parts at 1"
        ));
    }
    if !parts.is_power_of_two() || parts > MAX_BULK_PARTS {
        return Err(format!("parts {parts}: must be a power of two from 1 to {MAX_BULK_PARTS}"));
    }
    if !msg_size.is_multiple_of(BULK_MSG_ALIGN * parts) {
        return Err(format!(
            "message size {msg_size}: with {parts} parts it must be a multiple of {} ({BULK_MSG_ALIGN} × parts), so \
             that every part is a whole number of 16-byte units",
            BULK_MSG_ALIGN * parts
        ));
    }
    Ok(())
}

/// Checks that a channel of `protocol` can live where `placement` says: an index channel's two ends
/// are host processes, so its slots are in host memory.
pub(super) fn check_placement(protocol: Protocol, placement: Placement) -> std::result::Result<(), String> {
    if matches!(protocol, Protocol::FanIn | Protocol::Group) && placement != Placement::Host {
        return Err(format!(
            "placement {placement}: protocol {protocol} has host processes at one end (the clients), and its \
             host-only words (owner table, entry holders) must be in the mailbox: host placement only"
        ));
    }
    if protocol == Protocol::Index && placement != Placement::Host {
        return Err(format!(
            "placement {placement}: protocol index is for two host processes, so its slots must be in host memory \
             (--placement host); a device ring is for GPU programs (protocol ll or bulk)"
        ));
    }
    Ok(())
}
