//! The mailbox's byte layout: every structure that lives in the shared file, with its writer and its offsets.
//!
//! One source of truth: `mesh.cuh` (the device side) is checked against these
//! definitions by `device_header::layout_block` and a test. All fields are
//! fixed-width; no pointer is ever stored (each mapping, host or device, has its
//! own base address, so only offsets from the file's start are meaningful).
//!
//! Writers: a word shared between the host and the GPU has exactly one writer,
//! because the H200 reports no host-native atomics. Host-only words (claims,
//! the table lock, the arena cursor) may be updated with CPU atomics.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// `"MESHSHM1"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"MESHSHM1");
/// Bumped on any change to a structure in this file.
/// Version 4 = bulk parts + fan-in channels and channel groups ([`PROTOCOL_FANIN`], [`PROTOCOL_GROUP`]).
pub const LAYOUT_VERSION: u32 = 4;
/// The header page; the tables start after it.
pub const HEADER_SIZE: u64 = 4096;
/// One cache line of the GPU's and the host's coherence unit we separate writers by.
pub const LINE: u64 = 128;
/// Channel bindings one program can have.
pub const MAX_BINDINGS: usize = 8;
/// Longest channel or program name, in bytes (no terminating NUL needed).
pub const NAME_LEN: usize = 48;
/// Largest message a channel of the LL protocol ([`PROTOCOL_LL`]) or the index protocol
/// ([`PROTOCOL_INDEX`]) may carry.
pub const MAX_MSG_SIZE: u32 = 64 * 1024;
/// Largest message a channel of the bulk protocol ([`PROTOCOL_BULK`]) may carry.
pub const MAX_BULK_MSG_SIZE: u32 = 16 << 20;
/// A bulk channel's message size is a multiple of this: the unit of the 16-byte vector copies.
pub const BULK_MSG_ALIGN: u32 = 16;
/// Most parts a bulk channel's messages may be split into ([`ChannelDesc::parts`]): one per block of
/// a warp's worth of blocks, the most one end is designed to be served by.
pub const MAX_BULK_PARTS: u32 = 32;
/// Largest channel capacity, in messages.
pub const MAX_CAPACITY: u32 = 1 << 24;
/// Value of a binding that names no channel.
pub const NO_CHANNEL: u32 = u32::MAX;

/// The header page, written once by the creator; host-only fields noted.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// Always [`MAGIC`].
    pub magic: u64,
    /// Always [`LAYOUT_VERSION`].
    pub version: u32,
    /// Always [`HEADER_SIZE`].
    pub header_size: u32,
    /// The file's length in bytes; must equal the length on disk.
    pub file_size: u64,
    /// Number of program slots.
    pub slot_count: u32,
    /// Always `size_of::<Slot>()`.
    pub slot_size: u32,
    /// Offset of the slot table (`slot_count * slot_size` bytes).
    pub slots_offset: u64,
    /// Number of channel descriptors (live or free).
    pub channel_count: u32,
    /// Always `size_of::<ChannelDesc>()`.
    pub channel_desc_size: u32,
    /// Offset of the channel descriptor table.
    pub channels_offset: u64,
    /// Offset of the ring arena, where each channel's ring is carved out.
    pub arena_offset: u64,
    /// Size of the ring arena; the arena ends at `file_size`.
    pub arena_size: u64,
    /// Bytes of the arena handed out so far (host only, under `table_lock`).
    pub arena_used: AtomicU64,
    /// Host-only spin lock serialising channel creation across processes.
    pub table_lock: AtomicU32,
    /// Pid of the process that created the file (informational).
    pub creator_pid: u32,
    /// Pid of the meshd that serves the mailbox now, 0 when none (host only; informational, for
    /// messages: the proof that an owner is alive is its lock on the file, never this pid).
    pub owner_pid: AtomicU32,
}

/// A program's control block: written by meshd only, read by the kernel.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct SlotControl {
    /// Non-zero: the program is asked to stop (mesh_should_stop).
    pub stop: u32,
    /// Bumped by meshd at every (re)launch.
    pub generation: u32,
    /// 1 while a program owns the slot.
    pub in_use: u32,
    /// Number of valid entries in `bindings`.
    pub binding_count: u32,
    /// Channel indices bound to the program, [`NO_CHANNEL`] where unused.
    pub bindings: [u32; MAX_BINDINGS],
    /// The program's name, NUL-padded.
    pub name: [u8; NAME_LEN],
}

