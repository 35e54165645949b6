// native_kernel.cuh: the kernel of the native worker examples (native_echo.cu here, and the Rust example's
// native_kernel.ptx, built from native_kernel.cu). One warp sends `count` sequence-numbered 16-byte messages
// on binding 0 and receives them back on binding 1 (through a resident echo program such as
// tests/programs/echo_warp), checking every one, with mesh.cuh's warp channel calls.
// Message k: words k_lo, k_hi, ~k_lo, ~k_hi. A native worker's mesh_ctx has no program slot: only the
// channel calls of mesh.cuh are used.
#pragma once
#include "mesh.cuh"

typedef struct {
    unsigned long long received;   // messages received back
    unsigned long long errors;     // messages whose content was not the next in sequence
    unsigned long long first_bad;  // the first such message's index (~0: none)
    unsigned long long sent;       // messages sent
    unsigned long long timed_out;  // 1: gave up after timeout_ns
} native_result;

#define NATIVE_MSG_WORDS 4u
#define NATIVE_BATCH 256u

extern "C" __global__ void native_exchange(mesh_ctx ctx, unsigned long long count, unsigned long long timeout_ns,
                                           native_result* out) {
    __shared__ uint32_t tx_buf[NATIVE_BATCH * NATIVE_MSG_WORDS];
    __shared__ uint32_t rx_buf[NATIVE_BATCH * NATIVE_MSG_WORDS];
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    const uint32_t lane = threadIdx.x;
    mesh_chan tx = mesh_chan_open(ctx, 0, true);
    mesh_chan rx = mesh_chan_open(ctx, 1, false);
    if (tx.msg_size != 4u * NATIVE_MSG_WORDS || rx.msg_size != 4u * NATIVE_MSG_WORDS) {
        if (lane == 0) out->errors = ~0ull;
        return;
    }
    unsigned long long sent = 0, got = 0, errors = 0, first_bad = ~0ull;
    const uint64_t start = mesh_globaltimer();
    bool late = false;
    while (got < count) {
        if (sent < count) {
            const unsigned long long left = count - sent;
            const uint32_t n = left < NATIVE_BATCH ? (uint32_t)left : NATIVE_BATCH;
            for (uint32_t m = lane; m < n; m += 32u) {
                const unsigned long long k = sent + m;
                tx_buf[m * 4u] = (uint32_t)k;
                tx_buf[m * 4u + 1u] = (uint32_t)(k >> 32);
                tx_buf[m * 4u + 2u] = ~(uint32_t)k;
                tx_buf[m * 4u + 3u] = ~(uint32_t)(k >> 32);
            }
            __syncwarp();
            sent += mesh_warp_try_send_batch(&tx, tx_buf, n);
            __syncwarp();
        }
        const uint32_t r = mesh_warp_try_recv_batch(&rx, rx_buf, NATIVE_BATCH);
        for (uint32_t m = lane; m < r; m += 32u) {
            const unsigned long long k = got + m;
            const uint32_t* w = rx_buf + m * 4u;
            if (w[0] != (uint32_t)k || w[1] != (uint32_t)(k >> 32) || w[2] != ~(uint32_t)k || w[3] != ~(uint32_t)(k >> 32)) {
                errors++;
                if (k < first_bad) first_bad = k;
            }
        }
        __syncwarp();
        got += r;
        late = __shfl_sync(0xffffffffu, mesh_globaltimer() - start > timeout_ns, 0);
        if (late) break;
    }
    mesh_chan_close(&tx);
    mesh_chan_close(&rx);
    for (int o = 16; o > 0; o >>= 1) {
        errors += __shfl_xor_sync(0xffffffffu, errors, o);
        const unsigned long long b = __shfl_xor_sync(0xffffffffu, first_bad, o);
        first_bad = b < first_bad ? b : first_bad;
    }
    if (lane == 0) {
        out->received = got;
        out->errors = errors;
        out->first_bad = first_bad;
        out->sent = sent;
        out->timed_out = late ? 1ull : 0ull;
    }
}
