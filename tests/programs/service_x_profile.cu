// service_x_profile: service.cu with SERVICE_PROFILE (user words 8-13: where the loop's time goes): a
// benchmark variant for `MESH_SERVICE_PROGRAMS=... mesh-gpu-bench service`.
#define SERVICE_PROFILE
#include "service.cu"
