// warp_bw: what one warp (or one thread) reaches reading or writing mapped host memory, by kind of
// access: the ceiling for a channel's streaming, and the measurement that picks the channel's loads.
// Parameters: three u64 at the start of binding 0's slot memory, written by the benchmark before the
// launch: mode, bytes (the buffer after the 8 KiB of parameters, a multiple of 16 KiB), passes.
// Modes: 1 ld.volatile v2.u64 x16 per lane; 2 st.volatile v2.u64 x16; 3 ld.volatile u64 x32;
// 4 ld.relaxed.sys u64 x32; 5 ld.global.cv u64 x32; 6 ld.global.cv v2.u64 x16;
// 7 one thread, ld.volatile u64 x32; 8 one thread, ld.relaxed.sys u64 x32; 9 ld.volatile v2.u64 x32
// per lane (16 KiB in flight).
// The benchmark times launch + synchronize. `cargo xtask ptx` regenerates warp_bw.ptx.
#include "mesh.cuh"

static __device__ __forceinline__ uint64_t ld_relaxed(const volatile uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t ld_cv(const volatile uint64_t* p) {
    uint64_t v;
    asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void ld_cv2(const volatile uint64_t* p, uint64_t* a, uint64_t* b) {
    asm volatile("ld.global.cv.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}

// 32 words per lane per step, all issued before any is used.
#define STEP32(LOAD)                                                              \
    {                                                                             \
        uint64_t a[32];                                                           \
        _Pragma("unroll") for (uint32_t k = 0; k < 32; k++) a[k] = LOAD(buf + base + lane + stride * k); \
        _Pragma("unroll") for (uint32_t k = 0; k < 32; k++) acc ^= a[k];         \
    }

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    volatile uint64_t* p = (volatile uint64_t*)(mesh_detail_at(ctx, ctx.bindings[0].ring_offset) + MESH_RING_SLOTS);
    const uint64_t mode = p[0], bytes = p[1], passes = p[2];
    const bool one = mode >= 7;
    if (one && threadIdx.x != 0) return;
    volatile uint64_t* buf = p + 1024;  // 8 KiB past the parameters
    const uint64_t words = bytes / 8u;
    const uint32_t lane = threadIdx.x, stride = one ? 1u : 32u, per_step = mode == 9 ? 2048u : 32u * stride;
    uint64_t acc = 0;
    for (uint64_t pass = 0; pass < passes; pass++) {
        for (uint64_t base = 0; base < words; base += per_step) {
            if (mode == 9) {
                uint64_t a[32], b[32];
#pragma unroll
                for (uint32_t k = 0; k < 32; k++) mesh_detail_ld_volatile_v2(buf + base + 2 * (lane + 32u * k), &a[k], &b[k]);
#pragma unroll
                for (uint32_t k = 0; k < 32; k++) acc ^= a[k] + b[k];
            } else if (mode == 1 || mode == 2 || mode == 6) {
                uint64_t a[16], b[16];
#pragma unroll
                for (uint32_t k = 0; k < 16; k++) {
                    volatile uint64_t* q = buf + base + 2 * (lane + 32u * k);
                    if (mode == 1) mesh_detail_ld_volatile_v2(q, &a[k], &b[k]);
                    else if (mode == 6) ld_cv2(q, &a[k], &b[k]);
                    else mesh_detail_st_volatile_v2(q, pass, base + k);
                }
                if (mode != 2)
#pragma unroll
                    for (uint32_t k = 0; k < 16; k++) acc ^= a[k] + b[k];
            } else if (mode == 3 || mode == 7) {
                STEP32(mesh_detail_ld_volatile_u64)
            } else if (mode == 4 || mode == 8) {
                STEP32(ld_relaxed)
            } else {
                STEP32(ld_cv)
            }
        }
    }
    if (acc == 0x5eed) p[3] = acc;  // keeps the loads; never true for the benchmark's zeroed buffer
    __threadfence_system();
}
