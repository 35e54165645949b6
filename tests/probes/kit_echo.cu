// kit_echo.cu: issue 16 item 1's timeline: the echo of mesh.cuh's opening comment (tests/programs/echo_header.cu)
// in a standalone process, over a hand-made mailbox (the slot and ring offsets meshd's Mailbox gives, in
// the host memory kinds of kit_common.h), driven by a C++ port of mesh-shm's host client, so that one
// process holds the whole exchange and both clocks. Variants of the GPU side:
//   ptx   the committed tests/programs/echo_header.ptx, loaded by the driver (what meshd runs, bar the JIT)
//   kit   echo_header.cu's loop compiled here (must match ptx, or the other rows do not transfer)
//   timed the same loop with clock64 reads around each call: per message, empty polls before it, the
//         successful poll's duration, the send's, the last empty poll's, the poll period, the idle time
//         from the previous reply; plus the chained load latency of host and device memory (calibration)
// and of the host side:
//   mesh  mesh-shm's Producer::try_send / Consumer::try_recv as the bench drives them (first word
//         written last, first and last word read first, `pause` in the receive spin, every reply checked)
//   probe the LL probe's host loop over the same ring (words written in order, each reply word spun on)
// --delays spins that many ns on the host after each reply, before the next request (the sweep).
// --ptx FILE --ptx-block N: the ptx variant loads FILE (default tests/programs/echo_header.ptx) and launches
// it with N threads (default 32; echo_x_pollers needs 32 * (POLLERS + 1): run-kit.sh pollers).
// --hist 0 leaves out the timeline's histograms (its summary lines stay), --csv 0 its per-message CSV.
// Build: nvcc -O3 -arch=sm_90 -std=c++17 -I crates/mesh-shm/include -o kit_echo kit_echo.cu
// Run: tests/probes/run-kit.sh. Prints "ROW|echo|..." and "TL|..." lines, histograms ("HIST|"), raw data
// under $KIT_RAW_DIR. A measurement tool: not yet run on a GPU as written (2026-12-03).
#include "kit_common.h"
#include "kit_ring.h"
#include "mesh.cuh"

// ---- GPU side ----------------------------------------------------------------------------------

// echo_header.cu's body, unchanged.
__global__ void echo_kit(mesh_ctx ctx) {
    __shared__ uint32_t buf[1024];                    // one message, up to 4 KiB
    if (threadIdx.x >= 32) return;                    // one warp serves the channels
    if (threadIdx.x == 0) mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    while (!mesh_should_stop(ctx)) {
        if (mesh_chan_room(&out) > 0 && mesh_warp_try_recv(&in, buf)) mesh_warp_try_send(&out, buf);
    }
    mesh_chan_close(&in);                             // exact positions for the next launch
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}

// One record per message received, SM cycles (clock64) unless said.
struct Rec {
    uint32_t empties;     // empty polls since the previous message
    uint32_t poll_ok;     // the successful mesh_warp_try_recv: issue to return (its loads' latency + copy)
    uint32_t send;        // mesh_warp_try_send: call to return (stores issued, not arrived)
    uint32_t last_empty;  // the last empty poll before it: issue to return (≈ one load's latency + decision)
    uint32_t period;      // start of the previous poll to the start of this one (the poll period as lived)
    uint32_t idle;        // previous reply's sends issued to this poll's start (host turnaround + waiting)
    uint32_t top;         // loop top (mesh_should_stop, mesh_chan_room) before this poll
    uint32_t gt_lo;       // %globaltimer (ns) at the reply, low 32 bits
};
static_assert(sizeof(Rec) == 32, "Rec is one 32-byte record");

// Calibration words written by echo_timed: clock64 and %globaltimer at start and end, chained load
// latency (cycles for CHAIN loads) of host memory and of device memory, messages, partial polls.
enum { CAL_C0, CAL_G0, CAL_C1, CAL_G1, CAL_HOSTCHAIN, CAL_DEVCHAIN, CAL_N, CAL_PARTIAL, CAL_WORDS };
static const int CHAIN = 256;