/// A program's status block: written by the kernel only, read by the host.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct SlotStatus {
    /// Advanced by the kernel on every iteration of its loop.
    pub heartbeat: u64,
    /// One of the `STATE_*` values.
    pub state: u32,
    /// Set by mesh_exit.
    pub exit_code: i32,
    /// The control generation the kernel saw when it started.
    pub generation: u32,
}

/// A per-program area written by the kernel (block `i` may own word `i`), read by the host.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct SlotUser {
    /// Free-form words a program reports (the test programs use them for SM ids and timing).
    pub words: [u32; 32],
}

/// Kernel state values of [`SlotStatus::state`].
pub const STATE_IDLE: u32 = 0;
/// The kernel has started and is looping.
pub const STATE_RUNNING: u32 = 1;
/// The kernel left its loop because a stop was requested.
pub const STATE_STOPPED: u32 = 2;
/// The kernel called mesh_exit.
pub const STATE_EXITED: u32 = 3;

/// One program slot: three lines, one writer each.
#[repr(C)]
#[derive(Debug)]
pub struct Slot {
    /// meshd's line.
    pub control: SlotControl,
    /// The kernel's line.
    pub status: SlotStatus,
    /// The kernel's free-form line.
    pub user: SlotUser,
}

/// A channel descriptor: written by the creator under `table_lock`, then published by `state`.
#[repr(C)]
#[derive(Debug)]
pub struct ChannelDesc {
    /// 0: free; 1: live (stored last, with Release).
    pub state: AtomicU32,
    /// Bytes per message (a multiple of 8, at most [`MAX_MSG_SIZE`]).
    pub msg_size: u32,
    /// Messages the ring holds (a power of two, at most [`MAX_CAPACITY`]).
    pub capacity: u32,
    /// Where the ring's message slots live: [`PLACEMENT_HOST`] or [`PLACEMENT_DEVICE`].
    pub placement: u32,
    /// Offset of the channel's [`RingHeader`] from the file's start.
    pub ring_offset: u64,
    /// The channel's name, NUL-padded.
    pub name: [u8; NAME_LEN],
    /// Offset of the message slots from the file's start, page aligned (host placement); 0 for a
    /// device channel, whose slots are in GPU memory and whose ring in the file is its header alone.
    pub slots_offset: u64,
    /// Messages lost with a device ring's slots, counted over every renewal (host only: meshd adds
    /// to it when it makes a device ring anew after a start or a GPU fault; see `renew_device_ring`).
    pub lost: AtomicU64,
    /// The slots' format: [`PROTOCOL_LL`] (a tag in every word), [`PROTOCOL_BULK`] (payload, then
    /// one flag per message), [`PROTOCOL_INDEX`] (payload alone; host ends only), [`PROTOCOL_FANIN`]
    /// (an owner table, then LL slots with the sender) or [`PROTOCOL_GROUP`] (a table of client slots
    /// and their reply rings). A reader refuses any other value, naming the channel. Carved out of what
    /// was zeroed padding in layout version 3, so a descriptor written before the field existed reads
    /// as LL, which is what it is.
    pub protocol: u32,
    /// Parts every message of a bulk channel is split into (a power of two, 1 to [`MAX_BULK_PARTS`]),
    /// each with its own flag per slot and its own head and tail line (see `bulk`); 1 for every other
    /// protocol. Carved out of what was zeroed padding in layout version 3; a 0 reads as 1, which is
    /// the format such a descriptor's ring has (bit for bit today's bulk format). For a channel of
    /// [`PROTOCOL_GROUP`] this word is the group's entry count (its client slots, 1 to
    /// [`MAX_GROUP_ENTRIES`]), the second number its size needs, as parts are for bulk. For a
    /// channel of [`PROTOCOL_FANIN`] it is the shard count (a power of two, 1 to [`MAX_FANIN_SHARDS`]:
    /// that many whole fan-in rings, see [`fanin_shard_offset`]); a build before shards refuses a
    /// fan-in descriptor whose word is above 1, and so the whole file.
    pub parts: u32,
    /// Pads the descriptor to one line.
    pub pad: [u8; 32],
}

