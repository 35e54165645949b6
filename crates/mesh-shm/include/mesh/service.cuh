// mesh/service.cuh: a service, one program answering any number of host clients that come and go while
// it runs (docs/explanation/services.md).
//
// A service is two bindings whatever the number of clients: a fan-in channel (protocol fanin: every
// client sends into one ring, every message carries its sender's id) and a channel group (protocol
// group: one reply ring per client slot, handed out by meshd). `meshd service create NAME` makes both;
// a program binds the fan-in first and the group second. Host side: mesh-shm's fanin.rs, group.rs and
// service.rs define the bytes; the calls below follow their rules word for word.
//
// The contract, in one place:
//   * Lanes: the 32 lanes of one warp call every call of this part, and mesh_should_stop, together and
//     converged (no lane-dependent branch around them), with the same state (each lane holds a copy of
//     the mesh_fanin / mesh_group, and every copy changes the same way); mesh_begin, mesh_heartbeat,
//     mesh_end and mesh_exit are lane 0's alone. Several warps serve one service each with its own part
//     of the shards and of the clients ("Many warps" below).
//   * One consumer per shard: a fan-in shard is opened by exactly one warp. mesh_fanin_open(ctx, b, W)
//     is called by the first W warps of every block (W = 1 by default: the block's first warp), and
//     numbers this warp's part over the whole grid (warp w of block b is part b x W + w of
//     mesh_fanin_parts(ctx, b, G x W)), so a program written for one block splits the shards among
//     the blocks of `meshd load --grid G` instead of serving each shard once a block; a warp left
//     without a part gets a spare end (`parts` 0) and has nothing to serve. mesh_group_open(ctx, b, in)
//     opens the reply rings of exactly the clients of that fan-in end's shards.
//   * Client ids: a request's sender id is `slot | epoch << 16` (the epoch's low 16 bits). Keep
//     per-client state in an array indexed by `id & 0xffffu` (below `out.entries`, the group's client
//     slots; at most MESH_GROUP_MAX_ENTRIES with the built-in state); reset it when mesh_group_departed
//     returns the slot. meshd gives a slot to a new client (the next epoch) only after that
//     acknowledgement, but requests the departed client sent before it left may still be taken after
//     it, even once the slot has its new client: mesh_reply says GONE to them (mesh_reply_many sets
//     their bit in `dropped`). So change per-client state only for requests answered SENT (not
//     dropped), or keep the epoch (`id >> 16`) with the state and ignore other epochs.
//
// The simplest loop, one request at a time, on one warp of each block (tests/programs/service_x_simple.cu
// is this loop with counters; service_x_serial.cu the same loop on several warps a block). Loaded with
// `--grid G`, the G warps share the shards: with `--shards P` a service of many clients is served by up
// to P warps, and with one shard block 0's warp serves everything while the others' ends are spare.
// Replies here are the request with payload word 1 incremented, so the reply size must be the request
// size; with a different `--reply-size`, reply from a buffer of out.msg_size bytes, filled when the
// request is taken and kept unchanged while `held`, since a held reply is sent again as it was:
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//     MESH_BINDINGS(MESH_FANIN, MESH_GROUP);                // a load bound otherwise is refused
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         __shared__ uint32_t req[1024];                    // one message, up to 4 KiB
//         if (threadIdx.x >= 32) return;                    // one warp a block serves
//         const bool lead = blockIdx.x == 0 && threadIdx.x == 0;  // begins and beats for the grid
//         uint64_t beat = 0;
//         if (lead) beat = mesh_begin(ctx);
//         mesh_fanin in = mesh_fanin_open(ctx, 0);          // binding 0: this warp's part of the requests
//         mesh_group out = mesh_group_open(ctx, 1, in);     // binding 1: the reply rings of its clients
//         const bool ok = in.parts == 0 ||                  // spare: another warp serves every shard
//                         (in.ch.msg_size != 0 && out.msg_size == in.ch.msg_size && in.ch.msg_size <= sizeof(req));
//         bool held = false;                                // a request taken, its reply waiting for room
//         uint32_t client = 0;
//         for (uint32_t i = 0; ok && in.parts != 0 && !mesh_should_stop(ctx); i++) {
//             if (lead && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
//             uint32_t gone;
//             while (mesh_group_departed(&out, &gone)) {}   // acknowledged as returned; drop per-client state here
//             if (!held) {
//                 const int k = mesh_fanin_take_deferred(&in, req, &client);
//                 if (k == MESH_TAKE_NONE) continue;        // nothing whole yet
//                 if (k == MESH_TAKE_SKIP) {                // a send cut off (death, revocation): nothing to answer
//                     mesh_fanin_commit(&in);
//                     continue;
//                 }
//                 if (threadIdx.x == 0) req[1] += 1;        // f(client, request)
//                 __syncwarp();
//             }
//             const int r = mesh_reply(&out, client, req);  // SENT; GONE: its client left, dropped;
//             held = r == MESH_REPLY_FULL;                  // FULL: a slow client, tried again next time
//             if (!held) mesh_fanin_commit(&in);            // answered (or dropped): the request is done
//         }
//         mesh_fanin_close(&in);                            // exact positions for the next launch
//         mesh_group_close(&out);
//         __syncwarp();
//         if (threadIdx.x == 0) mesh_grid_end(ctx, ok ? 0 : 1);  // exit 1: not a fan-in and a group of one
//     }                                                     // size (or more clients than the state holds)
//
// Why deferred: a request is committed (its fan-in slot given back, the published position moved past
// it) only once it is answered or dropped. A stop that finds a reply held for room (its client's ring
// full) then publishes the position of that request, and the next launch takes it again and answers
// it: an orderly stop (an upgrade, a blink) loses no reply and repeats none. With mesh_fanin_take (take
// and commit in one) such a request would be consumed with its reply never written. While a reply is
// held the loop serves nobody else (one slow client stalls the rest until it reads or leaves: its
// departure makes mesh_reply say GONE once acknowledged); a client that keeps at most its reply ring's
// capacity of requests in flight is never FULL.
//
// Many requests per round trip. A service of many clients takes every request that has arrived at once
// instead (mesh_fanin_peek), answers them in parallel, one lane per request (mesh_reply_many), and gives
// their slots back together (mesh_fanin_consume); and it serves with several warps, each its own part
// of the fan-in's shards and of the clients, so that one warp's peek (a PCIe round trip) overlaps the
// others' replies. Create the service with `--shards 8` and load the program with `--block 256`
// (tests/programs/service.cu is this loop with counters, over a grid):
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         constexpr uint32_t most = 8;                      // warps serving at most
//         __shared__ uint32_t reqs[most][MESH_FANIN_BATCH_MAX * 16];  // a warp's 32 requests of 64 bytes
//         __shared__ uint32_t from[most][MESH_FANIN_BATCH_MAX];       // their senders
//         const uint32_t w = threadIdx.x / 32u, lane = threadIdx.x % 32u;
//         const uint32_t warps = blockDim.x / 32u < most ? blockDim.x / 32u : most;  // serving warps a block
//         const bool lead = blockIdx.x == 0 && threadIdx.x == 0;
//         uint64_t beat = 0;
//         if (lead) beat = mesh_begin(ctx);
//         bool ok = true;
//         if (w < warps) {                                  // the first `warps` warps of every block
//             mesh_fanin in = mesh_fanin_open(ctx, 0, warps);  // its part over the grid: b x warps + w
//             mesh_group out = mesh_group_open(ctx, 1, in);    // the reply rings of its clients
//             ok = in.parts == 0 || (in.ch.msg_size == 64 && out.msg_size == 64);  // spare, or 64 B each
//             for (uint32_t i = 0; ok && in.parts != 0 && !mesh_should_stop(ctx); i++) {
//                 if (lead && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);
//                 uint32_t gone, skipped, dropped;
//                 while (mesh_group_departed(&out, &gone)) {}   // this warp's clients alone
//                 const uint32_t n = mesh_fanin_peek(&in, reqs[w], from[w], &skipped, MESH_FANIN_BATCH_MAX);
//                 if (n == 0) continue;                         // nothing whole at the position yet
//                 if (lane < n && !((skipped >> lane) & 1u)) reqs[w][lane * 16 + 1] += 1;  // f(from[j], request j): lane j
//                 __syncwarp();
//                 const uint32_t done = mesh_reply_many(&out, from[w], reqs[w], n, skipped, &dropped);
//                 mesh_fanin_consume(&in, done);                // requests [0, done) answered or dropped
//             }
//             mesh_fanin_close(&in);                            // exact positions for the next launch
//             mesh_group_close(&out);
//         }
//         __shared__ bool wrong;                                // a warp found its bindings wrong
//         if (threadIdx.x == 0) wrong = false;
//         __syncthreads();
//         if (!ok && lane == 0) wrong = true;
//         __syncthreads();                                      // every warp closed
//         if (threadIdx.x == 0) mesh_grid_end(ctx, wrong ? 1 : 0);
//     }
//
// A batch is answered as a prefix: mesh_reply_many answers requests [0, done), every one unless a
// client's reply ring is full, in which case it stops at that client's first request that found no room,
// and mesh_fanin_consume gives back that prefix. The rest are peeked again by the next call, from the
// mailbox, as they came (so `f` is applied to a fresh copy): `f` may compute replies, but must not change
// program state until its request is answered. Compute into the reply buffer, then, after
// mesh_reply_many, commit the state of the requests j < done whose bit is clear in `skipped | dropped`
// (an idempotent change, a plain put, may be made early). Lane j per request suits requests that are
// independent of each other: several requests of one batch may come from one client (in its order) or
// touch one key, so a program with shared state applies them in batch order (one lane, j = 0 .. n - 1)
// or combines each client's requests (__match_any_sync on from[j]). With a reply size other than the
// request size, replies go in a buffer of their own: mesh_reply_many reads reply j at
// `msgs + j * out.msg_size`, and the peek writes request j at `buf + j * in.ch.msg_size`. A stop
// publishes the consumed position, so the next launch answers exactly the requests this one did not.
// The batched loop serves many clients faster; one request at a time gives a lone client, and the tail
// of many, a shorter wait (see BENCHMARKS.md).
//
// Shards. A fan-in channel created with `--shards P` (P a power of two up to MESH_FANIN_MAX_SHARDS) is P
// whole fan-in rings, each with its own reservation cursor, tail and slots, and a client always sends
// into shard (its slot % P), so that P times fewer senders contend for each cursor. The program sees one
// channel: every call takes from every shard of its part, and a peek looks at all of them in one round
// trip (a fair share each first, the shard served first turning by one each call). The batch lists each
// shard's whole requests at its front, shard after shard; mesh_fanin_consume(n) gives back the first n,
// which are a front of each shard's. Requests keep their order per client, and none between clients.
// One warp's end serves at most MESH_FANIN_WARP_SHARDS shards: a channel of more is served by several
// warps, each its part, and a grid of fewer serving warps is refused (the ends' msg_size 0).
//
// Many warps. Warp `part` of `parts` (a power of two dividing P, from mesh_fanin_parts) opens the fan-in
// with mesh_fanin_open (shards part, part + parts, ...) and the group with mesh_group_open from that end
// (the entries e with e % parts == part), so each client is one warp's: its requests, its replies and its
// departure, with one writer for every reply ring and every entry's state (warps share the built-in
// state array, each touching its own entries). Each warp calls mesh_group_departed on its own group: a
// departure acknowledged by another warp could hand the ring to a new client while the client's warp
// still answers the old one. The warps of several blocks serve the same way (`meshd load --grid G`):
// warp w of block b is part b x W + w of mesh_fanin_parts(ctx, 0, G x W), and the last block to finish
// ends the program (mesh_grid_end, mesh/core.cuh). `--shards 32 --grid 4 --block 256` gives 32 warps a
// shard each.
#pragma once
#include "channel.cuh"

