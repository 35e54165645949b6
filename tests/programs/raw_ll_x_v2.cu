// raw_ll_x_v2: raw_ll.cu (the one-warp LL probe) with 16-byte loads and stores, two tagged words each,
// as mesh.cuh's warp calls move them, instead of the probe's 8-byte ones. `mesh-gpu-bench rt-ab` runs it
// as `ll:raw_ll_x_v2` (one pair of slots) and `llring:raw_ll_x_v2` (32 pairs). Session 18 (an H100):
// 0.2-1.5 us slower than raw_ll at 8 B-1 KiB, 27 us at 4 KiB (docs/gpu-runs/PENDING.md). Same contract
// as raw_ll.cu; messages of a multiple of 8 bytes.
#define RAW_LL_WIDE 1
#include "raw_ll.cu"
