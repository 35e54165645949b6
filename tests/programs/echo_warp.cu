// echo_warp: one warp receives on binding 0 and sends every message back on binding 1 with the warp
// channel calls (a message up to 4 KiB per PCIe round trip), until meshd asks it to stop. Messages up
// to 16 KiB. Launch with a block of 32 threads (meshd's default). `cargo xtask ptx` regenerates it.
#include "mesh.cuh"

__shared__ uint32_t echo_buf[4096];

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;  // the first warp does the work
    const bool leader = threadIdx.x == 0;
    uint64_t beat = 0;
    if (leader) beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    if (in.msg_size == 0 || in.msg_size != out.msg_size || in.msg_size > sizeof(echo_buf)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    // The header's loop (mesh_should_stop on every iteration: it reads the stop word once every 100 µs
    // and never branches on a read in flight), with the batch calls: several messages per round trip
    // when a stream of small ones is waiting.
    const uint32_t fit = sizeof(echo_buf) / in.msg_size;
    for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
        if ((i & 1023u) == 0 && leader) {
            mesh_heartbeat(ctx, ++beat);
            // User word 0: polls that caught a message half-arrived (the benchmark reports them).
            *(volatile uint32_t*)mesh_detail_slot_at(ctx, MESH_SLOT_USER) = in.partial;
        }
        // Take only as many messages as can be sent on: a stop never strands one here.
        const uint32_t room = mesh_chan_room(&out);
        const uint32_t n = mesh_warp_try_recv_batch(&in, echo_buf, room < fit ? room : fit);
        if (n) mesh_warp_try_send_batch(&out, echo_buf, n);
    }
    mesh_chan_close(&in);
    mesh_chan_close(&out);
    if (leader) mesh_end(ctx);
}
