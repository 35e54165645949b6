// service_block.cpp: one block's copy of a service program (PROGRAM) for service_emu.cpp's grid, built
// once a block with -Dmesh_main=mesh_main_bK: each copy has its own __shared__ arrays (function-scope
// statics in the emulation), as each block of a GPU grid has its own shared memory, while the
// program's __device__ globals are one for every block (service_emu links the copies with
// --allow-multiple-definition, so every reference reaches the first copy's). Built by
// tests/warp_emulation.rs.
#include "warp_emu.h"
#define MESH_GROUP_PERIOD_NS 0u  // as service_emu.cpp: look at `changes` on every call
#include PROGRAM
