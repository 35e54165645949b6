// bulk_parts_sink_x_batch4: bulk_parts_sink.cu taking up to four whole messages a call on both paths
// (copy: mesh_block_try_recv_n; in place: mesh_block_peek_n / mesh_block_release_n, one barrier to give
// them back), the sink of `MESH_PARTS_VARIANT=_x_batch4 mesh-gpu-bench parts`.
#define PARTS_RECV_N 4u
#include "bulk_parts_sink.cu"
