// mesh.cuh: the device side of meshd's mailbox (mesh-shm), for programs whose mesh_main meshd runs.
//
// A program is `extern "C" __global__ void mesh_main(mesh_ctx ctx)`, launched once and looping until
// mesh_should_stop(ctx). The mailbox lives in host memory mapped into the GPU's address space: every
// access crosses PCIe, so channel ends cache the other side's index (mesh_chan) and read it only when
// the ring looks full or empty. The H200 has no host-native atomics, so each shared word has exactly
// one writer: the kernel writes its status line and its rings' own indices, meshd the control line.
// Ordering: slot writes, then st.release.sys of the index; ld.acquire.sys of the index, then slot reads.
//
// Slot states: MESH_STATE_IDLE (armed by meshd, not yet started), MESH_STATE_RUNNING (mesh_begin),
// MESH_STATE_STOPPED (mesh_end after a stop request), MESH_STATE_EXITED (mesh_exit with a code).
// A program may report up to MESH_SLOT_USER_WORDS words of its own through mesh_user_store; the
// mailbox has layout version MESH_LAYOUT_VERSION, checked by meshd when it opens the file; each program
// slot is MESH_SLOT_SIZE bytes (meshd passes its offset in mesh_ctx.slot_offset).
#pragma once
#include <stdint.h>
#include <stddef.h>

