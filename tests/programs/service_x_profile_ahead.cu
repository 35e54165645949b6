// service_x_profile_ahead: service.cu with SERVICE_PROFILE (user words 8-13: where the loop's time goes) and
// MESH_FANIN_PREFETCH 1 (each peek loads the next batch's slots before it returns): a benchmark variant for
// `MESH_SERVICE_PROGRAMS=... mesh-gpu-bench service`.
#define SERVICE_PROFILE
#define MESH_FANIN_PREFETCH 1
#include "service.cu"
