// ll_channels.cpp: an echo program of tests/programs (PROGRAM: echo_header.cu, echo_warp.cu, or echo.cu
// with EMU_ONE_THREAD) run whole on the CPU
// (warp_emu.h) against two LL channels laid out as mesh-shm lays them out (a ring header with head /
// tail lines, the slots in their own page-aligned region, each message msg_size * MESH_RING_WIRE_FACTOR
// bytes of (tag << 32 | payload) words). A driver thread plays the host: it sends numbered messages
// following ring.rs's producer (room from the published tail, the first pair written last, head
// published), or torn (one word held back ~300 us, so the receiver catches a message half-arrived),
// reads every echo following ring.rs's consumer (every word's tag and value, in order, tail published),
// asks the program to stop half way with messages in flight, and again at the end. Between the two
// launches on the same memory, and after the second, main checks the slot (STOPPED, exit code 0,
// heartbeat rising) and the published positions (exact: what was consumed was echoed, nothing written
// past the published head). Built and run by tests/ll_emulation.rs, e.g. `g++ -std=c++20 -O1 -pthread
// -I ../../include -I ../../../../tests/programs -DPROGRAM='"echo_header.cu"' ll_channels.cpp -o ll &&
// ./ll`.
#include "warp_emu.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

// The warp's loads of a ring's index lines (the out ring's tail, read by mesh_chan_room on every lane)
// as one load per warp: a converged warp's load instruction fetches one value for all its lanes (the
// header relies on it: mesh_warp_try_send's "every lane reads the same tail"), while warp_emu.h's
// lanes load each for itself and, with the driver publishing the tail meanwhile, disagree on the room
// and pass different `max` to mesh_warp_try_recv_batch: the emulation's lanes then fall apart, not the
// GPU's. The n-th load of a watched word by every lane returns one value, read by the first lane there.
uint64_t ll_warp_ld_u64(const volatile void* p);
#define mesh_detail_ld_volatile_u64 ll_warp_ld_u64

#include PROGRAM

namespace {

#ifdef EMU_ONE_THREAD
constexpr bool kOneThread = true;
#else
constexpr bool kOneThread = false;
#endif

constexpr uint32_t kLockstepWindow = 4096;  // loads a lane may run ahead of the slowest
struct LockstepWord {
    const void* addr = nullptr;
    std::mutex m;
    uint64_t made = 0;
    uint64_t count[32] = {};
    uint64_t vals[kLockstepWindow] = {};
};
LockstepWord lockstep[4];

void lockstep_watch(const void* const (&addrs)[4]) {
    for (uint32_t i = 0; i < 4; i++) {
        std::lock_guard<std::mutex> g(lockstep[i].m);
        lockstep[i].addr = kOneThread ? nullptr : addrs[i];  // one thread: nobody to agree with
        lockstep[i].made = 0;
        for (auto& c : lockstep[i].count) c = 0;
    }
}

}  // namespace

uint64_t ll_warp_ld_u64(const volatile void* p) {
    LockstepWord* w = nullptr;
    for (auto& l : lockstep)
        if (l.addr == (const void*)p) w = &l;
    if (w == nullptr) return emu_ld(p);
    for (;;) {
        {
            std::lock_guard<std::mutex> g(w->m);
            const uint64_t n = w->count[emu_lane];
            if (n < w->made) {
                w->count[emu_lane]++;
                return w->vals[n % kLockstepWindow];
            }
            uint64_t lo = n;
            for (uint64_t c : w->count) lo = c < lo ? c : lo;
            if (n - lo < kLockstepWindow) {
                const uint64_t v = emu_ld(p);
                w->vals[n % kLockstepWindow] = v;
                w->made++;
                w->count[emu_lane]++;
                return v;
            }
        }
        std::this_thread::yield();  // a lane this far behind needs no barrier to catch up
    }
}

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSlot = 512;      // the program's slot
constexpr uint64_t kInRing = 4096;   // ring headers (head / tail lines)
constexpr uint64_t kOutRing = 8192;
constexpr uint64_t kInSlots = 16384; // the slots regions, page aligned as layout.rs places them

struct Config {
    uint32_t msg, capacity, count;
    bool torn;
};

std::vector<uint64_t> memory;
char* base;
int failures;
const char* scenario = "";

