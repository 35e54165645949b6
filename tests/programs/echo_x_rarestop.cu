// echo_x_rarestop: echo_header with the stop check (and its %globaltimer read) made only every 4096th
// iteration: a benchmark variant, to measure what mesh_should_stop costs per iteration.
// `cargo xtask ptx` regenerates it.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t buf[1024];
    if (threadIdx.x >= 32) return;
    if (threadIdx.x == 0) mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    for (uint32_t i = 0; (i & 4095u) != 0 || !mesh_should_stop(ctx); i++) {
        if (mesh_chan_room(&out) > 0 && mesh_warp_try_recv(&in, buf)) mesh_warp_try_send(&out, buf);
    }
    mesh_chan_close(&in);
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}
