// echo_x_ld8: echo_header.cu's loop with mesh_warp_try_recv's short path loading one 8-byte word per
// lane and instruction (MESH_LEAN_LOAD_BYTES 8) instead of 16-byte pairs, beside echo_header in
// `mesh-gpu-bench rt-ab` (MESH_RT_AB_VARIANTS="echo_x_ld8"). Session 18 saw the raw LL probe 0.2-1.5 us
// slower at 8 B-1 KiB with 16-byte loads than with 8-byte ones on an H100: does the header's loop gain
// the same?
#define MESH_LEAN_LOAD_BYTES 8
#include "echo_header.cu"
