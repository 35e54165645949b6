// source: sends stress messages (stress.cuh) on binding 0, message `seq` at ring position `seq`, until
// meshd asks it to stop. Binding 1: optional knobs. Block of 1 thread: mesh_try_send; block of 32:
// mesh_warp_try_send_batch. Messages up to 16 KiB. `cargo xtask ptx` regenerates source.ptx.
#include "stress.cuh"

__shared__ uint32_t source_buf[4096];

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    const uint32_t lanes = blockDim.x >= 32 ? 32u : 1u;
    const bool leader = threadIdx.x == 0;
    if (lanes == 1 && !leader) return;
    uint64_t beat = 0;
    if (leader) beat = mesh_begin(ctx);
    const stress_knobs knobs = stress_read_knobs(ctx, 1);
    mesh_chan out = mesh_chan_open(ctx, 0, true);
    const uint32_t words = out.msg_size / 4u;
    if (out.msg_size == 0 || out.msg_size > sizeof(source_buf)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    if (leader) stress_set(ctx, STRESS_LAUNCHES, mesh_user_load(ctx, STRESS_LAUNCHES) + 1);
    uint32_t max = sizeof(source_buf) / out.msg_size;
    if (max > knobs.batch) max = knobs.batch;
    if (lanes == 1) max = 1;
    const bool fixed = knobs.flags & STRESS_FIXED;
    uint64_t filled = ~0ull;  // source_buf holds messages filled .. filled + max
    for (uint32_t i = 0;; i++) {
        if ((i & 63u) == 0) {
            if (mesh_should_stop(ctx)) break;
            if (leader) {
                mesh_heartbeat(ctx, ++beat);
                stress_set_count(ctx, out.mine);
            }
        }
        if (filled != out.mine) {
            if (lanes == 32) __syncwarp();
            if (fixed && filled != ~0ull) {
                for (uint32_t m = threadIdx.x; m < max; m += lanes) source_buf[m * words] = (uint32_t)(out.mine + m);
            } else {
                for (uint32_t m = 0; m < max; m++) stress_fill(source_buf + m * words, out.mine + m, words, lanes);
            }
            if (lanes == 32) __syncwarp();
            filled = out.mine;
        }
        const uint32_t n = lanes == 32 ? mesh_warp_try_send_batch(&out, source_buf, max) : (mesh_try_send(&out, source_buf) ? 1u : 0u);
        if (n) stress_pause(knobs.pause_ns * n);
    }
    if (leader) stress_set_count(ctx, out.mine);
    mesh_chan_close(&out);
    if (leader) mesh_end(ctx);
}
