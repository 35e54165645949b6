// mesh/channel.cuh: LL channels, the single-producer single-consumer rings for messages up to 64 KiB,
// used by one thread or by one whole warp.
//
// Every 8-byte word of a message carries a tag of its position (mesh-shm's ring.rs defines the
// format), so a receiver polls the message itself: one round trip per message, no index read, no
// fence. A channel's slots are in the mailbox (placement host: a host process or a GPU program at
// either end) or in GPU memory (placement device, `meshd channel create --placement device`: GPU
// programs at both ends); the calls are the same for both. Two ways to use them:
//   * one thread: mesh_try_send / mesh_try_recv (and mesh_try_recv_deferred + mesh_chan_commit).
//     Correct at any size, fast for messages of 8 bytes: one thread's loads of host memory do not
//     overlap, so larger messages cost a round trip per 8 bytes.
//   * one warp: mesh_warp_try_send / mesh_warp_try_recv (and their _batch forms). All 32 lanes call them
//     together, converged (no lane-dependent branch around the calls, mesh_chan_room and
//     mesh_should_stop included), with the same channel state (each lane holds a copy of the mesh_chan
//     and every copy changes the same way) and the same buffer. Each lane loads its own words, so a
//     message up to 4 KiB arrives in one round trip. Use these above 8 bytes, and the _batch forms for
//     streams of small messages. Figures per size and GPU: see BENCHMARKS.md.
// Large messages (64 KiB to 16 MiB) go through bulk channels (mesh/bulk.cuh); many clients through a
// service (mesh/service.cuh).
//
// The loop to write (an echo: every message received on binding 0 goes back on binding 1):
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         __shared__ uint32_t buf[1024];                    // one message, up to 4 KiB
//         if (threadIdx.x >= 32) return;                    // one warp serves the channels
//         uint64_t beat = 0;
//         if (threadIdx.x == 0) beat = mesh_begin(ctx);
//         mesh_chan in = mesh_chan_open(ctx, 0, false);
//         mesh_chan out = mesh_chan_open(ctx, 1, true);
//         if (in.msg_size == 0 || in.msg_size != out.msg_size || in.msg_size > sizeof(buf)) {
//             if (threadIdx.x == 0) mesh_exit(ctx, 1);      // a binding missing or of another size
//             return;
//         }
//         for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
//             if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
//             if (mesh_chan_room(&out) > 0 && mesh_warp_try_recv(&in, buf)) mesh_warp_try_send(&out, buf);
//         }
//         mesh_chan_close(&in);                             // exact positions for the next launch
//         mesh_chan_close(&out);
//         if (threadIdx.x == 0) mesh_end(ctx);
//     }
//
// Before a program returns after mesh_should_stop, it calls mesh_chan_close on every channel it opened
// and then mesh_end: that publishes its exact positions, so the relaunched kernel (after an upgrade or
// any blink) continues where it stopped, without losing or repeating a message.
//
// After a crash (a GPU fault, meshd killed, an MPS worker killed) delivery is at-least-once: a kernel
// that never reached mesh_chan_close resumes at the position it last published, so a consumer may
// receive again up to a ring of messages it had already taken (meshd logs the bound), and a producer
// resumes after every whole message it wrote. A receive publishes only what earlier receives took, so
// handle (send on) each message before you receive again and a crash never loses one; a program that
// must hold messages across receives takes them with mesh_try_recv_deferred and commits them once
// handled. A relay (the echo above) is fine with that: it passes the repeats on. A program that sends
// requests and waits for replies is not, unless it matches replies to requests: a repeated request is
// answered twice, and the extra reply must be dropped, or the exchange misaligns for good, or stops
// with both rings full, each end waiting for the other.
//
// Request / reply, surviving repeats (tests/programs/ping.cu is this loop, with timing and counters):
//   1. every request carries a sequence number (here word 0; ring position out.mine is unique for the
//      channel's life, across relaunches too, so a relaunch never reuses one);
//   2. a reply is matched to the request in flight by that number; a reply to an earlier number is a
//      repeat: dropped (count it if you like), never an error; only a reply to a number never sent,
//      or with wrong content, is one;
//   3. while a request cannot be sent (its ring is full), keep receiving replies: the other end may
//      be blocked on a full reply ring;
//   4. a (re)launch sends a fresh request instead of guessing what the last launch had in flight;
//      a reply to the old one then arrives as a repeat (ping.cu remembers, in user words, what an
//      orderly stop left in flight, to tell those replies from crash repeats).
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         __shared__ uint32_t req[1024], rep[1024];
//         if (threadIdx.x >= 32) return;
//         if (threadIdx.x == 0) mesh_begin(ctx);
//         mesh_chan out = mesh_chan_open(ctx, 0, true);   // requests
//         mesh_chan in = mesh_chan_open(ctx, 1, false);   // replies (e.g. the echo above)
//         const uint32_t words = out.msg_size / 4u;       // check out.msg_size == in.msg_size != 0
//         bool waiting = false;                           // a fresh request first, after any relaunch
//         uint32_t seq = 0;                               // the request in flight
//         uint32_t repeats = 0, errors = 0;               // report them with mesh_user_store if you like
//         // work(seq, i): your request's word i; use(rep): your handling of the answer
//         while (!mesh_should_stop(ctx)) {
//             if (!waiting) {
//                 const uint32_t next = (uint32_t)out.mine;
//                 for (uint32_t i = threadIdx.x; i < words; i += 32) req[i] = i == 0 ? next : work(next, i);
//                 __syncwarp();
//                 if (mesh_warp_try_send(&out, req)) { seq = next; waiting = true; continue; }
//                 // the ring is full: fall through and drain replies, so neither end waits for the other
//             }
//             if (!mesh_warp_try_recv(&in, rep)) continue;
//             const uint32_t r = rep[0];
//             if (waiting && r == seq) { waiting = false; use(rep); }        // the answer
//             else if ((int32_t)(r - (uint32_t)out.mine) < 0) repeats++;     // an earlier one again: drop
//             else errors++;                                                 // never sent: a real error
//         }
//         mesh_chan_close(&out);
//         mesh_chan_close(&in);
//         if (threadIdx.x == 0) mesh_end(ctx);
//     }
//
// The same holds for a host process talking to a GPU program after a crash: number the requests,
// skip replies with an old number.
//
// Format: message `seq` of a channel of msg_size payload bytes fills msg_size / 4 8-byte words of its
// slot; word k holds payload bytes 4k..4k+3 (little-endian) in its low half and its tag (the low 31
// bits of seq with the top bit set) in its high half. 8 bytes is the largest store PTX promises to
// arrive whole, so a word with the right tag is valid on its own, whatever order the words arrived in.
// The ring takes MESH_RING_WIRE_FACTOR times its payload in memory. The producer's `head` line and the
// consumer's `tail` line (the producer's credit) are published with a plain store every half ring,
// when a receiver finds the ring empty, and exactly on mesh_chan_close.
#pragma once
#include "core.cuh"

