// mesh/detail/fanin.cuh: the definitions of mesh/service.cuh's fan-in calls (the consumer end of a
// fan-in channel) and their format. Not for programs: names starting with mesh_detail_ may change.
#pragma once
#include "../service.cuh"

// Memory model of the service calls (the design's "CUDA and PTX facts"):
//   * One writer per word. A GPU without host-native atomics shares no word with a host writer: the
//     GPU writes exactly one word of the fan-in ring (its `tail`), and of the group only each reply
//     ring's `head` and slots (it is
//     their producer) and each entry's `acked_epoch`. It never reads the fan-in's reservation cursor
//     (`head`) or its owner table, which host producers CAS.
//   * Tags per word. PTX makes an aligned 8-byte access single-copy atomic but a 16-byte vector load
//     is two independent 8-byte ones, and the GPU's loads of host memory arrive in any order. So every
//     word the GPU consumes carries its own tag and is checked on its own, the fan-in's commit and
//     kind words included; no word's state is ever inferred from another's.
//   * Epoch and state of a group entry are one 8-byte word read with one load: two loads could pair a
//     new client's `bound` with the old client's epoch and let a stale reply reach the new client.
//   * The ack (`acked_epoch := epoch`) is a st.release.sys after the ring's exact `head` was stored:
//     meshd hands the entry (and its ring, `tail := head`) to a new client only once it sees the ack,
//     so the release must order every earlier reply and the `head` store before it. Two plain stores
//     to the system are not ordered by PTX (only fence.sc.sys or st.release.sys order them).

// Fan-in slots (fanin.rs): message `seq` takes MESH_FANIN_HEADER_WORDS + msg_size / 4 tagged words:
// word 0 the commit (payload: the sender id, `slot | epoch << 16`), word 1 the kind, then the body.
#define MESH_FANIN_HEADER_WORDS 2u
#define MESH_FANIN_KIND_DATA 0u
#define MESH_FANIN_KIND_SKIP 1u

// 16-byte loads per lane per round trip of mesh_fanin_peek (17: one round trip for 32 slots of 64-byte
// requests, or one slot of a 4 KiB one).
#define MESH_DETAIL_FANIN_PAIRS 17u

// Sharded format (mesh-shm's layout.rs, `fanin_shard_offset`): shard 0 is the one-ring format (the
// binding's ring header and `slots`); shard k >= 1's ring header starts MESH_BULK_ALIGN-aligned at
// span + (k - 1) x (MESH_BULK_ALIGN + span) from the region that starts the owner table before `slots`
// (span: the page-rounded bytes of owner table and slots of one ring), its owner table one page after
// it, its slots after that as in shard 0. The binding's protocol word carries P above
// MESH_BULK_PARTS_SHIFT.

// The shards of binding `b` when it is a fan-in binding these calls can serve (a host channel of
// protocol fanin, of 1 to MESH_FANIN_MAX_SHARDS shards, a power of two, and a valid size and capacity),
// else 0.
static __device__ __forceinline__ uint32_t mesh_detail_fanin_shards_of(const mesh_ctx& c, uint32_t b) {
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return 0u;
    const mesh_binding& d = c.bindings[b];
    const uint32_t shards = (d.protocol >> MESH_BULK_PARTS_SHIFT) == 0u ? 1u : d.protocol >> MESH_BULK_PARTS_SHIFT;
    if ((d.protocol & ((1u << MESH_BULK_PARTS_SHIFT) - 1u)) != MESH_PROTOCOL_FANIN || shards > MESH_FANIN_MAX_SHARDS ||
        (shards & (shards - 1u)) != 0u || d.placement != MESH_PLACEMENT_HOST || d.msg_size == 0 || d.msg_size % 8u != 0 ||
        d.capacity == 0 || (d.capacity & (d.capacity - 1u)) != 0)
        return 0u;
    return shards;
}

// Shard k's ring header and LL slots in fan-in binding `d` (the sharded format above).
static __device__ __forceinline__ void mesh_detail_fanin_shard_at(const mesh_ctx& c, const mesh_binding& d, uint32_t k, char** ring,
                                                           char** slots) {
    char* const slots0 = (char*)(uintptr_t)d.slots;
    if (k == 0u) {
        *ring = mesh_detail_at(c, d.ring_offset);
        *slots = slots0;
        return;
    }
    const uint64_t align = MESH_BULK_ALIGN;
    const uint64_t owners = ((uint64_t)8u * d.capacity + align - 1u) / align * align;
    const uint64_t span = (owners + (16u + 2u * (uint64_t)d.msg_size) * d.capacity + align - 1u) / align * align;
    *ring = slots0 - owners + span + (uint64_t)(k - 1u) * (align + span);
    *slots = *ring + align + owners;
}

