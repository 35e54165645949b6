// raw_pingpong_many: the service benchmark's raw baseline for N client processes at once, no channel
// and no service: thread c of the block (one thread per client, N = the block's threads, at most the
// slots' bytes / 128) polls the 8-byte word at byte c x 128 of binding 0's LL slots, which client c
// (`mesh-service-client --mode raw --index c`) stores, with a relaxed volatile load, and writes what it
// saw to the word 64 bytes after it with a volatile store, no fence: raw_pingpong.cu's round trip, N
// of them side by side. A warp's 32 threads poll their 32 clients' words in one round of loads. Each
// thread ends when its word holds ~0 (the benchmark stores ~0 into every one at the end).
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t c = threadIdx.x;
    if (blockIdx.x != 0) return;
    if (c == 0) mesh_begin(ctx);
    const mesh_binding& d = ctx.bindings[0];
    const uint64_t bytes = (uint64_t)d.msg_size * MESH_RING_WIRE_FACTOR * d.capacity;
    if (ctx.binding_count >= 1 && d.placement == MESH_PLACEMENT_HOST && d.slots != 0 && (uint64_t)(c + 1u) * 128u <= bytes) {
        char* word = (char*)(uintptr_t)d.slots + (uint64_t)c * 128u;
        uint64_t seen = 0;
        for (;;) {
            const uint64_t v = mesh_detail_ld_volatile_u64(word);
            if (v == ~0ull) break;
            if (v != seen) {
                seen = v;
                mesh_detail_st_volatile_u64(word + 64, v);
            }
        }
    }
    __syncthreads();
    if (c == 0) mesh_end(ctx);
}
