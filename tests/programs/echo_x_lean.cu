// echo_x_lean: echo_header with x_lean.cuh's one-pair receive and loop-free send: a
// benchmark variant, paired with ping_x_lean on device channels (`mesh-gpu-bench g2g-lean blink`).
// `cargo xtask ptx` regenerates it.
#include "x_lean.cuh"
#include "echo_header.cu"
