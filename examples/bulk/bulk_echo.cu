// bulk_echo: every message of a bulk channel (binding 0) goes back on another bulk channel of the same
// message size (binding 1), copied by the whole block straight from one ring's slot into the other's.
// Load it with one block of 256 to 1024 threads: meshd load bulk-echo bulk_echo.ptx --block 1024 ...
#include "mesh.cuh"

MESH_BINDINGS(MESH_BULK, MESH_BULK);  // a load that binds an LL channel is refused

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0) return;
    const bool leader = mesh_block_rank() == 0;                // one thread speaks to meshd
    uint64_t beat = 0;
    if (leader) beat = mesh_begin(ctx);
    mesh_bulk in = mesh_bulk_open(ctx, 0, false);
    mesh_bulk out = mesh_bulk_open(ctx, 1, true);
    if (in.msg_size == 0 || out.msg_size != in.msg_size) {   // not two bulk channels of one size
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;            // every thread leaves together
            if (leader) mesh_heartbeat(ctx, ++beat);
        }
        const void* msg = mesh_block_peek(&in);                // the next message, in place
        if (msg != 0 && mesh_block_try_send(&out, msg)) mesh_block_release(&in);
    }
    mesh_bulk_close(&in);
    mesh_bulk_close(&out);
    if (leader) mesh_end(ctx);
}
