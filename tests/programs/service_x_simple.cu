// service_x_simple: mesh/service.cuh's one-request-at-a-time example as it is written there, one warp
// a block (`if (threadIdx.x >= 32) return;`) opening the service with mesh_fanin_open(ctx, 0) and
// mesh_group_open(ctx, 1, in), plus counters. Loaded with `--grid G` it must split the shards among
// the G warps (warp of block b: part b of mesh_fanin_parts(ctx, 0, G)), never serve a shard once a
// block: tests/warp_emulation.rs runs it over grids and checks every request is answered once, in
// order. Lines added to the header's loop are marked `// +`.
//
// meshd: `meshd service create NAME --clients N --msg-size B --shards P` (reply size = request size, at
// most 4 KiB), then `meshd load svc PROGRAM.ptx --bind NAME --bind NAME.replies --grid G`. The last
// block to finish reports and ends the launch (its own counter, as service_x_serial.cu, so that the
// report precedes the end). User words as service_x_serial.cu's: 0 replies sent, 1 skips taken, 2
// replies dropped as GONE, 3 FULL answers, 4 departures acknowledged, 6 launches.
#include "mesh.cuh"

MESH_BINDINGS(MESH_FANIN, MESH_GROUP);  // a load bound otherwise is refused

#define SERVICE_WORDS 8u

__device__ uint32_t service_totals[SERVICE_WORDS];  // + this launch's counts, every warp's
__device__ uint32_t service_base[SERVICE_WORDS];    // + the last launches' (block 0 reads them)
__device__ uint32_t service_finished;               // + blocks done with this launch
__device__ uint32_t service_failed;                 // + 1: a warp found the bindings wrong

// User words 0-7: the last launches' counts plus this one's totals (one thread).               // +
static __device__ void service_report(const mesh_ctx& ctx) {                                    // +
    for (uint32_t i = 0; i < SERVICE_WORDS; i++)
        *(volatile uint32_t*)(mesh_detail_slot_at(ctx, MESH_SLOT_USER) + 4u * i) =
            ((const volatile uint32_t*)service_base)[i] + ((const volatile uint32_t*)service_totals)[i];
}

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t req[1024];                    // one message, up to 4 KiB
    if (threadIdx.x >= 32) return;                    // one warp a block serves
    const bool lead = blockIdx.x == 0 && threadIdx.x == 0;  // begins and beats for the grid
    uint64_t beat = 0;
    if (lead) {
        beat = mesh_begin(ctx);
        for (uint32_t i = 0; i < SERVICE_WORDS; i++) service_base[i] = mesh_user_load(ctx, i);  // +
        atomicAdd(&service_totals[6], 1u);                                       // + this launch
    }
    mesh_fanin in = mesh_fanin_open(ctx, 0);          // binding 0: this warp's part of the requests
    mesh_group out = mesh_group_open(ctx, 1, in);     // binding 1: the reply rings of its clients
    const bool ok = in.parts == 0 ||                  // spare: another warp serves every shard
                    (in.ch.msg_size != 0 && out.msg_size == in.ch.msg_size && in.ch.msg_size <= sizeof(req));
    uint32_t n[SERVICE_WORDS] = {0, 0, 0, 0, 0, 0, 0, 0};                        // + this warp's counts
    bool held = false;                                // a request taken, its reply waiting for room
    uint32_t client = 0;
    for (uint32_t i = 0; ok && in.parts != 0 && !mesh_should_stop(ctx); i++) {
        if (lead && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);  // meshd's readiness
        uint32_t gone;
        while (mesh_group_departed(&out, &gone)) n[4]++;  // acknowledged as returned; drop per-client state here
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
    }
    mesh_fanin_close(&in);                            // exact positions for the next launch
    mesh_group_close(&out);
    __syncwarp();
    if (threadIdx.x == 0) {
        for (uint32_t i = 0; i < SERVICE_WORDS; i++)                             // +
            if (n[i] != 0) atomicAdd(&service_totals[i], n[i]);                  // +
        if (!ok) atomicExch(&service_failed, 1u);                                // +
        // The last block to finish reports the exact counts and ends the launch (mesh_grid_end
        // without a report).                                                    // +
        __threadfence();
        if (atomicAdd(&service_finished, 1u) == gridDim.x - 1u) {
            __threadfence();
            service_report(ctx);                                                 // +
            const bool failed = *(volatile uint32_t*)&service_failed != 0u;
            for (uint32_t i = 0; i < SERVICE_WORDS; i++) service_totals[i] = 0;  // +
            service_failed = 0;
            service_finished = 0;
            if (!failed) mesh_end(ctx);
            else mesh_exit(ctx, 1);                   // not a fan-in and a group of one size that fits
        }
    }
}
