// echo_x_phasealways: echo_header.cu with mesh.cuh's phase lock on and waiting in every trial
// (MESH_PHASE_CHOOSE 0: no trials without the wait, no choice), beside the default (trials, the cheaper
// kept) and echo_x_nolock (never waits) in `mesh-gpu-bench rt-ab`'s turns.
#define MESH_PHASE_LOCK 1
#define MESH_PHASE_CHOOSE 0
#include "echo_header.cu"
