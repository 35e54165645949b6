// bulk_parts.cuh: what the parts programs (bulk_parts_source.cu, bulk_parts_sink.cu) write, check and
// report: ONE bulk channel (binding 0, created with `--parts P`) served by every block of the grid
// (a power of two up to P), block i moving its share of the parts (mesh_bulk_open_part).
//
// Message seq's 4-byte word k (counted over the whole message) is stress_value(seq, k) (stress.cuh);
// each block writes or checks the words of its own share, so every byte of every message is checked
// by the block that received it. Binding 1, if it is an 8-byte LL channel, holds the knobs
// (stress.cuh: STRESS_FIXED sends one buffer / copies each share out unchecked, for benchmarks).
//
// User words: word i (i < 32) is block i's alone: messages sent or received in its low 24 bits, shares
// that failed the check above (at most 255; a position found different from the count kept across a
// relaunch counts as one too). The host test and the bench read them (mesh-gpu-tests' parts).
#pragma once
#include "stress.cuh"

#define PARTS_MAX_BLOCKS 32u
#define PARTS_COUNT_MASK 0xffffffu
#define PARTS_BAD_SHIFT 24u
// Largest message of the FIXED (benchmark) mode, whose buffer every block shares, each its own share.
#define PARTS_FIXED_MAX (16u << 20)

__device__ uint4 bulk_parts_buf[PARTS_FIXED_MAX / 16u];

static __device__ __forceinline__ void parts_report(const mesh_ctx& ctx, uint32_t block, uint64_t count, uint32_t bad) {
    if (mesh_block_rank() == 0 && block < PARTS_MAX_BLOCKS)
        stress_set(ctx, block, ((bad > 255u ? 255u : bad) << PARTS_BAD_SHIFT) | ((uint32_t)count & PARTS_COUNT_MASK));
}

// Writes this block's share (words words, the first at message word `first`) of message seq.
static __device__ __forceinline__ void parts_fill(uint32_t* share, uint64_t seq, uint32_t first, uint32_t words) {
    for (uint32_t k = mesh_block_rank(); k < words; k += mesh_block_threads()) share[k] = stress_value(seq, first + k);
}

// Whether this block's share of message seq is whole, on every thread of the block. `l2`: load through
// L2 only (ld.global.cg), as check_blocks does for data it wrote itself (see there).
static __device__ __forceinline__ bool parts_check(const uint32_t* share, uint64_t seq, uint32_t first, uint32_t words,
                                                   bool l2 = false) {
    uint64_t wrong = 0;
    for (uint32_t k = mesh_block_rank(); k < words; k += mesh_block_threads())
        wrong |= (l2 ? __ldcg(share + k) : share[k]) != stress_value(seq, first + k);
    __shared__ uint32_t parts_wrong;
    if (mesh_block_rank() == 0) parts_wrong = 0;
    __syncthreads();
    if (wrong) parts_wrong = 1;  // any writer's store is the answer: a benign race on one word
    __syncthreads();
    const bool ok = parts_wrong == 0;
    __syncthreads();
    return ok;
}
static __device__ __forceinline__ bool parts_check_l2(const uint32_t* share, uint64_t seq, uint32_t first, uint32_t words) {
    return parts_check(share, seq, first, words, true);
}
