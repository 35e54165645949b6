// mesh/core.cuh: a program's life cycle (begin, heartbeat, end, exit), its stop check and its user words.
//
// A program is `extern "C" __global__ void mesh_main(mesh_ctx ctx)`, launched once by meshd and looping
// until mesh_should_stop(ctx). meshd passes the mailbox's address in this context, the program's slot and
// its bindings (`ctx.bindings[b]`, in the order of `meshd load --bind`); the other parts open those
// bindings as channels (mesh/channel.cuh, mesh/bulk.cuh, mesh/service.cuh).
//
// Slot states: MESH_STATE_IDLE (armed by meshd, not yet started), MESH_STATE_RUNNING (mesh_begin),
// MESH_STATE_STOPPED (mesh_end after a stop request), MESH_STATE_EXITED (mesh_exit with a code). A
// program may report up to MESH_SLOT_USER_WORDS words of its own through mesh_user_store. The mailbox
// has layout version MESH_LAYOUT_VERSION, checked by meshd when it opens the file; each program slot is
// MESH_SLOT_SIZE bytes (meshd passes its offset in ctx.slot_offset). A binding's `placement` is
// MESH_PLACEMENT_HOST or MESH_PLACEMENT_DEVICE, its `slots` the address of its ring's message slots in
// this context, and MESH_RING_SLOTS the size of the ring's header (indices and claims, always in the
// mailbox). The layout's constants and the mesh_ctx / mesh_binding structs are generated from mesh-shm's
// layout.rs (mesh/detail/layout.cuh).
//
// The heartbeat: meshd counts a running program whose heartbeat has not moved for
// `--health-max-heartbeat-age` (default 5 s) as not ready (`/readyz` answers 503, `meshd_ready` 0), so
// every loop beats (a plain store every few thousand iterations), or the program is loaded with
// `meshd load ... --no-readiness`. A program that waits without looping beats from its own progress.
//
// Program state across launches: `__device__` globals live in the program's module. They outlive the
// relaunches of a blink made for another program's change; they are lost at the program's own upgrade
// and unload, at a recovery (the context is made again and every module reloaded), at a restart of
// meshd, and in MPS mode whenever the program's worker changes. What must outlive those belongs in the
// mailbox (a channel, user words) or is rebuilt from it.
//
// A program of several blocks (`meshd load --grid G`): block 0's thread 0 begins and beats, and the
// block that finishes last ends the program, once every block has closed its channels: thread 0 of
// every block calls mesh_grid_end, which counts the blocks in device memory and resets the count for
// the next launch (a `__device__` global survives the relaunch of a blink, so a count left at G would
// never end a later launch). A program that reports its own totals at the end keeps such a counter
// itself, and resets it the same way (tests/programs/service.cu):
//
//     __device__ uint32_t finished;                         // blocks done with this launch
//     ...
//     __syncthreads();                                      // this block's warps closed their channels
//     if (threadIdx.x == 0) {
//         __threadfence();                                  // this block's closes before the count
//         if (atomicAdd(&finished, 1u) == gridDim.x - 1u) { // the last block of this launch
//             __threadfence();
//             finished = 0;                                 // reset: the next launch counts from 0
//             mesh_end(ctx);
//         }
//     }
#pragma once
#include "detail/ptx.cuh"

// What each binding expects. A program declares its bindings' protocols once, at file scope:
//
//     MESH_BINDINGS(MESH_LL, MESH_BULK);                    // binding 0: an LL channel, 1: a bulk one
//
// and meshd refuses a load (or an upgrade's load) that binds a channel of another protocol, or fewer
// channels than declared, naming the binding ("binding 1 (`big`): the program expects a bulk channel,
// `big` is an LL channel"), before anything changes. Without the declaration a program loads with any
// bindings, and an open of the wrong protocol gives an end whose msg_size is 0. The codes are
// MESH_LL, MESH_BULK, MESH_FANIN and MESH_GROUP (a service: MESH_BINDINGS(MESH_FANIN, MESH_GROUP)).
// The macro defines `extern "C" __device__ const uint32_t mesh_bindings[]` (a magic word, then the
// codes), which meshd reads from the linked image's symbol table; define it in one file of a program.
#define MESH_LL MESH_PROTOCOL_LL
#define MESH_BULK MESH_PROTOCOL_BULK
#define MESH_FANIN 3u  // MESH_PROTOCOL_FANIN
#define MESH_GROUP 4u  // MESH_PROTOCOL_GROUP
#define MESH_DETAIL_BINDINGS_MAGIC 0x4d420001u
#define MESH_BINDINGS(...) extern "C" __device__ const uint32_t mesh_bindings[] = {MESH_DETAIL_BINDINGS_MAGIC, __VA_ARGS__}

