// echo_x_nolock: echo_header.cu without mesh.cuh's phase lock (MESH_PHASE_LOCK 0: a poll on every
// call, the header's loop before session 17), beside it in `mesh-gpu-bench rt-ab`'s turns.
#define MESH_PHASE_LOCK 0
#include "echo_header.cu"
