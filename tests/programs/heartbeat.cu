// heartbeat: counts iterations until asked to stop, and records the largest gap between two of its
// iterations (%globaltimer, ns) in user word 0: the bystander. The gap is carried across relaunches
// (user words 2-3 hold the time of the last iteration), so that a blink's pause counts as a gap.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t beat = mesh_begin(ctx);
    volatile uint32_t* user = (volatile uint32_t*)mesh_detail_slot_at(ctx, MESH_SLOT_USER);
    uint64_t max_gap = user[0];
    uint64_t last = ((uint64_t)user[3] << 32) | user[2];
    if (last == 0) last = mesh_globaltimer();
    for (uint32_t i = 1; !mesh_should_stop(ctx); i++) {
        uint64_t now = mesh_globaltimer();
        if (now - last > max_gap) {
            max_gap = now - last;
            user[0] = (uint32_t)(max_gap > 0xffffffffull ? 0xffffffffull : max_gap);
        }
        last = now;
        user[2] = (uint32_t)now;
        user[3] = (uint32_t)(now >> 32);
        mesh_heartbeat(ctx, ++beat);
        if ((i & 1023u) == 0) user[1] = i;
    }
    mesh_end(ctx);
}
