//! The views of a host channel's ring that the host ends take, in the format its protocol names.

use std::ptr::NonNull;

use super::handle::{ChannelInfo, Mailbox, Placement, in_map};
use crate::error::{Result, ShmError};
use crate::layout::RingHeader;
use crate::protocol::Protocol;
use crate::ring::RingMemory;

impl Mailbox {
    pub(crate) fn ring_header(&self, ring_offset: u64) -> &RingHeader {
        // SAFETY: callers pass the offset of a live descriptor, checked by `live_desc` to lie in the arena.
        // The ring header holds only atomics.
        unsafe { &*self.base().add(in_map(ring_offset)).cast::<RingHeader>() }
    }

    /// The header and slots of host channel `info`, whose protocol must be `wanted`; a device
    /// channel's slots are not in this process's reach.
    pub(super) fn host_ring(&self, info: &ChannelInfo, wanted: Protocol) -> Result<(NonNull<RingHeader>, NonNull<u8>)> {
        if info.placement != Placement::Host {
            return Err(ShmError::DevicePlacement { channel: info.name.clone() });
        }
        if info.protocol != wanted {
            return Err(ShmError::Protocol { channel: info.name.clone(), protocol: info.protocol, wanted });
        }
        let header = NonNull::from(self.ring_header(info.ring_offset));
        // SAFETY: the slots offset was validated with the descriptor: page aligned, after the header,
        // its protocol's slot bytes inside the arena.
        let slots = unsafe { NonNull::new_unchecked(self.base().add(in_map(info.slots_offset))) };
        Ok((header, slots))
    }

    /// The ring of a host channel of protocol ll.
    pub(crate) fn ring_memory(&self, info: &ChannelInfo) -> Result<RingMemory> {
        let (header, slots) = self.host_ring(info, Protocol::Ll)?;
        // SAFETY: `info` came from a validated descriptor: the header and its slots lie in the
        // arena of this mapping, which the caller keeps alive (ends hold the `Arc`).
        Ok(unsafe { RingMemory::new(header, slots.cast(), info.msg_size as usize, u64::from(info.capacity)) })
    }

    /// The ring of a host channel of protocol bulk.
    pub(crate) fn bulk_memory(&self, info: &ChannelInfo) -> Result<crate::bulk::BulkMemory> {
        let (header, slots) = self.host_ring(info, Protocol::Bulk)?;
        // SAFETY: `info` came from a validated descriptor (capacity a power of two up to 2^24, message
        // size a multiple of 16): the header and its slots lie in the arena of this mapping, which the
        // caller keeps alive (ends hold the `Arc`).
        Ok(unsafe {
            crate::bulk::BulkMemory::new(header, slots, info.msg_size as usize, u64::from(info.capacity), info.parts)
        })
    }

    /// The ring of a host channel of protocol index.
    pub(crate) fn index_memory(&self, info: &ChannelInfo) -> Result<crate::index_ring::IndexMemory> {
        let (header, slots) = self.host_ring(info, Protocol::Index)?;
        // SAFETY: `info` came from a validated descriptor (capacity a power of two, message size a
        // multiple of 8, slots page aligned): the header and its slots lie in the arena of this
        // mapping, which the caller keeps alive (ends hold the `Arc`).
        Ok(unsafe {
            crate::index_ring::IndexMemory::new(header, slots, info.msg_size as usize, u64::from(info.capacity))
        })
    }
}
