// echo_header: the echo of mesh/channel.cuh's opening comment, copied exactly: what a user writes from the
// header. The benchmark measures it beside the raw word and the LL probe. `cargo xtask ptx` regenerates it.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t buf[1024];                    // one message, up to 4 KiB
    if (threadIdx.x >= 32) return;                    // one warp serves the channels
    uint64_t beat = 0;
    if (threadIdx.x == 0) beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    if (in.msg_size == 0 || in.msg_size != out.msg_size || in.msg_size > sizeof(buf)) {
        if (threadIdx.x == 0) mesh_exit(ctx, 1);      // a binding missing or of another size
        return;
    }
    for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
        if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
        if (mesh_chan_room(&out) > 0 && mesh_warp_try_recv(&in, buf)) mesh_warp_try_send(&out, buf);
    }
    mesh_chan_close(&in);                             // exact positions for the next launch
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}
