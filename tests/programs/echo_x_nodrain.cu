// echo_x_nodrain: echo_header whose receiver publishes its position only every half ring and on close
// (no store to the mailbox per message): a benchmark variant. `cargo xtask ptx` regenerates it.
#define MESH_PUBLISH_ON_DRAIN 0
#include "echo_header.cu"
