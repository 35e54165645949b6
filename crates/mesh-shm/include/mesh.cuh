// mesh.cuh: the device side of meshd's mailbox, for programs whose mesh_main meshd runs.
//
// A program is `extern "C" __global__ void mesh_main(mesh_ctx ctx)`: meshd launches it once and it loops
// until mesh_should_stop(ctx), then closes its channels and calls mesh_end; meshd relaunches it after
// every blink, and the closed positions make the new launch continue exactly where the last stopped.
// The mailbox lives in host memory mapped into the GPU's address space, so every access to it crosses
// PCIe: what costs is the number of dependent reads, not instructions. A GPU without host-native
// atomics shares no word between two writers, so each word of the mailbox has exactly one writer: the
// kernel writes its status line and its rings' own indices, meshd the control line.
//
// This header includes every part; a program may include only the parts it uses:
//   mesh/core.cuh      the life cycle (mesh_begin, mesh_heartbeat, mesh_end, mesh_exit, mesh_grid_end),
//                      the stop check (mesh_should_stop), user words (mesh_user_store / mesh_user_load),
//                      the bindings a program declares (MESH_BINDINGS), which meshd checks at load;
//   mesh/channel.cuh   LL channels, messages up to 64 KiB, one thread or one warp (mesh_chan_open,
//                      mesh_warp_try_recv, mesh_warp_try_send, ...); its opening shows the loop to
//                      write, and how a request / reply program survives a crash;
//   mesh/bulk.cuh      bulk channels, messages of 64 KiB to 16 MiB moved by whole blocks (mesh_bulk_open,
//                      mesh_block_peek, mesh_block_try_send, ...);
//   mesh/service.cuh   a service: one program, many host clients (mesh_fanin_*, mesh_group_*,
//                      mesh_reply, mesh_reply_many).
// Everything named mesh_detail_* (in mesh/detail/) is internal and may change between versions. The
// calls are listed with their contracts in docs/reference/device-api.md, generated from these parts.
//
// Build options (define before including; each non-default value is compiled by mesh-shm's tests):
// MESH_STOP_PERIOD_NS (mesh/core.cuh), MESH_PUBLISH_ON_DRAIN (mesh/channel.cuh), MESH_BULK_LOOKAHEAD
// (mesh/bulk.cuh), MESH_GROUP_PERIOD_NS and MESH_GROUP_MAX_ENTRIES (mesh/service.cuh). Options that were
// removed fail the build with what replaces them (mesh/detail/removed.cuh).
#pragma once
#include "mesh/core.cuh"
#include "mesh/channel.cuh"
#include "mesh/bulk.cuh"
#include "mesh/service.cuh"
