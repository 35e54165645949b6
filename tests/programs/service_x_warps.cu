// service_x_warps: service.cu's batched loop served by every warp of the block at once, for a fan-in
// channel of shards (`meshd service create --shards P`): warp w of W takes shards w, w + W, ... and
// answers their clients. A client's shard is its slot % P and W divides P, so its requests and its
// reply ring belong to warp slot % W alone: every reply ring keeps one writer, and each warp
// acknowledges the departures of its own clients only (a departure acknowledged by another warp could
// hand the ring to a new client while its warp still answers the old one). One warp alternates a peek
// (a PCIe round trip) with its replies and tops out near 3.3 M requests/s with 8 shards (BENCHMARKS.md,
// session 9); W warps overlap W of each.
//
// Experimental, for `MESH_SERVICE_SHARDS=8 MESH_SERVICE_BLOCK=256 MESH_SERVICE_PROGRAMS="service
// service_x_warps" mesh-gpu-bench service` (PENDING.md row 3). NOT YET RUN ON A GPU: g++ syntax check
// only. Exits with code 1 when the bindings are not a fan-in and a group, the request size is above
// WARPS_MAX_BYTES, or the warps are not a power of two dividing the shards. User words as service.cu's
// 0-7 (summed over the warps; each launch continues the last one's counts): each warp adds what it
// counted to the block's totals every 1024 of its iterations, thread 0 writes them with the heartbeat,
// and exactly at the stop, so the service GPU test can run it (`MESH_SERVICE_PROGRAM=service_x_warps
// MESH_SERVICE_TEST_BLOCK=256`).
#include "mesh.cuh"

#define WARPS_MAX 8u
#define WARPS_MAX_BYTES 128u  // request size served at most: 32 requests a warp in shared memory
#define SERVICE_WORDS 8u

// Keeps shards w, w + W, ... of `in`, which mesh_fanin_open gave lane s shard s: lane i takes shard
// w + i x W's words, and the end serves P / W shards (one: the one-ring calls over shard w).
static __device__ void warps_keep_shards(mesh_fanin* in, uint32_t w, uint32_t warps) {
    const uint32_t full = 0xffffffffu;
    const uint32_t src = (w + mesh_lane() * warps) & 31u;
    in->s_ring = (char*)__shfl_sync(full, (unsigned long long)in->s_ring, src);
    in->s_slots = (char*)__shfl_sync(full, (unsigned long long)in->s_slots, src);
    in->s_mine = __shfl_sync(full, (unsigned long long)in->s_mine, src);
    in->s_done = __shfl_sync(full, (unsigned long long)in->s_done, src);
    in->s_published = __shfl_sync(full, (unsigned long long)in->s_published, src);
    in->s_hint = __shfl_sync(full, in->s_hint, src);
    in->shards /= warps;
    in->start = 0;
    if (in->shards == 1u) {
        in->ch.ring = (char*)__shfl_sync(full, (unsigned long long)in->s_ring, 0);
        in->ch.slots = (char*)__shfl_sync(full, (unsigned long long)in->s_slots, 0);
        in->ch.mine = in->ch.other = __shfl_sync(full, (unsigned long long)in->s_done, 0);
        in->ch.published = __shfl_sync(full, (unsigned long long)in->s_published, 0);
    }
}

// Adds what this warp counted since its last call to the block's totals (lane 0 of the warp).
static __device__ void warps_add(uint32_t* totals, const uint32_t* n, uint32_t* added) {
    for (uint32_t i = 0; i < SERVICE_WORDS; i++) {
        if (n[i] != added[i]) atomicAdd(&totals[i], n[i] - added[i]);
        added[i] = n[i];
    }
}