static __device__ __forceinline__ uint32_t mesh_fanin_parts(const mesh_ctx& c, uint32_t b, uint32_t warps) {
    const uint32_t shards = mesh_detail_fanin_shards_of(c, b);
    uint32_t parts = 1u;
    while (parts * 2u <= warps && parts * 2u <= shards) parts *= 2u;
    return parts;
}

// Warp `part` of `parts`: shards part, part + parts, ... (mesh_fanin_open numbers the part over the grid).
static __device__ __forceinline__ mesh_fanin mesh_detail_fanin_open_part(const mesh_ctx& c, uint32_t b, uint32_t part, uint32_t parts) {
    mesh_fanin f = {{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, false}, 0, 0, 0};
    f.shards = 1u;
    f.part = part;
    f.parts = parts;
    const uint32_t shards = mesh_detail_fanin_shards_of(c, b);
    if (shards == 0u || parts == 0u || (parts & (parts - 1u)) != 0u || part >= parts || shards % parts != 0u ||
        shards / parts > MESH_FANIN_WARP_SHARDS)
        return f;
    const mesh_binding& d = c.bindings[b];
    const uint32_t mine = shards / parts, lane = mesh_detail_lane(), full = 0xffffffffu;
    f.stride = 16u + 2u * d.msg_size;
    if (lane < mine) {
        mesh_detail_fanin_shard_at(c, d, part + lane * parts, &f.s_ring, &f.s_slots);
        f.s_mine = f.s_done = f.s_published = mesh_detail_ld_volatile_u64(f.s_ring + MESH_RING_TAIL);
    }
    // `ch` is the one-ring end over this warp's first shard (the only one when mine is 1; with more,
    // the shard calls keep their positions in the lanes and use `ch` for its size and counters).
    f.ch.ring = (char*)__shfl_sync(full, (unsigned long long)f.s_ring, 0);
    f.ch.slots = (char*)__shfl_sync(full, (unsigned long long)f.s_slots, 0);
    f.ch.mine = f.ch.other = f.ch.published = __shfl_sync(full, (unsigned long long)f.s_published, 0);
    f.ch.msg_size = d.msg_size;
    f.ch.mask = d.capacity - 1u;
    f.shards = mine;
    return f;
}

static __device__ __forceinline__ mesh_fanin mesh_fanin_open(const mesh_ctx& c, uint32_t b, uint32_t warps) {
    const uint32_t w = mesh_block_rank() / 32u;
    if (warps == 0u || w >= warps) {
        // Refused (msg_size 0, `parts` not 0), with part 1 of 1, which names no entry: a group opened
        // from this end refuses too, and never takes over the entries of the warps that serve them.
        mesh_fanin f = {{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, false}, 0, 0, 0};
        f.shards = 1u;
        f.part = 1u;
        f.parts = 1u;
        return f;
    }
    // Numbered over the grid, never per block: numbered per block, warp w of every block would be
    // part w, and every block one more consumer of the same shards.
    const uint32_t part = blockIdx.x * warps + w, parts = mesh_fanin_parts(c, b, gridDim.x * warps);
    if (part >= parts) {  // spare: every shard is another warp's
        mesh_fanin f = {{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, false}, 0, 0, 0};
        f.shards = 0u;
        f.part = part;
        f.parts = 0u;
        return f;
    }
    return mesh_detail_fanin_open_part(c, b, part, parts);
}

// Publishes each shard's given-back position (lane s, shard s's tail word) when it is `force`d and has
// moved, or has moved half a ring: as mesh_detail_chan_flush / mesh_detail_chan_progress do for one ring.
static __device__ __forceinline__ void mesh_detail_fanin_shard_publish(mesh_fanin* f, bool force) {
    const uint64_t half = (f->ch.mask + 1u) / 2u;
    if (mesh_detail_lane() < f->shards && f->s_done != f->s_published &&
        (force || f->s_done - f->s_published >= (half ? half : 1u))) {
        mesh_detail_st_volatile_u64(f->s_ring + MESH_RING_TAIL, f->s_done);
        f->s_published = f->s_done;
    }
}

