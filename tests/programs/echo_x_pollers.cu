// echo_x_pollers: echo_header with docs/design/speed.md's proposed poll stream (issue 24 item 1): POLLERS
// warps poll the input ring SPACING_NS apart, so that a poll reaches the host soon after any moment a
// request lands (a lost race then costs ~SPACING_NS, not a whole ~1.4 µs empty poll), and one more warp,
// the server (warp 0), never loads host memory: it arms the pollers, takes what the first of them
// caught, sends it and checks the stop. A benchmark variant, written without a GPU and never compiled
// by nvcc yet (g++ syntax check only, tests/probes/cuda_syntax_stub.h); not built by default into
// anything but `cargo xtask ptx` / the bundle's nvcc step. Sweep: `nvcc -ptx -arch=compute_80
// -DPOLLERS=K -DSPACING_NS=S` (tests/probes/run-kit.sh pollers does it). Launch with a block of
// 32 * (POLLERS + 1) threads (meshd: `--block`); a smaller block exits with code 2. Messages up to
// 4 KiB (X_MAX_PAIRS 16-byte loads per lane; 256 B is one load per lane).
//
// Written against mesh.cuh's public calls and its documented channel format only (mesh_chan_open,
// mesh_chan_slot, mesh_tag, mesh_ld_volatile_v2, mesh_chan_room, mesh_warp_try_send, mesh_chan_progress,
// mesh_chan_flush, mesh_chan_close): the header's own receive is not used.
//
// The contract is the echo's: every message taken from binding 0 is sent on binding 1 exactly once
// across orderly stops. A poller may take message p only while the server has armed p, and the server
// arms p only with room in the output ring and before it has seen the stop; on the stop the server
// closes the claim word with a compare-and-swap, so a message is either claimed before (and then sent
// before the server closes the channels) or left in the ring for the next launch.
//
// Memory model (PTX ISA, "Memory Consistency Model"):
//  * The ring: each 8-byte word of message p carries mesh_tag(p) in its high half and is stored whole
//    by the producer (8-byte single-copy atomicity); pollers load it with ld.volatile (a relaxed, sys
//    scope, morally strong load), so a word with the right tag is that message's word whatever order
//    the words arrive in. A poller takes the message only when every word of it has its tag (a warp
//    vote over all lanes' loads): a half-arrived message is never claimed, it is polled again.
//  * The claim (which warp consumes message p): a 64-bit word in shared memory, `claim`, never a host
//    atomic (the H200 has no host-native atomics, and none is needed: one block consumes the ring).
//    claim == 2p: p is armed, nobody has it; 2p + 1: p is claimed; X_CLOSED: stopping. A poller that
//    saw p whole does atomicCAS(claim, 2p, 2p + 1) from one lane: the CAS is one read-modify-write of
//    one location, so in claim's coherence order exactly one CAS expecting 2p succeeds; every other
//    warp's (and the server's closing CAS) reads a value other than 2p and fails. The values only rise
//    (2p -> 2p+1 -> 2p+2 ...) or become X_CLOSED, never return: no ABA, and a poller holding an old
//    2p' can never claim a later message. So the first warp to see the message whole (first to CAS) is
//    the only one to consume it; the others drop their loads.
//  * The hand-off: the winning warp's lanes store the payload into shared `buf` (weak stores),
//    __syncwarp (orders them before lane 0's next accesses), then lane 0 st.release.cta `ready` = p + 1.
//    Every server lane spins with ld.acquire.cta on `ready`: its reads of buf after it sees p + 1 are
//    ordered after the poller's stores (release -> acquire, CTA scope: same block).
//  * Reuse of buf: the server reads buf (its send), __syncwarp, then lane 0 __threadfence_block() +
//    atomicExch(claim, 2(p + 1)) (a release pattern); the next winner's lane 0 CAS reads that value and
//    __threadfence_block() (an acquire pattern) before the __syncwarp after which its lanes store buf:
//    the server's reads of message p happen before the stores of message p + 1.
//  * The tail (the producer's credit): published by the server only (mesh_chan_progress / flush /
//    close on its own copy of `in`), for messages whose `ready` it has acquired: the poller's loads of
//    the slot completed (their values were voted on and stored to buf) before the release of `ready`,
//    so the producer cannot reuse a slot still being read. Same reasoning as the header's LL calls.
//  * Poll timing: `next_poll` (shared, 64-bit) hands out poll times at least SPACING_NS apart with a
//    CAS loop (relaxed atomics: only the timing depends on it, not correctness).
#include "mesh.cuh"

