// service_x_warps_window: service_x_warps.cu with MESH_REPLY_TRUST_WINDOW 1 (no reply ring's tail is
// ever read: every client keeps at most its reply ring's capacity of requests unanswered, as the
// bench's clients do): a benchmark variant, the warps' loop without the reply credit's reads.
#define MESH_REPLY_TRUST_WINDOW 1
#include "service_x_warps.cu"
