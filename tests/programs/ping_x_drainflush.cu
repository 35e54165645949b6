// ping_x_drainflush: ping whose receiver publishes its position whenever it finds the ring empty: a
// benchmark variant. `cargo xtask ptx` regenerates it.
#define MESH_PUBLISH_ON_DRAIN 1
#include "ping.cu"
