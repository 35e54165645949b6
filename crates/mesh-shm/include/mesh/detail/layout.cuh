// mesh/detail/layout.cuh: the mailbox's layout as the device sees it. The block between the markers is
// generated from mesh-shm's layout.rs (a test compares them); the structs carry static_asserts so that
// nvcc checks them too.
#pragma once
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "mesh.cuh needs compute capability 7.0 or later (__match_any_sync, ld.acquire.sys): build with -arch=compute_80, say"
#endif
#include <stddef.h>
#include <stdint.h>

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