// The protocol codes of fan-in and group bindings (mesh-shm's layout.rs), in the low bits of a
// binding's `protocol` word.
#define MESH_PROTOCOL_FANIN 3u
#define MESH_PROTOCOL_GROUP 4u
static_assert(MESH_FANIN == MESH_PROTOCOL_FANIN && MESH_GROUP == MESH_PROTOCOL_GROUP, "MESH_BINDINGS' codes (mesh/core.cuh)");

// What mesh_fanin_take and mesh_fanin_take_deferred found.
#define MESH_TAKE_NONE 0  // nothing whole at the position yet (empty, or still arriving)
#define MESH_TAKE_MSG 1   // a message, copied to the buffer, from *sender
#define MESH_TAKE_SKIP 2  // a slot completed by meshd as a skip: *sender's send was cut off (death or
                          // revocation); the buffer is untouched. Not a departure: see the group.

// What mesh_reply did.
#define MESH_REPLY_SENT 0  // in the client's reply ring
#define MESH_REPLY_FULL 1  // the client's ring is full (a slow client): nothing written; retry or drop
#define MESH_REPLY_GONE 2  // the id is not the entry's bound client (departed, or forged): dropped

// Requests mesh_fanin_peek returns per call at most: one per lane.
#define MESH_FANIN_BATCH_MAX 32u

