//! Creating and deleting channels: a ring placed in a free run of the arena under the table lock, zeroed, laid out, then published; a delete that unpublishes it; and a device ring's renewal.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use super::crash::crash_point;
use super::handle::{ChannelInfo, Mailbox, Placement, in_map};
use super::table::{check_channel_params, check_parts, check_placement};
use crate::arena::{Arena, ArenaUsage, Refusal};
use crate::error::{Result, ShmError};
use crate::layout::*;
use crate::protocol::Protocol;

impl Mailbox {
    /// Creates a named channel of `capacity` messages (a power of two) of `msg_size` bytes (a multiple of
    /// 8), its slots in the mailbox.
    pub fn create_channel(&self, name: &str, msg_size: u32, capacity: u32) -> Result<ChannelInfo> {
        self.create_channel_placed(name, msg_size, capacity, Placement::Host)
    }

    /// Creates a channel as [`Mailbox::create_channel`] does, its slots where `placement` says: for
    /// [`Placement::Device`] the mailbox holds only the ring's header (indices and claims), and the
    /// process that launches the programs provides the slots (see [`Mailbox::mesh_ctx_with`]).
    /// The protocol is [`Protocol::default_for`] the message size: see [`Mailbox::create_channel_with`].
    pub fn create_channel_placed(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
    ) -> Result<ChannelInfo> {
        self.create_channel_with(name, msg_size, capacity, placement, Protocol::default_for(msg_size))
    }

    /// Creates a channel as [`Mailbox::create_channel_placed`] does, its slots in the format `protocol`
    /// names: [`Protocol::Ll`] for messages up to 64 KiB (multiples of 8), [`Protocol::Bulk`] for
    /// messages of 16 B to 16 MiB (multiples of 16), [`Protocol::Index`] for messages of 8 B to 64 KiB
    /// (multiples of 8) between two host processes (host placement only; no program may bind it).
    /// Host ends of LL and index channels are [`crate::Producer`] and [`crate::Consumer`], of a bulk
    /// channel [`crate::BulkProducer`] and [`crate::BulkConsumer`]; GPU programs use mesh.cuh's
    /// `mesh_chan_*` (LL) and `mesh_block_*` (bulk) calls.
    pub fn create_channel_with(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
        protocol: Protocol,
    ) -> Result<ChannelInfo> {
        self.create_channel_parts(name, msg_size, capacity, placement, protocol, 1)
    }

    /// Creates a channel as [`Mailbox::create_channel_with`] does, every message split into `parts`
    /// parts (protocol bulk: a power of two from 1 to [`MAX_BULK_PARTS`], `msg_size` a multiple of
    /// 16 × `parts`; any other protocol: 1), so that up to `parts` GPU blocks serve each end, block
    /// `p` moving part `p` of every message (mesh.cuh's `mesh_bulk_open_part`). One part is the
    /// format of [`Mailbox::create_channel_with`]. The host ends serve every part.
    ///
    /// [`Protocol::FanIn`] is taken here too (what [`Mailbox::create_fanin`] does); a
    /// [`Protocol::Group`] needs its number of client slots: [`Mailbox::create_group`].
    pub fn create_channel_parts(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
        protocol: Protocol,
        parts: u32,
    ) -> Result<ChannelInfo> {
        if protocol == Protocol::Group {
            return Err(ShmError::ChannelConfig {
                name: name.to_string(),
                reason: "protocol group: a channel group is created with its number of client slots \
                         (Mailbox::create_group)"
                    .into(),
            });
        }
        self.create_ring(name, msg_size, capacity, placement, protocol, parts, |_, _| Ok(()))
    }

