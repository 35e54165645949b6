// bulk_parts_source_x_pubwarp: bulk_parts_source.cu with MESH_BULK_PUBLISHER_WARP 1 (mesh_block_try_send
// leaves the first warp out of the copy, and bulk_parts.cuh's in-place fill leaves it out of the fill, so
// that its publish fence overlaps the next message's copy or fill):
// the parts bench's variant, `MESH_PARTS_VARIANT=_x_pubwarp mesh-gpu-bench parts` (PENDING.md). NOT YET
// RUN ON A GPU, nor through nvcc (g++ syntax check only).
#define MESH_BULK_PUBLISHER_WARP 1
#include "bulk_parts_source.cu"
