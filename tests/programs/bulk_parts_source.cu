// bulk_parts_source: every block of the grid sends its share of every message on ONE bulk channel
// (binding 0, created with --parts P; grid a power of two up to P), message seq at ring position seq,
// filled in place (bulk_parts.cuh), until meshd asks it to stop. Knob STRESS_FIXED (binding 1): send
// one buffer filled once, with mesh_block_try_send (the copy path, for benchmarks). Launch with a
// multiple of 32 threads a block. NOT YET RUN ON A GPU, nor through nvcc (g++ syntax check only).
#include "bulk_parts.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t b = blockIdx.x;
    const bool leader = mesh_block_rank() == 0;
    uint64_t beat = 0;
    if (b == 0 && leader) beat = mesh_begin(ctx);
    mesh_bulk out = mesh_bulk_open_part(ctx, 0, true, b, gridDim.x);
    const stress_knobs knobs = stress_read_knobs(ctx, 1);
    const bool fixed = knobs.flags & STRESS_FIXED;
    if (b >= PARTS_MAX_BLOCKS || out.msg_size == 0 || mesh_block_threads() % 32u != 0 ||
        (fixed && out.stride > PARTS_FIXED_MAX)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t words = out.msg_size / 4u, first = mesh_bulk_part_offset(&out) / 4u;
    uint4* mine = bulk_parts_buf + mesh_bulk_part_offset(&out) / 16u;
    if (fixed) parts_fill((uint32_t*)mine, 0, first, words);
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (b == 0 && leader) mesh_heartbeat(ctx, ++beat);
        }
        bool sent;
        if (fixed) {
            sent = mesh_block_try_send(&out, mine);
        } else {
            uint32_t* slot = (uint32_t*)mesh_block_reserve(&out);
            sent = slot != 0;
            if (sent) {
                parts_fill(slot, out.mine, first, words);
                mesh_block_publish(&out);
            }
        }
        if (sent && (out.mine & 15u) == 0) parts_report(ctx, b, out.mine, 0);
        if (!sent) stress_pause(knobs.pause_ns);
    }
    parts_report(ctx, b, out.mine, 0);
    mesh_bulk_close(&out);
    if (b == 0 && leader) mesh_end(ctx);
}
