// echo_x_phase: echo_header's one-warp loop with its polls phase-locked to the client (issue 24 item 1,
// session 17; a benchmark variant). The kit's timeline on the H200 (docs/gpu-runs/2026-12-05-s17) shows
// the header's loop losing one whole poll (~1.5 µs) per request / reply from 64 B up: the poll issued
// right after a reply reaches the host before the host has seen the reply and written the next request,
// and the warp, one poll in flight at a time, sees the request only with the poll after it. The host
// delay sweep is a sawtooth: the same echo at the right phase is 1.6 µs, below the raw word's median.
// Here the warp learns the phase: after a reply it issues no poll until PHASE_WAIT (learned, %globaltimer
// ns) has passed, and adapts it from what the first poll after the wait saw: the request already there
// (a hit: wait PHASE_DOWN less next time, so that a stream, always a hit, comes down to no wait at all),
// exactly one empty poll before it (the first poll just missed: wait PHASE_UP more, up to PHASE_MAX), or
// several (a client slower than a poll period: its phase is its own, the wait stays). A miss costs a poll,
// a hit saves one, so the wait settles where misses are about PHASE_DOWN / (PHASE_UP + PHASE_DOWN) of the
// round trips. Same contract as the echo (mesh_warp_try_recv / mesh_warp_try_send unchanged): the wait
// only delays a poll.
#include "mesh.cuh"

#ifndef PHASE_UP
#define PHASE_UP 100u
#endif
#ifndef PHASE_DOWN
#define PHASE_DOWN 10u
#endif
#ifndef PHASE_MAX
#define PHASE_MAX 1500u
#endif

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t buf[1024];                    // one message, up to 4 KiB
    if (threadIdx.x >= 32) return;                    // one warp serves the channels
    uint64_t beat = 0;
    if (threadIdx.x == 0) beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    if (in.msg_size == 0 || in.msg_size != out.msg_size || in.msg_size > sizeof(buf)) {
        if (threadIdx.x == 0) mesh_exit(ctx, 1);      // a binding missing or of another size
        return;
    }
    uint32_t wait = 0, empties = 0;                   // the learned wait; empty polls since the last reply
    uint64_t due = 0;                                 // no poll before (lane 0's %globaltimer, every lane)
    for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
        if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
        if (__shfl_sync(0xffffffffu, mesh_globaltimer(), 0) < due) continue;
        if (mesh_chan_room(&out) == 0) continue;
        if (!mesh_warp_try_recv(&in, buf)) {
            empties++;
            continue;
        }
        if (empties == 0) wait = wait > PHASE_DOWN ? wait - PHASE_DOWN : 0u;
        else if (empties == 1) wait = wait + PHASE_UP < PHASE_MAX ? wait + PHASE_UP : PHASE_MAX;
        empties = 0;
        mesh_warp_try_send(&out, buf);
        due = __shfl_sync(0xffffffffu, mesh_globaltimer(), 0) + wait;
    }
    mesh_chan_close(&in);                             // exact positions for the next launch
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}