/// [`ChannelDesc::protocol`]: NCCL's LL packing, 4 payload bytes and a tag in every 8-byte word (see
/// `ring`); the ring costs twice its payload; for messages up to [`MAX_MSG_SIZE`].
pub const PROTOCOL_LL: u32 = 0;
/// [`ChannelDesc::protocol`]: NCCL's Simple layout, for large messages (see `bulk`): the payload as it
/// is, then, after a fence, one 8-byte flag per message; up to [`MAX_BULK_MSG_SIZE`].
pub const PROTOCOL_BULK: u32 = 1;

/// [`ChannelDesc::protocol`]: Lamport's (and rtrb's) layout, for channels whose two ends are host
/// processes (see `index_ring`): the payload alone in each slot, the producer's `head` (Release)
/// saying which slots are whole; the ring costs its payload. GPU programs cannot bind it (mesh.cuh's
/// opens refuse any protocol but their own, and meshd refuses the load). Up to [`MAX_MSG_SIZE`].
pub const PROTOCOL_INDEX: u32 = 2;

/// [`ChannelDesc::protocol`]: a fan-in ring (see `fanin` and `docs/explanation/services.md`):
/// any number of host producers, one consumer, every message carrying its sender. Its slots region
/// (host placement only) is the owner table, host only (`capacity` 8-byte ownership words), then, on
/// the next page, the LL slots of `2 + msg_size / 4` tagged words each ([`fanin_slots_offset`],
/// [`fanin_slot_bytes`]). The [`RingHeader`]'s `head` is the reservation cursor, its `tail` the
/// consumer's position; its consumer claim is the consumer's, its producer claim unused. Up to
/// [`MAX_MSG_SIZE`], multiples of 8. A channel of more than one shard ([`ChannelDesc::parts`]) has
/// that many such rings, shard 0 as above and the others after it in the region
/// ([`fanin_shard_offset`], [`fanin_region_bytes`]).
pub const PROTOCOL_FANIN: u32 = 3;

/// [`ChannelDesc::protocol`]: a channel group (see `group`): a `GroupHeader`, `entries`
/// `GroupEntry` lines (client slots) and one LL reply ring per entry, laid out as
/// [`group_ring_position`] says, in the channel's slots region (host placement only; the entry
/// count is the descriptor's `parts` word). Reply `msg_size` and `capacity` are the descriptor's.
/// The [`RingHeader`] in front holds only claims: its producer claim is the replying server's.
pub const PROTOCOL_GROUP: u32 = 4;
/// [`ChannelDesc::placement`]: the slots are in the mailbox (host memory), mapped into every context.
pub const PLACEMENT_HOST: u32 = 0;
/// [`ChannelDesc::placement`]: the slots are in GPU memory owned by meshd; only GPU programs use the
/// ring (its indices stay in the mailbox, so that meshd can say what a lost ring held).
pub const PLACEMENT_DEVICE: u32 = 1;

/// A ring's producer index: written by the producer only.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct ProducerLine {
    /// Messages ever sent, as last published: exact from a host producer, published in batches
    /// (and exactly on `mesh_chan_close`) by a GPU one. Consumers never read it on their path.
    pub head: AtomicU64,
}

/// A ring's consumer index: written by the consumer only.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct ConsumerLine {
    /// Messages ever received, as last published (the producer's credit): exact from a host
    /// consumer, in batches of half the ring, when it drains, and on `mesh_chan_close` from a GPU one.
    pub tail: AtomicU64,
}

/// Host-only claim words of a ring's two ends.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct ClaimLine {
    /// Who holds the producer end (see `claim`), 0 when free.
    pub producer: AtomicU64,
    /// Who holds the consumer end, 0 when free.
    pub consumer: AtomicU64,
}

/// The three lines in front of every ring's message slots.
#[repr(C)]
#[derive(Debug)]
pub struct RingHeader {
    /// The producer's index.
    pub producer: ProducerLine,
    /// The consumer's index.
    pub consumer: ConsumerLine,
    /// The claims.
    pub claims: ClaimLine,
}

