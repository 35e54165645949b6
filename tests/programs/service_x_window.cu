// service_x_window: service.cu with MESH_REPLY_TRUST_WINDOW 1 (the program never reads a reply ring's
// tail: every client keeps at most its reply ring's capacity of requests unanswered, as the bench's
// clients do): a benchmark variant that measures what the reply credit's reads cost (issue 26,
// docs/design/many-clients.md, "the reply ring's credit"), put beside service.cu by
// `MESH_SERVICE_PROGRAMS="service service_x_window ..." mesh-gpu-bench service`.
#define MESH_REPLY_TRUST_WINDOW 1
#include "service.cu"
