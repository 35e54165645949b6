// bulk_blocks.cpp: mesh.cuh's bulk block calls (mesh_bulk_open_part / close, mesh_block_send / try_send,
// reserve / publish, recv / try_recv, peek / release) run on the CPU as one block of emulated warps
// (warp_emu.h) against one bulk channel laid out as mesh-shm's bulk.rs and layout.rs lay it out (ring
// header, capacity x parts flags, the parts' index lines, page-aligned payloads), with the main thread
// playing everything else the way the Rust ends do.
//
// A scenario is one end of one channel of P parts served by B blocks, of which the emulated block is
// block b (blockIdx.x = b, gridDim.x = B: its share is parts b x P / B onwards). The emulation runs one
// block per process at a time (__shared__ is a static), so the other B - 1 blocks of that end are
// played by the driver too, part by part as bulk.rs's tests' PartBlock does, and so is the far end (a
// host end of every part: BulkProducerCore's or BulkConsumerCore's rules). Two blocks of one end never
// run at once here: what that shares is their parts' words only (one writer each), which the driver's
// stand-ins exercise, but not two emulated blocks' barriers side by side.
//
// What it cannot show: the GPU's memory model (every primitive is a sequentially consistent atomic,
// every barrier a full one), and blocks that are not whole warps (warp_emu.h runs 1 to 8 warps), so
// not a block of fewer threads than the parts it serves or than a peek's flags (count x lookahead).
//
// GPU producer: the block sends message seq with word k (of the whole message) value(seq, k); the
// driver checks every word of every whole message, holds it a while and checks it again (a producer
// that overwrote a slot before its tail came back shows), and checks that no part's head or flags ever
// run more than the capacity ahead of the tail it published. GPU consumer: the driver sends value(seq,
// k) messages as a host producer; the block checks every word of its share and counts what differed.
// Each scenario is two launches (the second resumes where the first closed; where the block serves
// several parts, the driver first leaves those parts disagreeing as a launch of more blocks would, and
// the open must settle them as bulk.rs says): each launch is stopped through the program slot once the
// ring is full (producer) or drained (consumer), so every count is exact; after it the parts' lines,
// the header's lower bound (mesh_bulk_close), the counts and the slot state are checked.
//
// Built and run by tests/bulk_emulation.rs: as it is (both ends), with MESH_BULK_LOOKAHEAD 1 (the
// consumer, the only end it changes), with EMU_SEND_N 2 and 3 (the producer sending that many messages
// a call: mesh_block_try_send_n on the copy path, mesh_block_reserve_n / mesh_block_publish_n in
// place) and with EMU_RECV_N 2 and 3 (the consumer taking that many: mesh_block_try_recv_n,
// mesh_block_peek_n / mesh_block_release_n; also with MESH_BULK_LOOKAHEAD 1, where each call finds one):
// `g++ -std=c++20 -O1 -pthread -I ../../include bulk_blocks.cpp && ./a.out [all | producer | consumer]`
// (exit 0 and "all passed"; a watchdog ends a deadlock after 60 s). `./a.out probe-resume-full` runs a
// known failure instead (see probe_resume_full).
#include "warp_emu.h"
// Look at the stop word on every check: the emulation's %globaltimer advances at warp barriers, and a
// block waiting for room or a message passes block barriers only, so a period would never elapse.
#define MESH_STOP_PERIOD_NS 0u
#include "mesh.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// ---- The message contents, the device side ----------------------------------------------------------

// Word k of message seq: distinct from the same word of any message fewer than 2^32 away (odd
// multiplier), so a stale lap, a wrong slot or a shifted share all show.
uint32_t value(uint64_t seq, uint32_t k) { return (uint32_t)seq * 0x01000193u + k * 0x9E3779B1u + 0x5bd1e995u; }

constexpr uint32_t kMaxShareWords = 16384;    // the block's buffer: 64 KiB
alignas(16) uint32_t g_buf[kMaxShareWords];  // one per block, as a __shared__ or global buffer would be
#ifndef EMU_SEND_N
#define EMU_SEND_N 1u  // messages the copy-path producer sends a call (above 1: mesh_block_try_send_n)
#endif
alignas(16) uint32_t g_bufs[EMU_SEND_N][kMaxShareWords];  // its buffers then
#ifndef EMU_RECV_N
#define EMU_RECV_N 1u  // messages the consumer takes a call (above 1: mesh_block_peek_n / mesh_block_try_recv_n)
#endif
alignas(16) uint32_t g_bufs_in[EMU_RECV_N][kMaxShareWords];  // the copy path's buffers then
bool g_copy;                                 // the copy path (send / recv) or in place (reserve / peek)

// What the block reports (rank 0 writes them after its last barrier; the driver reads after the join).
std::atomic<uint64_t> g_errors, g_err_seq, g_err_word, g_err_got;
std::atomic<bool> g_err_set;
uint64_t g_start, g_end, g_count;
bool g_refused;
std::atomic<bool> g_opened;  // the block's open is done (its rank 0 past it)

void device_error(uint64_t seq, uint32_t k, uint32_t got) {
    g_errors.fetch_add(1);
    if (!g_err_set.exchange(true)) {
        g_err_seq = seq;
        g_err_word = k;
        g_err_got = got;
    }
}

