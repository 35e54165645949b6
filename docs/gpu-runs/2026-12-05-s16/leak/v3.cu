#include "mesh.cuh"
extern "C" __global__ void mesh_main(mesh_ctx ctx) { while (!mesh_should_stop(ctx)) {} }
