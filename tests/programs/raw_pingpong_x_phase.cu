// raw_pingpong_x_phase: raw_pingpong.cu (the relaxed mapped word, one thread) with echo_x_phase.cu's
// phase lock (issue 24 item 1, session 17): after each reply no poll until a learned wait has passed,
// the wait adapted from what the first poll after it saw (PHASE_UP / PHASE_DOWN / PHASE_MAX as there).
// The limit of the technique: what the fastest raw loop gains from it, beside what the header's loop
// gains (`MESH_RT_AB_VARIANTS="... word:raw_pingpong_x_phase" mesh-gpu-bench rt-ab blink`).
#include "mesh.cuh"

#ifndef PHASE_UP
#define PHASE_UP 100u
#endif
#ifndef PHASE_DOWN
#define PHASE_DOWN 10u
#endif
#ifndef PHASE_MAX
#define PHASE_MAX 1500u
#endif

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
        if (empties == 0) wait = wait > PHASE_DOWN ? wait - PHASE_DOWN : 0u;
        else if (empties == 1) wait = wait + PHASE_UP < PHASE_MAX ? wait + PHASE_UP : PHASE_MAX;
        empties = 0;
        seen = v;
        mesh_st_volatile_u64(ring + MESH_RING_TAIL, v);
        due = mesh_globaltimer() + wait;
    }
    mesh_end(ctx);
}
