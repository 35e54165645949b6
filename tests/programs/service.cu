// service: the echo service of mesh/service.cuh in its batched form over many warps ("Many requests
// per round trip" and "Many warps": mesh_fanin_open over the grid, mesh_fanin_peek, mesh_reply_many,
// mesh_fanin_consume), plus a heartbeat and counters: every request taken from the fan-in channel
// (binding 0) goes back to its sender's reply ring in the channel group (binding 1) with payload word 1
// incremented, every other word as it came. Lines added to the header's loop are marked `// +`.
// Built with SERVICE_SERIAL defined (service_x_serial.cu), each serving warp runs the header's
// one-request-at-a-time loop instead (mesh_fanin_take_deferred, mesh_reply, mesh_fanin_commit): one
// request per round trip, which gives a lone client, and the tail of many clients, a shorter wait.
//
// meshd: `meshd service create NAME --clients N --msg-size B --shards 8` (reply size = request size, at
// most 4 KiB here), then `meshd load svc PROGRAM.ptx --bind NAME --bind NAME.replies --block 256`:
// warp w of the block's W serving warps (W = mesh_fanin_parts: the largest power of two at most the
// block's warps, SERVICE_WARPS and the shards) takes shards w, w + W, ... and answers their clients. With
// one shard, or a block of 32, one warp serves everything. With a grid of G blocks the G x 8 warps share
// the shards the same way (warp w of block b is part b x 8 + w): `--shards 32 --grid 4` gives each of 32
// warps one shard, `--shards 64 --grid 8` each of 64 (64 shards need two serving warps or more: with
// one, the open refuses them and the program exits with code 1). The last block to finish ends the
// launch and resets the grid's counters, which survive a blink (mesh/core.cuh). Exits with code 1 when
// a binding is not a fan-in / group or the sizes do not fit.
// User words, kept across upgrades and relaunches (each launch continues the last one's counts; summed
// over the warps of every block), written with the heartbeat (each warp adds its counts every 1024 of
// its iterations) and exactly at the stop, by the last block to finish:
//   0 replies sent, 1 skips taken (sends cut off by a death or a revocation), 2 replies dropped as GONE,
//   3 FULL answers (each retried), 4 departures acknowledged, 5 fan-in slots of a kind no producer
//   writes, 6 launches, 7 polls that found a request half-arrived.
#include "mesh.cuh"

#define SERVICE_WARPS 8u        // warps serving at most (a block of 256 threads)
#ifdef SERVICE_SERIAL
#define SERVICE_BUF_WORDS 1024u  // a warp's request: SERVICE_MAX_BYTES
#else
#define SERVICE_BUF_WORDS 1088u  // a warp's batch: at least the bodies one peek's round trip loads
#endif
#define SERVICE_MAX_BYTES 4096u  // request size served at most: one request a round trip
#define SERVICE_WORDS 8u

// The launch's counts over every block, in device memory (a block's shared memory is its own). Zero
// when a launch starts: the module's load zeroes them, and the last block of each launch zeroes them
// after its report, before the kernel ends.                                                      // +
__device__ uint32_t service_totals[SERVICE_WORDS];  // + this launch's counts, every warp's
__device__ uint32_t service_base[SERVICE_WORDS];    // + the last launches' (block 0 reads them)
__device__ uint32_t service_finished;               // + blocks done with this launch
__device__ uint32_t service_failed;                 // + 1: a warp found the bindings wrong

// Adds what this warp counted since its last call to the launch's totals (lane 0 of the warp).  // +
static __device__ void service_add(const uint32_t* n, uint32_t* added) {                       // +
    for (uint32_t i = 0; i < SERVICE_WORDS; i++) {
        if (n[i] != added[i]) atomicAdd(&service_totals[i], n[i] - added[i]);
        added[i] = n[i];
    }
}

// User words 0-7: the last launches' counts plus this one's totals (one thread).               // +
static __device__ void service_report(const mesh_ctx& ctx) {                                    // +
    for (uint32_t i = 0; i < SERVICE_WORDS; i++)
        *(volatile uint32_t*)(mesh_detail_slot_at(ctx, MESH_SLOT_USER) + 4u * i) =
            ((const volatile uint32_t*)service_base)[i] + ((const volatile uint32_t*)service_totals)[i];
}

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t reqs[SERVICE_WARPS][SERVICE_BUF_WORDS];                             // each warp's batch
#ifndef SERVICE_SERIAL
    __shared__ uint32_t from[SERVICE_WARPS][MESH_FANIN_BATCH_MAX];                           // their senders
