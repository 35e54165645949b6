// fanin_shards.cpp: mesh.cuh's fan-in consumer calls (mesh_fanin_open / peek / consume / take_deferred /
// commit / take / close), one ring and sharded, run as one warp on the CPU (warp_emu.h) against a fan-in
// region laid out as mesh-shm's layout.rs lays it out, with requests written as fanin.rs's producers
// write them (tagged words, the commit word last; some torn and finished later, some skips). A model
// of each shard checks every batch: each shard's requests are the front of its whole ones, in order,
// contiguous in the batch; senders, payloads and skip bits as written; at most `max`; every request
// taken exactly once by the end; each shard's published tail never ahead of what was given back (nor,
// after mesh_fanin_take, of the request it just took and that is not yet answered), and
// equal to it after the close; a reopen resumes there. Built and run by tests/warp_emulation.rs:
// `g++ -std=c++20 -O1 -pthread -I ../../include fanin_shards.cpp && ./a.out` (exit 0: all passed).
#include "warp_emu.h"
#include "mesh.cuh"

#include <cstdio>
#include <cstdlib>
#include <deque>

namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint64_t kRingOffset = 4096;  // shard 0's header (any non-zero offset in the "mailbox")
constexpr uint64_t kRegion = 8192;      // the slots region: page aligned

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Geometry {
    uint32_t shards, capacity, msg_size;
    uint64_t stride() const { return 16 + 2 * (uint64_t)msg_size; }
    uint64_t owners() const { return round_up(8 * (uint64_t)capacity, kAlign); }                  // fanin_slots_offset
    uint64_t span() const { return round_up(owners() + stride() * capacity, kAlign); }            // fanin_shard_span
    uint64_t shard_header(uint32_t k) const { return k == 0 ? kRingOffset : kRegion + span() + (k - 1) * (kAlign + span()); }
    uint64_t shard_slots(uint32_t k) const {
        return k == 0 ? kRegion + owners() : shard_header(k) + kAlign + owners();
    }
    uint64_t bytes() const { return kRegion + span() + (uint64_t)(shards - 1) * (kAlign + span()) + kAlign; }
};

struct Request {
    uint64_t seq;
    uint32_t sender, kind, seed;
    bool whole;
};

// Shared by the lanes (lane 0 writes between barriers; every lane reads after one).
Geometry g;
std::vector<uint64_t> memory;  // 8-byte words: the "mailbox"
char* base;
std::deque<Request> queue[32];   // per shard: requests produced and not yet given back, in order
uint64_t produced[32];           // per shard: the next sequence number
uint32_t shared_max, shared_consume, shared_mode;
uint32_t rng_state = 12345;
int failures;
uint64_t taken_total, skips_total;

uint32_t rnd() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

void fail(const char* what, long a = 0, long b = 0) {
    if (failures++ < 20) std::fprintf(stderr, "FAIL (P=%u, msg %u): %s [%ld, %ld]\n", g.shards, g.msg_size, what, a, b);
}

uint32_t payload(uint32_t seed, uint32_t i) { return seed * 2654435761u + i * 40503u; }

uint64_t* slot_words(uint32_t k, uint64_t seq) {
    return (uint64_t*)(base + g.shard_slots(k) + (seq & (g.capacity - 1)) * g.stride());
}

// Writes request `r` into shard k as a producer does: the body, the kind word, then the commit word.
// `torn`: one body word keeps its old tag (still arriving); `finish` writes the whole again.
void write_request(uint32_t k, const Request& r, bool torn) {
    uint64_t* w = slot_words(k, r.seq);
    const uint64_t tag = (uint64_t)mesh_detail_tag(r.seq) << 32;
    const uint32_t body = g.msg_size / 4;
    for (uint32_t i = 0; i < body; i++)
        if (!(torn && i == body / 2)) emu_st(&w[2 + i], tag | payload(r.seed, i));
    emu_st(&w[1], tag | r.kind);
    emu_st(&w[0], tag | r.sender);
}

