// bulk_parts_source_x_send2: bulk_parts_source.cu whose copy path sends two messages a call
// (mesh_block_try_send_n: one block barrier and one fence per part for both), for issue 24 item 3:
// `MESH_PARTS_VARIANT=_x_send2 mesh-gpu-bench parts blink` (the sink is bulk_parts_sink_x_send2.cu,
// the plain sink). On the H200 (session 13): 1 MiB copying over 16 blocks 0.70 -> 0.78 of the plain
// copy, over 32 blocks 0.59 -> 0.66; 16 MiB unchanged (BENCHMARKS.md).
#define PARTS_SEND_N 2u
#include "bulk_parts_source.cu"
