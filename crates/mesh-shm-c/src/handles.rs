//! The C API's types: the opaque handles (a mailbox, a producer end, a consumer end) and the `#[repr(C)]` structs a channel and a kernel's context are described by.

use std::time::Duration;

use mesh_shm::{BulkConsumer, BulkProducer, ChannelInfo, Consumer, Mailbox, Producer, Protocol, ShmError};

/// Channel bindings one `mesh_ctx` holds (`MESH_MAX_BINDINGS` of mesh.cuh).
pub const MESH_SHM_MAX_BINDINGS: usize = 8;

/// A mapped mailbox (opaque).
#[derive(Debug)]
pub struct MeshMailbox {
    pub(crate) mailbox: Mailbox,
}

/// A claimed producer end of a channel (opaque): of either protocol, the same calls.
#[derive(Debug)]
pub struct MeshProducer {
    pub(crate) inner: AnyProducer,
}

/// A claimed consumer end of a channel (opaque): of either protocol, the same calls.
#[derive(Debug)]
pub struct MeshConsumer {
    pub(crate) inner: AnyConsumer,
}

/// The end a channel's protocol calls for: LL or index (`Producer`, which handles both) or bulk (`BulkProducer`).
#[derive(Debug)]
pub(crate) enum AnyProducer {
    Ll(Producer),
    Bulk(BulkProducer),
}

impl AnyProducer {
    pub(crate) fn claim(mailbox: &Mailbox, name: &str) -> Result<Self, ShmError> {
        Ok(match mailbox.channel(name)?.protocol {
            Protocol::Bulk => Self::Bulk(BulkProducer::claim(mailbox, name)?),
            // A fan-in channel or a group is refused there, naming its ends (the C API has none yet).
            Protocol::Ll | Protocol::Index | Protocol::FanIn | Protocol::Group => {
                Self::Ll(Producer::claim(mailbox, name)?)
            }
        })
    }

    pub(crate) fn info(&self) -> &ChannelInfo {
        match self {
            Self::Ll(p) => p.info(),
            Self::Bulk(p) => p.info(),
        }
    }

    pub(crate) fn try_send(&mut self, msg: &[u8]) -> Result<bool, ShmError> {
        match self {
            Self::Ll(p) => p.try_send(msg),
            Self::Bulk(p) => p.try_send(msg),
        }
    }

    pub(crate) fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<(), ShmError> {
        match self {
            Self::Ll(p) => p.send(msg, timeout),
            Self::Bulk(p) => p.send(msg, timeout),
        }
    }
}

/// The consumer end a channel's protocol calls for.
#[derive(Debug)]
pub(crate) enum AnyConsumer {
    Ll(Consumer),
    Bulk(BulkConsumer),
}

impl AnyConsumer {
    pub(crate) fn claim(mailbox: &Mailbox, name: &str) -> Result<Self, ShmError> {
        Ok(match mailbox.channel(name)?.protocol {
            Protocol::Bulk => Self::Bulk(BulkConsumer::claim(mailbox, name)?),
            // A fan-in channel or a group is refused there, naming its ends (the C API has none yet).
            Protocol::Ll | Protocol::Index | Protocol::FanIn | Protocol::Group => {
                Self::Ll(Consumer::claim(mailbox, name)?)
            }
        })
    }

    pub(crate) fn info(&self) -> &ChannelInfo {
        match self {
            Self::Ll(c) => c.info(),
            Self::Bulk(c) => c.info(),
        }
    }

    pub(crate) fn try_recv(&mut self, out: &mut [u8]) -> Result<bool, ShmError> {
        match self {
            Self::Ll(c) => c.try_recv(out),
            Self::Bulk(c) => c.try_recv(out),
        }
    }

    pub(crate) fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<(), ShmError> {
        match self {
            Self::Ll(c) => c.recv(out, timeout),
            Self::Bulk(c) => c.recv(out, timeout),
        }
    }
}