// One ring's take (mesh_fanin_take_deferred over `ch`).
static __device__ __forceinline__ int mesh_detail_fanin_take_ring(mesh_fanin* f, void* buf, uint32_t* sender) {
    mesh_chan* ch = &f->ch;
    if (ch->msg_size == 0) return MESH_TAKE_NONE;
    const uint32_t lane = mesh_detail_lane();
    const uint32_t words = MESH_FANIN_HEADER_WORDS + ch->msg_size / 4u;  // even: msg_size is a multiple of 8
    const uint32_t t = mesh_detail_tag(ch->mine);
    const volatile uint64_t* src = (const volatile uint64_t*)(ch->slots + (ch->mine & ch->mask) * (uint64_t)f->stride);
    uint32_t* dst = (uint32_t*)buf;
    // Lane 0's first pair is words 0 and 1 (commit and kind); every other pair is body.
    uint64_t w0 = 0, w1 = 0;
    bool whole = true;
    for (uint32_t idx = 2u * lane; idx < words; idx += 64u) {
        uint64_t a, b;
        mesh_detail_ld_volatile_v2(src + idx, &a, &b);
        if (idx == 0) {
            w0 = a;
            w1 = b;
            continue;
        }
        whole &= (uint32_t)(a >> 32) == t && (uint32_t)(b >> 32) == t;
        dst[idx - 2u] = (uint32_t)a;
        dst[idx - 1u] = (uint32_t)b;
    }
    w0 = __shfl_sync(0xffffffffu, w0, 0);
    w1 = __shfl_sync(0xffffffffu, w1, 0);
    if ((uint32_t)(w0 >> 32) != t) {
        mesh_detail_chan_drained(ch);
        return MESH_TAKE_NONE;
    }
    if ((uint32_t)(w1 >> 32) != t) {
        ch->partial++;
        return MESH_TAKE_NONE;
    }
    const uint32_t kind = (uint32_t)w1;
    int took = MESH_TAKE_SKIP;
    if (kind == MESH_FANIN_KIND_DATA) {
        if (!__all_sync(0xffffffffu, whole)) {
            ch->partial++;
            return MESH_TAKE_NONE;
        }
        took = MESH_TAKE_MSG;
    } else if (kind != MESH_FANIN_KIND_SKIP) {
        f->corrupt++;  // no producer or completer writes it: passed over like a skip, and counted
    }
    *sender = (uint32_t)w0;
    __syncwarp();  // every lane's copy is in buf before any lane uses it
    ch->mine += 1;
    return took;
}

static __device__ __forceinline__ void mesh_fanin_commit(mesh_fanin* f) {
    mesh_chan* ch = &f->ch;
    if (ch->msg_size == 0) return;
    if (f->shards > 1u) {
        if (mesh_detail_lane() < f->shards) f->s_done = f->s_mine;
        mesh_detail_fanin_shard_publish(f, false);
        return;
    }
    ch->other = ch->mine;
    mesh_detail_chan_progress(ch);
}

static __device__ __forceinline__ int mesh_fanin_take(mesh_fanin* f, void* buf, uint32_t* sender) {
    const int took = mesh_fanin_take_deferred(f, buf, sender);
    if (took == MESH_TAKE_NONE || f->ch.msg_size == 0) return took;
    if (f->shards > 1u) {
        mesh_detail_fanin_shard_publish(f, false);
        if (mesh_detail_lane() < f->shards) f->s_done = f->s_mine;
    } else {
        mesh_detail_chan_took(&f->ch);
    }
    return took;
}

static __device__ __forceinline__ void mesh_fanin_close(mesh_fanin* f) {
    if (f->ch.msg_size != 0 && f->shards > 1u) mesh_detail_fanin_shard_publish(f, true);
    else mesh_detail_chan_flush(&f->ch);
}

// Slots an empty poll's next peek looks at (it doubles after each peek that found all it looked at, up
// to `max`): one request alone is found in one round trip of this many slots' words, a burst in a few.
#define MESH_DETAIL_FANIN_POLL_MIN 4u

