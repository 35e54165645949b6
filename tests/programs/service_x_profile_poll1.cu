// service_x_profile_poll1: service.cu with SERVICE_PROFILE (user words 8-13: where the loop's time goes) and #define MESH_FANIN_POLL_MIN 1u: a
// benchmark variant for `MESH_SERVICE_PROGRAMS=... mesh-gpu-bench service`.
#define SERVICE_PROFILE
#define MESH_FANIN_POLL_MIN 1u
#include "service.cu"