// Shards one warp's fan-in end serves at most (one per lane).
#define MESH_FANIN_WARP_SHARDS 32u

// How often, in ns of %globaltimer, mesh_group_departed reads the group's `changes` word (as
// mesh_should_stop reads the stop word: the load's value is looked at one period later, so the loop
// never waits for it). A departure is acknowledged within about two periods plus one scan. Define it
// before including mesh.cuh to change it.
#ifndef MESH_GROUP_PERIOD_NS
#define MESH_GROUP_PERIOD_NS 100000u
#endif

// Entries mesh_group_open(ctx, b, in) can serve with the built-in state (one mesh_reply_state each, in
// device memory); a larger group needs the overload that takes the caller's array. Define it before including mesh.cuh to change it. The built-in array is one
// for the whole module, shared by every call of those overloads: a program with two groups passes its
// own arrays.
#ifndef MESH_GROUP_MAX_ENTRIES
#define MESH_GROUP_MAX_ENTRIES 1024u
#endif

// The consumer end of a fan-in binding, held by every lane of the warp that serves it. Programs read
// ch.msg_size (0: not open), corrupt and ch.partial; the rest is the calls'. `ch` is an LL consumer whose
// slots are 16 bytes longer than an LL channel's.
typedef struct {
    mesh_chan ch;       // ring, slots (the LL slots after the host-only owner table), msg_size, mask, ...
    uint32_t stride;    // bytes per slot: 16 + 2 * msg_size
    uint32_t corrupt;   // slots passed over whose kind no producer writes (report it if you like)
    uint32_t strange;   // mesh_fanin_peek: which of the requests it returned are of such a kind
    // Shards (P > 1): lane s < P of the warp keeps shard s's words, every lane the rest. With one shard
    // `ch` is the ring and these are unused.
    uint32_t shards;       // P (1: one ring, `ch`)
    uint32_t start;        // the shard the next peek serves first (it turns by one a peek)
    uint32_t returned;     // the last peek's requests, as bits of the slots it looked at (slot order)
    uint32_t run;          // lane s: the bits of those that are shard s's
    char* s_ring;          // lane s: shard s's ring header (its tail word at MESH_RING_TAIL)
    char* s_slots;         // lane s: shard s's LL slots
    uint64_t s_mine;       // lane s: shard s's next slot to read
    uint64_t s_done;       // lane s: shard s's slots given back (consumed, or taken and committed)
    uint64_t s_published;  // lane s: what shard s's tail word holds
    uint32_t s_hint;       // lane s: how many of shard s's slots the next peek looks at
    uint32_t part;         // this warp's part of the shards, numbered over the grid
    uint32_t parts;        // the warps that serve the fan-in; 0: a spare end (this warp has no part)
} mesh_fanin;

