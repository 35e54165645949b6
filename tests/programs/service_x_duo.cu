// service_x_duo: service.cu's batched loop split over two warps, so that the PCIe read of the next
// batch (a peek, 2.3-4 µs on the H200) overlaps the replies to this one (1.5-3 µs) instead of taking
// turns with them in one warp (BENCHMARKS.md, "A service": one warp tops out near 2 M requests/s). A
// benchmark variant for `MESH_SERVICE_PROGRAMS="service service_x_duo" mesh-gpu-bench service`; load it
// with `--block 64` (the bench does). Measured on the H200 in session 8 (calls 1 and 3, blink, beside
// service.cu in the same run): it does not pay. 64 streaming clients 1.65 / 1.63 M requests/s against
// service.cu's 1.70 / 1.60, 64-client p99 36.5 / 23.6 us against 30.9 / 24.1, and a lone client's
// median 6.7 us against 5.0: with the peeks overlapped, what arrives per peek, not the warp's time,
// bounds the rate (BENCHMARKS.md, session 8). Kept as the measured alternative.
//
// Warp 1, the reader, peeks batches with its own copy of the fan-in end (it never consumes and never
// publishes the ring's tail) into two shared buffers in turn, each stamped with the restart generation
// it was peeked in, and moves its position past each batch as if it were answered. Warp 0, the
// replier, takes the buffers in the same turn, answers them (mesh_reply_many), consumes what it
// answered (mesh_fanin_consume on the one end that publishes the tail), acknowledges departures, and
// keeps the heartbeat and the counters. When a batch is answered only in part (a client's reply ring
// was full), the replier restarts the reader at its own consumed position (a new generation, and the
// buffer to fill next); buffers of an older generation are dropped unread, so requests are answered
// exactly once and in order. A stop: the replier sees it, tells the reader, publishes its exact
// position and ends; the next launch starts from there.
//
// User words as service.cu's (0 replies sent, 1 skips, 2 dropped as GONE, 3 partial batches, 4
// departures, 6 launches), plus 8 restarts of the reader and 9 stale buffers dropped. Words 5 and 7
// (slots of a kind no producer writes, half-arrived polls) are the reader's and not kept here.
#include "mesh.cuh"

#define DUO_WORDS 10u
#define DUO_MAX_BYTES 512u  // the request size this program serves at most (2 x 32 of them in shared memory)

