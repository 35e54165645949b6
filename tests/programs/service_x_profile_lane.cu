// service_x_profile_lane: service.cu with SERVICE_PROFILE (user words 8-13: where the loop's time goes) and #define MESH_REPLY_SPREAD 0: a
// benchmark variant for `MESH_SERVICE_PROGRAMS=... mesh-gpu-bench service`.
#define SERVICE_PROFILE
#define MESH_REPLY_SPREAD 0
#include "service.cu"