// User words 0-7: the last launches' counts plus this one's totals (thread 0).
static __device__ void warps_report(const mesh_ctx& ctx, const uint32_t* base, const uint32_t* totals) {
    for (uint32_t i = 0; i < SERVICE_WORDS; i++)
        *(volatile uint32_t*)(mesh_slot_at(ctx, MESH_SLOT_USER) + 4u * i) = base[i] + ((const volatile uint32_t*)totals)[i];
}

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t reqs[WARPS_MAX][MESH_FANIN_BATCH_MAX * WARPS_MAX_BYTES / 4u];
    __shared__ uint32_t from[WARPS_MAX][MESH_FANIN_BATCH_MAX];
    __shared__ mesh_group shared_group;
    __shared__ uint32_t totals[SERVICE_WORDS];  // what the warps have added of their counts
    __shared__ uint32_t base[SERVICE_WORDS];    // the last launches' counts
    __shared__ uint32_t unfit;
    const uint32_t warps = blockDim.x / 32u, w = threadIdx.x / 32u, lane = mesh_lane();
    if (threadIdx.x >= warps * 32u) return;  // a partial warp serves nothing
    uint64_t beat = 0;
    if (threadIdx.x == 0) beat = mesh_begin(ctx);
    mesh_fanin in = mesh_fanin_open(ctx, 0);  // every warp: lane s shard s (then its own, below)
    if (w == 0) {
        mesh_group g = mesh_group_open(ctx, 1);  // the entries' states: one array, each entry one warp's
        if (lane == 0) {
            shared_group = g;
            unfit = g.msg_size != in.ch.msg_size || in.ch.msg_size == 0 || in.ch.msg_size > WARPS_MAX_BYTES ||
                    warps > WARPS_MAX || (warps & (warps - 1u)) != 0u || in.shards % warps != 0u;
            for (uint32_t i = 0; i < SERVICE_WORDS; i++) {
                base[i] = mesh_user_load(ctx, i);
                totals[i] = 0;
            }
            totals[6] = 1;  // this launch
        }
    }
    __syncthreads();
    if (unfit) {
        if (threadIdx.x == 0) mesh_exit(ctx, 1);
        return;
    }
    mesh_group out = shared_group;
    if (warps > 1u) warps_keep_shards(&in, w, warps);
    uint32_t n[SERVICE_WORDS] = {0, 0, 0, 0, 0, 0, 0, 0}, added[SERVICE_WORDS] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t iter = 0;
    while (!mesh_should_stop(ctx)) {
        if ((++iter & 1023u) == 0) {  // this warp's counts into the totals; thread 0: heartbeat and words
            n[5] = in.corrupt;
            n[7] = in.ch.partial;
            if (lane == 0) warps_add(totals, n, added);
            if (threadIdx.x == 0) {
                mesh_heartbeat(ctx, ++beat);
                warps_report(ctx, base, totals);
            }
        }
        uint32_t gone;
        while (mesh_group_departed_part(&out, &gone, w, warps)) n[4]++;  // its own clients only
        uint32_t skipped, dropped;
        const uint32_t k = mesh_fanin_peek(&in, reqs[w], from[w], &skipped, MESH_FANIN_BATCH_MAX);
        if (k == 0) continue;
        const uint32_t words = in.ch.msg_size / 4u;
        if (lane < k && !((skipped >> lane) & 1u)) reqs[w][lane * words + 1] += 1;  // f(from[j], request j)
        __syncwarp();
        const uint32_t done = mesh_reply_many(&out, from[w], reqs[w], k, skipped, &dropped);
        mesh_fanin_consume(&in, done);
        const uint32_t kept = done >= 32u ? 0xffffffffu : (1u << done) - 1u;
        n[0] += done - (uint32_t)__popc((skipped | dropped) & kept);
        n[1] += (uint32_t)__popc(skipped & kept);
        n[2] += (uint32_t)__popc(dropped & kept);
        if (done < k) n[3]++;
    }
    mesh_fanin_close(&in);  // this warp's shards' exact positions
    n[5] = in.corrupt;
    n[7] = in.ch.partial;
    if (lane == 0) warps_add(totals, n, added);
    __syncthreads();  // every warp stopped answering: warp 0 publishes every reply ring's head
    if (w == 0) {
        out = shared_group;
        mesh_group_close(&out);
    }
    if (threadIdx.x == 0) {
        warps_report(ctx, base, totals);  // the exact counts
        mesh_end(ctx);
    }
}
