// service: the echo service of mesh.cuh's "Many clients: a service" section, in its batched form
// ("Many requests per round trip": mesh_fanin_peek, mesh_reply_many, mesh_fanin_consume), plus a
// heartbeat and counters: every request taken from the fan-in channel (binding 0) goes back to its
// sender's reply ring in the channel group (binding 1) with payload word 1 incremented, every other
// word as it came. Lines added to the header's loop are marked `// +`. Built with -DSERVICE_ONE_AT_A_TIME
// it runs the header's first loop instead (one request per round trip: mesh_fanin_take_deferred,
// mesh_reply, mesh_fanin_commit), which the bench puts beside the batched one.
//
// meshd: `meshd service create NAME --clients N --msg-size B` (reply size = request size, at most
// 1 KiB here), then `meshd load svc service.ptx --bind NAME --bind NAME.replies` (a block of 32, the
// default). Exits with code 1 when a binding is not a fan-in / group or the sizes do not fit.
// User words, kept across upgrades and relaunches (each launch continues the last one's counts), written
// with the heartbeat every 1024 iterations and exactly at the stop:
//   0 replies sent, 1 skips taken (sends cut off by a death or a revocation), 2 replies dropped as GONE,
//   3 FULL answers (each retried), 4 departures acknowledged, 5 fan-in slots of a kind no producer
//   writes, 6 launches, 7 polls that found a request half-arrived.
#include "mesh.cuh"

#ifdef SERVICE_PROFILE
// Where the loop's time goes (service_x_profile*.cu, for the bench): 8 peeks that found requests,
// 9 requests they found, 10 their ns / 1024, 11 ns / 1024 in mesh_reply_many and mesh_fanin_consume,
// 12 empty (or half-arrived) peeks, 13 their ns / 1024.
#define SERVICE_WORDS 14u
#else
#define SERVICE_WORDS 8u
#endif
#define SERVICE_MAX_BYTES 1024u  // request size this program serves at most (32 of them in shared memory)

static __device__ __forceinline__ void service_report(const mesh_ctx& ctx, const uint32_t* base, const uint32_t* n) {
    for (uint32_t i = 0; i < SERVICE_WORDS; i++) *(volatile uint32_t*)(mesh_slot_at(ctx, MESH_SLOT_USER) + 4u * i) = base[i] + n[i];
}

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t reqs[MESH_FANIN_BATCH_MAX * SERVICE_MAX_BYTES / 4u];  // up to 32 requests
    __shared__ uint32_t from[MESH_FANIN_BATCH_MAX];                          // their senders
    if (threadIdx.x >= 32) return;                    // one warp serves the service
    uint64_t beat = 0;                                                           // +
    if (threadIdx.x == 0) beat = mesh_begin(ctx);
    mesh_fanin in = mesh_fanin_open(ctx, 0);          // binding 0: the requests
    mesh_group out = mesh_group_open(ctx, 1);         // binding 1: the reply rings
    if (in.ch.msg_size == 0 || out.msg_size != in.ch.msg_size || in.ch.msg_size > SERVICE_MAX_BYTES) {  // +
        if (threadIdx.x == 0) mesh_exit(ctx, 1);                                 // +
        return;                                                                  // +
    }                                                                            // +
    uint32_t base[SERVICE_WORDS], n[SERVICE_WORDS];                              // + counters: the last
    for (uint32_t i = 0; i < SERVICE_WORDS; i++) {                               // + launches' and ours
        base[i] = mesh_user_load(ctx, i);                                        // +
        n[i] = 0;                                                                // +
    }                                                                            // +
    n[6] = 1;                                                                    // + this launch
    uint32_t iter = 0;                                                           // +
#ifdef SERVICE_PROFILE
    uint64_t prof_empty = 0, prof_peek = 0, prof_reply = 0;
#endif
#ifdef SERVICE_ONE_AT_A_TIME
    uint32_t* req = reqs;
    bool held = false;                                // a request taken, its reply waiting for room
    uint32_t client = 0;
#endif
    while (!mesh_should_stop(ctx)) {
        if ((++iter & 1023u) == 0 && threadIdx.x == 0) {                         // + heartbeat, counters
            mesh_heartbeat(ctx, ++beat);                                         // +
            n[5] = in.corrupt;                                                   // +
            n[7] = in.ch.partial;                                                // +
            service_report(ctx, base, n);                                        // +
        }                                                                        // +
        uint32_t gone;
        while (mesh_group_departed(&out, &gone)) n[4]++;   // acknowledged as returned; drop per-client state here
#ifndef SERVICE_ONE_AT_A_TIME
        uint32_t skipped, dropped;
#ifdef SERVICE_PROFILE
        const uint64_t t0 = mesh_globaltimer();
#endif
        const uint32_t k = mesh_fanin_peek(&in, reqs, from, &skipped, MESH_FANIN_BATCH_MAX);
#ifdef SERVICE_PROFILE
        const uint64_t t1 = mesh_globaltimer();
        if (k == 0) {
            n[12]++;
            prof_empty += t1 - t0;
            n[13] = (uint32_t)(prof_empty >> 10);
        }
#endif
        if (k == 0) continue;                         // nothing whole at the position yet
        const uint32_t w = in.ch.msg_size / 4u, j = threadIdx.x;
        if (j < k && !((skipped >> j) & 1u)) reqs[j * w + 1] += 1;  // f(from[j], request j): lane j
        __syncwarp();
        const uint32_t done = mesh_reply_many(&out, from, reqs, k, skipped, &dropped);
        mesh_fanin_consume(&in, done);                // requests [0, done) answered or dropped
        const uint32_t kept = done >= 32u ? 0xffffffffu : (1u << done) - 1u;    // +
        n[0] += done - (uint32_t)__popc((skipped | dropped) & kept);             // +
        n[1] += (uint32_t)__popc(skipped & kept);                                // +
        n[2] += (uint32_t)__popc(dropped & kept);                                // +
        if (done < k) n[3]++;                                                    // +
#ifdef SERVICE_PROFILE
        const uint64_t t2 = mesh_globaltimer();
        n[8]++;
        n[9] += k;
        prof_peek += t1 - t0;
        prof_reply += t2 - t1;
        n[10] = (uint32_t)(prof_peek >> 10);
        n[11] = (uint32_t)(prof_reply >> 10);
#endif
#else
        if (!held) {
            const int k = mesh_fanin_take_deferred(&in, req, &client);
            if (k == MESH_TAKE_NONE) continue;        // nothing whole yet
            if (k == MESH_TAKE_SKIP) {                // a send cut off (death, revocation): nothing to answer
                n[1]++;                                                          // +
                mesh_fanin_commit(&in);
                continue;
            }
            if (threadIdx.x == 0) req[1] += 1;        // f(client, request)
            __syncwarp();
        }
        const int r = mesh_reply(&out, client, req);  // SENT; GONE: its client left, dropped;
        held = r == MESH_REPLY_FULL;                  // FULL: a slow client, tried again next time
        if (r == MESH_REPLY_SENT) n[0]++;                                        // +
        else if (r == MESH_REPLY_GONE) n[2]++;                                   // +
        else n[3]++;                                                             // +
        if (!held) mesh_fanin_commit(&in);            // answered (or dropped): the request is done
#endif
    }
    mesh_fanin_close(&in);                            // exact positions for the next launch
    mesh_group_close(&out);
    n[5] = in.corrupt;                                                           // +
    n[7] = in.ch.partial;                                                        // +
    if (threadIdx.x == 0) service_report(ctx, base, n);                          // + the exact counts
    if (threadIdx.x == 0) mesh_end(ctx);
}
