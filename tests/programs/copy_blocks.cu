// copy_blocks: the bench's baseline beside a parts channel (mesh-gpu-bench parts): the grid's blocks
// copy binding 0's payload memory (a bulk channel's slot 0, msg_size bytes) into binding 1's, every
// block a contiguous 1/gridDim.x share with mesh_detail_block_copy, over and over until stopped; block i
// counts its copies in user word i (low 24 bits, as bulk_parts.cuh). The same blocks, the same bytes
// and the same copy loop as a parts channel's send, without the ring.
#include "bulk_parts.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t b = blockIdx.x;
    uint64_t beat = 0;
    if (b == 0 && mesh_block_rank() == 0) beat = mesh_begin(ctx);
    // Opened whole (one block's share = every part) only to find the payloads: nothing is sent.
    const mesh_bulk src = mesh_bulk_open(ctx, 0, false);
    const mesh_bulk dst = mesh_bulk_open(ctx, 1, false);
    const uint32_t blocks = gridDim.x;
    if (b >= PARTS_MAX_BLOCKS || src.msg_size == 0 || dst.msg_size != src.msg_size || src.msg_size % (16u * blocks) != 0) {
        if (mesh_block_rank() == 0) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t share = src.msg_size / blocks;
    const uint4* from = (const uint4*)(src.payload + (uint64_t)b * share);
    uint4* to = (uint4*)(dst.payload + (uint64_t)b * share);
    uint64_t copies = 0;
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (b == 0 && mesh_block_rank() == 0) mesh_heartbeat(ctx, ++beat);
            parts_report(ctx, b, copies, 0);
        }
        mesh_detail_block_copy(to, from, share / 16u);
        __syncthreads();
        copies++;
    }
    parts_report(ctx, b, copies, 0);
    if (b == 0 && mesh_block_rank() == 0) mesh_end(ctx);
}
