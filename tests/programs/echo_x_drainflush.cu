// echo_x_drainflush: echo_header whose receiver publishes its position whenever it finds the ring
// empty (a store to the mailbox per message, layout 2's behaviour): a benchmark variant.
// `cargo xtask ptx` regenerates it.
#define MESH_PUBLISH_ON_DRAIN 1
#include "echo_header.cu"
