// kit_common.h: host helpers shared by the issue-16 measurement kit (kit_ll.cu, kit_echo.cu): timing,
// statistics, the kinds of mapped host memory compared, where their pages are, CPU pinning, raw dumps.
// A measurement tool, not a library: every failure is printed and the caller skips that case.
#pragma once
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <string>
#include <vector>

#ifndef MAP_HUGETLB
#define MAP_HUGETLB 0x40000
#endif

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

// The same clock the Rust bench's Instant::now() reads (CLOCK_MONOTONIC through the vDSO), in ns.
static inline uint64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
// Busy-waits until now_ns() >= until (the host-delay sweep: no sleep, no pause, so the thread stays hot).
static inline void spin_until(uint64_t until) {
    while (now_ns() < until) {}
}
static inline void cpu_relax() { __builtin_ia32_pause(); }

struct Stats {
    double median_us = 0, p99_us = 0, min_us = 0, p10_us = 0, p90_us = 0;
};
static inline Stats stats_of(std::vector<uint32_t> v) {
    Stats s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    s.median_us = v[v.size() / 2] / 1e3;
    s.p99_us = v[v.size() * 99 / 100] / 1e3;
    s.p10_us = v[v.size() / 10] / 1e3;
    s.p90_us = v[v.size() * 9 / 10] / 1e3;
    s.min_us = v[0] / 1e3;
    return s;
}

// Raw samples, one number a line, into RAW_DIR/<name> (RAW_DIR from the environment; none: not kept).
static inline void dump_raw(const std::string& name, const std::vector<uint32_t>& v, const char* header) {
    const char* dir = getenv("KIT_RAW_DIR");
    if (!dir || !*dir) return;
    std::string path = std::string(dir) + "/" + name;
    FILE* f = fopen(path.c_str(), "w");
    if (!f) {
        fprintf(stderr, "raw dump %s: %s\n", path.c_str(), strerror(errno));
        return;
    }
    if (header) fprintf(f, "%s\n", header);
    for (uint32_t x : v) fprintf(f, "%u\n", x);
    fclose(f);
}

static inline std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t a = 0;
    while (a <= s.size()) {
        size_t b = s.find(sep, a);
        if (b == std::string::npos) b = s.size();
        if (b > a) out.push_back(s.substr(a, b - a));
        a = b + 1;
    }
    return out;
}

static inline std::string read_small(const std::string& path) {
    FILE* f = fopen(path.c_str(), "r");
    if (!f) return "";
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// The GPU's PCI address as sysfs spells it, its NUMA node and local CPUs (empty where sysfs has none).
struct GpuPlace {
    std::string bdf, node, cpus;
};
static inline GpuPlace gpu_place(int dev) {
    GpuPlace g;
    char id[64] = {0};
    if (cudaDeviceGetPCIBusId(id, sizeof id, dev) != cudaSuccess) return g;
    unsigned dom = 0, bus = 0, slot = 0, fn = 0;
    if (sscanf(id, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) == 4) {
        char b[32];
        snprintf(b, sizeof b, "%04x:%02x:%02x.%x", dom, bus, slot, fn);
        g.bdf = b;
    } else {
        g.bdf = id;
    }
    g.node = read_small("/sys/bus/pci/devices/" + g.bdf + "/numa_node");
    g.cpus = read_small("/sys/bus/pci/devices/" + g.bdf + "/local_cpulist");
    return g;
}

// Pins the calling thread (and the threads CUDA starts later, which inherit it) to one CPU; -1: no pin.
static inline bool pin_to(int cpu) {
    if (cpu < 0) return true;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "sched_setaffinity(cpu %d): %s\n", cpu, strerror(errno));
        return false;
    }
    return true;
}

// NUMA node of the page holding `p`, as the kernel says (move_pages with no target nodes only asks);
// a negative errno where it cannot say (memory the driver maps itself, a kernel without NUMA).
static inline int node_of(const void* p) {
    void* page = (void*)((uintptr_t)p & ~(uintptr_t)4095);
    int status = -999;
    long r = syscall(SYS_move_pages, 0, 1ul, &page, nullptr, &status, 0);
    if (r != 0) return -errno;
    return status;
}

