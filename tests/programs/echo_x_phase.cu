// echo_x_phase: echo_header.cu with mesh.cuh's phase lock on (MESH_PHASE_LOCK 1: trials with and
// without the wait, the cheaper kept), beside echo_x_nolock (never waits) and echo_x_phasealways
// (always waits) in `mesh-gpu-bench rt-ab`'s turns.
#define MESH_PHASE_LOCK 1
#include "echo_header.cu"
