// mesh/bulk.cuh: bulk channels, for large messages (16 B to 16 MiB, multiples of 16), moved by a whole
// thread block.
//
// A channel created with `--protocol bulk` (the default above 64 KiB: `meshd channel create NAME
// --msg-size 1048576 --capacity 8`) carries messages in NCCL's Simple format: the payload as it is,
// then one flag per message. A binding's `protocol` says which format it is: MESH_PROTOCOL_BULK here,
// MESH_PROTOCOL_LL for mesh/channel.cuh's channels (mesh_chan_open refuses a bulk channel and
// mesh_bulk_open an LL one: both then give msg_size 0, on which every call fails). Both placements
// work: host (the mailbox; a host process with mesh-shm's BulkProducer / BulkConsumer or a GPU program
// at either end) and device (GPU memory, two GPU programs).
//
// Every thread of the block calls every mesh_bulk_* / mesh_block_* call together, with the same
// arguments (each thread holds its own copy of the mesh_bulk, and every copy changes the same way);
// they synchronise the block (__syncthreads) and may not be called from divergent code. Any block shape
// of at least as many threads as the channel has parts works (32 threads always do; a smaller block is
// refused at the open). Not every call passes a barrier (a peek that already knows the next message
// whole, a reserve that already knows the room, return at once), so a buffer the block's threads share
// is the caller's to order: __syncthreads between the threads' writes of a shared `msg` and the
// mesh_block_try_send that sends it, and between their last reads of a shared `out` and the next
// mesh_block_try_recv into it. An end of a channel belongs to one block, or, for a channel of several
// parts, to blocks that each open their own share of the parts with mesh_bulk_open_part; two blocks
// opening the same part of the same end break the ring. Buffers are 16-byte aligned, global or shared
// memory, ch.msg_size bytes (for a block serving a share of the parts, the share's bytes).
//
// A bulk echo (tests/programs/bulk_echo.cu), one block: `meshd load echo bulk_echo.ptx --block 1024
// --bind in --bind out`, both channels bulk, of one message size:
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         if (mesh_block_rank() == 0) mesh_begin(ctx);
//         mesh_bulk in = mesh_bulk_open(ctx, 0, false);
//         mesh_bulk out = mesh_bulk_open(ctx, 1, true);
//         while (!mesh_block_should_stop(ctx)) {
//             const void* msg = mesh_block_peek(&in);               // the message, in place, or NULL
//             if (msg == NULL) continue;
//             if (mesh_block_try_send(&out, msg)) mesh_block_release(&in);
//         }
//         mesh_bulk_close(&in);
//         mesh_bulk_close(&out);
//         if (mesh_block_rank() == 0) mesh_end(ctx);
//     }
//
// One channel served by B blocks (parts). A channel created with `--parts P` (a power of two up to
// MESH_BULK_MAX_PARTS; msg_size a multiple of 16 × P) splits every message into P equal parts, part p
// being bytes p × msg_size / P to (p + 1) × msg_size / P. Each part has its own flag per slot and its own
// head and tail, with one writer each, so B blocks move one message together without any barrier
// between them: the block serving part p sends or receives part p of every message, at its own pace,
// and the message is whole when all its parts are. B must be a power of two up to P; block i of B then
// serves parts i × P / B to (i + 1) × P / B - 1, a contiguous share of P / B parts (ch.msg_size bytes,
// at byte mesh_bulk_part_offset(&ch) of the message). mesh_bulk_open(ctx, b, producer) is the share of
// one block serving every part. Both ends choose their B independently, and a host end (BulkProducer,
// BulkConsumer) serves every part. Only block 0 calls mesh_begin / mesh_end (and mesh_heartbeat); every
// block checks the stop itself. A 16 MiB copy over 8 blocks on one binding, `meshd load copy x.ptx
// --grid 8 --block 512 --bind in --bind out`, both channels `--parts 8`:
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         if (blockIdx.x == 0 && mesh_block_rank() == 0) mesh_begin(ctx);
//         mesh_bulk in = mesh_bulk_open_part(ctx, 0, false, blockIdx.x, gridDim.x);
//         mesh_bulk out = mesh_bulk_open_part(ctx, 1, true, blockIdx.x, gridDim.x);
//         while (!mesh_block_should_stop(ctx)) {
//             const void* part = mesh_block_peek(&in);              // this block's part, in place
//             if (part != NULL && mesh_block_try_send(&out, part)) mesh_block_release(&in);
//         }
//         mesh_bulk_close(&in);
//         mesh_bulk_close(&out);
//         if (blockIdx.x == 0 && mesh_block_rank() == 0) mesh_end(ctx);
//     }
//
// Choosing B: give every block at least 64-128 KiB of each message (each message costs a block a
// barrier and a release fence at the producer, a barrier at the consumer); in place
// (mesh_block_reserve / mesh_block_publish, mesh_block_peek / mesh_block_release) moves every byte once,
// the copy path twice. With 16 blocks or more, move several messages a call (the _n calls below: one
// barrier and one fence for all of them, at the price of the first message waiting for the last one's
// writing). Figures: see BENCHMARKS.md. In place, four at a time:
//
//     const uint32_t n = mesh_block_reserve_n(&out, 4);          // up to 4 free slots (0: full)
//     for (uint32_t k = 0; k < n; k++) fill((uint32_t*)mesh_block_reserved(&out, k), out.mine + k);
//     mesh_block_publish_n(&out, n);                            // one barrier and one fence for the n
//
//     const uint32_t m = mesh_block_peek_n(&in, 4);              // up to 4 whole messages (0: none yet)
//     for (uint32_t k = 0; k < m; k++) use((const uint32_t*)mesh_block_peeked(&in, k), in.mine + k);
//     if (m != 0) mesh_block_release_n(&in, m);                 // one barrier to give the m back
//
// Format (mesh-shm's bulk.rs): the slots start with capacity × parts flags of MESH_BULK_FLAG_SIZE bytes
// (slot s, part p at s × parts + p); for more than one part, 2 × parts index lines of MESH_LINE bytes
// follow on the next line boundary (part p's head, then its tail); all padded to MESH_BULK_ALIGN, then
// capacity payloads of msg_size bytes. One part has no index lines: its head and tail are the ring
// header's (MESH_RING_HEAD, MESH_RING_TAIL). The binding's `protocol` word holds a channel's parts above
// MESH_BULK_PARTS_SHIFT when there are more than one. Message `seq` is in slot seq & (capacity - 1); a
// part's flag holds seq + 1 once that part is whole. The ring header's head and tail are, for more than
// one part, lower bounds over the parts that block 0 publishes in mesh_bulk_close (for `meshd info`).
#pragma once
#include "core.cuh"

