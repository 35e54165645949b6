// kit_ll.cu: issue 16 item 1's memory question: the LL probe's kernels (ll_roundtrip.cu: the raw relaxed
// word and the one-warp LL exchange) over each kind of mapped host memory (kit_common.h: cudaHostAlloc
// as the probe, a registered /dev/shm file as meshd's mailbox, and variants), at one fixed slot (as the
// probe) or walking a ring of 64 slots laid out as a channel's (slot = 2 x payload bytes, page-aligned
// start), optionally spinning a fixed delay on the host after each reply (the host-delay sweep).
// Build: nvcc -O3 -arch=sm_90 -std=c++17 -o kit_ll kit_ll.cu    Run: tests/probes/run-kit.sh
// Prints one "ROW|ll|..." line per case (run-kit.sh makes the table); raw round trips (ns) under
// $KIT_RAW_DIR. A measurement tool: not yet run on a GPU as written (2026-12-03).
#include "kit_common.h"

__device__ __forceinline__ uint64_t ldv(const volatile uint64_t* p) {
    uint64_t v;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void stv(volatile uint64_t* p, uint64_t v) {
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v));
}

// The probe's raw kernel; round i uses slot (i & mask) of `stride` words (mask 0: the probe's one word).
__global__ void raw(volatile uint64_t* in, volatile uint64_t* out, int n, uint32_t mask, uint32_t stride) {
    for (uint64_t i = 1; i <= (uint64_t)n; i++) {
        const uint64_t off = (uint64_t)((uint32_t)i & mask) * stride;
        while (ldv(in + off) != i) {}
        stv(out + off, i);
    }
}

// The probe's one-warp LL kernel (llw): W words of 4 payload bytes + a 4-byte tag, lane l loads words
// l, l + 32, ...; all words' loads are issued before any is used; one vote. W below 32: lanes >= W idle.
template <int P>
__global__ void llw(volatile uint64_t* in, volatile uint64_t* out, int n, int W, uint32_t mask, uint32_t stride) {
    const int lane = threadIdx.x;
    for (uint32_t i = 1; i <= (uint32_t)n; i++) {
        const uint64_t off = (uint64_t)(i & mask) * stride;
        uint64_t v[P];
        bool ok;
        do {
#pragma unroll
            for (int k = 0; k < P; k++)
                if (lane + 32 * k < W) v[k] = ldv(in + off + lane + 32 * k);
            ok = true;
#pragma unroll
            for (int k = 0; k < P; k++)
                if (lane + 32 * k < W) ok &= (uint32_t)(v[k] >> 32) == i;
            ok = __all_sync(0xffffffff, ok);
        } while (!ok);
#pragma unroll
        for (int k = 0; k < P; k++)
            if (lane + 32 * k < W) stv(out + off + lane + 32 * k, v[k]);
    }
}

static const size_t REGION = 4u << 20;   // two 2 MiB pages: requests in the first, replies in the second
static const size_t IN_AT = 1u << 20;    // page-aligned, as a channel's slots
static const size_t OUT_AT = 3u << 20;
static const uint32_t RING = 64;         // the bench's channel capacity

struct Case {
    std::string label, kind, layout, size;  // size: "raw" or payload bytes
    uint32_t delay_ns;
};

static uint64_t deadline_check(uint64_t start, const Case& c) {
    uint64_t t = now_ns();
    if (t - start > 20000000000ull) {  // 20 s for one case: the kernel is not answering
        fprintf(stderr, "ll %s %s %s %s: no reply for 20 s, giving up\n", c.label.c_str(), c.kind.c_str(),
                c.layout.c_str(), c.size.c_str());
        exit(3);
    }
    return t;
}

// One case: launches the kernel, runs warm + rounds round trips, returns the round trips in ns.
static std::vector<uint32_t> run_case(Region& r, const Case& c, int rounds, int warm, CpuSeen* seen, int* torn) {
    const bool ring = c.layout == "ring";
    const bool is_raw = c.size == "raw";
    const int W = is_raw ? 1 : atoi(c.size.c_str()) / 4;
    const uint32_t stride = is_raw ? 2 : (uint32_t)W;  // words per slot: 2 x payload bytes, as a channel's
    const uint32_t mask = ring ? RING - 1 : 0;
    memset(r.host + IN_AT, 0, 1u << 20);
    memset(r.host + OUT_AT, 0, 1u << 20);
    volatile uint64_t* hin = (volatile uint64_t*)(r.host + IN_AT);
    volatile uint64_t* hout = (volatile uint64_t*)(r.host + OUT_AT);
    uint64_t* din = (uint64_t*)(r.dev + IN_AT);
    uint64_t* dout = (uint64_t*)(r.dev + OUT_AT);
    const int n = rounds + warm;
    if (is_raw) {
        raw<<<1, 1>>>(din, dout, n, mask, stride);
    } else {
        const int P = (W + 31) / 32;
        switch (P) {
            case 1: llw<1><<<1, 32>>>(din, dout, n, W, mask, stride); break;
            case 2: llw<2><<<1, 32>>>(din, dout, n, W, mask, stride); break;
            case 8: llw<8><<<1, 32>>>(din, dout, n, W, mask, stride); break;
            case 32: llw<32><<<1, 32>>>(din, dout, n, W, mask, stride); break;
            default: fprintf(stderr, "size %s: no kernel for %d words\n", c.size.c_str(), W); return {};
        }
    }
    CK(cudaGetLastError());
    std::vector<uint32_t> lat;
    lat.reserve(rounds);
    const uint64_t start = now_ns();
    for (uint32_t i = 1; i <= (uint32_t)n; i++) {
        const uint64_t off = (uint64_t)(i & mask) * stride;
        uint64_t a = now_ns(), b;
        if (is_raw) {
            hin[off] = i;
            for (uint32_t s = 0; hout[off] != i;)
                if ((++s & 0xfffff) == 0) deadline_check(start, c);
            b = now_ns();
        } else {
            // The probe's host loop: write the W words in order, then wait for each echoed word's tag.
            for (int k = 0; k < W; k++) hin[off + k] = ((uint64_t)i << 32) | (uint32_t)(i * 7 + k);
            for (int k = 0; k < W; k++) {
                for (uint32_t s = 0; (uint32_t)(hout[off + k] >> 32) != i;)
                    if ((++s & 0xfffff) == 0) deadline_check(start, c);
            }
            b = now_ns();
            for (int k = 0; k < W; k++)
                if ((uint32_t)hout[off + k] != (uint32_t)(i * 7 + k)) ++*torn;
        }
        if (i > (uint32_t)warm) lat.push_back((uint32_t)std::min<uint64_t>(b - a, 0xffffffffu));
        if ((i & 1023) == 0) seen->sample();
        if (c.delay_ns) spin_until(b + c.delay_ns);
    }
    CK(cudaDeviceSynchronize());
    return lat;
}