// The producer program: its share of every message until stopped (the stop comes while it waits for
// room, so the ring is full when it returns).
void produce(mesh_ctx ctx) {
    const uint32_t r = mesh_block_rank(), n = mesh_block_threads();
    if (r == 0) mesh_begin(ctx);
    mesh_bulk out = mesh_bulk_open_part(ctx, 0, true, blockIdx.x, gridDim.x);
    if (out.msg_size == 0 || out.msg_size / 4u > kMaxShareWords) {
        if (r == 0) g_refused = true;
        return;
    }
    const uint32_t words = out.msg_size / 4u, first = mesh_bulk_part_offset(&out) / 4u;
    const uint64_t start = out.mine;
    if (r == 0) g_opened = true;
    uint64_t count = 0;
    if (g_copy && EMU_SEND_N > 1) {
        // mesh_block_try_send_n: up to EMU_SEND_N messages a call, each from its own buffer.
        const void* msgs[EMU_SEND_N];
        for (uint32_t m = 0; m < EMU_SEND_N; m++) msgs[m] = g_bufs[m];
        while (!mesh_block_should_stop(ctx)) {
            for (uint32_t m = 0; m < EMU_SEND_N; m++)
                for (uint32_t k = r; k < words; k += n) g_bufs[m][k] = value(out.mine + m, first + k);
            __syncthreads();  // the buffers are whole before any thread copies from them
            count += mesh_block_try_send_n(&out, msgs, EMU_SEND_N);
            __syncthreads();  // every thread read the count's messages before the next fill
        }
    } else if (g_copy) {
        for (;; count++) {
            for (uint32_t k = r; k < words; k += n) g_buf[k] = value(out.mine, first + k);
            __syncthreads();  // the buffer is whole before any thread copies from it
            if (!mesh_block_send(ctx, &out, g_buf)) break;
        }
    } else if (EMU_SEND_N > 1) {
        // mesh_block_reserve_n / mesh_block_publish_n: up to EMU_SEND_N slots filled in place a call.
        while (!mesh_block_should_stop(ctx)) {
            const uint32_t got = mesh_block_reserve_n(&out, EMU_SEND_N);
            for (uint32_t m = 0; m < got; m++) {
                uint32_t* slot = (uint32_t*)mesh_block_reserved(&out, m);
                for (uint32_t k = r; k < words; k += n) slot[k] = value(out.mine + m, first + k);
            }
            mesh_block_publish_n(&out, got);
            count += got;
        }
    } else {
        while (!mesh_block_should_stop(ctx)) {
            uint32_t* slot = (uint32_t*)mesh_block_reserve(&out);
            if (slot == nullptr) continue;
            for (uint32_t k = r; k < words; k += n) slot[k] = value(out.mine, first + k);
            mesh_block_publish(&out);
            count++;
        }
    }
    mesh_bulk_close(&out);
    if (r == 0) {
        g_start = start;
        g_end = out.mine;
        g_count = count;
        mesh_end(ctx);
    }
}

// The consumer program: its share of every message until stopped (while it waits for one), every word
// checked.
void consume(mesh_ctx ctx) {
    const uint32_t r = mesh_block_rank(), n = mesh_block_threads();
    if (r == 0) mesh_begin(ctx);
    mesh_bulk in = mesh_bulk_open_part(ctx, 0, false, blockIdx.x, gridDim.x);
    if (in.msg_size == 0 || in.msg_size / 4u > kMaxShareWords) {
        if (r == 0) g_refused = true;
        return;
    }
    const uint32_t words = in.msg_size / 4u, first = mesh_bulk_part_offset(&in) / 4u;
    const uint64_t start = in.mine;
    if (r == 0) g_opened = true;
    uint64_t count = 0;
    if (g_copy && EMU_RECV_N > 1) {
        // mesh_block_try_recv_n: up to EMU_RECV_N messages a call, each into its own buffer.
        void* outs[EMU_RECV_N];
        for (uint32_t m = 0; m < EMU_RECV_N; m++) outs[m] = g_bufs_in[m];
        while (!mesh_block_should_stop(ctx)) {
            const uint64_t seq = in.mine;
            const uint32_t got = mesh_block_try_recv_n(&in, outs, EMU_RECV_N);
            for (uint32_t m = 0; m < got; m++)
                for (uint32_t k = r; k < words; k += n)
                    if (g_bufs_in[m][k] != value(seq + m, first + k)) device_error(seq + m, first + k, g_bufs_in[m][k]);
            __syncthreads();  // every thread checked the buffers before the next call copies into them
            count += got;
        }
    } else if (EMU_RECV_N > 1) {
        // mesh_block_peek_n / mesh_block_release_n: up to EMU_RECV_N messages checked in place a call.
        while (!mesh_block_should_stop(ctx)) {
            const uint32_t got = mesh_block_peek_n(&in, EMU_RECV_N);
            for (uint32_t m = 0; m < got; m++) {
                const uint32_t* msg = (const uint32_t*)mesh_block_peeked(&in, m);
                for (uint32_t k = r; k < words; k += n)
                    if (msg[k] != value(in.mine + m, first + k)) device_error(in.mine + m, first + k, msg[k]);
            }
            if (got) mesh_block_release_n(&in, got);
            count += got;
        }
    } else if (g_copy) {
        for (; mesh_block_recv(ctx, &in, g_buf); count++) {
            const uint64_t seq = in.mine - 1u;
            for (uint32_t k = r; k < words; k += n)
                if (g_buf[k] != value(seq, first + k)) device_error(seq, first + k, g_buf[k]);
            // Every thread has checked the buffer before the next message is copied into it (a peek
            // that finds the message already known whole passes no barrier).
            __syncthreads();
        }
    } else {
        while (!mesh_block_should_stop(ctx)) {
            const uint32_t* msg = (const uint32_t*)mesh_block_peek(&in);
            if (msg == nullptr) continue;
            for (uint32_t k = r; k < words; k += n)
                if (msg[k] != value(in.mine, first + k)) device_error(in.mine, first + k, msg[k]);
            mesh_block_release(&in);
            count++;
        }
    }
    mesh_bulk_close(&in);
    if (r == 0) {
        g_start = start;
        g_end = in.mine;
        g_count = count;
        mesh_end(ctx);
    }
}