#ifndef POLLERS
#define POLLERS 4
#endif
#ifndef SPACING_NS
#define SPACING_NS 300
#endif
#ifndef X_MAX_PAIRS
#define X_MAX_PAIRS 16u  // 16-byte loads per lane per poll: 16 x 32 x 8 payload bytes = 4 KiB
#endif
#define X_CLOSED (~0ull)

struct x_box {
    unsigned long long claim;      // 2p armed, 2p + 1 claimed, X_CLOSED stopping
    unsigned long long ready;      // p + 1 once message p's payload is in buf
    unsigned long long next_poll;  // %globaltimer of the next poll slot
    uint32_t ok;                   // the server's verdict on the bindings
    mesh_chan in;                  // the server's opened input channel, for the pollers' addresses
    uint32_t buf[32u * 2u * X_MAX_PAIRS];
};

static __device__ __forceinline__ uint64_t x_ld_relaxed_cta(const unsigned long long* p) {
    uint64_t v;
    asm volatile("ld.relaxed.cta.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t x_ld_acquire_cta(const unsigned long long* p) {
    uint64_t v;
    asm volatile("ld.acquire.cta.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void x_st_release_cta(unsigned long long* p, uint64_t v) {
    asm volatile("st.release.cta.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Lane 0's value on every lane.
static __device__ __forceinline__ uint64_t x_bcast(uint64_t v) {
    return __shfl_sync(0xffffffffu, v, 0);
}

// The next poll time for this warp: at least SPACING_NS after the one handed out before, and never in
// the past (a warp that comes back late polls at once and moves the schedule to now).
static __device__ __forceinline__ uint64_t x_take_poll_time(x_box* box) {
    uint64_t t = 0;
    if (mesh_lane() == 0) {
        unsigned long long cur = x_ld_relaxed_cta(&box->next_poll);
        for (;;) {
            const uint64_t now = mesh_globaltimer();
            t = cur < now ? now : cur;
            const unsigned long long prev = atomicCAS(&box->next_poll, cur, (unsigned long long)(t + SPACING_NS));
            if (prev == cur) break;
            cur = prev;
        }
    }
    return x_bcast(t);
}

// Warps 1..POLLERS: poll the armed message and hand it to the server when this warp claims it.
static __device__ void x_poller(x_box* box) {
    const uint32_t lane = mesh_lane();
    const mesh_chan in = box->in;  // a copy for addresses only: a poller never publishes anything
    const uint32_t words = in.msg_size / 4u;
    for (;;) {
        const uint64_t c = x_bcast(mesh_lane() == 0 ? x_ld_relaxed_cta(&box->claim) : 0u);
        if (c == X_CLOSED) return;
        if (c & 1u) continue;  // claimed: wait for the server to arm the next one
        const uint64_t p = c / 2u;
        const uint64_t at = x_take_poll_time(box);
        bool moved = false;
        while (mesh_globaltimer() < at)
            if ((moved = x_bcast(lane == 0 ? x_ld_relaxed_cta(&box->claim) : 0u) != c)) break;
        if (moved) continue;
        // One poll: every pair of the message's words at once (X_MAX_PAIRS 16-byte loads per lane,
        // predicated), then one vote on all of them.
        const volatile uint64_t* src = mesh_chan_slot(&in, p);
        const uint32_t t = mesh_tag(p);
        uint64_t a[X_MAX_PAIRS], b[X_MAX_PAIRS];
#pragma unroll
        for (uint32_t k = 0; k < X_MAX_PAIRS; k++)
            if (2u * (lane + 32u * k) < words) mesh_ld_volatile_v2(src + 2u * (lane + 32u * k), &a[k], &b[k]);
        bool whole = true;
#pragma unroll
        for (uint32_t k = 0; k < X_MAX_PAIRS; k++)
            if (2u * (lane + 32u * k) < words)
                whole &= (uint32_t)(a[k] >> 32) == t && (uint32_t)(b[k] >> 32) == t;
        if (!__all_sync(0xffffffffu, whole)) continue;  // empty or half-arrived: poll again
        // The claim: one CAS in shared memory; exactly one warp reads 2p here.
        bool won = false;
        if (lane == 0) {
            won = atomicCAS(&box->claim, (unsigned long long)c, (unsigned long long)(c + 1u)) == c;
            if (won) __threadfence_block();  // acquire: the server's reads of buf's last message come first
        }
        if (!__shfl_sync(0xffffffffu, won, 0)) continue;  // another warp has it (or the server closed)
        __syncwarp();
#pragma unroll
        for (uint32_t k = 0; k < X_MAX_PAIRS; k++) {
            const uint32_t idx = 2u * (lane + 32u * k);
            if (idx < words) {
                box->buf[idx] = (uint32_t)a[k];
                box->buf[idx + 1u] = (uint32_t)b[k];
            }
        }
        __syncwarp();                                      // every lane's buf stores before lane 0's release
        if (lane == 0) x_st_release_cta(&box->ready, p + 1u);
    }
}

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ x_box box;
    const uint32_t warp = threadIdx.x / 32u, lane = threadIdx.x % 32u;
    if (blockIdx.x != 0 || warp > POLLERS) return;
    if (threadIdx.x == 0) {
        box.claim = 1u;  // nothing armed yet (odd: "claimed"), so no poller polls before the server arms
        box.ready = 0u;
        box.next_poll = 0u;
        box.ok = 0u;
    }
    mesh_chan in = {}, out = {};
    if (warp == 0) {
        if (lane == 0) mesh_begin(ctx);
        in = mesh_chan_open(ctx, 0, false);
        out = mesh_chan_open(ctx, 1, true);
        const bool ok = blockDim.x >= 32u * (POLLERS + 1u) && in.msg_size != 0 && in.msg_size == out.msg_size &&
                        in.msg_size / 4u <= 32u * 2u * X_MAX_PAIRS;
        if (lane == 0) {
            box.in = in;
            box.ok = ok ? 1u : 0u;
            box.claim = ok ? 1u : X_CLOSED;
            if (!ok) mesh_exit(ctx, blockDim.x >= 32u * (POLLERS + 1u) ? 1 : 2);
        }
    }
    __syncthreads();  // the only block barrier: box is set up; from here warps meet only through box
    if (box.ok == 0u) return;
    if (warp != 0) {
        x_poller(&box);
        return;
    }
    // The server. p: the next message to receive (in.mine); armed: claim holds 2p.
    uint64_t p = in.mine;
    bool armed = false;
    while (!mesh_should_stop(ctx)) {
        if (!armed) {
            // Arm only with room to send: a message claimed is always sent, even across a stop.
            if (mesh_chan_room(&out) == 0) continue;
            __syncwarp();  // every lane is done reading buf (the last send)
            if (lane == 0) {
                __threadfence_block();                      // release: buf's reads before the arm
                atomicExch(&box.claim, (unsigned long long)(2u * p));
            }
            armed = true;
            if (MESH_PUBLISH_ON_DRAIN) mesh_chan_flush(&in);  // as the header's receive does when it waits
        }
        if (x_ld_acquire_cta(&box.ready) != p + 1u) continue;  // every lane acquires it itself
        mesh_warp_try_send(&out, box.buf);  // room was checked when p was armed; only this warp sends
        p++;
        in.mine = in.other = p;
        mesh_chan_progress(&in);
        armed = false;
    }
    // The stop: close the claim word. If a poller claimed p first, it is handing p over: send it.
    uint64_t was = 0;
    if (lane == 0) was = atomicCAS(&box.claim, (unsigned long long)(2u * p), X_CLOSED);
    was = x_bcast(was);
    if (armed && was == 2u * p + 1u) {
        while (x_ld_acquire_cta(&box.ready) != p + 1u) {}  // bounded: the claimer holds the whole message
        mesh_warp_try_send(&out, box.buf);
        p++;
        in.mine = in.other = p;
    }
    if (lane == 0) atomicExch(&box.claim, X_CLOSED);  // unarmed (claim odd) or after the hand-off
    __syncwarp();
    mesh_chan_close(&in);  // exact positions for the next launch
    mesh_chan_close(&out);
    if (lane == 0) mesh_end(ctx);
}