// How often, in ns of %globaltimer, mesh_should_stop(ctx) reads meshd's stop word; a stop is seen within
// about two periods. Define it before including mesh.cuh to change it. The read is rare because a load
// of host memory delays the loads issued after it by a whole PCIe round trip, even when nothing waits
// for its value (docs/explanation/channels.md).
#ifndef MESH_STOP_PERIOD_NS
#define MESH_STOP_PERIOD_NS 100000u
#endif

// True once meshd has asked the program to stop. Any thread; call it on every iteration of the loop,
// with mesh_main's own `ctx` (it keeps its state in ctx.stop_due and ctx.stop_seen, so each thread's copy
// of ctx checks on its own). It issues a relaxed load of the stop word at most once every
// MESH_STOP_PERIOD_NS and looks at what that load brought a period later, so the loop never waits for
// PCIe; a stop is seen within about two periods. The threads of a warp that call it together agree.
static __device__ __forceinline__ bool mesh_should_stop(mesh_ctx& c);

// The same question asked now, for a context that cannot keep the state above (a `const mesh_ctx&`):
// one PCIe read, waited for. Any thread. A loop should use mesh_should_stop(ctx).
static __device__ __forceinline__ bool mesh_should_stop(const mesh_ctx& c);

// Marks the program running (MESH_STATE_RUNNING). One thread (thread 0 of block 0), once per launch,
// before anything else talks to meshd. Returns the heartbeat the last launch left, so that a program's
// heartbeat keeps rising across the relaunches of a blink: continue counting from it.
static __device__ __forceinline__ uint64_t mesh_begin(const mesh_ctx& c);

// Publishes the heartbeat `beat`, a value the program counts upwards from what mesh_begin returned. One
// thread (the one that called mesh_begin); a plain store. meshd's readiness wants it to move at least
// every `--health-max-heartbeat-age` (default 5 s) while the program runs.
static __device__ __forceinline__ void mesh_heartbeat(const mesh_ctx& c, uint64_t beat);

// Marks the program stopped at meshd's request (MESH_STATE_STOPPED). One thread, after every channel the
// program opened is closed (mesh_chan_close, mesh_bulk_close, mesh_fanin_close, mesh_group_close); the
// kernel returns afterwards.
static __device__ __forceinline__ void mesh_end(const mesh_ctx& c);

// Ends a program of any grid once every block is done: thread 0 of each block calls it once per launch,
// after the block's channels are closed (its warps synchronized: __syncthreads, or __syncwarp for a
// block of one serving warp), with 0 or an exit code. The last block to call it calls mesh_end, or
// mesh_exit with the first nonzero code a block passed, and resets the grid's count for the next
// launch (the counter described above, kept by the header). With one block it ends at once.
static __device__ void mesh_grid_end(const mesh_ctx& c, int32_t code);

// Ends the program with `code`, which meshd reports (MESH_STATE_EXITED): for a program that cannot run,
// e.g. a binding missing or of the wrong size. One thread; the kernel returns afterwards, and meshd does
// not relaunch it.
static __device__ __forceinline__ void mesh_exit(const mesh_ctx& c, int32_t code);

// Stores `v` in word `i` (below MESH_SLOT_USER_WORDS; others are ignored) of the program's user line,
// with a release store: the program's own report (counters, progress), read by the host
// (mesh-shm's `Mailbox::slot(i).user_words()`). Any thread; one writer per word. The words survive
// upgrades and relaunches; a new load starts them at 0.
static __device__ __forceinline__ void mesh_user_store(const mesh_ctx& c, uint32_t i, uint32_t v);

// Word `i` of the program's user line (0 for `i` at or above MESH_SLOT_USER_WORDS), e.g. a counter the
// last launch left there. Any thread; one PCIe read.
static __device__ __forceinline__ uint32_t mesh_user_load(const mesh_ctx& c, uint32_t i);

// Nanoseconds of the GPU's global timer (%globaltimer), for timing inside a program. Any thread.
static __device__ __forceinline__ uint64_t mesh_globaltimer(void);

// The SM this thread runs on (%smid). Any thread.
static __device__ __forceinline__ uint32_t mesh_smid(void);

// This thread's rank in its block, whatever the block's shape (0: the thread that talks to meshd in the
// block calls of mesh/bulk.cuh).
static __device__ __forceinline__ uint32_t mesh_block_rank(void);

// The number of threads in this block, whatever its shape.
static __device__ __forceinline__ uint32_t mesh_block_threads(void);

// mesh_should_stop for a whole block: every thread of the block calls it together (it has two
// __syncthreads), thread 0 asks with its ctx, and every thread gets the same answer. Cheap to call on
// every iteration: no PCIe read but one a MESH_STOP_PERIOD_NS.
static __device__ __forceinline__ bool mesh_block_should_stop(mesh_ctx& c);

#include "detail/core.cuh"
