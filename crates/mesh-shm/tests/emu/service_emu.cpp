// service_emu.cpp: a service program of tests/programs (PROGRAM: service.cu, or service_x_serial.cu) run
// on the CPU as one block of WARPS emulated warps (warp_emu.h), against a fan-in channel of
// SHARDS shards and a channel group laid out as mesh-shm lays them out. A driver thread plays the
// clients and meshd: it sends each client's numbered requests into its shard (room from the shard's
// published tail), reads every reply from the client's ring and checks it (the request's number, word 1
// plus one, the rest as sent, in order), makes a quarter of the clients depart half way (entry
// DEPARTED, `changes` bumped) with requests in flight, and once the program acknowledges a departure
// binds the slot to a new client as meshd's connect does (the ring reset, tail := the published head;
// the next epoch), whose own requests, numbered from 0 and with bodies of their own, must be answered
// in order while nothing of the departed client's reaches it; then stops the program and checks its
// counts (user words: sent, skips, gone, departures). Built and run by tests/warp_emulation.rs, e.g.
// `g++ -std=c++20 -O1 -pthread -I ../../include -I ../../../../tests/programs -DPROGRAM='"service.cu"'
// service_emu.cpp -o service_emu && ./service_emu 8 1` (8 shards, one warp).
// Built with -DEMU_GRID=G and linked with G copies of service_block.cpp (block K's kernel renamed
// mesh_main_bK), it runs `service_emu SHARDS WARPS BLOCKS`: BLOCKS blocks of WARPS warps at once, as
// `meshd load --grid BLOCKS` does, and checks that the program's device-memory counters are zero again
// after the launch (the last block out zeroes them for the next one).
#include "warp_emu.h"
#define MESH_GROUP_PERIOD_NS 0u  // look at `changes` on every call (the emulation's time runs slow)
#ifdef EMU_GRID
#include "mesh.cuh"
extern "C" void mesh_main_b0(mesh_ctx);
extern "C" void mesh_main_b1(mesh_ctx);
extern "C" void mesh_main_b2(mesh_ctx);
extern "C" void mesh_main_b3(mesh_ctx);
static void (*const kBlockMains[4])(mesh_ctx) = {mesh_main_b0, mesh_main_b1, mesh_main_b2, mesh_main_b3};
static_assert(EMU_GRID == 4, "service_block.cpp is linked in four times");
// service.cu's launch counters, one for every block's copy of the program.
extern uint32_t service_totals[8], service_finished, service_failed;
#else
#include PROGRAM
#endif

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

uint32_t SHARDS = 1, WARPS = 1, BLOCKS = 1;  // from the command line: `service_emu SHARDS WARPS [BLOCKS]`

constexpr uint64_t kPage = 4096;
#ifndef EMU_MSG
#define EMU_MSG 64u  // the request (and reply) size: -DEMU_MSG=1024 and 4096 run larger ones
#endif
constexpr uint32_t kMsg = EMU_MSG, kWords = kMsg / 4;
constexpr uint32_t kCapacity = 8;        // fan-in slots per shard
constexpr uint32_t kReplyCapacity = 4;   // replies per client ring
constexpr uint32_t kClients = 16, kRequests = 40, kWindow = 3;  // kWindow: requests a client keeps unanswered
static_assert(kWindow >= 1 && kWindow <= kReplyCapacity, "a client's window fits its reply ring");
constexpr uint64_t kSlot = 512;          // the program's slot
constexpr uint64_t kFaninHeader = 4096;  // shard 0's ring header
constexpr uint64_t kRegion = 8192;       // the fan-in's slots region

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
constexpr uint64_t stride_of_fanin() { return 16 + 2 * (uint64_t)kMsg; }
uint64_t owners() { return round_up(8 * (uint64_t)kCapacity, kPage); }
uint64_t span() { return round_up(owners() + stride_of_fanin() * kCapacity, kPage); }
uint64_t shard_header(uint32_t k) { return k == 0 ? kFaninHeader : kRegion + span() + (k - 1) * (kPage + span()); }
uint64_t shard_slots(uint32_t k) { return k == 0 ? kRegion + owners() : shard_header(k) + kPage + owners(); }
uint64_t group_at() { return round_up(shard_header(SHARDS) + kPage, kPage); }  // past the last shard
uint64_t ring_stride() { return MESH_RING_SLOTS + round_up((uint64_t)kMsg * 2 * kReplyCapacity, MESH_LINE); }
uint64_t entry_at(uint32_t c) { return group_at() + MESH_GROUP_HEADER_SIZE + (uint64_t)c * MESH_GROUP_ENTRY_SIZE; }
uint64_t ring_at(uint32_t c) {
    return group_at() + MESH_GROUP_HEADER_SIZE + (uint64_t)kClients * MESH_GROUP_ENTRY_SIZE + c * ring_stride();
}
uint64_t bytes() { return ring_at(kClients) + kPage; }

