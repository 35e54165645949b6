// service_x_serial: service.cu with the header's one-request-at-a-time loop (mesh_fanin_take_deferred,
// mesh_reply, mesh_fanin_commit) instead of its batched one, put beside service.cu by `mesh-gpu-bench
// service [blink|mps]`. The README's program for 64 clients (`--shards 32`, loaded `--grid 4 --block
// 256`: a warp a shard; session 16, an H100: p99 1.9-2.1x the SPSC round trip at 64 clients, where the
// batched loop keeps 3.3-3.9x). `cargo xtask ptx` (or the GPU machine's `run`) compiles it.
#define SERVICE_ONE_AT_A_TIME
#include "service.cu"
