// service_x_poll1: service.cu whose peeks look at one slot after an empty poll (MESH_FANIN_POLL_MIN 1;
// the header's default is 4), as the one-at-a-time take does: does a lone request then come back as
// fast as service_x_serial's (3.5 µs against 5.0 on the H200, session 12)? For the service bench:
// `MESH_SERVICE_PROGRAMS="service service_x_poll1" mesh-gpu-bench service blink`.
#define MESH_FANIN_POLL_MIN 1u
#include "service.cu"
