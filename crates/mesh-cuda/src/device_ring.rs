//! Device channels' message slots: GPU memory that the blink backend's context allocates and owns.
//!
//! A channel created with placement device keeps its header (indices, claims) in the mailbox and its
//! slots here, so that two programs of the context exchange messages without crossing PCIe. The
//! memory is allocated when the first program bound to the channel is launched and lives as long as
//! the context: blinks, upgrades, unloads and reloads leave it (and the messages in it) untouched.
//! A new context (meshd started, or a reset after a fault) starts every ring empty: the mailbox's
//! indices are moved together and the messages they still counted are reported as lost. A deleted
//! channel's ring is released at once and freed as soon as no kernel of the context runs
//! (`cuMemFree` waits for the context's work, and resident kernels never end on their own): at
//! once when none runs, else at the next blink.

use std::collections::HashMap;

use cudarc::driver::sys;
use mesh_shm::{ChannelInfo, Mailbox, MeshCtx, Placement};

use crate::context::Context;
use crate::driver::check;
use crate::error::CudaError;

fn invalid(slot: u32, e: mesh_shm::ShmError) -> CudaError {
    CudaError::Invalid { what: format!("program slot {slot}"), reason: e.to_string() }
}

/// Bytes of device memory channel `info`'s slots take, in its protocol's format (LL: twice the payload;
/// bulk: the flags of every part and, for more than one part, the parts' index lines, padded to a
/// page, then the payload). Both device-ring owners size with it: this
/// module's (blink mode) and `exported`'s (MPS mode).
pub fn ring_bytes(info: &ChannelInfo) -> Result<usize, CudaError> {
    // At most 16 MiB × 2^24 bytes and its flags (mesh-shm's limits): a usize on the 64-bit hosts CUDA
    // runs on.
    let bytes = mesh_shm::layout::slot_bytes_for(info.msg_size, info.capacity, info.protocol.code(), info.parts)
        .ok_or_else(|| CudaError::Invalid {
            what: format!("channel {:?}", info.name),
            reason: format!("protocol {} has no size in this build's layout", info.protocol),
        })?;
    usize::try_from(bytes).map_err(|_| CudaError::Invalid {
        what: format!("channel {:?}", info.name),
        reason: "ring larger than this host's address space".into(),
    })
}

/// One ring's slots in device memory, freed on drop.
#[derive(Debug)]
struct DeviceSlots {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Context,
}

impl DeviceSlots {
    fn alloc(ctx: &Context, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: an out pointer and a size; the context is current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
        let slots = Self { ptr, bytes, ctx: ctx.clone() };
        // Zero: no word carries a tag, so every slot reads as empty. On a stream of its own, waited
        // for alone: the legacy stream's memset would not be ordered before the kernels' own
        // non-blocking streams, and a context-wide wait would wait for resident kernels.
        let stream = ctx.stream()?;
        // SAFETY: `ptr` holds `bytes` bytes, just allocated in this context; the stream is its own.
        check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(ptr, 0, bytes, stream.raw()) })?;
        stream.synchronize()?;
        Ok(slots)
    }
}

impl Drop for DeviceSlots {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: allocated in `alloc` in this context, freed once; an error cannot be acted on here.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// A ring renewed empty whose indices still counted messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingLoss {
    /// The channel.
    pub channel: String,
    /// Messages lost by the published indices (see `Mailbox::renew_device_ring`).
    pub lost: u64,
}

/// The device channels' slots of one context, by channel index.
#[derive(Debug, Default)]
pub struct DeviceRings {
    rings: HashMap<u32, DeviceSlots>,
    /// Deleted channels' rings, freed by [`DeviceRings::free_released`] once no kernel runs.
    released: Vec<DeviceSlots>,
    losses: Vec<RingLoss>,
}

impl DeviceRings {
    /// Allocates the slots of every device channel that program slot `slot` binds and this context
    /// has none of yet (each renewed in the mailbox, its loss recorded). Call it while no kernel of
    /// the context runs (a blink's change): an allocation may wait for the work before it.
    pub fn prepare(&mut self, ctx: &Context, mailbox: &Mailbox, slot: u32) -> Result<(), CudaError> {
        for info in mailbox.bound_channels(slot).map_err(|e| invalid(slot, e))? {
            if info.placement == Placement::Device && !self.rings.contains_key(&info.index) {
                self.allocate(ctx, mailbox, &info)?;
            }
        }
        Ok(())
    }

