// service_x_serial: service.cu with the header's one-request-at-a-time loop (mesh_fanin_take_deferred,
// mesh_reply, mesh_fanin_commit) instead of its batched one: a benchmark variant, put beside service.cu
// by `mesh-gpu-bench service [blink|mps]`. `cargo xtask ptx` (or the GPU machine's `run`) compiles it.
#define SERVICE_ONE_AT_A_TIME
#include "service.cu"