void fail(const char* what, long a = 0, long b = 0) {
    if (failures++ < 30) std::fprintf(stderr, "FAIL (%s, %s): %s [%ld, %ld]\n", PROGRAM, scenario, what, a, b);
}
uint64_t ld(uint64_t off) { return emu_ld(base + off); }
void st(uint64_t off, uint64_t v) { emu_st(base + off, v); }
uint32_t value(uint64_t seq, uint32_t i, uint32_t msg) {
    return (uint32_t)seq * 0x9E3779B1u ^ (i * 0x85EBCA77u + msg);
}
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Run {
    Config cfg;
    uint64_t in_slots, out_slots;
    std::atomic<uint32_t> launch{1};
    std::atomic<uint64_t> sent{0};
    uint64_t read = 0;
    uint64_t torn_sent = 0;

    uint32_t words() const { return cfg.msg / 4; }  // wire words of a message
    volatile uint64_t* in_word(uint64_t seq, uint32_t i) const {
        return (volatile uint64_t*)(base + in_slots + (seq % cfg.capacity) * cfg.msg * MESH_RING_WIRE_FACTOR) + i;
    }
    volatile uint64_t* out_word(uint64_t seq, uint32_t i) const {
        return (volatile uint64_t*)(base + out_slots + (seq % cfg.capacity) * cfg.msg * MESH_RING_WIRE_FACTOR) + i;
    }

    // ring.rs's producer: room from the published tail, every word but the first pair, then the first
    // pair (a receiver decides "empty" on word 0), head published. A torn message holds one word back.
    void send(uint64_t seq) {
        const uint64_t t = (uint64_t)mesh_detail_tag(seq) << 32;
        const uint32_t n = words();
        if (cfg.torn && seq % 3 == 1) {
            const uint32_t late = (uint32_t)(seq / 3) % n;  // word 0, the last, and ones between
            for (uint32_t i = 0; i < n; i++)
                if (i != late) emu_st(in_word(seq, i), t | value(seq, i, cfg.msg));
            std::this_thread::sleep_for(std::chrono::microseconds(300));  // > MESH_PARTIAL_WAIT_NS
            emu_st(in_word(seq, late), t | value(seq, late, cfg.msg));
            torn_sent++;
        } else {
            for (uint32_t i = 2; i < n; i++) emu_st(in_word(seq, i), t | value(seq, i, cfg.msg));
            emu_st(in_word(seq, 0), t | value(seq, 0, cfg.msg));
            emu_st(in_word(seq, 1), t | value(seq, 1, cfg.msg));
        }
        st(kInRing + MESH_RING_HEAD, seq + 1);
    }

    // ring.rs's consumer: message `read` taken when every word carries its tag; a word with a tag of
    // neither this lap nor the last (nor 0, never written) is a stray.
    bool try_read() {
        const uint32_t want = mesh_detail_tag(read);
        const uint32_t old = read >= cfg.capacity ? mesh_detail_tag(read - cfg.capacity) : 0u;
        bool whole = true;
        for (uint32_t i = 0; i < words(); i++) {
            const uint32_t tag = (uint32_t)(emu_ld(out_word(read, i)) >> 32);
            if (tag != want && tag != old) fail("a word with a stray tag", (long)read, i);
            whole &= tag == want;
        }
        if (!whole) return false;
        for (uint32_t i = 0; i < words(); i++) {
            const uint32_t v = (uint32_t)emu_ld(out_word(read, i));
            if (v != value(read, i, cfg.msg)) {
                fail("echoed word (message, word)", (long)read, i);
                break;
            }
        }
        read++;
        st(kOutRing + MESH_RING_TAIL, read);
        return true;
    }

    // At-least-once after a crash: while the program loops, its published tail never passes a message
    // that was not echoed yet (a launch killed there would resume past a message that got no echo:
    // lost). The tail is read first and the echoes counted after, so a late echo can only make this
    // pass. Not while it stops: its lanes (threads here) may still store the last echo when lane 0's
    // mesh_chan_close publishes the exact tail, and an orderly stop loses nothing anyway.
    void check_tail_behind_echoes() {
        const uint64_t tail = ld(kInRing + MESH_RING_TAIL);
        uint64_t written = read;
        while (written < tail) {
            bool whole = true;
            for (uint32_t i = 0; i < words() && whole; i++)
                whole = (uint32_t)(emu_ld(out_word(written, i)) >> 32) == mesh_detail_tag(written);
            if (!whole) break;
            written++;
        }
        if (tail > written) fail("the published tail passed messages not yet echoed (tail, echoed)", (long)tail, (long)written);
    }

    void drive() {
        const uint64_t total = cfg.count;
        bool stopped_first = false;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (read < total) {
            bool moved = false;
            while (sent < total && sent - ld(kInRing + MESH_RING_TAIL) < cfg.capacity) {
                send(sent);
                sent++;
                moved = true;
            }
            while (read < total && try_read()) moved = true;
            if (!stopped_first || launch.load() == 2) check_tail_behind_echoes();
            if (!stopped_first && read >= total / 2) {
                st(kSlot + MESH_SLOT_STOP, 1);  // meshd: stop, with messages in flight both ways
                stopped_first = true;
            }
            if (failures) break;  // the rest of the stream would only repeat the first failure
            if (std::chrono::steady_clock::now() > deadline) {
                fail("stuck (sent, read)", (long)sent, (long)read);
                break;
            }
            if (!moved) std::this_thread::yield();
        }
        // Stuck: stop the first launch anyway, so that the failure is reported, not left to the watchdog.
        if (!stopped_first) st(kSlot + MESH_SLOT_STOP, 1);
        // The second stop only once the second launch began (main clears the first one before it).
        while (launch.load() != 2) std::this_thread::yield();
        st(kSlot + MESH_SLOT_STOP, 1);
    }
};