/// One channel binding as the kernel receives it inside [`MeshCtx`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshBinding {
    /// Offset of the ring's [`RingHeader`] in the mailbox (0: unbound): the indices, always in host memory.
    pub ring_offset: u64,
    /// The device address of the ring's message slots in the launching context: inside the mailbox's
    /// mapping for a host channel, GPU memory for a device channel.
    pub slots: u64,
    /// Bytes per message.
    pub msg_size: u32,
    /// Ring capacity (a power of two).
    pub capacity: u32,
    /// [`PLACEMENT_HOST`] or [`PLACEMENT_DEVICE`].
    pub placement: u32,
    /// [`PROTOCOL_LL`], [`PROTOCOL_BULK`], [`PROTOCOL_FANIN`] (then `slots` is the address of its LL
    /// slots, after the host-only owner table; shard 0's, for a channel of shards, whose count is then
    /// above [`BINDING_PARTS_SHIFT`] as bulk parts are: shard k's are at `slots - fanin_slots_offset +
    /// fanin_shard_slots_offset(k)`, its header at `slots - fanin_slots_offset + fanin_shard_offset(k)`) or [`PROTOCOL_GROUP`] (then `slots` is the address of
    /// its `GroupHeader`, and `msg_size` and `capacity` its reply rings'; the entry count is read from
    /// the header) (was a zero reserved word before bulk channels: an
    /// older program reads every binding as LL, which every channel it could be given was). Never
    /// [`PROTOCOL_INDEX`]: such a channel is refused as a binding. A bulk channel of more than one
    /// part has its parts in bits [`BINDING_PARTS_SHIFT`].. ([`binding_protocol`]): a program built
    /// before parts existed then sees a protocol it does not know and refuses the binding, rather
    /// than moving whole messages through a ring laid out for parts.
    pub protocol: u32,
}

/// The argument of `mesh_main`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshCtx {
    /// The mailbox's device address in the launching context.
    pub base: u64,
    /// Offset of the program's [`Slot`].
    pub slot_offset: u64,
    /// The program's slot index.
    pub slot: u32,
    /// Valid entries of `bindings`.
    pub binding_count: u32,
    /// The program's channels, in the order it bound them.
    pub bindings: [MeshBinding; MAX_BINDINGS],
    /// The kernel's own: when (%globaltimer ns) `mesh_should_stop` next reads the stop word. 0 from meshd.
    pub stop_due: u64,
    /// The kernel's own: the stop word as last read (the read is consumed one period after it is issued). 0 from meshd.
    pub stop_seen: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

// Compile-time checks: each writer's words on a line of their own, and the sizes the device header states.
const _: () = assert!(size_of::<Header>() as u64 <= HEADER_SIZE);
const _: () = assert!(size_of::<SlotControl>() as u64 == LINE);
const _: () = assert!(size_of::<SlotStatus>() as u64 == LINE);
const _: () = assert!(size_of::<SlotUser>() as u64 == LINE);
const _: () = assert!(size_of::<Slot>() as u64 == 3 * LINE);
const _: () = assert!(offset_of!(Slot, status) as u64 == LINE);
const _: () = assert!(size_of::<ChannelDesc>() as u64 == LINE);
const _: () = assert!(size_of::<RingHeader>() as u64 == 3 * LINE);
const _: () = assert!(offset_of!(RingHeader, consumer) as u64 == LINE);
const _: () = assert!(size_of::<MeshBinding>() == 32);
const _: () = assert!(offset_of!(ChannelDesc, protocol) == 88);
const _: () = assert!(offset_of!(ChannelDesc, parts) == 92);
const _: () = assert!(size_of::<MeshCtx>() == 24 + 32 * MAX_BINDINGS + 16);

/// Ring bytes per payload byte: each 8-byte word of a slot carries 4 payload bytes and a tag (see `ring`).
pub const RING_WIRE_FACTOR: u64 = 2;

/// Slots start on a page of their own, so that a slot of a power-of-two size never straddles two pages.
pub const SLOTS_ALIGN: u64 = 4096;

/// Bytes of message slots of an LL ring of `capacity` messages of `msg_size` payload bytes.
pub const fn slot_bytes(msg_size: u32, capacity: u32) -> u64 {
    RING_WIRE_FACTOR * msg_size as u64 * capacity as u64
}

/// Bytes of one bulk flag (the sequence number plus one of the message its slot holds, 0: never written).
pub const BULK_FLAG_SIZE: u64 = 8;

/// [`MeshBinding::protocol`]: where a bulk binding keeps its channel's parts when there are more than one.
pub const BINDING_PARTS_SHIFT: u32 = 16;

