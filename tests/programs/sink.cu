// sink: receives on binding 0 and checks every message's sequence number (its ring position) and
// checksum (stress.cuh); counts passes and failures in its user words. Binding 1: optional knobs.
// Block of 1 thread: the one-thread calls (mesh_try_recv); block of 32: the warp calls
// (mesh_warp_try_recv_batch). Knob STRESS_FIXED: count only, no check (for throughput benchmarks).
// Messages up to 16 KiB. `cargo xtask ptx` regenerates sink.ptx.
#include "stress.cuh"

__shared__ uint32_t sink_buf[4096];

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    const uint32_t lanes = blockDim.x >= 32 ? 32u : 1u;
    const bool leader = threadIdx.x == 0;
    if (lanes == 1 && !leader) return;
    uint64_t beat = 0;
    if (leader) beat = mesh_begin(ctx);
    const stress_knobs knobs = stress_read_knobs(ctx, 1);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    const uint32_t words = in.msg_size / 4u;
    if (in.msg_size == 0 || in.msg_size > sizeof(sink_buf)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    const uint64_t kept = (uint64_t)mesh_user_load(ctx, STRESS_COUNT_LO) | ((uint64_t)mesh_user_load(ctx, STRESS_COUNT_HI) << 32);
    uint32_t errors = mesh_user_load(ctx, STRESS_ERRORS);
    if (leader) {
        stress_set(ctx, STRESS_LAUNCHES, mesh_user_load(ctx, STRESS_LAUNCHES) + 1);
        // Exactly once across relaunches: the count kept must equal the position the channel resumes at.
        if (kept != in.mine) stress_set(ctx, STRESS_RESUME, mesh_user_load(ctx, STRESS_RESUME) + 1);
    }
    uint64_t count = in.mine, stored = kept;
    uint32_t max = sizeof(sink_buf) / in.msg_size;
    if (max > knobs.batch) max = knobs.batch;
    for (uint32_t i = 0;; i++) {
        if ((i & 63u) == 0) {
            if (mesh_should_stop(ctx)) break;
            if (leader) mesh_heartbeat(ctx, ++beat);
        }
        const uint32_t n = lanes == 32 ? mesh_warp_try_recv_batch(&in, sink_buf, max) : (mesh_try_recv(&in, sink_buf) ? 1u : 0u);
        for (uint32_t m = 0; m < n; m++) {
            if (!(knobs.flags & STRESS_FIXED) && !stress_check(sink_buf + m * words, count + m, words, lanes) && leader) {
                if (errors == 0) stress_set(ctx, STRESS_FIRST_BAD, (uint32_t)(count + m));
                stress_set(ctx, STRESS_ERRORS, ++errors);
            }
            stress_pause(knobs.pause_ns);
        }
        if (lanes == 32) __syncwarp();
        count += n;
        // Report progress every 256 messages, and exactly whenever the ring is idle.
        if (leader && count != stored && (n == 0 || count - stored >= 256)) {
            stress_set_count(ctx, count);
            stored = count;
        }
    }
    if (leader) stress_set_count(ctx, count);
    mesh_chan_close(&in);
    if (leader) mesh_end(ctx);
}