// ---- The channel as mesh-shm lays it out ---------------------------------------------------------------

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSlot = 512;     // the program's slot
constexpr uint64_t kHeader = 4096;  // the ring header (MESH_RING_SLOTS bytes)
constexpr uint64_t kSlots = 8192;   // the ring's slots (flags, lines, payloads), page aligned

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// bulk.rs's BulkMemory over `base`: layout.rs's bulk_lines_offset and bulk_payload_offset.
struct Ring {
    char* base;
    uint32_t parts, cap, msg;
    uint64_t lines_off() const { return round_up(8ull * cap * parts, MESH_LINE); }
    uint64_t payload_off() const {
        return round_up(parts == 1 ? 8ull * cap : lines_off() + 2ull * parts * MESH_LINE, kPage);
    }
    uint64_t bytes() const { return kSlots + payload_off() + (uint64_t)cap * msg; }
    char* header() const { return base + kHeader; }
    char* slots() const { return base + kSlots; }
    uint64_t* flag(uint64_t seq, uint32_t p) const { return (uint64_t*)slots() + (seq & (cap - 1u)) * parts + p; }
    char* head_line(uint32_t p) const {
        return parts == 1 ? header() + MESH_RING_HEAD : slots() + lines_off() + 2ull * p * MESH_LINE;
    }
    char* tail_line(uint32_t p) const {
        return parts == 1 ? header() + MESH_RING_TAIL : slots() + lines_off() + (2ull * p + 1) * MESH_LINE;
    }
    uint32_t* words(uint64_t seq) const { return (uint32_t*)(slots() + payload_off() + (seq & (cap - 1u)) * msg); }
    uint32_t part_words() const { return msg / parts / 4u; }
};

