// bulk_stress.cuh: what the bulk stream programs (bulk_source.cu, bulk_sink.cu) write, check and report;
// stress.cuh's message format (sequence number, words, checksum over every byte), filled and checked by
// a whole block in place in a bulk ring's slot. mesh-gpu-tests' `stress::bulk` reads the same words.
//
// Block b (b < 8) of a program serves binding b (a bulk channel); the binding after the last block's,
// if it is an 8-byte LL channel, holds the knobs (stress.cuh). Blocks must be a multiple of 32 threads.
#pragma once
#include "stress.cuh"

// User words: launches (block 0), and per block b: messages sent or passed (BULK_COUNT(b), two words),
// and BULK_BAD(b): messages that failed the check in the low 20 bits, launches that found the channel's
// position differ from the count kept (a message lost or repeated across a relaunch) above.
#define BULK_LAUNCHES 0u
#define BULK_COUNT(b) (8u + 3u * (b))
#define BULK_BAD(b) (10u + 3u * (b))
#define BULK_RESUME_ONE (1u << 20)
#define BULK_MAX_BLOCKS 8u
// Largest message of the FIXED (benchmark) mode, which copies from / into a buffer of each block's own.
#define BULK_FIXED_MAX (16u << 20)

static __device__ __forceinline__ uint32_t bulk_block_sum(uint32_t part) {
    __shared__ uint32_t bulk_sum;
    if (mesh_block_rank() == 0) bulk_sum = 0;
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (mesh_detail_lane() == 0) atomicAdd(&bulk_sum, part);
    __syncthreads();
    const uint32_t sum = bulk_sum;
    __syncthreads();
    return sum;
}

// Writes message seq (words 4-byte words) into buf with every thread of the block.
static __device__ __forceinline__ void bulk_fill(uint32_t* buf, uint64_t seq, uint32_t words) {
    uint32_t part = 0;
    for (uint32_t k = mesh_block_rank(); k + 1 < words; k += mesh_block_threads()) {
        const uint32_t v = stress_value(seq, k);
        buf[k] = v;
        part += stress_term(v, k);
    }
    const uint32_t sum = bulk_block_sum(part);
    if (mesh_block_rank() == 0) buf[words - 1] = stress_finish(sum, seq);
}

// Whether buf holds message seq whole, on every thread of the block.
static __device__ __forceinline__ bool bulk_check(const uint32_t* buf, uint64_t seq, uint32_t words) {
    uint32_t part = 0;
    for (uint32_t k = mesh_block_rank(); k + 1 < words; k += mesh_block_threads()) part += stress_term(buf[k], k);
    const uint32_t sum = bulk_block_sum(part);
    return buf[0] == (uint32_t)seq && buf[words - 1] == stress_finish(sum, seq);
}

static __device__ __forceinline__ void bulk_set_count(const mesh_ctx& ctx, uint32_t b, uint64_t count) {
    stress_set(ctx, BULK_COUNT(b), (uint32_t)count);
    stress_set(ctx, BULK_COUNT(b) + 1u, (uint32_t)(count >> 32));
}
static __device__ __forceinline__ uint64_t bulk_count(const mesh_ctx& ctx, uint32_t b) {
    return (uint64_t)mesh_user_load(ctx, BULK_COUNT(b)) | ((uint64_t)mesh_user_load(ctx, BULK_COUNT(b) + 1u) << 32);
}