// Lane 0: produce a few requests (random clients, skips, torn ones) and finish some torn ones.
void produce_some(bool any) {
    const uint32_t count = any ? rnd() % 7 : 0;
    for (uint32_t i = 0; i < count; i++) {
        const uint32_t client = rnd() % 64;
        const uint32_t k = client % g.shards;
        if (produced[k] - (queue[k].empty() ? produced[k] : queue[k].front().seq) >= g.capacity) continue;  // full
        Request r{produced[k]++, client | (1u + rnd() % 3) << 16, rnd() % 10 == 0 ? (uint32_t)MESH_FANIN_KIND_SKIP : 0u,
                  rnd(), rnd() % 8 != 0};
        if (r.kind == MESH_FANIN_KIND_SKIP) r.whole = true;  // a skip is taken whatever its body holds
        write_request(k, r, !r.whole);
        queue[k].push_back(r);
    }
    for (uint32_t k = 0; k < g.shards; k++)
        for (auto& r : queue[k])
            if (!r.whole && (rnd() % 3 == 0 || !any)) {
                r.whole = true;
                write_request(k, r, false);
            }
}

// Lane 0: checks a batch against the model; returns each shard's count in it (-1 entries: bad).
void check_batch(uint32_t n, const uint32_t* buf, const uint32_t* senders, uint32_t skipped, uint32_t max,
                 uint32_t counts[32]) {
    for (uint32_t k = 0; k < 32; k++) counts[k] = 0;
    if (n > max) fail("more requests than max", n, max);
    int last_shard = -1;
    bool seen[32] = {};
    for (uint32_t j = 0; j < n; j++) {
        const uint32_t k = (senders[j] & 0xffffu) % g.shards;
        if ((int)k != last_shard) {
            if (seen[k]) fail("a shard's requests not contiguous in the batch", k, j);
            seen[k] = true;
            last_shard = (int)k;
        }
        const uint32_t at = counts[k]++;
        if (at >= queue[k].size()) {
            fail("a request the shard does not hold", k, at);
            continue;
        }
        const Request& r = queue[k][at];
        if (!r.whole) fail("a torn request returned", k, (long)r.seq);
        if (r.sender != senders[j]) fail("sender", (long)r.sender, (long)senders[j]);
        const bool skip = (skipped >> j) & 1u;
        if (skip != (r.kind == MESH_FANIN_KIND_SKIP)) fail("skip bit", j, skip);
        if (!skip)
            for (uint32_t i = 0; i < g.msg_size / 4; i++)
                if (buf[j * (g.msg_size / 4) + i] != payload(r.seed, i)) {
                    fail("payload word", (long)r.seq, i);
                    break;
                }
    }
}

// Lane 0: the first n of the batch given back.
void consume_model(uint32_t n, const uint32_t* senders) {
    for (uint32_t j = 0; j < n; j++) {
        const uint32_t k = (senders[j] & 0xffffu) % g.shards;
        if (!queue[k].empty()) {
            skips_total += queue[k].front().kind == MESH_FANIN_KIND_SKIP;
            queue[k].pop_front();
        }
        taken_total++;
    }
}

uint64_t tail_of(uint32_t k) { return emu_ld(base + g.shard_header(k) + MESH_RING_TAIL); }
uint64_t given_back(uint32_t k) { return queue[k].empty() ? produced[k] : queue[k].front().seq; }

void check_tails(bool exact) {
    for (uint32_t k = 0; k < g.shards; k++) {
        const uint64_t t = tail_of(k), want = given_back(k);
        if (exact ? t != want : t > want) fail(exact ? "tail after close" : "tail ahead of what was given back", (long)t, (long)want);
    }
}