static __device__ __forceinline__ void duo_report(const mesh_ctx& ctx, const uint32_t* base, const uint32_t* n) {
    for (uint32_t i = 0; i < DUO_WORDS; i++) *(volatile uint32_t*)(mesh_slot_at(ctx, MESH_SLOT_USER) + 4u * i) = base[i] + n[i];
}

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t reqs[2][MESH_FANIN_BATCH_MAX * DUO_MAX_BYTES / 4u];
    __shared__ uint32_t from[2][MESH_FANIN_BATCH_MAX];
    __shared__ uint32_t skipped_of[2];
    __shared__ uint32_t gen_of[2];
    __shared__ volatile uint32_t full[2];      // 0: free for the reader; n: a batch of n for the replier
    __shared__ volatile uint32_t restart_gen;  // bumped by the replier after a partial batch
    __shared__ volatile uint64_t restart_at;   // the reader's position from that generation on
    __shared__ volatile uint32_t restart_k;    // and the buffer it fills next
    __shared__ volatile uint32_t stop_all;     // the replier saw the stop
    const bool replier = threadIdx.x < 32;
    const bool lane0 = (threadIdx.x & 31u) == 0;
    if (threadIdx.x == 0) {
        full[0] = full[1] = 0;
        restart_gen = 0;
        restart_at = 0;
        restart_k = 0;
        stop_all = 0;
    }
    uint64_t beat = 0;
    if (threadIdx.x == 0) beat = mesh_begin(ctx);
    mesh_fanin in = mesh_fanin_open(ctx, 0);  // each warp its own copy; only the replier's consumes
    // One ring only: the reader moves in.ch.mine itself, which a sharded fan-in does not use.
    const bool unfit = in.ch.msg_size == 0 || in.shards != 1u || in.ch.msg_size > DUO_MAX_BYTES || blockDim.x < 64;
    __syncthreads();  // the flags are set before either warp looks at them (every thread of the block)
    if (threadIdx.x >= 64) return;
    if (unfit) {
        if (threadIdx.x == 0) mesh_exit(ctx, 1);
        return;
    }

    if (!replier) {
        // ---- the reader ----
        uint32_t gen = 0, k = 0;
        while (true) {
            uint32_t g = 0, stop = 0;
            if (lane0) {
                stop = stop_all;
                g = restart_gen;
            }
            if (__shfl_sync(0xffffffffu, stop, 0)) break;
            g = __shfl_sync(0xffffffffu, g, 0);
            if (g != gen) {  // the replier answered a batch in part: start again where it stands
                uint64_t at = 0;
                uint32_t kk = 0;
                if (lane0) {
                    __threadfence_block();  // restart_at and restart_k were written before restart_gen
                    at = restart_at;
                    kk = restart_k;
                }
                in.ch.mine = __shfl_sync(0xffffffffu, at, 0);
                k = __shfl_sync(0xffffffffu, kk, 0);
                gen = g;
            }
            uint32_t busy = 0;
            if (lane0) {
                busy = full[k];
                __threadfence_block();  // the replier's last use of the buffer before we write it
            }
            if (__shfl_sync(0xffffffffu, busy, 0)) continue;  // the replier has not taken it yet
            __syncwarp();
            uint32_t skipped;
            const uint32_t n = mesh_fanin_peek(&in, reqs[k], from[k], &skipped, MESH_FANIN_BATCH_MAX);
            if (n == 0) continue;
            if (lane0) {
                skipped_of[k] = skipped;
                gen_of[k] = gen;
                __threadfence_block();  // the batch, its senders and stamps before the flag
                full[k] = n;
            }
            __syncwarp();
            in.ch.mine += n;  // as if answered: the replier restarts us if it is not
            k ^= 1u;
        }
        return;
    }

    // ---- the replier ----
    mesh_group out = mesh_group_open(ctx, 1);
    if (out.msg_size != in.ch.msg_size) {
        if (threadIdx.x == 0) {
            stop_all = 1;
            mesh_exit(ctx, 1);
        }
        return;
    }
    uint32_t base[DUO_WORDS], n[DUO_WORDS];
    for (uint32_t i = 0; i < DUO_WORDS; i++) {
        base[i] = mesh_user_load(ctx, i);
        n[i] = 0;
    }
    n[6] = 1;
    uint32_t iter = 0, gen = 0, k = 0;
    while (!mesh_should_stop(ctx)) {
        if ((++iter & 1023u) == 0 && threadIdx.x == 0) {
            mesh_heartbeat(ctx, ++beat);
            duo_report(ctx, base, n);
        }
        uint32_t gone;
        while (mesh_group_departed(&out, &gone)) n[4]++;
        uint32_t count = 0, stamp = 0;
        if (lane0) {
            count = full[k];
            __threadfence_block();  // the batch is read after its flag
            stamp = gen_of[k];
        }
        count = __shfl_sync(0xffffffffu, count, 0);
        __syncwarp();  // every lane reads the batch after lane 0 saw its flag
        if (count == 0) {
            mesh_chan_flush(&in.ch);  // idle: publish the exact position (credit, the stall watcher)
            continue;
        }
        if (__shfl_sync(0xffffffffu, stamp, 0) != gen) {  // peeked before the last restart: drop it
            if (lane0) full[k] = 0;
            __syncwarp();
            n[9]++;
            continue;
        }
        const uint32_t skipped = skipped_of[k];
        const uint32_t w = in.ch.msg_size / 4u, j = threadIdx.x;
        if (j < count && !((skipped >> j) & 1u)) reqs[k][j * w + 1] += 1;  // f(from[j], request j)
        __syncwarp();
        uint32_t dropped;
        const uint32_t done = mesh_reply_many(&out, from[k], reqs[k], count, skipped, &dropped);
        mesh_fanin_consume(&in, done);
        const uint32_t kept = done >= 32u ? 0xffffffffu : (1u << done) - 1u;
        n[0] += done - (uint32_t)__popc((skipped | dropped) & kept);
        n[1] += (uint32_t)__popc(skipped & kept);
        n[2] += (uint32_t)__popc(dropped & kept);
        __syncwarp();
        if (lane0) {
            __threadfence_block();  // every lane's use of the buffer before the reader may overwrite it
            full[k] = 0;            // the buffer is the reader's again
        }
        k ^= 1u;
        if (done < count) {  // a client's ring is full: the reader starts again at our position
            n[3]++;
            n[8]++;
            gen++;
            if (lane0) {
                restart_at = in.ch.mine;
                restart_k = k;
                __threadfence_block();
                restart_gen = gen;
            }
            __syncwarp();
        }
    }
    if (lane0) stop_all = 1;
    mesh_fanin_close(&in);  // the exact consumed position for the next launch
    mesh_group_close(&out);
    if (threadIdx.x == 0) {
        duo_report(ctx, base, n);
        mesh_end(ctx);
    }
}