    /// Creates a channel of any protocol: checks, carves its ring out of the arena under the table
    /// lock, zeroes its header (and, for fan-in and group, its whole slots region: their formats say
    /// that zeroed memory is an empty ring and free entries), lets `init` lay out the slots region
    /// (its address and file offset), then publishes the descriptor.
    #[allow(clippy::too_many_arguments, reason = "the descriptor's fields, and the protocol's layout step")]
    pub(super) fn create_ring(
        &self,
        name: &str,
        msg_size: u32,
        capacity: u32,
        placement: Placement,
        protocol: Protocol,
        parts: u32,
        init: impl FnOnce(NonNull<u8>, u64) -> std::result::Result<(), String>,
    ) -> Result<ChannelInfo> {
        let cfg = |reason: String| ShmError::ChannelConfig { name: name.to_string(), reason };
        let encoded =
            encode_name(name).ok_or_else(|| cfg(format!("name must be 1 to {NAME_LEN} bytes without NUL")))?;
        // A name is printed in tables and log lines and listed in `--bind a,b`: no control characters,
        // no spaces, no commas (a name that cannot be typed could not be deleted either).
        if let Some(c) = name.chars().find(|&c| c.is_control() || c.is_whitespace() || c == ',') {
            return Err(cfg(format!("name may not hold control characters, spaces or commas (it holds {c:?})")));
        }
        check_channel_params(msg_size, capacity, protocol).map_err(cfg)?;
        check_parts(msg_size, protocol, parts).map_err(cfg)?;
        check_placement(protocol, placement).map_err(cfg)?;
        let _lock = TableLock::take(&self.header().table_lock);
        crash_point("create:locked");
        if self.find_channel(name)?.is_some() {
            return Err(ShmError::ChannelExists(name.to_string()));
        }
        let g = self.inner.geometry;
        let index =
            (0..g.channel_count).find(|&i| self.desc(i).state.load(Ordering::Acquire) == 0).ok_or_else(|| {
                ShmError::Full {
                    name: name.into(),
                    reason: format!("full: all {} channel descriptors are in use", g.channel_count),
                    room: None,
                }
            })?;
        let used = self.header().arena_used.load(Ordering::Acquire);
        self.check_arena_cursor(used)?;
        let ring_size = |at| ring_bytes_at(at, msg_size, capacity, placement.code(), protocol.code(), parts);
        if ring_size(g.arena_offset).is_none() {
            return Err(cfg(format!("protocol {protocol}: no size in this build's layout")));
        }
        let arena = Arena::new(g.arena_offset, g.arena_size, LINE);
        let (ring_offset, ring_end) = arena.place(&self.live_ranges(used).0, ring_size).map_err(|refusal| {
            let reason = match refusal {
                Refusal::Full { asked, free } => {
                    format!("full: its ring needs {asked} bytes, {free} of the {}-byte arena are free", g.arena_size)
                }
                // "fragmented: X free in all, largest free run Y, asked Z".
                Refusal::Fragmented { .. } => refusal.to_string(),
            };
            ShmError::Full { name: name.into(), reason, room: Some(refusal) }
        })?;
        let slots_offset = match placement {
            Placement::Host => host_slots_offset(ring_offset),
            Placement::Device => 0,
        };
        // SAFETY: the range lies in a free run of the arena (`place` chose it among the gaps between
        // the live rings) and belongs to no ring; the table lock keeps any other creator out. Zeroed
        // so that a reused file starts with empty indices and claims.
        unsafe { std::ptr::write_bytes(self.base().add(in_map(ring_offset)), 0, size_of::<RingHeader>()) };
        crash_point("create:header-zeroed");
        // Below the high-water mark the bytes may be a freed ring's: stale LL tags or bulk flags there
        // would read as messages. Past it the arena was never handed out and is still the file's
        // zeroes, so a mailbox whose channels were never freed zeroes nothing more than it did. Only
        // the words a format reads as state are zeroed: LL's tags sit in every line, but a bulk
        // ring's payloads and an index ring's slots hold no tag (a message is whole by its flags or
        // by `head`), so a reused 16 MiB bulk ring costs its flags and lines, not a 16 MiB memset
        // that would take memory bandwidth from every running program. A payload's stale bytes are
        // never delivered: a consumer reads only what a producer wrote after the create.
        let tagged_end = match protocol {
            Protocol::Bulk => slots_offset + bulk_payload_offset(capacity, parts),
            Protocol::Index => ring_offset + size_of::<RingHeader>() as u64,
            _ => ring_end,
        };
        let dirty_end = ring_end.min(tagged_end).min(g.arena_offset + used);
        if placement == Placement::Host && dirty_end > ring_offset {
            // SAFETY: `ring_offset..dirty_end` lies inside the free range just placed, as above.
            unsafe { std::ptr::write_bytes(self.base().add(in_map(ring_offset)), 0, in_map(dirty_end - ring_offset)) };
        }
        crash_point("create:slots-zeroed");
        if placement == Placement::Host {
            // SAFETY: the slots region lies in the range just carved out of the arena (`ring_size`
            // counts it), which no one else reaches before the descriptor is published below.
            let region = unsafe { NonNull::new_unchecked(self.base().add(in_map(slots_offset))) };
            if matches!(protocol, Protocol::FanIn | Protocol::Group) {
                let len = slot_bytes_for(msg_size, capacity, protocol.code(), parts).unwrap_or(0);
                // SAFETY: as above; `len` bytes from the slots offset end inside the ring's range.
                unsafe { std::ptr::write_bytes(region.as_ptr(), 0, in_map(len)) };
            }
            init(region, slots_offset).map_err(cfg)?;
        }
        crash_point("create:slots-laid-out");
        let d = self.desc(index);
        let d_ptr = std::ptr::from_ref(d).cast_mut();
        // SAFETY: the descriptor is free (state 0), so no reader looks at these fields until the
        // Release store of `state` below; the table lock excludes other writers.
        unsafe {
            (&raw mut (*d_ptr).msg_size).write(msg_size);
            (&raw mut (*d_ptr).capacity).write(capacity);
            (&raw mut (*d_ptr).ring_offset).write(ring_offset);
            (&raw mut (*d_ptr).placement).write(placement.code());
            (&raw mut (*d_ptr).protocol).write(protocol.code());
            (&raw mut (*d_ptr).parts).write(parts);
            (&raw mut (*d_ptr).slots_offset).write(slots_offset);
            (&raw mut (*d_ptr).name).write(encoded);
        }
        crash_point("create:descriptor-written");
        // The high-water mark: a reader that still treats it as a bump cursor starts past every ring.
        self.header().arena_used.store(used.max(ring_end - g.arena_offset), Ordering::Release);
        crash_point("create:high-water-stored");
        d.state.store(1, Ordering::Release);
        crash_point("create:published");
        self.channel_info_at(index)?.ok_or_else(|| ShmError::NoSuchChannel(name.to_string()))
    }