void run(uint32_t shards, uint32_t capacity, uint32_t msg_size, uint32_t rounds) {
    g = Geometry{shards, capacity, msg_size};
    memory.assign(g.bytes() / 8, 0);
    base = (char*)memory.data();
    for (auto& q : queue) q.clear();
    for (auto& p : produced) p = 0;
    static uint32_t buf[MESH_FANIN_BATCH_MAX * 8192 / 4];
    static uint32_t senders[MESH_FANIN_BATCH_MAX];
    mesh_ctx ctx;
    std::memset(&ctx, 0, sizeof ctx);
    ctx.base = (uint64_t)(uintptr_t)base;
    ctx.binding_count = 1;
    ctx.bindings[0].ring_offset = kRingOffset;
    ctx.bindings[0].slots = (uint64_t)(uintptr_t)(base + g.shard_slots(0));
    ctx.bindings[0].msg_size = msg_size;
    ctx.bindings[0].capacity = capacity;
    ctx.bindings[0].placement = MESH_PLACEMENT_HOST;
    ctx.bindings[0].protocol = MESH_PROTOCOL_FANIN | (shards > 1 ? shards << MESH_BULK_PARTS_SHIFT : 0u);
    emu_run_warp([&](uint32_t lane) {
        for (uint32_t launch = 0; launch < 2; launch++) {  // the second: a reopen resumes at the tails
            mesh_fanin f = mesh_fanin_open(ctx, 0);
            if (lane == 0 && (f.ch.msg_size != msg_size || f.shards != shards)) fail("open", f.ch.msg_size, f.shards);
            for (uint32_t round = 0; round < rounds + 64; round++) {
                const bool draining = round >= rounds;  // the last rounds: nothing new, every torn one finished
                if (lane == 0) {
                    produce_some(!draining);
                    const uint32_t r = rnd();
                    shared_max = draining ? 32u : (r % 3 == 0 ? 1u : r % 3 == 1 ? 5u : 32u);
                    // 1: the take (deferred, then committed); 2: the take that commits at once
                    shared_mode = draining ? 0u : r % 5 == 0 ? 1u : r % 5 == 1 ? 2u : 0u;
                }
                __syncwarp();
                const uint32_t max = shared_max;
                if (shared_mode == 2) {
                    uint32_t sender = 0;
                    const int took = mesh_fanin_take(&f, buf, &sender);
                    if (lane == 0 && took != MESH_TAKE_NONE) {
                        uint32_t counts[32];
                        check_batch(1, buf, &sender, took == MESH_TAKE_SKIP ? 1u : 0u, 1, counts);
                        // Taken, not yet answered: a tail published now must not pass it (a launch
                        // dying here must take it again: at-least-once).
                        check_tails(false);
                        consume_model(1, &sender);  // answered before the next call
                    }
                } else if (shared_mode) {
                    uint32_t sender = 0;
                    const int took = mesh_fanin_take_deferred(&f, buf, &sender);
                    if (lane == 0 && took != MESH_TAKE_NONE) {
                        uint32_t counts[32];
                        const uint32_t skipped = took == MESH_TAKE_SKIP ? 1u : 0u;
                        check_batch(1, buf, &sender, skipped, 1, counts);
                        consume_model(1, &sender);
                    }
                    __syncwarp();
                    mesh_fanin_commit(&f);
                } else {
                    uint32_t skipped = 0;
                    const uint32_t n = mesh_fanin_peek(&f, buf, senders, &skipped, max);
                    if (lane == 0) {
                        uint32_t counts[32];
                        check_batch(n, buf, senders, skipped, max, counts);
                        shared_consume = draining || rnd() % 4 != 0 ? n : rnd() % (n + 1);
                    }
                    __syncwarp();
                    const uint32_t d = shared_consume;
                    if (lane == 0) consume_model(d, senders);
                    __syncwarp();
                    mesh_fanin_consume(&f, d);
                }
                __syncwarp();
                if (lane == 0) check_tails(false);
                __syncwarp();
            }
            mesh_fanin_close(&f);
            __syncwarp();
            if (lane == 0) {
                check_tails(true);
                for (uint32_t k = 0; k < shards; k++)
                    if (!queue[k].empty()) fail("requests never taken", k, (long)queue[k].size());
            }
            __syncwarp();
        }
    });
    std::printf("P=%u capacity %u msg %u: %llu taken (%llu skips), %d failures so far\n", shards, capacity, msg_size,
                (unsigned long long)taken_total, (unsigned long long)skips_total, failures);
    taken_total = skips_total = 0;
}

}  // namespace

