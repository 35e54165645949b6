// declared_bindings: a program that declares what its bindings must be (mesh.cuh's MESH_BINDINGS):
// binding 0 an LL channel, binding 1 a bulk channel. meshd refuses a load bound otherwise, naming the
// binding; bound rightly it runs, beating until asked to stop, and reports in user word 0 the
// protocols it was given (binding 0's code, plus binding 1's times 16). tests/tests/bindings.rs loads
// it both ways in both modes.
#include "mesh.cuh"

MESH_BINDINGS(MESH_LL, MESH_BULK);

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t beat = mesh_begin(ctx);
    const uint32_t seen = (ctx.bindings[0].protocol & 0xffffu) | (ctx.bindings[1].protocol & 0xffffu) << 4;
    mesh_user_store(ctx, 0, seen);
    while (!mesh_should_stop(ctx)) mesh_heartbeat(ctx, ++beat);
    mesh_end(ctx);
}
