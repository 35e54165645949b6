// copy_once: the other baseline, no resident kernel: one launch copies binding 0's first msg_size bytes
// of slot memory to binding 1's with one warp (plain loads, all issued before use), then returns. The
// benchmark times launch + synchronize around it. `cargo xtask ptx` regenerates copy_once.ptx.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    const uint64_t* src = (const uint64_t*)(mesh_detail_at(ctx, ctx.bindings[0].ring_offset) + MESH_RING_SLOTS);
    uint64_t* dst = (uint64_t*)(mesh_detail_at(ctx, ctx.bindings[1].ring_offset) + MESH_RING_SLOTS);
    const uint32_t words = ctx.bindings[0].msg_size / 8u;
    for (uint32_t base = 0; base < words; base += 32u * 16u) {
        uint64_t v[16];
#pragma unroll
        for (uint32_t k = 0; k < 16; k++) {
            uint32_t i = base + threadIdx.x + 32u * k;
            if (i < words) v[k] = src[i];
        }
#pragma unroll
        for (uint32_t k = 0; k < 16; k++) {
            uint32_t i = base + threadIdx.x + 32u * k;
            if (i < words) dst[i] = v[k];
        }
    }
}
