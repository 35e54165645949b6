// warp_emu.h: one warp of mesh.cuh's device calls run on the CPU, for tests of their logic without a
// GPU. 32 std::threads are the lanes; every warp intrinsic (__shfl_*_sync, __ballot_sync, __syncwarp,
// ...) is an exchange through shared slots between two barriers, so warp-uniform code runs as the
// lanes of a warp would. mesh.cuh's PTX primitives (loads and stores with their scopes, %laneid,
// %globaltimer) are defined here, before mesh.cuh is included with MESH_HOST_EMULATION, as sequentially
// consistent atomics: this checks what the calls compute, not the GPU's memory model or speed.
// One block of up to EMU_MAX_WARPS warps (emu_run_block): each warp its own barrier and exchange
// slots, __syncthreads the block's barrier; __shared__ is a static (one block per translation unit at a
// time). A grid (emu_run_grid) runs several blocks at once, each its own copy of the program (one
// translation unit a block, its kernel renamed: tests/emu/service_block.cpp), so that each has its own
// __shared__ statics while the program's __device__ globals are one (linked with
// --allow-multiple-definition).
#pragma once
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define MESH_HOST_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
struct dim3 {
    unsigned x, y, z;
};
struct uint4 {
    unsigned x, y, z, w;
};

inline thread_local dim3 threadIdx = {0, 0, 0};
// A lane's block and grid (a test thread sets them before emu_run_block, which hands them to its lanes).
inline thread_local dim3 blockIdx = {0, 0, 0}, gridDim = {1, 1, 1};
inline dim3 blockDim = {32, 1, 1};
constexpr uint32_t EMU_MAX_WARPS = 32;  // over every block of a grid
inline thread_local uint32_t emu_lane = 0;
inline thread_local uint32_t emu_warp = 0;
// Each warp's %globaltimer: read from the steady clock once per warp barrier, by the barrier's
// completion (while every lane waits), so every lane of a warp reads the same time between two
// barriers, as a converged warp's one S2R instruction gives every lane one value. Lanes reading the
// clock each for itself (as this file did first) saw different times on a loaded machine and took
// different sides of `now < due` in mesh_should_stop: the lanes of one warp left the loop apart and
// met at different barriers (the CI's 2-core machine hung in the service loop with 8 warps).
inline std::atomic<uint64_t> emu_warp_clock[EMU_MAX_WARPS];
// The stop word (mesh_should_stop's), when a test names it (emu_watch_stop): every lane of a warp loads
// it in one instruction on a GPU (one coalesced load, one value); lanes that loaded it each for itself
// saw meshd's store at different moments, left the loop apart and hung. So each warp reads it once per
// barrier, as it reads the clock, and the lanes' loads of that address return the warp's copy.
inline const void* emu_stop_word = nullptr;
inline std::atomic<uint32_t> emu_warp_stop[EMU_MAX_WARPS];
inline void emu_watch_stop(const void* stop_word) { emu_stop_word = stop_word; }
inline uint64_t emu_steady_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
struct EmuTick {
    uint32_t warp;
    void operator()() noexcept {
        emu_warp_clock[warp].store(emu_steady_ns(), std::memory_order_relaxed);
        if (emu_stop_word != nullptr)
            emu_warp_stop[warp].store(__atomic_load_n((const uint32_t*)emu_stop_word, __ATOMIC_SEQ_CST),
                                      std::memory_order_relaxed);
    }
};
inline std::barrier<EmuTick>* emu_barriers[EMU_MAX_WARPS];
// The block barrier ticks every warp's clock and stop word too (a block call waits through
// __syncthreads alone: its warps' clocks must move there).
struct EmuBlockTick {
    uint32_t first, warps;  // the block's warps: first to first + warps - 1
    void operator()() noexcept {
        for (uint32_t w = first; w < first + warps; w++) EmuTick{w}();
    }
};
inline thread_local std::barrier<EmuBlockTick>* emu_block_barrier = nullptr;  // the lane's block's
inline uint64_t emu_warp_slots[EMU_MAX_WARPS][32];
#define emu_slots emu_warp_slots[emu_warp]

