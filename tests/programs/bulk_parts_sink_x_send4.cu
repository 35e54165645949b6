// bulk_parts_sink_x_send4: bulk_parts_sink.cu as it is, the sink of `MESH_PARTS_VARIANT=_x_send4
// mesh-gpu-bench parts` (which loads bulk_parts_sink{VARIANT} beside bulk_parts_source{VARIANT}).
#include "bulk_parts_sink.cu"
