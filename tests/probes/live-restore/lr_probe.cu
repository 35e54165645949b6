//! lr_probe.cu: the GPU side of the live-restore probes (questions 1-5 of run.sh), one binary, one mode per
//! argv[1]. Build: nvcc -O2 -arch=sm_90 -std=c++17 -o lr_probe lr_probe.cu -lcuda
//!
//! Modes that create a CUDA context:
//!   hb SHM MAXSEC                      resident heartbeat kernel into SHM (a /dev/shm file, registered with
//!                                      cuMemHostRegister(DEVICEMAP)); ends on SHM's stop word or after MAXSEC
//!   launch RESULT                      a fresh context and one tiny kernel; writes CLOCK_MONOTONIC stamps
//!   vmm-export SOCK MAXSEC             cuMemCreate (POSIX fd), fills it, hands its fd to every SOCK client
//!   vmm-import SOCK SHM MAXSEC SOCK2   imports that fd, maps it, runs the heartbeat kernel reading/writing it,
//!                                      and hands the fd it holds on to every SOCK2 client
//!   vmm-third SOCK2                    imports the fd from the importer, checks the data, writes LR_MAGIC
//!   standby SHM                        a second context beside SHM's kernel: its gaps while this one is
//!                                      created, loads a module and registers SHM (question 5)
//! Modes that make no CUDA call (observers: they never create a context):
//!   wait-adv SHM MS | adv SHM MS | reset SHM | stop SHM | wait-done SHM MS | show SHM
//!   killtest SHMDIR LOGDIR LABEL N     question 4: kill -9 of a context with a resident kernel, timed
//! Every CUDA call is checked and its error printed. Times are CLOCK_MONOTONIC (shared by all processes)
//! or the kernel's own %globaltimer.
#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <string>
#include <vector>

#include "lr_shm.h"

#define CK(call)                                                                                        \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "FAIL %s:%d %s: %s (%d)\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_), \
                    (int)e_);                                                                           \
            exit(3);                                                                                    \
        }                                                                                               \
    } while (0)
