//! lr_shm.h: the heartbeat page shared by a resident kernel, its host process and observers (lr_probe.cu).
//!
//! One 4 KiB /dev/shm file per heartbeat. The kernel writes its iteration count, its %globaltimer and the
//! largest gap between two of its iterations; an observer maps the same file without any CUDA call (so it
//! creates no context that would time-slice with the kernel) and reads them, or writes the control word.
//! Host-native atomics are absent on the GPU machine: every shared field is one aligned 64-bit word that
//! exactly one side writes, except `ctl`, whose two 32-bit halves the host writes separately.
#pragma once
#include <stdint.h>

// Gaps longer than this are logged with their end time in `big` (a ring), for the full log.
#define LR_BIG_NS 100000ull
#define LR_BIG_RING 64
#define LR_PAGE 4096
// What the exporter writes into every 32-bit word of the VMM allocation (question 3).
#define LR_PATTERN32 0xA5A5A5A5u
#define LR_PATTERN64 0xA5A5A5A5A5A5A5A5ull
// What the third process writes into the allocation's last word, for the importer to find.
#define LR_MAGIC 0x5EC0DE0F1A5Cull

struct LrHb {
    // host -> GPU: low half 1 = stop; high half = reset generation (the kernel then restarts `max_gap`).
    volatile uint64_t ctl;
    volatile uint64_t count;        // GPU: iterations so far
    volatile uint64_t gt;           // GPU: %globaltimer of the last iteration
    volatile uint64_t max_gap;      // GPU: largest gap (ns) between two iterations since the last reset
    volatile uint64_t reset_seen;   // GPU: the last reset generation it applied
    volatile uint64_t start_gt;     // GPU: %globaltimer of its first iteration
    volatile uint64_t nbig;         // GPU: gaps over LR_BIG_NS so far (the ring holds the last 64)
    volatile uint64_t kernel_done;  // GPU: 1 left on the stop word, 2 left on its own time limit
    volatile uint64_t bad;          // GPU: data mismatches in the VMM buffer (question 3)
    volatile uint64_t host_state;   // host: 1 kernel launched, 2 kernel ended cleanly, 3 it ended in an error
    volatile int64_t host_err;      // host: the CUDA error code the kernel's stream ended with
    volatile uint64_t host_pid;     // host: the pid of the process that launched the kernel
    volatile uint64_t mps;          // host: CU_DEVICE_ATTRIBUTE_MPS_ENABLED of its context, plus 1 (0 unknown)
    volatile uint64_t pad[3];
    volatile uint64_t big[LR_BIG_RING][2];  // GPU: (globaltimer at the gap's end, gap ns)
};