// Messages a consumer's peek looks at in one round trip (a flag of each of its parts each), so that a
// consumer behind its producer learns of several whole messages at once and takes the next ones without
// loading a flag; at most 32 flags a block (one warp's lanes), so fewer for a block of many parts.
// Define it before including mesh.cuh to change it (at least 1).
#ifndef MESH_BULK_LOOKAHEAD
#define MESH_BULK_LOOKAHEAD 8u
#endif
static_assert(MESH_BULK_LOOKAHEAD >= 1u, "MESH_BULK_LOOKAHEAD: a peek must look at one message at least");

// Messages mesh_block_reserve_n, mesh_block_try_send_n, mesh_block_peek_n and mesh_block_try_recv_n
// take in one call at most.
#define MESH_BULK_SEND_MAX 8u

// One end of a bound bulk channel (this block's share of its parts), held in registers by every thread
// of the block using it. Programs read msg_size (0: not open) and mine (the next position); the rest is
// the calls'.
typedef struct {
    char* ring;                // the ring's header (indices and claims, in the mailbox)
    uint64_t* flags;           // capacity × parts flags (the mailbox, or GPU memory for a device channel)
    char* payload;             // this block's share of slot 0's payload (the slots follow, stride apart)
    char* lines;               // part `first`'s head line (one part: the header's head); its tail follows
    uint32_t msg_size;         // payload bytes this block moves per message, a multiple of 16 (0: not open)
    uint32_t mask;             // capacity - 1
    uint64_t mine;             // producer: the next message to write; consumer: the next to read
    uint64_t other;            // producer: the slowest of its parts' tails as last read; consumer: the end of the
                               // messages its last flag loads found whole (mesh_block_peek)
    uint32_t placement;        // MESH_PLACEMENT_HOST or MESH_PLACEMENT_DEVICE
    uint32_t parts;            // the channel's parts
    uint32_t first;            // this block's first part
    uint32_t count;            // parts this block serves (threads 0 .. count - 1 each keep one's words)
    uint32_t stride;           // the whole message's bytes: one slot's payload to the next
    uint32_t line_step;        // bytes from one part's head line to the next's
    bool producer;
} mesh_bulk;