// The program's state for one entry's reply ring, in device memory (not registers: a group has up to
// 65,536 entries). Lanes read it together and lane 0 writes it back, before a __syncwarp.
typedef struct {
    uint64_t head;       // the next reply to write
    uint64_t tail;       // the client's tail as last read (credit)
    uint64_t published;  // what the ring's head word holds
    uint32_t epoch;      // the epoch this entry was last seen bound at (valid when `bound`)
    uint32_t bound;      // 1: `epoch` was read bound and its departure is not yet acknowledged by us
} mesh_reply_state;

// The producer end of every reply ring of a group binding, held by every lane of the warp that serves
// it. Programs read msg_size (0: not open) and entries (the client slots); the rest is the calls'.
typedef struct {
    char* header;              // the GroupHeader (0: not bound)
    mesh_reply_state* state;   // `entries` states
    uint64_t ring_stride;
    uint64_t changes_due;      // the next time `changes` may be read (%globaltimer)
    uint64_t changes_read;     // the value the last rate-limited load brought (lane 0's; looked at a period later)
    uint64_t changes_seen;     // `changes` as of the last complete scan
    uint32_t entries;
    uint32_t msg_size;         // payload bytes of a reply (0: not bound; every call fails)
    uint32_t mask;             // capacity - 1
    uint32_t scan_at;          // the next of its part's entries to look at in a scan in progress (k: entry part + k x parts)
    bool scanned;              // a scan has completed since the open (a new launch scans first)
    bool scanning;             // a scan is in progress, started at `changes_seen`'s new value
    uint64_t scan_changes;     // `changes` as read (Acquire) when the scan in progress started
    uint32_t part, parts;      // this warp answers the entries e with e % parts == part (0 of 1: all)
} mesh_group;

