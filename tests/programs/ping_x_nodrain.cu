// ping_x_nodrain: ping whose receiver publishes its position only every half ring and on close: a
// benchmark variant. `cargo xtask ptx` regenerates it.
#define MESH_PUBLISH_ON_DRAIN 0
#include "ping.cu"
