// bulk_parts_source: every block of the grid sends its share of every message on ONE bulk channel
// (binding 0, created with --parts P; grid a power of two up to P), message seq at ring position seq,
// filled in place (bulk_parts.cuh), until meshd asks it to stop. Knob STRESS_FIXED (binding 1): send
// one buffer filled once, with mesh_block_try_send (the copy path, for benchmarks). Launch with a
// multiple of 32 threads a block. Built with PARTS_SEND_N > 1 the copy
// path sends that many messages a call (mesh_block_try_send_n: one barrier and one fence for them);
// with PARTS_FILL_N > 1 (bulk_parts_source_x_batch4.cu) the in-place path fills that many slots a call
// (mesh_block_reserve_n / mesh_block_publish_n).
#include "bulk_parts.cuh"

#ifndef PARTS_SEND_N
#define PARTS_SEND_N 1u
#endif
#ifndef PARTS_FILL_N
#define PARTS_FILL_N 1u
#endif

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
        const uint64_t before = out.mine;
        if (fixed) {
#if PARTS_SEND_N > 1
            const void* msgs[PARTS_SEND_N];
            for (uint32_t m = 0; m < PARTS_SEND_N; m++) msgs[m] = mine;  // the same fixed buffer each time
            sent = mesh_block_try_send_n(&out, msgs, PARTS_SEND_N) != 0;
#else
            sent = mesh_block_try_send(&out, mine);
#endif
        } else {
#if PARTS_FILL_N > 1
            const uint32_t got = mesh_block_reserve_n(&out, PARTS_FILL_N);
            for (uint32_t m = 0; m < got; m++) parts_fill((uint32_t*)mesh_block_reserved(&out, m), out.mine + m, first, words);
            mesh_block_publish_n(&out, got);
            sent = got != 0;
#else
            uint32_t* slot = (uint32_t*)mesh_block_reserve(&out);
            sent = slot != 0;
            if (sent) {
                parts_fill(slot, out.mine, first, words);
                mesh_block_publish(&out);
            }
#endif
        }
        if (sent && (out.mine >> 4) != (before >> 4)) parts_report(ctx, b, out.mine, 0);  // every 16th message
        if (!sent) stress_pause(knobs.pause_ns);
    }
    parts_report(ctx, b, out.mine, 0);
    mesh_bulk_close(&out);
    if (b == 0 && leader) mesh_end(ctx);
}
