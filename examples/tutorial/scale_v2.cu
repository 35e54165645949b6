// scale, version 2: the tutorial's upgrade, which triples where version 1 doubles. A request is up to
// 64 32-bit words: word 0 is the caller's number for it, and comes back as it was; every other word
// comes back multiplied by FACTOR.
#include "mesh.cuh"

// doc:begin factor
#define FACTOR 3u
// doc:end factor

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);            // binding 0: requests
    mesh_chan out = mesh_chan_open(ctx, 1, true);            // binding 1: replies
    uint32_t msg[64];
    if (in.msg_size == 0 || in.msg_size != out.msg_size || in.msg_size > sizeof(msg)) {
        mesh_exit(ctx, 1);
        return;
    }
    // doc:begin loop
    while (!mesh_should_stop(ctx)) {
        // Take a request only when its reply has room: a stop then never strands one here.
        if (mesh_chan_room(&out) > 0 && mesh_try_recv(&in, msg)) {
            for (uint32_t i = 1; i < in.msg_size / 4; i++) msg[i] *= FACTOR;
            mesh_try_send(&out, msg);
        }
        mesh_heartbeat(ctx, ++beat);
    }
    // Publish both positions exactly: the next launch (after an upgrade, say) starts right here.
    mesh_chan_close(&in);
    mesh_chan_close(&out);
    mesh_end(ctx);
    // doc:end loop
}
