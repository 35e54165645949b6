// bulk_parts_source_x_send2: bulk_parts_source.cu whose copy path sends two messages a call
// (mesh_block_try_send_n: one block barrier and one fence per part for both), for issue 24 item 3:
// `MESH_PARTS_VARIANT=_x_send2 mesh-gpu-bench parts blink` (the sink is bulk_parts_sink_x_send2.cu,
// the plain sink). Not yet run on a GPU (PENDING.md).
#define PARTS_SEND_N 2u
#include "bulk_parts_source.cu"