/// The [`MeshBinding::protocol`] word of a channel of `protocol` split into `parts` parts (a bulk
/// channel's parts, a fan-in channel's shards): the protocol alone for one (what every binding held
/// before parts and shards existed), the count above it otherwise, so that a program built before
/// them sees a protocol it does not know and refuses the binding. A group's `parts` word is its
/// entry count and never goes here.
pub const fn binding_protocol(protocol: u32, parts: u32) -> u32 {
    if (protocol == PROTOCOL_BULK || protocol == PROTOCOL_FANIN) && parts > 1 {
        protocol | (parts << BINDING_PARTS_SHIFT)
    } else {
        protocol
    }
}

/// `parts` as a ring counts them: a 0 (a descriptor that predates the field) is one part.
const fn parts_of(parts: u32) -> u64 {
    if parts == 0 { 1 } else { parts as u64 }
}

/// Where a bulk ring of more than one part keeps its index lines, from the start of its slots: the
/// first line boundary after its `capacity × parts` flags. Part `p`'s head is line `2p`, its tail line
/// `2p + 1` (one writer each). A ring of one part has none: its head and tail are the [`RingHeader`]'s.
pub const fn bulk_lines_offset(capacity: u32, parts: u32) -> u64 {
    (BULK_FLAG_SIZE * capacity as u64 * parts_of(parts)).div_ceil(LINE) * LINE
}

/// Where a bulk ring's payloads start, from the start of its slots: after `capacity × parts` flags
/// (and, for more than one part, `2 × parts` index lines), on a page of their own (so that a payload
/// of a multiple of 4 KiB is page aligned). One part: exactly the format before parts existed.
pub const fn bulk_payload_offset(capacity: u32, parts: u32) -> u64 {
    let end = if parts_of(parts) == 1 {
        BULK_FLAG_SIZE * capacity as u64
    } else {
        bulk_lines_offset(capacity, parts) + 2 * parts_of(parts) * LINE
    };
    end.div_ceil(SLOTS_ALIGN) * SLOTS_ALIGN
}

/// Bytes of a bulk ring's slots: its flags (and index lines), then `capacity` payloads of `msg_size`
/// bytes each.
pub const fn bulk_slot_bytes(msg_size: u32, capacity: u32, parts: u32) -> u64 {
    bulk_payload_offset(capacity, parts) + msg_size as u64 * capacity as u64
}

/// Bytes of an index ring's slots: the payloads alone.
pub const fn index_slot_bytes(msg_size: u32, capacity: u32) -> u64 {
    msg_size as u64 * capacity as u64
}

/// Words in front of every fan-in slot's LL body: the sender (word 0, the commit) and the kind (word 1).
pub const FANIN_HEADER_WORDS: u64 = 2;

/// Bytes of a fan-in ring's owner table: one 8-byte ownership word per slot (host only).
pub const fn fanin_owner_bytes(capacity: u64) -> u64 {
    8 * capacity
}

/// Bytes of a fan-in ring's LL slots: `capacity` slots of [`FANIN_HEADER_WORDS`] 8-byte words, then
/// the body at [`RING_WIRE_FACTOR`] bytes per payload byte.
pub const fn fanin_ll_bytes(msg_size: u32, capacity: u64) -> u64 {
    (8 * FANIN_HEADER_WORDS + RING_WIRE_FACTOR * msg_size as u64) * capacity
}

/// Where a fan-in ring's LL slots start, from the start of its slots region: after its owner table
/// (`capacity` 8-byte words), on a page of their own.
pub const fn fanin_slots_offset(capacity: u32) -> u64 {
    fanin_owner_bytes(capacity as u64).div_ceil(SLOTS_ALIGN) * SLOTS_ALIGN
}

/// Bytes of a fan-in ring's slots region: its owner table (page-rounded), then `capacity` slots of
/// `16 + 2 × msg_size` bytes (the sender and kind words, then the LL body).
pub const fn fanin_slot_bytes(msg_size: u32, capacity: u32) -> u64 {
    fanin_slots_offset(capacity) + fanin_ll_bytes(msg_size, capacity as u64)
}

/// Most shards a fan-in channel may have ([`ChannelDesc::parts`] of a channel of [`PROTOCOL_FANIN`]).
/// One warp's end on the GPU serves at most 32 of them (a lane each: the most its one-round-trip peek
/// covers), so a channel of 64 is served by two warps or more, each its part of the shards (mesh.cuh,
/// `mesh_fanin_open`): a warp for every client or two of a 64- to 128-client service.
pub const MAX_FANIN_SHARDS: u32 = 64;