static void info() {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    GpuPlace g = gpu_place(0);
    printf("KIT_GPU_NAME=%s\n", p.name);
    printf("KIT_GPU_BDF=%s\nKIT_GPU_NODE=%s\nKIT_GPU_CPUS=%s\n", g.bdf.c_str(), g.node.c_str(), g.cpus.c_str());
    printf("KIT_ONLINE_CPUS=%s\n", read_small("/sys/devices/system/cpu/online").c_str());
    printf("KIT_NODES=%s\n", read_small("/sys/devices/system/node/online").c_str());
    printf("KIT_THP=%s\n", read_small("/sys/kernel/mm/transparent_hugepage/enabled").c_str());
    printf("KIT_THP_SHMEM=%s\n", read_small("/sys/kernel/mm/transparent_hugepage/shmem_enabled").c_str());
    printf("KIT_HUGEPAGES=%s\n", read_small("/proc/sys/vm/nr_hugepages").c_str());
    printf("KIT_PCIE_SPEED=%s x%s\n", read_small("/sys/bus/pci/devices/" + g.bdf + "/current_link_speed").c_str(),
           read_small("/sys/bus/pci/devices/" + g.bdf + "/current_link_width").c_str());
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    printf("KIT_SM_CLOCK_KHZ=%d\n", khz);
}

int main(int argc, char** argv) {
    Args args(argc, argv);
    const int cpu = atoi(args.get("--cpu", "-1").c_str());
    if (!pin_to(cpu)) return 1;  // before CUDA starts its threads, so that they inherit it
    if (args.has("--info")) {
        info();
        return 0;
    }
    const std::string label = args.get("--label", cpu < 0 ? "unpinned" : ("cpu" + std::to_string(cpu)).c_str());
    const int rounds = atoi(args.get("--rounds", "20000").c_str());
    const int warm = atoi(args.get("--warm", "1000").c_str());
    const auto kinds = split(args.get("--kinds", "hostalloc,shm"), ',');
    const auto sizes = split(args.get("--sizes", "raw,8,64,256,1024,4096"), ',');
    const auto layouts = split(args.get("--layouts", "fixed,ring"), ',');
    const auto delays = parse_delays(args.get("--delays", "0"));
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    for (auto& kind : kinds) {
        const int k = kind_of(kind);
        Region r;
        std::string why;
        if (k < 0 || !region_open(k, REGION, &r, &why)) {
            printf("ROW|ll|%s|%s|-|-|-|SKIP %s\n", label.c_str(), kind.c_str(), k < 0 ? "unknown kind" : why.c_str());
            continue;
        }
        printf("MEM|ll|%s|%s|%s\n", label.c_str(), kind.c_str(), r.note.c_str());
        for (auto& layout : layouts)
            for (auto& size : sizes)
                for (uint32_t d : delays) {
                    Case c{label, kind, layout, size, d};
                    CpuSeen seen;
                    seen.sample();
                    int torn = 0;
                    auto lat = run_case(r, c, rounds, warm, &seen, &torn);
                    Stats s = stats_of(lat);
                    printf("ROW|ll|%s|%s|%s|%s|%u|%.3f|%.3f|%.3f|cpus=%s%s\n", label.c_str(), kind.c_str(),
                           layout.c_str(), size.c_str(), d, s.median_us, s.p99_us, s.min_us, seen.str().c_str(),
                           torn ? (" TORN=" + std::to_string(torn)).c_str() : "");
                    fflush(stdout);
                    dump_raw("ll-" + label + "-" + kind + "-" + layout + "-" + size + "-d" + std::to_string(d) + ".txt",
                             lat, "# round trip ns, host CLOCK_MONOTONIC");
                }
        region_close(&r);
    }
    cudaError_t e = cudaGetLastError();
    if (e) printf("ERROR|ll|%s\n", cudaGetErrorString(e));
    return 0;
}
