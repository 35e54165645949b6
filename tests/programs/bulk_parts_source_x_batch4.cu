// bulk_parts_source_x_batch4: bulk_parts_source.cu sending four messages a call on both paths (copy:
// mesh_block_try_send_n; in place: mesh_block_reserve_n / mesh_block_publish_n: one block barrier and
// one fence per part for the four), run by tests/tests/parts.rs and the parts bench, with
// bulk_parts_sink_x_batch4.cu taking four a call.
#define PARTS_SEND_N 4u
#define PARTS_FILL_N 4u
#include "bulk_parts_source.cu"
