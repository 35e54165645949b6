// raw_ll_x_v2: raw_ll.cu (the one-warp LL probe) with 16-byte loads and stores, two tagged words each,
// as mesh.cuh's warp calls move them, instead of the probe's 8-byte ones. Session 18's question for the
// H200: the header's loop is 5.75 us at 4 KiB where raw_ll walking a ring of slots is 3.6 (session 17):
// is the load width part of it? `mesh-gpu-bench rt-ab` runs it as `ll:raw_ll_x_v2` (one pair of slots)
// and `llring:raw_ll_x_v2` (32 pairs). Same contract as raw_ll.cu: binding 0 is scratch of msg_size M
// (a multiple of 8 up to 4 KiB, so M / 4 words, an even count) and an even capacity C; round trip i uses
// pair (i - 1) mod (C / 2); ends when word 0 of the next request slot carries the number ~0. Launch
// with 32 threads.
#include "mesh.cuh"

#define RAW_LL_MAX_PAIRS 512u  // 4 KiB of payload: 1,024 words
#define RAW_LL_PAIRS_PER_LANE (RAW_LL_MAX_PAIRS / 32u)

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || mesh_block_rank() >= 32u) return;
    const uint32_t lane = mesh_block_rank(), full = 0xffffffffu;
    const uint32_t words = ctx.binding_count >= 1u ? ctx.bindings[0].msg_size / 4u : 0u;
    const uint32_t pairs = ctx.binding_count >= 1u ? ctx.bindings[0].capacity / 2u : 0u;
    if (lane == 0) mesh_begin(ctx);
    if (ctx.binding_count < 1u || ctx.bindings[0].slots == 0 || words < 2u || words > 2u * RAW_LL_MAX_PAIRS ||
        words % 2u != 0 || pairs == 0 || mesh_block_threads() < 32u) {
        if (lane == 0) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t word_pairs = words / 2u;
    const uint64_t slot_bytes = 8ull * words;
    for (uint32_t i = 1;; i++) {
        const uint64_t at = ctx.bindings[0].slots + (uint64_t)((i - 1u) % pairs) * 2u * slot_bytes;
        const volatile uint64_t* in = (const volatile uint64_t*)(uintptr_t)at;
        volatile uint64_t* out = (volatile uint64_t*)(uintptr_t)(at + slot_bytes);
        uint64_t a[RAW_LL_PAIRS_PER_LANE], b[RAW_LL_PAIRS_PER_LANE];
        bool whole, stop;
        do {
#pragma unroll
            for (uint32_t k = 0; k < RAW_LL_PAIRS_PER_LANE; k++)
                if (lane + 32u * k < word_pairs) mesh_ld_volatile_v2(in + 2u * (lane + 32u * k), &a[k], &b[k]);
            whole = true;
#pragma unroll
            for (uint32_t k = 0; k < RAW_LL_PAIRS_PER_LANE; k++)
                if (lane + 32u * k < word_pairs) whole &= (uint32_t)(a[k] >> 32) == i && (uint32_t)(b[k] >> 32) == i;
            stop = __shfl_sync(full, (uint32_t)(a[0] >> 32), 0) == ~0u;  // lane 0's a[0] is word 0
            whole = __all_sync(full, whole);
        } while (!whole && !stop);
        if (stop) break;
#pragma unroll
        for (uint32_t k = 0; k < RAW_LL_PAIRS_PER_LANE; k++)
            if (lane + 32u * k < word_pairs) mesh_st_volatile_v2(out + 2u * (lane + 32u * k), a[k], b[k]);
    }
    if (lane == 0) mesh_end(ctx);
}
