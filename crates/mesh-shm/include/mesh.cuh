// mesh.cuh: the device side of meshd's mailbox (mesh-shm), for programs whose mesh_main meshd runs.
//
// A program is `extern "C" __global__ void mesh_main(mesh_ctx ctx)`, launched once and looping until
// mesh_should_stop(ctx). The mailbox lives in host memory mapped into the GPU's address space: every
// access crosses PCIe (about a microsecond for a read), so what costs is the number of dependent reads,
// not instructions. The H200 has no host-native atomics, so each shared word has exactly one writer:
// the kernel writes its status line and its rings' own indices, meshd the control line.
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
// The heartbeat: meshd counts a running program whose heartbeat has not moved for
// `--health-max-heartbeat-age` (default 5 s) as not ready (`/readyz` answers 503, `meshd_ready` 0),
// so every loop beats (a plain store every few thousand iterations costs nothing measurable), or the
// program is loaded with `meshd load ... --no-readiness`. A program that waits without looping (a
// kernel blocked in a long computation) beats from its own progress.
//
// Its host round trip is the raw one-warp LL exchange's (the same tagged words moved by a bare kernel):
// on the H200 (session 19, `mesh-gpu-bench rt-ab`, medians of 5 turns x 4,000, a client whose time
// between reply and next request varies over 0-1.5 us) 2.44 / 2.58 / 2.79 / 3.27 / 5.80 us at 8 / 64 /
// 256 B / 1 / 4 KiB, 1.03 / 1.01 / 0.97 / 0.88 / 0.70x that exchange, in MPS mode too; a raw mapped word
// (one 8-byte counter, its own flag) takes 2.0-2.3 us. With a client that sends its next request the
// instant a reply lands, one poll is lost per round trip (the poll sent right after the reply reaches the
// host before the request): 2.7-3.0 us at 8-256 B. Two options take that poll out for such a client
// only, and cost a client whose time varies 6-18% (session 19): MESH_PHASE_LOCK (at mesh_warp_try_recv;
// 8-256 B in 2.1-2.3 us) and the poll stream ("Lowest host round trip: the poll stream" below; 8 / 64 B
// in 2.5-2.6 us, slower from 256 B). Keep this loop unless the client is such a closed loop.
// GPU to GPU (device channels) this one-warp loop is at the raw two-kernel round trip: 1.18 / 1.21 /
// 1.26 / 1.56 us at 8 / 64 / 256 B / 1 KiB against 1.07 / 1.37 / 1.39 / 1.85 us for two bare kernels on
// device memory (same run).
//
// mesh_should_stop(ctx) is cheap to call on every iteration: it reads meshd's stop word at most once
// every MESH_STOP_PERIOD_NS (100 µs) of %globaltimer and never branches on a read in flight (see
// below), so the loop polls its channels at full speed; a stop is seen within about two periods.
//
// Large messages (64 KiB to 16 MiB) go through channels of protocol bulk, moved by a whole thread
// block: see "Large messages" at the end of this file.
//
// Channels (see "Channels" below) carry a tag in every 8-byte word of a message, so a receiver polls
// the message itself: one round trip per message, no index read, no fence. A channel's slots are in
// the mailbox (placement host: a host process or a GPU program at either end) or in GPU memory
// (placement device, `meshd channel create --placement device`: GPU programs at both ends, no PCIe);
// the calls are the same for both. Two ways to use them:
//   * one thread: mesh_try_send / mesh_try_recv (and _deferred + mesh_chan_commit, mesh_chan_room).
//     Correct at any size; fast up to 8-byte messages (one 16-byte load): a host round trip of 8 bytes
//     0.94-1.00x the raw one-warp LL exchange and 1.02-1.18x the raw mapped word over a client whose
//     time varies, up to 0.19 us under one warp's loop (session 19, an H100, four calls, both modes,
//     tests/programs/echo.cu in `rt-ab`). Larger messages cost one round trip per 8 bytes, because one
//     thread's loads of host memory do not overlap.
//   * one warp: mesh_warp_try_send / mesh_warp_try_recv (and _batch). All 32 lanes call them together,
//     converged (as the loops in this file keep the warp: no lane-dependent branch around the calls,
//     mesh_chan_room and mesh_should_stop included), because every lane loads the channel's shared
//     index words itself and the calls rely on the lanes seeing one value, which a converged warp's
//     single load instruction gives them;
//     each lane loads its own words, so a message up to 4 KiB arrives in one round trip (up to 1 KiB:
//     at most four loads per lane, all in flight together, and one vote). Use these for anything above
//     8 bytes, and the _batch forms for streams of small messages.
//   * the poll stream (mesh_poll_*): a block of 32 * (MESH_POLLERS + 1) threads receives one channel
//     with MESH_POLLERS warps polling it in turn, so that a poll reaches the host soon after any
//     moment a message lands; only for a host client that sends each request the instant the last
//     reply lands, with messages up to 64 B (session 19, H200: 8 / 64 B 0.85-0.96x the one-warp LL
//     exchange, where one warp is 0.97-1.11x); a client whose own time varies is 7-18% slower with it.
//   * a whole block, bulk channels: "Large messages" below; one channel served by several blocks with
//     `--parts` (mesh_bulk_open_part).
// Before a program returns after mesh_should_stop, it calls mesh_chan_close on every channel it opened
// and then mesh_end: that publishes its exact positions, so the relaunched kernel (after an upgrade or
// any blink) continues where it stopped, without losing or repeating a message.
//
// After a crash (a GPU fault, meshd killed, an MPS worker killed) delivery is at-least-once: a kernel
// that never reached mesh_chan_close resumes at the position it last published, so a consumer may
// receive again up to a ring of messages it had already taken (meshd logs the bound), and a producer
// resumes after every whole message it wrote. A receive publishes only what earlier receives took
// (mesh_chan_took), so handle (send on) each message before you receive again and a crash never loses
// one; a program that must hold messages across receives takes them with mesh_try_recv_deferred and
// commits them once handled. A relay (the echo above) is fine with that: it passes
// the repeats on. A program that sends requests and waits for replies is not, unless it matches
// replies to requests: a repeated request is answered twice, and the extra reply must be dropped, or
// the exchange misaligns for good, or stops with both rings full, each end waiting for the other.
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
// Slot states: MESH_STATE_IDLE (armed by meshd, not yet started), MESH_STATE_RUNNING (mesh_begin),
// MESH_STATE_STOPPED (mesh_end after a stop request), MESH_STATE_EXITED (mesh_exit with a code).
// A program may report up to MESH_SLOT_USER_WORDS words of its own through mesh_user_store; the
// mailbox has layout version MESH_LAYOUT_VERSION, checked by meshd when it opens the file; each program
// slot is MESH_SLOT_SIZE bytes (meshd passes its offset in mesh_ctx.slot_offset). A binding's
// `placement` is MESH_PLACEMENT_HOST or MESH_PLACEMENT_DEVICE; its `slots` the address of its ring's
// message slots in this context, MESH_RING_SLOTS the size of the ring's header (indices and claims,
// always in the mailbox).
#pragma once
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "mesh.cuh needs compute capability 7.0 or later (__match_any_sync, ld.acquire.sys): build with -arch=compute_80, say"
#endif
#include <stdint.h>
#include <stddef.h>

// BEGIN GENERATED LAYOUT (from mesh-shm's layout.rs; MESH_BLESS=1 cargo test -p mesh-shm rewrites it)
#define MESH_LAYOUT_VERSION 4u
#define MESH_MAX_BINDINGS 8u
#define MESH_SLOT_SIZE 384u
#define MESH_SLOT_STOP 0u
#define MESH_SLOT_GENERATION 4u
#define MESH_SLOT_HEARTBEAT 128u
#define MESH_SLOT_STATE 136u
#define MESH_SLOT_EXIT_CODE 140u
#define MESH_SLOT_SEEN_GENERATION 144u
#define MESH_SLOT_USER 256u
#define MESH_SLOT_USER_WORDS 32u
#define MESH_RING_HEAD 0u
#define MESH_RING_TAIL 128u
#define MESH_RING_SLOTS 384u
#define MESH_RING_WIRE_FACTOR 2u
#define MESH_STATE_IDLE 0u
#define MESH_STATE_RUNNING 1u
#define MESH_STATE_STOPPED 2u
#define MESH_STATE_EXITED 3u
#define MESH_PLACEMENT_HOST 0u
#define MESH_PLACEMENT_DEVICE 1u
#define MESH_PROTOCOL_LL 0u
#define MESH_PROTOCOL_BULK 1u
#define MESH_BULK_FLAG_SIZE 8u
#define MESH_BULK_ALIGN 4096u
#define MESH_BULK_MAX_PARTS 32u
#define MESH_BULK_PARTS_SHIFT 16u
#define MESH_FANIN_MAX_SHARDS 64u
#define MESH_LINE 128u
typedef struct {
    uint64_t ring_offset;
    uint64_t slots;
    uint32_t msg_size;
    uint32_t capacity;
    uint32_t placement;
    uint32_t protocol;
} mesh_binding;
typedef struct {
    uint64_t base;
    uint64_t slot_offset;
    uint32_t slot;
    uint32_t binding_count;
    mesh_binding bindings[MESH_MAX_BINDINGS];
    uint64_t stop_due;
    uint32_t stop_seen;
    uint32_t reserved;
} mesh_ctx;
static_assert(sizeof(mesh_binding) == 32, "sizeof(mesh_binding) disagrees with mesh-shm");
static_assert(offsetof(mesh_binding, slots) == 8, "offsetof(mesh_binding, slots) disagrees with mesh-shm");
static_assert(offsetof(mesh_binding, msg_size) == 16, "offsetof(mesh_binding, msg_size) disagrees with mesh-shm");
static_assert(offsetof(mesh_binding, capacity) == 20, "offsetof(mesh_binding, capacity) disagrees with mesh-shm");
static_assert(offsetof(mesh_binding, placement) == 24, "offsetof(mesh_binding, placement) disagrees with mesh-shm");
static_assert(offsetof(mesh_binding, protocol) == 28, "offsetof(mesh_binding, protocol) disagrees with mesh-shm");
static_assert(sizeof(mesh_ctx) == 296, "sizeof(mesh_ctx) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, slot_offset) == 8, "offsetof(mesh_ctx, slot_offset) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, slot) == 16, "offsetof(mesh_ctx, slot) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, binding_count) == 20, "offsetof(mesh_ctx, binding_count) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, bindings) == 24, "offsetof(mesh_ctx, bindings) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, stop_due) == 280, "offsetof(mesh_ctx, stop_due) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, stop_seen) == 288, "offsetof(mesh_ctx, stop_seen) disagrees with mesh-shm");
// END GENERATED LAYOUT

