// ping: the GPU end of a GPU↔GPU round-trip benchmark, and the request/reply program of mesh.cuh's
// "Request / reply" section. One warp sends request `seq` on binding 0 and waits for its reply on
// binding 1 (an echo program, e.g. echo_header, at the other end), timing each round trip with
// %globaltimer and checking every word of the reply. Messages 8 B to 4 KiB.
//
// Requests carry their sequence number: word 0 is seq, word i > 0 is seq * 2654435761 + i, and seq is
// the request's ring position (out.mine as it is sent), so it is never reused, across relaunches too.
// A crash makes the channels at-least-once: the echo may take requests again and answer them twice,
// and ping may receive replies again. So a reply is matched to the request in flight by its word 0:
//   * the outstanding seq, every word right: the answer (timed);
//   * an earlier seq, every word right for it: a repeat, dropped and counted (user word 7), never an
//     error; the replies owed to requests of a launch that stopped in order are dropped uncounted;
//   * anything else (a word wrong, or a seq never sent): a wrong reply (user word 5).
// While the request ring is full ping keeps receiving (and dropping) replies, so that a full reply ring
// can never leave both ends waiting on each other, and a relaunch sends a fresh request rather than
// guessing which one is outstanding.
//
// User words: 0-1 round trips timed (lo, hi), 2-3 their total ns (lo, hi), 4 the fastest in ns, 6 the
// slowest in ns (these four: this launch, from PING_WARMUP round trips on, published every 1024);
// 5 wrong replies, 7 repeats dropped (both since the load, published when they change); 8-9 for the
// next launch: the oldest seq still unanswered when the program stopped in order, and 1 if there was
// one (replies come in order, so its reply and those after it, up to the next launch's first
// request, are owed, not repeats).
// `cargo xtask ptx` regenerates ping.ptx.
#include "mesh.cuh"

#define PING_WARMUP 1000u
#ifndef PING_STOP_EVERY
#define PING_STOP_EVERY 1u  // the header's loop: mesh_should_stop on every iteration
#endif
#define PING_BAD 5u
#define PING_REPEATS 7u
#define PING_OWED_SEQ 8u
#define PING_OWED 9u

// Word i of request (and reply) `seq`.
static __device__ __forceinline__ uint32_t ping_word(uint32_t seq, uint32_t i) {
    return i == 0 ? seq : seq * 2654435761u + i;
}

// The seq a reply carries when every word of it is right for that seq (the warp's vote), else
// `ok` is false. All 32 lanes call it together.
static __device__ __forceinline__ uint32_t ping_reply_seq(const uint32_t* buf, uint32_t words, bool* ok) {
    const uint32_t r = buf[0];
    bool good = true;
    for (uint32_t i = threadIdx.x; i < words; i += 32) good &= buf[i] == ping_word(r, i);
    *ok = __all_sync(0xffffffffu, good);
    return r;
}

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
    // What the last launch left: its counters, and the requests it had in flight if it stopped in order
    // (seqs owed_from up to this launch's first: their replies are owed, not repeats). Cleared at
    // once, so that after a crash of this launch every earlier reply counts as a repeat.
    uint32_t bad = mesh_user_load(ctx, PING_BAD), repeats = mesh_user_load(ctx, PING_REPEATS);
    bool owed = mesh_user_load(ctx, PING_OWED) == 1u;
    const uint32_t owed_from = mesh_user_load(ctx, PING_OWED_SEQ), first = (uint32_t)out.mine;
    if (leader) mesh_user_store(ctx, PING_OWED, 0);
    uint64_t done = 0, total = 0, fastest = ~0ull, slowest = 0;
    bool waiting = false;  // a request is in flight: `seq`
    uint64_t sent_at = 0;
    uint32_t seq = 0;
    for (uint32_t iter = 0; iter % PING_STOP_EVERY != 0 || !mesh_should_stop(ctx); iter++) {
        if (!waiting) {
            // A fresh request at the next ring position (after a relaunch too: never a guess at what
            // the last launch had outstanding).
            const uint32_t next = (uint32_t)out.mine;
            for (uint32_t i = threadIdx.x; i < words; i += 32) out_buf[i] = ping_word(next, i);
            __syncwarp();
            sent_at = mesh_globaltimer();
            if (mesh_warp_try_send(&out, out_buf)) {
                seq = next;
                waiting = true;
                continue;
            }
            // The request ring is full: the echo may be waiting for room in the reply ring. Drain it.
        }
        if (!mesh_warp_try_recv(&in, in_buf)) continue;
        const uint64_t took = mesh_globaltimer() - sent_at;
        bool ok;
        const uint32_t r = ping_reply_seq(in_buf, words, &ok);
        if (ok && waiting && r == seq) {
            waiting = false;
            owed = false;  // replies come in order: every owed one came before this
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
                    mesh_user_store(ctx, 6, (uint32_t)slowest);
                    mesh_user_store(ctx, 1, (uint32_t)(n >> 32));
                    mesh_user_store(ctx, 0, (uint32_t)n);
                }
            }
        } else if (ok && owed && r - owed_from < first - owed_from) {
            // the answer to a request of the last launch, which stopped in order: due, not a repeat
        } else if (ok && (int32_t)(r - (uint32_t)out.mine) < 0) {
            repeats++;  // an earlier request answered again, or an earlier reply received again
            if (leader) mesh_user_store(ctx, PING_REPEATS, repeats);
        } else {
            bad++;  // a word wrong, or the answer to a request never sent
            if (leader) mesh_user_store(ctx, PING_BAD, bad);
            if (r == seq) waiting = false;  // answered, wrongly: go on
        }
    }
    if (leader) {  // what the next launch may still receive an answer to
        mesh_user_store(ctx, PING_OWED_SEQ, owed ? owed_from : seq);
        mesh_user_store(ctx, PING_OWED, owed || waiting ? 1u : 0u);
    }
    mesh_chan_close(&out);
    mesh_chan_close(&in);
    if (leader) mesh_end(ctx);
}
