#include "mesh.cuh"
extern "C" __global__ void mesh_main(mesh_ctx ctx) { if (threadIdx.x == 0) mesh_heartbeat(ctx, 1); }