inline void emu_sync() { emu_barriers[emu_warp]->arrive_and_wait(); }
// Lane `lane`'s word `mine` exchanged within its warp: every lane gets every lane's.
inline uint64_t emu_exchange(uint64_t mine, uint32_t from) {
    emu_slots[emu_lane] = mine;
    emu_sync();
    const uint64_t v = emu_slots[from & 31u];
    emu_sync();
    return v;
}
template <class T>
inline uint64_t emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value fits 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
inline T emu_from(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}

inline void __syncwarp(unsigned = 0xffffffffu) { emu_sync(); }
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned __activemask() { return ~0u; }
template <class T>
inline T __shfl_sync(unsigned, T v, int src, int = 32) {
    return emu_from<T>(emu_exchange(emu_bits(v), (uint32_t)src));
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta, int = 32) {
    const T u = emu_from<T>(emu_exchange(emu_bits(v), emu_lane >= delta ? emu_lane - delta : emu_lane));
    return u;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m, int = 32) {
    return emu_from<T>(emu_exchange(emu_bits(v), emu_lane ^ (uint32_t)m));
}
inline unsigned __ballot_sync(unsigned, bool p) {
    emu_slots[emu_lane] = p;
    emu_sync();
    unsigned bits = 0;
    for (uint32_t i = 0; i < 32; i++) bits |= (emu_slots[i] ? 1u : 0u) << i;
    emu_sync();
    return bits;
}
inline bool __any_sync(unsigned m, bool p) { return __ballot_sync(m, p) != 0; }
inline bool __all_sync(unsigned m, bool p) { return __ballot_sync(m, p) == 0xffffffffu; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <class T>
inline T atomicCAS(T* p, T expected, T desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
template <class T>
inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
// The lanes whose `v` equals this lane's.
template <class T>
inline unsigned __match_any_sync(unsigned, T v) {
    emu_slots[emu_lane] = emu_bits(v);
    emu_sync();
    unsigned bits = 0;
    for (uint32_t i = 0; i < 32; i++) bits |= (emu_slots[i] == emu_slots[emu_lane] ? 1u : 0u) << i;
    emu_sync();
    return bits;
}

// mesh.cuh's PTX primitives, as atomics.
inline uint64_t emu_ld(const volatile void* p) { return __atomic_load_n((const uint64_t*)p, __ATOMIC_SEQ_CST); }
inline void emu_st(volatile void* p, uint64_t v) { __atomic_store_n((uint64_t*)p, v, __ATOMIC_SEQ_CST); }
inline uint32_t emu_ld32(const void* p) { return __atomic_load_n((const uint32_t*)p, __ATOMIC_SEQ_CST); }
inline void emu_st32(void* p, uint32_t v) { __atomic_store_n((uint32_t*)p, v, __ATOMIC_SEQ_CST); }
static inline uint64_t mesh_detail_ld_acquire_u64(const void* p) { return emu_ld(p); }
static inline uint32_t mesh_detail_ld_acquire_u32(const void* p) { return emu_ld32(p); }
static inline uint32_t mesh_detail_ld_relaxed_u32(const void* p) {
    return p == emu_stop_word ? emu_warp_stop[emu_warp].load(std::memory_order_relaxed) : emu_ld32(p);
}
static inline void mesh_detail_st_release_u64(void* p, uint64_t v) { emu_st(p, v); }
static inline void mesh_detail_st_release_u32(void* p, uint32_t v) { emu_st32(p, v); }
static inline uint64_t mesh_globaltimer(void) { return emu_warp_clock[emu_warp].load(std::memory_order_relaxed); }
static inline uint32_t mesh_smid(void) { return 0; }
static inline uint64_t mesh_detail_ld_volatile_u64(const volatile void* p) { return emu_ld(p); }
static inline void mesh_detail_ld_volatile_v2(const volatile void* p, uint64_t* a, uint64_t* b) {
    *a = emu_ld(p);
    *b = emu_ld((const volatile char*)p + 8);
}
static inline void mesh_detail_st_volatile_u64(volatile void* p, uint64_t v) { emu_st(p, v); }
static inline void mesh_detail_st_volatile_v2(volatile void* p, uint64_t a, uint64_t b) {
    emu_st(p, a);
    emu_st((volatile char*)p + 8, b);
}
static inline uint32_t mesh_detail_lane(void) { return emu_lane; }
static inline uint64_t mesh_detail_group_ld_relaxed_u64(const void* p) { return emu_ld(p); }
static inline uint64_t mesh_detail_ld_acquire_gpu_u64(const void* p) { return emu_ld(p); }
static inline void mesh_detail_st_release_gpu_u64(void* p, uint64_t v) { emu_st(p, v); }
static inline uint4 mesh_detail_ld_volatile_v4(const void* p) {
    uint4 v;
    std::memcpy(&v, (const void*)p, sizeof v);
    return v;
}
static inline void mesh_detail_st_relaxed_sys_u64(void* p, uint64_t v) { emu_st(p, v); }
static inline void mesh_detail_st_relaxed_gpu_u64(void* p, uint64_t v) { emu_st(p, v); }
static inline void mesh_detail_fence_acq_rel_sys(void) { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void mesh_detail_fence_acq_rel_gpu(void) { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Runs `body(block, thread)` on `grid` blocks of `warps` x 32 threads each, all at once (blockDim.x =
// warps x 32, gridDim.x = grid; warp w of block b is emulated warp b x warps + w). A thread that returns
// early leaves its warp's and its block's barriers (as an exited thread does on a GPU).
inline void emu_run_grid(uint32_t grid, uint32_t warps, const std::function<void(uint32_t, uint32_t)>& body) {
    const uint32_t all = grid * warps;
    if (grid == 0 || warps == 0 || all > EMU_MAX_WARPS) std::abort();  // a test's own mistake
    std::vector<std::unique_ptr<std::barrier<EmuTick>>> bars;
    for (uint32_t w = 0; w < all; w++) {
        EmuTick{w}();  // the clock and the stop word as the block starts
        bars.emplace_back(std::make_unique<std::barrier<EmuTick>>(32, EmuTick{w}));
        emu_barriers[w] = bars.back().get();
    }
    std::vector<std::unique_ptr<std::barrier<EmuBlockTick>>> blocks;
    for (uint32_t b = 0; b < grid; b++)
        blocks.emplace_back(std::make_unique<std::barrier<EmuBlockTick>>((ptrdiff_t)warps * 32, EmuBlockTick{b * warps, warps}));
    blockDim = {warps * 32u, 1, 1};
    std::vector<std::thread> threads;
    for (uint32_t b = 0; b < grid; b++)
        for (uint32_t t = 0; t < warps * 32u; t++)
            threads.emplace_back([&, b, t] {
                emu_lane = t % 32u;
                emu_warp = b * warps + t / 32u;
                threadIdx = {t, 0, 0};
                blockIdx = {b, 0, 0};
                gridDim = {grid, 1, 1};
                emu_block_barrier = blocks[b].get();
                body(b, t);
                emu_barriers[emu_warp]->arrive_and_drop();
                emu_block_barrier->arrive_and_drop();
            });
    for (auto& th : threads) th.join();
    blockDim = {32, 1, 1};
}

// Runs `body(thread)` on `warps` x 32 threads, one block (blockDim.x = warps x 32), whose blockIdx and
// gridDim are the calling thread's (a test of one block of a larger grid sets them first).
inline void emu_run_block(uint32_t warps, const std::function<void(uint32_t)>& body) {
    const dim3 block = blockIdx, grid = gridDim;
    emu_run_grid(1, warps, [&](uint32_t, uint32_t t) {
        blockIdx = block;
        gridDim = grid;
        body(t);
    });
}
// One warp (the lanes of emu_run_block(1, ...)).
inline void emu_run_warp(const std::function<void(uint32_t)>& lane_body) { emu_run_block(1, lane_body); }