// The PTX primitives below (loads and stores with their scopes, %laneid, %globaltimer, %smid) are
// skipped when MESH_HOST_EMULATION is defined: mesh-shm's CPU tests then run these calls as one warp
// of 32 threads, with the primitives as atomics (crates/mesh-shm/tests/emu/warp_emu.h). Programs never
// define it.
#ifndef MESH_HOST_EMULATION  // (a CPU test build supplies these: crates/mesh-shm/tests/emu)
static __device__ __forceinline__ uint64_t mesh_ld_acquire_u64(const void* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint32_t mesh_ld_acquire_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint32_t mesh_ld_relaxed_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void mesh_st_release_u64(void* p, uint64_t v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ void mesh_st_release_u32(void* p, uint32_t v) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
#endif  // MESH_HOST_EMULATION
static __device__ __forceinline__ char* mesh_at(const mesh_ctx& c, uint64_t offset) {
    return (char*)(uintptr_t)(c.base + offset);
}
static __device__ __forceinline__ char* mesh_slot_at(const mesh_ctx& c, uint64_t field) {
    return mesh_at(c, c.slot_offset + field);
}

#ifndef MESH_HOST_EMULATION  // (a CPU test build supplies these: crates/mesh-shm/tests/emu)
// Nanoseconds of the GPU's global timer.
static __device__ __forceinline__ uint64_t mesh_globaltimer(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// The SM this thread runs on.
static __device__ __forceinline__ uint32_t mesh_smid(void) {
    uint32_t id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
#endif  // MESH_HOST_EMULATION

// How often, in ns of %globaltimer, mesh_should_stop(ctx) reads meshd's stop word. Define it before
// including mesh.cuh to change it: a stop is seen within about two periods. Why so rarely: on the
// H200 a load of host memory delays the loads issued after it (device-memory polls too) by its whole
// PCIe round trip even though nothing waits for its value; read every 8 µs it cost GPU↔GPU round
// trips on device channels 0.64 µs on average (BENCHMARKS.md, layout 3).
#ifndef MESH_STOP_PERIOD_NS
#define MESH_STOP_PERIOD_NS 100000u
#endif

// True once meshd asks the program to stop. Call it on every iteration, with mesh_main's own `ctx`
// (it keeps the check's state in ctx.stop_due and ctx.stop_seen): it reads the stop word with a
// relaxed load at most once every MESH_STOP_PERIOD_NS, and looks at what that load brought only at
// the next check, a period later, so the loop's branch never waits for the PCIe read and a program
// whose channels are in device memory touches host memory once a period.
static __device__ __forceinline__ bool mesh_should_stop(mesh_ctx& c) {
    const uint64_t now = mesh_globaltimer();
    if (now < c.stop_due) return false;
    if (c.stop_seen != 0) return true;
    c.stop_seen = mesh_ld_relaxed_u32(mesh_slot_at(c, MESH_SLOT_STOP));
    c.stop_due = now + MESH_STOP_PERIOD_NS;
    return false;
}

// The same question asked now: one PCIe read, waited for. For a context that cannot keep the state
// above (a `const mesh_ctx&`); a loop should use mesh_should_stop(ctx).
static __device__ __forceinline__ bool mesh_should_stop(const mesh_ctx& c) {
    return mesh_ld_relaxed_u32(mesh_slot_at(c, MESH_SLOT_STOP)) != 0;
}

// Marks the program running; call from one thread. Returns the heartbeat to continue from, so that
// a program's heartbeat keeps rising across the relaunches of a blink.
static __device__ __forceinline__ uint64_t mesh_begin(const mesh_ctx& c) {
    uint32_t gen = mesh_ld_acquire_u32(mesh_slot_at(c, MESH_SLOT_GENERATION));
    uint64_t beat = *(volatile uint64_t*)mesh_slot_at(c, MESH_SLOT_HEARTBEAT);
    *(volatile uint32_t*)mesh_slot_at(c, MESH_SLOT_SEEN_GENERATION) = gen;
    mesh_st_release_u32(mesh_slot_at(c, MESH_SLOT_STATE), MESH_STATE_RUNNING);
    return beat;
}

// Publishes the heartbeat (one thread; the value the program counts, rising: start from what mesh_begin
// returned). meshd's readiness wants it to move at least every `--health-max-heartbeat-age` seconds
// (default 5) while the program runs; see the loop at the top of this file.
static __device__ __forceinline__ void mesh_heartbeat(const mesh_ctx& c, uint64_t beat) {
    *(volatile uint64_t*)mesh_slot_at(c, MESH_SLOT_HEARTBEAT) = beat;
}

// Marks the program stopped at meshd's request (one thread, as the kernel leaves).
static __device__ __forceinline__ void mesh_end(const mesh_ctx& c) {
    mesh_st_release_u32(mesh_slot_at(c, MESH_SLOT_STATE), MESH_STATE_STOPPED);
}

// Ends the program with a code meshd reports (one thread; the kernel should return afterwards).
static __device__ __forceinline__ void mesh_exit(const mesh_ctx& c, int32_t code) {
    *(volatile int32_t*)mesh_slot_at(c, MESH_SLOT_EXIT_CODE) = code;
    mesh_st_release_u32(mesh_slot_at(c, MESH_SLOT_STATE), MESH_STATE_EXITED);
}

// Stores word `i` (< MESH_SLOT_USER_WORDS) of the program's user line. The words survive upgrades and
// relaunches (a new load starts them at 0), so a program can keep counters there.
static __device__ __forceinline__ void mesh_user_store(const mesh_ctx& c, uint32_t i, uint32_t v) {
    if (i < MESH_SLOT_USER_WORDS) mesh_st_release_u32(mesh_slot_at(c, MESH_SLOT_USER) + 4u * i, v);
}

// Reads back word `i` of the program's user line (e.g. a counter the previous launch left there).
static __device__ __forceinline__ uint32_t mesh_user_load(const mesh_ctx& c, uint32_t i) {
    return i < MESH_SLOT_USER_WORDS ? *(volatile uint32_t*)(mesh_slot_at(c, MESH_SLOT_USER) + 4u * i) : 0u;
}

// ---- Channels ---------------------------------------------------------------------------------
// Format (mesh-shm's ring.rs): message `seq` of a channel of msg_size payload bytes fills msg_size/4
// 8-byte words of its slot; word k holds payload bytes 4k..4k+3 (little-endian) in its low half and
// mesh_tag(seq) in its high half. 8 bytes is the largest store PTX promises to arrive whole, so a word
// with the right tag is valid on its own, whatever order the words arrived in. The ring takes
// MESH_RING_WIRE_FACTOR times its payload in memory.
// Indices: the producer's `head` line and the consumer's `tail` line (the producer's credit). A GPU end
// publishes its index with a plain store (no fence) every half ring, when a receiver finds the ring
// empty, and exactly on mesh_chan_flush / mesh_chan_close.

#ifndef MESH_HOST_EMULATION  // (a CPU test build supplies these: crates/mesh-shm/tests/emu)
static __device__ __forceinline__ uint64_t mesh_ld_volatile_u64(const volatile void* p) {
    uint64_t v;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void mesh_ld_volatile_v2(const volatile void* p, uint64_t* a, uint64_t* b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}
static __device__ __forceinline__ void mesh_st_volatile_u64(volatile void* p, uint64_t v) {
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ void mesh_st_volatile_v2(volatile void* p, uint64_t a, uint64_t b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
// This thread's lane in its warp.
static __device__ __forceinline__ uint32_t mesh_lane(void) {
    uint32_t l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return l;
}
#endif  // MESH_HOST_EMULATION

// The tag of message `seq`: its low 31 bits with the top bit set (never 0, the value of a ring never
// written, and never the tag of the message a ring earlier in the same slot).
static __device__ __forceinline__ uint32_t mesh_tag(uint64_t seq) {
    return (uint32_t)seq | 0x80000000u;
}

// One end of a bound channel, held in registers by the thread (or by every lane of the warp) using it.
typedef struct {
    char* ring;           // the ring's header (indices and claims, in the mailbox)
    char* slots;          // the ring's message slots (the mailbox, or GPU memory for a device channel)
    uint32_t msg_size;    // payload bytes per message, a multiple of 8 (0: not bound)
    uint32_t mask;        // capacity - 1
    uint64_t mine;        // producer: the next message to write; consumer: the next to read
    uint64_t other;       // producer: the consumer's tail as last read; consumer: messages committed
    uint64_t published;   // what this end's index line holds
    uint32_t hint;        // consumer, warp calls: how many messages the next poll looks at (see below)
    uint32_t magic;       // ceil(2^32 / words per message): word index -> message index without a division
    uint32_t partial;     // consumer: polls that found a message half-arrived (each costs a round trip)
    bool producer;
    // consumer, mesh_warp_try_recv's phase lock (see there), in SM clocks (clock64):
    bool lock;            // it applies: a host channel (MESH_PHASE_LOCK on)
    uint32_t wait;        // the learned wait after a message
    uint32_t empties;     // polls that found nothing since the last message
    uint64_t due;         // no poll before this clock
    uint64_t last;        // when the last message was taken
    uint32_t trial;       // messages taken so far (the lock's trials run on it)
    uint32_t gap;         // lane k: clocks between message k - 1 and k of this trial (k = trial % 32);
                          // the one field whose copies differ between a warp's lanes
    uint32_t cost_free;   // the trials without the wait, and those with it: gaps summed, each at most
                          // twice the trial's median, as a running mean (weight 1/4 to the newest)
    uint32_t cost_lock;
} mesh_chan;

static __device__ __forceinline__ volatile uint64_t* mesh_chan_slot(const mesh_chan* ch, uint64_t seq) {
    return (volatile uint64_t*)(ch->slots + (seq & ch->mask) * (uint64_t)ch->msg_size * MESH_RING_WIRE_FACTOR);
}

// Stores this end's index (head for a producer, committed tail for a consumer). A plain store: the
// other end needs it only as credit (or to resume), never to validate a message.
static __device__ __forceinline__ void mesh_chan_flush(mesh_chan* ch) {
    if (ch->msg_size == 0) return;
    uint64_t v = ch->producer ? ch->mine : ch->other;
    if (v != ch->published) {
        // One store, from the lowest active lane: when a whole warp calls this, 32 stores of one word
        // would each cross PCIe. A lone thread is its own lowest active lane.
        if ((__activemask() & ((1u << mesh_lane()) - 1u)) == 0)
            mesh_st_volatile_u64(ch->ring + (ch->producer ? MESH_RING_HEAD : MESH_RING_TAIL), v);
        ch->published = v;
    }
}

// Publishes this end's index when half a ring has gone by since the last time.
static __device__ __forceinline__ void mesh_chan_progress(mesh_chan* ch) {
    uint64_t v = ch->producer ? ch->mine : ch->other;
    uint64_t batch = (ch->mask + 1u) / 2u;
    if (v - ch->published >= (batch ? batch : 1u)) mesh_chan_flush(ch);
}

// A receive that commits as it takes, once it moved ch->mine past what it took: publishes (every half
// ring) what earlier calls took (ch->other) first, then counts these as consumed. The program handled
// the earlier ones before it called again, so a launch that dies between this take and the handling
// resumes before these messages: at-least-once after a crash, never lost. The next call, an empty poll
// or mesh_chan_close publishes them.
static __device__ __forceinline__ void mesh_chan_took(mesh_chan* ch) {
    mesh_chan_progress(ch);
    ch->other = ch->mine;
}

// mesh_warp_try_recv's phase lock on host channels (off by default; see "The phase lock" below).
#ifndef MESH_PHASE_LOCK
#define MESH_PHASE_LOCK 0
#endif

// Opens binding `b` as a producer (`producer` true) or consumer. An unbound `b`, or a channel of
// protocol bulk (open those with mesh_bulk_open), gives msg_size 0, on which every call fails. A producer resumes after the last message written into the ring, a consumer
// at the last position committed and published.
static __device__ __forceinline__ mesh_chan mesh_chan_open(const mesh_ctx& c, uint32_t b, bool producer) {
    mesh_chan ch = {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, producer};
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return ch;
    if (c.bindings[b].protocol != MESH_PROTOCOL_LL) return ch;  // a bulk channel: mesh_bulk_open
    ch.ring = mesh_at(c, c.bindings[b].ring_offset);
    ch.slots = (char*)(uintptr_t)c.bindings[b].slots;
    ch.msg_size = c.bindings[b].msg_size;
    ch.mask = c.bindings[b].capacity - 1;
    ch.magic = (uint32_t)(((1ull << 32) + ch.msg_size / 4u - 1u) / (ch.msg_size / 4u));
    ch.lock = MESH_PHASE_LOCK && !producer && c.bindings[b].placement == MESH_PLACEMENT_HOST;
    uint64_t tail = mesh_ld_volatile_u64(ch.ring + MESH_RING_TAIL);
    if (producer) {
        uint64_t head = mesh_ld_volatile_u64(ch.ring + MESH_RING_HEAD);
        ch.published = head;
        if ((int64_t)(tail - head) > 0) head = tail;
        // Skip messages written after the published head (a producer that stopped without closing, or
        // died): whole ones only, every word tagged, as mesh-shm's ProducerCore::resume judges them; one
        // cut off mid-write is written again. Every word, not the first and last: a warp's lanes store
        // their words at once, so a launch killed mid-send can leave both ends of a message and miss a
        // word between, and skipping that message would leave its consumer waiting for the word for
        // good. The first word alone decides the usual case (after an orderly close, the next slot is
        // empty), and a crash costs a read of each message written since the last publication.
        const uint32_t words = ch.msg_size / 4u;
        while (head - tail <= ch.mask) {
            const volatile uint64_t* w = mesh_chan_slot(&ch, head);
            const uint32_t t = mesh_tag(head);
            if ((uint32_t)(mesh_ld_volatile_u64(w) >> 32) != t) break;
            bool whole = true;
            for (uint32_t i = 1; i < words; i++) whole &= (uint32_t)(mesh_ld_volatile_u64(w + i) >> 32) == t;
            if (!whole) break;
            head++;
        }
        ch.mine = head;
        ch.other = tail;
    } else {
        ch.mine = ch.other = ch.published = tail;
    }
    return ch;
}

// Publishes this end's exact position; call it on every channel before mesh_end, so that the next
// launch of the program continues exactly here. The channel stays usable.
static __device__ __forceinline__ void mesh_chan_close(mesh_chan* ch) {
    mesh_chan_flush(ch);
}

// Free slots a producer can fill now (reading the consumer's tail, one round trip, only when the ring
// looks full). A relay checks this before it receives, so that a stop never finds it holding a message
// it could not pass on. Safe to call from every lane of a warp together.
static __device__ __forceinline__ uint32_t mesh_chan_room(mesh_chan* ch) {
    if (ch->msg_size == 0 || !ch->producer) return 0;
    if (ch->mine - ch->other > ch->mask) {
        ch->other = mesh_ld_volatile_u64(ch->ring + MESH_RING_TAIL);
        mesh_chan_flush(ch);  // the ring looked full: a good moment to say how far we are
    }
    uint64_t used = ch->mine - ch->other;
    return used > ch->mask ? 0u : (uint32_t)(ch->mask + 1u - used);
}

// Whether a receiver that finds its ring empty publishes its position then (1, the default), or only
// every half ring and on mesh_chan_close (0: no store to the mailbox per message; the producer always
// has half a ring of credit). Measured on the H200: no difference above the noise (BENCHMARKS.md).
#ifndef MESH_PUBLISH_ON_DRAIN
#define MESH_PUBLISH_ON_DRAIN 1
#endif

// A receiver waiting on an empty ring publishes its position: all of it, or without
// MESH_PUBLISH_ON_DRAIN once half a ring is owed. A receive publishes only what earlier receives took
// (mesh_chan_took), so a consumer that took every message in flight in one call would otherwise leave
// the producer without credit for good.
static __device__ __forceinline__ void mesh_chan_publish_waiting(mesh_chan* ch) {
    if (MESH_PUBLISH_ON_DRAIN) mesh_chan_flush(ch);
    else mesh_chan_progress(ch);
}

// A receive found the ring empty.
static __device__ __forceinline__ void mesh_chan_drained(mesh_chan* ch) {
    ch->hint = 1;
    mesh_chan_publish_waiting(ch);
}

// How long a receiver waits for the rest of a message whose first words have arrived, in ns of
// %globaltimer, before it gives up for this call (a producer that died mid-message must not keep a
// kernel from seeing its stop request).
#define MESH_PARTIAL_WAIT_NS 100000u

// --- One thread ---

// Sends one message of ch->msg_size bytes (4-byte aligned). False when the ring is full.
static __device__ __forceinline__ bool mesh_try_send(mesh_chan* ch, const void* msg) {
    if (mesh_chan_room(ch) == 0) return false;
    volatile uint64_t* dst = mesh_chan_slot(ch, ch->mine);
    const uint32_t* src = (const uint32_t*)msg;
    const uint64_t t = (uint64_t)mesh_tag(ch->mine) << 32;
    for (uint32_t i = 0; i < ch->msg_size / 4u; i += 2) mesh_st_volatile_v2(dst + i, t | src[i], t | src[i + 1]);
    ch->mine += 1;
    mesh_chan_progress(ch);
    return true;
}

// Like mesh_try_recv, but the slot stays held (the producer cannot reuse it) until mesh_chan_commit.
// False when no whole message is there; `out` may then have been written.
static __device__ __forceinline__ bool mesh_try_recv_deferred(mesh_chan* ch, void* out) {
    if (ch->msg_size == 0 || ch->producer) return false;
    const volatile uint64_t* src = mesh_chan_slot(ch, ch->mine);
    const uint32_t t = mesh_tag(ch->mine);
    uint32_t* dst = (uint32_t*)out;
    uint64_t since = 0;
    for (uint32_t i = 0; i < ch->msg_size / 4u;) {
        uint64_t a, b;
        mesh_ld_volatile_v2(src + i, &a, &b);
        if ((uint32_t)(a >> 32) == t && (uint32_t)(b >> 32) == t) {
            dst[i] = (uint32_t)a;
            dst[i + 1] = (uint32_t)b;
            i += 2;
        } else if (i == 0) {
            mesh_chan_drained(ch);
            return false;
        } else if (since == 0) {
            ch->partial++;
            since = mesh_globaltimer();
        } else if (mesh_globaltimer() - since > MESH_PARTIAL_WAIT_NS) {
            return false;
        }
    }
    ch->mine += 1;
    return true;
}

// Makes the messages received with mesh_try_recv_deferred free for the producer to reuse (published
// in batches: every half ring, when the ring drains, on mesh_chan_close).
static __device__ __forceinline__ void mesh_chan_commit(mesh_chan* ch) {
    if (ch->msg_size == 0 || ch->producer) return;
    ch->other = ch->mine;
    mesh_chan_progress(ch);
}

// Receives one message into `out` (ch->msg_size bytes, 4-byte aligned). False when the ring is empty.
static __device__ __forceinline__ bool mesh_try_recv(mesh_chan* ch, void* out) {
    if (!mesh_try_recv_deferred(ch, out)) return false;
    mesh_chan_took(ch);
    return true;
}

// --- One warp: all 32 lanes call these together, with the same channel state (each lane holds a copy
// of the mesh_chan and every lane's copy changes the same way), and the same buffer. ---

// Words each lane keeps in flight: a warp moves 32 x 32 words (4 KiB of payload) per round trip, as
// MESH_WARP_PAIRS 16-byte loads per lane.
#define MESH_WARP_LOADS 32u
#define MESH_WARP_PAIRS (MESH_WARP_LOADS / 2u)

// Message index of word `idx` of a batch: idx / words without the ~40 instructions of a division. Exact
// while idx * words < 2^32 (the error, magic * words - 2^32, is below words); batches keep idx < 2^16.
static __device__ __forceinline__ uint32_t mesh_chan_msg_of(const mesh_chan* ch, uint32_t idx) {
    return __umulhi(idx, ch->magic);
}

static __device__ __forceinline__ uint32_t mesh_warp_min(uint32_t v) {
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}

// Receives up to `max` messages into `buf` (max * msg_size bytes, 4-byte aligned, shared or global
// memory), committing them. Returns how many (the same on every lane); 0 when the ring is empty. Words of
// several small messages are loaded together, so a stream of them needs one round trip per 4 KiB; a
// message larger than 4 KiB takes one round trip per 4 KiB. How many messages a call looks at adapts:
// one after an empty poll, twice as many after a call that found all it looked at, so that a request /
// reply exchange polls one message's words and a stream grows to `max` within a few calls.
static __device__ uint32_t mesh_warp_try_recv_batch(mesh_chan* ch, void* buf, uint32_t max) {
    if (ch->msg_size == 0 || ch->producer || max == 0) return 0;
    const uint32_t lane = mesh_lane();
    const uint32_t words = ch->msg_size / 4u;  // even: messages are multiples of 8 bytes
    const uint32_t round = 32u * MESH_WARP_LOADS;
    uint32_t n = 1;
    if (words <= round) {
        n = round / words;
        if (n > max) n = max;
        if (n > ch->hint) n = ch->hint;
        const uint32_t to_end = ch->mask + 1u - (uint32_t)(ch->mine & ch->mask);  // slots are contiguous until the ring's end
        if (n > to_end) n = to_end;
    }
    const uint32_t total = n * words;
    const volatile uint64_t* src = mesh_chan_slot(ch, ch->mine);
    uint32_t* dst = (uint32_t*)buf;
    const uint32_t seq = (uint32_t)ch->mine;
    uint32_t got = n;
    // Each lane loads pairs of words with one 16-byte load (measured on the H200: 16-byte loads of
    // mapped memory reach 6x the bandwidth of 8-byte ones); each word of a pair is checked on its own,
    // since only 8 bytes arrive whole. Pair k of a lane: words base + 2 * (lane + 32k) and the next.
    for (uint32_t base = 0; base < total && got == n; base += round) {
        uint64_t a[MESH_WARP_PAIRS], b[MESH_WARP_PAIRS];
        uint32_t stale = 0;  // bit k: pair k is still to be seen with its tags
#pragma unroll
        for (uint32_t k = 0; k < MESH_WARP_PAIRS; k++)
            if (base + 2u * (lane + 32u * k) < total) stale |= 1u << k;
        uint64_t since = 0;
        for (bool first = true;; first = false) {
#pragma unroll
            for (uint32_t k = 0; k < MESH_WARP_PAIRS; k++)
                if ((stale >> k) & 1u) mesh_ld_volatile_v2(src + base + 2u * (lane + 32u * k), &a[k], &b[k]);
            if (first && base == 0) {
                // Empty? Decided on the first pair of each lane alone (it holds the first message's first
                // words), so an empty poll waits for one round trip, not for every word it asked for.
                const bool mine0 = (stale & 1u) && 2u * lane < words && (uint32_t)(a[0] >> 32) == (seq | 0x80000000u);
                if (!__any_sync(0xffffffffu, mine0)) {
                    mesh_chan_drained(ch);
                    return 0;
                }
            }
            uint32_t bad = n;  // the first message with a word missing, as this lane sees it
#pragma unroll
            for (uint32_t k = 0; k < MESH_WARP_PAIRS; k++) {
                if (!((stale >> k) & 1u)) continue;
                const uint32_t j = mesh_chan_msg_of(ch, base + 2u * (lane + 32u * k));  // both words: one message
                const uint32_t t = (seq + j) | 0x80000000u;
                if ((uint32_t)(a[k] >> 32) == t && (uint32_t)(b[k] >> 32) == t) {
                    stale &= ~(1u << k);
                } else if (j < bad) {
                    bad = j;
                }
            }
            bad = mesh_warp_min(bad);
            if (bad == n) break;  // every message of this round is whole
            if (bad > 0) {        // take the whole messages in front of the first incomplete one
                got = bad;
                break;
            }
            // The first message is on its way: wait for its other words, within a bound.
            if (since == 0) {
                ch->partial++;
                since = mesh_globaltimer();
            }
            if (__shfl_sync(0xffffffffu, mesh_globaltimer() - since > MESH_PARTIAL_WAIT_NS, 0)) return 0;
        }
#pragma unroll
        for (uint32_t k = 0; k < MESH_WARP_PAIRS; k++) {
            const uint32_t idx = base + 2u * (lane + 32u * k);
            if (idx < total && mesh_chan_msg_of(ch, idx) < got) {
                dst[idx] = (uint32_t)a[k];
                dst[idx + 1] = (uint32_t)b[k];
            }
        }
    }
    __syncwarp();
    ch->hint = got == n ? 2u * n : got;
    ch->mine += got;
    mesh_chan_took(ch);
    return got;
}

// 16-byte loads per lane on mesh_warp_try_recv's short path: messages up to 64 x this many wire words
// (MESH_LEAN_PAIRS 4: 1 KiB) take it. 16 bytes, not 8: one 8-byte load per word measured the same or
// slower at every size in both modes (session 19, an H100, `rt-ab`, the same registers), although the
// raw LL probe had been faster with 8-byte loads (session 18).
#ifndef MESH_LEAN_PAIRS
#define MESH_LEAN_PAIRS 4u
#endif

// The phase lock of mesh_warp_try_recv (issue 24 item 1, session 17). One warp has one poll of host
// memory in flight at a time (~1.3-1.5 us of PCIe each on the H200). In a request / reply exchange the
// poll issued right after a reply reaches the host before the client has even seen that reply, comes
// back empty, and the next request waits for the poll after it: one whole poll per round trip lost
// (the kit's timeline: 0.5-1 empty poll a message from 64 B up; the same loop at the right phase is
// 1.6-1.7 us against the raw word's 2.3). So after a message the receive may issue no poll until a
// learned wait has passed, learnt from the first poll after the wait: the next message already there (a
// hit: MESH_PHASE_DOWN clocks less next time, so that a stream, every poll a hit, comes down to no
// wait), exactly one empty poll before it (just missed: MESH_PHASE_UP more, up to MESH_PHASE_MAX), or
// several (a client slower than a poll: the wait stays).
// Whether to wait at all is measured, not assumed: a wait that helps one client at one size can cost
// another a poll (a slower client, or a large message whose poll at the edge meets the host still
// writing it: session 17, up to +1.1 us at 256 B with a client taking 300 ns). Messages are taken in
// trials of MESH_PHASE_TRIAL (32: one message a lane); of every 16 trials the first runs without the
// wait and the second with it, each scored by the sum of the clocks between its messages, each gap
// capped at twice the trial's median, and the other 14 run as the cheaper way has done (a running
// mean of those scores, the newest weighing 1/4: one pair of trials alone is noise). Capped: a
// host client's own hiccups (a 20 us outlier in 32 messages) swamped the plain sums in session 18's
// call 1 (trials of one client differing by 20% where the lock's effect was 5%). Summed, not the
// median alone: with the wait a slow client's gaps split in two modes (call 2: the locked trials'
// median 5,500 clocks against 7,100 without, their sums equal), and the median picked the wait
// for clients it did not help. A call inside the wait returns false without loading anything (a
// message may be there: try_recv's false means "not now"). Clocks are the SM's (clock64: its rate is
// the SM clock's, which a one-warp kernel may not drive to boost: ~1 per ns in session 18's calls).
// It applies only where it can pay: the consumer end of a host channel, messages of up to 1 KiB (the
// short path); device channels and larger messages poll on every call whatever MESH_PHASE_LOCK says.
// Measured (BENCHMARKS.md, sessions 17 and 18, an H100, `mesh-gpu-bench rt-ab` beside the same loop
// without it, medians): a host client that answers at once gets 8 / 64 / 256 B in 2.0-2.1 / 2.1-2.2 /
// 2.25-2.35 us instead of 2.7-3.0 / 2.7-2.9 / 2.6-2.8 (0.69-0.86x, four calls, both modes; 1 KiB
// within +-0.3 us). A slower client can lose: at 700 ns between reply and request 64 B +0.5 us and 1 KiB
// +0.2-0.5 (256 B 0.7 us faster), at 3 us 8-256 B +0.3-0.6 us; no scoring of the trials tried (summed
// gaps, the median, capped sums with a running mean) removed that. A build with it also slows its
// device channels, which never wait: ping <-> echo 0.05-0.08 us at 8-256 B and 0.33 us at 1 KiB
// (ptxas: echo_header 160 registers against 138). And a client whose time between reply and request
// varies (session 19, drawn from 0-1.5 us for each request, H100 and H200, both modes) loses 6-9% at
// 8-256 B. So it is off by default (a poll on every call): define MESH_PHASE_LOCK 1 before including
// mesh.cuh in a program whose host clients answer at once.
#ifndef MESH_PHASE_UP
#define MESH_PHASE_UP 200u
#endif
#ifndef MESH_PHASE_DOWN
#define MESH_PHASE_DOWN 20u
#endif
#ifndef MESH_PHASE_MAX
#define MESH_PHASE_MAX 3000u
#endif
#define MESH_PHASE_TRIAL 32u  // one gap a lane: the trial's median is a warp sort
#define MESH_PHASE_CLIP 40000u

#ifndef MESH_HOST_EMULATION
// This SM's clock (cycles).
static __device__ __forceinline__ uint64_t mesh_clock(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    return t;
}
#endif

// Lane 0's clock on every lane, so that the warp agrees on it.
static __device__ __forceinline__ uint64_t mesh_warp_clock(void) {
    return __shfl_sync(0xffffffffu, mesh_clock(), 0);
}

// The median of one value a lane (the upper of the middle two), on every lane: a bitonic sort over
// the warp's shuffles (15 of them, once a trial).
static __device__ __forceinline__ uint32_t mesh_warp_median(uint32_t v) {
    const uint32_t lane = mesh_lane();
#pragma unroll
    for (uint32_t k = 2; k <= 32u; k <<= 1)
#pragma unroll
        for (uint32_t j = k >> 1; j > 0; j >>= 1) {
            const uint32_t o = __shfl_xor_sync(0xffffffffu, v, j);
            const bool keep_min = ((lane & j) == 0) == ((lane & k) == 0);  // ascending where lane & k is 0
            v = keep_min ? (o < v ? o : v) : (o > v ? o : v);
        }
    return __shfl_sync(0xffffffffu, v, 16);
}

// Whether the current trial waits: the second of every 16 does, and the other 14 when the last trial
// with the wait have cost fewer clocks (capped gaps summed, a running mean) than those without.
#ifndef MESH_PHASE_CHOOSE
#define MESH_PHASE_CHOOSE 1  // 0: every trial waits (a measurement knob: echo_x_phasealways.cu)
#endif
static __device__ __forceinline__ bool mesh_phase_on(const mesh_chan* ch) {
    if (!MESH_PHASE_CHOOSE) return true;
    const uint32_t t = (ch->trial / MESH_PHASE_TRIAL) % 16u;
    return t == 1u || (t > 1u && ch->cost_lock < ch->cost_free);
}

// True while the phase lock's wait runs.
static __device__ __forceinline__ bool mesh_phase_waiting(const mesh_chan* ch) {
    if (!ch->lock || ch->wait == 0 || !mesh_phase_on(ch)) return false;
    return mesh_warp_clock() < ch->due;
}

// A message was taken: score the trial, learn the wait from the polls since the last message (only
// while waiting: a free poll says nothing about it), and start the next wait.
static __device__ __forceinline__ void mesh_phase_took(mesh_chan* ch) {
    if (!ch->lock) return;
    const uint64_t now = mesh_warp_clock();
    const bool on = mesh_phase_on(ch);
    if (mesh_lane() == ch->trial % MESH_PHASE_TRIAL)  // the first message of all has no gap: 0, one low value
        ch->gap = ch->trial == 0 ? 0u : now - ch->last < MESH_PHASE_CLIP ? (uint32_t)(now - ch->last) : MESH_PHASE_CLIP;
    if (on) {
        if (ch->empties == 0) ch->wait = ch->wait > MESH_PHASE_DOWN ? ch->wait - MESH_PHASE_DOWN : 0u;
        else if (ch->empties == 1)
            ch->wait = ch->wait + MESH_PHASE_UP < MESH_PHASE_MAX ? ch->wait + MESH_PHASE_UP : MESH_PHASE_MAX;
    }
    ch->empties = 0;
    ch->last = now;
    if (++ch->trial % MESH_PHASE_TRIAL == 0) {  // a trial ends: keep the probes' scores
        const uint32_t t = (ch->trial / MESH_PHASE_TRIAL - 1u) % 16u;
        if (t <= 1u) {
            const uint32_t cap = 2u * mesh_warp_median(ch->gap);
            uint32_t sum = ch->gap < cap ? ch->gap : cap;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            uint32_t* cost = t == 0u ? &ch->cost_free : &ch->cost_lock;  // a running mean over four probes
            *cost = *cost == 0u ? sum : (3u * *cost + sum) / 4u;
        }
    }
    ch->due = now + ch->wait;
}

// The short path, with the phase lock's steps where `locked` (a constant at each call: the path
// without them is the same code as a build without MESH_PHASE_LOCK).
static __device__ __forceinline__ bool mesh_warp_recv_lean(mesh_chan* ch, void* buf, uint32_t words, bool locked) {
    if (locked && mesh_phase_waiting(ch)) return false;
    const uint32_t lane = mesh_lane(), t = mesh_tag(ch->mine);
    const volatile uint64_t* src = mesh_chan_slot(ch, ch->mine);
    uint64_t a[MESH_LEAN_PAIRS], b[MESH_LEAN_PAIRS];
#pragma unroll
    for (uint32_t k = 0; k < MESH_LEAN_PAIRS; k++) {
        a[k] = b[k] = 0;
        if (2u * (lane + 32u * k) < words) mesh_ld_volatile_v2(src + 2u * (lane + 32u * k), &a[k], &b[k]);
    }
    bool whole = true;
#pragma unroll
    for (uint32_t k = 0; k < MESH_LEAN_PAIRS; k++)
        if (2u * (lane + 32u * k) < words) whole &= (uint32_t)(a[k] >> 32) == t && (uint32_t)(b[k] >> 32) == t;
    if (!__all_sync(0xffffffffu, whole)) {
        if (__shfl_sync(0xffffffffu, (uint32_t)(a[0] >> 32) == t, 0)) ch->partial++;  // word 0 is there: half-arrived
        else mesh_chan_drained(ch);                                                  // nothing yet
        if (locked) ch->empties++;
        return false;
    }
    uint32_t* dst = (uint32_t*)buf;
#pragma unroll
    for (uint32_t k = 0; k < MESH_LEAN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        if (idx < words) {
            dst[idx] = (uint32_t)a[k];
            dst[idx + 1u] = (uint32_t)b[k];
        }
    }
    __syncwarp();
    ch->mine += 1;
    mesh_chan_took(ch);
    if (locked) mesh_phase_took(ch);
    return true;
}

// Receives one message into `buf` (msg_size bytes). True on every lane when one arrived; false when
// none has, or while the phase lock waits (above).
// A message of up to 1 KiB (MESH_LEAN_PAIRS 16-byte loads per lane, all issued before any is looked
// at) takes the short path: predicated loads, one vote, and a half-arrived message is simply polled
// again on the next call. On the H200 (session 5, device channels, ping <-> echo) it halved the round
// trip: 8 / 64 / 256 B 1.08 / 1.11 / 1.14 us against 2.21 / 2.25 / 2.31 us through the batch path,
// whose unrolled 16-pair setup, min-reduction and partial wait cost as much as a load of GPU memory.
// Larger messages take the batch path. Ordering as in the batch path: a word with the right tag is
// that message's word (8-byte single-copy atomicity), the vote covers every word, and the tail store
// (mesh_chan_progress) comes after the vote that consumed the loaded values.
static __device__ __forceinline__ bool mesh_warp_try_recv(mesh_chan* ch, void* buf) {
    const uint32_t words = ch->msg_size / 4u;  // wire words (8 B), 4 payload bytes each; even
    if (words > 64u * MESH_LEAN_PAIRS) return mesh_warp_try_recv_batch(ch, buf, 1) == 1;  // never waits
    if (words == 0 || ch->producer) return false;
    // Two copies of the short path, so that a channel the lock does not apply to (a device channel)
    // runs the code it runs without MESH_PHASE_LOCK. Session 18, a lock build's ping <-> echo on device
    // channels: one path with the steps skipped at run time 0.1 us slower at 8-256 B and 0.36 us at 1
    // KiB; two copies 0.05-0.08 and 0.33 (what is left is the kernel's registers, 160 against 138).
    if (MESH_PHASE_LOCK && ch->lock) return mesh_warp_recv_lean(ch, buf, words, true);
    return mesh_warp_recv_lean(ch, buf, words, false);
}

// Sends up to `count` messages from `buf` (count * msg_size bytes, 4-byte aligned), as many as there is
// room for; returns how many (the same on every lane). Stores only: nothing waits for PCIe.
static __device__ uint32_t mesh_warp_try_send_batch(mesh_chan* ch, const void* buf, uint32_t count) {
    uint32_t room = __shfl_sync(0xffffffffu, mesh_chan_room(ch), 0);
    ch->other = __shfl_sync(0xffffffffu, ch->other, 0);
    const uint32_t words = ch->msg_size / 4u;
    uint32_t n = count < room ? count : room;
    if (n * (uint64_t)words > 65536u) n = 65536u / words;  // see mesh_chan_msg_of
    const uint32_t* src = (const uint32_t*)buf;
    // Pairs of words, one 16-byte store each (a pair never straddles two messages: words is even).
    for (uint32_t idx = 2u * mesh_lane(); idx < n * words; idx += 64u) {
        const uint32_t j = mesh_chan_msg_of(ch, idx);
        const uint64_t seq = ch->mine + j;
        const uint64_t t = (uint64_t)mesh_tag(seq) << 32;
        mesh_st_volatile_v2(mesh_chan_slot(ch, seq) + (idx - j * words), t | src[idx], t | src[idx + 1]);
    }
    ch->mine += n;
    if (n) mesh_chan_progress(ch);
    return n;
}

// Sends one message from `buf` (msg_size bytes). False on every lane when the ring is full. Stores
// only, 16 bytes per lane per store: nothing waits for PCIe.
static __device__ __forceinline__ bool mesh_warp_try_send(mesh_chan* ch, const void* buf) {
    if (ch->msg_size == 0 || !ch->producer) return false;
    // Every lane reads the same tail (one request) when the ring looks full, so they agree; with
    // credit cached, one compare (no call).
    if (ch->mine - ch->other > ch->mask && mesh_chan_room(ch) == 0) return false;
    const uint32_t words = ch->msg_size / 4u;
    volatile uint64_t* dst = mesh_chan_slot(ch, ch->mine);
    const uint64_t t = (uint64_t)mesh_tag(ch->mine) << 32;
    const uint32_t* src = (const uint32_t*)buf;
    for (uint32_t idx = 2u * mesh_lane(); idx < words; idx += 64u) mesh_st_volatile_v2(dst + idx, t | src[idx], t | src[idx + 1]);
    ch->mine += 1;
    mesh_chan_progress(ch);
    return true;
}

// ---- Lowest host round trip: the poll stream ---------------------------------------------------
// One warp polling a host ring misses a request that lands just after its poll by a whole empty poll
// (~1.4 us of PCIe on the H200). The poll stream (docs/design/speed.md, issue 24 item 1) has
// MESH_POLLERS warps poll the input ring MESH_POLL_SPACING_NS apart, so that a poll reaches the host
// soon after any moment a request lands (a lost race costs ~MESH_POLL_SPACING_NS), and warp 0, the
// server, never loads host memory: it arms the pollers, takes what the first of them caught, sends it
// and checks the stop. Measured on an H200 (tests/probes/run-kit.sh pollers, host round trip through
// mesh-shm's client, one run): MESH_POLLERS 2, 300 ns: 2.45 / 2.54 / 2.56 / 3.57 us at 8 / 64 / 256 /
// 1024 B, against the one-warp echo above (echo_header, session 5, before its short-path receive:
// session 8 measured it at 2.71 / 2.76 / 2.77 / 2.84 us) 2.26 / 3.60 / 3.73 / 3.98 us and the raw
// mapped word 2.51 us in the same run; 1 poller: 2.49 / 2.55 / 2.56 / 4.49; 4 pollers at 300 ns:
// 3.07 / 2.69 / 2.66 / 3.66; 8 worse. Hence the defaults 2 and 300 ns (override with -D).
// Worth it only for a client that sends its next request the instant a reply lands, and messages up to
// 64 B: session 19 (H200, `rt-ab`, beside the one-warp loop in the same turns) 2.63 / 2.46 us at 8 / 64
// B against 3.04 / 2.87, but 3.24 against 2.77 at 256 B; and with a client whose time between reply and
// request varies over 0-1.5 us it is slower at every size (8-256 B +7-18%, 4 KiB +28-37%): its polls
// then land no sooner after a request than one warp's, and its hand-off adds to every message. It
// costs MESH_POLLERS + 1 warps of one block.
//
// The loop to write (tests/programs/echo_poll.cu is this program; meshd: `--block 96`, i.e.
// 32 * (MESH_POLLERS + 1) threads; a smaller block exits with code 2):
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         __shared__ mesh_poll_box box;                     // the pollers' hand-off, one message up to 4 KiB
//         if (blockIdx.x != 0 || threadIdx.x >= 32u * (MESH_POLLERS + 1u)) return;
//         mesh_chan in = {}, out = {};
//         uint64_t beat = 0;
//         if (threadIdx.x < 32) {                           // warp 0 serves the channels
//             if (threadIdx.x == 0) beat = mesh_begin(ctx);
//             in = mesh_chan_open(ctx, 0, false);
//             out = mesh_chan_open(ctx, 1, true);
//         }
//         if (!mesh_poll_start(&box, &in, in.msg_size == out.msg_size)) {
//             if (threadIdx.x == 0) mesh_exit(ctx, blockDim.x < 32u * (MESH_POLLERS + 1u) ? 2 : 1);
//             return;
//         }
//         if (threadIdx.x >= 32) {                          // warps 1..MESH_POLLERS poll until closed
//             mesh_poll_serve(&box);
//             return;
//         }
//         for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
//             if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
//             if (mesh_chan_room(&out) > 0 && mesh_poll_try_recv(&box, &in, box.buf)) mesh_warp_try_send(&out, box.buf);
//         }
//         if (mesh_poll_stop(&box, &in, box.buf)) mesh_warp_try_send(&out, box.buf);  // a claimed message
//         mesh_chan_close(&in);                             // exact positions for the next launch
//         mesh_chan_close(&out);
//         if (threadIdx.x == 0) mesh_end(ctx);
//     }
//
// The calls:
//   * mesh_poll_start(&box, &in, ok = true): the whole block (every thread not returned), after warp 0
//     opened `in` (thread 0's copy of `in` and `ok` count); sets the box up, one __syncthreads inside.
//     False on every thread when the block is smaller than 32 * (MESH_POLLERS + 1), `in` is not an
//     open receiving channel of at most 4 KiB messages (MESH_POLL_MAX_PAIRS), or `ok` is false: then
//     nothing polls and the box is closed.
//   * mesh_poll_serve(&box): warps 1..MESH_POLLERS, whole warps; returns when the server closed the box.
//   * mesh_poll_try_recv(&box, &in, buf): warp 0, all lanes. Arms the next message (in.mine) if it is
//     not armed, and returns true when a poller handed it over: the message is then in buf (msg_size
//     bytes; pass box.buf itself to skip a copy: it then stays valid until the next call), in.mine has
//     moved past it and its slot is credited to the producer (mesh_chan_progress). Call it only when
//     the message can be handled (e.g. mesh_chan_room(&out) > 0): an armed message, once a poller
//     claimed it, must be handled, even across the stop.
//   * mesh_poll_stop(&box, &in, buf): warp 0, all lanes, after the stop; closes the claim and the
//     pollers. True when one message had been claimed: it is now in buf and the caller must still
//     handle it (send it); false otherwise. Then close the channels as usual.
// Contract (the echo's): every message taken from `in` is handled exactly once across orderly stops. A
// poller may take message p only while the server has armed p, and the server arms p only in
// mesh_poll_try_recv (so when it can handle p) and never after mesh_poll_stop; at the stop the server
// closes the claim word with a compare-and-swap, so a message is either claimed before (and handed to
// the caller by mesh_poll_stop) or left in the ring for the next launch.
//
// Memory model (PTX ISA, "Memory Consistency Model"):
//  * The ring: each 8-byte word of message p carries mesh_tag(p) in its high half and is stored whole
//    by the producer (8-byte single-copy atomicity); pollers load it with ld.volatile (a relaxed, sys
//    scope, morally strong load), so a word with the right tag is that message's word whatever order
//    the words arrive in. A poller takes the message only when every word of it has its tag (a warp
//    vote over all lanes' loads): a half-arrived message is never claimed, it is polled again.
//  * The claim (which warp consumes message p): a 64-bit word in shared memory, `claim`, never a host
//    atomic (the H200 has no host-native atomics, and none is needed: one block consumes the ring).
//    claim == 2p: p is armed, nobody has it; 2p + 1: p is claimed; MESH_POLL_CLOSED: stopping. A poller
//    that saw p whole does atomicCAS(claim, 2p, 2p + 1) from one lane: the CAS is one read-modify-write
//    of one location, so in claim's coherence order exactly one CAS expecting 2p succeeds; every other
//    warp's (and the server's closing CAS) reads a value other than 2p and fails. The values only rise
//    (2p -> 2p+1 -> 2p+2 ...) or become MESH_POLL_CLOSED, never return: no ABA, and a poller holding
//    an old 2p' can never claim a later message. So the first warp to see the message whole (first to
//    CAS) is the only one to consume it; the others drop their loads.
//  * The hand-off: the winning warp's lanes store the payload into shared `buf` (weak stores),
//    __syncwarp (orders them before lane 0's next accesses), then lane 0 st.release.cta `ready` = p + 1.
//    Every server lane spins with ld.acquire.cta on `ready`: its reads of buf after it sees p + 1 are
//    ordered after the poller's stores (release -> acquire, CTA scope: same block).
//  * Reuse of buf: the server reads buf (the copy, or the caller's send from box.buf between two calls),
//    __syncwarp, then lane 0 __threadfence_block() + atomicExch(claim, 2(p + 1)) (a release pattern);
//    the next winner's lane 0 CAS reads that value and __threadfence_block() (an acquire pattern)
//    before the __syncwarp after which its lanes store buf: the server's reads of message p happen
//    before the stores of message p + 1. After the close no poller stores buf: the only claimer of the
//    last armed message released `ready` before the server acquired it, and a closed claim is never
//    CASed, so box.buf stays the caller's after mesh_poll_stop.
//  * `armed`: the server's own flag in the box (warp 0 only): lane 0 writes it between two __syncwarp,
//    every lane reads it after the second, so the lanes agree and no read races a write.
//  * The tail (the producer's credit): published by the server only (mesh_chan_progress / flush /
//    close on its own copy of `in`), for messages whose `ready` it has acquired: the poller's loads of
//    the slot completed (their values were voted on and stored to buf) before the release of `ready`,
//    so the producer cannot reuse a slot still being read. Same reasoning as the header's LL calls.
//  * Poll timing: `next_poll` (shared, 64-bit) hands out poll times at least MESH_POLL_SPACING_NS
//    apart with a CAS loop (relaxed atomics: only the timing depends on it, not correctness).

#ifndef MESH_POLLERS
#define MESH_POLLERS 2u  // warps polling the input ring (warps 1..MESH_POLLERS; warp 0 serves)
#endif
#ifndef MESH_POLL_SPACING_NS
#define MESH_POLL_SPACING_NS 300u  // ns of %globaltimer between two polls of the stream
#endif
#ifndef MESH_POLL_MAX_PAIRS
#define MESH_POLL_MAX_PAIRS 16u  // 16-byte loads per lane per poll: 16 x 32 x 8 payload bytes = 4 KiB
#endif
#define MESH_POLL_CLOSED (~0ull)

struct mesh_poll_box {
    unsigned long long claim;      // 2p armed, 2p + 1 claimed, MESH_POLL_CLOSED stopping
    unsigned long long ready;      // p + 1 once message p's payload is in buf
    unsigned long long next_poll;  // %globaltimer of the next poll slot
    uint32_t ok;                   // mesh_poll_start's verdict
    uint32_t armed;                // the server's: claim was set to 2 * in.mine and not yet handled
    mesh_chan in;                  // the server's opened input channel, for the pollers' addresses
    uint32_t buf[32u * 2u * MESH_POLL_MAX_PAIRS];  // the message handed over (payload words)
};

#ifndef MESH_HOST_EMULATION  // (a CPU test build supplies these: crates/mesh-shm/tests/emu)
static __device__ __forceinline__ uint64_t mesh_poll_ld_relaxed(const unsigned long long* p) {
    uint64_t v;
    asm volatile("ld.relaxed.cta.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t mesh_poll_ld_acquire(const unsigned long long* p) {
    uint64_t v;
    asm volatile("ld.acquire.cta.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void mesh_poll_st_release(unsigned long long* p, uint64_t v) {
    asm volatile("st.release.cta.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
#endif  // MESH_HOST_EMULATION

// Lane 0's value on every lane.
static __device__ __forceinline__ uint64_t mesh_poll_bcast(uint64_t v) {
    return __shfl_sync(0xffffffffu, v, 0);
}

// The next poll time for this warp: at least MESH_POLL_SPACING_NS after the one handed out before, and
// never in the past (a warp that comes back late polls at once and moves the schedule to now).
static __device__ __forceinline__ uint64_t mesh_poll_take_time(mesh_poll_box* box) {
    uint64_t t = 0;
    if (mesh_lane() == 0) {
        unsigned long long cur = mesh_poll_ld_relaxed(&box->next_poll);
        for (;;) {
            const uint64_t now = mesh_globaltimer();
            t = cur < now ? now : cur;
            const unsigned long long prev =
                atomicCAS(&box->next_poll, cur, (unsigned long long)(t + MESH_POLL_SPACING_NS));
            if (prev == cur) break;
            cur = prev;
        }
    }
    return mesh_poll_bcast(t);
}

// The whole block, after warp 0 opened `in` (thread 0's `in` and `ok` are the ones used). False on
// every thread when the poll stream cannot run (block too small, `in` unusable, `ok` false).
static __device__ bool mesh_poll_start(mesh_poll_box* box, const mesh_chan* in, bool ok = true) {
    if (threadIdx.x == 0) {
        ok = ok && blockDim.x >= 32u * (MESH_POLLERS + 1u) && in->msg_size != 0 && !in->producer &&
             in->msg_size / 4u <= 32u * 2u * MESH_POLL_MAX_PAIRS;
        box->claim = ok ? 1u : MESH_POLL_CLOSED;  // 1: nothing armed yet (odd: "claimed"), nobody polls
        box->ready = 0u;
        box->next_poll = 0u;
        box->armed = 0u;
        box->in = *in;
        box->ok = ok ? 1u : 0u;
    }
    __syncthreads();  // the only block barrier: box is set up; from here warps meet only through box
    return box->ok != 0u;
}

// Warps 1..MESH_POLLERS: poll the armed message and hand it to the server when this warp claims it;
// returns once the server closed the box (mesh_poll_stop).
static __device__ void mesh_poll_serve(mesh_poll_box* box) {
    const uint32_t lane = mesh_lane();
    const mesh_chan in = box->in;  // a copy for addresses only: a poller never publishes anything
    const uint32_t words = in.msg_size / 4u;
    for (;;) {
        const uint64_t c = mesh_poll_bcast(lane == 0 ? mesh_poll_ld_relaxed(&box->claim) : 0u);
        if (c == MESH_POLL_CLOSED) return;
        if (c & 1u) continue;  // claimed: wait for the server to arm the next one
        const uint64_t p = c / 2u;
        const uint64_t at = mesh_poll_take_time(box);
        bool moved = false;
        while (mesh_globaltimer() < at)
            if ((moved = mesh_poll_bcast(lane == 0 ? mesh_poll_ld_relaxed(&box->claim) : 0u) != c)) break;
        if (moved) continue;
        // One poll: every pair of the message's words at once (MESH_POLL_MAX_PAIRS 16-byte loads per
        // lane, predicated), then one vote on all of them.
        const volatile uint64_t* src = mesh_chan_slot(&in, p);
        const uint32_t t = mesh_tag(p);
        uint64_t a[MESH_POLL_MAX_PAIRS], b[MESH_POLL_MAX_PAIRS];
#pragma unroll
        for (uint32_t k = 0; k < MESH_POLL_MAX_PAIRS; k++)
            if (2u * (lane + 32u * k) < words) mesh_ld_volatile_v2(src + 2u * (lane + 32u * k), &a[k], &b[k]);
        bool whole = true;
#pragma unroll
        for (uint32_t k = 0; k < MESH_POLL_MAX_PAIRS; k++)
            if (2u * (lane + 32u * k) < words)
                whole &= (uint32_t)(a[k] >> 32) == t && (uint32_t)(b[k] >> 32) == t;
        if (!__all_sync(0xffffffffu, whole)) continue;  // empty or half-arrived: poll again
        // The claim: one CAS in shared memory; exactly one warp reads 2p here.
        bool won = false;
        if (lane == 0) {
            won = atomicCAS(&box->claim, (unsigned long long)c, (unsigned long long)(c + 1u)) == c;
            if (won) __threadfence_block();  // acquire: the server's reads of buf's last message come first
        }
        if (!__shfl_sync(0xffffffffu, won, 0)) continue;  // another warp has it (or the server closed)
        __syncwarp();
#pragma unroll
        for (uint32_t k = 0; k < MESH_POLL_MAX_PAIRS; k++) {
            const uint32_t idx = 2u * (lane + 32u * k);
            if (idx < words) {
                box->buf[idx] = (uint32_t)a[k];
                box->buf[idx + 1u] = (uint32_t)b[k];
            }
        }
        __syncwarp();  // every lane's buf stores before lane 0's release
        if (lane == 0) mesh_poll_st_release(&box->ready, p + 1u);
    }
}

// Warp 0: message in->mine, handed over (acquired), into buf; moves in->mine past it (the caller
// counts it as consumed).
static __device__ __forceinline__ void mesh_poll_take(mesh_poll_box* box, mesh_chan* in, void* buf) {
    if ((uint32_t*)buf != box->buf) {
        uint32_t* dst = (uint32_t*)buf;
        for (uint32_t idx = mesh_lane(); idx < in->msg_size / 4u; idx += 32u) dst[idx] = box->buf[idx];
    }
    in->mine += 1;
}

// Warp 0, all lanes: arms message in->mine if it is not armed; true with it in buf (in->mine advanced;
// the tail published up to the messages earlier calls took) when a poller handed it over. Call only
// when the message can be handled.
static __device__ __forceinline__ bool mesh_poll_try_recv(mesh_poll_box* box, mesh_chan* in, void* buf) {
    const uint64_t p = in->mine;
    if (box->armed == 0u) {
        __syncwarp();  // every lane is done reading buf (the last message) and `armed`
        if (mesh_lane() == 0) {
            __threadfence_block();  // release: buf's reads before the arm
            atomicExch(&box->claim, (unsigned long long)(2u * p));
            box->armed = 1u;
        }
        __syncwarp();  // `armed` as lane 0 wrote it, for every lane
        mesh_chan_publish_waiting(in);  // as the header's receive does when it waits
    }
    if (mesh_poll_ld_acquire(&box->ready) != p + 1u) return false;  // every lane acquires it itself
    mesh_poll_take(box, in, buf);
    __syncwarp();  // every lane read `armed` (and buf, when copied) before lane 0 clears it
    if (mesh_lane() == 0) box->armed = 0u;
    __syncwarp();
    mesh_chan_took(in);
    return true;
}

// Warp 0, all lanes, after the stop: closes the claim and the pollers. True when a poller had claimed
// the armed message: it is in buf now (in->mine advanced) and must still be handled (sent).
static __device__ bool mesh_poll_stop(mesh_poll_box* box, mesh_chan* in, void* buf) {
    const uint64_t p = in->mine;
    const bool armed = box->armed != 0u;
    uint64_t was = 0;
    if (mesh_lane() == 0) was = atomicCAS(&box->claim, (unsigned long long)(2u * p), MESH_POLL_CLOSED);
    was = mesh_poll_bcast(was);
    bool got = false;
    if (armed && was == 2u * p + 1u) {  // a poller claimed p first: it is handing p over
        while (mesh_poll_ld_acquire(&box->ready) != p + 1u) {}  // bounded: the claimer holds the whole message
        mesh_poll_take(box, in, buf);
        in->other = in->mine;  // handled before mesh_chan_close, which publishes it
        got = true;
    }
    __syncwarp();  // every lane read `armed` (and buf) first
    if (mesh_lane() == 0) {
        atomicExch(&box->claim, MESH_POLL_CLOSED);  // unarmed (claim odd) or after the hand-off
        box->armed = 0u;
    }
    __syncwarp();
    return got;
}

// ---- Many clients: a service ----------------------------------------------------------------
// One program serving any number of host clients (issue 26, docs/design/many-clients.md) through two
// bindings whatever the number of clients: a fan-in channel (protocol fanin: every client sends into
// one ring, every message carries its sender's id) and a channel group (protocol group: one SPSC
// reply ring per client slot, handed out by meshd). Host side: mesh-shm's fanin.rs, group.rs and
// service.rs define the bytes; the calls below follow their rules word for word.
//
// The contract, in one place:
//   * Lanes: the 32 lanes of one warp call every call of this section, and mesh_should_stop, together
//     and converged (no lane-dependent branch around them); mesh_begin, mesh_heartbeat, mesh_end and
//     mesh_exit are lane 0's alone. Several warps serve one service each with its own part of the
//     shards and of the clients ("Many warps" below; the loop of tests/programs/service.cu).
//   * Client ids: a request's sender id is `slot | epoch << 16` (the epoch's low 16 bits). Keep
//     per-client state in an array indexed by `id & 0xffffu` (below `out.entries`, the group's client
//     slots; at most MESH_GROUP_MAX_ENTRIES with the built-in state); reset it when mesh_group_departed
//     returns the slot. meshd gives a slot to a new client (the next epoch) only after that
//     acknowledgement, but requests the departed client sent before it left may still be taken after
//     it, even once the slot has its new client: mesh_reply says GONE to them (mesh_reply_many sets
//     their bit in `dropped`). So change per-client state only for requests answered SENT (not
//     dropped), or keep the epoch (`id >> 16`) with the state and ignore other epochs.
//   * Program state across launches: `__device__` globals live in the program's module. They outlive
//     the relaunches of a blink made for another program's change; they are lost at the program's
//     own upgrade and unload, at a recovery (the context is made again and every module reloaded), at
//     a restart of meshd, and in MPS mode whenever the program's worker changes. What must outlive
//     those belongs in the mailbox (a channel, user words) or is rebuilt from it.
//
// The simplest loop, one request at a time (tests/programs/service_x_serial.cu is this program, plus a
// heartbeat and counters in user words, run on every warp of its block as "Many warps" below says:
// loaded with a block of 32 it is this loop exactly; meshd binds the fan-in first, the group second; replies here:
// the request with payload word 1 incremented, so the reply size must be the request size; with a
// different `--reply-size`, reply from a buffer of out.msg_size bytes, filled when the request is taken
// and kept unchanged while `held`, since a held reply is sent again as it was). A service
// of more than a few clients should take many requests per round trip, with several warps, instead:
// "Many requests per round trip" and "Many warps" below, the loop of tests/programs/service.cu. Measured
// on the H200 with 8 shards (BENCHMARKS.md, session 12): this loop on one warp makes 0.14 M requests/s
// whatever the clients; on 8 warps (each opening its part as "Many warps" says: service_x_serial.cu)
// it answers a lone client in 3.5 µs, faster than the batched loop's 5.0, and tops out near 3.5 M/s;
// the batched loop on 8 warps makes 6.3 M/s from 8 clients and 12.6 M/s from 16.
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         __shared__ uint32_t req[1024];                    // one message, up to 4 KiB
//         if (threadIdx.x >= 32) return;                    // one warp serves the service
//         uint64_t beat = 0;
//         if (threadIdx.x == 0) beat = mesh_begin(ctx);
//         mesh_fanin in = mesh_fanin_open(ctx, 0);          // binding 0: the requests
//         mesh_group out = mesh_group_open(ctx, 1);         // binding 1: the reply rings
//         if (in.ch.msg_size == 0 || out.msg_size != in.ch.msg_size || in.ch.msg_size > sizeof(req)) {
//             if (threadIdx.x == 0) mesh_exit(ctx, 1);      // not a fan-in and a group of one size (or
//             return;                                       // more clients than mesh_group_open serves)
//         }
//         bool held = false;                                // a request taken, its reply waiting for room
//         uint32_t client = 0;
//         for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
//             if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
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
//         if (threadIdx.x == 0) mesh_end(ctx);
//     }
//
// Why deferred: a request is committed (its fan-in slot given back, the published position moved past
// it) only once it is answered or dropped. A stop that finds a reply held for room (its client's ring
// full) then publishes the position of that request, and the next launch takes it again and answers
// it: an orderly stop (an upgrade, a blink) loses no reply and repeats none. With mesh_fanin_take
// (take and commit in one) such a request would be consumed with its reply never written. While a
// reply is held the loop serves nobody else (one slow client stalls the rest until it reads or
// leaves: its departure makes mesh_reply say GONE once acknowledged); a client that keeps at most its
// reply ring's capacity of requests in flight is never FULL. A held client that departs is seen
// through mesh_reply (GONE after mesh_group_departed acknowledged it), so the loop needs no check of
// `gone` against `client`.
//
// All 32 lanes of one warp call every function of this section together, with the same state (like
// the mesh_warp_* calls): each lane holds a copy of the mesh_fanin / mesh_group, and every lane's copy
// changes the same way. Memory model, in brief (the design's "CUDA and PTX facts"):
//   * One writer per word. The H200 has no host-native atomics, so the GPU writes exactly one word of
//     the fan-in ring (its `tail`), and of the group only each reply ring's `head` and slots (it is
//     their producer) and each entry's `acked_epoch`. It never reads the fan-in's reservation cursor
//     (`head`) or its owner table, which host producers CAS.
//   * Tags per word. PTX makes an aligned 8-byte access single-copy atomic but a 16-byte vector load
//     is two independent 8-byte ones, and the GPU's loads of host memory arrive in any order. So every
//     word the GPU consumes carries its own tag and is checked on its own, the fan-in's commit and
//     kind words included; no word's state is ever inferred from another's.
//   * Epoch and state of a group entry are one 8-byte word read with one load: two loads could pair a
//     new client's `bound` with the old client's epoch and let a stale reply reach the new client.
//   * The ack (`acked_epoch := epoch`) is a st.release.sys after the ring's exact `head` was stored:
//     meshd hands the entry (and its ring, `tail := head`) to a new client only once it sees the ack,
//     so the release must order every earlier reply and the `head` store before it. Two plain stores
//     to the system are not ordered by PTX (only fence.sc.sys or st.release.sys order them).

#ifndef MESH_PROTOCOL_FANIN
#define MESH_PROTOCOL_FANIN 3u
#endif
#ifndef MESH_PROTOCOL_GROUP
#define MESH_PROTOCOL_GROUP 4u
#endif
static_assert(MESH_PROTOCOL_FANIN == 3u && MESH_PROTOCOL_GROUP == 4u, "protocol codes disagree with mesh-shm's layout.rs");

// Fan-in slots (fanin.rs): message `seq` takes MESH_FANIN_HEADER_WORDS + msg_size / 4 tagged words:
// word 0 the commit (payload: the sender id, `slot | epoch << 16`), word 1 the kind, then the body.
#define MESH_FANIN_HEADER_WORDS 2u
#define MESH_FANIN_KIND_DATA 0u
#define MESH_FANIN_KIND_SKIP 1u
// What mesh_fanin_take found.
#define MESH_TAKE_NONE 0   // nothing whole at the position yet (empty, or still arriving)
#define MESH_TAKE_MSG 1    // a message, copied to the buffer, from *sender
#define MESH_TAKE_SKIP 2   // a slot completed by meshd as a skip: *sender's send was cut off (death or
                           // revocation); the buffer is untouched. Not a departure: see the group.

// Group (group.rs): a GroupHeader line, `entries` GroupEntry pairs of lines, then the reply rings,
// ring_stride bytes apart, each a ring header (MESH_RING_SLOTS bytes) and LL slots.
#define MESH_GROUP_ENTRIES 0u       // u32, write-once
#define MESH_GROUP_MSG_SIZE 4u      // u32, write-once
#define MESH_GROUP_CAPACITY 8u      // u32, write-once
#define MESH_GROUP_RING_STRIDE 16u  // u64, write-once
#define MESH_GROUP_CHANGES 24u      // u64, bumped by meshd (Release) on every connect and departure
#define MESH_GROUP_HEADER_SIZE 128u
#define MESH_GROUP_ENTRY_SIZE 256u
#define MESH_GROUP_ENTRY_BINDING 0u  // u64: epoch (low half) | state (high half), meshd's, ONE word
#define MESH_GROUP_ENTRY_ACKED 128u  // u32: acked_epoch, the program's only word of the table
#define MESH_GROUP_FREE 0u
#define MESH_GROUP_BOUND 1u
#define MESH_GROUP_DEPARTED 2u
// What mesh_reply did.
#define MESH_REPLY_SENT 0  // in the client's reply ring
#define MESH_REPLY_FULL 1  // the client's ring is full (a slow client): nothing written; retry or drop
#define MESH_REPLY_GONE 2  // the id is not the entry's bound client (departed, or forged): dropped

// How often, in ns of %globaltimer, mesh_group_departed reads the group's `changes` word (as
// mesh_should_stop reads the stop word: the load's value is looked at one period later, so the loop
// never waits for it). A departure is acknowledged within about two periods plus one scan.
#ifndef MESH_GROUP_PERIOD_NS
#define MESH_GROUP_PERIOD_NS 100000u
#endif
// Entries mesh_group_open(ctx, b) (and mesh_group_open_part(ctx, b, part, parts)) can serve with the
// built-in state (one mesh_reply_state each, in device memory); a larger group needs
// mesh_group_open(ctx, b, state, max) (or mesh_group_open_part(ctx, b, state, max, part, parts)) with
// the caller's array.
// Define it before including mesh.cuh to change it. The built-in array is one for the whole module,
// shared by every call of that overload: a program with two groups passes its own arrays.
#ifndef MESH_GROUP_MAX_ENTRIES
#define MESH_GROUP_MAX_ENTRIES 1024u
#endif

// --- The fan-in channel: the program is its one consumer ---

// 16-byte loads per lane per round trip of mesh_fanin_peek (17: one round trip for 32 slots of 64-byte
// requests, or one slot of a 4 KiB one).
#define MESH_FANIN_PAIRS 17u

// The consumer end of a fan-in binding. `ch` is an LL consumer (its tail publication is mesh_chan's:
// every half ring, on drain, on close) whose slots are 16 bytes longer than an LL channel's.
typedef struct {
    mesh_chan ch;       // ring, slots (the LL slots after the host-only owner table), msg_size, mask, ...
    uint32_t stride;    // bytes per slot: 16 + 2 * msg_size
    uint32_t corrupt;   // slots passed over whose kind no producer writes (report it if you like)
    uint32_t strange;   // mesh_fanin_peek: which of the requests it returned are of such a kind
    // mesh_fanin_peek's loads of the slots after the ones it returned, issued before it returns so that
    // they cross PCIe while the program answers (registers: every call on a mesh_fanin is inlined).
    uint32_t ahead_n;   // slots loaded ahead (0: none)
    uint64_t ahead_at;  // the position of the first of them
    uint64_t ahead_a[MESH_FANIN_PAIRS], ahead_b[MESH_FANIN_PAIRS];
    // Shards (`meshd service create --shards P`, P > 1; see "Shards" below): lane s < P of the warp
    // keeps shard s's words, every lane the rest. With one shard `ch` is the ring and these are unused.
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
} mesh_fanin;

// Shards. A fan-in channel created with `--shards P` (P a power of two up to MESH_FANIN_MAX_SHARDS) is
// P whole fan-in rings, each with its own reservation cursor, tail and slots, and a client always
// sends into shard (its slot % P): P times fewer senders contend for each cursor (on the H200
// machine's 16 CPUs one ring takes 2-3 M sends/s from any number of clients; two rings about twice
// that). The program sees one channel: every call below takes from every shard, and a peek looks at
// all of them in its one round trip (each shard's slots, as many as its hint wants and the round
// holds, a fair share each first, the shard served first turning by one each call). The batch lists
// each shard's whole requests at its front, shard after shard; mesh_fanin_consume(n) gives back the
// first n, which are a front of each shard's. Requests keep their order per client (one shard each),
// and none between clients, as with one ring. Lane s keeps shard s's position, so a sharded fan-in
// is opened and used by a whole warp (as every call here is anyway), and one warp's end serves at most
// MESH_FANIN_WARP_SHARDS (32) shards: a channel of more is served by several warps, each its part of
// the shards (mesh_fanin_open_part, "Many warps" below), and mesh_fanin_open alone refuses it. Requests
// above about 4 KiB (a slot larger than one round trip's loads) are taken one shard per call, turning.
// The format (mesh-shm's layout.rs, `fanin_shard_offset`): shard 0 is the one-ring format (the
// binding's ring header and `slots`); shard k >= 1's ring header starts MESH_BULK_ALIGN-aligned at
// span + (k - 1) x (MESH_BULK_ALIGN + span) from the region that starts the owner table before `slots`
// (span: the page-rounded bytes of owner table and slots of one ring), its owner table one page after
// it, its slots after that as in shard 0. The binding's protocol word carries P above
// MESH_BULK_PARTS_SHIFT.
#define MESH_FANIN_WARP_SHARDS 32u

// The shards of binding `b` when it is a fan-in binding these calls can serve (a host channel of
// protocol fanin, of 1 to MESH_FANIN_MAX_SHARDS shards, a power of two, and a valid size and capacity),
// else 0.
static __device__ __forceinline__ uint32_t mesh_fanin_shards_of(const mesh_ctx& c, uint32_t b) {
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return 0u;
    const mesh_binding& d = c.bindings[b];
    const uint32_t shards = (d.protocol >> MESH_BULK_PARTS_SHIFT) == 0u ? 1u : d.protocol >> MESH_BULK_PARTS_SHIFT;
    if ((d.protocol & ((1u << MESH_BULK_PARTS_SHIFT) - 1u)) != MESH_PROTOCOL_FANIN || shards > MESH_FANIN_MAX_SHARDS ||
        (shards & (shards - 1u)) != 0u || d.placement != MESH_PLACEMENT_HOST || d.msg_size == 0 || d.msg_size % 8u != 0 ||
        d.capacity == 0 || (d.capacity & (d.capacity - 1u)) != 0)
        return 0u;
    return shards;
}

// Shard k's ring header and LL slots in fan-in binding `d` (the format: "Shards" above).
static __device__ __forceinline__ void mesh_fanin_shard_at(const mesh_ctx& c, const mesh_binding& d, uint32_t k, char** ring,
                                                           char** slots) {
    char* const slots0 = (char*)(uintptr_t)d.slots;
    if (k == 0u) {
        *ring = mesh_at(c, d.ring_offset);
        *slots = slots0;
        return;
    }
    const uint64_t align = MESH_BULK_ALIGN;
    const uint64_t owners = ((uint64_t)8u * d.capacity + align - 1u) / align * align;
    const uint64_t span = (owners + (16u + 2u * (uint64_t)d.msg_size) * d.capacity + align - 1u) / align * align;
    *ring = slots0 - owners + span + (uint64_t)(k - 1u) * (align + span);
    *slots = *ring + align + owners;
}

// Many warps (see "Many warps" below): how many warps of `warps` serve the fan-in at binding `b`, one
// part each: the largest power of two at most `warps` and at most its shards (1 without shards), so
// that it divides the shards. The rest of the block's warps have nothing to take. A channel of more
// than MESH_FANIN_WARP_SHARDS shards needs at least shards / 32 warps (fewer: their ends' msg_size is 0).
static __device__ __forceinline__ uint32_t mesh_fanin_parts(const mesh_ctx& c, uint32_t b, uint32_t warps) {
    const uint32_t shards = mesh_fanin_shards_of(c, b);
    uint32_t parts = 1u;
    while (parts * 2u <= warps && parts * 2u <= shards) parts *= 2u;
    return parts;
}

// Opens binding `b` as warp `part` of `parts` serving it (parts from mesh_fanin_parts, the same for every
// warp): this warp's end takes from shards part, part + parts, ... alone (shards / parts of them; with
// one, it is a one-ring end over that shard), hence the requests of the clients whose slot % parts ==
// part, whose replies and departures mesh_group_open_part(ctx, 1, part, parts) gives the same warp.
// Binding `b` must be a host channel of protocol fanin (mesh-shm points its `slots` at the LL slots,
// past the owner table the GPU never reads). Otherwise, or for a part that does not divide the shards
// evenly or would serve more than MESH_FANIN_WARP_SHARDS of them, the end's ch.msg_size is 0 and every
// take finds nothing. Each of its shards resumes at its published tail (after a crash: at-least-once,
// as every consumer): lane i reads shard part + i x parts's, the one writer of that word.
static __device__ __forceinline__ mesh_fanin mesh_fanin_open_part(const mesh_ctx& c, uint32_t b, uint32_t part, uint32_t parts) {
    mesh_fanin f = {{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, false}, 0, 0, 0};
    f.shards = 1u;
    const uint32_t shards = mesh_fanin_shards_of(c, b);
    if (shards == 0u || parts == 0u || (parts & (parts - 1u)) != 0u || part >= parts || shards % parts != 0u ||
        shards / parts > MESH_FANIN_WARP_SHARDS)
        return f;
    const mesh_binding& d = c.bindings[b];
    const uint32_t mine = shards / parts, lane = mesh_lane(), full = 0xffffffffu;
    f.stride = 16u + 2u * d.msg_size;
    if (lane < mine) {
        mesh_fanin_shard_at(c, d, part + lane * parts, &f.s_ring, &f.s_slots);
        f.s_mine = f.s_done = f.s_published = mesh_ld_volatile_u64(f.s_ring + MESH_RING_TAIL);
    }
    // `ch` is the one-ring end over this warp's first shard (the only one when mine is 1; with more,
    // the shard calls keep their positions in the lanes and use `ch` for its size and counters).
    f.ch.ring = (char*)__shfl_sync(full, (unsigned long long)f.s_ring, 0);
    f.ch.slots = (char*)__shfl_sync(full, (unsigned long long)f.s_slots, 0);
    f.ch.mine = f.ch.other = f.ch.published = __shfl_sync(full, (unsigned long long)f.s_published, 0);
    f.ch.msg_size = d.msg_size;
    f.ch.mask = d.capacity - 1u;
    f.shards = mine;
    return f;
}

// Opens binding `b` for one warp serving every shard (at most MESH_FANIN_WARP_SHARDS of them): the end
// of mesh_fanin_open_part(c, b, 0, 1).
static __device__ __forceinline__ mesh_fanin mesh_fanin_open(const mesh_ctx& c, uint32_t b) {
    return mesh_fanin_open_part(c, b, 0u, 1u);
}

// Polls the slot at the fan-in's position once (one round trip: each lane loads its pairs of words,
// with 16-byte loads, all issued before any is used) and takes it when it is whole:
//   word 0 not tagged for this position: MESH_TAKE_NONE (empty; the tail is published, as on drain);
//   word 1 tagged and SKIP: MESH_TAKE_SKIP, *sender = word 0's payload, whatever the body holds;
//   word 1 tagged and DATA and every body word tagged: MESH_TAKE_MSG, body copied to `buf`;
//   anything else: still arriving, MESH_TAKE_NONE (the next call polls again; `buf` may be written).
// Every word is judged by its own tag (the loads are unordered; word 0 may arrive before the body).
// `buf`: msg_size bytes, 4-byte aligned, shared or global memory. Same result on every lane.
// Deferred: the slot taken (MSG or SKIP) stays the program's, and the published position does not pass
// it, until mesh_fanin_commit; the next take reads the slot after it. A launch that stops before
// the commit leaves the slot to the next launch, which takes it again (the loop at the top of this
// section holds a request so while its reply waits for room). A sharded fan-in takes the first whole
// request it finds in one round trip over every shard, the shard it looks at first turning by one a
// call (so no client of one shard starves the others).
static __device__ __forceinline__ int mesh_fanin_take_deferred(mesh_fanin* f, void* buf, uint32_t* sender);

// Publishes each shard's given-back position (lane s, shard s's tail word) when it is `force`d and has
// moved, or has moved half a ring: as mesh_chan_flush / mesh_chan_progress do for one ring.
static __device__ __forceinline__ void mesh_fanin_shard_publish(mesh_fanin* f, bool force) {
    const uint64_t half = (f->ch.mask + 1u) / 2u;
    if (mesh_lane() < f->shards && f->s_done != f->s_published &&
        (force || f->s_done - f->s_published >= (half ? half : 1u))) {
        mesh_st_volatile_u64(f->s_ring + MESH_RING_TAIL, f->s_done);
        f->s_published = f->s_done;
    }
}

// One ring's take (mesh_fanin_take_deferred over `ch`).
static __device__ __forceinline__ int mesh_fanin_take_ring(mesh_fanin* f, void* buf, uint32_t* sender) {
    mesh_chan* ch = &f->ch;
    if (ch->msg_size == 0) return MESH_TAKE_NONE;
    const uint32_t lane = mesh_lane();
    const uint32_t words = MESH_FANIN_HEADER_WORDS + ch->msg_size / 4u;  // even: msg_size is a multiple of 8
    const uint32_t t = mesh_tag(ch->mine);
    const volatile uint64_t* src = (const volatile uint64_t*)(ch->slots + (ch->mine & ch->mask) * (uint64_t)f->stride);
    uint32_t* dst = (uint32_t*)buf;
    // Lane 0's first pair is words 0 and 1 (commit and kind); every other pair is body.
    uint64_t w0 = 0, w1 = 0;
    bool whole = true;
    for (uint32_t idx = 2u * lane; idx < words; idx += 64u) {
        uint64_t a, b;
        mesh_ld_volatile_v2(src + idx, &a, &b);
        if (idx == 0) {
            w0 = a;
            w1 = b;
            continue;
        }
        whole &= (uint32_t)(a >> 32) == t && (uint32_t)(b >> 32) == t;
        dst[idx - 2u] = (uint32_t)a;
        dst[idx - 1u] = (uint32_t)b;
    }
    w0 = __shfl_sync(0xffffffffu, w0, 0);
    w1 = __shfl_sync(0xffffffffu, w1, 0);
    if ((uint32_t)(w0 >> 32) != t) {
        mesh_chan_drained(ch);
        return MESH_TAKE_NONE;
    }
    if ((uint32_t)(w1 >> 32) != t) {
        ch->partial++;
        return MESH_TAKE_NONE;
    }
    const uint32_t kind = (uint32_t)w1;
    int took = MESH_TAKE_SKIP;
    if (kind == MESH_FANIN_KIND_DATA) {
        if (!__all_sync(0xffffffffu, whole)) {
            ch->partial++;
            return MESH_TAKE_NONE;
        }
        took = MESH_TAKE_MSG;
    } else if (kind != MESH_FANIN_KIND_SKIP) {
        f->corrupt++;  // no producer or completer writes it: passed over like a skip, and counted
    }
    *sender = (uint32_t)w0;
    __syncwarp();  // every lane's copy is in buf before any lane uses it
    ch->mine += 1;
    return took;
}

// Gives back every slot taken with mesh_fanin_take_deferred so far: the producers may reuse them once
// the position is published (a plain store from one lane: every half ring, on an empty poll, and on
// mesh_fanin_close). Every lane together.
static __device__ __forceinline__ void mesh_fanin_commit(mesh_fanin* f) {
    mesh_chan* ch = &f->ch;
    if (ch->msg_size == 0) return;
    if (f->shards > 1u) {
        if (mesh_lane() < f->shards) f->s_done = f->s_mine;
        mesh_fanin_shard_publish(f, false);
        return;
    }
    ch->other = ch->mine;
    mesh_chan_progress(ch);
}

// mesh_fanin_take_deferred and mesh_fanin_commit in one: the slot is given back as it is taken. For a
// program that can always answer at once (or drops what it cannot answer); one that may hold a request
// (a reply waiting for room) takes it deferred, as the loop at the top of this section does.
// As mesh_chan_took: what earlier takes took is published (every half ring) before this one counts
// as given back, so that a launch dying before it answered this request takes it again (at-least-once).
static __device__ __forceinline__ int mesh_fanin_take(mesh_fanin* f, void* buf, uint32_t* sender) {
    const int took = mesh_fanin_take_deferred(f, buf, sender);
    if (took == MESH_TAKE_NONE || f->ch.msg_size == 0) return took;
    if (f->shards > 1u) {
        mesh_fanin_shard_publish(f, false);
        if (mesh_lane() < f->shards) f->s_done = f->s_mine;
    } else {
        mesh_chan_took(&f->ch);
    }
    return took;
}

// Publishes the fan-in's exact position (its tail: every slot committed, none taken deferred and not
// committed); call it before mesh_end.
static __device__ __forceinline__ void mesh_fanin_close(mesh_fanin* f) {
    if (f->ch.msg_size != 0 && f->shards > 1u) mesh_fanin_shard_publish(f, true);
    else mesh_chan_flush(&f->ch);
}

// --- Many requests per round trip: mesh_fanin_peek, mesh_reply_many, mesh_fanin_consume ---
//
// The loop above takes one request per PCIe round trip (about 2 µs on the H200): about 450,000
// requests a second whatever the number of clients. A service of many clients takes every request
// that has arrived at once instead, answers them in parallel, one lane per request, and gives their
// slots back together; and it serves with several warps, each its own part of the fan-in's shards
// and of the clients, so that one warp's peek (a PCIe round trip) overlaps the others' replies. Create
// the service with `--shards 8` and load the program with `--block 256` (tests/programs/service.cu is
// this loop with counters; the header's loop above is its one-at-a-time form):
//
//     extern "C" __global__ void mesh_main(mesh_ctx ctx) {
//         constexpr uint32_t most = 8;                      // warps serving at most
//         __shared__ uint32_t reqs[most][MESH_FANIN_BATCH_MAX * 16];  // a warp's 32 requests of 64 bytes
//         __shared__ uint32_t from[most][MESH_FANIN_BATCH_MAX];       // their senders
//         const uint32_t w = threadIdx.x / 32u, lane = threadIdx.x % 32u;
//         const uint32_t warps = blockDim.x / 32u < most ? blockDim.x / 32u : most;
//         const uint32_t parts = mesh_fanin_parts(ctx, 0, warps);  // warps that serve: a power of two
//         uint64_t beat = 0;
//         if (threadIdx.x == 0) beat = mesh_begin(ctx);
//         bool ok = true;
//         if (w < parts) {                                  // the other warps have nothing to take
//             mesh_fanin in = mesh_fanin_open_part(ctx, 0, w, parts);   // shards w, w + parts, ...
//             mesh_group out = mesh_group_open_part(ctx, 1, w, parts);  // their clients' reply rings
//             ok = in.ch.msg_size == 64 && out.msg_size == 64;          // a fan-in and a group of 64 B
//             for (uint32_t i = 0; ok && !mesh_should_stop(ctx); i++) {
//                 if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);
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
//         __syncthreads();                                      // every warp closed
//         if (threadIdx.x == 0) {
//             if (ok) mesh_end(ctx);
//             else mesh_exit(ctx, 1);
//         }
//     }
//
// mesh_fanin_peek copies the whole requests at the fan-in's position (up to `max`, in order) without
// taking them; mesh_reply_many answers a prefix of them, [0, done): every one unless a client's reply
// ring is full, in which case it stops at that client's first request that found no room, and sends
// nothing after it; mesh_fanin_consume gives back the prefix. The rest are peeked again by the next
// call, from the mailbox, as they came (so `f` is applied to a fresh copy). A request at or after
// `done` has had `f` applied and will have it applied again: `f` may compute replies, but must not
// change program state until its request is answered. Compute into the reply buffer, then, after
// mesh_reply_many, commit the state of the requests j < done whose bit is clear in `skipped | dropped`
// (an idempotent change, a plain put, may be made early). Lane j per request suits requests that are
// independent of each other: the requests of one batch are in fan-in order, several may come from one
// client (in its order) or touch one key, so a program with shared state applies them in batch order
// (one lane, j = 0 .. n - 1) or combines each client's requests (__match_any_sync on from[j]). With a
// reply size other than the request size, replies go in a buffer of their own: mesh_reply_many reads
// reply j at `msgs + j * out.msg_size` (the group's size), and the peek writes request j at
// `buf + j * in.ch.msg_size`. A stop publishes the
// consumed position, so the next launch answers exactly the requests this one did not: an orderly
// stop loses no reply and repeats none, as with the deferred take. As in the loop above, a client
// whose ring stays full stalls the requests behind its own until it reads or leaves.
//
// Many warps. A client's requests go to shard (its slot % P) of a fan-in of P shards, and its replies to
// its own ring: warp `part` of `parts` (a power of two dividing P, mesh_fanin_parts) opens the fan-in
// with mesh_fanin_open_part (shards part, part + parts, ...) and the group with mesh_group_open_part
// (the entries e with e % parts == part), so each client is one warp's: its requests, its replies and
// its departure, with one writer for every reply ring and every entry's state (warps share the
// built-in state array, each touching its own entries). A departure acknowledged by another warp could
// hand the ring to a new client while the client's warp still answers the old one: so each warp calls
// mesh_group_departed on its own group. The warps stop each at its own mesh_should_stop; thread 0 ends
// the program after a __syncthreads, so that every warp's close has published its positions. With one
// shard (or a block of 32) one warp serves everything, as the one-warp loops above. The warps of
// several blocks serve the same way (`meshd load --grid G`): warp w of block b is part b x W + w of
// mesh_fanin_parts(ctx, 0, G x W); block 0's thread 0 begins and beats, and the block that finishes
// last (a device-memory counter, atomicAdd after a __threadfence) ends the program, every warp of the
// grid having closed (tests/programs/service.cu and service_x_serial.cu). `--shards 32 --grid 4
// --block 256` gives 32 warps a shard each, `--shards 64 --grid 8` 64 (a warp's end holds 32 shards at
// most, so 64 shards need two serving warps or more). Measured on the H200 (BENCHMARKS.md, session 12:
// 8 shards, blink): 8 warps against one, a lone client 0.80 against 0.49 M requests/s, 16 clients 12.5
// against 3.3 M/s, 64 clients 5.0 against 2.7 M/s. For 64 clients, serve one request at a time (the
// loop above, with mesh_fanin_parts' warps: tests/programs/service_x_serial.cu) over `--shards 32
// --grid 4 --block 256`: on an H100 (session 16) its 64-client p99 was 7.4 µs blink / 7.1 µs MPS, 2.1x /
// 1.9x the SPSC echo's median, at 11.4-12.5 M requests/s; this batched loop on the same grid kept a
// p99 of 3.3-3.8x (12.1-13.5 M/s): 32 requests answered together make the last one wait for the rest.

// Requests mesh_fanin_peek takes per call at most: one per lane.
#define MESH_FANIN_BATCH_MAX 32u
// Slots an empty poll's next peek looks at (it doubles after each peek that found all it looked at, up
// to `max`): one request alone is found in one round trip of this many slots' words, a burst in a few.
#ifndef MESH_FANIN_POLL_MIN
#define MESH_FANIN_POLL_MIN 4u
#endif
// Whether mesh_fanin_peek loads the slots after the ones it returns before it returns (1), so that the
// next peek finds them arrived, or loads each batch when asked (0, the default). Only when the next
// batch's words fit one round trip (requests up to about 4 KiB). Measured on the H200 (BENCHMARKS.md,
// "A service"): a peek then takes 2.2 µs instead of 4.1, but the replies that follow wait for the
// loads (2.8 -> 4.8 µs a batch), so streaming gains 0-16% and a lone request loses 0.4-1.5 µs.
#ifndef MESH_FANIN_PREFETCH
#define MESH_FANIN_PREFETCH 0
#endif
static __device__ __forceinline__ uint32_t mesh_warp_or(uint32_t v) {
    for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Slots a peek at position `at` looks at: up to `max`, the adaptive hint, one round trip's words (or
// one slot of a larger request, over several), and the ring's end (slots are contiguous until it).
static __device__ __forceinline__ uint32_t mesh_fanin_span(const mesh_fanin* f, uint64_t at, uint32_t max) {
    const uint32_t words = MESH_FANIN_HEADER_WORDS + f->ch.msg_size / 4u;
    uint32_t n = words <= 64u * MESH_FANIN_PAIRS ? 64u * MESH_FANIN_PAIRS / words : 1u;
    if (n > max) n = max;
    if (n > f->ch.hint) n = f->ch.hint;
    const uint32_t to_end = f->ch.mask + 1u - (uint32_t)(at & f->ch.mask);
    return n < to_end ? n : to_end;
}

// Issues this lane's 16-byte loads of words [base, base + one round) of the `n` slots at position `at`
// into a / b, and returns without waiting for any of them.
static __device__ __forceinline__ void mesh_fanin_load(const mesh_fanin* f, uint64_t at, uint32_t n, uint32_t base,
                                                       uint64_t* a, uint64_t* b) {
    const uint32_t total = n * (MESH_FANIN_HEADER_WORDS + f->ch.msg_size / 4u);
    const volatile uint64_t* src = (const volatile uint64_t*)(f->ch.slots + (at & f->ch.mask) * (uint64_t)f->stride);
    const uint32_t lane = mesh_lane();
#pragma unroll
    for (uint32_t k = 0; k < MESH_FANIN_PAIRS; k++) {
        const uint32_t idx = base + 2u * (lane + 32u * k);
        if (idx < total) mesh_ld_volatile_v2(src + idx, &a[k], &b[k]);
    }
}

// Copies the whole requests at the fan-in's position, up to `max` (at most MESH_FANIN_BATCH_MAX), in
// order, into `buf` (request j at j * msg_size bytes; 4-byte aligned, shared or global memory: size it
// for `max` requests), their
// senders into `senders[j]`, and sets bit j of *skipped for a slot completed as a skip (a send cut
// off: nothing to answer; slots of a kind no producer writes count as skips and in `corrupt`; a
// skipped request's part of `buf` holds whatever its slot held). Returns how many (the same on every
// lane); 0 when the first is not whole yet. One call returns at most min(max, 32, 1088 / (2 +
// msg_size / 4)) requests, at least one: what one round trip's loads hold (32 requests up to 64 bytes,
// 4 at 1 KiB, 1 above about 4 KiB, which then takes several round trips; fewer where the ring's end
// comes first). Takes nothing:
// mesh_fanin_consume does. All the slots'
// words are loaded with 16-byte loads, all issued before any is used, and each word is judged by its
// own tag, as mesh_fanin_take_deferred does. With MESH_FANIN_PREFETCH 1, before it returns requests it
// issues the loads of the slots after them, which the next call uses if it peeks there: values loaded
// earlier are as good as any, since every word carries the tag of its position, and a slot that was
// not whole then is simply not taken yet (the call after polls afresh). A sharded fan-in's batch lists
// each shard's whole requests at its front, shard after shard (see "Shards"); no prefetch there.
static __device__ __forceinline__ uint32_t mesh_fanin_peek(mesh_fanin* f, void* buf, uint32_t* senders, uint32_t* skipped,
                                                           uint32_t max);

// One ring's peek (mesh_fanin_peek over `ch`).
static __device__ __forceinline__ uint32_t mesh_fanin_peek_ring(mesh_fanin* f, void* buf, uint32_t* senders,
                                                                uint32_t* skipped, uint32_t max) {
    mesh_chan* ch = &f->ch;
    *skipped = 0;
    if (ch->msg_size == 0 || max == 0) return 0;
    if (max > MESH_FANIN_BATCH_MAX) max = MESH_FANIN_BATCH_MAX;
    const uint32_t lane = mesh_lane();
    const uint32_t words = MESH_FANIN_HEADER_WORDS + ch->msg_size / 4u;  // even: msg_size is a multiple of 8
    const uint32_t round = 64u * MESH_FANIN_PAIRS;                        // words per round trip
    if (ch->hint < MESH_FANIN_POLL_MIN) ch->hint = MESH_FANIN_POLL_MIN;
    // MESH_FANIN_PREFETCH first: with it 0 the compiler then knows the ahead_* words are never read,
    // and keeps none of them in registers (34 of 8 bytes; they pushed the service loop past 255
    // registers into local memory once the sharded peek sat beside this one).
    const bool ahead = MESH_FANIN_PREFETCH && f->ahead_n != 0 && f->ahead_at == ch->mine && f->ahead_n <= max;
    const uint32_t n = ahead ? f->ahead_n : mesh_fanin_span(f, ch->mine, max);
    f->ahead_n = 0;
    const uint32_t magic = (uint32_t)(((1ull << 32) + words - 1u) / words);  // idx / words as a multiply
    const uint32_t total = n * words;
    uint32_t* dst = (uint32_t*)buf;
    const uint32_t body = ch->msg_size / 4u;
    // Per slot j (bit j): its commit word tagged, its kind word tagged, its kind not DATA (and neither
    // DATA nor SKIP), a body word not tagged. Each lane sees some words; the warp ORs what it saw.
    uint32_t committed = 0, kinded = 0, other = 0, strange = 0, torn = 0;
    for (uint32_t base = 0; base < total; base += round) {
        uint64_t a[MESH_FANIN_PAIRS], b[MESH_FANIN_PAIRS];
        if (ahead && base == 0) {
#pragma unroll
            for (uint32_t k = 0; k < MESH_FANIN_PAIRS; k++) {
                a[k] = f->ahead_a[k];
                b[k] = f->ahead_b[k];
            }
        } else {
            mesh_fanin_load(f, ch->mine, n, base, a, b);
        }
#pragma unroll
        for (uint32_t k = 0; k < MESH_FANIN_PAIRS; k++) {
            const uint32_t idx = base + 2u * (lane + 32u * k);
            if (idx >= total) continue;
            // Both words of the pair: one slot (words is even). The multiply is exact while idx * words < 2^32:
            // always with several slots (a round is 1088 words); one slot of any size is slot 0.
            const uint32_t j = n == 1u ? 0u : __umulhi(idx, magic);
            const uint32_t p = idx - j * words;       // the pair's first word within its slot
            const uint32_t t = mesh_tag(ch->mine + j);
            const bool ta = (uint32_t)(a[k] >> 32) == t, tb = (uint32_t)(b[k] >> 32) == t;
            if (p == 0) {  // commit (the sender id) and kind
                if (ta) {
                    committed |= 1u << j;
                    senders[j] = (uint32_t)a[k];
                }
                if (tb) {
                    kinded |= 1u << j;
                    if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA) other |= 1u << j;
                    if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA && (uint32_t)b[k] != MESH_FANIN_KIND_SKIP) strange |= 1u << j;
                }
            } else {
                if (!(ta && tb)) torn |= 1u << j;
                dst[j * body + p - 2u] = (uint32_t)a[k];
                dst[j * body + p - 1u] = (uint32_t)b[k];
            }
        }
    }
    committed = mesh_warp_or(committed);
    kinded = mesh_warp_or(kinded);
    other = mesh_warp_or(other);
    strange = mesh_warp_or(strange);
    torn = mesh_warp_or(torn);
    // Slot j is whole when committed and kinded, and either not DATA (a skip: its body is not looked
    // at) or every body word tagged. The requests are the whole slots in front of the first that is not.
    const uint32_t whole = committed & kinded & (other | ~torn);
    const uint32_t got = whole == 0xffffffffu ? 32u : (uint32_t)__ffs((int)~whole) - 1u;
    const uint32_t took = got < n ? got : n;
    if (took == 0) {
        if (!(committed & 1u)) mesh_chan_drained(ch);  // empty: publish, look at few slots next time
        else ch->partial++;                              // the first is still arriving
        __syncwarp();
        return 0;
    }
    if (took == n && n < max) ch->hint = 2u * n;  // all it looked at: look at more next time
    const uint32_t mask = took == 32u ? 0xffffffffu : (1u << took) - 1u;
    f->strange = strange & mask;  // counted in `corrupt` when consumed, not each time it is peeked
    *skipped = other & mask;
    if (MESH_FANIN_PREFETCH) {
        // The next batch, if every request returned is consumed: its loads cross PCIe while the
        // program answers these. Only one round trip's worth (the next call loads the rest itself).
        const uint64_t next = ch->mine + took;
        const uint32_t m = mesh_fanin_span(f, next, max);
        if (m * words <= round) {
            mesh_fanin_load(f, next, m, 0, f->ahead_a, f->ahead_b);
            f->ahead_at = next;
            f->ahead_n = m;
        }
    }
    __syncwarp();  // every lane's copy is in buf and senders before any lane uses them
    return took;
}

// The lowest `n` set bits of `bits`.
static __device__ __forceinline__ uint32_t mesh_fanin_lowest(uint32_t bits, uint32_t n) {
    while ((uint32_t)__popc(bits) > n) bits &= ~(0x80000000u >> __clz(bits));
    return bits;
}

// Inclusive prefix sum over the warp's lanes.
static __device__ __forceinline__ uint32_t mesh_warp_scan(uint32_t v) {
    const uint32_t lane = mesh_lane();
#pragma unroll
    for (uint32_t o = 1; o < 32u; o <<= 1) {
        const uint32_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

// A one-ring view of shard s (its words from lane s), for the calls that take one slot over several
// round trips, and its words written back afterwards.
static __device__ __forceinline__ mesh_fanin mesh_fanin_shard_view(const mesh_fanin* f, uint32_t s) {
    mesh_fanin g = *f;
    g.shards = 1u;
    g.ahead_n = 0;
    g.strange = 0;
    g.ch.ring = (char*)__shfl_sync(0xffffffffu, (unsigned long long)f->s_ring, s);
    g.ch.slots = (char*)__shfl_sync(0xffffffffu, (unsigned long long)f->s_slots, s);
    g.ch.mine = __shfl_sync(0xffffffffu, (unsigned long long)f->s_mine, s);
    g.ch.other = __shfl_sync(0xffffffffu, (unsigned long long)f->s_done, s);
    g.ch.published = __shfl_sync(0xffffffffu, (unsigned long long)f->s_published, s);
    g.ch.hint = __shfl_sync(0xffffffffu, f->s_hint, s);
    return g;
}
static __device__ __forceinline__ void mesh_fanin_shard_back(mesh_fanin* f, const mesh_fanin* g, uint32_t s) {
    if (mesh_lane() == s) {
        f->s_mine = g->ch.mine;
        f->s_done = g->ch.other;
        f->s_published = g->ch.published;
        f->s_hint = g->ch.hint;
    }
    f->ch.partial = g->ch.partial;
    f->corrupt = g->corrupt;
}

// mesh_fanin_peek over every shard, in one round trip (requests up to one round's words; larger ones
// one shard a call). *first: the sender of the batch's first request (for the take). Sets `returned`
// and each shard lane's `run`, which mesh_fanin_consume and the take use.
static __device__ __forceinline__ uint32_t mesh_fanin_peek_shards(mesh_fanin* f, void* buf, uint32_t* senders,
                                                                  uint32_t* skipped, uint32_t max, uint32_t* first) {
    mesh_chan* ch = &f->ch;
    const uint32_t full = 0xffffffffu;
    const uint32_t lane = mesh_lane(), shards = f->shards, last = shards - 1u;
    const uint32_t words = MESH_FANIN_HEADER_WORDS + ch->msg_size / 4u;  // even: msg_size is a multiple of 8
    const uint32_t round = 64u * MESH_FANIN_PAIRS;                        // words per round trip
    const uint32_t start = f->start;
    f->start = (start + 1u) & last;
    f->returned = 0;
    f->run = 0;
    *first = 0;
    if (words > round) {
        // One slot takes several round trips: one shard this call (the one-ring peek over it).
        mesh_fanin g = mesh_fanin_shard_view(f, start);
        uint32_t from = 0;
        const uint32_t took = mesh_fanin_peek_ring(&g, buf, senders ? senders : &from, skipped, 1u);
        mesh_fanin_shard_back(f, &g, start);
        if (took) {
            f->returned = 1u;
            if (lane == start) f->run = 1u;
            f->strange = g.strange;
            *first = senders ? senders[0] : __shfl_sync(full, from, 0);  // lane 0 loads slot 0's words 0 and 1
        }
        return took;
    }
    uint32_t budget = round / words;  // slots one round trip loads
    if (budget > 32u) budget = 32u;   // one bit each in the masks below
    // Lane r < shards stands for rank r: shard (start + r) mod shards. What each wants: its hint, up to
    // its ring's end (slots are contiguous until it). A shard found empty wants one slot until a
    // request arrives (not MESH_FANIN_POLL_MIN as one ring does: the empty shards' slots would be
    // taken from the budget of the busy ones), and twice as many after each peek that found all it
    // looked at whole.
    uint32_t want = 0;
    if (lane < shards) {
        if (f->s_hint == 0u) f->s_hint = MESH_FANIN_POLL_MIN;
        const uint32_t to_end = ch->mask + 1u - (uint32_t)(f->s_mine & ch->mask);
        want = f->s_hint < to_end ? f->s_hint : to_end;
        if (want > budget) want = budget;
    }
    const uint32_t shard_r = (start + lane) & last;  // rank `lane`'s shard (lane < shards)
    uint32_t w = __shfl_sync(full, want, shard_r);
    if (lane >= shards) w = 0;
    const uint32_t share = budget / shards ? budget / shards : 1u;
    // A fair share each first (budget / shards, at least one slot), by rank while the budget lasts;
    // then what is left, by rank, to those that want more.
    const uint32_t fair = w < share ? w : share;
    const uint32_t fair_to = mesh_warp_scan(fair);
    const uint32_t fair_all = __shfl_sync(full, fair_to, 31);
    uint32_t n = fair_to - fair >= budget ? 0u : (fair < budget - (fair_to - fair) ? fair : budget - (fair_to - fair));
    const uint32_t left = fair_all < budget ? budget - fair_all : 0u;
    const uint32_t more = w - n;
    const uint32_t more_to = mesh_warp_scan(more);
    n += more_to - more >= left ? 0u : (more < left - (more_to - more) ? more : left - (more_to - more));
    const uint32_t to = mesh_warp_scan(n), off = to - n;  // rank `lane`'s run: slots [off, to)
    const uint32_t total = __shfl_sync(full, to, 31);
    // Lane j < total stands for slot j: its rank (runs are a front of the ranks, each non-empty), its
    // shard's slots and position, hence its address and tag.
    const uint32_t starts = mesh_warp_or(n != 0u ? 1u << off : 0u);
    const uint32_t upto = lane == 31u ? full : (2u << lane) - 1u;
    const uint32_t rank = (uint32_t)__popc(starts & upto) - 1u;  // wraps for lanes >= total (unused)
    const unsigned long long r_slots = __shfl_sync(full, (unsigned long long)f->s_slots, shard_r);
    const unsigned long long r_mine = __shfl_sync(full, (unsigned long long)f->s_mine, shard_r);
    const uint32_t rr = rank & 31u;
    const char* j_slots = (const char*)__shfl_sync(full, r_slots, rr);
    const uint64_t j_seq = __shfl_sync(full, r_mine, rr) + (lane - __shfl_sync(full, off, rr));
    const unsigned long long j_addr = (unsigned long long)(j_slots + (j_seq & ch->mask) * (uint64_t)f->stride);
    const uint32_t j_tag = mesh_tag(j_seq);
    // Every lane's loads, all issued before any is used: word idx of the round is word idx - j x words
    // of slot j.
    const uint32_t magic = (uint32_t)(((1ull << 32) + words - 1u) / words);  // idx / words as a multiply
    const uint32_t tw = total * words;
    uint64_t a[MESH_FANIN_PAIRS], b[MESH_FANIN_PAIRS];
#pragma unroll
    for (uint32_t k = 0; k < MESH_FANIN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        const uint32_t j = __umulhi(idx, magic);  // exact: idx x words < 2^32 (both within one round)
        const unsigned long long at = __shfl_sync(full, j_addr, j & 31u);
        a[k] = b[k] = 0;
        if (idx < tw) mesh_ld_volatile_v2((const volatile uint64_t*)at + (idx - j * words), &a[k], &b[k]);
    }
    // Per slot j (bit j), as mesh_fanin_peek_ring judges them: each word by its own tag.
    uint32_t committed = 0, kinded = 0, other = 0, strange = 0, torn = 0;
#pragma unroll
    for (uint32_t k = 0; k < MESH_FANIN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        const uint32_t j = __umulhi(idx, magic);
        const uint32_t t = __shfl_sync(full, j_tag, j & 31u);
        if (idx >= tw) continue;
        const bool ta = (uint32_t)(a[k] >> 32) == t, tb = (uint32_t)(b[k] >> 32) == t;
        if (idx == j * words) {  // commit (the sender id) and kind
            if (ta) committed |= 1u << j;
            if (tb) {
                kinded |= 1u << j;
                if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA) other |= 1u << j;
                if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA && (uint32_t)b[k] != MESH_FANIN_KIND_SKIP) strange |= 1u << j;
            }
        } else if (!(ta && tb)) {
            torn |= 1u << j;
        }
    }
    committed = mesh_warp_or(committed);
    kinded = mesh_warp_or(kinded);
    other = mesh_warp_or(other);
    strange = mesh_warp_or(strange);
    torn = mesh_warp_or(torn);
    const uint32_t whole = committed & kinded & (other | ~torn);
    // Each run's whole front (rank lanes), the batch (at most `max`, by rank), and each shard's news:
    // empty (publish, look at few next time), all whole (look at more), a front still arriving.
    uint32_t front = 0, hint = 0;
    bool drained = false;
    if (lane < shards && n != 0u) {
        const uint32_t gaps = ~whole >> off;
        uint32_t got = gaps == 0u ? 32u : (uint32_t)__ffs((int)gaps) - 1u;
        if (got > n) got = n;
        front = got == 32u ? full : ((1u << got) - 1u) << off;
        drained = !((committed >> off) & 1u);
        hint = got == n ? 2u * n : 0u;
        if (hint > 32u) hint = 32u;
    }
    if (__any_sync(full, lane < shards && n != 0u && !front && !drained)) ch->partial++;
    const uint32_t returned = mesh_fanin_lowest(mesh_warp_or(front), max);
    const uint32_t rank_s = (lane - start) & last;  // shard `lane`'s rank
    const uint32_t s_front = __shfl_sync(full, front, rank_s);
    const bool s_drained = __shfl_sync(full, (uint32_t)drained, rank_s) != 0u;
    const uint32_t s_hint = __shfl_sync(full, hint, rank_s);
    if (lane < shards) {
        f->run = s_front & returned;
        if (s_drained) {
            f->s_hint = 1u;
            mesh_fanin_shard_publish(f, MESH_PUBLISH_ON_DRAIN);  // without it, once half a ring is owed
        } else if (s_hint > f->s_hint) {
            f->s_hint = s_hint;
        }
    }
    if (returned == 0u) {
        __syncwarp();
        return 0;
    }
    // The batch, in slot order without the gaps: slot j is request popc(returned below j).
    uint32_t* dst = (uint32_t*)buf;
    const uint32_t body = ch->msg_size / 4u;
    uint32_t sender0 = 0;
#pragma unroll
    for (uint32_t k = 0; k < MESH_FANIN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        const uint32_t j = __umulhi(idx, magic);
        if (idx >= tw || !((returned >> j) & 1u)) continue;
        const uint32_t o = (uint32_t)__popc(returned & ((1u << j) - 1u));
        const uint32_t p = idx - j * words;
        if (p == 0) {
            if (senders) senders[o] = (uint32_t)a[k];
            if (o == 0) sender0 = (uint32_t)a[k];
        } else {
            dst[o * body + p - 2u] = (uint32_t)a[k];
            dst[o * body + p - 1u] = (uint32_t)b[k];
        }
    }
    *first = mesh_warp_or(sender0);  // one lane holds it, the others 0
    const bool in_batch = (returned >> lane) & 1u;
    const uint32_t o = (uint32_t)__popc(returned & ((1u << lane) - 1u));
    *skipped = mesh_warp_or(in_batch && ((other >> lane) & 1u) ? 1u << o : 0u);
    f->strange = mesh_warp_or(in_batch && ((strange >> lane) & 1u) ? 1u << o : 0u);
    f->returned = returned;
    __syncwarp();  // every lane's copy is in buf and senders before any lane uses them
    return (uint32_t)__popc(returned);
}

static __device__ __forceinline__ uint32_t mesh_fanin_peek(mesh_fanin* f, void* buf, uint32_t* senders, uint32_t* skipped,
                                                           uint32_t max) {
    *skipped = 0;
    if (f->ch.msg_size == 0 || max == 0) return 0;
    if (max > MESH_FANIN_BATCH_MAX) max = MESH_FANIN_BATCH_MAX;
    if (f->shards == 1u) return mesh_fanin_peek_ring(f, buf, senders, skipped, max);
    uint32_t first;
    return mesh_fanin_peek_shards(f, buf, senders, skipped, max, &first);
}

// The take over every shard: the batch's first request, taken (deferred) from its shard.
static __device__ __forceinline__ int mesh_fanin_take_shards(mesh_fanin* f, void* buf, uint32_t* sender) {
    const uint32_t words = MESH_FANIN_HEADER_WORDS + f->ch.msg_size / 4u;
    if (words > 64u * MESH_FANIN_PAIRS) {
        // One slot takes several round trips: the one-ring take over one shard, turning.
        const uint32_t s = f->start;
        f->start = (s + 1u) & (f->shards - 1u);
        mesh_fanin g = mesh_fanin_shard_view(f, s);
        const int took = mesh_fanin_take_ring(&g, buf, sender);
        mesh_fanin_shard_back(f, &g, s);
        return took;
    }
    uint32_t skipped = 0, from = 0;
    if (mesh_fanin_peek_shards(f, buf, (uint32_t*)0, &skipped, 1u, &from) == 0) return MESH_TAKE_NONE;
    if (mesh_lane() < f->shards) f->s_mine += (uint32_t)__popc(f->returned & f->run);
    f->corrupt += f->strange & 1u;
    f->strange = 0;
    f->returned = 0;
    f->run = 0;
    *sender = from;
    return (skipped & 1u) ? MESH_TAKE_SKIP : MESH_TAKE_MSG;
}

static __device__ __forceinline__ int mesh_fanin_take_deferred(mesh_fanin* f, void* buf, uint32_t* sender) {
    if (f->ch.msg_size == 0) return MESH_TAKE_NONE;
    return f->shards > 1u ? mesh_fanin_take_shards(f, buf, sender) : mesh_fanin_take_ring(f, buf, sender);
}

// Gives back the first `n` requests of the last mesh_fanin_peek (answered or dropped): the producers
// may reuse their slots once the position is published (every half ring, on an empty poll, and on
// mesh_fanin_close). Every lane together.
static __device__ __forceinline__ void mesh_fanin_consume(mesh_fanin* f, uint32_t n) {
    mesh_chan* ch = &f->ch;
    if (ch->msg_size == 0 || n == 0) return;
    const uint32_t mask = n >= 32u ? 0xffffffffu : (1u << n) - 1u;
    f->corrupt += (uint32_t)__popc(f->strange & mask);
    f->strange = 0;
    if (f->shards > 1u) {
        // The first n requests of the batch are the lowest n bits of `returned`; each shard's are a
        // front of its run, so its position moves by how many of them are its own.
        const uint32_t first = mesh_fanin_lowest(f->returned, n);
        if (mesh_lane() < f->shards) {
            f->s_mine += (uint32_t)__popc(first & f->run);
            f->s_done = f->s_mine;
        }
        f->returned = 0;
        f->run = 0;
        mesh_fanin_shard_publish(f, false);
        return;
    }
    ch->mine += n;
    ch->other = ch->mine;
    mesh_chan_progress(ch);
}

// --- The channel group: the program is every reply ring's producer ---

// The program's state for one entry's reply ring, in device memory (not registers: a group has up to
// 65,536 entries). Lanes read it together and lane 0 writes it back, before a __syncwarp.
typedef struct {
    uint64_t head;       // the next reply to write
    uint64_t tail;       // the client's tail as last read (credit)
    uint64_t published;  // what the ring's head word holds
    uint32_t epoch;      // the epoch this entry was last seen bound at (valid when `bound`)
    uint32_t bound;      // 1: `epoch` was read bound and its departure is not yet acknowledged by us
} mesh_reply_state;

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

static __device__ __forceinline__ char* mesh_group_entry(const mesh_group* g, uint32_t slot) {
    return g->header + MESH_GROUP_HEADER_SIZE + (uint64_t)slot * MESH_GROUP_ENTRY_SIZE;
}
static __device__ __forceinline__ char* mesh_group_ring(const mesh_group* g, uint32_t slot) {
    return g->header + MESH_GROUP_HEADER_SIZE + (uint64_t)g->entries * MESH_GROUP_ENTRY_SIZE + (uint64_t)slot * g->ring_stride;
}
static __device__ __forceinline__ volatile uint64_t* mesh_group_slot(const mesh_group* g, uint32_t slot, uint64_t seq) {
    return (volatile uint64_t*)(mesh_group_ring(g, slot) + MESH_RING_SLOTS +
                                (seq & g->mask) * (uint64_t)g->msg_size * MESH_RING_WIRE_FACTOR);
}
#ifndef MESH_HOST_EMULATION  // (a CPU test build supplies these: crates/mesh-shm/tests/emu)
// A relaxed 8-byte load of host memory (the rate-limited read of a group's `changes`).
static __device__ __forceinline__ uint64_t mesh_group_ld_relaxed_u64(const void* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
#endif  // MESH_HOST_EMULATION
// Lane 0 stores a word of the mailbox for the warp: 32 stores of one word would each cross PCIe.
static __device__ __forceinline__ bool mesh_lane0(void) {
    return mesh_lane() == 0;
}

// Opens binding `b`, a host channel of protocol group (its `slots` is the GroupHeader's address),
// keeping each entry's state in `state` (`max` entries; device memory the warp alone uses). The
// header's geometry is read once, here (meshd writes it once, before the binding exists), and checked
// against the binding: on any disagreement, or more entries than `max`, msg_size is 0 and every call
// fails (mesh_reply: GONE). Each reply ring resumes as mesh_chan_open resumes a producer: after the
// published head and every whole reply written after it.
static __device__ mesh_group mesh_group_open_part(const mesh_ctx& c, uint32_t b, mesh_reply_state* state, uint32_t max,
                                                 uint32_t part, uint32_t parts) {
    mesh_group g = {0, state, 0, 0, 0, 0, 0, 0, 0, 0, false, false, 0, 0, 1};
    if (parts == 0 || (parts & (parts - 1u)) != 0 || part >= parts) return g;
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return g;
    const mesh_binding& d = c.bindings[b];
    if (d.protocol != MESH_PROTOCOL_GROUP || d.placement != MESH_PLACEMENT_HOST || state == 0) return g;
    char* h = (char*)(uintptr_t)d.slots;
    const uint32_t entries = *(volatile uint32_t*)(h + MESH_GROUP_ENTRIES);
    const uint32_t msg_size = *(volatile uint32_t*)(h + MESH_GROUP_MSG_SIZE);
    const uint32_t capacity = *(volatile uint32_t*)(h + MESH_GROUP_CAPACITY);
    const uint64_t stride = *(volatile uint64_t*)(h + MESH_GROUP_RING_STRIDE);
    const uint64_t slots = (uint64_t)msg_size * MESH_RING_WIRE_FACTOR * capacity;
    if (entries == 0 || entries > max || entries > 65536u || msg_size != d.msg_size || capacity != d.capacity ||
        msg_size == 0 || msg_size % 8u != 0 || capacity == 0 || (capacity & (capacity - 1u)) != 0 ||
        stride != MESH_RING_SLOTS + (slots + MESH_LINE - 1u) / MESH_LINE * MESH_LINE)
        return g;
    g.header = h;
    g.ring_stride = stride;
    g.entries = entries;
    g.msg_size = msg_size;
    g.mask = capacity - 1u;
    g.part = part;
    g.parts = parts;
    const uint32_t last = msg_size / 4u - 1u;
    for (uint32_t s = part + mesh_lane() * parts; s < entries; s += 32u * parts) {  // each lane its own entries
        char* ring = mesh_group_ring(&g, s);
        const uint64_t tail = mesh_ld_volatile_u64(ring + MESH_RING_TAIL);
        uint64_t head = mesh_ld_volatile_u64(ring + MESH_RING_HEAD);
        mesh_reply_state st = {head, tail, head, 0u, 0u};
        if ((int64_t)(tail - head) > 0) head = tail;
        while (head - tail <= g.mask && (uint32_t)(mesh_ld_volatile_u64(mesh_group_slot(&g, s, head)) >> 32) == mesh_tag(head) &&
               (uint32_t)(mesh_ld_volatile_u64(mesh_group_slot(&g, s, head) + last) >> 32) == mesh_tag(head))
            head++;
        st.head = head;
        state[s] = st;
    }
    __syncwarp();
    return g;
}

// The built-in state: MESH_GROUP_MAX_ENTRIES entries, for one group per program. A function-scope
// static, so that only a program that calls this overload carries the array (a file-scope one put
// 32 KiB of device memory, and a `.nv.global` section, in every module that includes this header).
static __device__ __forceinline__ mesh_reply_state* mesh_group_state_builtin(void) {
    static mesh_reply_state mesh_group_state_default[MESH_GROUP_MAX_ENTRIES];
    return mesh_group_state_default;
}
static __device__ __forceinline__ mesh_group mesh_group_open(const mesh_ctx& c, uint32_t b, mesh_reply_state* state, uint32_t max) {
    return mesh_group_open_part(c, b, state, max, 0u, 1u);
}
static __device__ __forceinline__ mesh_group mesh_group_open(const mesh_ctx& c, uint32_t b) {
    return mesh_group_open_part(c, b, mesh_group_state_builtin(), MESH_GROUP_MAX_ENTRIES, 0u, 1u);
}
// The group as warp `part` of `parts` serving it (a power of two, the same for every warp): this warp's
// copy answers and acknowledges the entries e with e % parts == part alone, and opens and closes only
// their rings, so that the warps of one block share the state array (built-in, or the caller's) with
// one writer per entry. Pair it with mesh_fanin_open_part(ctx, 0, part, parts): warp `part` then takes
// exactly the requests of those clients ("Many warps" above).
static __device__ __forceinline__ mesh_group mesh_group_open_part(const mesh_ctx& c, uint32_t b, uint32_t part, uint32_t parts) {
    return mesh_group_open_part(c, b, mesh_group_state_builtin(), MESH_GROUP_MAX_ENTRIES, part, parts);
}

// Stores entry `slot`'s exact head if it moved (lane 0, a plain store: the client needs it for
// nothing, meshd for its reset at the next connect, which the ack orders).
static __device__ __forceinline__ void mesh_group_flush(mesh_group* g, uint32_t slot, mesh_reply_state* st) {
    if (st->head != st->published) {
        if (mesh_lane0()) mesh_st_volatile_u64(mesh_group_ring(g, slot) + MESH_RING_HEAD, st->head);
        st->published = st->head;
    }
}

// Replies `msg` (msg_size bytes, 4-byte aligned) to `client` (a sender id: from mesh_fanin_take or
// mesh_fanin_take_deferred, or senders[j] of mesh_fanin_peek).
// GONE unless the id's epoch is the entry's bound one: read, when this warp has not already seen that
// epoch bound, with ONE 8-byte acquire load of the entry's epoch+state word (two loads could pair the
// next client's `bound` with this client's epoch). Seen bound once, it stays good without a load until
// this warp acknowledges that epoch's departure: meshd hands the ring to anyone else only after the
// ack, and a reply written before it is discarded by meshd's reset (`tail := head`). The acquire orders
// our later reads of the ring's tail and our stores into it after meshd's reset of the ring.
// FULL when the client's ring has no room (its tail is read, one round trip, only when it looks full).
static __device__ __forceinline__ int mesh_reply(mesh_group* g, uint32_t client, const void* msg) {
    const uint32_t slot = client & 0xffffu, e16 = client >> 16;
    if (g->msg_size == 0 || slot >= g->entries) return MESH_REPLY_GONE;
    mesh_reply_state st = g->state[slot];  // every lane the same copy
    if (!(st.bound && (st.epoch & 0xffffu) == e16)) {
        uint64_t w = 0;
        if (mesh_lane0()) w = mesh_ld_acquire_u64(mesh_group_entry(g, slot) + MESH_GROUP_ENTRY_BINDING);
        w = __shfl_sync(0xffffffffu, w, 0);
        const uint32_t epoch = (uint32_t)w, state = (uint32_t)(w >> 32);
        if (state != MESH_GROUP_BOUND || (epoch & 0xffffu) != e16) return MESH_REPLY_GONE;
        st.epoch = epoch;
        st.bound = 1u;
    }
    int r = MESH_REPLY_SENT;
    if (st.head - st.tail > g->mask) {
        uint64_t tail = 0;
        if (mesh_lane0()) tail = mesh_ld_volatile_u64(mesh_group_ring(g, slot) + MESH_RING_TAIL);
        st.tail = __shfl_sync(0xffffffffu, tail, 0);
        mesh_group_flush(g, slot, &st);  // it looked full: a good moment to say how far we are
        if (st.head - st.tail > g->mask) r = MESH_REPLY_FULL;
    }
    if (r == MESH_REPLY_SENT) {
        const uint32_t words = g->msg_size / 4u;
        volatile uint64_t* dst = mesh_group_slot(g, slot, st.head);
        const uint64_t t = (uint64_t)mesh_tag(st.head) << 32;
        const uint32_t* src = (const uint32_t*)msg;
        for (uint32_t idx = 2u * mesh_lane(); idx < words; idx += 64u) mesh_st_volatile_v2(dst + idx, t | src[idx], t | src[idx + 1]);
        st.head += 1;
        const uint64_t half = (g->mask + 1u) / 2u;
        if (st.head - st.published >= (half ? half : 1u)) mesh_group_flush(g, slot, &st);
    }
    __syncwarp();  // every lane read the old state
    if (mesh_lane0()) g->state[slot] = st;
    __syncwarp();  // and sees the new one next time
    return r;
}

// Whether mesh_reply_many spreads each reply's 16-byte stores over the warp's lanes (1, the default) or
// has each request's lane write its own reply (0). Measured on the H200: BENCHMARKS.md, "A service".
#ifndef MESH_REPLY_SPREAD
#define MESH_REPLY_SPREAD 1
#endif

// Answers requests [0, n) of a peek: request j's reply is `msgs + j * msg_size` (4-byte aligned), to
// `clients[j]`, unless bit j of `skip` is set (a skipped slot: nothing to answer). Returns `done`: how
// many of them, from the first, are answered or dropped. A request to a client that is not bound (it
// left: GONE), or whose id names no entry, is dropped and its bit set in *dropped (bits j < done only;
// those at or above `done` are 0). When a client's ring has no room for all its
// requests of the batch (its tail is read, one round trip, only when it looks full), `done` is the
// index of its first request that found none, and nothing at or after that index is sent (so the
// requests after it stay in the fan-in, to be peeked and answered later, in order): n unless a client is
// slow. Lanes in parallel: each client's first lane in the batch checks its entry and credit for all its
// requests (in order, as mesh_reply would one by one), then the lanes write the replies together.
static __device__ __forceinline__ uint32_t mesh_reply_many(mesh_group* g, const uint32_t* clients, const void* msgs, uint32_t n,
                                           uint32_t skip, uint32_t* dropped) {
    *dropped = 0;
    if (n > 32u) n = 32u;
    const uint32_t lane = mesh_lane();
    const uint32_t below = (1u << lane) - 1u;
    const bool mine = lane < n && !((skip >> lane) & 1u);
    const uint32_t id = mine ? clients[lane] : 0u;
    const uint32_t slot = id & 0xffffu;
    const bool valid = mine && g->msg_size != 0 && slot < g->entries;
    // The lanes asking for the same entry; the lowest of them speaks for them all.
    const uint32_t asking = __ballot_sync(0xffffffffu, valid);
    const uint32_t same = __match_any_sync(0xffffffffu, valid ? slot : 0xffffffffu) & asking;
    const bool leader = valid && (same & below) == 0;
    mesh_reply_state st = {0, 0, 0, 0u, 0u};
    uint32_t sent = 0;           // leader: its lanes whose reply goes out (bit per lane)
    uint32_t gone = 0;           // leader: its lanes dropped (not bound)
    uint32_t full_at = 32u;      // leader: its first lane without room
    if (leader) {
        st = g->state[slot];
        bool tail_read = false;
        uint64_t head = st.head;
        for (uint32_t m = same; m != 0; m &= m - 1u) {
            const uint32_t l = (uint32_t)__ffs((int)m) - 1u;
            const uint32_t e16 = clients[l] >> 16;
            if (!(st.bound && (st.epoch & 0xffffu) == e16)) {
                // One 8-byte acquire load of epoch and state (see mesh_reply).
                const uint64_t w = mesh_ld_acquire_u64(mesh_group_entry(g, slot) + MESH_GROUP_ENTRY_BINDING);
                const uint32_t epoch = (uint32_t)w, state = (uint32_t)(w >> 32);
                if (state != MESH_GROUP_BOUND || (epoch & 0xffffu) != e16) {
                    gone |= 1u << l;
                    continue;
                }
                st.epoch = epoch;
                st.bound = 1u;
            }
            if (head - st.tail > g->mask && !tail_read) {
                st.tail = mesh_ld_volatile_u64(mesh_group_ring(g, slot) + MESH_RING_TAIL);
                tail_read = true;
            }
            if (head - st.tail > g->mask) {
                full_at = l;
                break;
            }
            sent |= 1u << l;
            head++;
        }
    }
    const uint32_t block = mesh_warp_min(full_at);  // the first request of the batch that found no room
    const uint32_t done = block < n ? block : n;
    const uint32_t keep = done >= 32u ? 0xffffffffu : (1u << done) - 1u;
    sent &= keep;
    gone &= keep;
    // Each lane learns from its leader where its reply goes: the entry's head plus the replies its
    // leader sends before it.
    const uint32_t lead = valid ? (uint32_t)__ffs((int)same) - 1u : lane;
    const uint32_t sent_all = __shfl_sync(0xffffffffu, sent, lead);
    const uint64_t head0 = __shfl_sync(0xffffffffu, st.head, lead);
    __syncwarp();  // the leader's acquire load orders every lane's stores into the ring after meshd's reset
    const uint32_t words = g->msg_size / 4u;
    const bool go = (sent_all >> lane) & 1u;  // this lane's request gets its reply
    const uint64_t seq = head0 + (uint32_t)__popc(sent_all & below);
#if MESH_REPLY_SPREAD
    // Pair q of the batch (16 bytes) is pair q % ppr of reply q / ppr: consecutive lanes write
    // consecutive pairs of a reply, so each store instruction fills whole lines of host memory, and a
    // lone reply is written by ppr lanes at once. q / ppr by a multiply, exact while q * ppr < 2^32:
    // q < 32 * ppr and ppr <= 8192 (64 KiB replies).
    const uint32_t ppr = words / 2u;
    const uint32_t pmagic = (uint32_t)(((1ull << 32) + ppr - 1u) / ppr);
    for (uint32_t q0 = 0; q0 < n * ppr; q0 += 32u) {
        const uint32_t q = q0 + lane;
        uint32_t r = ppr == 1u ? q : __umulhi(q, pmagic);
        if (r > 31u) r = 31u;  // q past the end (looked at below): any lane's values will do
        const uint64_t rseq = __shfl_sync(0xffffffffu, seq, r);
        const uint32_t rslot = __shfl_sync(0xffffffffu, slot, r);
        const bool rgo = __shfl_sync(0xffffffffu, (uint32_t)go, r) != 0u;
        if (q < n * ppr && rgo) {
            const uint32_t p = 2u * (q - r * ppr);  // the pair's first word in the reply
            const uint32_t* src = (const uint32_t*)msgs + (uint64_t)r * words + p;
            mesh_st_volatile_v2(mesh_group_slot(g, rslot, rseq) + p, (uint64_t)mesh_tag(rseq) << 32 | src[0],
                                (uint64_t)mesh_tag(rseq) << 32 | src[1]);
        }
    }
#else
    if (go) {  // each request's lane writes its own reply
        volatile uint64_t* dst = mesh_group_slot(g, slot, seq);
        const uint64_t t = (uint64_t)mesh_tag(seq) << 32;
        const uint32_t* src = (const uint32_t*)msgs + (uint64_t)lane * words;
        for (uint32_t i = 0; i < words; i += 2u) mesh_st_volatile_v2(dst + i, t | src[i], t | src[i + 1]);
    }
#endif
    if (leader) {
        const uint64_t half = (g->mask + 1u) / 2u;
        st.head += (uint32_t)__popc(sent);
        // Publish the head every half ring, and when the ring looked full (as mesh_reply does). One
        // store per entry, by its leader: different entries, different words.
        if (st.head != st.published && (st.head - st.published >= (half ? half : 1u) || full_at < 32u)) {
            mesh_st_volatile_u64(mesh_group_ring(g, slot) + MESH_RING_HEAD, st.head);
            st.published = st.head;
        }
        g->state[slot] = st;
    }
    uint32_t lost = mesh_warp_or(gone);
    // A request whose id names no entry of the group (forged, or the group is unbound) is dropped too.
    lost |= __ballot_sync(0xffffffffu, mine && !valid) & keep;
    *dropped = lost;
    __syncwarp();  // every lane sees the new states next time
    return done;
}

// Acknowledges entry `slot`'s departure at `epoch`: its exact head first, then acked_epoch with
// st.release.sys. The __syncwarp orders every lane's reply stores before lane 0's release (release is
// cumulative over what lane 0 has observed), so meshd, once it sees the ack, resets a ring that holds
// every reply ever written to the departed client.
static __device__ __forceinline__ void mesh_group_ack(mesh_group* g, uint32_t slot, uint32_t epoch) {
    mesh_reply_state st = g->state[slot];
    mesh_group_flush(g, slot, &st);
    st.bound = 0u;  // any later reply to this epoch reads the entry again (and finds it not bound)
    __syncwarp();
    if (mesh_lane0()) {
        g->state[slot] = st;
        mesh_st_release_u32(mesh_group_entry(g, slot) + MESH_GROUP_ENTRY_ACKED, epoch);
    }
    __syncwarp();
}

// Returns true with the id (`slot | epoch << 16`, as in the fan-in's sender words) of one departed
// client, acknowledged as it is returned: drop its state, and reply to it no more (mesh_reply would say
// GONE). Requests it sent before it left may still be taken after this, even once its slot has a new
// client (whose id has the next epoch): they come back GONE (`dropped`), and must not touch the new
// client's state (the section's opening, "Client ids"). Call it in a loop until false. Reads the group's `changes` word rate-limited (one relaxed
// load every MESH_GROUP_PERIOD_NS, looked at a period later); when that moved, or on the first call
// after the open (acknowledging what the last launch had not), it reads `changes` again with an
// acquire load (so that the entries it then loads are at least that recent) and scans the entries, 32
// per round trip: a departed entry whose acked_epoch != epoch (not `<`: epochs wrap) is acknowledged.
// A group opened with mesh_group_open_part looks at its own part's entries alone (32 of them a round
// trip, so a scan costs entries / (32 x parts) round trips): a departure must be acknowledged by the
// warp that answers that client, or its ring could go to a new client while the warp still answers the
// old one.
static __device__ __forceinline__ bool mesh_group_departed(mesh_group* g, uint32_t* gone) {
    if (g->msg_size == 0) return false;
    const uint32_t part = g->part, parts = g->parts;
    if (!g->scanning) {
        if (g->scanned) {
            const uint64_t now = mesh_globaltimer();
            if (now < g->changes_due) return false;
            g->changes_due = now + MESH_GROUP_PERIOD_NS;
            // Last period's load, lane 0's alone, arrived by now: the shuffle is where the warp first
            // uses its value, a period after it was issued (shuffling it as it is loaded would wait
            // for the PCIe read there, every period).
            const bool moved = __shfl_sync(0xffffffffu, g->changes_read != g->changes_seen, 0);
            if (!moved) {
                if (mesh_lane0()) g->changes_read = mesh_group_ld_relaxed_u64(g->header + MESH_GROUP_CHANGES);
                return false;
            }
        }
        uint64_t v = 0;
        if (mesh_lane0()) v = mesh_ld_acquire_u64(g->header + MESH_GROUP_CHANGES);
        g->scan_changes = __shfl_sync(0xffffffffu, v, 0);
        g->scanning = true;
        g->scan_at = 0;
    }
    const uint32_t lane = mesh_lane();
    // scan_at counts this part's entries (part, part + parts, ...): a round trip loads 32 of its own.
    while (part + g->scan_at * parts < g->entries) {
        const uint32_t s = part + (g->scan_at + lane) * parts;
        uint64_t w = 0;
        uint32_t acked = 0;
        const bool mine = s < g->entries;
        if (mine) {
            char* e = mesh_group_entry(g, s);
            w = mesh_ld_acquire_u64(e + MESH_GROUP_ENTRY_BINDING);  // epoch and state: one load
            acked = *(volatile uint32_t*)(e + MESH_GROUP_ENTRY_ACKED);  // ours: what we (or a last launch) wrote
        }
        const bool due = mine && (uint32_t)(w >> 32) == MESH_GROUP_DEPARTED && acked != (uint32_t)w;
        const uint32_t ballot = __ballot_sync(0xffffffffu, due);
        if (ballot == 0) {
            g->scan_at += 32u;
            continue;
        }
        const uint32_t first = (uint32_t)__ffs((int)ballot) - 1u;
        const uint32_t epoch = __shfl_sync(0xffffffffu, (uint32_t)w, first);
        const uint32_t slot = part + (g->scan_at + first) * parts;
        mesh_group_ack(g, slot, epoch);
        g->scan_at += first + 1u;
        *gone = slot | (epoch & 0xffffu) << 16;
        return true;
    }
    g->scanning = false;
    g->scanned = true;
    g->changes_seen = g->changes_read = g->scan_changes;
    return false;
}

// Publishes every reply ring's exact head; call it before mesh_end.
static __device__ void mesh_group_close(mesh_group* g) {
    if (g->msg_size == 0) return;
    for (uint32_t s = g->part + mesh_lane() * g->parts; s < g->entries; s += 32u * g->parts) {  // one store each
        mesh_reply_state st = g->state[s];
        if (st.head != st.published) {
            mesh_st_volatile_u64(mesh_group_ring(g, s) + MESH_RING_HEAD, st.head);
            st.published = st.head;
            g->state[s] = st;
        }
    }
    __syncwarp();
}

// ---- Large messages: bulk channels, moved by a whole thread block ------------------------------
// A channel created with `--protocol bulk` (the default above 64 KiB: `meshd channel create NAME
// --msg-size 1048576 --capacity 8`) carries messages of 16 B to 16 MiB, multiples of 16, in NCCL's
// Simple format: the payload as it is, then one flag per message. A binding's `protocol` says which
// format it is: MESH_PROTOCOL_BULK here, MESH_PROTOCOL_LL for the channels above (mesh_chan_open
// refuses a bulk channel and mesh_bulk_open an LL one: both then give msg_size 0, on which every
// call fails). Both placements work: host (the mailbox; a host process with mesh-shm's
// BulkProducer / BulkConsumer or a GPU program at either end) and device (GPU memory, two GPU
// programs). Run on the H200: tests/tests/large.rs and parts.rs; figures in BENCHMARKS.md.
//
// Every thread of the block calls every mesh_bulk_* / mesh_block_* function together, with the same
// arguments (each thread holds its own copy of the mesh_bulk, and every copy changes the same way);
// they synchronise the block (__syncthreads) and may not be called from divergent code. Any block
// shape of at least as many threads as the channel has parts works (32 threads always do; a smaller
// block is refused at the open); mesh_block_rank() is a thread's rank in it (0: the one that talks to
// meshd). Not every call passes a barrier (a peek that already knows the next message whole, a
// reserve that already knows the room, return at once), so a buffer the block's threads share is
// the caller's to order: __syncthreads between the threads' writes of a shared `msg` and the
// mesh_block_try_send that sends it, and between their last reads of a shared `out` and the next
// mesh_block_try_recv into it. An end
// of a channel belongs to one block, or, for a channel of several parts, to blocks that each open
// their own share of the parts with mesh_bulk_open_part (below); two blocks opening the same part of
// the same end break the ring. Buffers are 16-byte aligned, global or shared memory, msg_size bytes
// (ch.msg_size: for a block serving a share of the parts, the share's bytes).
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
// ONE CHANNEL SERVED BY B BLOCKS (parts). A channel created with `--parts P` (a power of two up to
// MESH_BULK_MAX_PARTS; msg_size a multiple of 16 × P) splits every message into P equal parts, part p
// being bytes p × msg_size / P to (p + 1) × msg_size / P. Each part has its own flag per slot and its
// own head and tail, with one writer each, so B blocks move one message together without any barrier
// between them: the block serving part p sends or receives part p of every message, at its own pace,
// and the message is whole when all its parts are. B must be a power of two up to P; block i of B then
// serves parts i × P / B to (i + 1) × P / B - 1, a contiguous share of P / B parts (ch.msg_size bytes,
// at byte mesh_bulk_part_offset(&ch) of the message). mesh_bulk_open(ctx, b, producer) is the share of
// one block serving every part. Both ends choose their B independently, and a host end (BulkProducer,
// BulkConsumer) serves every part. A 16 MiB copy over 8 blocks on one binding, `meshd load copy x.ptx
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
// How many blocks (H200, session 9, device channels, `mesh-gpu-bench parts`: one channel of B parts
// beside the same work without the ring, same blocks, same run; BENCHMARKS.md): a block copies about
// 47 GB/s, or fills or checks every word at about 24 GB/s, and the ring costs each block a barrier and
// a release fence a message at the producer (the fence waits for the block's stores), a barrier at
// the consumer, so give every block at least 64-128 KiB of each message. At 1 MiB: up to 8 blocks
// keep 0.81-0.99 of the bare work (copy path or in place), 16 blocks 0.72-0.79, 32 blocks 0.60
// copying and 0.73 in place. At 16 MiB: 0.89-1.08 up to 16 blocks (1.15 in place at 32); 32 blocks copying reach 1 TB/s,
// 0.66 of one bare copy: the copy path moves every byte twice (into the ring and out of it), four
// HBM transfers a byte against the bare copy's two, which is HBM's rate. In place
// (mesh_block_reserve / mesh_block_publish, mesh_block_peek / mesh_block_release) moves it once.
// A block with several messages at hand moves them in one call ("Several messages a call" below:
// mesh_block_try_send_n, mesh_block_reserve_n / mesh_block_publish_n, mesh_block_try_recv_n,
// mesh_block_peek_n / mesh_block_release_n): one barrier and one fence for all of them. Two a call at
// the copy path's producer took 1 MiB from 0.70 to 0.78 of the bare copy over 16 blocks and from 0.59
// to 0.66 over 32 (session 13; nothing at 16 MiB), at the price of the first message waiting for the
// second's copy. Four a call at both ends (reserve_n / publish_n at the source, peek_n / release_n at
// the sink; tests/programs/bulk_parts_*_x_batch4.cu) keep 1 MiB at 0.75 copying and 0.74 in place over
// 32 blocks, 0.81-0.82 over 16, 0.83-0.97 up to 8; 16 MiB at 0.82-1.22 up to 16 blocks and 1.52 in place
// over 32 (0.49 copying: HBM, as above): so with 16 blocks or more, move four messages a call (an H100,
// session 16, BENCHMARKS.md).
//
// Only block 0 calls mesh_begin / mesh_end (and mesh_heartbeat); every block checks the stop itself.
// A block whose share is refused (B not a power of two, B > P, blockIdx.x >= B, or an LL binding)
// gets msg_size 0, on which every call fails.
//
// Format (mesh-shm's bulk.rs): the slots start with capacity × parts flags of MESH_BULK_FLAG_SIZE
// bytes (slot s, part p at s × parts + p); for more than one part, 2 × parts index lines of MESH_LINE
// bytes follow on the next line boundary (part p's head, then its tail); all padded to
// MESH_BULK_ALIGN, then capacity payloads of msg_size bytes. One part has no index lines: its head and
// tail are the ring header's (MESH_RING_HEAD, MESH_RING_TAIL), the format before parts existed. The
// binding's `protocol` word holds a channel's parts above MESH_BULK_PARTS_SHIFT when there are more
// than one (a program built before parts existed sees an unknown protocol and refuses the binding).
// Message `seq` is in slot seq & (capacity - 1); a part's flag holds seq + 1 once that part is whole.
// A sender's threads store the part with 16-byte stores, the block synchronises, and one thread per
// part stores its flag with release semantics; a receiver's threads (one per part) load the flags
// with acquire semantics (one PCIe round trip for a host channel, which a large message amortises),
// the block synchronises, and every thread loads the payload, 4 x 16 bytes in flight each. Both ends
// publish each part's index (head, tail) on every message: a producer waits for room only when the
// ring looks full, reading its parts' tails once. The ring header's head and tail are, for more than
// one part, lower bounds over the parts that block 0 publishes in mesh_bulk_close (for `meshd info`).

// One end of a bound bulk channel (this block's share of its parts), held in registers by every
// thread of the block using it.
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

// This thread's rank in its block, and the block's size (any shape).
static __device__ __forceinline__ uint32_t mesh_block_rank(void) {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
static __device__ __forceinline__ uint32_t mesh_block_threads(void) {
    return blockDim.x * blockDim.y * blockDim.z;
}

// Thread 0's `v`, on every thread of the block.
static __device__ __forceinline__ uint64_t mesh_block_bcast(uint64_t v) {
    __shared__ uint64_t mesh_bcast_word;
    __syncthreads();  // every thread has read the previous value
    if (mesh_block_rank() == 0) mesh_bcast_word = v;
    __syncthreads();
    return mesh_bcast_word;
}

// The largest `v` of threads 0 .. n - 1 (n from 1 to MESH_BULK_MAX_PARTS), on every thread of the
// block, compared as signed distances (`v` is a difference of two sequence numbers, or a count).
static __device__ __forceinline__ int64_t mesh_block_max_of(int64_t v, uint32_t n) {
    __shared__ int64_t mesh_max_words[MESH_BULK_MAX_PARTS];
    __syncthreads();  // every thread has read the previous values
    if (mesh_block_rank() < n) mesh_max_words[mesh_block_rank()] = v;
    __syncthreads();
    int64_t m = mesh_max_words[0];
    for (uint32_t i = 1; i < n; i++) m = mesh_max_words[i] > m ? mesh_max_words[i] : m;
    return m;
}

// mesh_should_stop for a whole block: thread 0 asks (keeping the check's state in its ctx), every
// thread gets the same answer. Cheap to call on every iteration (two block barriers, no PCIe read
// but one a MESH_STOP_PERIOD_NS).
static __device__ __forceinline__ bool mesh_block_should_stop(mesh_ctx& c) {
    return mesh_block_bcast(mesh_block_rank() == 0 ? (uint64_t)mesh_should_stop(c) : 0u) != 0;
}

#ifndef MESH_HOST_EMULATION  // (a CPU test build supplies these: crates/mesh-shm/tests/emu)
static __device__ __forceinline__ uint64_t mesh_ld_acquire_gpu_u64(const void* p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void mesh_st_release_gpu_u64(void* p, uint64_t v) {
    asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ uint4 mesh_ld_volatile_v4(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
#endif  // MESH_HOST_EMULATION

// Copies n 16-byte units from src to dst (global or shared memory) with every thread of the block, 4
// loads in flight per thread before its stores. The loads are volatile: they go past the SM's L1,
// which may still hold a ring slot's previous lap.
static __device__ __forceinline__ void mesh_block_copy(uint4* dst, const uint4* src, uint32_t n) {
    const uint32_t s = mesh_block_threads();
    uint32_t i = mesh_block_rank();
    for (; i + 3u * s < n; i += 4u * s) {
        const uint4 a = mesh_ld_volatile_v4(src + i), b = mesh_ld_volatile_v4(src + i + s);
        const uint4 c = mesh_ld_volatile_v4(src + i + 2u * s), d = mesh_ld_volatile_v4(src + i + 3u * s);
        dst[i] = a;
        dst[i + s] = b;
        dst[i + 2u * s] = c;
        dst[i + 3u * s] = d;
    }
    for (; i < n; i += s) dst[i] = mesh_ld_volatile_v4(src + i);
}

// The flag of part first + r of message seq's slot (r < count).
static __device__ __forceinline__ uint64_t* mesh_bulk_flag(const mesh_bulk* ch, uint64_t seq, uint32_t r) {
    return ch->flags + (seq & ch->mask) * ch->parts + ch->first + r;
}
// This block's share of message seq's slot.
static __device__ __forceinline__ char* mesh_bulk_slot(const mesh_bulk* ch, uint64_t seq) {
    return ch->payload + (seq & ch->mask) * (uint64_t)ch->stride;
}
// Part first + r's head line, and its tail line.
static __device__ __forceinline__ char* mesh_bulk_head_line(const mesh_bulk* ch, uint32_t r) {
    return ch->lines + (uint64_t)r * ch->line_step;
}
static __device__ __forceinline__ char* mesh_bulk_tail_line(const mesh_bulk* ch, uint32_t r) {
    return mesh_bulk_head_line(ch, r) + (MESH_RING_TAIL - MESH_RING_HEAD);
}
static __device__ __forceinline__ uint64_t mesh_bulk_ld_flag(const mesh_bulk* ch, const uint64_t* f) {
    return ch->placement == MESH_PLACEMENT_HOST ? mesh_ld_acquire_u64(f) : mesh_ld_acquire_gpu_u64(f);
}

// Where this block's share starts inside a message: what a block that keeps whole messages in its
// own buffers adds to their address.
static __device__ __forceinline__ uint32_t mesh_bulk_part_offset(const mesh_bulk* ch) {
    return ch->parts == 0 ? 0u : ch->first * (ch->stride / ch->parts);
}

// Opens this block's share of binding `b` of protocol bulk as a producer (`producer` true) or consumer:
// it is block `block` of the `blocks` blocks that serve this end (a power of two up to the channel's
// parts), and serves parts block × parts / blocks onwards, parts / blocks of them. Every thread of the
// block calls it. A producer resumes each of its parts after the last message written into it
// (published or not), as mesh_bulk_open always did; where its parts disagree (the end was served by
// more blocks before) it continues at the furthest and completes the parts behind with what their
// slots hold (a message the last launch left half-written is delivered torn). A part behind whose
// consumer has no room for all of it (its ring full) is completed as that consumer frees slots: the
// open waits for it there, since nothing after the open writes those flags and the block could not
// send past that consumer anyway; a stop while it waits leaves the part's head where the completion
// got and returns msg_size 0 (every call fails; the next launch completes the rest). A consumer resumes
// at the furthest of its parts' tails and moves the others there (the messages between, partly taken
// by the last launch, are skipped). An unbound `b`, an LL channel or a refused share gives msg_size 0.
static __device__ mesh_bulk mesh_bulk_open_part(const mesh_ctx& c, uint32_t b, bool producer, uint32_t block,
                                                uint32_t blocks) {
    mesh_bulk ch = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, producer};
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return ch;
    const uint32_t word = c.bindings[b].protocol;
    const uint32_t parts = (word >> MESH_BULK_PARTS_SHIFT) == 0u ? 1u : word >> MESH_BULK_PARTS_SHIFT;
    if ((word & ((1u << MESH_BULK_PARTS_SHIFT) - 1u)) != MESH_PROTOCOL_BULK || parts > MESH_BULK_MAX_PARTS ||
        (parts & (parts - 1u)) != 0u || blocks == 0u || (blocks & (blocks - 1u)) != 0u || blocks > parts ||
        block >= blocks || c.bindings[b].msg_size % (16u * parts) != 0u)
        return ch;
    // A thread a part, for the calls' per-part work and the close's look at every part: a block of
    // fewer threads than the channel's parts is refused (32 threads always do).
    if (mesh_block_threads() < parts) return ch;
    const uint32_t capacity = c.bindings[b].capacity;
    const uint32_t part_bytes = c.bindings[b].msg_size / parts;
    ch.ring = mesh_at(c, c.bindings[b].ring_offset);
    ch.flags = (uint64_t*)(uintptr_t)c.bindings[b].slots;
    ch.parts = parts;
    ch.count = parts / blocks;
    ch.first = block * ch.count;
    ch.stride = c.bindings[b].msg_size;
    ch.msg_size = ch.count * part_bytes;
    ch.mask = capacity - 1u;
    ch.placement = c.bindings[b].placement;
    const uint64_t flags_bytes = (uint64_t)capacity * parts * MESH_BULK_FLAG_SIZE;
    uint64_t end = flags_bytes;
    if (parts == 1u) {
        ch.lines = ch.ring + MESH_RING_HEAD;
        ch.line_step = 0;
    } else {
        const uint64_t lines = (flags_bytes + MESH_LINE - 1u) / MESH_LINE * MESH_LINE;
        ch.lines = (char*)ch.flags + lines + (uint64_t)ch.first * 2u * MESH_LINE;
        ch.line_step = 2u * MESH_LINE;
        end = lines + 2u * (uint64_t)parts * MESH_LINE;
    }
    ch.payload = (char*)ch.flags + (end + MESH_BULK_ALIGN - 1u) / MESH_BULK_ALIGN * MESH_BULK_ALIGN +
                 (uint64_t)ch.first * part_bytes;
    // Threads 0 .. count - 1 each read one part's indices (and, for a producer, its flags after the
    // published head), and the block takes the furthest: every copy of the channel must start equal.
    // Positions are compared as distances from part `first`'s tail, read by every thread.
    const uint32_t r = mesh_block_rank();
    const uint64_t base = mesh_block_bcast(r == 0 ? mesh_ld_acquire_u64(mesh_bulk_tail_line(&ch, 0)) : 0u);
    int64_t pos = 0, tail_at = 0;
    uint64_t tail = base;
    if (r < ch.count) {
        tail = mesh_ld_acquire_u64(mesh_bulk_tail_line(&ch, r));
        uint64_t at = tail;
        if (producer) {
            uint64_t head = mesh_ld_acquire_u64(mesh_bulk_head_line(&ch, r));
            if ((int64_t)(tail - head) > 0) head = tail;
            while (head - tail <= ch.mask && mesh_bulk_ld_flag(&ch, mesh_bulk_flag(&ch, head, r)) == head + 1u) head++;
            at = head;
        }
        pos = (int64_t)(at - base);
        tail_at = (int64_t)(tail - base);
    }
    const int64_t furthest = mesh_block_max_of(pos, ch.count);
    ch.mine = base + (uint64_t)furthest;
    ch.other = ch.mine;  // a consumer knows of no whole message yet (a producer's is set below)
    if (producer) {
        // The parts behind, completed: as far as room allows, then (rarely: the end was served by more
        // blocks and one part's consumer is a full ring behind) as its consumer frees slots, rereading
        // that tail. The flags between could otherwise never be written: the block's publishes flag
        // its own position, its close stores each part's head there, and a relaunch resumes past them.
        int64_t stopped = 0;
        if (r < ch.count) {
            uint64_t at = base + (uint64_t)pos;
            while (at != ch.mine) {
                if (at - tail > ch.mask) {  // no room: wait for this part's consumer, or a stop
                    if (mesh_ld_acquire_u32(mesh_slot_at(c, MESH_SLOT_STOP)) != 0u) {
                        stopped = 1;
                        break;
                    }
                    tail = mesh_ld_acquire_u64(mesh_bulk_tail_line(&ch, r));
                    continue;
                }
                if (ch.placement == MESH_PLACEMENT_HOST) mesh_st_release_u64(mesh_bulk_flag(&ch, at, r), at + 1u);
                else mesh_st_release_gpu_u64(mesh_bulk_flag(&ch, at, r), at + 1u);
                at++;
            }
            if (at != base + (uint64_t)pos) mesh_st_volatile_u64(mesh_bulk_head_line(&ch, r), at);
            tail_at = (int64_t)(tail - base);
        }
        // The slowest tail, for the room check (after the waits: they may have moved).
        ch.other = base - (uint64_t)mesh_block_max_of(-tail_at, ch.count);
        if (mesh_block_max_of(stopped, ch.count) != 0) ch.msg_size = 0;  // every call fails; close too
    } else if (r < ch.count && tail != ch.mine) {
        mesh_st_release_u64(mesh_bulk_tail_line(&ch, r), ch.mine);
    }
    __syncthreads();
    return ch;
}

// Opens binding `b` of protocol bulk as a producer (`producer` true) or consumer, one block serving
// every part: mesh_bulk_open_part(c, b, producer, 0, 1).
static __device__ mesh_bulk mesh_bulk_open(const mesh_ctx& c, uint32_t b, bool producer) {
    return mesh_bulk_open_part(c, b, producer, 0u, 1u);
}

// Publishes this end's position: every part it serves (its line), and, from the block serving part 0,
// the ring header's lower bound over every part (for `meshd info`; one part: the same word). Both ends
// publish their parts on every message already; call it on every bulk channel before mesh_end anyway
// (what the next launch resumes from is then certain).
static __device__ __forceinline__ void mesh_bulk_close(mesh_bulk* ch) {
    __syncthreads();
    if (ch->msg_size == 0) return;
    const uint32_t r = mesh_block_rank();
    const uint32_t side = ch->producer ? 0u : MESH_RING_TAIL - MESH_RING_HEAD;
    if (r < ch->count) {
        if (ch->producer) mesh_st_release_u64(mesh_bulk_head_line(ch, r), ch->mine);
        else mesh_st_release_u64(mesh_bulk_tail_line(ch, r), ch->mine);
    }
    if (ch->parts == 1u || ch->first != 0u) return;
    // Block 0's threads read every part's line (other blocks' too: reading needs no ownership).
    const char* line0 = ch->lines;
    int64_t behind = 0;
    if (r < ch->parts) behind = (int64_t)(ch->mine - mesh_ld_acquire_u64(line0 + (uint64_t)r * ch->line_step + side));
    const int64_t most = mesh_block_max_of(behind, ch->parts);
    if (r == 0) mesh_st_release_u64(ch->ring + (ch->producer ? MESH_RING_HEAD : MESH_RING_TAIL), ch->mine - (uint64_t)most);
}

// Free slots a producer can fill now (the same on every thread; reads its parts' tails, one round
// trip, only when the ring looks full). The tails are loaded with acquire semantics, and the barrier
// of the reduction passes that on to the block: the consumers' reads of a slot's last lap (before
// their release of the tail) are then ordered before the block's stores into it. A relaxed or volatile
// load would leave that to the hardware not issuing a store before the load it depends on has
// returned, which the PTX memory model does not promise (the payload accesses are weak, so that would
// be a data race); once per ring that looked full, the acquire costs nothing that matters. A tail
// ahead of this end (its consumer skipped messages when it resumed) moves the producer there.
// mesh_bulk_room_for(ch, want) reads the tails when fewer than `want` slots look free (mesh_bulk_room:
// when none does), so that a caller that needs `want` at once sees the room the consumer made.
static __device__ __forceinline__ uint32_t mesh_bulk_room_for(mesh_bulk* ch, uint32_t want) {
    if (ch->msg_size == 0 || !ch->producer) return 0;
    if (ch->mine - ch->other + (want ? want - 1u : 0u) > ch->mask) {
        const uint32_t r = mesh_block_rank();
        int64_t used = INT64_MIN;
        if (r < ch->count) used = (int64_t)(ch->mine - mesh_ld_acquire_u64(mesh_bulk_tail_line(ch, r)));
        const int64_t most = mesh_block_max_of(used, ch->count);
        if (most < 0) ch->mine -= (uint64_t)most;  // every tail ahead: jump to the nearest
        ch->other = ch->mine - (uint64_t)(most < 0 ? 0 : most);
    }
    const uint64_t used = ch->mine - ch->other;
    return used > ch->mask ? 0u : (uint32_t)(ch->mask + 1u - used);
}
static __device__ __forceinline__ uint32_t mesh_bulk_room(mesh_bulk* ch) {
    return mesh_bulk_room_for(ch, 1u);
}

// This block's share of the next message's slot for the block to write in place (msg_size bytes,
// 16-byte aligned), or NULL when the ring is full. Write it with ordinary stores, then
// mesh_block_publish.
static __device__ __forceinline__ void* mesh_block_reserve(mesh_bulk* ch) {
    return mesh_bulk_room(ch) == 0 ? (void*)0 : (void*)mesh_bulk_slot(ch, ch->mine);
}

// Makes the share written into the slot mesh_block_reserve gave visible to the consumer: the block
// synchronises (every thread's stores are ordered before the flag stores), then each of threads
// 0 .. count - 1 stores one part's flag with release semantics (system scope for a host channel, GPU
// scope for a device one), which orders what the block stored before it: NCCL's Simple protocol does
// the same (a barrier, then one thread's fence.acq_rel.sys and the step store), so one fence per part
// and message, not one per thread. Then each stores its part's head.
static __device__ __forceinline__ void mesh_block_publish(mesh_bulk* ch) {
    const bool host = ch->placement == MESH_PLACEMENT_HOST;
    __syncthreads();
    const uint32_t r = mesh_block_rank();
    if (r < ch->count) {
        const uint64_t flag = ch->mine + 1u;
        if (host) mesh_st_release_u64(mesh_bulk_flag(ch, ch->mine, r), flag);
        else mesh_st_release_gpu_u64(mesh_bulk_flag(ch, ch->mine, r), flag);
        mesh_st_volatile_u64(mesh_bulk_head_line(ch, r), flag);
    }
    ch->mine += 1u;
}

// Sends this block's share of one message from `msg` (msg_size bytes, 16-byte aligned: for a block
// serving a share of the parts, the share alone). False on every thread when the ring is full. 16
// bytes per thread per load and store, 4 in flight; one fence per part.
static __device__ __forceinline__ bool mesh_block_try_send(mesh_bulk* ch, const void* msg) {
    void* slot = mesh_block_reserve(ch);
    if (slot == 0) return false;
    mesh_block_copy((uint4*)slot, (const uint4*)msg, ch->msg_size / 16u);
    mesh_block_publish(ch);
    return true;
}

// Messages a consumer's peek looks at in one round trip (a flag of each of its parts each), so that a
// consumer behind its producer learns of several whole messages at once and takes the next ones
// without loading a flag: at 1 MiB over 32 blocks (32 KiB a block a message) the load was a third of
// a message's time. At most 32 flags a block (one warp's lanes), so fewer for a block of many parts.
#ifndef MESH_BULK_LOOKAHEAD
#define MESH_BULK_LOOKAHEAD 8u
#endif
static_assert(MESH_BULK_LOOKAHEAD >= 1u, "MESH_BULK_LOOKAHEAD: a peek must look at one message at least");

// This block's share of the next message, in place (msg_size bytes, 16-byte aligned), or NULL on every
// thread when its parts are not all whole yet. Read it with ordinary loads (the acquires of the flags
// and the block barrier order them after the producer's stores), then mesh_block_release; until then
// it stays the program's and the producer cannot reuse its parts of the slot. The first warp's lanes
// load the flags of up to MESH_BULK_LOOKAHEAD messages (lane r: message mine + r / count, part r %
// count) with acquire semantics; the messages found whole in a row are remembered (`other`), and the
// peeks that follow return them with no load and no barrier: the acquires and the barrier after them
// already order every thread's reads of those slots after the producer's stores.
static __device__ __forceinline__ const void* mesh_block_peek(mesh_bulk* ch) {
    if (ch->msg_size == 0 || ch->producer) return 0;
    if ((int64_t)(ch->other - ch->mine) > 0) return (const void*)mesh_bulk_slot(ch, ch->mine);
    const uint32_t r = mesh_block_rank(), threads = mesh_block_threads();
    const uint32_t lanes_n = threads < 32u ? threads : 32u;  // the voters: a thread a flag
    uint32_t ahead = MESH_BULK_LOOKAHEAD < lanes_n / ch->count ? MESH_BULK_LOOKAHEAD : lanes_n / ch->count;
    if (ahead > ch->mask + 1u) ahead = ch->mask + 1u;
    uint64_t whole = 0;
    if (r < 32u) {
        bool missing = false;
        if (r < ch->count * ahead) {
            const uint64_t m = ch->mine + r / ch->count;
            missing = mesh_bulk_ld_flag(ch, mesh_bulk_flag(ch, m, r % ch->count)) != m + 1u;
        }
        const uint32_t lanes = threads >= 32u ? 0xffffffffu : (1u << threads) - 1u;
        const uint32_t gaps = __ballot_sync(lanes, missing);
        // Whole messages in a row: those before the first with a part missing.
        whole = gaps == 0u ? ahead : ((uint32_t)__ffs((int)gaps) - 1u) / ch->count;
    }
    whole = mesh_block_bcast(whole);
    ch->other = ch->mine + whole;
    return whole ? (const void*)mesh_bulk_slot(ch, ch->mine) : (const void*)0;
}

#ifndef MESH_HOST_EMULATION  // (a CPU test build supplies these: crates/mesh-shm/tests/emu)
// A relaxed store at system scope: the consumer's tail (see mesh_block_release).
static __device__ __forceinline__ void mesh_st_relaxed_sys_u64(void* p, uint64_t v) {
    asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// A fence that makes every earlier access of this thread (and, after a block barrier, of the block)
// visible before its later stores at system / GPU scope; followed by a relaxed store it is a release
// pattern (PTX memory model), one fence for any number of such stores.
static __device__ __forceinline__ void mesh_fence_acq_rel_sys(void) {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}
static __device__ __forceinline__ void mesh_fence_acq_rel_gpu(void) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
static __device__ __forceinline__ void mesh_st_relaxed_gpu_u64(void* p, uint64_t v) {
    asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
#endif  // MESH_HOST_EMULATION

// Messages mesh_block_reserve_n, mesh_block_try_send_n, mesh_block_peek_n and mesh_block_try_recv_n
// take in one call at most.
#define MESH_BULK_SEND_MAX 8u

// Several messages a call. A block that has several messages' worth of work at hand pays the ring's
// per-message costs once for all of them: at 32 KiB a block a message (1 MiB over 32 blocks) the
// producer's barrier and release fence cost about half a message's copy (docs/design/speed.md). In
// place, a producer reserves up to n slots (mesh_block_reserve_n), writes each share
// (mesh_block_reserved(ch, k)) and publishes them all (mesh_block_publish_n: one barrier, one fence
// per part); a consumer learns of up to n whole messages (mesh_block_peek_n: at most one round trip of
// flag loads), reads each (mesh_block_peeked(ch, k)) and gives them all back (mesh_block_release_n: one
// barrier). The copy path's mesh_block_try_send_n and mesh_block_try_recv_n are those with a copy
// each. The consumer sees each message whole when its flags are, in order; the price is latency: the
// first message waits for the last one's writing. In place, four at a time (tests/programs/
// bulk_parts_source.cu and bulk_parts_sink.cu built with PARTS_FILL_N / PARTS_RECV_N 4):
//
//     const uint32_t n = mesh_block_reserve_n(&out, 4);          // up to 4 free slots (0: full)
//     for (uint32_t k = 0; k < n; k++) fill((uint32_t*)mesh_block_reserved(&out, k), out.mine + k);
//     mesh_block_publish_n(&out, n);                            // one barrier and one fence for the n
//
//     const uint32_t m = mesh_block_peek_n(&in, 4);              // up to 4 whole messages (0: none yet)
//     for (uint32_t k = 0; k < m; k++) use((const uint32_t*)mesh_block_peeked(&in, k), in.mine + k);
//     if (m != 0) mesh_block_release_n(&in, m);                 // one barrier to give the m back

// Reserves up to n of the next slots (n at most MESH_BULK_SEND_MAX) to write in place at once: how many
// (the same on every thread; 0 when the ring is full). The tails are read when fewer than n slots look
// free. Slot k's share (k below the count) is mesh_block_reserved(ch, k); write them with ordinary
// stores, then mesh_block_publish_n(ch, count).
static __device__ __forceinline__ uint32_t mesh_block_reserve_n(mesh_bulk* ch, uint32_t n) {
    if (n > MESH_BULK_SEND_MAX) n = MESH_BULK_SEND_MAX;
    const uint32_t room = mesh_bulk_room_for(ch, n);
    return room < n ? room : n;
}

// This block's share of the k-th slot mesh_block_reserve_n reserved (msg_size bytes, 16-byte aligned).
static __device__ __forceinline__ void* mesh_block_reserved(const mesh_bulk* ch, uint32_t k) {
    return (void*)mesh_bulk_slot(ch, ch->mine + k);
}

// Makes the n slots mesh_block_reserve_n reserved (n at most what it returned) visible to the consumer,
// in order: ONE block barrier and, per part, ONE fence and a relaxed flag store per message (a release
// pattern each), where n calls of mesh_block_publish pay n barriers and n release stores; then each
// part's head.
static __device__ __forceinline__ void mesh_block_publish_n(mesh_bulk* ch, uint32_t n) {
    if (n == 0) return;
    __syncthreads();
    const uint32_t r = mesh_block_rank();
    if (r < ch->count) {
        const bool host = ch->placement == MESH_PLACEMENT_HOST;
        if (host) mesh_fence_acq_rel_sys();
        else mesh_fence_acq_rel_gpu();
        for (uint32_t k = 0; k < n; k++) {
            const uint64_t flag = ch->mine + k + 1u;
            if (host) mesh_st_relaxed_sys_u64(mesh_bulk_flag(ch, ch->mine + k, r), flag);
            else mesh_st_relaxed_gpu_u64(mesh_bulk_flag(ch, ch->mine + k, r), flag);
        }
        mesh_st_volatile_u64(mesh_bulk_head_line(ch, r), ch->mine + n);
    }
    ch->mine += n;
}

// Sends this block's share of up to `n` messages at once (n at most MESH_BULK_SEND_MAX; msgs[k] as `msg`
// of mesh_block_try_send): as many as the ring has room for, msgs[0] first; returns how many (the same
// on every thread; 0 when the ring is full): mesh_block_reserve_n, a copy each, mesh_block_publish_n.
// Measured with bulk_parts_source_x_send2.cu (two a call): see "How many blocks" above.
static __device__ __forceinline__ uint32_t mesh_block_try_send_n(mesh_bulk* ch, const void* const* msgs, uint32_t n) {
    n = mesh_block_reserve_n(ch, n);
    for (uint32_t k = 0; k < n; k++)
        mesh_block_copy((uint4*)mesh_block_reserved(ch, k), (const uint4*)msgs[k], ch->msg_size / 16u);
    mesh_block_publish_n(ch, n);
    return n;
}

// Gives the share mesh_block_peek returned back to the producer (mesh_block_release_n: the first n of
// the messages mesh_block_peek_n found, n at most what it returned, with the one barrier): the block
// synchronises (every thread's reads of it are done) and each of threads 0 .. count - 1 publishes
// one part's tail with a relaxed store, no fence. A release there would wait until every store the
// block made before it had reached memory, and on the copy path (mesh_block_try_recv) those are the whole share copied
// out: at 32 KiB a block a message that wait was as long as the copy. The tail orders only the
// block's *loads* of the slot, and those are done: each copied value was stored (a store cannot
// issue before the load it stores has returned), and in-place readers are past the barrier. NCCL's
// Simple protocol posts a receiver's step the same way (`postPeer`: a barrier, then
// `st_relaxed_sys_global`, with `fence_acq_rel_sys` only on the sender's side). The producer's
// mesh_bulk_room acquires the tail, and its next stores into the slot come after that.
static __device__ __forceinline__ void mesh_block_release_n(mesh_bulk* ch, uint32_t n) {
    __syncthreads();
    ch->mine += n;
    if (mesh_block_rank() < ch->count) mesh_st_relaxed_sys_u64(mesh_bulk_tail_line(ch, mesh_block_rank()), ch->mine);
}
static __device__ __forceinline__ void mesh_block_release(mesh_bulk* ch) {
    mesh_block_release_n(ch, 1u);
}

// How many of the next messages are whole, up to n (n at most MESH_BULK_SEND_MAX; the same on every
// thread; 0 when the next is not): the messages mesh_block_peek already knows whole, else its one round
// trip of flag loads (up to MESH_BULK_LOOKAHEAD messages; so at most that many). Message k's share (k
// below the count) is mesh_block_peeked(ch, k), read in place; give them back with
// mesh_block_release_n(ch, count).
static __device__ __forceinline__ uint32_t mesh_block_peek_n(mesh_bulk* ch, uint32_t n) {
    if (n == 0 || mesh_block_peek(ch) == 0) return 0;
    if (n > MESH_BULK_SEND_MAX) n = MESH_BULK_SEND_MAX;
    const uint64_t known = ch->other - ch->mine;
    return known < n ? (uint32_t)known : n;
}

// This block's share of the k-th message mesh_block_peek_n found whole (msg_size bytes, 16-byte aligned).
static __device__ __forceinline__ const void* mesh_block_peeked(const mesh_bulk* ch, uint32_t k) {
    return (const void*)mesh_bulk_slot(ch, ch->mine + k);
}

// Receives this block's share of one message into `out` (msg_size bytes, 16-byte aligned). False on
// every thread when it is not whole yet (`out` untouched).
static __device__ __forceinline__ bool mesh_block_try_recv(mesh_bulk* ch, void* out) {
    const void* msg = mesh_block_peek(ch);
    if (msg == 0) return false;
    mesh_block_copy((uint4*)out, (const uint4*)msg, ch->msg_size / 16u);
    mesh_block_release(ch);
    return true;
}

// Receives this block's share of up to n whole messages at once (n at most MESH_BULK_SEND_MAX), message
// k into outs[k] (as `out` of mesh_block_try_recv): how many (the same on every thread; 0 when the
// next is not whole): mesh_block_peek_n, a copy each, mesh_block_release_n.
static __device__ __forceinline__ uint32_t mesh_block_try_recv_n(mesh_bulk* ch, void* const* outs, uint32_t n) {
    n = mesh_block_peek_n(ch, n);
    if (n == 0) return 0;
    for (uint32_t k = 0; k < n; k++)
        mesh_block_copy((uint4*)outs[k], (const uint4*)mesh_block_peeked(ch, k), ch->msg_size / 16u);
    mesh_block_release_n(ch, n);
    return n;
}

// Sends one message, waiting for room; false on every thread if meshd asked the program to stop first
// (the message is then not sent).
static __device__ __forceinline__ bool mesh_block_send(mesh_ctx& c, mesh_bulk* ch, const void* msg) {
    if (ch->msg_size == 0 || !ch->producer) return false;
    while (!mesh_block_try_send(ch, msg))
        if (mesh_block_should_stop(c)) return false;
    return true;
}

// Receives one message into `out`, waiting for it; false on every thread if meshd asked the program to
// stop first.
static __device__ __forceinline__ bool mesh_block_recv(mesh_ctx& c, mesh_bulk* ch, void* out) {
    if (ch->msg_size == 0 || ch->producer) return false;
    while (!mesh_block_try_recv(ch, out))
        if (mesh_block_should_stop(c)) return false;
    return true;
}
