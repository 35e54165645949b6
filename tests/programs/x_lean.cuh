// x_lean.cuh: a lean receive and send (docs/explanation/channels.md), for the benchmark variants echo_x_lean.cu
// and ping_x_lean.cu (not a program: no mesh_main). Built on mesh.cuh's calls, its documented format and
// its internals (mesh_detail_*), which a benchmark variant may use and a program should not.
//
// x_lean_try_recv: when a message fits one 16-byte load per lane (msg_size <= 256 B: 64 wire words),
// one predicated load per lane, one vote, no 16-pair unrolled setup, no min-reduction, no partial-wait
// loop (a half-arrived message is simply polled again next call). Larger messages: the header's call.
// x_lean_try_send: the same size limit, one predicated store per lane and no loop; the room check is
// one compare on the cached credit, the tail read (mesh_chan_room) only when the ring looks full.
// (mesh_warp_try_send has no __shfl_sync of the room; only mesh_warp_try_send_batch does: what this
// drops against mesh_warp_try_send is its store loop and its call of mesh_chan_room on every send.)
//
// Memory model: exactly the header's LL format and ordering. Every 8-byte word carries mesh_detail_tag(seq) in
// its high half and is stored whole (st.volatile = relaxed, sys scope, morally strong; 8-byte single-
// copy atomicity), so a word read with the right tag by ld.volatile is that message's word whatever
// order the words arrive in; a message is taken only when every lane's words have the tag (one
// __all_sync vote). No fence per message on either side, as in the header: the consumer's tail store
// (mesh_detail_chan_progress / flush, lowest active lane) is issued after the vote that consumed the loaded
// values, and the producer's stores after its read of that tail. The payload in `buf` is written by
// each lane for its own words and ordered for the whole warp by __syncwarp before the call returns.
#pragma once
#include "mesh.cuh"

static __device__ __forceinline__ bool x_lean_try_recv(mesh_chan* ch, void* buf) {
    const uint32_t words = ch->msg_size / 4u;  // wire words (8 B), 4 payload bytes each
    if (words > 64u) return mesh_warp_try_recv(ch, buf);
    if (words == 0 || ch->producer) return false;
    const uint32_t lane = mesh_detail_lane(), t = mesh_detail_tag(ch->mine);
    const bool mine = 2u * lane < words;  // lane 0 always: words >= 2
    uint64_t a = 0, b = 0;
    if (mine) mesh_detail_ld_volatile_v2(mesh_detail_chan_slot(ch, ch->mine) + 2u * lane, &a, &b);
    const bool first = (uint32_t)(a >> 32) == t;
    if (!__all_sync(0xffffffffu, !mine || (first && (uint32_t)(b >> 32) == t))) {
        if (__shfl_sync(0xffffffffu, first, 0)) ch->partial++;  // word 0 is there: half-arrived
        else mesh_detail_chan_drained(ch);                             // nothing yet
        return false;
    }
    uint32_t* dst = (uint32_t*)buf;
    if (mine) {
        dst[2u * lane] = (uint32_t)a;
        dst[2u * lane + 1u] = (uint32_t)b;
    }
    __syncwarp();
    ch->mine += 1;
    mesh_detail_chan_took(ch);  // publishes what earlier calls took: at-least-once after a crash
    return true;
}

static __device__ __forceinline__ bool x_lean_try_send(mesh_chan* ch, const void* buf) {
    const uint32_t words = ch->msg_size / 4u;
    if (words > 64u) return mesh_warp_try_send(ch, buf);
    if (words == 0 || !ch->producer) return false;
    if (ch->mine - ch->other > ch->mask && mesh_chan_room(ch) == 0) return false;  // every lane alike
    const uint32_t lane = mesh_detail_lane();
    if (2u * lane < words) {
        const uint32_t* src = (const uint32_t*)buf;
        const uint64_t t = (uint64_t)mesh_detail_tag(ch->mine) << 32;
        mesh_detail_st_volatile_v2(mesh_detail_chan_slot(ch, ch->mine) + 2u * lane, t | src[2u * lane], t | src[2u * lane + 1u]);
    }
    ch->mine += 1;
    mesh_detail_chan_progress(ch);
    return true;
}

// The including program's calls become the lean ones (mesh.cuh, included above, keeps its own).
#define mesh_warp_try_recv x_lean_try_recv
#define mesh_warp_try_send x_lean_try_send
