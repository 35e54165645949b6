// ping_x_rarestop: ping with the stop check made only every 4096th iteration: a benchmark variant.
// `cargo xtask ptx` regenerates it.
#define PING_STOP_EVERY 4096u
#include "ping.cu"
