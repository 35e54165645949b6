// ping: the GPU end of a GPU↔GPU round-trip benchmark. One warp sends message `seq` on binding 0 and
// waits for it to come back on binding 1 (an echo program, e.g. echo_header, at the other end), timing
// each round trip with %globaltimer and checking every word of the reply. After PING_WARMUP round
// trips it reports in its user words: 0-1 round trips timed (lo, hi), 2-3 their total ns (lo, hi), 4 the
// fastest in ns, 5 replies whose content was wrong, 6 the slowest in ns. Messages up to 4 KiB.
// `cargo xtask ptx` regenerates ping.ptx.
#include "mesh.cuh"

#define PING_WARMUP 1000u
#ifndef PING_STOP_EVERY
#define PING_STOP_EVERY 1u  // the header's loop: mesh_should_stop on every iteration
#endif

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t out_buf[1024], in_buf[1024];
    if (threadIdx.x >= 32) return;
    const bool leader = threadIdx.x == 0;
    if (leader) mesh_begin(ctx);
    mesh_chan out = mesh_chan_open(ctx, 0, true);
    mesh_chan in = mesh_chan_open(ctx, 1, false);
    if (out.msg_size == 0 || out.msg_size != in.msg_size || out.msg_size > sizeof(out_buf)) {
        if (leader) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t words = out.msg_size / 4u;
    // Resume: replies still owed by the last launch are taken first (the echo may hold one).
    uint64_t done = 0, total = 0, fastest = ~0ull, slowest = 0;
    uint32_t bad = 0;
    bool waiting = false;
    uint64_t sent_at = 0;
    uint32_t seq = (uint32_t)out.mine;
    for (uint32_t iter = 0; iter % PING_STOP_EVERY != 0 || !mesh_should_stop(ctx); iter++) {
        if (!waiting) {
            if (in.mine != out.mine) {  // a reply of an earlier launch is still due: take it untimed
                if (mesh_warp_try_recv(&in, in_buf)) continue;
                continue;
            }
            seq = (uint32_t)out.mine;
            for (uint32_t i = threadIdx.x; i < words; i += 32) out_buf[i] = seq * 2654435761u + i;
            __syncwarp();
            sent_at = mesh_globaltimer();
            if (mesh_warp_try_send(&out, out_buf)) waiting = true;
        } else if (mesh_warp_try_recv(&in, in_buf)) {
            const uint64_t took = mesh_globaltimer() - sent_at;
            waiting = false;
            bool ok = true;
            for (uint32_t i = threadIdx.x; i < words; i += 32) ok &= in_buf[i] == seq * 2654435761u + i;
            ok = __all_sync(0xffffffffu, ok);
            if (!ok) bad++;
            done++;
            if (done > PING_WARMUP) {
                total += took;
                fastest = took < fastest ? took : fastest;
                slowest = took > slowest ? took : slowest;
                if (leader && ((done & 1023u) == 0)) {
                    const uint64_t n = done - PING_WARMUP;
                    mesh_user_store(ctx, 2, (uint32_t)total);
                    mesh_user_store(ctx, 3, (uint32_t)(total >> 32));
                    mesh_user_store(ctx, 4, (uint32_t)fastest);
                    mesh_user_store(ctx, 5, bad);
                    mesh_user_store(ctx, 6, (uint32_t)slowest);
                    mesh_user_store(ctx, 1, (uint32_t)(n >> 32));
                    mesh_user_store(ctx, 0, (uint32_t)n);
                }
            }
        }
    }
    mesh_chan_close(&out);
    mesh_chan_close(&in);
    if (leader) mesh_end(ctx);
}
