// heartbeat: counts iterations until asked to stop, and records the largest gap between two of its
// iterations (%globaltimer, ns) in user word 0 and the iteration count in user word 1: the bystander.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t beat = mesh_begin(ctx);
    uint64_t last = mesh_globaltimer();
    uint64_t max_gap = 0;
    for (uint32_t i = 1; !mesh_should_stop(ctx); i++) {
        uint64_t now = mesh_globaltimer();
        if (now - last > max_gap) {
            max_gap = now - last;
            mesh_user_store(ctx, 0, (uint32_t)(max_gap > 0xffffffffull ? 0xffffffffull : max_gap));
        }
        last = now;
        mesh_heartbeat(ctx, ++beat);
        if ((i & 1023u) == 0) mesh_user_store(ctx, 1, i);
    }
    mesh_end(ctx);
}