    /// The kernel argument of program slot `slot` (its device channels prepared first, see `prepare`).
    pub fn mesh_ctx(&mut self, ctx: &Context, mailbox: &Mailbox, slot: u32, base: u64) -> Result<MeshCtx, CudaError> {
        self.prepare(ctx, mailbox, slot)?;
        mailbox
            .mesh_ctx_with(slot, base, |info| self.rings.get(&info.index).map(|r| r.ptr))
            .map_err(|e| invalid(slot, e))
    }

    fn allocate(&mut self, ctx: &Context, mailbox: &Mailbox, info: &ChannelInfo) -> Result<(), CudaError> {
        // Zeroed, a bulk ring's flags say "never written" as an LL ring's untagged words do.
        let bytes = ring_bytes(info)?;
        let slots = DeviceSlots::alloc(ctx, bytes).map_err(|e| CudaError::Invalid {
            what: format!("channel {:?}", info.name),
            reason: format!("allocating its {bytes}-byte ring in device memory: {e}"),
        })?;
        let lost = mailbox
            .renew_device_ring(info)
            .map_err(|e| CudaError::Invalid { what: format!("channel {:?}", info.name), reason: e.to_string() })?;
        if lost > 0 {
            self.losses.push(RingLoss { channel: info.name.clone(), lost });
        }
        self.rings.insert(info.index, slots);
        Ok(())
    }

    /// The context that held every ring is gone (reset after a fault): forget them without freeing
    /// (the reset freed them); the next launch of each allocates it again, empty.
    pub fn forget_all(&mut self) {
        for (_, slots) in self.rings.drain() {
            std::mem::forget(slots);
        }
        for slots in self.released.drain(..) {
            std::mem::forget(slots);
        }
    }

    /// Channel `index` was deleted: its ring leaves the table at once (a channel created later at
    /// that index gets a new one, of its own size) and waits in the released list until
    /// [`DeviceRings::free_released`]. A channel with no ring here (never bound) holds nothing.
    pub fn release(&mut self, index: u32) {
        if let Some(slots) = self.rings.remove(&index) {
            self.released.push(slots);
        }
    }

    /// Frees the released rings' device memory. Call it while no kernel of the context runs (a
    /// blink's change, or no program running): a free waits for the context's work.
    pub fn free_released(&mut self) {
        self.released.clear();
    }

    /// Rings renewed with messages in them since the last call, for the log.
    pub fn take_losses(&mut self) -> Vec<RingLoss> {
        std::mem::take(&mut self.losses)
    }

    /// Bytes of device memory held by live channels' rings.
    pub fn bytes(&self) -> usize {
        self.rings.values().map(|r| r.bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_shm::Protocol;
    use mesh_shm::layout::{bulk_slot_bytes, slot_bytes};

    fn device_channel(msg_size: u32, capacity: u32, protocol: Protocol) -> ChannelInfo {
        device_channel_parts(msg_size, capacity, protocol, 1)
    }

    fn device_channel_parts(msg_size: u32, capacity: u32, protocol: Protocol, parts: u32) -> ChannelInfo {
        ChannelInfo {
            index: 0,
            name: "c".into(),
            msg_size,
            capacity,
            ring_offset: 0,
            placement: Placement::Device,
            protocol,
            parts,
            slots_offset: 0,
            lost: 0,
            head: 0,
            tail: 0,
            producer_pid: None,
            consumer_pid: None,
        }
    }

    #[test]
    fn a_ring_is_sized_in_its_protocols_format() {
        let ll = device_channel(64, 8, Protocol::Ll);
        assert_eq!(ring_bytes(&ll).unwrap() as u64, slot_bytes(64, 8));
        // Bulk: 8 flags padded to a page, then 8 payloads of 1 MiB; not the LL ring's twice the payload
        // (which MPS mode's rings were once given: 16 MiB where 8 MiB and a page are needed).
        let bulk = device_channel(1 << 20, 8, Protocol::Bulk);
        assert_eq!(ring_bytes(&bulk).unwrap() as u64, bulk_slot_bytes(1 << 20, 8, 1));
        assert_eq!(ring_bytes(&bulk).unwrap(), 4096 + (8 << 20));
        // 32 parts: 8 × 32 flags (2 KiB), then 64 index lines (8 KiB), padded to 12 KiB.
        let parts = device_channel_parts(1 << 20, 8, Protocol::Bulk, 32);
        assert_eq!(ring_bytes(&parts).unwrap(), 12288 + (8 << 20));
        // A small bulk ring needs more than twice its payload: the page of flags.
        assert!(ring_bytes(&device_channel(16, 1, Protocol::Bulk)).unwrap() as u64 > slot_bytes(16, 1));
    }
}