static __device__ __forceinline__ uint64_t clk() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}

// Cycles for CHAIN dependent loads starting at p (each address depends on the last value, zero here).
static __device__ uint64_t chain(const volatile uint64_t* p) {
    uint64_t v = 0;
    const uint64_t t0 = clk();
    for (int j = 0; j < CHAIN; j++) v = mesh_ld_volatile_u64(p + (v & 1));
    // A store of v before the clock read: the read cannot issue before the last load has landed.
    *(volatile uint64_t*)(p + 2) = v;
    return clk() - t0;
}

// echo_header's loop, the && split so that each call is timed; lane 0 writes the records.
__global__ void echo_timed(mesh_ctx ctx, Rec* rec, uint32_t max, uint64_t* cal, uint64_t* scratch) {
    __shared__ uint32_t buf[1024];
    if (threadIdx.x >= 32) return;
    const bool lead = threadIdx.x == 0;
    const uint64_t c0 = clk(), g0 = mesh_globaltimer();
    if (lead) mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    if (lead) {
        // Before the host sends anything: the user words (host memory, untouched by the exchange).
        cal[CAL_HOSTCHAIN] = chain((const volatile uint64_t*)mesh_slot_at(ctx, MESH_SLOT_USER + 64));
        cal[CAL_DEVCHAIN] = chain(scratch);
        mesh_user_store(ctx, 0, 1);  // ready: the host starts now
    }
    __syncwarp();
    uint32_t n = 0, empties = 0, last_empty = 0;
    uint64_t t_reply = clk(), t_prev = t_reply;
    while (!mesh_should_stop(ctx)) {
        const uint64_t ta = clk();
        if (mesh_chan_room(&out) > 0) {
            const uint64_t tb = clk();
            const bool got = mesh_warp_try_recv(&in, buf);
            const uint64_t tc = clk();
            if (got) {
                mesh_warp_try_send(&out, buf);
                const uint64_t td = clk();
                if (lead && n < max) {
                    Rec r;
                    r.empties = empties;
                    r.poll_ok = (uint32_t)(tc - tb);
                    r.send = (uint32_t)(td - tc);
                    r.last_empty = last_empty;
                    r.period = (uint32_t)(tb - t_prev);
                    r.idle = (uint32_t)(tb - t_reply);
                    r.top = (uint32_t)(tb - ta);
                    r.gt_lo = (uint32_t)mesh_globaltimer();
                    rec[n] = r;
                }
                n++;
                empties = 0;
                t_reply = td;
            } else {
                empties++;
                last_empty = (uint32_t)(tc - tb);
            }
            t_prev = tb;
        }
    }
    mesh_chan_close(&in);
    mesh_chan_close(&out);
    if (lead) {
        cal[CAL_C0] = c0;
        cal[CAL_G0] = g0;
        cal[CAL_C1] = clk();
        cal[CAL_G1] = mesh_globaltimer();
        cal[CAL_N] = n;
        cal[CAL_PARTIAL] = in.partial;
        mesh_end(ctx);
    }
}

// ---- The mailbox, as mesh-shm lays it out (a 64 MiB mailbox of 64 slots and 256 channels) ----------

static const size_t MB_SIZE = 64u << 20;
static const uint64_t SLOT0 = 4096;      // HEADER_SIZE: program slot 0
static const uint64_t ARENA = 61440;     // 4096 + 64 * 384 + 256 * 128, rounded up to a page
static uint64_t up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

struct Layout {
    uint64_t in_ring, in_slots, out_ring, out_slots;
};
static Layout layout_for(uint32_t msg) {
    Layout l;
    l.in_ring = ARENA;
    l.in_slots = up(l.in_ring + MESH_RING_SLOTS, 4096);  // host_slots_offset
    l.out_ring = up(l.in_slots + 2ull * msg * CAP, 128);
    l.out_slots = up(l.out_ring + MESH_RING_SLOTS, 4096);
    return l;
}

