// bulk_echo: every message received on binding 0 (a bulk channel) goes back on binding 1 (a bulk
// channel of the same message size), copied by the whole block straight from one ring's slot into the
// other's; user word 0 counts messages echoed. One block of 256 to 1024 threads.
// `cargo xtask ptx` regenerates bulk_echo.ptx.
#include "mesh.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0) return;
    const bool leader = mesh_block_rank() == 0;
    uint64_t beat = 0;
    if (leader) beat = mesh_begin(ctx);
    mesh_bulk in = mesh_bulk_open(ctx, 0, false);
    mesh_bulk out = mesh_bulk_open(ctx, 1, true);
    if (in.msg_size == 0 || out.msg_size != in.msg_size) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (leader) mesh_heartbeat(ctx, ++beat);
        }
        const void* msg = mesh_block_peek(&in);
        if (msg != 0 && mesh_block_try_send(&out, msg)) {
            mesh_block_release(&in);
            if (leader) mesh_user_store(ctx, 0, (uint32_t)in.mine);
        }
    }
    mesh_bulk_close(&in);
    mesh_bulk_close(&out);
    if (leader) mesh_end(ctx);
}