// The smaps fields that say whether the mapping holding `p` uses huge pages (kB), "?" where unreadable.
static inline std::string huge_of(const void* p) {
    FILE* f = fopen("/proc/self/smaps", "r");
    if (!f) return "smaps?";
    char line[512];
    bool in = false;
    std::string out;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            if (in) break;
            in = a >= lo && a < hi;
            if (in) {
                char rest[256] = {0};
                sscanf(line, "%*s %*s %*s %*s %*s %255[^\n]", rest);
                out += std::string("map=") + (rest[0] ? rest : "anon") + " ";
            }
            continue;
        }
        if (!in) continue;
        char key[64];
        unsigned long kb;
        if (sscanf(line, "%63[^:]: %lu kB", key, &kb) == 2) {
            std::string k(key);
            if (k == "KernelPageSize" || k == "AnonHugePages" || k == "ShmemPmdMapped" || k == "FilePmdMapped" ||
                k == "Rss")
                out += k + "=" + std::to_string(kb) + " ";
        }
    }
    fclose(f);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out.empty() ? "not-in-smaps" : out;
}

// The kinds of mapped host memory compared. `shm` is what meshd's mailbox is: a file in /dev/shm,
// set_len, mmap(MAP_SHARED) (memmap2's map_raw), then cuMemHostRegister with DEVICEMAP | PORTABLE
// (crates/mesh-cuda/src/memory.rs), here through the runtime's cudaHostRegister with the same flag bits
// (cudaHostRegisterMapped = CU_MEMHOSTREGISTER_DEVICEMAP = 2, cudaHostRegisterPortable = ..._PORTABLE = 1).
// `hostalloc` is the LL probe's cudaHostAlloc(cudaHostAllocMapped). The others each change one thing:
// shm-populate maps with MAP_POPULATE; shm-thp asks for transparent huge pages (madvise; only works where
// /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it); tmpfs-huge is the mailbox's recipe in a
// tmpfs mounted with huge=always at $KIT_HUGE_DIR (run-kit.sh mounts one); anon / anon-thp are private
// anonymous memory, registered; hugetlb is MAP_HUGETLB (needs a reserved pool: usually refused).
enum MemKind { MK_HOSTALLOC, MK_SHM, MK_SHM_POPULATE, MK_SHM_THP, MK_TMPFS_HUGE, MK_ANON, MK_ANON_THP, MK_HUGETLB, MK_COUNT };
static const char* const KIND_NAMES[MK_COUNT] = {"hostalloc", "shm",  "shm-populate", "shm-thp",
                                                  "tmpfs-huge", "anon", "anon-thp",     "hugetlb"};
static inline int kind_of(const std::string& s) {
    for (int k = 0; k < MK_COUNT; k++)
        if (s == KIND_NAMES[k]) return k;
    return -1;
}

struct Region {
    int kind = -1;
    char* host = nullptr;
    char* dev = nullptr;
    size_t len = 0;
    bool hostalloc = false, registered = false;
    std::string note;  // how it was made, where its pages are
};

static const size_t HUGE_2M = 2u << 20;

