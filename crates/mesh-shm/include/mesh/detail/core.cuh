// mesh/detail/core.cuh: the definitions of mesh/core.cuh's calls, and the block-wide helpers the bulk
// calls share. Not for programs: names starting with mesh_detail_ may change.
#pragma once
#include "../core.cuh"

static __device__ __forceinline__ bool mesh_should_stop(mesh_ctx& c) {
    const uint64_t now = mesh_globaltimer();
    if (now < c.stop_due) return false;
    if (c.stop_seen != 0) return true;
    c.stop_seen = mesh_detail_ld_relaxed_u32(mesh_detail_slot_at(c, MESH_SLOT_STOP));
    c.stop_due = now + MESH_STOP_PERIOD_NS;
    return false;
}

static __device__ __forceinline__ bool mesh_should_stop(const mesh_ctx& c) {
    return mesh_detail_ld_relaxed_u32(mesh_detail_slot_at(c, MESH_SLOT_STOP)) != 0;
}

static __device__ __forceinline__ uint64_t mesh_begin(const mesh_ctx& c) {
    uint32_t gen = mesh_detail_ld_acquire_u32(mesh_detail_slot_at(c, MESH_SLOT_GENERATION));
    uint64_t beat = *(volatile uint64_t*)mesh_detail_slot_at(c, MESH_SLOT_HEARTBEAT);
    *(volatile uint32_t*)mesh_detail_slot_at(c, MESH_SLOT_SEEN_GENERATION) = gen;
    mesh_detail_st_release_u32(mesh_detail_slot_at(c, MESH_SLOT_STATE), MESH_STATE_RUNNING);
    return beat;
}

static __device__ __forceinline__ void mesh_heartbeat(const mesh_ctx& c, uint64_t beat) {
    *(volatile uint64_t*)mesh_detail_slot_at(c, MESH_SLOT_HEARTBEAT) = beat;
}

static __device__ __forceinline__ void mesh_end(const mesh_ctx& c) {
    mesh_detail_st_release_u32(mesh_detail_slot_at(c, MESH_SLOT_STATE), MESH_STATE_STOPPED);
}

static __device__ __forceinline__ void mesh_exit(const mesh_ctx& c, int32_t code) {
    *(volatile int32_t*)mesh_detail_slot_at(c, MESH_SLOT_EXIT_CODE) = code;
    mesh_detail_st_release_u32(mesh_detail_slot_at(c, MESH_SLOT_STATE), MESH_STATE_EXITED);
}

static __device__ __forceinline__ void mesh_user_store(const mesh_ctx& c, uint32_t i, uint32_t v) {
    if (i < MESH_SLOT_USER_WORDS) mesh_detail_st_release_u32(mesh_detail_slot_at(c, MESH_SLOT_USER) + 4u * i, v);
}

static __device__ __forceinline__ uint32_t mesh_user_load(const mesh_ctx& c, uint32_t i) {
    return i < MESH_SLOT_USER_WORDS ? *(volatile uint32_t*)(mesh_detail_slot_at(c, MESH_SLOT_USER) + 4u * i) : 0u;
}

static __device__ __forceinline__ uint32_t mesh_block_rank(void) {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

static __device__ __forceinline__ uint32_t mesh_block_threads(void) {
    return blockDim.x * blockDim.y * blockDim.z;
}

// Thread 0's `v`, on every thread of the block.
static __device__ __forceinline__ uint64_t mesh_detail_block_bcast(uint64_t v) {
    __shared__ uint64_t mesh_detail_bcast_word;
    __syncthreads();  // every thread has read the previous value
    if (mesh_block_rank() == 0) mesh_detail_bcast_word = v;
    __syncthreads();
    return mesh_detail_bcast_word;
}

// The largest `v` of threads 0 .. n - 1 (n from 1 to MESH_BULK_MAX_PARTS), on every thread of the
// block, compared as signed distances (`v` is a difference of two sequence numbers, or a count).
static __device__ __forceinline__ int64_t mesh_detail_block_max_of(int64_t v, uint32_t n) {
    __shared__ int64_t mesh_detail_max_words[MESH_BULK_MAX_PARTS];
    __syncthreads();  // every thread has read the previous values
    if (mesh_block_rank() < n) mesh_detail_max_words[mesh_block_rank()] = v;
    __syncthreads();
    int64_t m = mesh_detail_max_words[0];
    for (uint32_t i = 1; i < n; i++) m = mesh_detail_max_words[i] > m ? mesh_detail_max_words[i] : m;
    return m;
}

static __device__ __forceinline__ bool mesh_block_should_stop(mesh_ctx& c) {
    return mesh_detail_block_bcast(mesh_block_rank() == 0 ? (uint64_t)mesh_should_stop(c) : 0u) != 0;
}

// The grid's count of blocks done, and the first nonzero code, in device memory: a function-scope
// static, so that only a program that calls mesh_grid_end carries them.
static __device__ __forceinline__ uint32_t* mesh_detail_grid_words(void) {
    static uint32_t mesh_detail_grid_done[2];
    return mesh_detail_grid_done;
}

static __device__ void mesh_grid_end(const mesh_ctx& c, int32_t code) {
    uint32_t* const w = mesh_detail_grid_words();
    if (code != 0) atomicCAS(&w[1], 0u, (uint32_t)code);
    __threadfence();  // this block's closes (and code) before its count
    if (atomicAdd(&w[0], 1u) != gridDim.x * gridDim.y * gridDim.z - 1u) return;
    __threadfence();
    const int32_t first = (int32_t)atomicExch(&w[1], 0u);
    w[0] = 0;  // a __device__ word survives the relaunch of a blink: the next launch counts from 0
    __threadfence();
    if (first != 0) mesh_exit(c, first);
    else mesh_end(c);
}
