// kv_server: a service program for many clients (64 and more), loaded over a grid. Every request taken
// from the service's fan-in channel (binding 0) is answered on its sender's reply ring (binding 1, the
// service's channel group) with its first 32-bit word plus one, every other word as it came.
//
//   meshd service create kv --clients 64 --msg-size 64 --shards 32
//   meshd load kv-server kv_server.ptx --grid 4 --block 256 --bind kv --bind kv.replies
//
// Each warp of the grid serves its own part of the shards. mesh_fanin_open numbers the parts over the
// whole grid (block b's warp w is part b x WARPS + w), never per block: numbered per block, the same
// part would be served by one warp in every block, several consumers of one shard.
#include "mesh.cuh"

MESH_BINDINGS(MESH_FANIN, MESH_GROUP);  // binding 0: the requests, 1: the reply rings

#define WARPS 8u           // warps a block serves with at most (a block of 256 threads)
#define MAX_BYTES 4096u    // the largest request served

// Blocks that have finished this launch, and whether a warp found its bindings wrong. __device__
// memory outlives a launch (a blink relaunches the kernel without reloading the module), so the last
// block sets both back to 0 before it ends.
__device__ uint32_t blocks_done;
__device__ uint32_t bindings_wrong;

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t reqs[WARPS][MAX_BYTES / 4];
    const uint32_t warps = blockDim.x / 32u < WARPS ? blockDim.x / 32u : WARPS;
    const uint32_t w = threadIdx.x / 32u;
    const bool lead = blockIdx.x == 0 && threadIdx.x == 0;
    uint64_t beat = 0;
    if (lead) beat = mesh_begin(ctx);
    if (w < warps) {                                                       // the block's serving warps
        // doc:begin parts
        mesh_fanin in = mesh_fanin_open(ctx, 0, warps);  // part b x warps + w, numbered over the grid
        mesh_group out = mesh_group_open(ctx, 1, in);    // the reply rings of its shards' clients
        // doc:end parts
        // doc:begin loop
        bool ok = in.parts == 0 ||                                 // spare: every shard is another warp's
                  (in.ch.msg_size != 0 && out.msg_size == in.ch.msg_size && in.ch.msg_size <= MAX_BYTES);
        uint32_t* req = reqs[w];
        bool held = false;                                         // a reply waiting for room
        uint32_t client = 0, iter = 0;
        while (ok && in.parts != 0 && !mesh_should_stop(ctx)) {
            if (lead && (++iter & 1023u) == 0) mesh_heartbeat(ctx, ++beat);
            uint32_t gone;
            while (mesh_group_departed(&out, &gone)) {}            // a client left: forget its state here
            if (!held) {
                const int k = mesh_fanin_take_deferred(&in, req, &client);
                if (k == MESH_TAKE_NONE) continue;                 // nothing whole yet
                if (k == MESH_TAKE_SKIP) {                         // a send cut off by its client's death
                    mesh_fanin_commit(&in);
                    continue;
                }
                if (threadIdx.x % 32u == 0) req[0] += 1;           // the work: f(client, request)
                __syncwarp();
            }
            const int r = mesh_reply(&out, client, req);           // SENT, GONE (client left) or FULL
            held = r == MESH_REPLY_FULL;                           // a slow client: try again next time
            if (!held) mesh_fanin_commit(&in);                     // answered or dropped: done
        }
        mesh_fanin_close(&in);                                     // exact positions for the next launch
        mesh_group_close(&out);
        // doc:end loop
        if (!ok && threadIdx.x % 32u == 0) atomicExch(&bindings_wrong, 1u);  // not a fan-in and group of one size
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // doc:begin last-block
        __threadfence();
        if (atomicAdd(&blocks_done, 1u) == gridDim.x - 1u) {      // the last block out: every warp closed
            __threadfence();                                       // then every block's writes are seen
            const bool wrong = *(volatile uint32_t*)&bindings_wrong != 0u;
            blocks_done = 0;                                       // both for the next launch
            bindings_wrong = 0;
            if (wrong) mesh_exit(ctx, 1);
            else mesh_end(ctx);
        }
        // doc:end last-block
    }
}
