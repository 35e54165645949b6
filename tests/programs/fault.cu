// fault: starts, beats once, then writes through an illegal address: the GPU fault meshd must survive.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t beat = mesh_begin(ctx);
    mesh_heartbeat(ctx, beat + 1);
    *(volatile uint64_t*)(uintptr_t)0x10 = beat;
    mesh_end(ctx);
}
