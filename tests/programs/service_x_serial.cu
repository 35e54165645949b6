// service_x_serial: service.cu with mesh/service.cuh's one-request-at-a-time loop on every serving warp
// (mesh_fanin_take_deferred, mesh_reply, mesh_fanin_commit) instead of the batched one. The service
// bench (`mesh-gpu-bench service`) and tests/tests/service.rs run it beside service.cu; both are built
// from the one source so that their counters, reports and stop can never drift apart.
#define SERVICE_SERIAL 1
#include "service.cu"