// A 2 MiB-aligned address range of `len` bytes, reserved (PROT_NONE), for a MAP_FIXED mapping over it:
// huge pages need the range aligned.
static inline void* reserve_aligned(size_t len) {
    void* r = mmap(nullptr, len + HUGE_2M, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return nullptr;
    uintptr_t a = ((uintptr_t)r + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1);
    if (a > (uintptr_t)r) munmap(r, a - (uintptr_t)r);
    uintptr_t end = (uintptr_t)r + len + HUGE_2M;
    if (end > a + len) munmap((void*)(a + len), end - (a + len));
    return (void*)a;
}

// Makes a region of `len` bytes (a multiple of 2 MiB) of kind `k`, zeroed and mapped for the GPU.
// False (with `why`) when this machine cannot make that kind; the caller skips it.
static inline bool region_open(int k, size_t len, Region* r, std::string* why) {
    static int counter = 0;
    r->kind = k;
    r->len = len;
    if (k == MK_HOSTALLOC) {
        void* p = nullptr;
        cudaError_t e = cudaHostAlloc(&p, len, cudaHostAllocMapped);
        if (e != cudaSuccess) {
            *why = std::string("cudaHostAlloc: ") + cudaGetErrorString(e);
            return false;
        }
        memset(p, 0, len);
        r->host = (char*)p;
        r->hostalloc = true;
    } else {
        // Huge pages need a 2 MiB-aligned range; the mailbox's own kinds take the address the kernel
        // picks, as memmap2 does.
        const bool aligned = k == MK_SHM_THP || k == MK_TMPFS_HUGE || k == MK_ANON_THP;
        void* at = aligned ? reserve_aligned(len) : nullptr;
        if (aligned && !at) {
            *why = std::string("reserve: ") + strerror(errno);
            return false;
        }
        const int fixed = aligned ? MAP_FIXED : 0;
        void* p = MAP_FAILED;
        if (k == MK_SHM || k == MK_SHM_POPULATE || k == MK_SHM_THP || k == MK_TMPFS_HUGE) {
            const char* dir = "/dev/shm";
            if (k == MK_TMPFS_HUGE) {
                dir = getenv("KIT_HUGE_DIR");
                if (!dir || !*dir) {
                    *why = "no KIT_HUGE_DIR (a tmpfs mounted with huge=always)";
                    if (at) munmap(at, len);
                    return false;
                }
            }
            char path[256];
            snprintf(path, sizeof path, "%s/mesh-kit.%d.%d", dir, (int)getpid(), counter++);
            int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
            if (fd < 0) {
                *why = std::string("open ") + path + ": " + strerror(errno);
                return false;
            }
            // The file is unlinked at once: the mapping keeps it, and a killed run leaves nothing behind.
            unlink(path);
            if (ftruncate(fd, (off_t)len) != 0) {
                *why = std::string("ftruncate: ") + strerror(errno);
                close(fd);
                return false;
            }
            int flags = MAP_SHARED | fixed | (k == MK_SHM_POPULATE ? MAP_POPULATE : 0);
            p = mmap(at, len, PROT_READ | PROT_WRITE, flags, fd, 0);
            close(fd);
        } else if (k == MK_ANON || k == MK_ANON_THP) {
            p = mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | fixed, -1, 0);
        } else if (k == MK_HUGETLB) {
            p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        }
        if (p == MAP_FAILED) {
            *why = std::string("mmap: ") + strerror(errno);
            return false;
        }
        if (k == MK_SHM_THP || k == MK_ANON_THP) {
            if (madvise(p, len, MADV_HUGEPAGE) != 0) r->note += std::string("madvise(HUGEPAGE): ") + strerror(errno) + "; ";
        }
        // shm: not touched before registration, like the mailbox (only its header page is written
        // before meshd registers it); the registration pins, and so allocates, every page.
        if (k != MK_SHM && k != MK_SHM_POPULATE && k != MK_TMPFS_HUGE) memset(p, 0, len);
        cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterMapped | cudaHostRegisterPortable);
        if (e != cudaSuccess) {
            *why = std::string("cudaHostRegister: ") + cudaGetErrorString(e);
            cudaGetLastError();
            munmap(p, len);
            return false;
        }
        memset(p, 0, len);
        r->host = (char*)p;
        r->registered = true;
    }
    void* d = nullptr;
    cudaError_t e = cudaHostGetDevicePointer(&d, r->host, 0);
    if (e != cudaSuccess) {
        *why = std::string("cudaHostGetDevicePointer: ") + cudaGetErrorString(e);
        return false;
    }
    r->dev = (char*)d;
    int n0 = node_of(r->host), n1 = node_of(r->host + len / 2);
    r->note += "node=" + std::to_string(n0) + "," + std::to_string(n1) + " " + huge_of(r->host);
    return true;
}

static inline void region_close(Region* r) {
    if (!r->host) return;
    if (r->hostalloc) {
        cudaFreeHost(r->host);
    } else {
        if (r->registered) cudaHostUnregister(r->host);
        munmap(r->host, r->len);
    }
    r->host = r->dev = nullptr;
}

// Which CPUs the thread ran on during a measurement (sampled), as a short list.
struct CpuSeen {
    uint64_t mask[4] = {0, 0, 0, 0};
    void sample() {
        int c = sched_getcpu();
        if (c >= 0 && c < 256) mask[c / 64] |= 1ull << (c % 64);
    }
    std::string str() const {
        std::string s;
        for (int c = 0; c < 256; c++)
            if (mask[c / 64] >> (c % 64) & 1) s += (s.empty() ? "" : "+") + std::to_string(c);
        return s.empty() ? "?" : s;
    }
};

// Shared command-line parsing: --key value pairs.
struct Args {
    std::vector<std::string> v;
    Args(int argc, char** argv) : v(argv + 1, argv + argc) {}
    std::string get(const char* key, const char* dflt) const {
        for (size_t i = 0; i + 1 < v.size(); i++)
            if (v[i] == key) return v[i + 1];
        return dflt;
    }
    bool has(const char* key) const {
        for (auto& s : v)
            if (s == key) return true;
        return false;
    }
};

// The delays of the host-delay sweep, ns: "0:1600:100" or a comma list.
static inline std::vector<uint32_t> parse_delays(const std::string& s) {
    std::vector<uint32_t> d;
    unsigned a, b, step;
    if (sscanf(s.c_str(), "%u:%u:%u", &a, &b, &step) == 3 && step > 0) {
        for (unsigned x = a; x <= b; x += step) d.push_back(x);
    } else {
        for (auto& t : split(s, ',')) d.push_back((uint32_t)atoi(t.c_str()));
    }
    return d;
}