static inline uint32_t payload_of(uint64_t seq, uint32_t k) { return (uint32_t)(seq * 2654435761u) ^ (k * 40503u); }

// ---- One case ------------------------------------------------------------------------------------

struct Case {
    std::string label, kind, variant, hostloop;
    uint32_t size, delay_ns;
};
struct Result {
    std::vector<uint32_t> rtt;  // host round trips, ns, after the warm-up
    std::vector<Rec> recs;      // timed: one per message, warm-up included
    uint64_t cal[CAL_WORDS] = {0};
    int bad = 0;                // replies that were not the message sent
    std::string error;
};

static cudaKernel_t g_ptx_kernel = nullptr;  // echo_header.ptx's mesh_main, loaded once
static unsigned g_ptx_block = 32;             // --ptx-block: threads of its block (echo_x_pollers: 32 * (K + 1))

static bool wait_word(volatile uint32_t* p, uint32_t want, double seconds) {
    const uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    while (*p != want)
        if (now_ns() > end) return false;
    return true;
}

static Result run_case(Region& r, const Case& c, int rounds, int warm, CpuSeen* seen, Rec* drec, uint64_t* dcal,
                       uint64_t* dscratch) {
    Result res;
    const Layout l = layout_for(c.size);
    const uint32_t words = c.size / 4;
    memset(r.host + SLOT0, 0, MESH_SLOT_SIZE);
    memset(r.host + ARENA, 0, l.out_slots + 2ull * c.size * CAP - ARENA);
    mesh_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.base = (uint64_t)(uintptr_t)r.dev;
    ctx.slot_offset = SLOT0;
    ctx.slot = 0;
    ctx.binding_count = 2;
    ctx.bindings[0] = {l.in_ring, ctx.base + l.in_slots, c.size, CAP, MESH_PLACEMENT_HOST, 0};
    ctx.bindings[1] = {l.out_ring, ctx.base + l.out_slots, c.size, CAP, MESH_PLACEMENT_HOST, 0};
    const int n = rounds + warm;
    if (c.variant == "ptx") {
        void* params[] = {&ctx};
        cudaError_t e = cudaLaunchKernel((const void*)g_ptx_kernel, dim3(1), dim3(g_ptx_block), params, 0, 0);
        if (e != cudaSuccess) {
            res.error = std::string("launch: ") + cudaGetErrorString(e);
            return res;
        }
    } else if (c.variant == "kit") {
        echo_kit<<<1, 32>>>(ctx);
    } else {
        CK(cudaMemset(drec, 0, sizeof(Rec) * n));
        echo_timed<<<1, 32>>>(ctx, drec, (uint32_t)n, dcal, dscratch);
    }
    CK(cudaGetLastError());
    char* slot = r.host + SLOT0;
    volatile uint32_t* stop = (volatile uint32_t*)(slot + MESH_SLOT_STOP);
    volatile uint32_t* state = (volatile uint32_t*)(slot + MESH_SLOT_STATE);
    volatile uint32_t* ready = (volatile uint32_t*)(slot + MESH_SLOT_USER);
    if (!wait_word(state, MESH_STATE_RUNNING, 10) || (c.variant == "timed" && !wait_word(ready, 1, 10))) {
        res.error = "the kernel did not start within 10 s";
        *stop = 1;
        cudaDeviceSynchronize();
        return res;
    }
    HostProducer tx{(uint64_t*)(r.host + l.in_ring + MESH_RING_HEAD), (uint64_t*)(r.host + l.in_ring + MESH_RING_TAIL),
                    (uint64_t*)(r.host + l.in_slots), words};
    HostConsumer rx{(uint64_t*)(r.host + l.out_ring + MESH_RING_TAIL), (uint64_t*)(r.host + l.out_slots), words};
    uint64_t* in_slots = (uint64_t*)(r.host + l.in_slots);
    uint64_t* out_slots = (uint64_t*)(r.host + l.out_slots);
    std::vector<uint32_t> msg(words), back(words);
    res.rtt.reserve(rounds);
    const bool mesh = c.hostloop == "mesh";
    const uint64_t start = now_ns();
    for (uint64_t i = 0; i < (uint64_t)n && res.error.empty(); i++) {
        for (uint32_t k = 0; k < words; k++) msg[k] = payload_of(i, k);
        const uint64_t a = now_ns();
        uint64_t b;
        if (mesh) {
            for (uint32_t s = 1; !tx.try_send(msg.data()); s++)
                if ((s & 0xfffff) == 0 && now_ns() - start > 20000000000ull) {
                    res.error = "no credit for 20 s";
                    break;
                }
            for (uint32_t s = 1; !rx.try_recv(back.data()); s++) {
                cpu_relax();  // std::hint::spin_loop(), as the bench's client
                if ((s & 0xfffff) == 0 && now_ns() - start > 20000000000ull) res.error = "no reply for 20 s";
                if (!res.error.empty()) break;
            }
            b = now_ns();
        } else {
            // The probe's host loop over the same ring: words in order, then each reply word spun on.
            // No credit check: requests and replies alternate, so the slot is long free.
            uint64_t* w = in_slots + (i & (CAP - 1)) * words;
            for (uint32_t k = 0; k < words; k++) st_relaxed(w + k, word_of(i, msg[k]));
            st_release(tx.head_line, i + 1);
            const uint64_t* o = out_slots + (i & (CAP - 1)) * words;
            const uint32_t t = tag_of(i);
            for (uint32_t k = 0; k < words && res.error.empty(); k++)
                for (uint32_t s = 1; (uint32_t)(ld_relaxed(o + k) >> 32) != t; s++)
                    if ((s & 0xfffff) == 0 && now_ns() - start > 20000000000ull) {
                        res.error = "no reply for 20 s";
                        break;
                    }
            b = now_ns();
            for (uint32_t k = 0; k < words; k++) back[k] = (uint32_t)ld_relaxed(o + k);
            st_release(rx.tail_line, i + 1);
        }
        for (uint32_t k = 0; k < words; k++)
            if (back[k] != msg[k]) {
                res.bad++;
                break;
            }
        if (i >= (uint64_t)warm) res.rtt.push_back((uint32_t)std::min<uint64_t>(b - a, 0xffffffffu));
        if ((i & 1023) == 0) seen->sample();
        if (c.delay_ns) spin_until(b + c.delay_ns);
    }
    *stop = 1;
    if (!res.error.empty()) {
        // The kernel still stops: it reads the stop word every MESH_STOP_PERIOD_NS.
        cudaDeviceSynchronize();
        return res;
    }
    CK(cudaDeviceSynchronize());
    if (*state != MESH_STATE_STOPPED) res.error = "the kernel ended without mesh_end";
    if (c.variant == "timed") {
        res.recs.resize(n);
        CK(cudaMemcpy(res.recs.data(), drec, sizeof(Rec) * n, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(res.cal, dcal, sizeof res.cal, cudaMemcpyDeviceToHost));
    }
    return res;
}

// ---- Reporting the timeline ------------------------------------------------------------------------

static void percentiles(const char* what, std::vector<double> v, std::string* out) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    char b[160];
    snprintf(b, sizeof b, "%s p10/50/90/99 %.0f/%.0f/%.0f/%.0f", what, v[v.size() / 10], v[v.size() / 2],
             v[v.size() * 9 / 10], v[v.size() * 99 / 100]);
    *out += b;
}