// The program's slot and positions after a launch ended.
void check_launch(Run& r, uint32_t launch, uint64_t* beat, uint64_t* in_flight) {
    const uint32_t state = emu_ld32(base + kSlot + MESH_SLOT_STATE);
    const int32_t code = (int32_t)emu_ld32(base + kSlot + MESH_SLOT_EXIT_CODE);
    if (state != MESH_STATE_STOPPED) fail("slot state after the launch (launch, state)", launch, state);
    if (code != 0) fail("exit code", code);
    const uint64_t hb = ld(kSlot + MESH_SLOT_HEARTBEAT);
    if (hb <= *beat) fail("heartbeat did not rise across the launch (before, after)", (long)*beat, (long)hb);
    *beat = hb;
    const uint64_t in_tail = ld(kInRing + MESH_RING_TAIL), out_head = ld(kOutRing + MESH_RING_HEAD);
    // An echo receives only with room to send: each message consumed was sent on, none held.
    if (in_tail != out_head) fail("in ring's published tail against out ring's published head", (long)in_tail, (long)out_head);
    const uint64_t sent = r.sent.load();
    if (in_tail > sent) fail("tail published past what was sent", (long)in_tail, (long)sent);
    *in_flight = sent - in_tail;
    // The out ring holds exactly messages up to the published head: the next launch resumes there.
    const uint64_t cap = r.cfg.capacity;
    for (uint64_t s = out_head >= cap ? out_head - cap : 0; s < out_head; s++)
        for (uint32_t i = 0; i < r.words(); i++)
            if ((uint32_t)(emu_ld(r.out_word(s, i)) >> 32) != mesh_detail_tag(s)) fail("a message before the published head is not whole", (long)s, i);
    for (uint32_t i = 0; i < r.words(); i++)
        if ((uint32_t)(emu_ld(r.out_word(out_head, i)) >> 32) == mesh_detail_tag(out_head))
            fail("a word written past the published head", (long)out_head, i);
    if (launch == 2) {
        if (in_tail != r.cfg.count) fail("final in tail", (long)in_tail, r.cfg.count);
        if (r.read != r.cfg.count) fail("messages read", (long)r.read, r.cfg.count);
    }
}

mesh_ctx make_ctx(const Run& r) {
    mesh_ctx ctx;
    std::memset(&ctx, 0, sizeof ctx);
    ctx.base = (uint64_t)(uintptr_t)base;
    ctx.slot_offset = kSlot;
    ctx.binding_count = 2;
    ctx.bindings[0] = {kInRing, (uint64_t)(uintptr_t)(base + r.in_slots), r.cfg.msg, r.cfg.capacity, MESH_PLACEMENT_HOST,
                       MESH_PROTOCOL_LL};
    ctx.bindings[1] = {kOutRing, (uint64_t)(uintptr_t)(base + r.out_slots), r.cfg.msg, r.cfg.capacity, MESH_PLACEMENT_HOST,
                       MESH_PROTOCOL_LL};
    return ctx;
}

// One program run for one launch: a block of one warp (echo.cu's lanes 1-31 leave at once, so its
// lane 0 meets no barrier: a ticker moves its clock and stop word as the warp's barriers would).
void launch_block(mesh_ctx ctx) {
    std::atomic<bool> done{false};
    std::thread ticker;
    if (kOneThread)
        ticker = std::thread([&] {
            while (!done.load()) {
                EmuTick{0}();
                std::this_thread::sleep_for(std::chrono::microseconds(20));
            }
        });
    emu_run_block(1, [&](uint32_t) { mesh_main(ctx); });
    done = true;
    if (ticker.joinable()) ticker.join();
}