// How many warps of `warps` serve the fan-in at binding `b`, one part each: the largest power of two at
// most `warps` and at most its shards (1 without shards), so that it divides the shards. Any thread.
// The other warps have nothing to take (mesh_fanin_open gives them a spare end). A channel of more than MESH_FANIN_WARP_SHARDS shards needs at
// least shards / 32 warps (with fewer, their ends' msg_size is 0).
static __device__ __forceinline__ uint32_t mesh_fanin_parts(const mesh_ctx& c, uint32_t b, uint32_t warps);

// Opens binding `b` (a host channel of protocol fanin) for this warp, one of the first `warps` warps of
// every block of the grid, which all open it (1: the block's first warp; the other warps do not call
// it). Every lane of the warp together. The part is numbered over the grid: warp w of block b is part
// `part` = b x warps + w of `parts` = mesh_fanin_parts(c, b, gridDim.x x warps), and takes from shards
// part, part + parts, ... alone, hence the requests of the clients whose slot % parts == part, whose
// replies and departures mesh_group_open(c, 1, end) gives the same warp. So one consumer serves each
// shard whatever the grid. Each shard resumes at its published tail (after a crash: at-least-once, as
// every consumer). A warp whose number is at or past `parts` gets a spare end (`parts` 0, ch.msg_size
// 0): every shard is another warp's, and it has nothing to take. For another protocol, a warp at or
// past `warps`, or a grid whose serving warps would each serve more than MESH_FANIN_WARP_SHARDS
// shards, the end's ch.msg_size is 0 (its `parts` not 0) and every take finds nothing.
static __device__ __forceinline__ mesh_fanin mesh_fanin_open(const mesh_ctx& c, uint32_t b, uint32_t warps = 1u);

