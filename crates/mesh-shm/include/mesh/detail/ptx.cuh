// mesh/detail/ptx.cuh: the PTX primitives every part uses (loads and stores with their scopes, %laneid,
// %globaltimer, %smid), the mailbox's addressing, and warp reductions. Not for programs: their names
// start with mesh_detail_ and may change.
#pragma once
#include "layout.cuh"
#include "removed.cuh"

// The primitives are skipped when MESH_HOST_EMULATION is defined: mesh-shm's CPU tests then run the
// calls as warps of 32 threads, with the primitives as atomics (crates/mesh-shm/tests/emu/warp_emu.h).
// Programs never define it.
#ifndef MESH_HOST_EMULATION
static __device__ __forceinline__ uint64_t mesh_detail_ld_acquire_u64(const void* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint32_t mesh_detail_ld_acquire_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint32_t mesh_detail_ld_relaxed_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void mesh_detail_st_release_u64(void* p, uint64_t v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ void mesh_detail_st_release_u32(void* p, uint32_t v) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ uint64_t mesh_detail_ld_volatile_u64(const volatile void* p) {
    uint64_t v;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void mesh_detail_ld_volatile_v2(const volatile void* p, uint64_t* a, uint64_t* b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}
static __device__ __forceinline__ void mesh_detail_st_volatile_u64(volatile void* p, uint64_t v) {
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ void mesh_detail_st_volatile_v2(volatile void* p, uint64_t a, uint64_t b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
// This thread's lane in its warp.
static __device__ __forceinline__ uint32_t mesh_detail_lane(void) {
    uint32_t l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return l;
}
// A relaxed 8-byte load of host memory (the rate-limited read of a group's `changes`).
static __device__ __forceinline__ uint64_t mesh_detail_group_ld_relaxed_u64(const void* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t mesh_detail_ld_acquire_gpu_u64(const void* p) {
    uint64_t v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void mesh_detail_st_release_gpu_u64(void* p, uint64_t v) {
    asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
static __device__ __forceinline__ uint4 mesh_detail_ld_volatile_v4(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
// A relaxed store at system scope: the consumer's tail (see mesh_block_release).
static __device__ __forceinline__ void mesh_detail_st_relaxed_sys_u64(void* p, uint64_t v) {
    asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// A fence that makes every earlier access of this thread (and, after a block barrier, of the block)
// visible before its later stores at system / GPU scope; followed by a relaxed store it is a release
// pattern (PTX memory model), one fence for any number of such stores.
static __device__ __forceinline__ void mesh_detail_fence_acq_rel_sys(void) {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}
static __device__ __forceinline__ void mesh_detail_fence_acq_rel_gpu(void) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
static __device__ __forceinline__ void mesh_detail_st_relaxed_gpu_u64(void* p, uint64_t v) {
    asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// mesh_globaltimer and mesh_smid are public (mesh/core.cuh documents them); defined here with the
// other primitives so that the emulation replaces them together.
static __device__ __forceinline__ uint64_t mesh_globaltimer(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ uint32_t mesh_smid(void) {
    uint32_t id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
#endif  // MESH_HOST_EMULATION

static __device__ __forceinline__ char* mesh_detail_at(const mesh_ctx& c, uint64_t offset) {
    return (char*)(uintptr_t)(c.base + offset);
}
static __device__ __forceinline__ char* mesh_detail_slot_at(const mesh_ctx& c, uint64_t field) {
    return mesh_detail_at(c, c.slot_offset + field);
}

// The tag of message `seq` in every 8-byte word of an LL slot: its low 31 bits with the top bit set
// (never 0, the value of a ring never written, and never the tag of the message a ring earlier in the
// same slot).
static __device__ __forceinline__ uint32_t mesh_detail_tag(uint64_t seq) {
    return (uint32_t)seq | 0x80000000u;
}

// Lane 0 stores a word of the mailbox for the warp: 32 stores of one word would each cross PCIe.
static __device__ __forceinline__ bool mesh_detail_lane0(void) {
    return mesh_detail_lane() == 0;
}

// The smallest of the warp's values, on every lane.
static __device__ __forceinline__ uint32_t mesh_detail_warp_min(uint32_t v) {
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w < v ? w : v;
    }
    return v;
}

// The OR of the warp's values, on every lane.
static __device__ __forceinline__ uint32_t mesh_detail_warp_or(uint32_t v) {
    for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Inclusive prefix sum over the warp's lanes.
static __device__ __forceinline__ uint32_t mesh_detail_warp_scan(uint32_t v) {
    const uint32_t lane = mesh_detail_lane();
#pragma unroll
    for (uint32_t o = 1; o < 32u; o <<= 1) {
        const uint32_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