// Slots a peek at position `at` looks at: up to `max`, the adaptive hint, one round trip's words (or
// one slot of a larger request, over several), and the ring's end (slots are contiguous until it).
static __device__ __forceinline__ uint32_t mesh_detail_fanin_span(const mesh_fanin* f, uint64_t at, uint32_t max) {
    const uint32_t words = MESH_FANIN_HEADER_WORDS + f->ch.msg_size / 4u;
    uint32_t n = words <= 64u * MESH_DETAIL_FANIN_PAIRS ? 64u * MESH_DETAIL_FANIN_PAIRS / words : 1u;
    if (n > max) n = max;
    if (n > f->ch.hint) n = f->ch.hint;
    const uint32_t to_end = f->ch.mask + 1u - (uint32_t)(at & f->ch.mask);
    return n < to_end ? n : to_end;
}

// Issues this lane's 16-byte loads of words [base, base + one round) of the `n` slots at position `at`
// into a / b, and returns without waiting for any of them.
static __device__ __forceinline__ void mesh_detail_fanin_load(const mesh_fanin* f, uint64_t at, uint32_t n, uint32_t base,
                                                       uint64_t* a, uint64_t* b) {
    const uint32_t total = n * (MESH_FANIN_HEADER_WORDS + f->ch.msg_size / 4u);
    const volatile uint64_t* src = (const volatile uint64_t*)(f->ch.slots + (at & f->ch.mask) * (uint64_t)f->stride);
    const uint32_t lane = mesh_detail_lane();
#pragma unroll
    for (uint32_t k = 0; k < MESH_DETAIL_FANIN_PAIRS; k++) {
        const uint32_t idx = base + 2u * (lane + 32u * k);
        if (idx < total) mesh_detail_ld_volatile_v2(src + idx, &a[k], &b[k]);
    }
}

// One ring's peek (mesh_fanin_peek over `ch`).
static __device__ __forceinline__ uint32_t mesh_detail_fanin_peek_ring(mesh_fanin* f, void* buf, uint32_t* senders,
                                                                uint32_t* skipped, uint32_t max) {
    mesh_chan* ch = &f->ch;
    *skipped = 0;
    if (ch->msg_size == 0 || max == 0) return 0;
    if (max > MESH_FANIN_BATCH_MAX) max = MESH_FANIN_BATCH_MAX;
    const uint32_t lane = mesh_detail_lane();
    const uint32_t words = MESH_FANIN_HEADER_WORDS + ch->msg_size / 4u;  // even: msg_size is a multiple of 8
    const uint32_t round = 64u * MESH_DETAIL_FANIN_PAIRS;                        // words per round trip
    if (ch->hint < MESH_DETAIL_FANIN_POLL_MIN) ch->hint = MESH_DETAIL_FANIN_POLL_MIN;
    const uint32_t n = mesh_detail_fanin_span(f, ch->mine, max);
    const uint32_t magic = (uint32_t)(((1ull << 32) + words - 1u) / words);  // idx / words as a multiply
    const uint32_t total = n * words;
    uint32_t* dst = (uint32_t*)buf;
    const uint32_t body = ch->msg_size / 4u;
    // Per slot j (bit j): its commit word tagged, its kind word tagged, its kind not DATA (and neither
    // DATA nor SKIP), a body word not tagged. Each lane sees some words; the warp ORs what it saw.
    uint32_t committed = 0, kinded = 0, other = 0, strange = 0, torn = 0;
    for (uint32_t base = 0; base < total; base += round) {
        uint64_t a[MESH_DETAIL_FANIN_PAIRS], b[MESH_DETAIL_FANIN_PAIRS];
        mesh_detail_fanin_load(f, ch->mine, n, base, a, b);
#pragma unroll
        for (uint32_t k = 0; k < MESH_DETAIL_FANIN_PAIRS; k++) {
            const uint32_t idx = base + 2u * (lane + 32u * k);
            if (idx >= total) continue;
            // Both words of the pair: one slot (words is even). The multiply is exact while idx * words < 2^32:
            // always with several slots (a round is 1088 words); one slot of any size is slot 0.
            const uint32_t j = n == 1u ? 0u : __umulhi(idx, magic);
            const uint32_t p = idx - j * words;       // the pair's first word within its slot
            const uint32_t t = mesh_detail_tag(ch->mine + j);
            const bool ta = (uint32_t)(a[k] >> 32) == t, tb = (uint32_t)(b[k] >> 32) == t;
            if (p == 0) {  // commit (the sender id) and kind
                if (ta) {
                    committed |= 1u << j;
                    senders[j] = (uint32_t)a[k];
                }
                if (tb) {
                    kinded |= 1u << j;
                    if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA) other |= 1u << j;
                    if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA && (uint32_t)b[k] != MESH_FANIN_KIND_SKIP) strange |= 1u << j;
                }
            } else {
                if (!(ta && tb)) torn |= 1u << j;
                dst[j * body + p - 2u] = (uint32_t)a[k];
                dst[j * body + p - 1u] = (uint32_t)b[k];
            }
        }
    }
    committed = mesh_detail_warp_or(committed);
    kinded = mesh_detail_warp_or(kinded);
    other = mesh_detail_warp_or(other);
    strange = mesh_detail_warp_or(strange);
    torn = mesh_detail_warp_or(torn);
    // Slot j is whole when committed and kinded, and either not DATA (a skip: its body is not looked
    // at) or every body word tagged. The requests are the whole slots in front of the first that is not.
    const uint32_t whole = committed & kinded & (other | ~torn);
    const uint32_t got = whole == 0xffffffffu ? 32u : (uint32_t)__ffs((int)~whole) - 1u;
    const uint32_t took = got < n ? got : n;
    if (took == 0) {
        if (!(committed & 1u)) mesh_detail_chan_drained(ch);  // empty: publish, look at few slots next time
        else ch->partial++;                              // the first is still arriving
        __syncwarp();
        return 0;
    }
    if (took == n && n < max) ch->hint = 2u * n;  // all it looked at: look at more next time
    const uint32_t mask = took == 32u ? 0xffffffffu : (1u << took) - 1u;
    f->strange = strange & mask;  // counted in `corrupt` when consumed, not each time it is peeked
    *skipped = other & mask;
    __syncwarp();  // every lane's copy is in buf and senders before any lane uses them
    return took;
}