#define CU(call)                                                                                        \
    do {                                                                                                \
        CUresult r_ = (call);                                                                           \
        if (r_ != CUDA_SUCCESS) {                                                                       \
            const char* s_ = "?";                                                                       \
            cuGetErrorString(r_, &s_);                                                                  \
            fprintf(stderr, "FAIL %s:%d %s: %s (%d)\n", __FILE__, __LINE__, #call, s_, (int)r_);        \
            exit(3);                                                                                    \
        }                                                                                               \
    } while (0)

static uint64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
static void sleep_us(uint64_t us) {
    timespec t = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

// ---------------------------------------------------------------- the kernel

__device__ __forceinline__ uint64_t gtimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One thread. Each iteration: a gap check, the heartbeat, optionally a read and a write of the VMM buffer
// `dev` (words 1..words-2 hold LR_PATTERN64; word 0 gets the iteration count and is read back), then the
// control word. Leaves on stop or after max_ns of its own time, so nothing outlives the probe for long.
__global__ void hb_kernel(LrHb* h, uint64_t max_ns, volatile uint64_t* dev, uint64_t words) {
    uint64_t t0 = gtimer(), prev = t0, maxg = 0, n = 0, nbig = 0;
    uint32_t gen_seen = (uint32_t)(h->ctl >> 32);
    h->start_gt = t0;
    h->reset_seen = gen_seen;
    uint64_t bad = 0;
    for (;;) {
        uint64_t now = gtimer();
        uint64_t g = now - prev;
        prev = now;
        if (g > maxg) {
            maxg = g;
            h->max_gap = maxg;
        }
        if (g > LR_BIG_NS) {
            h->big[nbig % LR_BIG_RING][0] = now;
            h->big[nbig % LR_BIG_RING][1] = g;
            __threadfence_system();
            h->nbig = ++nbig;
        }
        n++;
        if (dev != nullptr && words > 2) {
            uint64_t idx = 1 + n % (words - 2);
            if (dev[idx] != LR_PATTERN64) bad++;
            dev[0] = n;
            __threadfence();
            if (dev[0] != n) bad++;
            if (bad != 0) h->bad = bad;
        }
        h->count = n;
        h->gt = now;
        uint64_t c = h->ctl;
        if ((uint32_t)c != 0) {
            h->kernel_done = 1;
            break;
        }
        uint32_t gen = (uint32_t)(c >> 32);
        if (gen != gen_seen) {
            gen_seen = gen;
            maxg = 0;
            h->max_gap = 0;
            __threadfence_system();
            h->reset_seen = gen;
        }
        if (now - t0 > max_ns) {
            h->kernel_done = 2;
            break;
        }
    }
    __threadfence_system();
}

__global__ void tiny_kernel(int* p) { *p = 42; }

// ---------------------------------------------------------------- host helpers

static LrHb* map_hb(const char* path, bool create) {
    int fd = open(path, O_RDWR | (create ? O_CREAT : 0), 0600);
    if (fd < 0) {
        fprintf(stderr, "FAIL open %s: %s\n", path, strerror(errno));
        exit(3);
    }
    if (create && ftruncate(fd, LR_PAGE) != 0) {
        fprintf(stderr, "FAIL ftruncate %s: %s\n", path, strerror(errno));
        exit(3);
    }
    void* p = mmap(nullptr, LR_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "FAIL mmap %s: %s\n", path, strerror(errno));
        exit(3);
    }
    return (LrHb*)p;
}

static volatile uint32_t* ctl_half(LrHb* h, int high) { return (volatile uint32_t*)&h->ctl + high; }

static void init_ctx(int* mps_out) {
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    CU(cuInit(0));
    CUdevice d;
    CU(cuDeviceGet(&d, 0));
    int mps = -1;
    CUresult r = cuDeviceGetAttribute(&mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, d);
    if (r != CUDA_SUCCESS) mps = -1;
    if (mps_out) *mps_out = mps;
}

static int send_fd(int sock, int fd) {
    char byte = 'F';
    iovec iov = {&byte, 1};
    char ctrl[CMSG_SPACE(sizeof(int))];
    memset(ctrl, 0, sizeof ctrl);
    msghdr m = {};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &m, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

static int recv_fd(int sock) {
    char byte;
    iovec iov = {&byte, 1};
    char ctrl[CMSG_SPACE(sizeof(int))];
    msghdr m = {};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
    if (recvmsg(sock, &m, 0) != 1) return -1;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

static int unix_listen(const char* path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a = {};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    unlink(path);
    if (s < 0 || bind(s, (sockaddr*)&a, sizeof a) != 0 || listen(s, 8) != 0) {
        fprintf(stderr, "FAIL listen %s: %s\n", path, strerror(errno));
        exit(3);
    }
    return s;
}

static int unix_connect(const char* path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a = {};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    for (int i = 0; i < 200; i++) {
        if (connect(s, (sockaddr*)&a, sizeof a) == 0) return s;
        sleep_us(10000);
    }
    fprintf(stderr, "FAIL connect %s: %s\n", path, strerror(errno));
    exit(3);
}

// Imports a POSIX-fd VMM handle and maps it read/write on device 0; returns the address and the size.
static CUdeviceptr import_map(int fd, size_t* size_out, CUmemGenericAllocationHandle* h_out) {
    CUmemGenericAllocationHandle h;
    CU(cuMemImportFromShareableHandle(&h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUmemAllocationProp prop = {};
    CU(cuMemGetAllocationPropertiesFromHandle(&prop, h));
    size_t gran = 0;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    // The exporter allocates exactly one granule; the importer maps the same.
    size_t size = gran;
    CUdeviceptr p;
    CU(cuMemAddressReserve(&p, size, 0, 0, 0));
    CU(cuMemMap(p, size, 0, h, 0));
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(p, size, &acc, 1));
    *size_out = size;
    *h_out = h;
    return p;
}

// Runs the heartbeat kernel on SHM (optionally over a VMM buffer) and waits for it by polling the stream,
// calling `idle` between polls. Returns the process's exit code: 0 when the kernel ended on the stop word.
static int run_hb(const char* shm, double maxsec, CUdeviceptr dev, uint64_t words, void (*idle)(void*), void* arg) {
    uint64_t t_start = now_ns();
    int mps = -1;
    init_ctx(&mps);
    uint64_t t_ctx = now_ns();
    LrHb* h = map_hb(shm, true);
    CU(cuMemHostRegister((void*)h, LR_PAGE, CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr hd;
    CU(cuMemHostGetDevicePointer(&hd, (void*)h, 0));
    h->host_pid = (uint64_t)getpid();
    h->mps = (uint64_t)(mps + 1);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    hb_kernel<<<1, 1, 0, st>>>((LrHb*)hd, (uint64_t)(maxsec * 1e9), (volatile uint64_t*)dev, words);
    CK(cudaGetLastError());
    h->host_state = 1;
    printf("hb pid=%d mps_enabled=%d ctx_ms=%.1f launched at %llu\n", getpid(), mps, (t_ctx - t_start) / 1e6,
           (unsigned long long)now_ns());
    fflush(stdout);
    cudaError_t e;
    while ((e = cudaStreamQuery(st)) == cudaErrorNotReady) {
        if (idle) idle(arg);
        else sleep_us(1000);
    }
    h->host_err = (int64_t)e;
    h->host_state = e == cudaSuccess ? 2 : 3;
    printf("hb pid=%d kernel ended: %s (%d) kernel_done=%llu count=%llu max_gap_us=%.1f nbig=%llu bad=%llu\n",
           getpid(), cudaGetErrorString(e), (int)e, (unsigned long long)h->kernel_done,
           (unsigned long long)h->count, h->max_gap / 1e3, (unsigned long long)h->nbig,
           (unsigned long long)h->bad);
    fflush(stdout);
    if (e != cudaSuccess) return 4;
    CU(cuMemHostUnregister((void*)h));
    return h->kernel_done == 1 ? 0 : 5;
}

// ---------------------------------------------------------------- modes with a context

static int mode_hb(int argc, char** argv) {
    if (argc < 4) return 2;
    return run_hb(argv[2], atof(argv[3]), 0, 0, nullptr, nullptr);
}

static int mode_launch(int argc, char** argv) {
    if (argc < 3) return 2;
    uint64_t t_start = now_ns();
    int mps = -1;
    init_ctx(&mps);
    uint64_t t_ctx = now_ns();
    int* d;
    CK(cudaMalloc(&d, sizeof(int)));
    tiny_kernel<<<1, 1>>>(d);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    int v = 0;
    CK(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
    uint64_t t_done = now_ns();
    FILE* f = fopen(argv[2], "w");
    if (!f) return 3;
    fprintf(f, "%llu %llu %llu %d %d\n", (unsigned long long)t_start, (unsigned long long)t_ctx,
            (unsigned long long)t_done, v, mps);
    fclose(f);
    printf("launch pid=%d mps_enabled=%d ctx_ms=%.2f kernel_ms=%.2f value=%d\n", getpid(), mps,
           (t_ctx - t_start) / 1e6, (t_done - t_ctx) / 1e6, v);
    return v == 42 ? 0 : 6;
}

static int mode_vmm_export(int argc, char** argv) {
    if (argc < 4) return 2;
    alarm((unsigned)atoi(argv[3]));  // a safety: the exporter never outlives the probe for long
    init_ctx(nullptr);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h;
    CU(cuMemCreate(&h, gran, &prop, 0));
    CUdeviceptr p;
    CU(cuMemAddressReserve(&p, gran, 0, 0, 0));
    CU(cuMemMap(p, gran, 0, h, 0));
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(p, gran, &acc, 1));
    CU(cuMemsetD32(p, LR_PATTERN32, gran / 4));
    CU(cuCtxSynchronize());
    int fd = -1;
    CU(cuMemExportToShareableHandle((void*)&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    int ls = unix_listen(argv[2]);
    printf("exported pid=%d size=%zu fd=%d\n", getpid(), gran, fd);
    fflush(stdout);
    for (;;) {
        int c = accept(ls, nullptr, nullptr);
        if (c < 0) continue;
        printf("export: sent fd: %s\n", send_fd(c, fd) == 0 ? "ok" : strerror(errno));
        fflush(stdout);
        close(c);
    }
}

struct ImportIdle {
    int ls;
    int fd;
};
static void import_idle(void* arg) {
    ImportIdle* s = (ImportIdle*)arg;
    int c = accept(s->ls, nullptr, nullptr);  // non-blocking: EAGAIN when nobody waits
    if (c >= 0) {
        printf("import: re-sent its fd to a third process: %s\n", send_fd(c, s->fd) == 0 ? "ok" : strerror(errno));
        fflush(stdout);
        close(c);
    }
    sleep_us(1000);
}

static int mode_vmm_import(int argc, char** argv) {
    if (argc < 6) return 2;
    int s = unix_connect(argv[2]);
    int fd = recv_fd(s);
    close(s);
    if (fd < 0) {
        fprintf(stderr, "FAIL recv fd from %s\n", argv[2]);
        return 3;
    }
    // The context first (run_hb creates it too, idempotently), because the import needs one.
    init_ctx(nullptr);
    size_t size = 0;
    CUmemGenericAllocationHandle h;
    CUdeviceptr p = import_map(fd, &size, &h);
    uint64_t words = size / 8;
    uint64_t first = 0;
    CU(cuMemcpyDtoH(&first, p + 8, 8));
    printf("import pid=%d mapped %zu B, word 1 = %#llx (%s)\n", getpid(), size, (unsigned long long)first,
           first == LR_PATTERN64 ? "pattern" : "NOT the pattern");
    fflush(stdout);
    ImportIdle idle = {unix_listen(argv[5]), fd};
    fcntl(idle.ls, F_SETFL, O_NONBLOCK);
    int rc = run_hb(argv[3], atof(argv[4]), p, words, import_idle, &idle);
    if (rc != 0 && rc != 5) return rc;
    // After the kernel: the whole buffer as this process sees it now.
    std::vector<uint64_t> buf(words);
    CU(cuMemcpyDtoH(buf.data(), p, size));
    uint64_t badw = 0;
    for (uint64_t i = 1; i + 1 < words; i++) badw += buf[i] != LR_PATTERN64;
    LrHb* hb = map_hb(argv[3], false);
    printf("import final: word0=%llu kernel_count=%llu (%s) pattern_bad_words=%llu last_word=%#llx (%s) kernel_bad=%llu\n",
           (unsigned long long)buf[0], (unsigned long long)hb->count, buf[0] == hb->count ? "match" : "MISMATCH",
           (unsigned long long)badw, (unsigned long long)buf[words - 1],
           buf[words - 1] == LR_MAGIC ? "the third process's write" : "no third-process write",
           (unsigned long long)hb->bad);
    CU(cuMemUnmap(p, size));
    CU(cuMemAddressFree(p, size));
    CU(cuMemRelease(h));
    return (rc == 0 && badw == 0 && buf[0] == hb->count && hb->bad == 0) ? 0 : 7;
}

static int mode_vmm_third(int argc, char** argv) {
    if (argc < 3) return 2;
    int s = unix_connect(argv[2]);
    int fd = recv_fd(s);
    close(s);
    if (fd < 0) {
        fprintf(stderr, "FAIL recv fd from %s\n", argv[2]);
        return 3;
    }
    init_ctx(nullptr);
    size_t size = 0;
    CUmemGenericAllocationHandle h;
    CUdeviceptr p = import_map(fd, &size, &h);
    uint64_t words = size / 8;
    std::vector<uint64_t> buf(words);
    CU(cuMemcpyDtoH(buf.data(), p, size));
    uint64_t w0a = buf[0];
    sleep_us(100000);
    uint64_t w0b = 0;
    CU(cuMemcpyDtoH(&w0b, p, 8));
    uint64_t badw = 0;
    for (uint64_t i = 1; i + 1 < words; i++) badw += buf[i] != LR_PATTERN64;
    uint64_t magic = LR_MAGIC;
    CU(cuMemcpyHtoD(p + (words - 1) * 8, &magic, 8));
    CU(cuCtxSynchronize());
    printf("third pid=%d imported and mapped %zu B: word0 %llu -> %llu in 100 ms (%s), pattern_bad_words=%llu, wrote magic\n",
           getpid(), size, (unsigned long long)w0a, (unsigned long long)w0b, w0b > w0a ? "live" : "NOT advancing",
           (unsigned long long)badw);
    CU(cuMemUnmap(p, size));
    CU(cuMemAddressFree(p, size));
    CU(cuMemRelease(h));
    return (w0b > w0a && badw == 0) ? 0 : 7;
}

// ---------------------------------------------------------------- observers (no CUDA call)

// Sets a new reset generation and waits until the kernel applied it; false after 2 s.
static bool hb_reset(LrHb* h) {
    uint32_t gen = *ctl_half(h, 1) + 1;
    *ctl_half(h, 1) = gen;
    uint64_t until = now_ns() + 2000000000ull;
    while (now_ns() < until) {
        if ((uint32_t)h->reset_seen == gen) return true;
        sleep_us(100);
    }
    return false;
}

static bool hb_advancing(LrHb* h, uint64_t ms) {
    uint64_t c0 = h->count;
    sleep_us(ms * 1000);
    return h->count > c0;
}

static const char* PTX_NOOP =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry lr_noop(.param .u64 p)\n{\n.reg .b64 %rd<2>;\nld.param.u64 %rd1, [p];\nret;\n}\n";

// Question 5: a second context beside SHM's running kernel. Each step is bracketed by a reset of the
// kernel's largest gap and a read of it 50 ms later, so each figure is that step's own stall.
static int mode_standby(int argc, char** argv) {
    if (argc < 3) return 2;
    LrHb* h = map_hb(argv[2], false);
    auto measure = [&](const char* what, auto&& step) {
        if (!hb_reset(h)) {
            printf("standby: %s: the kernel did not apply a reset (not running?)\n", what);
            return false;
        }
        uint64_t t = now_ns();
        step();
        uint64_t dt = now_ns() - t;
        sleep_us(50000);
        printf("standby step=%s step_ms=%.3f running_kernel_max_gap_us=%.1f\n", what, dt / 1e6, h->max_gap / 1e3);
        fflush(stdout);
        return true;
    };
    measure("idle-200ms", [&] { sleep_us(150000); });
    measure("context-create", [&] { init_ctx(nullptr); });
    CUmodule mod;
    measure("module-load-ptx", [&] { CU(cuModuleLoadData(&mod, PTX_NOOP)); });
    CUfunction fn;
    measure("get-function", [&] { CU(cuModuleGetFunction(&fn, mod, "lr_noop")); });
    measure("host-register-shm", [&] { CU(cuMemHostRegister((void*)h, LR_PAGE, CU_MEMHOSTREGISTER_DEVICEMAP)); });
    measure("idle-context-500ms", [&] { sleep_us(450000); });
    measure("host-unregister-shm", [&] { CU(cuMemHostUnregister((void*)h)); });
    measure("module-unload", [&] { CU(cuModuleUnload(mod)); });
    // The context's destruction at exit: run.sh reads the gap after this process is gone.
    if (!hb_reset(h)) printf("standby: the kernel did not apply the last reset\n");
    return 0;
}

static void show(LrHb* h) {
    printf("count=%llu gt=%llu max_gap_us=%.1f reset_seen=%llu start_gt=%llu nbig=%llu kernel_done=%llu bad=%llu "
           "host_state=%llu host_err=%lld host_pid=%llu mps=%lld ctl=%#llx\n",
           (unsigned long long)h->count, (unsigned long long)h->gt, h->max_gap / 1e3,
           (unsigned long long)h->reset_seen, (unsigned long long)h->start_gt, (unsigned long long)h->nbig,
           (unsigned long long)h->kernel_done, (unsigned long long)h->bad, (unsigned long long)h->host_state,
           (long long)h->host_err, (unsigned long long)h->host_pid, (long long)h->mps - 1,
           (unsigned long long)h->ctl);
    uint64_t n = h->nbig < LR_BIG_RING ? h->nbig : LR_BIG_RING;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = (h->nbig - n + i) % LR_BIG_RING;
        printf("  gap %.1f us ending at globaltimer %llu (+%.3f s from start)\n", h->big[k][1] / 1e3,
               (unsigned long long)h->big[k][0], (h->big[k][0] - h->start_gt) / 1e9);
    }
}

// ---------------------------------------------------------------- question 4

// Forks and execs this binary with `args`, its output appended to `log`.
static pid_t spawn_self(const char* log, std::vector<const char*> args) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "FAIL readlink /proc/self/exe: %s\n", strerror(errno));
        exit(3);
    }
    self[n] = 0;
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        std::vector<char*> av;
        av.push_back(self);
        for (const char* a : args) av.push_back((char*)a);
        av.push_back(nullptr);
        execv(self, av.data());
        _exit(127);
    }
    return p;
}

static bool wait_adv(LrHb* h, uint64_t ms) {
    uint64_t until = now_ns() + ms * 1000000ull;
    while (now_ns() < until) {
        if (h->host_state == 1 && h->count > 0 && hb_advancing(h, 20)) return true;
        if (h->host_state >= 2) return false;
        sleep_us(5000);
    }
    return false;
}

// Waits for `p` up to `ms`; kills and reaps it if still there. Returns its wait status, or -1.
static int reap(pid_t p, uint64_t ms) {
    uint64_t until = now_ns() + ms * 1000000ull;
    int st = 0;
    while (now_ns() < until) {
        pid_t r = waitpid(p, &st, WNOHANG);
        if (r == p) return st;
        if (r < 0) return -1;
        sleep_us(2000);
    }
    kill(p, SIGKILL);
    waitpid(p, &st, 0);
    return -1;
}

static double med(std::vector<double> v) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
static void summ(const char* label, const char* what, std::vector<double> v) {
    if (v.empty()) {
        printf("Q4 %s %s: no samples\n", label, what);
        return;
    }
    std::sort(v.begin(), v.end());
    printf("Q4 %s %-34s n=%zu min=%.2f median=%.2f max=%.2f\n", label, what, v.size(), v.front(), med(v),
           v.back());
}

// killtest SHMDIR LOGDIR LABEL ITERS: S (a heartbeat kernel that stays) and, each iteration, K (one more), both
// this binary's children; kill -9 K and time what follows. Then a fresh process N makes a context and a
// kernel. Plain or MPS as the environment says (CUDA_MPS_PIPE_DIRECTORY).
static int mode_killtest(int argc, char** argv) {
    if (argc < 6) return 2;
    std::string sdir = argv[2], dir = argv[3], label = argv[4];
    int iters = atoi(argv[5]);
    std::string s_shm = sdir + "/q4-" + label + "-S.shm", k_shm = sdir + "/q4-" + label + "-K.shm";
    std::string s_log = dir + "/q4-" + label + "-S.log", k_log = dir + "/q4-" + label + "-K.log";
    std::string n_log = dir + "/q4-" + label + "-N.log", n_res = sdir + "/q4-" + label + "-N.res";
    LrHb* S = map_hb(s_shm.c_str(), true);
    LrHb* K = map_hb(k_shm.c_str(), true);
    pid_t s_pid = -1;
    int s_restarts = 0;
    auto start_s = [&]() {
        memset((void*)S, 0, LR_PAGE);
        s_pid = spawn_self(s_log.c_str(), {"hb", s_shm.c_str(), "200"});
        if (!wait_adv(S, 30000)) {
            printf("Q4 %s: S did not start (see %s)\n", label.c_str(), s_log.c_str());
            return false;
        }
        return true;
    };
    // Runs N (launch): returns (ctx ready, kernel done) in ns since `t0`, and N's own ctx time; false on failure.
    auto run_n = [&](uint64_t t0, double* ctx_ms, double* done_ms, double* own_ctx_ms) {
        unlink(n_res.c_str());
        pid_t n = spawn_self(n_log.c_str(), {"launch", n_res.c_str()});
        int st = reap(n, 20000);
        FILE* f = fopen(n_res.c_str(), "r");
        unsigned long long a = 0, b = 0, c = 0;
        int v = 0, mps = 0;
        bool ok = f && fscanf(f, "%llu %llu %llu %d %d", &a, &b, &c, &v, &mps) == 5 && st == 0;
        if (f) fclose(f);
        if (!ok) return false;
        *ctx_ms = ((double)b - (double)t0) / 1e6;
        *done_ms = ((double)c - (double)t0) / 1e6;
        *own_ctx_ms = (b - a) / 1e6;
        return true;
    };
    if (!start_s()) return 8;
    // Baselines: S alone for 1 s; a fresh N while S runs (its context creation time-slices with S).
    hb_reset(S);
    sleep_us(1000000);
    double s_alone_us = S->max_gap / 1e3;
    hb_reset(S);
    double bctx = 0, bdone = 0, bown = 0;
    uint64_t tb = now_ns();
    bool bok = run_n(tb, &bctx, &bdone, &bown);
    sleep_us(50000);
    printf("Q4 %s baseline: S alone 1 s max_gap_us=%.1f; fresh process N (no kill): ok=%d ctx at %.1f ms, "
           "kernel done at %.1f ms from its spawn, its own ctx_ms=%.1f; S max_gap during N_us=%.1f\n",
           label.c_str(), s_alone_us, bok, bctx, bdone, bown, S->max_gap / 1e3);
    std::vector<double> v_sbeside, v_hbstop, v_kgt, v_reap, v_nctx, v_ndone, v_sgap, v_sgapn;
    int s_failed = 0, k_failed = 0;
    for (int i = 0; i < iters; i++) {
        memset((void*)K, 0, LR_PAGE);
        pid_t k = spawn_self(k_log.c_str(), {"hb", k_shm.c_str(), "60"});
        if (!wait_adv(K, 30000)) {
            printf("Q4 %s iter %d: K did not start (see %s)\n", label.c_str(), i, k_log.c_str());
            reap(k, 100);
            k_failed++;
            continue;
        }
        // S beside a live K first (two plain contexts time-slice), so that the gap across K's death has its
        // own baseline.
        hb_reset(S);
        sleep_us(300000);
        double s_beside = S->max_gap / 1e3;
        v_sbeside.push_back(s_beside);
        if (!hb_reset(S)) printf("Q4 %s iter %d: S did not apply a reset\n", label.c_str(), i);
        uint64_t s_count0 = S->count;
        uint64_t k_last_count = K->count;
        uint64_t k_gt_before = K->gt;
        uint64_t t0 = now_ns();
        kill(k, SIGKILL);
        uint64_t last_change = t0, t_reaped = 0, t_zombie = 0;
        int st = 0;
        uint64_t deadline = t0 + 15000000000ull;
        for (;;) {
            uint64_t t = now_ns();
            uint64_t c = K->count;
            if (c != k_last_count) {
                k_last_count = c;
                last_change = t;
            }
            if (t_zombie == 0 && t_reaped == 0) {
                char path[64], buf[512];
                snprintf(path, sizeof path, "/proc/%d/stat", (int)k);
                int fd = open(path, O_RDONLY);
                if (fd >= 0) {
                    ssize_t n = read(fd, buf, sizeof buf - 1);
                    close(fd);
                    if (n > 0) {
                        buf[n] = 0;
                        const char* rp = strrchr(buf, ')');
                        if (rp && rp[1] == ' ' && rp[2] == 'Z') t_zombie = t;
                    }
                }
            }
            if (t_reaped == 0 && waitpid(k, &st, WNOHANG) == k) t_reaped = t;
            if (t_reaped != 0 && t - last_change > 300000000ull) break;
            if (t > deadline) break;
            sleep_us(20);
        }
        double hbstop_ms = ((double)last_change - (double)t0) / 1e6;
        double reap_ms = t_reaped ? (t_reaped - t0) / 1e6 : -1;
        double zombie_ms = t_zombie ? (t_zombie - t0) / 1e6 : -1;
        uint64_t k_gt_after = K->gt;
        if (t_reaped == 0) {
            printf("Q4 %s iter %d: K not reaped within 15 s\n", label.c_str(), i);
            reap(k, 5000);
        }
        // S across K's death.
        int sst = 0;
        bool s_alive = waitpid(s_pid, &sst, WNOHANG) == 0;
        bool s_adv = s_alive && S->count > s_count0 && hb_advancing(S, 50);
        double sgap = S->max_gap / 1e3;
        if (!s_adv) {
            s_failed++;
            printf("Q4 %s iter %d: S FAILED across K's death: alive=%d host_state=%llu host_err=%lld (see %s)\n",
                   label.c_str(), i, s_alive, (unsigned long long)S->host_state, (long long)S->host_err,
                   s_log.c_str());
        } else {
            v_sgap.push_back(sgap);
        }
        // N after the death.
        if (s_adv) hb_reset(S);
        double nctx = -1, ndone = -1, nown = -1;
        bool nok = run_n(t0, &nctx, &ndone, &nown);
        double sgapn = s_adv ? S->max_gap / 1e3 : -1;
        if (nok) {
            v_nctx.push_back(nctx);
            v_ndone.push_back(ndone);
        }
        if (s_adv) v_sgapn.push_back(sgapn);
        v_hbstop.push_back(hbstop_ms);
        v_kgt.push_back(((double)k_gt_after - (double)k_gt_before) / 1e6);
        if (reap_ms >= 0) v_reap.push_back(reap_ms);
        printf("Q4 %s iter %d: K heartbeat last advanced at %+.2f ms (K's globaltimer advanced %.2f ms after "
               "the last read before the kill); K zombie at %.2f ms, reaped at %.2f ms (signal %d); new process N: "
               "ok=%d ctx at %.1f ms, kernel done at %.1f ms (its own ctx %.1f ms); S: %s, max_gap across K's "
               "death %.1f us, during N's start %.1f us, beside a live K %.1f us\n",
               label.c_str(), i, hbstop_ms, ((double)k_gt_after - (double)k_gt_before) / 1e6, zombie_ms, reap_ms,
               WIFSIGNALED(st) ? WTERMSIG(st) : 0, nok, nctx, ndone, nown, s_adv ? "ran on" : "FAILED", sgap,
               sgapn, s_beside);
        fflush(stdout);
        if (!s_adv) {
            if (s_alive) {
                *ctl_half(S, 0) = 1;
                reap(s_pid, 3000);
            } else {
                reap(s_pid, 100);
            }
            s_restarts++;
            if (!start_s()) {
                s_pid = -1;
                break;
            }
        }
    }
    // Phase B: N started right at the kill, while K's context is still being torn down: can a new context
    // and kernel come up meanwhile, and when? (Phase A's N waits for the teardown, to keep S's figure clean.)
    std::vector<double> v_bdone, v_bown, v_breap;
    int b_failed = 0;
    for (int i = 0; i < (iters + 1) / 2; i++) {
        memset((void*)K, 0, LR_PAGE);
        pid_t k = spawn_self(k_log.c_str(), {"hb", k_shm.c_str(), "60"});
        if (!wait_adv(K, 30000)) {
            printf("Q4 %s at-kill %d: K did not start (see %s)\n", label.c_str(), i, k_log.c_str());
            reap(k, 100);
            b_failed++;
            continue;
        }
        sleep_us(100000);
        unlink(n_res.c_str());
        uint64_t t0 = now_ns();
        kill(k, SIGKILL);
        pid_t n = spawn_self(n_log.c_str(), {"launch", n_res.c_str()});
        uint64_t t_k = 0, t_n = 0, deadline = t0 + 20000000000ull;
        int kst = 0, nst = -1;
        while ((t_k == 0 || t_n == 0) && now_ns() < deadline) {
            if (t_k == 0 && waitpid(k, &kst, WNOHANG) == k) t_k = now_ns();
            if (t_n == 0 && waitpid(n, &nst, WNOHANG) == n) t_n = now_ns();
            sleep_us(50);
        }
        if (t_k == 0) reap(k, 100);
        if (t_n == 0) nst = reap(n, 100);
        FILE* f = fopen(n_res.c_str(), "r");
        unsigned long long a = 0, b = 0, c = 0;
        int v = 0, mps = 0;
        bool ok = f && fscanf(f, "%llu %llu %llu %d %d", &a, &b, &c, &v, &mps) == 5 && nst == 0;
        if (f) fclose(f);
        printf("Q4 %s at-kill %d: N spawned at the kill: ok=%d ctx at %.1f ms, kernel done at %.1f ms (its own ctx "
               "%.1f ms); K reaped at %.2f ms\n",
               label.c_str(), i, ok, ok ? ((double)b - (double)t0) / 1e6 : -1, ok ? ((double)c - (double)t0) / 1e6 : -1,
               ok ? (b - a) / 1e6 : -1, t_k ? (t_k - t0) / 1e6 : -1);
        if (ok) {
            v_bdone.push_back(((double)c - (double)t0) / 1e6);
            v_bown.push_back((b - a) / 1e6);
        } else {
            b_failed++;
        }
        if (t_k) v_breap.push_back((t_k - t0) / 1e6);
        // S may have failed here too (MPS): restart it for the summary's stop check.
        int sst = 0;
        if (s_pid > 0 && waitpid(s_pid, &sst, WNOHANG) != 0) {
            printf("Q4 %s at-kill %d: S ended (see %s)\n", label.c_str(), i, s_log.c_str());
            s_pid = start_s() ? s_pid : -1;
        }
    }
    printf("Q4 %s summary (ms from the kill -9 unless us):\n", label.c_str());
    summ(label.c_str(), "at-kill N kernel done (ms)", v_bdone);
    summ(label.c_str(), "at-kill N own ctx (ms)", v_bown);
    summ(label.c_str(), "at-kill K reaped (ms)", v_breap);
    summ(label.c_str(), "K heartbeat stopped (ms)", v_hbstop);
    summ(label.c_str(), "K kernel's own clock ran on (ms)", v_kgt);
    summ(label.c_str(), "K reaped by waitpid (ms)", v_reap);
    summ(label.c_str(), "after-teardown N ctx ready (ms)", v_nctx);
    summ(label.c_str(), "after-teardown N kernel done (ms)", v_ndone);
    summ(label.c_str(), "S max gap beside a live K (us)", v_sbeside);
    summ(label.c_str(), "S max gap across K death (us)", v_sgap);
    summ(label.c_str(), "S max gap during N start (us)", v_sgapn);
    printf("Q4 %s S failed in %d of %d kills (restarted %d times); K failed to start %d times; at-kill N "
           "failed %d times\n",
           label.c_str(), s_failed, iters, s_restarts, k_failed, b_failed);
    if (s_pid > 0) {
        *ctl_half(S, 0) = 1;
        int st = reap(s_pid, 5000);
        printf("Q4 %s S stopped by its stop word: %s\n", label.c_str(),
               st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "exited 0" : "did NOT exit cleanly");
    }
    return s_failed == 0 && k_failed == 0 ? 0 : 9;
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: lr_probe MODE ARGS (see the header of lr_probe.cu)\n");
        return 2;
    }
    std::string m = argv[1];
    int rc = 2;
    if (m == "hb") rc = mode_hb(argc, argv);
    else if (m == "launch") rc = mode_launch(argc, argv);
    else if (m == "vmm-export") rc = mode_vmm_export(argc, argv);
    else if (m == "vmm-import") rc = mode_vmm_import(argc, argv);
    else if (m == "vmm-third") rc = mode_vmm_third(argc, argv);
    else if (m == "standby") rc = mode_standby(argc, argv);
    else if (m == "killtest") rc = mode_killtest(argc, argv);
    else if (argc >= 3) {
        // Created if missing (same size, never truncated): an observer may start before the heartbeat.
        LrHb* h = map_hb(argv[2], true);
        uint64_t ms = argc >= 4 ? strtoull(argv[3], nullptr, 10) : 0;
        if (m == "wait-adv") {
            rc = wait_adv(h, ms) ? 0 : 1;
        } else if (m == "adv") {
            uint64_t c0 = h->count;
            bool adv = hb_advancing(h, ms);
            printf("advancing=%s delta=%llu max_gap_us=%.1f kernel_done=%llu host_state=%llu bad=%llu\n",
                   adv ? "yes" : "no", (unsigned long long)(h->count - c0), h->max_gap / 1e3,
                   (unsigned long long)h->kernel_done, (unsigned long long)h->host_state,
                   (unsigned long long)h->bad);
            rc = adv ? 0 : 1;
        } else if (m == "reset") {
            rc = hb_reset(h) ? 0 : 1;
        } else if (m == "stop") {
            *ctl_half(h, 0) = 1;
            rc = 0;
        } else if (m == "wait-done") {
            uint64_t until = now_ns() + ms * 1000000ull;
            while (h->host_state < 2 && now_ns() < until) sleep_us(2000);
            rc = h->host_state == 2 ? 0 : 1;
        } else if (m == "show") {
            show(h);
            rc = 0;
        }
    }
    if (rc == 2) fprintf(stderr, "lr_probe %s: bad arguments (see the header of lr_probe.cu)\n", argv[1]);
    return rc;
}
