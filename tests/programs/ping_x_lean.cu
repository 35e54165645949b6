// ping_x_lean: ping with x_lean.cuh's one-pair receive and loop-free send: a
// benchmark variant, paired with echo_x_lean on device channels (`mesh-gpu-bench g2g-lean blink`).
// `cargo xtask ptx` regenerates it.
#include "x_lean.cuh"
#include "ping.cu"