#endif
    const uint32_t lane = threadIdx.x % 32u;
    const uint32_t warps = blockDim.x / 32u < SERVICE_WARPS ? blockDim.x / 32u : SERVICE_WARPS;
    const uint32_t w = threadIdx.x / 32u;             // this block's warp (the open numbers it over the grid)
    const bool lead = blockIdx.x == 0 && threadIdx.x == 0;  // begins, beats, reports while running
    uint64_t beat = 0;
    if (lead) {
        beat = mesh_begin(ctx);
        for (uint32_t i = 0; i < SERVICE_WORDS; i++) service_base[i] = mesh_user_load(ctx, i);  // +
        atomicAdd(&service_totals[6], 1u);                                       // + this launch
    }
    bool ok = true;
    if (w < warps) {                                  // the block's serving warps
        mesh_fanin in = mesh_fanin_open(ctx, 0, warps);  // binding 0: part b x warps + w of the grid's
        mesh_group out = mesh_group_open(ctx, 1, in);    // binding 1: its clients' reply rings
        ok = in.parts == 0 ||                         // spare: every shard is another warp's
             (in.ch.msg_size != 0 && out.msg_size == in.ch.msg_size && in.ch.msg_size <= SERVICE_MAX_BYTES);
#ifdef SERVICE_SERIAL
        uint32_t* req = reqs[w];
        bool held = false;                            // a request taken, its reply waiting for room
        uint32_t client = 0;
#else
        // Requests a peek may return: as many as the warp's buffer holds (32 up to 136 bytes, 4 at 1
        // KiB, 1 at 4 KiB: what one round trip loads anyway).
        const uint32_t fit = ok && in.ch.msg_size != 0 ? SERVICE_BUF_WORDS * 4u / in.ch.msg_size : 1u;
        const uint32_t most = fit < MESH_FANIN_BATCH_MAX ? fit : MESH_FANIN_BATCH_MAX;
#endif
        uint32_t n[SERVICE_WORDS] = {0, 0, 0, 0, 0, 0, 0, 0};                    // + this warp's counts
        uint32_t added[SERVICE_WORDS] = {0, 0, 0, 0, 0, 0, 0, 0};                // + and what it added
        uint32_t iter = 0;                                                       // +
        while (ok && in.parts != 0 && !mesh_should_stop(ctx)) {
            if ((++iter & 1023u) == 0) {                                         // + heartbeat, counters
                n[5] = in.corrupt;                                               // +
                n[7] = in.ch.partial;                                            // +
                if (lane == 0) service_add(n, added);                            // +
                if (lead) {
                    mesh_heartbeat(ctx, ++beat);      // meshd's readiness
                    service_report(ctx);                                         // +
                }
            }
            uint32_t gone;
            while (mesh_group_departed(&out, &gone)) n[4]++;  // this warp's clients; drop their state here
#ifdef SERVICE_SERIAL
            if (!held) {
                const int k = mesh_fanin_take_deferred(&in, req, &client);
                if (k == MESH_TAKE_NONE) continue;    // nothing whole yet
                if (k == MESH_TAKE_SKIP) {            // a send cut off (death, revocation): nothing to answer
                    n[1]++;                                                      // +
                    mesh_fanin_commit(&in);
                    continue;
                }
                if (lane == 0) req[1] += 1;           // f(client, request)
                __syncwarp();
            }
            const int r = mesh_reply(&out, client, req);  // SENT; GONE: its client left, dropped;
            held = r == MESH_REPLY_FULL;              // FULL: a slow client, tried again next time
            if (r == MESH_REPLY_SENT) n[0]++;                                    // +
            else if (r == MESH_REPLY_GONE) n[2]++;                               // +
            else n[3]++;                                                         // +
            if (!held) mesh_fanin_commit(&in);        // answered (or dropped): the request is done
#else
            uint32_t skipped, dropped;
            const uint32_t k = mesh_fanin_peek(&in, reqs[w], from[w], &skipped, most);
            if (k == 0) continue;                     // nothing whole at the position yet
            const uint32_t words = in.ch.msg_size / 4u;
            if (lane < k && !((skipped >> lane) & 1u)) reqs[w][lane * words + 1] += 1;  // f(from[j], request j): lane j
            __syncwarp();
            const uint32_t done = mesh_reply_many(&out, from[w], reqs[w], k, skipped, &dropped);
            mesh_fanin_consume(&in, done);            // requests [0, done) answered or dropped
            const uint32_t kept = done >= 32u ? 0xffffffffu : (1u << done) - 1u;  // +
            n[0] += done - (uint32_t)__popc((skipped | dropped) & kept);           // +
            n[1] += (uint32_t)__popc(skipped & kept);                              // +
            n[2] += (uint32_t)__popc(dropped & kept);                              // +
            if (done < k) n[3]++;                                                  // +
#endif
        }
        mesh_fanin_close(&in);                        // exact positions for the next launch
        mesh_group_close(&out);
        n[5] = in.corrupt;                                                       // +
        n[7] = in.ch.partial;                                                    // +
        if (lane == 0) service_add(n, added);                                    // +
        if (!ok && lane == 0) atomicExch(&service_failed, 1u);
    }
    __syncthreads();                                  // this block's warps closed
    if (threadIdx.x == 0) {
        // The last block to finish ends the launch: every warp of the grid closed, so its positions
        // (and counts) are exact.
        __threadfence();
        if (atomicAdd(&service_finished, 1u) == gridDim.x - 1u) {
            __threadfence();
            service_report(ctx);                                                 // + the exact counts
            const bool failed = *(volatile uint32_t*)&service_failed != 0u;
            for (uint32_t i = 0; i < SERVICE_WORDS; i++) service_totals[i] = 0;  // + zero for the next launch
            service_failed = 0;
            service_finished = 0;
            if (!failed) mesh_end(ctx);
            else mesh_exit(ctx, 1);                   // not a fan-in and a group of one size that fits
        }
    }
}
