// warp_bw: what one warp reaches reading or writing mapped host memory with plain 16-byte volatile
// loads or stores (16 per lane in flight, 8 KiB per warp), the ceiling for a channel's streaming. Its
// parameters are three u64 at the start of binding 0's slot memory, written by the benchmark before
// the launch: mode (1 read, 2 write), bytes (the buffer after the parameters, a multiple of 8 KiB),
// passes. The benchmark times launch + synchronize. `cargo xtask ptx` regenerates warp_bw.ptx.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    volatile uint64_t* p = (volatile uint64_t*)(mesh_at(ctx, ctx.bindings[0].ring_offset) + MESH_RING_SLOTS);
    const uint64_t mode = p[0], bytes = p[1], passes = p[2];
    volatile uint64_t* buf = p + 1024;  // 8 KiB past the parameters
    const uint64_t vecs = bytes / 16u;
    uint64_t acc = 0;
    for (uint64_t pass = 0; pass < passes; pass++) {
        for (uint64_t base = 0; base < vecs; base += 32u * 16u) {
            uint64_t a[16], b[16];
            if (mode == 1) {
#pragma unroll
                for (uint32_t k = 0; k < 16; k++) mesh_ld_volatile_v2(buf + 2 * (base + threadIdx.x + 32u * k), &a[k], &b[k]);
#pragma unroll
                for (uint32_t k = 0; k < 16; k++) acc ^= a[k] + b[k];
            } else {
#pragma unroll
                for (uint32_t k = 0; k < 16; k++) mesh_st_volatile_v2(buf + 2 * (base + threadIdx.x + 32u * k), pass, base + k);
            }
        }
    }
    if (acc == 0x5eed) p[3] = acc;  // keeps the loads; never true for the benchmark's zeroed buffer
    __threadfence_system();
}