// Opens this block's share of binding `b` (protocol bulk) as a producer (`producer` true) or consumer:
// block `block` of the `blocks` blocks that serve this end (a power of two up to the channel's parts),
// serving parts block × parts / blocks onwards, parts / blocks of them. Every thread of the block
// together. A producer resumes each of its parts after the last message written into it; where its parts
// disagree (the end was served by more blocks before) it continues at the furthest and completes the
// parts behind with what their slots hold (a message the last launch left half-written is delivered
// torn), waiting for room where a part's consumer is a full ring behind (a stop meanwhile gives msg_size
// 0; the next launch completes the rest). A consumer resumes at the furthest of its parts' tails and
// skips the others there. An unbound `b`, an LL channel, a refused share (B not a power of two, B > P,
// block >= blocks) or a block of fewer threads than parts gives msg_size 0, on which every call fails.
static __device__ mesh_bulk mesh_bulk_open_part(const mesh_ctx& c, uint32_t b, bool producer, uint32_t block,
                                                uint32_t blocks);

// Opens binding `b` (protocol bulk) as a producer (`producer` true) or consumer, one block serving every
// part: mesh_bulk_open_part(c, b, producer, 0, 1). Every thread of the block together.
static __device__ mesh_bulk mesh_bulk_open(const mesh_ctx& c, uint32_t b, bool producer);

// Where this block's share starts inside a message, in bytes: what a block that keeps whole messages in
// its own buffers adds to their address. Any thread.
static __device__ __forceinline__ uint32_t mesh_bulk_part_offset(const mesh_bulk* ch);

// Publishes this end's exact position (every part it serves; from the block serving part 0, the ring
// header's lower bound over every part). Every thread of the block together, on every bulk channel,
// before mesh_end.
static __device__ __forceinline__ void mesh_bulk_close(mesh_bulk* ch);

// Free slots a producer can fill now, the same on every thread (0 for a consumer). Every thread of the
// block together. It reads its parts' tails (one round trip) only when the ring looks full.
static __device__ __forceinline__ uint32_t mesh_bulk_room(mesh_bulk* ch);

// This block's share of the next slot, to write in place (msg_size bytes, 16-byte aligned), or NULL on
// every thread when the ring is full. Every thread of the block together. Write it with ordinary stores,
// then mesh_block_publish.
static __device__ __forceinline__ void* mesh_block_reserve(mesh_bulk* ch);

// Makes the share written into the slot mesh_block_reserve gave visible to the consumer (one barrier,
// then one release store of a flag per part). Every thread of the block together.
static __device__ __forceinline__ void mesh_block_publish(mesh_bulk* ch);

// Sends this block's share of one message from `msg` (msg_size bytes, 16-byte aligned: for a block
// serving a share of the parts, the share alone). Every thread of the block together. False on every
// thread when the ring is full (nothing sent).
static __device__ __forceinline__ bool mesh_block_try_send(mesh_bulk* ch, const void* msg);

// This block's share of the next message, in place (msg_size bytes, 16-byte aligned), or NULL on every
// thread when its parts are not all whole yet. Every thread of the block together. Read it with ordinary
// loads, then mesh_block_release; until then the producer cannot reuse its parts of the slot. One round
// trip of flag loads finds up to MESH_BULK_LOOKAHEAD whole messages, and the peeks after it return those
// without a load or a barrier.
static __device__ __forceinline__ const void* mesh_block_peek(mesh_bulk* ch);

