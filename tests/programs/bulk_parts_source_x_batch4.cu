// bulk_parts_source_x_batch4: bulk_parts_source.cu sending four messages a call on both paths (copy:
// mesh_block_try_send_n; in place: mesh_block_reserve_n / mesh_block_publish_n: one block barrier and
// one fence per part for the four), for issue 24 item 3: `MESH_PARTS_VARIANT=_x_batch4 mesh-gpu-bench
// parts blink`, with bulk_parts_sink_x_batch4.cu taking four a call. Session 13's _x_send2 (two a
// call, copy-path source only): 1 MiB over 32 blocks 0.59 -> 0.66 of the plain copy (BENCHMARKS.md).
#define PARTS_SEND_N 4u
#define PARTS_FILL_N 4u
#include "bulk_parts_source.cu"
