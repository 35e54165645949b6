// echo_x_phase50: echo_x_phase.cu adapting in finer steps (50 ns up, 5 down; its default 100 / 10), for
// `MESH_RT_AB_VARIANTS="echo_x_phase echo_x_phase50" mesh-gpu-bench rt-ab blink`.
#define PHASE_UP 50u
#define PHASE_DOWN 5u
#include "echo_x_phase.cu"
