// service_x_serial_capped: service_x_serial.cu (one request at a time) with MESH_FANIN_PEEK_CAPPED 1,
// so that the take loads one slot a shard: the bench's variant beside service_x_serial.
#define MESH_FANIN_PEEK_CAPPED 1
#define SERVICE_ONE_AT_A_TIME
#include "service.cu"
