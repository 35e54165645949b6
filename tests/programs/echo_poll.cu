// echo_poll: the echo of mesh.cuh's section "Lowest host round trip: the poll stream", copied exactly:
// what a user writes from the header for the lowest host round trip (MESH_POLLERS warps poll the input
// ring MESH_POLL_SPACING_NS apart, warp 0 serves). Launch with `--block 96` (32 * (MESH_POLLERS + 1)).
// tests/programs/echo_x_pollers.cu is the same logic written out, kept for the POLLERS x SPACING_NS sweep
// (tests/probes/run-kit.sh pollers builds and runs both).
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ mesh_poll_box box;                     // the pollers' hand-off, one message up to 4 KiB
    if (blockIdx.x != 0 || threadIdx.x >= 32u * (MESH_POLLERS + 1u)) return;
    mesh_chan in = {}, out = {};
    uint64_t beat = 0;
    if (threadIdx.x < 32) {                           // warp 0 serves the channels
        if (threadIdx.x == 0) beat = mesh_begin(ctx);
        in = mesh_chan_open(ctx, 0, false);
        out = mesh_chan_open(ctx, 1, true);
    }
    if (!mesh_poll_start(&box, &in, in.msg_size == out.msg_size)) {
        if (threadIdx.x == 0) mesh_exit(ctx, blockDim.x < 32u * (MESH_POLLERS + 1u) ? 2 : 1);
        return;
    }
    if (threadIdx.x >= 32) {                          // warps 1..MESH_POLLERS poll until closed
        mesh_poll_serve(&box);
        return;
    }
    for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
        if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
        if (mesh_chan_room(&out) > 0 && mesh_poll_try_recv(&box, &in, box.buf)) mesh_warp_try_send(&out, box.buf);
    }
    if (mesh_poll_stop(&box, &in, box.buf)) mesh_warp_try_send(&out, box.buf);  // a claimed message
    mesh_chan_close(&in);                             // exact positions for the next launch
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}