// The lowest `n` set bits of `bits`.
static __device__ __forceinline__ uint32_t mesh_detail_fanin_lowest(uint32_t bits, uint32_t n) {
    while ((uint32_t)__popc(bits) > n) bits &= ~(0x80000000u >> __clz(bits));
    return bits;
}

// A one-ring view of shard s (its words from lane s), for the calls that take one slot over several
// round trips, and its words written back afterwards.
static __device__ __forceinline__ mesh_fanin mesh_detail_fanin_shard_view(const mesh_fanin* f, uint32_t s) {
    mesh_fanin g = *f;
    g.shards = 1u;
    g.strange = 0;
    g.ch.ring = (char*)__shfl_sync(0xffffffffu, (unsigned long long)f->s_ring, s);
    g.ch.slots = (char*)__shfl_sync(0xffffffffu, (unsigned long long)f->s_slots, s);
    g.ch.mine = __shfl_sync(0xffffffffu, (unsigned long long)f->s_mine, s);
    g.ch.other = __shfl_sync(0xffffffffu, (unsigned long long)f->s_done, s);
    g.ch.published = __shfl_sync(0xffffffffu, (unsigned long long)f->s_published, s);
    g.ch.hint = __shfl_sync(0xffffffffu, f->s_hint, s);
    return g;
}
static __device__ __forceinline__ void mesh_detail_fanin_shard_back(mesh_fanin* f, const mesh_fanin* g, uint32_t s) {
    if (mesh_detail_lane() == s) {
        f->s_mine = g->ch.mine;
        f->s_done = g->ch.other;
        f->s_published = g->ch.published;
        f->s_hint = g->ch.hint;
    }
    f->ch.partial = g->ch.partial;
    f->corrupt = g->corrupt;
}