// Takes the request at the fan-in's position when it is whole, without giving its slot back. Every
// lane of the warp together; the same result on every lane. One round trip:
//   MESH_TAKE_MSG: a request, its body copied to `buf` (msg_size bytes, 4-byte aligned, shared or
//     global memory), its sender id in *sender;
//   MESH_TAKE_SKIP: a send cut off (*sender's), nothing to answer; `buf` untouched;
//   MESH_TAKE_NONE: nothing whole yet (`buf` may have been written); the next call polls again.
// The slot taken stays the program's, and the published position does not pass it, until
// mesh_fanin_commit: a launch that stops before the commit leaves the request to the next launch. A
// sharded fan-in takes the first whole request it finds over its shards, the shard it looks at first
// turning by one a call, so that no client starves the others.
static __device__ __forceinline__ int mesh_fanin_take_deferred(mesh_fanin* f, void* buf, uint32_t* sender);

// Gives back every slot taken with mesh_fanin_take_deferred so far: the producers may reuse them once the
// position is published (a plain store from one lane: every half ring, on an empty poll, and on
// mesh_fanin_close). Every lane of the warp together.
static __device__ __forceinline__ void mesh_fanin_commit(mesh_fanin* f);

// mesh_fanin_take_deferred and mesh_fanin_commit in one: the slot is given back as it is taken (what
// earlier takes took is published first, so a launch dying before it answered this request takes it
// again). For a program that can always answer at once, or drops what it cannot answer. Every lane of
// the warp together.
static __device__ __forceinline__ int mesh_fanin_take(mesh_fanin* f, void* buf, uint32_t* sender);

// Copies the whole requests at the fan-in's position, up to `max` (at most MESH_FANIN_BATCH_MAX), in
// order, without taking them: request j's body to `buf + j * msg_size` (4-byte aligned, shared or global
// memory, room for `max` requests), its sender to senders[j], and bit j of *skipped set for a send cut
// off (nothing to answer; its part of `buf` holds whatever its slot held; a slot of a kind no producer
// writes counts as skipped and in `corrupt`). Every lane of the warp together. Returns how many (the
// same on every lane); 0 when the first is not whole yet. One call returns what one round trip's loads
// hold, at least one request: 32 up to 64 bytes, 4 at 1 KiB, 1 above about 4 KiB (which then takes
// several round trips). Give the answered ones back with mesh_fanin_consume.
static __device__ __forceinline__ uint32_t mesh_fanin_peek(mesh_fanin* f, void* buf, uint32_t* senders, uint32_t* skipped,
                                                           uint32_t max);

// Gives back the first `n` requests of the last mesh_fanin_peek (answered or dropped: `done` of
// mesh_reply_many): the producers may reuse their slots once the position is published (every half ring,
// on an empty poll, and on mesh_fanin_close). Every lane of the warp together.
static __device__ __forceinline__ void mesh_fanin_consume(mesh_fanin* f, uint32_t n);

// Publishes the fan-in's exact position (every slot committed or consumed; none taken deferred and not
// committed). Every lane of the warp together, before mesh_end.
static __device__ __forceinline__ void mesh_fanin_close(mesh_fanin* f);

// Opens binding `b` (a host channel of protocol group) for the warp that holds fan-in end `in`, with
// the built-in state (at most MESH_GROUP_MAX_ENTRIES entries): this warp answers and acknowledges the
// clients of in's shards alone (the entries e with e % in.parts == in.part), and opens and closes only
// their rings. Every lane of the warp together. Each reply ring resumes after the published head and
// every whole reply written after it. For a spare `in`, on any disagreement between the group's
// header and the binding, or more entries than the state holds, msg_size is 0 and every call fails
// (mesh_reply: GONE).
static __device__ __forceinline__ mesh_group mesh_group_open(const mesh_ctx& c, uint32_t b, const mesh_fanin& in);

// mesh_group_open with the caller's state array: `max` entries of device memory, shared by the warps
// that serve the group, each touching its own entries.
static __device__ __forceinline__ mesh_group mesh_group_open(const mesh_ctx& c, uint32_t b, const mesh_fanin& in, mesh_reply_state* state,
                                                            uint32_t max);

