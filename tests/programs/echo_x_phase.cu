// echo_x_phase: echo_header.cu's loop with mesh.cuh's phase lock on (MESH_PHASE_LOCK 1: trials with and
// without the wait, the cheaper kept), beside echo_x_nolock (never waits) and echo_x_phasealways
// (always waits) in `mesh-gpu-bench rt-ab`'s turns. Every 4096 iterations lane 0 reports the lock's
// state in its user words (0: the learned wait in SM clocks, 1: messages taken, 2 / 3: the clocks between
// messages, each capped at twice the median, of the last trial without and with the wait), which
// `rt-ab` prints after each measurement (`PHASE|` lines).
#define MESH_PHASE_LOCK 1
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
        if (threadIdx.x == 0 && (i & 4095u) == 0) {
            mesh_heartbeat(ctx, ++beat);              // meshd's readiness
            mesh_user_store(ctx, 0, in.wait);
            mesh_user_store(ctx, 1, in.trial);
            mesh_user_store(ctx, 2, in.cost_free);
            mesh_user_store(ctx, 3, in.cost_lock);
        }
        if (mesh_chan_room(&out) > 0 && mesh_warp_try_recv(&in, buf)) mesh_warp_try_send(&out, buf);
    }
    mesh_chan_close(&in);                             // exact positions for the next launch
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}
