// bulk_source: each block b sends stress messages on binding b (a bulk channel), message `seq` at ring
// position `seq`, filled in place by the whole block, until meshd asks it to stop (bulk_stress.cuh).
// Knob STRESS_FIXED: send one buffer filled once, with mesh_block_try_send (for throughput benchmarks;
// messages up to 1 MiB). Launch with 1 to 8 blocks of a multiple of 32 threads (256 to 1024 is
// right). `cargo xtask ptx` regenerates bulk_source.ptx.
#include "bulk_stress.cuh"

__device__ uint4 bulk_source_buf[BULK_MAX_BLOCKS][BULK_FIXED_MAX / 16u];

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t b = blockIdx.x;
    const bool leader = mesh_block_rank() == 0;
    uint64_t beat = 0;
    if (b == 0 && leader) beat = mesh_begin(ctx);
    mesh_bulk out = mesh_bulk_open(ctx, b, true);
    const stress_knobs knobs = stress_read_knobs(ctx, gridDim.x);
    const bool fixed = knobs.flags & STRESS_FIXED;
    if (b >= BULK_MAX_BLOCKS || out.msg_size == 0 || mesh_block_threads() % 32u != 0 || (fixed && out.msg_size > BULK_FIXED_MAX)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t words = out.msg_size / 4u;
    if (b == 0 && leader) stress_set(ctx, BULK_LAUNCHES, mesh_user_load(ctx, BULK_LAUNCHES) + 1);
    if (fixed) bulk_fill((uint32_t*)bulk_source_buf[b], 0, words);
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (b == 0 && leader) mesh_heartbeat(ctx, ++beat);
        }
        bool sent;
        if (fixed) {
            sent = mesh_block_try_send(&out, bulk_source_buf[b]);
        } else {
            uint32_t* slot = (uint32_t*)mesh_block_reserve(&out);
            sent = slot != 0;
            if (sent) {
                bulk_fill(slot, out.mine, words);
                mesh_block_publish(&out);
            }
        }
        if (sent && leader && (out.mine & 15u) == 0) bulk_set_count(ctx, b, out.mine);
        if (!sent) stress_pause(knobs.pause_ns);
    }
    if (leader) bulk_set_count(ctx, b, out.mine);
    mesh_bulk_close(&out);
    if (b == 0 && leader) mesh_end(ctx);
}
