// bulk_parts_source_x_send4: bulk_parts_source.cu whose copy path sends four messages a call
// (mesh_block_try_send_n), beside _x_send2: `MESH_PARTS_VARIANT=_x_send4 mesh-gpu-bench parts blink`
// (the sink is bulk_parts_sink_x_send4.cu, the plain sink).
#define PARTS_SEND_N 4u
#include "bulk_parts_source.cu"
