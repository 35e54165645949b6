// ignore_stop: never looks at its stop request; it beats for 20 s (so that it cannot hold a GPU
// forever), then exits with code 7. Tests meshd's deadline on a program that will not stop.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t beat = mesh_begin(ctx);
    uint64_t start = mesh_globaltimer();
    while (mesh_globaltimer() - start < 20ull * 1000 * 1000 * 1000) mesh_heartbeat(ctx, ++beat);
    mesh_exit(ctx, 7);
}