// A channel of 64 shards, more than one warp's 32 lanes hold: mesh_fanin_open refuses it (msg_size 0)
// and so does a part that would serve more than 32; mesh_fanin_parts gives 1, 2, 64 and 64 for 1, 2,
// 64 and 128 warps; warp p of 2 (mesh_detail_fanin_open_part) serves shards p, p + 2, ..., lane i shard
// p + 2i at that shard's published tail; warp 5 of 64 is a one-ring end over shard 5.
void check_64_shards() {
    g = {64, 4, 64};
    memory.assign(g.bytes() / 8, 0);
    base = (char*)memory.data();
    for (uint32_t k = 0; k < 64; k++) *(uint64_t*)(base + g.shard_header(k) + MESH_RING_TAIL) = 1000u + k;
    mesh_ctx ctx;
    std::memset(&ctx, 0, sizeof ctx);
    ctx.base = (uint64_t)(uintptr_t)base;
    ctx.binding_count = 1;
    ctx.bindings[0] = {kRingOffset, (uint64_t)(uintptr_t)(base + g.shard_slots(0)), 64, 4, MESH_PLACEMENT_HOST,
                       MESH_PROTOCOL_FANIN | 64u << MESH_BULK_PARTS_SHIFT};
    emu_run_block(1, [&](uint32_t) {
        const uint32_t lane = mesh_detail_lane();
        const mesh_fanin whole = mesh_fanin_open(ctx, 0);
        const mesh_fanin too_many = mesh_detail_fanin_open_part(ctx, 0, 0, 1);
        if (lane == 0 && (whole.ch.msg_size != 0 || too_many.ch.msg_size != 0))
            fail("one warp opened 64 shards", whole.ch.msg_size, too_many.ch.msg_size);
        const uint32_t parts[4] = {mesh_fanin_parts(ctx, 0, 1), mesh_fanin_parts(ctx, 0, 2), mesh_fanin_parts(ctx, 0, 64),
                                   mesh_fanin_parts(ctx, 0, 128)};
        if (lane == 0 && (parts[0] != 1 || parts[1] != 2 || parts[2] != 64 || parts[3] != 64))
            fail("mesh_fanin_parts for 1 / 2 warps, 64 / 128 warps", parts[1], parts[3]);
        for (uint32_t p = 0; p < 2; p++) {
            const mesh_fanin f = mesh_detail_fanin_open_part(ctx, 0, p, 2);
            const uint32_t k = p + 2u * lane;
            if (lane == 0 && (f.ch.msg_size != 64 || f.shards != 32)) fail("part of 2: size, shards", f.ch.msg_size, f.shards);
            if (f.s_ring != base + g.shard_header(k) || f.s_slots != base + g.shard_slots(k)) fail("part of 2: a lane's shard", p, k);
            if (f.s_mine != 1000u + k || f.s_published != 1000u + k) fail("part of 2: a lane's tail", k, (long)f.s_mine);
        }
        const mesh_fanin one = mesh_detail_fanin_open_part(ctx, 0, 5, 64);
        if (lane == 0 && (one.shards != 1 || one.ch.ring != base + g.shard_header(5) ||
                          one.ch.slots != base + g.shard_slots(5) || one.ch.mine != 1005u || one.ch.other != 1005u))
            fail("part 5 of 64: the one-ring end over shard 5", one.shards, (long)one.ch.mine);
    });
    std::printf("64 shards: one warp refused, parts of 2 and 64 checked\n");
}