// mesh_fanin_peek over every shard, in one round trip (requests up to one round's words; larger ones
// one shard a call). *first: the sender of the batch's first request (for the take). Sets `returned`
// and each shard lane's `run`, which mesh_fanin_consume and the take use.
static __device__ __forceinline__ uint32_t mesh_detail_fanin_peek_shards(mesh_fanin* f, void* buf, uint32_t* senders,
                                                                  uint32_t* skipped, uint32_t max, uint32_t* first) {
    mesh_chan* ch = &f->ch;
    const uint32_t full = 0xffffffffu;
    const uint32_t lane = mesh_detail_lane(), shards = f->shards, last = shards - 1u;
    const uint32_t words = MESH_FANIN_HEADER_WORDS + ch->msg_size / 4u;  // even: msg_size is a multiple of 8
    const uint32_t round = 64u * MESH_DETAIL_FANIN_PAIRS;                        // words per round trip
    const uint32_t start = f->start;
    f->start = (start + 1u) & last;
    f->returned = 0;
    f->run = 0;
    *first = 0;
    if (words > round) {
        // One slot takes several round trips: one shard this call (the one-ring peek over it).
        mesh_fanin g = mesh_detail_fanin_shard_view(f, start);
        uint32_t from = 0;
        const uint32_t took = mesh_detail_fanin_peek_ring(&g, buf, senders ? senders : &from, skipped, 1u);
        mesh_detail_fanin_shard_back(f, &g, start);
        if (took) {
            f->returned = 1u;
            if (lane == start) f->run = 1u;
            f->strange = g.strange;
            *first = senders ? senders[0] : __shfl_sync(full, from, 0);  // lane 0 loads slot 0's words 0 and 1
        }
        return took;
    }
    uint32_t budget = round / words;  // slots one round trip loads
    if (budget > 32u) budget = 32u;   // one bit each in the masks below
    // Lane r < shards stands for rank r: shard (start + r) mod shards. What each wants: its hint, up to
    // its ring's end (slots are contiguous until it). A shard found empty wants one slot until a
    // request arrives (not MESH_DETAIL_FANIN_POLL_MIN as one ring does: the empty shards' slots would be
    // taken from the budget of the busy ones), and twice as many after each peek that found all it
    // looked at whole.
    uint32_t want = 0;
    if (lane < shards) {
        if (f->s_hint == 0u) f->s_hint = MESH_DETAIL_FANIN_POLL_MIN;
        const uint32_t to_end = ch->mask + 1u - (uint32_t)(f->s_mine & ch->mask);
        want = f->s_hint < to_end ? f->s_hint : to_end;
        if (want > budget) want = budget;
    }
    const uint32_t shard_r = (start + lane) & last;  // rank `lane`'s shard (lane < shards)
    uint32_t w = __shfl_sync(full, want, shard_r);
    if (lane >= shards) w = 0;
    const uint32_t share = budget / shards ? budget / shards : 1u;
    // A fair share each first (budget / shards, at least one slot), by rank while the budget lasts;
    // then what is left, by rank, to those that want more.
    const uint32_t fair = w < share ? w : share;
    const uint32_t fair_to = mesh_detail_warp_scan(fair);
    const uint32_t fair_all = __shfl_sync(full, fair_to, 31);
    uint32_t n = fair_to - fair >= budget ? 0u : (fair < budget - (fair_to - fair) ? fair : budget - (fair_to - fair));
    const uint32_t left = fair_all < budget ? budget - fair_all : 0u;
    const uint32_t more = w - n;
    const uint32_t more_to = mesh_detail_warp_scan(more);
    n += more_to - more >= left ? 0u : (more < left - (more_to - more) ? more : left - (more_to - more));
    const uint32_t to = mesh_detail_warp_scan(n), off = to - n;  // rank `lane`'s run: slots [off, to)
    const uint32_t total = __shfl_sync(full, to, 31);
    // Lane j < total stands for slot j: its rank (runs are a front of the ranks, each non-empty), its
    // shard's slots and position, hence its address and tag.
    const uint32_t starts = mesh_detail_warp_or(n != 0u ? 1u << off : 0u);
    const uint32_t upto = lane == 31u ? full : (2u << lane) - 1u;
    const uint32_t rank = (uint32_t)__popc(starts & upto) - 1u;  // wraps for lanes >= total (unused)
    const unsigned long long r_slots = __shfl_sync(full, (unsigned long long)f->s_slots, shard_r);
    const unsigned long long r_mine = __shfl_sync(full, (unsigned long long)f->s_mine, shard_r);
    const uint32_t rr = rank & 31u;
    const char* j_slots = (const char*)__shfl_sync(full, r_slots, rr);
    const uint64_t j_seq = __shfl_sync(full, r_mine, rr) + (lane - __shfl_sync(full, off, rr));
    const unsigned long long j_addr = (unsigned long long)(j_slots + (j_seq & ch->mask) * (uint64_t)f->stride);
    const uint32_t j_tag = mesh_detail_tag(j_seq);
    // Every lane's loads, all issued before any is used: word idx of the round is word idx - j x words
    // of slot j.
    const uint32_t magic = (uint32_t)(((1ull << 32) + words - 1u) / words);  // idx / words as a multiply
    const uint32_t tw = total * words;
    uint64_t a[MESH_DETAIL_FANIN_PAIRS], b[MESH_DETAIL_FANIN_PAIRS];
#pragma unroll
    for (uint32_t k = 0; k < MESH_DETAIL_FANIN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        const uint32_t j = __umulhi(idx, magic);  // exact: idx x words < 2^32 (both within one round)
        const unsigned long long at = __shfl_sync(full, j_addr, j & 31u);
        a[k] = b[k] = 0;
        if (idx < tw) mesh_detail_ld_volatile_v2((const volatile uint64_t*)at + (idx - j * words), &a[k], &b[k]);
    }
    // Per slot j (bit j), as mesh_detail_fanin_peek_ring judges them: each word by its own tag.
    uint32_t committed = 0, kinded = 0, other = 0, strange = 0, torn = 0;
#pragma unroll
    for (uint32_t k = 0; k < MESH_DETAIL_FANIN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        const uint32_t j = __umulhi(idx, magic);
        const uint32_t t = __shfl_sync(full, j_tag, j & 31u);
        if (idx >= tw) continue;
        const bool ta = (uint32_t)(a[k] >> 32) == t, tb = (uint32_t)(b[k] >> 32) == t;
        if (idx == j * words) {  // commit (the sender id) and kind
            if (ta) committed |= 1u << j;
            if (tb) {
                kinded |= 1u << j;
                if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA) other |= 1u << j;
                if ((uint32_t)b[k] != MESH_FANIN_KIND_DATA && (uint32_t)b[k] != MESH_FANIN_KIND_SKIP) strange |= 1u << j;
            }
        } else if (!(ta && tb)) {
            torn |= 1u << j;
        }
    }
    committed = mesh_detail_warp_or(committed);
    kinded = mesh_detail_warp_or(kinded);
    other = mesh_detail_warp_or(other);
    strange = mesh_detail_warp_or(strange);
    torn = mesh_detail_warp_or(torn);
    const uint32_t whole = committed & kinded & (other | ~torn);
    // Each run's whole front (rank lanes), the batch (at most `max`, by rank), and each shard's news:
    // empty (publish, look at few next time), all whole (look at more), a front still arriving.
    uint32_t front = 0, hint = 0;
    bool drained = false;
    if (lane < shards && n != 0u) {
        const uint32_t gaps = ~whole >> off;
        uint32_t got = gaps == 0u ? 32u : (uint32_t)__ffs((int)gaps) - 1u;
        if (got > n) got = n;
        front = got == 32u ? full : ((1u << got) - 1u) << off;
        drained = !((committed >> off) & 1u);
        hint = got == n ? 2u * n : 0u;
        if (hint > 32u) hint = 32u;
    }
    if (__any_sync(full, lane < shards && n != 0u && !front && !drained)) ch->partial++;
    const uint32_t returned = mesh_detail_fanin_lowest(mesh_detail_warp_or(front), max);
    const uint32_t rank_s = (lane - start) & last;  // shard `lane`'s rank
    const uint32_t s_front = __shfl_sync(full, front, rank_s);
    const bool s_drained = __shfl_sync(full, (uint32_t)drained, rank_s) != 0u;
    const uint32_t s_hint = __shfl_sync(full, hint, rank_s);
    if (lane < shards) {
        f->run = s_front & returned;
        if (s_drained) {
            f->s_hint = 1u;
            mesh_detail_fanin_shard_publish(f, MESH_PUBLISH_ON_DRAIN);  // without it, once half a ring is owed
        } else if (s_hint > f->s_hint) {
            f->s_hint = s_hint;
        }
    }
    if (returned == 0u) {
        __syncwarp();
        return 0;
    }
    // The batch, in slot order without the gaps: slot j is request popc(returned below j).
    uint32_t* dst = (uint32_t*)buf;
    const uint32_t body = ch->msg_size / 4u;
    uint32_t sender0 = 0;