// A histogram in `bucket`-ns buckets up to `top` (the rest in the last), one line per bucket.
static void histogram(const std::string& head, const std::vector<double>& v, double bucket, double top) {
    const int nb = (int)(top / bucket) + 1;
    std::vector<int> h(nb, 0);
    for (double x : v) h[std::min(nb - 1, std::max(0, (int)(x / bucket)))]++;
    int most = *std::max_element(h.begin(), h.end());
    for (int b = 0; b < nb; b++) {
        if (h[b] == 0) continue;
        int bar = most ? (int)(50.0 * h[b] / most + 0.5) : 0;
        printf("HIST|%s|%s%5.0f|%6d|%s\n", head.c_str(), b == nb - 1 ? ">=" : "  ", b * bucket, h[b],
               std::string(bar, '#').c_str());
    }
}

static void timeline(const Case& c, const Result& res, int warm, bool hist, bool csv) {
    const uint64_t* cal = res.cal;
    const double ns_per_cyc = cal[CAL_C1] > cal[CAL_C0] ? (double)(cal[CAL_G1] - cal[CAL_G0]) / (cal[CAL_C1] - cal[CAL_C0]) : 0;
    std::string head = c.label + "|" + c.kind + "|" + std::to_string(c.size) + "|" + c.hostloop + "|d" + std::to_string(c.delay_ns);
    std::vector<double> empties, poll_ok, send, last_empty, period, idle, top;
    std::vector<double> rtt_by_empties[4];
    for (size_t i = warm; i < res.recs.size(); i++) {
        const Rec& r = res.recs[i];
        empties.push_back(r.empties);
        poll_ok.push_back(r.poll_ok * ns_per_cyc);
        send.push_back(r.send * ns_per_cyc);
        if (r.empties) last_empty.push_back(r.last_empty * ns_per_cyc);
        period.push_back(r.period * ns_per_cyc);
        idle.push_back(r.idle * ns_per_cyc);
        top.push_back(r.top * ns_per_cyc);
        if (i - warm < res.rtt.size()) rtt_by_empties[std::min<uint32_t>(r.empties, 3)].push_back(res.rtt[i - warm]);
    }
    const double clock_ghz = ns_per_cyc > 0 ? 1.0 / ns_per_cyc : 0;
    printf("TLCAL|%s|sm_clock_ghz=%.3f messages=%lu partial_polls=%lu host_load_ns=%.0f dev_load_ns=%.0f\n", head.c_str(),
           clock_ghz, (unsigned long)cal[CAL_N], (unsigned long)cal[CAL_PARTIAL],
           cal[CAL_HOSTCHAIN] * ns_per_cyc / CHAIN, cal[CAL_DEVCHAIN] * ns_per_cyc / CHAIN);
    std::string line;
    percentiles("empties", empties, &line);
    line += " | ";
    percentiles("last_empty_ns", last_empty, &line);
    line += " | ";
    percentiles("period_ns", period, &line);
    line += " | ";
    percentiles("poll_ok_ns", poll_ok, &line);
    line += " | ";
    percentiles("send_ns", send, &line);
    line += " | ";
    percentiles("idle_ns", idle, &line);
    line += " | ";
    percentiles("top_ns", top, &line);
    printf("TLPCT|%s|%s\n", head.c_str(), line.c_str());
    std::string by;
    for (int e = 0; e < 4; e++) {
        std::vector<uint32_t> v;
        for (double x : rtt_by_empties[e]) v.push_back((uint32_t)x);
        Stats s = stats_of(v);
        char b[96];
        snprintf(b, sizeof b, "%s%d empties: n=%zu rtt_median_us=%.2f", e ? "; " : "", e, v.size(), s.median_us);
        by += b;
        if (e == 3) by += " (3 = 3 or more)";
    }
    printf("TLRTT|%s|%s\n", head.c_str(), by.c_str());
    if (hist) {
        std::vector<int> h(12, 0);
        for (double x : empties) h[std::min(11, (int)x)]++;
        for (int b = 0; b < 12; b++)
            if (h[b]) printf("HIST|%s|empty polls per message|%s%2d|%6d\n", head.c_str(), b == 11 ? ">=" : "  ", b, h[b]);
        histogram(head + "|last empty poll ns (load latency + decision)", last_empty, 100, 3000);
        histogram(head + "|poll period ns (poll start to poll start)", period, 100, 3000);
        histogram(head + "|successful poll ns (data to return)", poll_ok, 100, 3000);
        histogram(head + "|send ns (data to reply issued)", send, 50, 1500);
        histogram(head + "|idle ns (reply issued to the successful poll's start)", idle, 200, 8000);
    }
    const Stats pok = stats_of(std::vector<uint32_t>(poll_ok.begin(), poll_ok.end()));
    const Stats per = stats_of(std::vector<uint32_t>(period.begin(), period.end()));
    const Stats le = stats_of(std::vector<uint32_t>(last_empty.begin(), last_empty.end()));
    const Stats snd = stats_of(std::vector<uint32_t>(send.begin(), send.end()));
    const Stats idl = stats_of(std::vector<uint32_t>(idle.begin(), idle.end()));
    double mean_empties = 0;
    for (double x : empties) mean_empties += x;
    mean_empties /= empties.empty() ? 1 : empties.size();
    printf("TL|%s|%.2f|%.0f|%.0f|%.0f|%.0f|%.0f|%.0f|%lu\n", head.c_str(), mean_empties, le.median_us * 1e3,
           per.median_us * 1e3, pok.median_us * 1e3, snd.median_us * 1e3, idl.median_us * 1e3,
           cal[CAL_HOSTCHAIN] * ns_per_cyc / CHAIN, (unsigned long)cal[CAL_PARTIAL]);
    // Raw records with the host's round trip beside each, for whoever wants the joint distribution.
    const char* dir = getenv("KIT_RAW_DIR");
    if (csv && dir && *dir) {
        std::string path = std::string(dir) + "/timeline-" + c.label + "-" + c.kind + "-" + std::to_string(c.size) + "-" +
                           c.hostloop + "-d" + std::to_string(c.delay_ns) + ".csv";
        FILE* f = fopen(path.c_str(), "w");
        if (f) {
            fprintf(f, "# ns_per_cycle=%.6f warm=%d host_chain_cycles=%lu dev_chain_cycles=%lu chain=%d\n", ns_per_cyc, warm,
                    (unsigned long)cal[CAL_HOSTCHAIN], (unsigned long)cal[CAL_DEVCHAIN], CHAIN);
            fprintf(f, "msg,empties,poll_ok_cyc,send_cyc,last_empty_cyc,period_cyc,idle_cyc,top_cyc,gt_lo,rtt_ns\n");
            for (size_t i = 0; i < res.recs.size(); i++) {
                const Rec& r = res.recs[i];
                fprintf(f, "%zu,%u,%u,%u,%u,%u,%u,%u,%u,%d\n", i, r.empties, r.poll_ok, r.send, r.last_empty, r.period,
                        r.idle, r.top, r.gt_lo, i >= (size_t)warm && i - warm < res.rtt.size() ? (int)res.rtt[i - warm] : -1);
            }
            fclose(f);
        }
    }
}

