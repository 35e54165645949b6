// bulk_parts_sink: every block of the grid receives its share of every message on ONE bulk channel
// (binding 0, created with --parts P; grid a power of two up to P) and checks every word of it in
// place (bulk_parts.cuh), counting messages and failures in its own user word: every 16 messages, and
// whenever its share of the ring is found empty. Knob STRESS_FIXED (binding 1): copy each share out
// with mesh_block_try_recv and count it unchecked (the copy path, for benchmarks). Launch with a
// multiple of 32 threads a block. Built with PARTS_RECV_N > 1 (bulk_parts_sink_x_batch4.cu) it takes
// up to that many messages a call, on either path (mesh_block_try_recv_n; mesh_block_peek_n /
// mesh_block_release_n: one barrier to give them all back).
#include "bulk_parts.cuh"

#ifndef PARTS_RECV_N
#define PARTS_RECV_N 1u
#endif

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t b = blockIdx.x;
    const bool leader = mesh_block_rank() == 0;
    uint64_t beat = 0;
    if (b == 0 && leader) beat = mesh_begin(ctx);
    mesh_bulk in = mesh_bulk_open_part(ctx, 0, false, b, gridDim.x);
    const stress_knobs knobs = stress_read_knobs(ctx, 1);
    const bool fixed = knobs.flags & STRESS_FIXED;
    if (b >= PARTS_MAX_BLOCKS || in.msg_size == 0 || mesh_block_threads() % 32u != 0 ||
        (fixed && in.stride > PARTS_FIXED_MAX)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t words = in.msg_size / 4u, first = mesh_bulk_part_offset(&in) / 4u;
    uint4* mine = bulk_parts_buf + mesh_bulk_part_offset(&in) / 16u;
    const uint32_t word = mesh_user_load(ctx, b);
    uint32_t bad = word >> PARTS_BAD_SHIFT;
    // Exactly once across relaunches: the count kept must equal the position the share resumes at.
    if ((word & PARTS_COUNT_MASK) != ((uint32_t)in.mine & PARTS_COUNT_MASK)) bad++;
    uint64_t published = in.mine;
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (b == 0 && leader) mesh_heartbeat(ctx, ++beat);
        }
        bool got;
        const uint64_t before = in.mine;
#if PARTS_RECV_N > 1
        if (fixed) {
            void* outs[PARTS_RECV_N];
            for (uint32_t m = 0; m < PARTS_RECV_N; m++) outs[m] = mine;  // the same buffer each time, unchecked
            got = mesh_block_try_recv_n(&in, outs, PARTS_RECV_N) != 0;
        } else {
            const uint32_t n = mesh_block_peek_n(&in, PARTS_RECV_N);
            for (uint32_t m = 0; m < n; m++)
                if (!parts_check((const uint32_t*)mesh_block_peeked(&in, m), in.mine + m, first, words)) bad++;
            if (n) mesh_block_release_n(&in, n);
            got = n != 0;
        }
#else
        if (fixed) {
            got = mesh_block_try_recv(&in, mine);
        } else {
            const uint32_t* msg = (const uint32_t*)mesh_block_peek(&in);
            got = msg != 0;
            if (got) {
                if (!parts_check(msg, in.mine, first, words)) bad++;
                mesh_block_release(&in);
            }
        }
#endif
        if (got) stress_pause(knobs.pause_ns);
        if (got ? (in.mine >> 4) != (before >> 4) : in.mine != published) {  // every 16th message, or idle
            parts_report(ctx, b, in.mine, bad);
            published = in.mine;
        }
    }
    parts_report(ctx, b, in.mine, bad);
    mesh_bulk_close(&in);
    if (b == 0 && leader) mesh_end(ctx);
}
