// echo_x_phase200: echo_x_phase.cu adapting in coarser steps (200 ns up, 20 down; its default 100 / 10),
// for `MESH_RT_AB_VARIANTS="echo_x_phase echo_x_phase200" mesh-gpu-bench rt-ab blink`.
#define PHASE_UP 200u
#define PHASE_DOWN 20u
#include "echo_x_phase.cu"
