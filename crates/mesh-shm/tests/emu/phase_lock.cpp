// phase_lock.cpp: mesh.cuh's phase lock (mesh_phase_waiting / mesh_phase_took, MESH_PHASE_LOCK 1) driven
// by a model of one warp polling a host channel, with a model clock instead of the SM's, on the CPU (one
// emulated warp: the calls' shuffles are real). The model, from session 17's measurements on an H100 /
// H200 (BENCHMARKS.md): a poll reaches the host DREAD clocks after it is issued and returns POLL clocks
// after; it sees a request that landed before it reached the host. After taking one the warp sends
// (SEND), the reply lands DWRITE later, and the client's next request lands its turnaround after that
// (plus up to 99 clocks of jitter). A stream is a client whose next request is always there.
// Checks, each against the same model without the lock (ch.lock false: a poll on every call):
//   1. an immediate client: the lock takes the lost poll out (mean round trip at most 0.85x);
//   2. a stream: the wait comes down to nothing and the round trip is no longer than without;
//   3. every client turnaround from 0 to 5,000 clocks: the lock never costs more than 5% on average.
// Prints one line per case and "all passed"; exits 1 on a failed check. Built by phase_emulation.rs.
#include "warp_emu.h"

#undef mesh_clock
inline thread_local uint64_t model_now = 0;  // every lane runs the same model: lane 0's value is everyone's
#define mesh_clock() model_now
#define MESH_PHASE_LOCK 1
#include "mesh.cuh"

#include <cstdio>

constexpr uint64_t DREAD = 700, POLL = 1400, SEND = 200, DWRITE = 600, LOOP = 50;
constexpr uint64_t STREAM = ~0ull;  // a turnaround meaning "the next request is always there"

struct Outcome {
    double mean;          // the client's round trip: request landed -> reply landed, mean clocks
    double first_hits;    // messages the first poll after the previous one caught, fraction
    uint32_t wait;        // the learned wait at the end
};

// `n` round trips (after `warm`) of a client with `turnaround`, the lock on or off.
static Outcome model(bool lock, uint64_t turnaround, uint32_t warm, uint32_t n) {
    mesh_chan ch{};
    ch.lock = lock;
    model_now = 1000;
    // The next request: when a poll can see it, and when its round trip started (a stream's at the
    // previous reply: its requests wait in the ring, so its round trip is the interval between replies).
    uint64_t landed = 1000, since = 1000, sum = 0;
    uint32_t lcg = 12345, first_hits = 0, taken = 0;
    bool first = true;
    while (taken < warm + n) {
        if (mesh_phase_waiting(&ch)) {  // spinning until due: jump there
            model_now = ch.due;
            continue;
        }
        const uint64_t issue = model_now;
        model_now = issue + POLL;
        if (landed > issue + DREAD) {  // the poll reached the host before the request
            ch.empties++;
            first = false;
            model_now += LOOP;
            continue;
        }
        mesh_phase_took(&ch);
        const uint64_t reply = model_now + SEND + DWRITE;
        if (taken >= warm) {
            sum += reply - since;
            first_hits += first;
        }
        lcg = lcg * 1664525u + 1013904223u;
        landed = turnaround == STREAM ? 0 : reply + turnaround + (lcg >> 16) % 100u;
        since = turnaround == STREAM ? reply : landed;
        model_now += SEND + LOOP;
        taken++;
        first = true;
    }
    return {double(sum) / n, double(first_hits) / n, ch.wait};
}

int main() {
    bool ok = true;
    auto check = [&](bool good, const char* what) {
        if (!good) {
            printf("FAILED: %s\n", what);
            ok = false;
        }
    };
    emu_run_warp([&](uint32_t lane) {
        const bool say = lane == 0;
        // 1. An immediate client.
        const Outcome on = model(true, 250, 500, 1500), off = model(false, 250, 500, 1500);
        if (say)
            printf("immediate client: lock %.0f clocks (first poll hits %.2f, wait %u), no lock %.0f (hits %.2f)\n",
                   on.mean, on.first_hits, on.wait, off.mean, off.first_hits);
        if (say) check(on.mean <= 0.85 * off.mean, "the lock takes the lost poll out for an immediate client");
        // 2. A stream.
        const Outcome s_on = model(true, STREAM, 500, 1500), s_off = model(false, STREAM, 500, 1500);
        if (say) printf("stream: lock %.0f clocks (wait %u), no lock %.0f\n", s_on.mean, s_on.wait, s_off.mean);
        if (say) check(s_on.wait == 0, "a stream brings the wait down to nothing");
        if (say) check(s_on.mean <= s_off.mean, "a stream is no slower with the lock");
        // 3. Every turnaround.
        for (uint64_t t = 0; t <= 5000; t += t < 2000 ? 250 : 500) {
            const Outcome a = model(true, t, 500, 1500), b = model(false, t, 500, 1500);
            if (say) printf("turnaround %4llu: lock %.0f (wait %u), no lock %.0f: %.2fx\n", (unsigned long long)t, a.mean,
                            a.wait, b.mean, a.mean / b.mean);
            if (say) check(a.mean <= 1.05 * b.mean, "the lock costs at most 5% at any turnaround");
        }
    });
    if (!ok) return 1;
    printf("all passed\n");
    return 0;
}