std::vector<uint64_t> memory;
char* base;
int failures;
uint64_t replies_read_total;  // the driver's, read by main after it joined

void fail(const char* what, long a = 0, long b = 0) {
    if (failures++ < 20)
        std::fprintf(stderr, "FAIL (%s, %u shards, %u warps, %u blocks): %s [%ld, %ld]\n", PROGRAM, SHARDS, WARPS, BLOCKS, what, a, b);
}
uint64_t ld(uint64_t off) { return emu_ld(base + off); }
void st(uint64_t off, uint64_t v) { emu_st(base + off, v); }
// A request body word of client slot c at epoch e: a departed client's reply that reached the slot's
// next client would be seen as wrong (its number, and every word of its body).
uint32_t body_word(uint32_t c, uint32_t e, uint32_t n, uint32_t i) { return c * 7919u + n * 104729u + i * 31u + e * 15485863u; }

// The driver: clients and meshd.
void drive() {
    uint32_t sent[kClients] = {}, got[kClients] = {}, epoch[kClients];
    uint64_t reply_tail[kClients] = {}, produced[32] = {};
    bool departed[kClients] = {}, rebound[kClients] = {};
    uint32_t departures = 0;
    for (uint32_t c = 0; c < kClients; c++) epoch[c] = 1;
    uint64_t replies_read = 0;
    // Stuck means no reply for 60 s, not a slow run: a loaded CI machine starves the warps' threads
    // for seconds at a time, so the deadline moves with every reply read.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    uint64_t replies_at_deadline = 0;
    for (;;) {
        if (replies_read != replies_at_deadline) {
            replies_at_deadline = replies_read;
            deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        }
        bool done = true;
        for (uint32_t c = 0; c < kClients; c++) {
            const bool leaves = c % 4 == 3 && !rebound[c];  // each such slot once: its next client stays
            // Send while the window and the shard have room.
            const uint32_t k = c % SHARDS;
            while (!departed[c] && sent[c] < kRequests && sent[c] - got[c] < kWindow &&
                   produced[k] - ld(shard_header(k) + MESH_RING_TAIL) < kCapacity) {
                const uint64_t seq = produced[k]++;
                uint64_t* w = (uint64_t*)(base + shard_slots(k) + (seq & (kCapacity - 1)) * stride_of_fanin());
                const uint64_t tag = (uint64_t)mesh_detail_tag(seq) << 32;
                emu_st(&w[2], tag | sent[c]);                      // request word 0: its number
                emu_st(&w[3], tag | (sent[c] * 3u + 1u));          // word 1: the service adds one
                for (uint32_t i = 2; i < kWords; i++) emu_st(&w[2 + i], tag | body_word(c, epoch[c], sent[c], i));
                emu_st(&w[1], tag | MESH_FANIN_KIND_DATA);
                emu_st(&w[0], tag | (c | epoch[c] << 16));         // the commit: slot c at its epoch
                sent[c]++;
            }
            // A quarter of the clients leave half way, with requests in flight (answered before the
            // program acknowledges the departure, or dropped as GONE after it).
            if (leaves && !departed[c] && got[c] >= kRequests / 2 && sent[c] > got[c]) {
                departed[c] = true;  // meshd: the entry departs; the program must acknowledge it
                departures++;
                st(entry_at(c) + MESH_GROUP_ENTRY_BINDING, (uint64_t)MESH_GROUP_DEPARTED << 32 | epoch[c]);
                st(group_at() + MESH_GROUP_CHANGES, ld(group_at() + MESH_GROUP_CHANGES) + 1);
            }
            // Read every whole reply.
            auto read_replies = [&] {
                for (;;) {
                    const uint64_t t = reply_tail[c];
                    const uint64_t* r = (const uint64_t*)(base + ring_at(c) + MESH_RING_SLOTS + (t & (kReplyCapacity - 1)) * kMsg * 2);
                    bool whole = true;
                    for (uint32_t i = 0; i < kWords; i++) whole &= (uint32_t)(emu_ld(&r[i]) >> 32) == mesh_detail_tag(t);
                    if (!whole) break;
                    const uint32_t n = (uint32_t)emu_ld(&r[0]);
                    if (n != got[c]) fail("reply out of order", c, n);
                    if ((uint32_t)emu_ld(&r[1]) != n * 3u + 2u) fail("reply word 1", c, n);
                    for (uint32_t i = 2; i < kWords; i++)
                        if ((uint32_t)emu_ld(&r[i]) != body_word(c, epoch[c], n, i)) fail("reply body", c | epoch[c] << 16, i);
                    got[c]++;
                    replies_read++;
                    reply_tail[c] = t + 1;
                    st(ring_at(c) + MESH_RING_TAIL, t + 1);
                }
            };
            read_replies();
            if (departed[c] && (uint32_t)ld(entry_at(c) + MESH_GROUP_ENTRY_ACKED) == epoch[c]) {
                // The ack is released after every reply the program wrote to this client: those that
                // landed between the read above and the ack are read now, before the ack counts.
                read_replies();
                // meshd's connect of the slot's next client: the ring reset to the program's exact head
                // (written before the ack), the next epoch bound, `changes` bumped. Anything the
                // program writes for the departed client from now on is read, and failed, as the new
                // client's.
                const uint64_t head = ld(ring_at(c) + MESH_RING_HEAD);
                if (head != reply_tail[c]) fail("published head at the ack, not what the client read", c, (long)head);
                st(ring_at(c) + MESH_RING_TAIL, head);
                reply_tail[c] = head;
                epoch[c]++;
                sent[c] = got[c] = 0;
                departed[c] = false;
                rebound[c] = true;
                st(entry_at(c) + MESH_GROUP_ENTRY_BINDING, (uint64_t)MESH_GROUP_BOUND << 32 | epoch[c]);
                st(group_at() + MESH_GROUP_CHANGES, ld(group_at() + MESH_GROUP_CHANGES) + 1);
            }
            if (departed[c] || got[c] < kRequests) done = false;
        }
        if (done) break;
        if (std::chrono::steady_clock::now() > deadline) {
            for (uint32_t c = 0; c < kClients; c++)
                if (departed[c] || got[c] < kRequests) fail("client stuck (id, sent * 1000 + got)", c | epoch[c] << 16, sent[c] * 1000 + got[c]);
            break;
        }
        std::this_thread::yield();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (uint32_t c = 0; c < kClients; c++) {  // a last look: no reply past the last one asked for
        const uint64_t* r = (const uint64_t*)(base + ring_at(c) + MESH_RING_SLOTS +
                                              (reply_tail[c] & (kReplyCapacity - 1)) * kMsg * 2);
        if ((uint32_t)(emu_ld(&r[0]) >> 32) == mesh_detail_tag(reply_tail[c])) fail("a reply past the last request", c);
    }
    st(kSlot + MESH_SLOT_STOP, 1);  // meshd: stop
    uint64_t expected_sent = replies_read;
    // Set by the program at its stop (user words 0-4); the block has not ended yet: the caller checks.
    std::printf("driver: %llu replies read, %u departures (each slot bound again)\n", (unsigned long long)expected_sent,
                departures);
    replies_read_total = expected_sent;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 || argc == 4) {
        SHARDS = (uint32_t)std::atoi(argv[1]);
        WARPS = (uint32_t)std::atoi(argv[2]);
        if (argc == 4) BLOCKS = (uint32_t)std::atoi(argv[3]);
    }
#ifdef EMU_GRID
    const uint32_t most_blocks = EMU_GRID;
#else
    const uint32_t most_blocks = 1;
#endif
    if (SHARDS == 0 || SHARDS > MESH_FANIN_MAX_SHARDS || (SHARDS & (SHARDS - 1)) != 0 || WARPS == 0 || BLOCKS == 0 ||
        BLOCKS > most_blocks || WARPS * BLOCKS > EMU_MAX_WARPS) {
        std::fprintf(stderr, "usage: %s SHARDS WARPS [BLOCKS] (shards a power of two to %u, warps x blocks 1 to %u, blocks to %u)\n",
                     argv[0], MESH_FANIN_MAX_SHARDS, EMU_MAX_WARPS, most_blocks);
        return 2;
    }
    memory.assign(bytes() / 8, 0);
    base = (char*)memory.data();
    // The group's header and entries, as meshd writes them: every client bound at epoch 1.
    emu_st32(base + group_at() + MESH_GROUP_ENTRIES, kClients);
    emu_st32(base + group_at() + MESH_GROUP_MSG_SIZE, kMsg);
    emu_st32(base + group_at() + MESH_GROUP_CAPACITY, kReplyCapacity);
    st(group_at() + MESH_GROUP_RING_STRIDE, ring_stride());
    for (uint32_t c = 0; c < kClients; c++) st(entry_at(c) + MESH_GROUP_ENTRY_BINDING, (uint64_t)MESH_GROUP_BOUND << 32 | 1u);
    mesh_ctx ctx;
    std::memset(&ctx, 0, sizeof ctx);
    ctx.base = (uint64_t)(uintptr_t)base;
    ctx.slot_offset = kSlot;
    ctx.binding_count = 2;
    ctx.bindings[0] = {kFaninHeader, (uint64_t)(uintptr_t)(base + shard_slots(0)), kMsg, kCapacity, MESH_PLACEMENT_HOST,
                       MESH_PROTOCOL_FANIN | (SHARDS > 1 ? SHARDS << MESH_BULK_PARTS_SHIFT : 0u)};
    ctx.bindings[1] = {1024, (uint64_t)(uintptr_t)(base + group_at()), kMsg, kReplyCapacity, MESH_PLACEMENT_HOST,
                       MESH_PROTOCOL_GROUP};
    std::thread driver(drive);
    emu_watch_stop(base + kSlot + MESH_SLOT_STOP);  // each warp's lanes see the stop at the same barrier
#ifdef EMU_GRID
    emu_run_grid(BLOCKS, WARPS, [&](uint32_t b, uint32_t) { kBlockMains[b](ctx); });
#else
    emu_run_block(WARPS, [&](uint32_t) { mesh_main(ctx); });
#endif
    driver.join();
    uint32_t words[8];
    for (uint32_t i = 0; i < 8; i++) words[i] = emu_ld32(base + kSlot + MESH_SLOT_USER + 4 * i);
    const int32_t exit_code = (int32_t)emu_ld32(base + kSlot + MESH_SLOT_EXIT_CODE);
    std::printf("%s, %u-byte requests, %u shards, %u warps, %u blocks: program sent %u, skips %u, gone %u, full %u, departures %u, launches %u, exit %d\n",
                PROGRAM, kMsg, SHARDS, WARPS, BLOCKS, words[0], words[1], words[2], words[3], words[4], words[6], exit_code);
#ifdef EMU_GRID
    for (uint32_t i = 0; i < 8; i++)
        if (service_totals[i] != 0) fail("a launch counter not zeroed for the next launch", i, service_totals[i]);
    if (service_finished != 0 || service_failed != 0) fail("blocks finished / failed not zeroed", service_finished, service_failed);
#endif
    if (exit_code != 0) fail("the program exited with a code", exit_code);
    if (words[4] != kClients / 4) fail("departures acknowledged", words[4], kClients / 4);
    if (words[1] != 0) fail("skips (no send was cut off)", words[1]);
    if (words[0] != replies_read_total) fail("replies the program sent, and the clients read", words[0], (long)replies_read_total);
    if (words[6] != 1) fail("launches", words[6]);
    if (failures) {
        std::fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    std::printf("all passed\n");
    return 0;
}