// A fan-in channel of P shards (P a power of two, 1 to `MAX_FANIN_SHARDS`, in the descriptor's
// `parts` word) is P whole fan-in rings sharing nothing, each of `capacity` slots of `msg_size`:
//
// * shard 0: the channel's own `RingHeader` (at `ring_offset`), its owner table at the start of the
//   slots region, its slots `fanin_slots_offset(capacity)` after it: exactly a channel of one shard,
//   which is the format of every fan-in channel before shards existed (layout 4, unchanged);
// * shard k >= 1, at `base_k = span + (k - 1) * (SLOTS_ALIGN + span)` from the region's start, with
//   `span = fanin_shard_span(msg_size, capacity)`: its own `RingHeader` (same struct, same offsets:
//   the cursor is `producer.head`, the consumer's position `consumer.tail`) at `base_k`, on a page of
//   its own; its owner table at `base_k + SLOTS_ALIGN`; its slots `fanin_slots_offset(capacity)`
//   after that.
//
// Zeroed memory is every shard empty at position 0. A client (sender id `slot | epoch << 16`) sends
// into shard `slot % P` alone (`fanin_shard_of`), so its requests stay in order in one ring.

/// The bytes one fan-in shard's owner table and slots take in the region, page-rounded: the step
/// between two shards, less the page of the next one's [`RingHeader`].
pub const fn fanin_shard_span(msg_size: u32, capacity: u32) -> u64 {
    fanin_slot_bytes(msg_size, capacity).div_ceil(SLOTS_ALIGN) * SLOTS_ALIGN
}

/// Where shard `k` (1 to P - 1) of a fan-in channel has its [`RingHeader`], from the start of the
/// channel's slots region: `span + (k - 1) × (SLOTS_ALIGN + span)`. Shard 0 has none in the region
/// (its header is the channel's own, at `ring_offset`): for `k = 0` this returns 0, which is the
/// start of shard 0's owner table, not a header.
pub const fn fanin_shard_offset(k: u32, msg_size: u32, capacity: u32) -> u64 {
    if k == 0 {
        return 0;
    }
    let span = fanin_shard_span(msg_size, capacity);
    span + (k as u64 - 1) * (SLOTS_ALIGN + span)
}

/// Where shard `k` of a fan-in channel has its owner table, from the start of the slots region: 0
/// for shard 0, the page after its header ([`fanin_shard_offset`]) for the others.
pub const fn fanin_shard_owners_offset(k: u32, msg_size: u32, capacity: u32) -> u64 {
    if k == 0 { 0 } else { fanin_shard_offset(k, msg_size, capacity) + SLOTS_ALIGN }
}

/// Where shard `k` of a fan-in channel has its LL slots, from the start of the slots region: its
/// owner table's start plus [`fanin_slots_offset`]. Shard 0's is what a fan-in binding's `slots` names.
pub const fn fanin_shard_slots_offset(k: u32, msg_size: u32, capacity: u32) -> u64 {
    fanin_shard_owners_offset(k, msg_size, capacity) + fanin_slots_offset(capacity)
}

/// Bytes of the slots region of a fan-in channel of `shards` shards:
/// `span + (P - 1) × (SLOTS_ALIGN + span)`; for one shard exactly [`fanin_slot_bytes`] (not
/// page-rounded), so that a channel of one shard takes the arena bytes it took before shards existed
/// and a layout-4 mailbox validates as it did. A 0 (a descriptor that predates the field) is one
/// shard.
pub const fn fanin_region_bytes(msg_size: u32, capacity: u32, shards: u32) -> u64 {
    if shards <= 1 {
        fanin_slot_bytes(msg_size, capacity)
    } else {
        let span = fanin_shard_span(msg_size, capacity);
        span + (shards as u64 - 1) * (SLOTS_ALIGN + span)
    }
}

/// The shard a sender id sends into, of a fan-in channel of `shards` shards: its client slot (the
/// id's low 16 bits) modulo the shard count, always the same one, so that its messages stay in order.
pub const fn fanin_shard_of(sender: u32, shards: u32) -> u32 {
    let shards = if shards == 0 { 1 } else { shards };
    (sender & 0xffff) % shards
}

