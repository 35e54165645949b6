// raw_ll_x_v2: raw_ll.cu (the one-warp LL probe) with 16-byte loads and stores, two tagged words each,
// as mesh.cuh's warp calls move them, instead of the probe's 8-byte ones. `mesh-gpu-bench rt-ab` runs it
// as `ll:raw_ll_x_v2` (one pair of slots) and `llring:raw_ll_x_v2` (32 pairs). Sessions 18 and 19 (an
// H100): 0.2-1.5 us slower than raw_ll at 8 B-1 KiB and 16-28 us at 4 KiB, while the header's loop with
// the same 16-byte loads is not (BENCHMARKS.md, session 19: a cost of this loop, not of the load width).
// Same contract as raw_ll.cu; messages of a multiple of 8 bytes.
#define RAW_LL_WIDE 1
#include "raw_ll.cu"
