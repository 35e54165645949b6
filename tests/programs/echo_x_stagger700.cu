// echo_x_stagger700: echo_x_stagger.cu with its two polls 700 ns apart (its default: 500), for the sweep
// `MESH_RT_AB_VARIANTS="echo_x_stagger:1024 echo_x_stagger300:1024 echo_x_stagger700:1024" mesh-gpu-bench rt-ab blink`.
#define STAGGER_NS 700u
#include "echo_x_stagger.cu"
