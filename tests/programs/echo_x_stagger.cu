// echo_x_stagger: echo_header's one warp with two polls of the input ring in flight at once, STAGGER_NS
// apart (issue 24 item 1, session 14; a benchmark variant, written without a GPU and checked by g++ only,
// tests/probes/cuda_syntax_stub.h). The header's loop polls one message at a time: a request that lands
// just after a poll left waits for that poll to come back empty and for the next one, a whole PCIe round
// trip more (~1.1-1.4 µs on the H200: docs/design/speed.md, "The cause, named"), and whether it does
// depends on the loop's phase against the host, which is why its 64 B-1 KiB rows move between calls
// (1 KiB: 2.84 µs in session 8, 3.59 in session 12, beside an LL probe of 2.6-2.8). The poll stream
// (echo_poll.cu) fixes it with more warps; this asks whether one warp does: it issues poll A, STAGGER_NS
// later poll B (into other registers, before looking at A), then looks at A (the warp waits for A's loads
// alone), then issues A again STAGGER_NS after B and looks at B, and so on: two polls in flight, so a
// lost race costs ~STAGGER_NS instead of a round trip. Whether a lane's second load of the same address
// overlaps its first in flight is what the GPU decides; the poll stream's warps load the same addresses
// and did (session 5).
//
// `mesh-gpu-bench rt-ab blink` with MESH_RT_AB_VARIANTS="echo_x_stagger" measures it in turns beside the
// header's loop, the raw word and the one-warp LL probe. Messages up to 1 KiB (X_PAIRS 16-byte loads per
// lane, as mesh_warp_try_recv's short path); larger ones, or a binding missing, exit with code 1.
// Written against mesh.cuh's public calls and documented channel format (mesh_chan_open, mesh_chan_slot,
// mesh_tag, mesh_ld_volatile_v2, mesh_chan_room, mesh_warp_try_send, mesh_chan_took,
// mesh_chan_drained, mesh_chan_close). Same contract as the echo: every message taken from binding 0 goes
// back on binding 1 once, in order, across orderly stops (a poll's values are used only for the position
// it loaded, and only when every word carries that position's tag: 8-byte single-copy atomicity, as in
// mesh_warp_try_recv).
#include "mesh.cuh"

#ifndef STAGGER_NS
#define STAGGER_NS 500u
#endif
#define X_PAIRS 4u  // 16-byte loads per lane per poll: messages up to 64 x 4 wire words, 1 KiB

// One poll in flight: the loaded pairs, the position they were loaded for, and when (lane 0's clock).
typedef struct {
    uint64_t a[X_PAIRS], b[X_PAIRS];
    uint64_t pos;
    uint64_t at;
} x_poll;

// Issues this lane's loads of message `in->mine` into `p` and returns without waiting for them.
static __device__ __forceinline__ void x_issue(const mesh_chan* in, x_poll* p, uint32_t words) {
    const volatile uint64_t* src = mesh_chan_slot(in, in->mine);
    const uint32_t lane = mesh_lane();
#pragma unroll
    for (uint32_t k = 0; k < X_PAIRS; k++)
        if (2u * (lane + 32u * k) < words) mesh_ld_volatile_v2(src + 2u * (lane + 32u * k), &p->a[k], &p->b[k]);
    p->pos = in->mine;
    p->at = __shfl_sync(0xffffffffu, mesh_globaltimer(), 0);
}

// Spins until `at` + STAGGER_NS (every lane on lane 0's clock, so the warp stays converged).
static __device__ __forceinline__ void x_wait_after(uint64_t at) {
    while (__shfl_sync(0xffffffffu, mesh_globaltimer(), 0) < at + STAGGER_NS) {
    }
}

// Takes and echoes the message `p` loaded, when `p` was loaded for the position now due, every word of it
// carries that position's tag, and the output ring has room. A poll of a position already taken is
// passed over without waiting for its loads.
static __device__ __forceinline__ void x_serve(mesh_chan* in, mesh_chan* out, const x_poll* p, uint32_t* buf,
                                               uint32_t words) {
    if (p->pos != in->mine) return;  // the same on every lane
    const uint32_t lane = mesh_lane(), t = mesh_tag(in->mine);
    bool whole = true;
#pragma unroll
    for (uint32_t k = 0; k < X_PAIRS; k++)
        if (2u * (lane + 32u * k) < words) whole &= (uint32_t)(p->a[k] >> 32) == t && (uint32_t)(p->b[k] >> 32) == t;
    if (!__all_sync(0xffffffffu, whole)) {
        if (__shfl_sync(0xffffffffu, (uint32_t)(p->a[0] >> 32) == t, 0)) in->partial++;  // half-arrived
        else mesh_chan_drained(in);                                                      // nothing yet
        return;
    }
    if (mesh_chan_room(out) == 0) return;  // polled again later (every lane reads the same tail)
#pragma unroll
    for (uint32_t k = 0; k < X_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        if (idx < words) {
            buf[idx] = (uint32_t)p->a[k];
            buf[idx + 1u] = (uint32_t)p->b[k];
        }
    }
    __syncwarp();
    in->mine += 1;
    mesh_chan_took(in);
    mesh_warp_try_send(out, buf);  // room checked above
    __syncwarp();                  // every lane has read buf before the next take writes it
}

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t buf[64u * X_PAIRS];  // one message, up to 1 KiB
    if (threadIdx.x >= 32) return;           // one warp serves the channels
    uint64_t beat = 0;
    if (threadIdx.x == 0) beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    const uint32_t words = in.msg_size / 4u;
    if (in.msg_size == 0 || in.msg_size != out.msg_size || words > 64u * X_PAIRS) {
        if (threadIdx.x == 0) mesh_exit(ctx, 1);
        return;
    }
    x_poll pa, pb;
    x_issue(&in, &pa, words);
    pb.pos = ~0ull;
    pb.at = pa.at;
    for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
        if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);
        x_wait_after(pa.at);
        x_issue(&in, &pb, words);  // B in flight before A is looked at
        x_serve(&in, &out, &pa, buf, words);
        x_wait_after(pb.at);
        x_issue(&in, &pa, words);  // A again, STAGGER_NS after B
        x_serve(&in, &out, &pb, buf, words);
    }
    mesh_chan_close(&in);  // exact positions for the next launch
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}
