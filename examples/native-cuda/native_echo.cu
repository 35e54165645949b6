// native_echo: a native GPU worker in CUDA C (runtime API) over mesh-shm-c. Started by meshd:
//   meshd spawn nat --bind to-echo --bind from-echo -- ./native-cuda 100000 result.txt
// it opens the mailbox (MESH_MAILBOX), claims the producer end of its first channel and the consumer end of
// its second (MESH_CHANNELS), registers the mailbox with cudaHostRegister(..., cudaHostRegisterMapped), builds
// a mesh_ctx from the device pointer, says ready (MESH_READY_FD), and runs native_exchange (native_kernel.cuh):
// COUNT sequence-checked messages through a resident echo program. Prints, and writes to RESULT if given,
// "messages=N errors=E ms=T"; exits 0 only when all N came back in order.
// Build (see README.md here):
//   cargo build --release -p mesh-shm-c
//   nvcc -O2 -arch=sm_90 -I crates/mesh-shm/include -I crates/mesh-shm-c/include -o native-cuda \
//        examples/native-cuda/native_echo.cu target/release/libmesh_shm_c.a -lpthread -ldl -lm
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_shm.h"
#include "native_kernel.cuh"

static_assert(sizeof(MeshShmCtx) == sizeof(mesh_ctx), "mesh_shm.h's MeshShmCtx is mesh.cuh's mesh_ctx");
static_assert(offsetof(MeshShmCtx, bindings) == offsetof(mesh_ctx, bindings), "same layout");

#define SHM(call)                                                                                   \
    do {                                                                                            \
        MeshStatus s_ = (call);                                                                     \
        if (s_ != MESH_OK) {                                                                        \
            fprintf(stderr, "native-cuda: %s: %s (%s)\n", #call, mesh_shm_strerror(s_), mesh_shm_last_error()); \
            return 1;                                                                               \
        }                                                                                           \
    } while (0)
#define CUDA(call)                                                                       \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "native-cuda: %s: %s\n", #call, cudaGetErrorString(e_));     \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

int main(int argc, char** argv) {
    unsigned long long count = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000ull;
    const char* result_path = argc > 2 ? argv[2] : NULL;
    MeshMailbox* mb = NULL;
    SHM(mesh_shm_open(NULL, &mb));  // NULL: MESH_MAILBOX
    uint32_t bound = 0;
    SHM(mesh_shm_bound_count(&bound));
    if (bound < 2) {
        fprintf(stderr, "native-cuda: needs two channels (--bind TO --bind FROM), MESH_CHANNELS names %u\n", bound);
        return 1;
    }
    MeshChannelInfo to, from;
    char to_name[64], from_name[64];
    SHM(mesh_shm_bound_channel(mb, 0, &to, to_name, sizeof to_name));
    SHM(mesh_shm_bound_channel(mb, 1, &from, from_name, sizeof from_name));
    MeshProducer* tx = NULL;
    MeshConsumer* rx = NULL;
    SHM(mesh_shm_producer_claim(mb, to_name, &tx));  // this process's kernel drives these ends
    SHM(mesh_shm_consumer_claim(mb, from_name, &rx));

    void* base = NULL;
    size_t len = 0;
    SHM(mesh_shm_region(mb, &base, &len));
    CUDA(cudaFree(0));  // creates the context (an MPS client under --isolation mps)
    CUDA(cudaHostRegister(base, len, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* dev = NULL;
    CUDA(cudaHostGetDevicePointer(&dev, base, 0));
    MeshShmCtx c;
    SHM(mesh_shm_ctx(mb, (uint64_t)(uintptr_t)dev, NULL, 0, &c));  // NULL: the MESH_CHANNELS channels
    mesh_ctx ctx;
    memcpy(&ctx, &c, sizeof ctx);
    native_result* out = NULL;
    CUDA(cudaMalloc(&out, sizeof *out));
    CUDA(cudaMemset(out, 0, sizeof *out));
    SHM(mesh_shm_ready());  // meshd checks MPS membership now

    cudaEvent_t t0, t1;
    CUDA(cudaEventCreate(&t0));
    CUDA(cudaEventCreate(&t1));
    CUDA(cudaEventRecord(t0));
    native_exchange<<<1, 32>>>(ctx, count, 60ull * 1000000000ull, out);
    CUDA(cudaGetLastError());
    CUDA(cudaEventRecord(t1));
    CUDA(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA(cudaEventElapsedTime(&ms, t0, t1));
    native_result r;
    CUDA(cudaMemcpy(&r, out, sizeof r, cudaMemcpyDeviceToHost));
    const bool ok = r.received == count && r.errors == 0 && !r.timed_out;
    char line[256];
    snprintf(line, sizeof line, "messages=%llu errors=%llu ms=%.3f sent=%llu first_bad=%lld timed_out=%llu\n", r.received,
             r.errors, ms, r.sent, (long long)r.first_bad, r.timed_out);
    fputs(line, stdout);
    if (result_path) {
        FILE* f = fopen(result_path, "w");
        if (f) {
            fputs(line, f);
            fclose(f);
        }
    }
    CUDA(cudaFree(out));
    CUDA(cudaHostUnregister(base));
    mesh_shm_producer_release(tx);
    mesh_shm_consumer_release(rx);
    mesh_shm_close(mb);
    return ok ? 0 : 2;
}
