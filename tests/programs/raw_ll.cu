// raw_ll: the one-warp LL probe (tests/probes/ll_roundtrip.cu's `llw`) as a resident program, so that the
// round-trip bench (`mesh-gpu-bench rt-ab`) measures the raw limit for 1 and 4 KiB messages in the same
// process, context and mailbox as the channels, interleaved with them. No channel protocol: binding 0 is
// a host channel of msg_size M (the payload: a multiple of 8 up to 4 KiB) and an even capacity C, used as
// scratch: C / 2 pairs of slots. Round trip i (from 1) uses pair p = (i - 1) mod (C / 2): the host writes
// M / 4 words of 8 bytes into slot 2p (the low half payload, the high half the round trip's number); the
// warp loads every word (lane l: words l, l + 32, ..., all issued before any is looked at), and once all
// carry the number stores them back into slot 2p + 1, where the host waits for all of them. Capacity 2
// is one fixed pair (the probe as written); a ring of pairs walks the slots as a channel does, and
// `rt-ab` measures both (`raw_ll`, `raw_ll_ring`: capacity 64). Ends when word 0 of the next request slot carries the number
// ~0. Launch with 32 threads. `cargo xtask ptx` regenerates raw_ll.ptx.
#include "mesh.cuh"

#define RAW_LL_MAX_WORDS 1024u  // 4 KiB of payload
// 1: 16-byte loads and stores, two words each, as mesh.cuh's warp calls move them;
// 0: one 8-byte word per lane and instruction (the probe as written).
#ifndef RAW_LL_WIDE
#define RAW_LL_WIDE 0
#endif
#define RAW_LL_UNIT (1u + RAW_LL_WIDE)  // words per load
#define RAW_LL_PER_LANE (RAW_LL_MAX_WORDS / 32u / RAW_LL_UNIT)

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || mesh_block_rank() >= 32u) return;
    const uint32_t lane = mesh_block_rank(), full = 0xffffffffu;
    const uint32_t words = ctx.binding_count >= 1u ? ctx.bindings[0].msg_size / 4u : 0u;
    const uint32_t pairs = ctx.binding_count >= 1u ? ctx.bindings[0].capacity / 2u : 0u;
    if (lane == 0) mesh_begin(ctx);
    if (ctx.binding_count < 1u || ctx.bindings[0].slots == 0 || words < 2u || words > RAW_LL_MAX_WORDS ||
        words % RAW_LL_UNIT != 0 || pairs == 0 || mesh_block_threads() < 32u) {
        if (lane == 0) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t units = words / RAW_LL_UNIT;
    const uint64_t slot_bytes = 8ull * words;
    for (uint32_t i = 1;; i++) {
        const uint64_t at = ctx.bindings[0].slots + (uint64_t)((i - 1u) % pairs) * 2u * slot_bytes;
        const volatile uint64_t* in = (const volatile uint64_t*)(uintptr_t)at;
        volatile uint64_t* out = (volatile uint64_t*)(uintptr_t)(at + slot_bytes);
        uint64_t v[RAW_LL_PER_LANE], w[RAW_LL_PER_LANE];  // w: a unit's second word (RAW_LL_WIDE)
        bool whole, stop;
        do {
#pragma unroll
            for (uint32_t k = 0; k < RAW_LL_PER_LANE; k++) {
                const uint32_t u = lane + 32u * k;
                w[k] = (uint64_t)i << 32;  // stands for the missing second word of an 8-byte load
                if (u < units) {
                    if (RAW_LL_WIDE) mesh_detail_ld_volatile_v2(in + 2u * u, &v[k], &w[k]);
                    else v[k] = mesh_detail_ld_volatile_u64(in + u);
                }
            }
            whole = true;
#pragma unroll
            for (uint32_t k = 0; k < RAW_LL_PER_LANE; k++)
                if (lane + 32u * k < units) whole &= (uint32_t)(v[k] >> 32) == i && (uint32_t)(w[k] >> 32) == i;
            stop = __shfl_sync(full, (uint32_t)(v[0] >> 32), 0) == ~0u;  // lane 0's v[0] is word 0
            whole = __all_sync(full, whole);
        } while (!whole && !stop);
        if (stop) break;
#pragma unroll
        for (uint32_t k = 0; k < RAW_LL_PER_LANE; k++) {
            const uint32_t u = lane + 32u * k;
            if (u < units) {
                if (RAW_LL_WIDE) mesh_detail_st_volatile_v2(out + 2u * u, v[k], w[k]);
                else mesh_detail_st_volatile_u64(out + u, v[k]);
            }
        }
    }
    if (lane == 0) mesh_end(ctx);
}