// mesh_fanin_open numbers its part over the grid: under a grid of 4 blocks of 2 serving warps (8 of
// 64 shards each), warp w of block b is part b x 2 + w of 8 and its lane i holds shard part + 8i, so
// no two warps of the grid hold one shard; the same program's one-warp-a-block open over one shard
// gives block 0's warp the shard, the others spare ends (parts 0, nothing to take).
// Every shard is held by exactly one warp either way. A warp past the serving warps of
// its block is refused.
void check_grid_numbering() {
    g = {64, 4, 64};
    memory.assign(g.bytes() / 8, 0);
    base = (char*)memory.data();
    for (uint32_t k = 0; k < 64; k++) *(uint64_t*)(base + g.shard_header(k) + MESH_RING_TAIL) = 1000u + k;
    mesh_ctx ctx;
    std::memset(&ctx, 0, sizeof ctx);
    ctx.base = (uint64_t)(uintptr_t)base;
    ctx.binding_count = 1;
    ctx.bindings[0] = {kRingOffset, (uint64_t)(uintptr_t)(base + g.shard_slots(0)), 64, 4, MESH_PLACEMENT_HOST,
                       MESH_PROTOCOL_FANIN | 64u << MESH_BULK_PARTS_SHIFT};
    std::atomic<uint32_t> holders[64] = {};
    emu_run_grid(4, 2, [&](uint32_t b, uint32_t t) {
        const uint32_t lane = t % 32u, w = t / 32u;
        const mesh_fanin f = mesh_fanin_open(ctx, 0, 2);
        if (lane == 0 && (f.part != b * 2u + w || f.parts != 8u || f.shards != 8u || f.ch.msg_size != 64))
            fail("grid part of warp b x 2 + w", (long)(b * 2u + w), (long)f.part * 1000 + f.parts);
        if (lane < f.shards) {
            const uint32_t k = f.part + 8u * lane;
            if (f.s_ring != base + g.shard_header(k) || f.s_mine != 1000u + k) fail("grid part: a lane's shard", f.part, k);
            holders[k]++;
        }
    });
    for (uint32_t k = 0; k < 64; k++)
        if (holders[k] != 1u) fail("a shard held by other than exactly one warp of the grid", k, holders[k]);
    ctx.bindings[0].protocol = MESH_PROTOCOL_FANIN;  // one shard: one warp of the grid serves it
    std::atomic<uint32_t> served{0}, spare{0};
    emu_run_grid(4, 1, [&](uint32_t b, uint32_t t) {
        if (t >= 32u) return;
        const mesh_fanin f = mesh_fanin_open(ctx, 0);
        if (t != 0) return;
        if (b == 0 && (f.parts != 1u || f.part != 0u || f.ch.msg_size != 64)) fail("one shard: block 0 serves it", f.parts, f.ch.msg_size);
        if (b != 0 && (f.parts != 0u || f.ch.msg_size != 0 || f.shards != 0u)) fail("one shard: a spare end", b, f.parts);
        (f.parts != 0u ? served : spare)++;
    });
    if (served != 1u || spare != 3u) fail("one shard over 4 blocks: served, spare", served, spare);
    // A warp past the `warps` it was told opens (both warps of a block call mesh_fanin_open(ctx, 0)):
    // refused, with part 1 of 1, so that a group opened from it names no entry.
    emu_run_grid(1, 2, [&](uint32_t, uint32_t t) {
        const mesh_fanin f = mesh_fanin_open(ctx, 0);
        if (t == 32u && (f.ch.msg_size != 0 || f.parts != 1u || f.part != 1u)) fail("a warp past `warps`: refused", f.part, f.parts);
        if (t == 0u && (f.ch.msg_size != 64 || f.parts != 1u || f.part != 0u)) fail("warp 0 of one serving warp", f.part, f.parts);
    });
    std::printf("grid numbering: 64 shards over 8 warps of 4 blocks, one shard over 4 blocks\n");
}

int main() {
    check_64_shards();
    check_grid_numbering();
    run(1, 16, 64, 120);
    run(2, 16, 64, 120);
    run(8, 8, 64, 150);
    run(32, 4, 16, 120);
    run(8, 16, 8, 100);
    run(4, 4, 8192, 40);  // a slot larger than one round trip's loads: one shard a call
    if (failures) {
        std::fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    std::printf("all passed\n");
    return 0;
}