// Whether a receiver that finds its ring empty publishes its position then (1, the default), or only
// every half ring and on mesh_chan_close (0: no store to the mailbox per message; the producer always
// has half a ring of credit). Define it before including mesh.cuh to change it.
#ifndef MESH_PUBLISH_ON_DRAIN
#define MESH_PUBLISH_ON_DRAIN 1
#endif

// One end of a bound LL channel, held in registers by the thread (or by every lane of the warp) using
// it. Programs read msg_size (0: not open), mine (the next position), partial; the rest is the calls'.
typedef struct {
    char* ring;           // the ring's header (indices and claims, in the mailbox)
    char* slots;          // the ring's message slots (the mailbox, or GPU memory for a device channel)
    uint32_t msg_size;    // payload bytes per message, a multiple of 8 (0: not bound)
    uint32_t mask;        // capacity - 1
    uint64_t mine;        // producer: the next message to write; consumer: the next to read
    uint64_t other;       // producer: the consumer's tail as last read; consumer: messages committed
    uint64_t published;   // what this end's index line holds
    uint32_t hint;        // consumer, warp calls: how many messages the next poll looks at
    uint32_t magic;       // ceil(2^32 / words per message): word index -> message index without a division
    uint32_t partial;     // consumer: polls that found a message half-arrived (each costs a round trip)
    bool producer;
} mesh_chan;