/// The most entries (client slots) a channel group can have: a client id keeps its slot in 16 bits.
pub const MAX_GROUP_ENTRIES: u32 = 1 << 16;
/// Bytes of a channel group's header (`GroupHeader`, meshd's line).
pub const GROUP_HEADER_BYTES: u64 = LINE;
/// Bytes of one entry of a channel group's table (`GroupEntry`: meshd's line, then the program's).
pub const GROUP_ENTRY_BYTES: u64 = 2 * LINE;

/// Bytes from one reply ring of a channel group to the next: a [`RingHeader`] and its LL slots,
/// rounded up to a line.
pub const fn group_ring_stride(msg_size: u32, capacity: u32) -> u64 {
    size_of::<RingHeader>() as u64 + slot_bytes(msg_size, capacity).div_ceil(LINE) * LINE
}

/// Where entry `slot`'s reply ring starts, from the group's header: after the header and the table
/// of `entries` entries, `slot` strides in.
pub const fn group_ring_position(entries: u32, msg_size: u32, capacity: u32, slot: u32) -> u64 {
    GROUP_HEADER_BYTES + entries as u64 * GROUP_ENTRY_BYTES + slot as u64 * group_ring_stride(msg_size, capacity)
}

/// Bytes of a channel group's region: its header line, `entries` entries of two lines, and
/// `entries` reply rings of `capacity` replies of `msg_size` bytes.
pub const fn group_bytes(entries: u32, msg_size: u32, capacity: u32) -> u64 {
    group_ring_position(entries, msg_size, capacity, entries)
}

/// Bytes of a ring's slots in the format `protocol` names; `parts` is a bulk channel's parts, a
/// fan-in channel's shards or a group's entries (the descriptor's `parts` word) and counts for those
/// three alone. `None` for a
/// protocol this build does not know: its size is unknown, and a reader must refuse the channel
/// rather than guess (reading it as LL would get its bounds wrong).
pub const fn slot_bytes_for(msg_size: u32, capacity: u32, protocol: u32, parts: u32) -> Option<u64> {
    match protocol {
        PROTOCOL_LL => Some(slot_bytes(msg_size, capacity)),
        PROTOCOL_BULK => Some(bulk_slot_bytes(msg_size, capacity, parts)),
        PROTOCOL_INDEX => Some(index_slot_bytes(msg_size, capacity)),
        PROTOCOL_FANIN => Some(fanin_region_bytes(msg_size, capacity, parts)),
        PROTOCOL_GROUP => Some(group_bytes(parts, msg_size, capacity)),
        _ => None,
    }
}

/// Where a ring whose header is at `ring_offset` keeps its slots, for a host channel: the first page
/// boundary after the header.
pub const fn host_slots_offset(ring_offset: u64) -> u64 {
    (ring_offset + size_of::<RingHeader>() as u64).div_ceil(SLOTS_ALIGN) * SLOTS_ALIGN
}

/// Bytes a ring starting at `ring_offset` takes in the arena, up to the next line: its header, and
/// for a host channel the gap to the page boundary and the slots. `None` for a protocol this build
/// does not know (see [`slot_bytes_for`]).
pub const fn ring_bytes_at(
    ring_offset: u64,
    msg_size: u32,
    capacity: u32,
    placement: u32,
    protocol: u32,
    parts: u32,
) -> Option<u64> {
    let Some(slots) = slot_bytes_for(msg_size, capacity, protocol, parts) else { return None };
    let end = if placement == PLACEMENT_DEVICE {
        ring_offset + size_of::<RingHeader>() as u64
    } else {
        host_slots_offset(ring_offset) + slots
    };
    Some(end.div_ceil(LINE) * LINE - ring_offset)
}

/// Encodes a name into a fixed NUL-padded field; `None` when it is empty, too long or holds a NUL.
pub fn encode_name(name: &str) -> Option<[u8; NAME_LEN]> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > NAME_LEN || bytes.contains(&0) {
        return None;
    }
    let mut out = [0u8; NAME_LEN];
    out[..bytes.len()].copy_from_slice(bytes);
    Some(out)
}

/// Decodes a NUL-padded name field; invalid UTF-8 is replaced rather than refused (it is only displayed).
pub fn decode_name(field: &[u8; NAME_LEN]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
    String::from_utf8_lossy(&field[..end]).into_owned()
}