    /// Deletes the channel called `name`: its descriptor is unpublished (one store, so a process
    /// killed at any step leaves it either live or deleted), and its ring's bytes are free for the
    /// next channel created; the name can be created again at once, with any size. Returns the
    /// messages it held that are now discarded (by the published indices: a lower bound for a device
    /// ring whose GPU end has not published its last batch).
    ///
    /// Refused, naming the holder, while a program slot in use binds it or a live host process holds
    /// its producer or consumer end; refused while it holds messages unless `discard`. A fan-in
    /// channel or a channel group is refused too: it is a service's, deleted with its service
    /// ([`Mailbox::delete_service`]), whose clients meshd knows.
    ///
    /// A host end claimed while the delete runs cannot keep a dead ring: every claiming end reads
    /// the descriptor again under the table lock after it took its claim word, and gives the claim
    /// back if the channel is gone or is another channel now (`claims`); an end claimed between the
    /// checks below and the unpublishing store is also seen by the second look at the claim words,
    /// which publishes the descriptor again and refuses the delete.
    pub fn delete_channel(&self, name: &str, discard: bool) -> Result<u64> {
        let refuse = |reason: String| ShmError::ChannelConfig { name: name.to_string(), reason };
        let _lock = TableLock::take(&self.header().table_lock);
        let index = self.find_channel(name)?.ok_or_else(|| ShmError::NoSuchChannel(name.to_string()))?;
        let info = self.channel_info_at(index)?.ok_or_else(|| ShmError::NoSuchChannel(name.to_string()))?;
        if matches!(info.protocol, Protocol::FanIn | Protocol::Group) {
            let service = match info.protocol {
                Protocol::Group => name.strip_suffix(crate::protocol::SERVICE_REPLIES_SUFFIX).unwrap_or(name),
                _ => name,
            };
            return Err(refuse(format!(
                "protocol {}: a service's channel is deleted with its service, not on its own: use service \
                 delete {service:?}",
                info.protocol
            )));
        }
        if let Some(slot) = self.binding_slot(&[index])? {
            return Err(refuse(format!("in use: the program in slot {slot} binds it (unload the program first)")));
        }
        let ring = self.ring_header(info.ring_offset);
        let holders = || live_holder(ring);
        if let Some((end, pid)) = holders() {
            return Err(refuse(format!("in use: pid {pid} holds its {end} end")));
        }
        let queued = info.head.saturating_sub(info.tail);
        if queued > 0 && !discard {
            return Err(refuse(format!("it holds {queued} message(s): delete it with discard to drop them")));
        }
        crash_point("delete:checked");
        let d = self.desc(index);
        d.state.store(0, Ordering::SeqCst);
        crash_point("delete:unpublished");
        // A claim that read the descriptor live before the store above and took its end meanwhile
        // is seen here (both sides use SeqCst): the channel stays, and the claimer keeps it.
        if let Some((end, pid)) = holders() {
            d.state.store(1, Ordering::SeqCst);
            return Err(refuse(format!("in use: pid {pid} took its {end} end while it was being deleted")));
        }
        Ok(queued)
    }