// Opens binding `b` of protocol LL as a producer (`producer` true) or a consumer. Any thread, or every
// lane of a warp together (each gets the same copy). A producer resumes after the last whole message
// written into the ring, a consumer at the last position committed and published. An unbound `b`, or a
// channel of another protocol (bulk: mesh_bulk_open; fan-in or group: mesh/service.cuh), gives msg_size
// 0, on which every call fails: check msg_size before use.
static __device__ __forceinline__ mesh_chan mesh_chan_open(const mesh_ctx& c, uint32_t b, bool producer);

// Publishes this end's exact position, so that the next launch continues exactly here. Call it on
// every channel the program opened, before mesh_end, by the thread or warp that uses the channel. The
// channel stays usable.
static __device__ __forceinline__ void mesh_chan_close(mesh_chan* ch);

// Free slots a producer can fill now; 0 for a consumer or a channel not open. It reads the consumer's
// tail (one round trip) only when the ring looks full. A relay checks it before it receives, so that a
// stop never finds it holding a message it could not pass on. One thread, or every lane of a warp
// together.
static __device__ __forceinline__ uint32_t mesh_chan_room(mesh_chan* ch);

// Sends one message of ch->msg_size bytes from `msg` (4-byte aligned). One thread. False when the ring
// is full (or the end is not an open producer); nothing is then written.
static __device__ __forceinline__ bool mesh_try_send(mesh_chan* ch, const void* msg);

// Receives one message into `out` (ch->msg_size bytes, 4-byte aligned), committing the messages earlier
// calls took. One thread. False when no whole message is there (`out` may then have been written).
static __device__ __forceinline__ bool mesh_try_recv(mesh_chan* ch, void* out);

// Like mesh_try_recv, but the message stays held (the producer cannot reuse its slot) until
// mesh_chan_commit: for a program that must hold messages across receives and survive a crash without
// losing one. One thread.
static __device__ __forceinline__ bool mesh_try_recv_deferred(mesh_chan* ch, void* out);

// Gives every message received with mesh_try_recv_deferred so far back to the producer (published in
// batches: every half ring, when the ring drains, on mesh_chan_close). One thread.
static __device__ __forceinline__ void mesh_chan_commit(mesh_chan* ch);

// Receives one message into `buf` (msg_size bytes, 4-byte aligned, shared or global memory), committing
// the messages earlier calls took. Every lane of one warp together. True on every lane when one arrived,
// false on every lane when none has (or it is still arriving: the next call polls again). Messages up to
// 1 KiB take a short path of one vote; larger ones one round trip per 4 KiB.
static __device__ __forceinline__ bool mesh_warp_try_recv(mesh_chan* ch, void* buf);

// Receives up to `max` messages into `buf` (max * msg_size bytes, 4-byte aligned, shared or global
// memory), committing the messages earlier calls took. Every lane of one warp together. Returns how many
// (the same on every lane); 0 when the ring is empty. Small messages are loaded together, one round trip
// per 4 KiB; how many a call looks at adapts (one after an empty poll, twice as many after a call that
// found all it looked at), so that a request / reply exchange polls one message and a stream grows to
// `max` within a few calls.
static __device__ uint32_t mesh_warp_try_recv_batch(mesh_chan* ch, void* buf, uint32_t max);

// Sends one message from `buf` (msg_size bytes, 4-byte aligned). Every lane of one warp together. False
// on every lane when the ring is full. Stores only, 16 bytes per lane per store: nothing waits for PCIe.
static __device__ __forceinline__ bool mesh_warp_try_send(mesh_chan* ch, const void* buf);

// Sends up to `count` messages from `buf` (count * msg_size bytes, 4-byte aligned), as many as there is
// room for. Every lane of one warp together. Returns how many (the same on every lane). Stores only.
static __device__ uint32_t mesh_warp_try_send_batch(mesh_chan* ch, const void* buf, uint32_t count);

#include "detail/channel.cuh"