uint64_t ld(const void* p) { return emu_ld(p); }
void st(void* p, uint64_t v) { emu_st(p, v); }
uint32_t ld_word(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
void st_word(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
bool after(uint64_t a, uint64_t b) { return (int64_t)(a - b) > 0; }

// ---- Scenarios and the driver -----------------------------------------------------------------------

struct Scenario {
    bool producer;  // the block is the producer (else the consumer)
    bool copy;      // send / recv (else reserve / publish, peek / release)
    uint32_t parts, blocks, block, warps, msg, cap, placement;
    uint64_t start;         // every index starts here (near 2^32: nothing may truncate a position)
    uint32_t first, total;  // messages the first launch ends at, and the second, from `start`
};

std::string describe(const Scenario& s) {
    char b[256];
    std::snprintf(b, sizeof b, "%s %s, P=%u B=%u b=%u, %u warps, msg %u, capacity %u, %s, start %llu",
                  s.producer ? "producer" : "consumer", s.copy ? "copy" : "in place", s.parts, s.blocks, s.block,
                  s.warps, s.msg, s.cap, s.placement == MESH_PLACEMENT_HOST ? "host" : "device",
                  (unsigned long long)s.start);
    return b;
}

std::atomic<bool> g_finished;  // the watchdog's: every scenario done
char g_where[512];            // what the watchdog reports (written by the driver only)
int failures;
std::string g_current;

void fail(const char* what, long long a = 0, long long b = 0) {
    if (failures++ < 30) std::fprintf(stderr, "FAIL (%s): %s [%lld, %lld]\n", g_current.c_str(), what, a, b);
}

// The driver of one scenario: the far end (every part, as the Rust host end) and the other blocks of
// the emulated block's end (their parts, one at a time each, as PartBlock).
struct Driver {
    Scenario s;
    Ring ring;
    uint32_t first, count;  // the emulated block's parts
    uint64_t end;           // host end: producer test, its tail; consumer test, its head
    uint64_t pos[MESH_BULK_MAX_PARTS];  // the other blocks' parts: how far each is
    uint64_t limit;                     // how far the other blocks' parts may go in this phase
    uint64_t host_limit;                // how far the host end may go in this phase
    bool frozen = false;                // after the stop: nothing moves (the close's lower bound is exact)

    bool mine(uint32_t p) const { return p >= first && p < first + count; }
    // The other blocks' parts stop a message short of the emulated block's at the end of a phase, so
    // that the header's lower bound (mesh_bulk_close) is not simply the block's own position.
    uint64_t lag() const { return s.blocks > 1 ? 1 : 0; }
    // A position as the failures report it: from the scenario's start.
    long long at(uint64_t v) const { return (long long)(v - s.start); }

    // Checks `words` words of message seq's slot from word k0; false (and counted) if any differs.
    bool check(uint64_t seq, uint32_t k0, uint32_t words, const char* what) {
        const uint32_t* w = ring.words(seq);
        for (uint32_t k = k0; k < k0 + words; k++) {
            const uint32_t got = ld_word(&w[k]);
            if (got != value(seq, k)) {
                fail(what, at(seq), k);
                return false;
            }
        }
        return true;
    }

    // The host consumer (GPU producer test): every whole message up to host_limit, checked twice.
    void host_consume() {
        while (after(host_limit, end)) {
            for (uint32_t p = 0; p < s.parts; p++)
                if (ld(ring.flag(end, p)) != end + 1) return;
            check(end, 0, s.msg / 4, "a whole message's word");
            for (int i = 0; i < 3; i++) std::this_thread::yield();
            // Still the same message: its producer waited for this tail before writing the slot again.
            for (uint32_t p = 0; p < s.parts; p++)
                if (ld(ring.flag(end, p)) != end + 1) fail("a held message's flag changed", at(end), p);
            check(end, first * ring.part_words(), count * ring.part_words(), "a held message changed");
            end++;
            for (uint32_t p = 0; p < s.parts; p++) st(ring.tail_line(p), end);
            if (s.parts > 1) st(ring.header() + MESH_RING_TAIL, end);
        }
    }

    // The producer (GPU consumer test): messages up to host_limit, as room allows (the slowest part's
    // tail). Even messages as the host end writes them (the payload, then every flag); odd ones part by
    // part, each part's flag right after its bytes, as a producer of P blocks does, with a pause after
    // the block's first part: it must wait for every part of its share, not only the first.
    void host_produce() {
        while (after(host_limit, end)) {
            for (uint32_t p = 0; p < s.parts; p++)
                if (end - ld(ring.tail_line(p)) >= s.cap) return;
            uint32_t* w = ring.words(end);
            const uint32_t pw = ring.part_words();
            if ((end & 1u) == 0) {
                for (uint32_t k = 0; k < s.msg / 4; k++) st_word(&w[k], value(end, k));
                for (uint32_t p = 0; p < s.parts; p++) st(ring.flag(end, p), end + 1);
            } else {
                for (uint32_t p = 0; p < s.parts; p++) {
                    for (int i = 0; p == first + 1 && mine(p) && i < 10; i++) std::this_thread::yield();
                    for (uint32_t k = p * pw; k < (p + 1) * pw; k++) st_word(&w[k], value(end, k));
                    st(ring.flag(end, p), end + 1);
                }
            }
            end++;
            for (uint32_t p = 0; p < s.parts; p++) st(ring.head_line(p), end);
            if (s.parts > 1) st(ring.header() + MESH_RING_HEAD, end);
        }
    }

    // The other blocks of the GPU end, a part each.
    void other_blocks() {
        const uint32_t pw = ring.part_words();
        for (uint32_t q = 0; q < s.parts; q++) {
            if (mine(q)) continue;
            if (s.producer) {
                while (after(limit, pos[q]) && pos[q] - ld(ring.tail_line(q)) < s.cap) {
                    uint32_t* w = ring.words(pos[q]);
                    for (uint32_t k = q * pw; k < (q + 1) * pw; k++) st_word(&w[k], value(pos[q], k));
                    st(ring.flag(pos[q], q), pos[q] + 1);
                    pos[q]++;
                    st(ring.head_line(q), pos[q]);
                }
            } else {
                while (after(limit, pos[q]) && ld(ring.flag(pos[q], q)) == pos[q] + 1) {
                    check(pos[q], q * pw, pw, "another block's part");
                    pos[q]++;
                    st(ring.tail_line(q), pos[q]);
                }
            }
        }
    }

    // What the emulated block may never do, whatever the timing: run its parts' heads or flags more
    // than a ring ahead of their tails (producer), or its tails ahead of the host's head (consumer).
    void invariants() {
        for (uint32_t p = first; p < first + count; p++) {
            if (s.producer) {
                const uint64_t tail = ld(ring.tail_line(p)), head = ld(ring.head_line(p));
                if (after(head, tail + s.cap)) fail("a part's head more than a ring past its tail", at(head), at(tail));
                for (uint64_t seq = tail; seq != tail + s.cap; seq++) {
                    const uint64_t f = ld(ring.flag(seq, p));
                    if (f != seq + 1 && f != seq + 1 - s.cap && f != 0)
                        fail("a flag neither this lap's nor the last's", at(seq), at(f));
                }
            } else if (const uint64_t tail = ld(ring.tail_line(p)); after(tail, end)) {
                fail("a part's tail ahead of the head", at(tail), at(end));
            }
        }
    }

    // One pass of everything the driver plays; after the stop only the invariants (a block that does
    // not stop may still be running away).
    void step() {
        if (!frozen && s.producer) {
            other_blocks();
            host_consume();
        } else if (!frozen) {
            host_produce();
            other_blocks();
        }
        invariants();
    }

    // The phase is over once the block can only wait: the ring full of its messages (producer) or
    // drained (consumer), every part there.
    bool settled(uint64_t target) const {
        const uint64_t there = s.producer ? target + s.cap : target;
        if (end != target) return false;
        for (uint32_t p = 0; p < s.parts; p++) {
            const uint64_t v = mine(p) ? ld(s.producer ? ring.head_line(p) : ring.tail_line(p)) : pos[p] + lag();
            if (v != there) return false;
        }
        return true;
    }

    // One launch of the block, stopped once the phase settles at `target`, then its reports and the
    // lines it closed checked.
    void launch(const mesh_ctx& ctx, uint64_t target, uint64_t expect_start, const char* name) {
        std::snprintf(g_where, sizeof g_where, "%s, %s", g_current.c_str(), name);
        host_limit = target;
        limit = (s.producer ? target + s.cap : target) - lag();
        frozen = false;
        st(base_slot() + MESH_SLOT_STOP, 0);
        g_start = g_end = g_count = ~0ull;
        g_refused = false;
        std::atomic<bool> done{false};
        std::thread block([&] {
            blockIdx = {s.block, 0, 0};
            gridDim = {s.blocks, 1, 1};
            emu_run_block(s.warps, [&](uint32_t) {
                if (s.producer) produce(ctx);
                else consume(ctx);
            });
            blockIdx = {0, 0, 0};
            gridDim = {1, 1, 1};
            done = true;
        });
        bool stopped = false;
        const int failures_before = failures;
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(15);
        while (!done) {
            step();
            // Stopped once settled; or at once on a failure, or after 15 s without settling (a block
            // still looping then hears the stop; one stuck at a barrier is the watchdog's).
            const bool late = std::chrono::steady_clock::now() > give_up;
            if (!stopped && (settled(target) || failures != failures_before || late)) {
                if (failures == failures_before && !settled(target)) {
                    fail("the phase never settled (the block or the ring stuck)");
                    report();
                }
                stopped = frozen = true;
                st(base_slot() + MESH_SLOT_STOP, 1);
            }
            std::this_thread::yield();
        }
        block.join();
        if (!stopped) fail("the block returned before it was stopped");
        if (failures != failures_before) return;
        if (g_refused) return fail("the block's share was refused");
        const uint64_t expect_end = s.producer ? target + s.cap : target;
        if (g_start != expect_start) fail("where the open resumed", at(g_start), at(expect_start));
        if (g_end != expect_end) fail("where the block ended", at(g_end), at(expect_end));
        if (g_count != g_end - g_start) fail("messages the block moved", (long long)g_count, at(g_end) - at(g_start));
        if (emu_ld32(base_slot() + MESH_SLOT_STATE) != MESH_STATE_STOPPED) fail("slot state after the launch");
        for (uint32_t p = first; p < first + count; p++) {
            const uint64_t line = ld(s.producer ? ring.head_line(p) : ring.tail_line(p));
            if (line != expect_end) fail("a part's line after the close", p, at(line));
        }
        // mesh_bulk_close: the block serving part 0 publishes the header's lower bound over every part.
        if (first == 0) {
            uint64_t low = ld(s.producer ? ring.head_line(0) : ring.tail_line(0));
            for (uint32_t p = 1; p < s.parts; p++) {
                const uint64_t v = ld(s.producer ? ring.head_line(p) : ring.tail_line(p));
                if (after(low, v)) low = v;
            }
            const uint64_t h = ld(ring.header() + (s.producer ? MESH_RING_HEAD : MESH_RING_TAIL));
            if (h != low) fail("the header's lower bound after the close", at(h), at(low));
        }
    }

    char* base_slot() const { return ring.base + kSlot; }

    // Where everything stands (the watchdog's last words; racy reads of the driver's own fields).
    void report() const {
        std::fprintf(stderr, "  driver: host %s at %lld (limit %lld), other parts up to %lld, %s\n",
                     s.producer ? "consumer" : "producer", at(end), at(host_limit), at(limit),
                     frozen ? "stop set" : "stop not set");
        for (uint32_t p = 0; p < s.parts; p++)
            std::fprintf(stderr, "  part %u%s: head %lld, tail %lld, slot 0's flag %lld, the last slot's %lld\n", p,
                         mine(p) ? " (the block's)" : "", at(ld(ring.head_line(p))), at(ld(ring.tail_line(p))),
                         at(ld(ring.flag(0, p))), at(ld(ring.flag(s.cap - 1, p))));
    }
};

std::atomic<Driver*> g_driver;  // the scenario running, for the watchdog's report

bool run(const Scenario& s) {
    g_current = describe(s);
    const int failures_before = failures;
    const auto t0 = std::chrono::steady_clock::now();
    Ring ring{nullptr, s.parts, s.cap, s.msg};
    const uint64_t bytes = round_up(ring.bytes(), kPage);
    ring.base = (char*)std::aligned_alloc(kPage, bytes);
    std::memset(ring.base, 0, bytes);
    Driver d;
    g_driver = &d;
    d.s = s;
    d.ring = ring;
    d.count = s.parts / s.blocks;
    d.first = s.block * d.count;
    d.end = s.start;
    for (uint32_t p = 0; p < s.parts; p++) {
        d.pos[p] = s.start;
        st(ring.head_line(p), s.start);
        st(ring.tail_line(p), s.start);
    }
    st(ring.header() + MESH_RING_HEAD, s.start);
    st(ring.header() + MESH_RING_TAIL, s.start);
    g_copy = s.copy;
    g_errors = 0;
    g_err_set = false;
    mesh_ctx ctx;
    std::memset(&ctx, 0, sizeof ctx);
    ctx.base = (uint64_t)(uintptr_t)ring.base;
    ctx.slot_offset = kSlot;
    ctx.binding_count = 1;
    ctx.bindings[0] = {kHeader, (uint64_t)(uintptr_t)ring.slots(), s.msg, s.cap, s.placement,
                       MESH_PROTOCOL_BULK | (s.parts > 1 ? s.parts << MESH_BULK_PARTS_SHIFT : 0u)};

    const uint64_t t1 = s.start + s.first, t2 = s.start + s.total;
    d.launch(ctx, t1, s.start, "launch 1");
    if (failures != failures_before) {
        std::printf("FAIL %s\n", g_current.c_str());
        g_driver = nullptr;
        std::free(ring.base);
        return false;
    }
    uint64_t start2 = s.producer ? t1 + s.cap : t1;
    if (d.count >= 2) {
        // As a launch of more blocks would have left the block's parts: part first + 1 a message
        // further than the others.
        if (s.producer) {
            // Drained; then part first + 1's old block wrote message m and its flag (head unpublished),
            // the others' wrote their bytes but no flag. The open continues past m and completes m.
            d.host_limit = d.limit = start2 + s.cap;
            d.frozen = false;
            while (d.end != start2) d.step();
            const uint64_t m = start2;
            uint32_t* w = ring.words(m);
            for (uint32_t k = d.first * ring.part_words(); k < (d.first + d.count) * ring.part_words(); k++)
                st_word(&w[k], value(m, k));
            st(ring.flag(m, d.first + 1), m + 1);
            start2 = m + 1;
        } else {
            // Message t1 sent; part first + 1's old block took its part of it, the others' none. The
            // open skips it, moving the other parts' tails past it.
            d.host_limit = d.limit = t1 + 1;
            d.frozen = false;
            while (d.end != t1 + 1) d.step();
            st(ring.tail_line(d.first + 1), t1 + 1);
            start2 = t1 + 1;
        }
    }
    d.launch(ctx, t2, start2, "launch 2");
    if (s.producer) {
        // Everything the block sent is read and checked.
        std::snprintf(g_where, sizeof g_where, "%s, draining", g_current.c_str());
        d.host_limit = d.limit = t2 + s.cap;
        d.frozen = false;
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(15);
        while (d.end != t2 + s.cap && std::chrono::steady_clock::now() < give_up) d.step();
        if (d.end != t2 + s.cap) fail("messages left unread (read up to)", d.at(d.end));
    }
    if (g_errors) {
        fail("words the block found wrong (message, word)", d.at(g_err_seq), (long long)g_err_word);
        std::fprintf(stderr, "  %llu words wrong; the first held %#x, not %#x\n", (unsigned long long)g_errors.load(),
                     (unsigned)g_err_got, value(g_err_seq, (uint32_t)g_err_word));
    }
    g_driver = nullptr;
    std::free(ring.base);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s %s (%.0f ms)\n", failures == failures_before ? "ok  " : "FAIL", g_current.c_str(), ms);
    std::fflush(stdout);
    return failures == failures_before;
}

// The format's offsets against bulk.rs's own test (parts_lay_out_flags_then_lines_then_payloads).
void check_layout() {
    Ring r{nullptr, 32, 4, 32 * 16};
    if (r.payload_off() != 12288 || r.lines_off() != 1024)
        fail("layout: 32 parts, capacity 4");
    Ring q{nullptr, 2, 1, 64};
    if (q.lines_off() + 2 * MESH_LINE != 128 + 256 || q.payload_off() != 4096) fail("layout: 2 parts, capacity 1");
    Ring o{nullptr, 1, 8, 48};
    if (o.payload_off() != 4096) fail("layout: one part");
}

// The probes' channel (P = 2, capacity 2, messages of 2 x 64 bytes, one producer block serving both
// parts), as a launch of two producer blocks left it: part 0 written to 4, its consumer at 2; part 1
// written to 2, its consumer at 0. Allocated here (the caller frees ring.base); *ctx binds it.
Ring probe_ring(mesh_ctx* ctx) {
    const uint32_t kMsg = 2 * 64, kCap = 2;
    Ring ring{nullptr, 2, kCap, kMsg};
    const uint64_t bytes = round_up(ring.bytes(), kPage);
    ring.base = (char*)std::aligned_alloc(kPage, bytes);
    std::memset(ring.base, 0, bytes);
    const uint32_t pw = ring.part_words();
    auto write_part = [&](uint64_t seq, uint32_t p) {
        for (uint32_t k = p * pw; k < (p + 1) * pw; k++) st_word(&ring.words(seq)[k], value(seq, k));
        st(ring.flag(seq, p), seq + 1);
    };
    for (uint64_t seq = 2; seq < 4; seq++) write_part(seq, 0);  // part 0: 0, 1 read, 2, 3 in the ring
    for (uint64_t seq = 0; seq < 2; seq++) write_part(seq, 1);  // part 1: 0, 1 in the ring, unread
    st(ring.head_line(0), 4);
    st(ring.tail_line(0), 2);
    st(ring.head_line(1), 2);
    st(ring.tail_line(1), 0);
    g_copy = false;
    std::memset(ctx, 0, sizeof *ctx);
    ctx->base = (uint64_t)(uintptr_t)ring.base;
    ctx->slot_offset = kSlot;
    ctx->binding_count = 1;
    ctx->bindings[0] = {kHeader, (uint64_t)(uintptr_t)ring.slots(), kMsg, kCap, MESH_PLACEMENT_HOST,
                        MESH_PROTOCOL_BULK | (2u << MESH_BULK_PARTS_SHIFT)};
    return ring;
}

// Two consumer blocks, one a part, each taking its part's whole messages up to 6 (for up to 2 s).
void drain_probe(const Ring& ring, uint64_t tail[2]) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while ((tail[0] < 6 || tail[1] < 6) && std::chrono::steady_clock::now() < give_up) {
        for (uint32_t p = 0; p < 2; p++)
            while (tail[p] < 6 && ld(ring.flag(tail[p], p)) == tail[p] + 1) st(ring.tail_line(p), ++tail[p]);
        std::this_thread::yield();
    }
}

// A REGRESSION TEST (`probe-resume-full`, run by tests/bulk_emulation.rs): a producer block serving
// several parts resumes where a launch of more blocks left them disagreeing, and a part behind has no
// room at the open (its ring full: its consumer is a block of its own, behind). mesh_bulk_open_part
// used to complete that part only as far as room allowed then, and nothing completed the rest later
// (bulk.rs's producer keeps `behind` and catches up as room comes): the publishes store the block's
// position in every part's flag, so that part's consumer waited for the flag of a message no one
// writes and the producer for room only that consumer frees; mesh_bulk_close then published the
// part's head past the unwritten flags, so a relaunch (or a host producer) resumed past them too: the
// part stayed stuck (part 1's consumer at 2 across a relaunch). The open now waits for that consumer
// and completes the part as it frees slots. Here P = 2, capacity 2, one producer block: part 0 written
// to 4, its consumer at 2; part 1 written to 2, its consumer at 0. Both parts' consumers must reach 6.
int probe_resume_full() {
    g_current = "probe: resume with a part behind and full";
    mesh_ctx ctx;
    Ring ring = probe_ring(&ctx);
    // Two consumer blocks, one a part, each reading its part's whole messages up to 6; then the same
    // after a relaunch of the producer (which resumes from what the first launch's close published).
    uint64_t tail[2] = {2, 0};
    for (int launch = 1; launch <= 2; launch++) {
        st(ring.base + kSlot + MESH_SLOT_STOP, 0);
        g_opened = false;
        std::thread block([&] { emu_run_block(1, [&](uint32_t) { produce(ctx); }); });
        // The state above is what the open finds: its consumers start once it returned, or after
        // 100 ms (it waits for part 1's consumer, which it needs to free a slot).
        const auto opened_by = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (!g_opened && std::chrono::steady_clock::now() < opened_by) std::this_thread::yield();
        drain_probe(ring, tail);
        st(ring.base + kSlot + MESH_SLOT_STOP, 1);
        block.join();
        std::printf("probe, launch %d: part 0's consumer reached %llu, part 1's %llu (6 each expected); heads %llu "
                    "and %llu, producer from %llu to %llu\n",
                    launch, (unsigned long long)tail[0], (unsigned long long)tail[1],
                    (unsigned long long)ld(ring.head_line(0)), (unsigned long long)ld(ring.head_line(1)),
                    (unsigned long long)g_start, (unsigned long long)g_end);
    }
    std::free(ring.base);
    const bool ok = tail[0] == 6 && tail[1] == 6;
    std::printf(ok ? "probe: delivered\n" : "probe: stuck (a part behind never completed)\n");
    return ok ? 0 : 1;
}

// The same resume, with a stop while the open waits: part 1's consumer does not move during the first
// launch, and meshd stops it. The open must return (an end whose every call fails: msg_size 0) without
// writing a flag part 1's consumer has no room for and without publishing part 1's head past the gap;
// a second launch, with the consumers draining, then delivers every message.
int probe_stop_while_resuming() {
    g_current = "probe: a stop while the open waits for a part behind";
    mesh_ctx ctx;
    Ring ring = probe_ring(&ctx);
    bool ok = true;
    // Launch 1: nobody consumes; the stop comes while the open waits.
    st(ring.base + kSlot + MESH_SLOT_STOP, 0);
    g_refused = false;
    {
        std::thread block([&] { emu_run_block(1, [&](uint32_t) { produce(ctx); }); });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        st(ring.base + kSlot + MESH_SLOT_STOP, 1);
        block.join();
    }
    const uint64_t head1 = ld(ring.head_line(1)), flag2 = ld(ring.flag(2, 1));
    std::printf("probe, stopped launch: refused %d, part 1's head %llu (2 expected), its flag at 2: %llu (not 3)\n",
                (int)g_refused, (unsigned long long)head1, (unsigned long long)flag2);
    ok &= g_refused && head1 == 2 && flag2 != 3 && ld(ring.head_line(0)) == 4;
    // Launch 2: the consumers drain; everything arrives.
    uint64_t tail[2] = {2, 0};
    st(ring.base + kSlot + MESH_SLOT_STOP, 0);
    g_opened = false;
    g_refused = false;
    std::thread block([&] { emu_run_block(1, [&](uint32_t) { produce(ctx); }); });
    drain_probe(ring, tail);
    st(ring.base + kSlot + MESH_SLOT_STOP, 1);
    block.join();
    std::printf("probe, second launch: part 0's consumer reached %llu, part 1's %llu (6 each expected)\n",
                (unsigned long long)tail[0], (unsigned long long)tail[1]);
    ok &= tail[0] == 6 && tail[1] == 6;
    std::free(ring.base);
    std::printf(ok ? "probe: stopped cleanly, then delivered\n" : "probe: a stop while resuming went wrong\n");
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "all";
    // A deadlock fails rather than hangs: the emulated block waits forever on a ring that never moves.
    std::thread([] {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!g_finished && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (g_finished) return;
        std::fprintf(stderr, "TIMEOUT: no end after 60 s (deadlock?) in %s\n", g_where);
        if (Driver* d = g_driver.load()) d->report();
        std::fflush(stderr);
        std::_Exit(3);
    }).detach();
    if (mode == "probe-resume-full") {
        const int rc = probe_resume_full();
        g_finished = true;
        return rc;
    }
    if (mode == "probe-stop-while-resuming") {
        const int rc = probe_stop_while_resuming();
        g_finished = true;
        return rc;
    }
    if (mode != "all" && mode != "producer" && mode != "consumer") {
        std::fprintf(stderr, "usage: %s [all | producer | consumer | probe-resume-full | probe-stop-while-resuming]\n", argv[0]);
        return 2;
    }
    check_layout();
    constexpr uint32_t H = MESH_PLACEMENT_HOST, D = MESH_PLACEMENT_DEVICE;
    constexpr uint64_t kNear32 = (1ull << 32) - 3;  // the indices cross 2^32 during the run
    // Shapes: {parts, blocks, block, msg, capacity, placement, start}. The message sizes: fewer 16-byte
    // units than threads (1 KiB), a ragged count past the copy's 4-unit rounds (4144: 259 units), enough
    // for several rounds of 256 threads (16432: 1027 units), and parts' shares likewise.
    struct Shape {
        uint32_t parts, blocks, block, msg, cap, placement;
        uint64_t start;
    };
    const Shape shapes[] = {
        {1, 1, 0, 1024, 2, H, 0},              // the format before parts
        {2, 1, 0, 2 * 528, 1, H, 0},           // capacity 1: a resuming consumer must move the tail behind
        {4, 2, 0, 4 * 272, 1, D, kNear32},     // block 0 of 2, capacity 1
        {1, 1, 0, 4144, 4, D, kNear32},        // ragged, device placement, indices across 2^32
        {1, 1, 0, 16432, 2, H, 0},             // several copy rounds
        {4, 2, 1, 4 * 1040, 4, H, 0},          // block 1 of 2: parts 2 and 3
        {4, 4, 0, 4 * 4096, 2, H, kNear32},    // block 0 of 4: part 0 alone, the header's bound
        {8, 1, 0, 8 * 528, 4, D, 0},           // one block serving all 8 parts
        {32, 32, 31, 32 * 256, 2, H, 0},       // the last part's lines, far out
        {32, 1, 0, 32 * 64, 4, H, kNear32},    // 32 parts in one block: a lookahead of one message
    };
    uint32_t ran = 0;
    for (const bool producer : {true, false}) {
        if ((mode == "producer" && !producer) || (mode == "consumer" && producer)) continue;
        for (const bool copy : {true, false})
            for (const Shape& h : shapes)
                for (const uint32_t w : {1u, 2u, 8u}) {  // 8 warps: 256 threads, the most the emulation runs
                    // Fewer messages for 256 threads (each barrier costs them all a wake-up), still
                    // several laps of the ring.
                    const uint32_t n1 = w == 8 ? 5 : 8, n2 = w == 8 ? 14 : 30;
                    // The first failing scenario ends the run: the rest would only repeat it, slowly.
                    if (failures != 0) continue;
                    run({producer, copy, h.parts, h.blocks, h.block, w, h.msg, h.cap, h.placement, h.start, n1, n2});
                    ran++;
                }
    }
    g_finished = true;
    std::printf("%u scenarios (MESH_BULK_LOOKAHEAD %u, EMU_SEND_N %u, EMU_RECV_N %u)\n", ran,
                (unsigned)MESH_BULK_LOOKAHEAD, (unsigned)EMU_SEND_N, (unsigned)EMU_RECV_N);
    if (failures) {
        std::fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    std::printf("all passed\n");
    return 0;
}