    /// The first program slot in use that binds any of the descriptors `indices`.
    pub(super) fn binding_slot(&self, indices: &[u32]) -> Result<Option<u32>> {
        for slot in 0..self.inner.geometry.slot_count {
            let slot = self.slot(slot)?;
            if slot.in_use() && slot.bindings().iter().any(|b| indices.contains(b)) {
                return Ok(Some(slot.index()));
            }
        }
        Ok(None)
    }

    /// The ranges of the arena that live rings take, `(start, end)`, and the descriptors published.
    /// Every published descriptor that validates counts with its ring's bytes (host or device
    /// placement, every protocol: `live_desc` sizes it by `ring_bytes_at`). One that does not (a
    /// newer meshd's protocol, a damaged word) has no size this build can trust, so while one is
    /// published everything below the high-water mark `used` counts as taken, and new rings go past it
    /// as they did before space was reused.
    pub(super) fn live_ranges(&self, used: u64) -> (Vec<(u64, u64)>, u32) {
        let g = self.inner.geometry;
        let mut ranges = Vec::new();
        let mut published = 0;
        for i in 0..g.channel_count {
            if self.desc(i).state.load(Ordering::Acquire) == 0 {
                continue;
            }
            published += 1;
            match self.live_desc(i) {
                Ok(Some(d)) => ranges.push((d.ring_offset, d.end)),
                Ok(None) => published -= 1,
                Err(_) => ranges.push((g.arena_offset, g.arena_offset.saturating_add(used))),
            }
        }
        (ranges, published)
    }

    /// What the ring arena and the channel table hold now: the arena's bytes in use by live rings,
    /// free, and in the longest free run (the largest ring that can be created now fits in it), and
    /// the descriptors published out of the table's total. A snapshot, read without the table lock:
    /// a creation running meanwhile may or may not be counted.
    pub fn arena_usage(&self) -> ArenaUsage {
        let g = self.inner.geometry;
        let used = self.header().arena_used.load(Ordering::Acquire).min(g.arena_size);
        let (live, published) = self.live_ranges(used);
        let space = Arena::new(g.arena_offset, g.arena_size, LINE).space(&live);
        ArenaUsage {
            in_use: space.in_use,
            free: space.free,
            largest_free: space.largest_free,
            descriptors_in_use: published,
            descriptors_total: g.channel_count,
        }
    }