int main(int argc, char** argv) {
    Args args(argc, argv);
    const int cpu = atoi(args.get("--cpu", "-1").c_str());
    if (!pin_to(cpu)) return 1;
    const std::string label = args.get("--label", cpu < 0 ? "unpinned" : ("cpu" + std::to_string(cpu)).c_str());
    const int rounds = atoi(args.get("--rounds", "20000").c_str());
    const int warm = atoi(args.get("--warm", "1000").c_str());
    const auto kinds = split(args.get("--kinds", "hostalloc,shm"), ',');
    const auto variants = split(args.get("--variants", "ptx,kit,timed"), ',');
    const auto hostloops = split(args.get("--hostloops", "mesh"), ',');
    const auto sizes = split(args.get("--sizes", "8,64,256,1024,4096"), ',');
    const auto delays = parse_delays(args.get("--delays", "0"));
    const std::string ptx = args.get("--ptx", "tests/programs/echo_header.ptx");
    g_ptx_block = (unsigned)atoi(args.get("--ptx-block", "32").c_str());
    const bool hist = args.get("--hist", "1") == "1", csv = args.get("--csv", "1") == "1";
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    std::string ptx_error;
    for (auto& v : variants)
        if (v == "ptx" && !g_ptx_kernel) {
            cudaLibrary_t lib;
            cudaError_t e = cudaLibraryLoadFromFile(&lib, ptx.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0);
            if (e == cudaSuccess) e = cudaLibraryGetKernel(&g_ptx_kernel, lib, "mesh_main");
            if (e != cudaSuccess) {
                ptx_error = std::string("load ") + ptx + ": " + cudaGetErrorString(e);
                cudaGetLastError();
                g_ptx_kernel = nullptr;
            }
        }
    const int n = rounds + warm;
    Rec* drec = nullptr;
    uint64_t *dcal = nullptr, *dscratch = nullptr;
    CK(cudaMalloc(&drec, sizeof(Rec) * n));
    CK(cudaMalloc(&dcal, sizeof(uint64_t) * CAL_WORDS));
    CK(cudaMalloc(&dscratch, 4096));
    CK(cudaMemset(dscratch, 0, 4096));
    for (auto& kind : kinds) {
        const int k = kind_of(kind);
        Region r;
        std::string why;
        if (k < 0 || !region_open(k, MB_SIZE, &r, &why)) {
            printf("ROW|echo|%s|%s|-|-|-|-|SKIP %s\n", label.c_str(), kind.c_str(), k < 0 ? "unknown kind" : why.c_str());
            continue;
        }
        printf("MEM|echo|%s|%s|%s\n", label.c_str(), kind.c_str(), r.note.c_str());
        for (auto& variant : variants) {
            if (variant == "ptx" && !g_ptx_kernel) {
                printf("ROW|echo|%s|%s|ptx|-|-|-|SKIP %s\n", label.c_str(), kind.c_str(), ptx_error.c_str());
                continue;
            }
            for (auto& hostloop : hostloops)
                for (auto& size : sizes)
                    for (uint32_t d : delays) {
                        Case c{label, kind, variant, hostloop, (uint32_t)atoi(size.c_str()), d};
                        if (c.size < 8 || c.size > 4096 || c.size % 8) {
                            printf("ROW|echo|%s|%s|%s|%s|%s|%u|SKIP size must be 8..4096, a multiple of 8\n",
                                   label.c_str(), kind.c_str(), variant.c_str(), hostloop.c_str(), size.c_str(), d);
                            continue;
                        }
                        CpuSeen seen;
                        seen.sample();
                        Result res = run_case(r, c, rounds, warm, &seen, drec, dcal, dscratch);
                        if (!res.error.empty()) {
                            printf("ROW|echo|%s|%s|%s|%s|%u|%u|ERROR %s\n", label.c_str(), kind.c_str(), variant.c_str(),
                                   hostloop.c_str(), c.size, d, res.error.c_str());
                            fflush(stdout);
                            continue;
                        }
                        Stats s = stats_of(res.rtt);
                        printf("ROW|echo|%s|%s|%s|%s|%u|%u|%.3f|%.3f|%.3f|cpus=%s%s\n", label.c_str(), kind.c_str(),
                               variant.c_str(), hostloop.c_str(), c.size, d, s.median_us, s.p99_us, s.min_us,
                               seen.str().c_str(), res.bad ? (" BAD=" + std::to_string(res.bad)).c_str() : "");
                        dump_raw("echo-" + label + "-" + kind + "-" + variant + "-" + hostloop + "-" + size + "-d" +
                                     std::to_string(d) + ".txt",
                                 res.rtt, "# round trip ns, host CLOCK_MONOTONIC");
                        if (variant == "timed") timeline(c, res, warm, hist, csv);
                        fflush(stdout);
                    }
        }
        region_close(&r);
    }
    cudaError_t e = cudaGetLastError();
    if (e) printf("ERROR|echo|%s\n", cudaGetErrorString(e));
    return 0;
}
