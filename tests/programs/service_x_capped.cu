// service_x_capped: service.cu with MESH_FANIN_PEEK_CAPPED 1 (a sharded peek looks at no more of a
// shard's slots than the caller takes, one warp scan): a benchmark variant, put beside service.cu by
// `MESH_SERVICE_SHARDS=8 MESH_SERVICE_PROGRAMS="service service_x_capped ..." mesh-gpu-bench service`.
#define MESH_FANIN_PEEK_CAPPED 1
#include "service.cu"
