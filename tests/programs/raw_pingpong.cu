// raw_pingpong: the benchmark's baseline, no channel: the fastest raw round trip through mapped host
// memory. Polls one word the host writes (the head line of binding 0's ring, used as scratch) with a
// relaxed volatile load and writes it back to the next line with a volatile store, no fence, until the
// host writes ~0. `cargo xtask ptx` regenerates raw_pingpong.ptx.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    mesh_begin(ctx);
    char* ring = mesh_detail_at(ctx, ctx.bindings[0].ring_offset);
    uint64_t seen = 0;
    for (;;) {
        uint64_t v = mesh_detail_ld_volatile_u64(ring + MESH_RING_HEAD);
        if (v == ~0ull) break;
        if (v != seen) {
            seen = v;
            mesh_detail_st_volatile_u64(ring + MESH_RING_TAIL, v);
        }
    }
    mesh_end(ctx);
}
