// check_blocks: the other half of the in-place path's baseline (with fill_blocks; mesh-gpu-bench
// parts): the grid's blocks fill their share of every slot of binding 0's bulk channel once, then
// check every word of slot after slot against bulk_parts.cuh's pattern until stopped (the work of a
// parts sink on the in-place path, without the ring); block i counts its checked shares in user word
// i (low 24 bits) and failed checks in its high 8 bits, as the sink does.
//
// The loads go through L2 (ld.global.cg): a sink reads what blocks on other SMs wrote, which its own
// L1 cannot hold, and a baseline served from L1 (a block re-reading the share it wrote itself) ran
// far faster per block than any transfer between SMs can.
#include "bulk_parts.cuh"

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    const uint32_t b = blockIdx.x;
    uint64_t beat = 0;
    if (b == 0 && mesh_block_rank() == 0) beat = mesh_begin(ctx);
    const mesh_bulk src = mesh_bulk_open(ctx, 0, false);  // only to find the payload: nothing is received
    const uint32_t blocks = gridDim.x;
    if (b >= PARTS_MAX_BLOCKS || src.msg_size == 0 || src.msg_size % (16u * blocks) != 0) {
        if (mesh_block_rank() == 0) mesh_exit(ctx, 1);
        return;
    }
    const uint32_t share = src.msg_size / blocks, words = share / 4u, first = b * words;
    for (uint64_t s = 0; s <= src.mask; s++) parts_fill((uint32_t*)(mesh_detail_bulk_slot(&src, s) + (uint64_t)b * share), 0, first, words);
    __syncthreads();
    uint64_t checks = 0;
    uint32_t bad = 0;
    for (uint32_t i = 0;; i++) {
        if ((i & 15u) == 0) {
            if (mesh_block_should_stop(ctx)) break;
            if (b == 0 && mesh_block_rank() == 0) mesh_heartbeat(ctx, ++beat);
            parts_report(ctx, b, checks, bad);
        }
        if (!parts_check_l2((const uint32_t*)(mesh_detail_bulk_slot(&src, checks) + (uint64_t)b * share), 0, first, words)) bad++;
        checks++;
    }
    parts_report(ctx, b, checks, bad);
    if (b == 0 && mesh_block_rank() == 0) mesh_end(ctx);
}