// Two launches of the program on fresh memory; returns the messages in flight at the first stop.
uint64_t run(const Config& cfg) {
    char name[96];
    std::snprintf(name, sizeof name, "msg %u, capacity %u, %u messages%s", cfg.msg, cfg.capacity, cfg.count,
                  cfg.torn ? ", torn" : "");
    scenario = name;
    Run r;
    r.cfg = cfg;
    const uint64_t ring_bytes = round_up((uint64_t)cfg.msg * MESH_RING_WIRE_FACTOR * cfg.capacity, kPage);
    r.in_slots = kInSlots;
    r.out_slots = kInSlots + ring_bytes;
    memory.assign((r.out_slots + ring_bytes + kPage) / 8, 0);
    base = (char*)memory.data();
    const void* const watched[4] = {base + kInRing + MESH_RING_HEAD, base + kInRing + MESH_RING_TAIL,
                                    base + kOutRing + MESH_RING_HEAD, base + kOutRing + MESH_RING_TAIL};
    emu_watch_stop(base + kSlot + MESH_SLOT_STOP);
    uint64_t beat = 0, in_flight = 0, ignored = 0;
    std::thread driver([&] { r.drive(); });
    lockstep_watch(watched);
    launch_block(make_ctx(r));
    check_launch(r, 1, &beat, &in_flight);
    // meshd's relaunch: the stop cleared, the slot armed again; the channels as the first launch left them.
    st(kSlot + MESH_SLOT_STOP, 0);
    emu_st32(base + kSlot + MESH_SLOT_STATE, MESH_STATE_IDLE);
    lockstep_watch(watched);
    r.launch = 2;
    launch_block(make_ctx(r));
    driver.join();
    check_launch(r, 2, &beat, &ignored);
    std::printf("%s: %s: in flight at the first stop %llu, torn %llu, read %llu\n", PROGRAM, name,
                (unsigned long long)in_flight, (unsigned long long)r.torn_sent, (unsigned long long)r.read);
    std::fflush(stdout);
    return in_flight;
}

// A producer's resume after a crash (no close): the published head is 2, message 2 was written whole,
// message 3 has its first and last words but not one between (a warp's lanes store at once, and the
// launch died mid-send). mesh_chan_open must resume at 3 and write it again; judging by the first and
// last words alone it would resume at 4, and the consumer would wait at 3 for good.
void check_producer_resume() {
    scenario = "producer resume after a crash, a message torn between its ends";
    const uint32_t msg = 64, capacity = 4, words = msg / 4;
    Run r;
    r.cfg = {msg, capacity, 0, false};
    const uint64_t ring_bytes = round_up((uint64_t)msg * MESH_RING_WIRE_FACTOR * capacity, kPage);
    r.in_slots = kInSlots;
    r.out_slots = kInSlots + ring_bytes;
    memory.assign((r.out_slots + ring_bytes + kPage) / 8, 0);
    base = (char*)memory.data();
    st(kOutRing + MESH_RING_HEAD, 2);
    st(kOutRing + MESH_RING_TAIL, 0);
    for (uint64_t seq = 0; seq < 4; seq++)
        for (uint32_t i = 0; i < words; i++) {
            if (seq == 3 && i == words / 2) continue;  // the word the crash lost
            *r.out_word(seq, i) = (uint64_t)mesh_detail_tag(seq) << 32 | value(seq, i, msg);
        }
    const mesh_ctx ctx = make_ctx(r);
    std::atomic<uint64_t> mine{0};
    emu_run_block(1, [&](uint32_t t) {
        mesh_chan out = mesh_chan_open(ctx, 1, true);
        if (t == 0) mine = out.mine;
    });
    if (mine.load() != 3) fail("the producer resumed past a message missing a word (resumed at, expected)", (long)mine.load(), 3);
    std::printf("%s: %s: resumed at %llu\n", PROGRAM, scenario, (unsigned long long)mine.load());
}

}  // namespace

int main() {
    std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(120));
        std::fprintf(stderr, "WATCHDOG (%s, %s): no end after 120 s, a hang\n", PROGRAM, scenario);
        std::_Exit(3);
    }).detach();
#ifdef EMU_MAX_MSG
    const uint32_t max_msg = EMU_MAX_MSG;  // a program serving smaller messages only
#else
    const uint32_t max_msg = kOneThread ? 256u : 4096u;  // echo.cu's buffer holds 256 bytes
#endif
    uint64_t in_flight = 0;
    for (uint32_t msg : {8u, 64u, 256u, 1024u, 4096u}) {
        if (msg > max_msg) continue;
        const uint32_t count = (msg >= 1024 ? 300 : 600);  // capacity 4: 75 to 150 laps of the ring
        in_flight += run({msg, 4, count, false});
        in_flight += run({msg, 16, count, false});
        in_flight += run({msg, 4, 60, true});
        in_flight += run({msg, 16, 120, true});  // whole messages in front of a torn one: one poll takes them
        if (failures) break;
    }
    if (in_flight == 0) fail("no launch stopped with messages in flight: the relaunch was not put to the test");
    check_producer_resume();
    if (failures) {
        std::fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    std::printf("all passed\n");
    return 0;
}