// Replies `msg` (msg_size bytes, 4-byte aligned) to `client` (a sender id from mesh_fanin_take,
// mesh_fanin_take_deferred or mesh_fanin_peek). Every lane of the warp together; the same result on
// every lane: MESH_REPLY_SENT; MESH_REPLY_FULL when the client's ring has no room (nothing written: try
// again later, or drop); MESH_REPLY_GONE when the id is not the entry's bound client (it departed, or
// the id is forged): dropped. The entry's epoch is read (one acquire load of its epoch and state, one
// word) only until this warp has seen it bound; the client's tail (one round trip) only when its ring
// looks full.
static __device__ __forceinline__ int mesh_reply(mesh_group* g, uint32_t client, const void* msg);

// Answers requests [0, n) of a peek: reply j is `msgs + j * msg_size` (4-byte aligned), to
// `clients[j]`, unless bit j of `skip` is set (nothing to answer). Every lane of the warp together, one
// lane per request. Returns `done`, the same on every lane: how many of them, from the first, are
// answered or dropped; n unless a client's ring had no room, in which case `done` is the index of that
// client's first request that found none and nothing at or after it is sent. A request to a client
// that is not bound (GONE), or whose id names no entry, is dropped and its bit set in *dropped (bits
// below `done` only). Give the first `done` back with mesh_fanin_consume.
static __device__ __forceinline__ uint32_t mesh_reply_many(mesh_group* g, const uint32_t* clients, const void* msgs, uint32_t n,
                                                           uint32_t skip, uint32_t* dropped);

// Returns true with the id (`slot | epoch << 16`) of one departed client of this warp's part,
// acknowledged as it is returned: drop its state, and reply to it no more (mesh_reply would say GONE).
// Call it in a loop until false, every lane of the warp together, from the warp that answers those
// clients. Requests it sent before it left may still be taken after this, even once its slot has a new
// client: they come back GONE and must not touch the new client's state. It reads the group's `changes`
// word once every MESH_GROUP_PERIOD_NS (looked at a period later) and scans the entries, 32 per round
// trip, only when that moved or on the first call after the open.
static __device__ __forceinline__ bool mesh_group_departed(mesh_group* g, uint32_t* gone);

// Publishes every reply ring's exact head (this warp's part). Every lane of the warp together, before
// mesh_end.
static __device__ void mesh_group_close(mesh_group* g);

// Calls that were removed: a program that still calls one fails to build with what replaces it (each a
// template, so that the message appears only where it is called; not part of the API reference).
template <typename... T>
struct mesh_detail_removed {
    static constexpr bool value = false;
};
template <typename... T> static __device__ mesh_fanin mesh_fanin_open_part(const mesh_ctx&, T...) {
    static_assert(mesh_detail_removed<T...>::value,
                  "mesh_fanin_open_part was removed: mesh_fanin_open(ctx, b, warps), called by the first `warps` warps of "
                  "every block, numbers the part over the grid");
    return mesh_fanin{};
}
template <typename... T> static __device__ mesh_group mesh_group_open_part(const mesh_ctx&, T...) {
    static_assert(mesh_detail_removed<T...>::value,
                  "mesh_group_open_part was removed: mesh_group_open(ctx, b, in) opens the reply rings of fan-in end in's clients");
    return mesh_group{};
}
template <typename B> static __device__ mesh_group mesh_group_open(const mesh_ctx&, B) {
    static_assert(mesh_detail_removed<B>::value,
                  "mesh_group_open(ctx, b) was removed: mesh_group_open(ctx, b, in) opens the reply rings of fan-in end in's clients");
    return mesh_group{};
}
template <typename B, typename... T> static __device__ mesh_group mesh_group_open(const mesh_ctx&, B, mesh_reply_state*, T...) {
    static_assert(mesh_detail_removed<B, T...>::value,
                  "mesh_group_open(ctx, b, state, max) was removed: mesh_group_open(ctx, b, in, state, max) opens the "
                  "reply rings of fan-in end in's clients");
    return mesh_group{};
}

#include "detail/fanin.cuh"
#include "detail/group.cuh"