#pragma unroll
    for (uint32_t k = 0; k < MESH_DETAIL_FANIN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        const uint32_t j = __umulhi(idx, magic);
        if (idx >= tw || !((returned >> j) & 1u)) continue;
        const uint32_t o = (uint32_t)__popc(returned & ((1u << j) - 1u));
        const uint32_t p = idx - j * words;
        if (p == 0) {
            if (senders) senders[o] = (uint32_t)a[k];
            if (o == 0) sender0 = (uint32_t)a[k];
        } else {
            dst[o * body + p - 2u] = (uint32_t)a[k];
            dst[o * body + p - 1u] = (uint32_t)b[k];
        }
    }
    *first = mesh_detail_warp_or(sender0);  // one lane holds it, the others 0
    const bool in_batch = (returned >> lane) & 1u;
    const uint32_t o = (uint32_t)__popc(returned & ((1u << lane) - 1u));
    *skipped = mesh_detail_warp_or(in_batch && ((other >> lane) & 1u) ? 1u << o : 0u);
    f->strange = mesh_detail_warp_or(in_batch && ((strange >> lane) & 1u) ? 1u << o : 0u);
    f->returned = returned;
    __syncwarp();  // every lane's copy is in buf and senders before any lane uses them
    return (uint32_t)__popc(returned);
}

