// echo: receives on binding 0 and sends every message back on binding 1, until meshd asks it to stop.
// One thread, the one-thread channel calls; messages up to 256 bytes. Regenerate echo.ptx with
// `cargo xtask ptx` (nvcc -ptx -arch=compute_80).
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    if (in.msg_size == 0 || out.msg_size == 0 || in.msg_size != out.msg_size || in.msg_size > 256) {
        mesh_exit(ctx, 1);
        return;
    }
    uint64_t msg[32];
    for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
        // mesh_should_stop reads the stop word once every few microseconds and never waits for it.
        if ((i & 1023u) == 0) {
            mesh_heartbeat(ctx, ++beat);
            // User word 0: polls that caught a message half-arrived (the benchmark reports them).
            *(volatile uint32_t*)mesh_detail_slot_at(ctx, MESH_SLOT_USER) = in.partial;
        }
        // Receive only with room to send, so that a stop never strands a message here.
        if (mesh_chan_room(&out) > 0 && mesh_try_recv(&in, msg)) mesh_try_send(&out, msg);
    }
    // Publish both positions exactly, so that the next launch continues where this one stopped.
    mesh_chan_close(&in);
    mesh_chan_close(&out);
    mesh_end(ctx);
}