// Gives the share mesh_block_peek returned back to the producer. Every thread of the block together
// (one barrier).
static __device__ __forceinline__ void mesh_block_release(mesh_bulk* ch);

// Receives this block's share of one message into `out` (msg_size bytes, 16-byte aligned). Every thread
// of the block together. False on every thread when it is not whole yet (`out` untouched).
static __device__ __forceinline__ bool mesh_block_try_recv(mesh_bulk* ch, void* out);

// Sends one message, waiting for room. Every thread of the block together. False on every thread if
// meshd asked the program to stop first (the message is then not sent), or the end is not an open
// producer.
static __device__ __forceinline__ bool mesh_block_send(mesh_ctx& c, mesh_bulk* ch, const void* msg);

// Receives one message into `out`, waiting for it. Every thread of the block together. False on every
// thread if meshd asked the program to stop first, or the end is not an open consumer.
static __device__ __forceinline__ bool mesh_block_recv(mesh_ctx& c, mesh_bulk* ch, void* out);

// Reserves up to `n` of the next slots (n at most MESH_BULK_SEND_MAX) to write in place at once. Every
// thread of the block together. Returns how many (the same on every thread; 0 when the ring is full);
// the tails are read when fewer than n slots look free. Write each with mesh_block_reserved, then
// mesh_block_publish_n.
static __device__ __forceinline__ uint32_t mesh_block_reserve_n(mesh_bulk* ch, uint32_t n);

// This block's share of the k-th slot mesh_block_reserve_n reserved (msg_size bytes, 16-byte aligned).
// Any thread; k below what mesh_block_reserve_n returned.
static __device__ __forceinline__ void* mesh_block_reserved(const mesh_bulk* ch, uint32_t k);

// Makes the first `n` slots mesh_block_reserve_n reserved (n at most what it returned) visible to the
// consumer, in order, with one barrier and one fence per part for all of them. Every thread of the block
// together.
static __device__ __forceinline__ void mesh_block_publish_n(mesh_bulk* ch, uint32_t n);

// Sends this block's share of up to `n` messages (n at most MESH_BULK_SEND_MAX; msgs[k] as `msg` of
// mesh_block_try_send), as many as the ring has room for, msgs[0] first. Every thread of the block
// together. Returns how many (the same on every thread; 0 when the ring is full).
static __device__ __forceinline__ uint32_t mesh_block_try_send_n(mesh_bulk* ch, const void* const* msgs, uint32_t n);

// How many of the next messages are whole, up to `n` (n at most MESH_BULK_SEND_MAX, and at most
// MESH_BULK_LOOKAHEAD found per round trip): the same on every thread; 0 when the next is not. Every
// thread of the block together. Read each in place with mesh_block_peeked, then mesh_block_release_n.
static __device__ __forceinline__ uint32_t mesh_block_peek_n(mesh_bulk* ch, uint32_t n);

// This block's share of the k-th message mesh_block_peek_n found whole (msg_size bytes, 16-byte
// aligned). Any thread; k below what mesh_block_peek_n returned.
static __device__ __forceinline__ const void* mesh_block_peeked(const mesh_bulk* ch, uint32_t k);

// Gives the first `n` messages mesh_block_peek_n found (n at most what it returned) back to the
// producer, with one barrier. Every thread of the block together.
static __device__ __forceinline__ void mesh_block_release_n(mesh_bulk* ch, uint32_t n);

// Receives this block's share of up to `n` whole messages (n at most MESH_BULK_SEND_MAX), message k into
// outs[k] (as `out` of mesh_block_try_recv). Every thread of the block together. Returns how many (the
// same on every thread; 0 when the next is not whole).
static __device__ __forceinline__ uint32_t mesh_block_try_recv_n(mesh_bulk* ch, void* const* outs, uint32_t n);

#include "detail/bulk.cuh"