    /// Checks the arena cursor `used` (read under the table lock) before a ring is carved out at it.
    /// It is a word of the shared header that any process mapping the file can overwrite after
    /// `open` checked it, and a wrong one would make the new ring overlap a live channel's (zeroing
    /// its indices and claims), sit off a line (every later `open` refuses the whole file), or lie
    /// past the arena, outside the mapping. So it must lie in the arena, on a line, and at or past
    /// the end of every live ring (it is the high-water mark of the rings ever made, which an older
    /// reader takes for a bump cursor). A descriptor that fails validation is that channel's fault
    /// and not counted, as in `find_channel`.
    pub(super) fn check_arena_cursor(&self, used: u64) -> Result<()> {
        let g = self.inner.geometry;
        let furthest = (0..g.channel_count)
            .filter_map(|i| self.live_desc(i).ok().flatten())
            .map(|d| d.end)
            .fold(g.arena_offset, u64::max);
        let reason = if let Some(reason) = self.cursor_past_arena(used) {
            reason
        } else if !used.is_multiple_of(LINE) {
            format!("{used} bytes used, not a multiple of the {LINE}-byte line every ring starts on")
        } else if g.arena_offset + used < furthest {
            format!(
                "{used} bytes used, but the live rings reach byte {} of the arena: a ring made there would overlap them",
                furthest - g.arena_offset
            )
        } else {
            return Ok(());
        };
        Err(ShmError::Invalid {
            path: self.inner.path.clone(),
            field: "arena cursor",
            reason: format!("{reason} (another process overwrote the header?); no channel can be created in this file"),
        })
    }

    /// A device channel's ring got new, empty slots (meshd started, or its context was recreated after a
    /// fault): both indices move to the larger of the two, so that its ends resume on an empty ring.
    /// Returns how many messages the lost slots held by the published indices: `head - tail`, exact
    /// when both ends had closed their channels, a lower bound otherwise (a GPU end publishes its
    /// index in batches of half a ring). Call it only while no program bound to it runs.
    pub fn renew_device_ring(&self, info: &ChannelInfo) -> Result<u64> {
        if info.placement != Placement::Device {
            return Err(ShmError::ChannelConfig {
                name: info.name.clone(),
                reason: "only a device channel's slots can be renewed".into(),
            });
        }
        let ring = self.ring_header(info.ring_offset);
        let head = ring.producer.head.load(Ordering::Acquire);
        let tail = ring.consumer.tail.load(Ordering::Acquire);
        let lost = head.saturating_sub(tail);
        let at = head.max(tail);
        ring.producer.head.store(at, Ordering::Release);
        ring.consumer.tail.store(at, Ordering::Release);
        self.desc(info.index).lost.fetch_add(lost, Ordering::AcqRel);
        Ok(lost)
    }
}

/// The end of `ring` that a live process holds, and its pid (a claim word whose process died holds nothing).
pub(super) fn live_holder(ring: &RingHeader) -> Option<(&'static str, u32)> {
    [("producer", &ring.claims.producer), ("consumer", &ring.claims.consumer)].into_iter().find_map(|(end, w)| {
        crate::claim::Holder::from_word(w.load(Ordering::SeqCst)).filter(|h| h.alive()).map(|h| (end, h.pid))
    })
}

/// The host-only spin lock over the channel table; a holder that died leaves it taken for 1 s at most.
pub(super) struct TableLock<'a>(&'a AtomicU32);

impl<'a> TableLock<'a> {
    pub(super) fn take(word: &'a AtomicU32) -> Self {
        let me = std::process::id();
        let start = std::time::Instant::now();
        loop {
            match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Self(word),
                Err(holder) => {
                    let dead = crate::claim::pid_of(holder)
                        .is_none_or(|p| rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH));
                    if (dead || start.elapsed().as_secs() >= 1)
                        && word.compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
                    {
                        return Self(word);
                    }
                    std::thread::yield_now();
                }
            }
        }
    }
}

impl Drop for TableLock<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}
