// raw_pingpong_x_phase: raw_pingpong.cu (the relaxed mapped word, one thread) with the first phase
// lock (issue 24 item 1, session 17's call 3; mesh.cuh's has since moved to SM clocks and trials, and
// works on a warp's mesh_chan, so this one thread keeps its own copy of the rule): after each reply no
// poll until a learned wait has passed, the wait adapted from what the first poll after it saw (100 ns
// more after one empty poll, 10 ns less after none, at most 1.5 us; %globaltimer), always on. The limit
// of the technique: what the fastest raw loop gains from it, beside what the header's loop gains
// (`MESH_RT_AB_VARIANTS="... word:raw_pingpong_x_phase" mesh-gpu-bench rt-ab blink`).
#include "mesh.cuh"

#define X_UP_NS 100u
#define X_DOWN_NS 10u
#define X_MAX_NS 1500u

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    mesh_begin(ctx);
    char* ring = mesh_at(ctx, ctx.bindings[0].ring_offset);
    uint64_t seen = 0, due = 0;
    uint32_t wait = 0, empties = 0;
    for (;;) {
        if (mesh_globaltimer() < due) continue;
        uint64_t v = mesh_ld_volatile_u64(ring + MESH_RING_HEAD);
        if (v == ~0ull) break;
        if (v == seen) {
            empties++;
            continue;
        }
        if (empties == 0) wait = wait > X_DOWN_NS ? wait - X_DOWN_NS : 0u;
        else if (empties == 1) wait = wait + X_UP_NS < X_MAX_NS ? wait + X_UP_NS : X_MAX_NS;
        empties = 0;
        seen = v;
        mesh_st_volatile_u64(ring + MESH_RING_TAIL, v);
        due = mesh_globaltimer() + wait;
    }
    mesh_end(ctx);
}