/// A channel as the mailbox describes it now.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshChannelInfo {
    /// Its index in the channel table (what a program slot binds).
    pub index: u32,
    /// Payload bytes per message (a multiple of 8).
    pub msg_size: u32,
    /// Messages the ring holds (a power of two).
    pub capacity: u32,
    /// Where its slots live: 0 host (the mailbox), 1 device (GPU memory: no host end can be claimed).
    pub placement: u32,
    /// Offset of the ring from the mailbox's start: `mesh_binding.ring_offset` in mesh.cuh.
    pub ring_offset: u64,
    /// Messages ever sent, as last published.
    pub head: u64,
    /// Messages ever received, as last published.
    pub tail: u64,
}

impl From<&ChannelInfo> for MeshChannelInfo {
    fn from(c: &ChannelInfo) -> Self {
        Self {
            index: c.index,
            msg_size: c.msg_size,
            capacity: c.capacity,
            placement: c.placement.code(),
            ring_offset: c.ring_offset,
            head: c.head,
            tail: c.tail,
        }
    }
}

/// One channel binding of a kernel's context: the same bytes as mesh.cuh's `mesh_binding`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshShmBinding {
    /// Offset of the ring's header from the mailbox's start (0: unbound).
    pub ring_offset: u64,
    /// The device address of the ring's message slots in the kernel's context: `device_base` plus
    /// the channel's `slots_offset` (a native worker binds host channels only).
    pub slots: u64,
    /// Payload bytes per message.
    pub msg_size: u32,
    /// Ring capacity.
    pub capacity: u32,
    /// 0: the slots are in the mailbox (host); 1: in GPU memory (never for a native worker).
    pub placement: u32,
    /// The slots' format: 0 LL (mesh.cuh's mesh_chan_* and warp calls), 1 bulk (mesh_bulk_* and
    /// mesh_block_* calls). A zero reserved word before bulk channels existed.
    pub protocol: u32,
}

/// A kernel's context: the same bytes as mesh.cuh's `mesh_ctx` (copy it into one with `memcpy`).
/// A native worker's kernel has no program slot: `slot` is `UINT32_MAX` and `slot_offset` 0, so it
/// must not call the slot functions of mesh.cuh (`mesh_begin`, `mesh_should_stop`, `mesh_heartbeat`,
/// …); the channel functions are what it uses.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshShmCtx {
    /// The mailbox's device address in the kernel's context (from `cudaHostGetDevicePointer`).
    pub base: u64,
    /// Offset of a program slot; 0 for a native worker.
    pub slot_offset: u64,
    /// A program slot's index; `UINT32_MAX` for a native worker.
    pub slot: u32,
    /// Valid entries of `bindings`.
    pub binding_count: u32,
    /// The channels, binding 0, 1, …
    pub bindings: [MeshShmBinding; MESH_SHM_MAX_BINDINGS],
    /// The kernel's own (mesh_should_stop's state); 0.
    pub stop_due: u64,
    /// The kernel's own; 0.
    pub stop_seen: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

// The C structs are mesh-shm's own layout, byte for byte (mesh.cuh checks that one against the device).
const _: () = assert!(MESH_SHM_MAX_BINDINGS == mesh_shm::layout::MAX_BINDINGS);
const _: () = assert!(size_of::<MeshShmBinding>() == size_of::<mesh_shm::MeshBinding>());
const _: () = assert!(size_of::<MeshShmCtx>() == size_of::<mesh_shm::MeshCtx>());
const _: () =
    assert!(core::mem::offset_of!(MeshShmCtx, bindings) == core::mem::offset_of!(mesh_shm::MeshCtx, bindings));
const _: () = assert!(
    core::mem::offset_of!(MeshShmCtx, binding_count) == core::mem::offset_of!(mesh_shm::MeshCtx, binding_count)
);
const _: () =
    assert!(core::mem::offset_of!(MeshShmBinding, capacity) == core::mem::offset_of!(mesh_shm::MeshBinding, capacity));
const _: () =
    assert!(core::mem::offset_of!(MeshShmBinding, slots) == core::mem::offset_of!(mesh_shm::MeshBinding, slots));
const _: () =
    assert!(core::mem::offset_of!(MeshShmCtx, stop_due) == core::mem::offset_of!(mesh_shm::MeshCtx, stop_due));