// BEGIN GENERATED LAYOUT (from mesh-shm's layout.rs; MESH_BLESS=1 cargo test -p mesh-shm rewrites it)
#define MESH_LAYOUT_VERSION 2u
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
#define MESH_STATE_IDLE 0u
#define MESH_STATE_RUNNING 1u
#define MESH_STATE_STOPPED 2u
#define MESH_STATE_EXITED 3u
typedef struct {
    uint64_t ring_offset;
    uint32_t msg_size;
    uint32_t capacity;
} mesh_binding;
typedef struct {
    uint64_t base;
    uint64_t slot_offset;
    uint32_t slot;
    uint32_t binding_count;
    mesh_binding bindings[MESH_MAX_BINDINGS];
} mesh_ctx;
static_assert(sizeof(mesh_binding) == 16, "sizeof(mesh_binding) disagrees with mesh-shm");
static_assert(offsetof(mesh_binding, msg_size) == 8, "offsetof(mesh_binding, msg_size) disagrees with mesh-shm");
static_assert(offsetof(mesh_binding, capacity) == 12, "offsetof(mesh_binding, capacity) disagrees with mesh-shm");
static_assert(sizeof(mesh_ctx) == 152, "sizeof(mesh_ctx) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, slot_offset) == 8, "offsetof(mesh_ctx, slot_offset) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, slot) == 16, "offsetof(mesh_ctx, slot) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, binding_count) == 20, "offsetof(mesh_ctx, binding_count) disagrees with mesh-shm");
static_assert(offsetof(mesh_ctx, bindings) == 24, "offsetof(mesh_ctx, bindings) disagrees with mesh-shm");
// END GENERATED LAYOUT

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
static __device__ __forceinline__ void mesh_st_release_u64(void* p, uint64_t v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ void mesh_st_release_u32(void* p, uint32_t v) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ char* mesh_at(const mesh_ctx& c, uint64_t offset) {
    return (char*)(uintptr_t)(c.base + offset);
}
static __device__ __forceinline__ char* mesh_slot_at(const mesh_ctx& c, uint64_t field) {
    return mesh_at(c, c.slot_offset + field);
}

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

// True once meshd asks the program to stop. Cheap enough to poll every iteration (one PCIe read).
static __device__ __forceinline__ bool mesh_should_stop(const mesh_ctx& c) {
    return mesh_ld_acquire_u32(mesh_slot_at(c, MESH_SLOT_STOP)) != 0;
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

// Publishes the heartbeat (one thread; the value the program counts, rising).
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

// Stores word `i` (< MESH_SLOT_USER_WORDS) of the program's user line.
static __device__ __forceinline__ void mesh_user_store(const mesh_ctx& c, uint32_t i, uint32_t v) {
    if (i < MESH_SLOT_USER_WORDS) mesh_st_release_u32(mesh_slot_at(c, MESH_SLOT_USER) + 4u * i, v);
}

// One end of a bound channel, held in registers by the one thread that uses it.
typedef struct {
    char* ring;           // the ring's header
    uint32_t msg_size;    // bytes per message, a multiple of 8
    uint32_t mask;        // capacity - 1
    uint64_t mine;        // this end's index (head for a producer, tail for a consumer)
    uint64_t other;       // cached copy of the other end's index
    bool producer;
} mesh_chan;

// Opens binding `b` as a producer (`producer` true) or consumer. An unbound `b` gives msg_size 0.
static __device__ __forceinline__ mesh_chan mesh_chan_open(const mesh_ctx& c, uint32_t b, bool producer) {
    mesh_chan ch = {0, 0, 0, 0, 0, producer};
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0) return ch;
    ch.ring = mesh_at(c, c.bindings[b].ring_offset);
    ch.msg_size = c.bindings[b].msg_size;
    ch.mask = c.bindings[b].capacity - 1;
    if (producer) {
        ch.mine = *(volatile uint64_t*)(ch.ring + MESH_RING_HEAD);
        ch.other = mesh_ld_acquire_u64(ch.ring + MESH_RING_TAIL);
    } else {
        ch.mine = *(volatile uint64_t*)(ch.ring + MESH_RING_TAIL);
        ch.other = mesh_ld_acquire_u64(ch.ring + MESH_RING_HEAD);
    }
    return ch;
}

// Free slots a producer can fill now (refreshing the cached consumer index when it looks full).
// A program that relays messages checks this before it receives, so that a stop never finds it
// holding a message it could not pass on.
static __device__ __forceinline__ uint32_t mesh_chan_room(mesh_chan* ch) {
    if (ch->msg_size == 0 || !ch->producer) return 0;
    if (ch->mine - ch->other > ch->mask) ch->other = mesh_ld_acquire_u64(ch->ring + MESH_RING_TAIL);
    uint64_t used = ch->mine - ch->other;
    return used > ch->mask ? 0u : (uint32_t)(ch->mask + 1u - used);
}

// Sends one message of ch->msg_size bytes (8-byte aligned). False when the ring is full.
static __device__ __forceinline__ bool mesh_try_send(mesh_chan* ch, const void* msg) {
    if (ch->msg_size == 0 || !ch->producer) return false;
    if (ch->mine - ch->other > ch->mask) {
        ch->other = mesh_ld_acquire_u64(ch->ring + MESH_RING_TAIL);
        if (ch->mine - ch->other > ch->mask) return false;
    }
    volatile uint64_t* dst = (volatile uint64_t*)(ch->ring + MESH_RING_SLOTS + (ch->mine & ch->mask) * ch->msg_size);
    const uint64_t* src = (const uint64_t*)msg;
    for (uint32_t i = 0; i < ch->msg_size / 8u; i++) dst[i] = src[i];
    ch->mine += 1;
    mesh_st_release_u64(ch->ring + MESH_RING_HEAD, ch->mine);
    return true;
}

// Publishes a consumer's index after mesh_try_recv_deferred calls: the slots read become free.
static __device__ __forceinline__ void mesh_chan_commit(mesh_chan* ch) {
    if (ch->msg_size != 0 && !ch->producer) mesh_st_release_u64(ch->ring + MESH_RING_TAIL, ch->mine);
}

// Like mesh_try_recv, but leaves the slot held until mesh_chan_commit: a relay sends its reply first
// and frees the slot after, taking one sys-scope release off the round trip.
static __device__ __forceinline__ bool mesh_try_recv_deferred(mesh_chan* ch, void* out) {
    if (ch->msg_size == 0 || ch->producer) return false;
    if (ch->mine == ch->other) {
        ch->other = mesh_ld_acquire_u64(ch->ring + MESH_RING_HEAD);
        if (ch->mine == ch->other) return false;
    }
    const volatile uint64_t* src =
        (const volatile uint64_t*)(ch->ring + MESH_RING_SLOTS + (ch->mine & ch->mask) * ch->msg_size);
    uint64_t* dst = (uint64_t*)out;
    for (uint32_t i = 0; i < ch->msg_size / 8u; i++) dst[i] = src[i];
    ch->mine += 1;
    return true;
}

// Receives one message into `out` (ch->msg_size bytes, 8-byte aligned). False when the ring is empty.
static __device__ __forceinline__ bool mesh_try_recv(mesh_chan* ch, void* out) {
    if (!mesh_try_recv_deferred(ch, out)) return false;
    mesh_chan_commit(ch);
    return true;
}
