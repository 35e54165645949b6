// bulk_sink: each block b receives on binding b (a bulk channel) and checks every message in place:
// its sequence number (its ring position) and its checksum over every byte (bulk_stress.cuh), counting
// passes and failures in its user words: the count every 16 messages, and exactly whenever the ring
// is found empty (so a finite stream's last messages are counted while the sink runs, not only at its
// stop; a stream of 200 once stayed at 192). Knob STRESS_FIXED: copy each message out with
// mesh_block_try_recv and count it without a check (for throughput benchmarks; up to 1 MiB). Launch
// with 1 to 8 blocks of a multiple of 32 threads. `cargo xtask ptx` regenerates bulk_sink.ptx.
#include "bulk_stress.cuh"

__device__ uint4 bulk_sink_buf[BULK_MAX_BLOCKS][BULK_FIXED_MAX / 16u];

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t b = blockIdx.x;
    const bool leader = mesh_block_rank() == 0;
    uint64_t beat = 0;
    if (b == 0 && leader) beat = mesh_begin(ctx);
    mesh_bulk in = mesh_bulk_open(ctx, b, false);
    const stress_knobs knobs = stress_read_knobs(ctx, gridDim.x);
    const bool fixed = knobs.flags & STRESS_FIXED;
    if (b >= BULK_MAX_BLOCKS || in.msg_size == 0 || mesh_block_threads() % 32u != 0 || (fixed && in.msg_size > BULK_FIXED_MAX)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t words = in.msg_size / 4u;
    uint32_t bad = mesh_user_load(ctx, BULK_BAD(b));
    if (leader) {
        if (b == 0) stress_set(ctx, BULK_LAUNCHES, mesh_user_load(ctx, BULK_LAUNCHES) + 1);
        // Exactly once across relaunches: the count kept must equal the position the channel resumes at.
        if (bulk_count(ctx, b) != in.mine) stress_set(ctx, BULK_BAD(b), bad += BULK_RESUME_ONE);
    }
    uint64_t published = in.mine;  // the count last stored in BULK_COUNT(b)
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (b == 0 && leader) mesh_heartbeat(ctx, ++beat);
        }
        bool got;
        if (fixed) {
            got = mesh_block_try_recv(&in, bulk_sink_buf[b]);
        } else {
            const uint32_t* msg = (const uint32_t*)mesh_block_peek(&in);
            got = msg != 0;
            if (got) {
                if (!bulk_check(msg, in.mine, words) && leader) stress_set(ctx, BULK_BAD(b), ++bad);
                mesh_block_release(&in);
            }
        }
        if (got) stress_pause(knobs.pause_ns);
        // Every 16th message, and when the ring is empty with messages not yet counted (nothing else to
        // do then; a stream's tail would otherwise wait for the next 16th or the stop).
        if (got ? (in.mine & 15u) == 0 : in.mine != published) {
            if (leader) bulk_set_count(ctx, b, in.mine);
            published = in.mine;
        }
    }
    if (leader) bulk_set_count(ctx, b, in.mine);
    mesh_bulk_close(&in);
    if (b == 0 && leader) mesh_end(ctx);
}
