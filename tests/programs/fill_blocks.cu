// fill_blocks: half of the in-place path's baseline beside a parts channel (mesh-gpu-bench parts, with
// check_blocks): the grid's blocks write message after message into binding 0's payload memory, slot
// after slot of the bulk channel (the same memory a ring of that capacity moves messages through),
// with bulk_parts.cuh's parts_fill, every block a contiguous 1/gridDim.x share of each slot, until
// stopped; block i counts its shares in user word i (low 24 bits). The work of a parts source on the
// in-place path (fill every word), without the ring.
#include "bulk_parts.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t b = blockIdx.x;
    uint64_t beat = 0;
    if (b == 0 && mesh_block_rank() == 0) beat = mesh_begin(ctx);
    const mesh_bulk dst = mesh_bulk_open(ctx, 0, false);  // only to find the payload: nothing is sent
    const uint32_t blocks = gridDim.x;
    if (b >= PARTS_MAX_BLOCKS || dst.msg_size == 0 || dst.msg_size % (16u * blocks) != 0) {
        if (mesh_block_rank() == 0) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t share = dst.msg_size / blocks, words = share / 4u, first = b * words;
    uint64_t fills = 0;
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (b == 0 && mesh_block_rank() == 0) mesh_heartbeat(ctx, ++beat);
            parts_report(ctx, b, fills, 0);
        }
        parts_fill((uint32_t*)(mesh_detail_bulk_slot(&dst, fills) + (uint64_t)b * share), fills, first, words);
        __syncthreads();
        fills++;
    }
    parts_report(ctx, b, fills, 0);
    if (b == 0 && mesh_block_rank() == 0) mesh_end(ctx);
}