static __device__ __forceinline__ uint32_t mesh_fanin_peek(mesh_fanin* f, void* buf, uint32_t* senders, uint32_t* skipped,
                                                           uint32_t max) {
    *skipped = 0;
    if (f->ch.msg_size == 0 || max == 0) return 0;
    if (max > MESH_FANIN_BATCH_MAX) max = MESH_FANIN_BATCH_MAX;
    if (f->shards == 1u) return mesh_detail_fanin_peek_ring(f, buf, senders, skipped, max);
    uint32_t first;
    return mesh_detail_fanin_peek_shards(f, buf, senders, skipped, max, &first);
}

// The take over every shard: the batch's first request, taken (deferred) from its shard.
static __device__ __forceinline__ int mesh_detail_fanin_take_shards(mesh_fanin* f, void* buf, uint32_t* sender) {
    const uint32_t words = MESH_FANIN_HEADER_WORDS + f->ch.msg_size / 4u;
    if (words > 64u * MESH_DETAIL_FANIN_PAIRS) {
        // One slot takes several round trips: the one-ring take over one shard, turning.
        const uint32_t s = f->start;
        f->start = (s + 1u) & (f->shards - 1u);
        mesh_fanin g = mesh_detail_fanin_shard_view(f, s);
        const int took = mesh_detail_fanin_take_ring(&g, buf, sender);
        mesh_detail_fanin_shard_back(f, &g, s);
        return took;
    }
    uint32_t skipped = 0, from = 0;
    if (mesh_detail_fanin_peek_shards(f, buf, (uint32_t*)0, &skipped, 1u, &from) == 0) return MESH_TAKE_NONE;
    if (mesh_detail_lane() < f->shards) f->s_mine += (uint32_t)__popc(f->returned & f->run);
    f->corrupt += f->strange & 1u;
    f->strange = 0;
    f->returned = 0;
    f->run = 0;
    *sender = from;
    return (skipped & 1u) ? MESH_TAKE_SKIP : MESH_TAKE_MSG;
}

static __device__ __forceinline__ int mesh_fanin_take_deferred(mesh_fanin* f, void* buf, uint32_t* sender) {
    if (f->ch.msg_size == 0) return MESH_TAKE_NONE;
    return f->shards > 1u ? mesh_detail_fanin_take_shards(f, buf, sender) : mesh_detail_fanin_take_ring(f, buf, sender);
}

static __device__ __forceinline__ void mesh_fanin_consume(mesh_fanin* f, uint32_t n) {
    mesh_chan* ch = &f->ch;
    if (ch->msg_size == 0 || n == 0) return;
    const uint32_t mask = n >= 32u ? 0xffffffffu : (1u << n) - 1u;
    f->corrupt += (uint32_t)__popc(f->strange & mask);
    f->strange = 0;
    if (f->shards > 1u) {
        // The first n requests of the batch are the lowest n bits of `returned`; each shard's are a
        // front of its run, so its position moves by how many of them are its own.
        const uint32_t first = mesh_detail_fanin_lowest(f->returned, n);
        if (mesh_detail_lane() < f->shards) {
            f->s_mine += (uint32_t)__popc(first & f->run);
            f->s_done = f->s_mine;
        }
        f->returned = 0;
        f->run = 0;
        mesh_detail_fanin_shard_publish(f, false);
        return;
    }
    ch->mine += n;
    ch->other = ch->mine;
    mesh_detail_chan_progress(ch);
}
