// mesh/detail/group.cuh: the definitions of mesh/service.cuh's group calls (the program is every reply
// ring's producer) and the group's format. Not for programs: names starting with mesh_detail_ may change.
#pragma once
#include "../service.cuh"

// Group (group.rs): a GroupHeader line, `entries` GroupEntry pairs of lines, then the reply rings,
// ring_stride bytes apart, each a ring header (MESH_RING_SLOTS bytes) and LL slots.
#define MESH_GROUP_ENTRIES 0u       // u32, write-once
#define MESH_GROUP_MSG_SIZE 4u      // u32, write-once
#define MESH_GROUP_CAPACITY 8u      // u32, write-once
#define MESH_GROUP_RING_STRIDE 16u  // u64, write-once
#define MESH_GROUP_CHANGES 24u      // u64, bumped by meshd (Release) on every connect and departure
#define MESH_GROUP_HEADER_SIZE 128u
#define MESH_GROUP_ENTRY_SIZE 256u
#define MESH_GROUP_ENTRY_BINDING 0u  // u64: epoch (low half) | state (high half), meshd's, ONE word
#define MESH_GROUP_ENTRY_ACKED 128u  // u32: acked_epoch, the program's only word of the table
#define MESH_GROUP_FREE 0u
#define MESH_GROUP_BOUND 1u
#define MESH_GROUP_DEPARTED 2u

static __device__ __forceinline__ char* mesh_detail_group_entry(const mesh_group* g, uint32_t slot) {
    return g->header + MESH_GROUP_HEADER_SIZE + (uint64_t)slot * MESH_GROUP_ENTRY_SIZE;
}
static __device__ __forceinline__ char* mesh_detail_group_ring(const mesh_group* g, uint32_t slot) {
    return g->header + MESH_GROUP_HEADER_SIZE + (uint64_t)g->entries * MESH_GROUP_ENTRY_SIZE + (uint64_t)slot * g->ring_stride;
}
static __device__ __forceinline__ volatile uint64_t* mesh_detail_group_slot(const mesh_group* g, uint32_t slot, uint64_t seq) {
    return (volatile uint64_t*)(mesh_detail_group_ring(g, slot) + MESH_RING_SLOTS +
                                (seq & g->mask) * (uint64_t)g->msg_size * MESH_RING_WIRE_FACTOR);
}

// Warp `part` of `parts`: the entries e with e % parts == part (mesh_group_open takes them from the fan-in end).
static __device__ mesh_group mesh_detail_group_open_part(const mesh_ctx& c, uint32_t b, mesh_reply_state* state, uint32_t max,
                                                        uint32_t part, uint32_t parts) {
    mesh_group g = {0, state, 0, 0, 0, 0, 0, 0, 0, 0, false, false, 0, 0, 1};
    if (parts == 0 || (parts & (parts - 1u)) != 0 || part >= parts) return g;
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return g;
    const mesh_binding& d = c.bindings[b];
    if (d.protocol != MESH_PROTOCOL_GROUP || d.placement != MESH_PLACEMENT_HOST || state == 0) return g;
    char* h = (char*)(uintptr_t)d.slots;
    const uint32_t entries = *(volatile uint32_t*)(h + MESH_GROUP_ENTRIES);
    const uint32_t msg_size = *(volatile uint32_t*)(h + MESH_GROUP_MSG_SIZE);
    const uint32_t capacity = *(volatile uint32_t*)(h + MESH_GROUP_CAPACITY);
    const uint64_t stride = *(volatile uint64_t*)(h + MESH_GROUP_RING_STRIDE);
    const uint64_t slots = (uint64_t)msg_size * MESH_RING_WIRE_FACTOR * capacity;
    if (entries == 0 || entries > max || entries > 65536u || msg_size != d.msg_size || capacity != d.capacity ||
        msg_size == 0 || msg_size % 8u != 0 || capacity == 0 || (capacity & (capacity - 1u)) != 0 ||
        stride != MESH_RING_SLOTS + (slots + MESH_LINE - 1u) / MESH_LINE * MESH_LINE)
        return g;
    g.header = h;
    g.ring_stride = stride;
    g.entries = entries;
    g.msg_size = msg_size;
    g.mask = capacity - 1u;
    g.part = part;
    g.parts = parts;
    const uint32_t last = msg_size / 4u - 1u;
    for (uint32_t s = part + mesh_detail_lane() * parts; s < entries; s += 32u * parts) {  // each lane its own entries
        char* ring = mesh_detail_group_ring(&g, s);
        const uint64_t tail = mesh_detail_ld_volatile_u64(ring + MESH_RING_TAIL);
        uint64_t head = mesh_detail_ld_volatile_u64(ring + MESH_RING_HEAD);
        mesh_reply_state st = {head, tail, head, 0u, 0u};
        if ((int64_t)(tail - head) > 0) head = tail;
        while (head - tail <= g.mask && (uint32_t)(mesh_detail_ld_volatile_u64(mesh_detail_group_slot(&g, s, head)) >> 32) == mesh_detail_tag(head) &&
               (uint32_t)(mesh_detail_ld_volatile_u64(mesh_detail_group_slot(&g, s, head) + last) >> 32) == mesh_detail_tag(head))
            head++;
        st.head = head;
        state[s] = st;
    }
    __syncwarp();
    return g;
}

// The built-in state: MESH_GROUP_MAX_ENTRIES entries, for one group per program. A function-scope
// static, so that only a program that calls this overload carries the array (a file-scope one put
// 32 KiB of device memory, and a `.nv.global` section, in every module that includes this header).
static __device__ __forceinline__ mesh_reply_state* mesh_detail_group_state_builtin(void) {
    static mesh_reply_state mesh_detail_group_state_default[MESH_GROUP_MAX_ENTRIES];
    return mesh_detail_group_state_default;
}
static __device__ __forceinline__ mesh_group mesh_group_open(const mesh_ctx& c, uint32_t b, const mesh_fanin& in, mesh_reply_state* state,
                                                            uint32_t max) {
    return mesh_detail_group_open_part(c, b, state, max, in.part, in.parts);
}
static __device__ __forceinline__ mesh_group mesh_group_open(const mesh_ctx& c, uint32_t b, const mesh_fanin& in) {
    return mesh_detail_group_open_part(c, b, mesh_detail_group_state_builtin(), MESH_GROUP_MAX_ENTRIES, in.part, in.parts);
}

// Stores entry `slot`'s exact head if it moved (lane 0, a plain store: the client needs it for
// nothing, meshd for its reset at the next connect, which the ack orders).
static __device__ __forceinline__ void mesh_detail_group_flush(mesh_group* g, uint32_t slot, mesh_reply_state* st) {
    if (st->head != st->published) {
        if (mesh_detail_lane0()) mesh_detail_st_volatile_u64(mesh_detail_group_ring(g, slot) + MESH_RING_HEAD, st->head);
        st->published = st->head;
    }
}

static __device__ __forceinline__ int mesh_reply(mesh_group* g, uint32_t client, const void* msg) {
    const uint32_t slot = client & 0xffffu, e16 = client >> 16;
    if (g->msg_size == 0 || slot >= g->entries) return MESH_REPLY_GONE;
    mesh_reply_state st = g->state[slot];  // every lane the same copy
    if (!(st.bound && (st.epoch & 0xffffu) == e16)) {
        uint64_t w = 0;
        if (mesh_detail_lane0()) w = mesh_detail_ld_acquire_u64(mesh_detail_group_entry(g, slot) + MESH_GROUP_ENTRY_BINDING);
        w = __shfl_sync(0xffffffffu, w, 0);
        const uint32_t epoch = (uint32_t)w, state = (uint32_t)(w >> 32);
        if (state != MESH_GROUP_BOUND || (epoch & 0xffffu) != e16) return MESH_REPLY_GONE;
        st.epoch = epoch;
        st.bound = 1u;
    }
    int r = MESH_REPLY_SENT;
    if (st.head - st.tail > g->mask) {
        uint64_t tail = 0;
        if (mesh_detail_lane0()) tail = mesh_detail_ld_volatile_u64(mesh_detail_group_ring(g, slot) + MESH_RING_TAIL);
        st.tail = __shfl_sync(0xffffffffu, tail, 0);
        mesh_detail_group_flush(g, slot, &st);  // it looked full: a good moment to say how far we are
        if (st.head - st.tail > g->mask) r = MESH_REPLY_FULL;
    }
    if (r == MESH_REPLY_SENT) {
        const uint32_t words = g->msg_size / 4u;
        volatile uint64_t* dst = mesh_detail_group_slot(g, slot, st.head);
        const uint64_t t = (uint64_t)mesh_detail_tag(st.head) << 32;
        const uint32_t* src = (const uint32_t*)msg;
        for (uint32_t idx = 2u * mesh_detail_lane(); idx < words; idx += 64u) mesh_detail_st_volatile_v2(dst + idx, t | src[idx], t | src[idx + 1]);
        st.head += 1;
        const uint64_t half = (g->mask + 1u) / 2u;
        if (st.head - st.published >= (half ? half : 1u)) mesh_detail_group_flush(g, slot, &st);
    }
    __syncwarp();  // every lane read the old state
    if (mesh_detail_lane0()) g->state[slot] = st;
    __syncwarp();  // and sees the new one next time
    return r;
}

static __device__ __forceinline__ uint32_t mesh_reply_many(mesh_group* g, const uint32_t* clients, const void* msgs, uint32_t n,
                                           uint32_t skip, uint32_t* dropped) {
    *dropped = 0;
    if (n > 32u) n = 32u;
    const uint32_t lane = mesh_detail_lane();
    const uint32_t below = (1u << lane) - 1u;
    const bool mine = lane < n && !((skip >> lane) & 1u);
    const uint32_t id = mine ? clients[lane] : 0u;
    const uint32_t slot = id & 0xffffu;
    const bool valid = mine && g->msg_size != 0 && slot < g->entries;
    // The lanes asking for the same entry; the lowest of them speaks for them all.
    const uint32_t asking = __ballot_sync(0xffffffffu, valid);
    const uint32_t same = __match_any_sync(0xffffffffu, valid ? slot : 0xffffffffu) & asking;
    const bool leader = valid && (same & below) == 0;
    mesh_reply_state st = {0, 0, 0, 0u, 0u};
    uint32_t sent = 0;           // leader: its lanes whose reply goes out (bit per lane)
    uint32_t gone = 0;           // leader: its lanes dropped (not bound)
    uint32_t full_at = 32u;      // leader: its first lane without room
    if (leader) {
        st = g->state[slot];
        bool tail_read = false;
        uint64_t head = st.head;
        for (uint32_t m = same; m != 0; m &= m - 1u) {
            const uint32_t l = (uint32_t)__ffs((int)m) - 1u;
            const uint32_t e16 = clients[l] >> 16;
            if (!(st.bound && (st.epoch & 0xffffu) == e16)) {
                // One 8-byte acquire load of epoch and state (see mesh_reply).
                const uint64_t w = mesh_detail_ld_acquire_u64(mesh_detail_group_entry(g, slot) + MESH_GROUP_ENTRY_BINDING);
                const uint32_t epoch = (uint32_t)w, state = (uint32_t)(w >> 32);
                if (state != MESH_GROUP_BOUND || (epoch & 0xffffu) != e16) {
                    gone |= 1u << l;
                    continue;
                }
                st.epoch = epoch;
                st.bound = 1u;
            }
            if (head - st.tail > g->mask && !tail_read) {
                st.tail = mesh_detail_ld_volatile_u64(mesh_detail_group_ring(g, slot) + MESH_RING_TAIL);
                tail_read = true;
            }
            if (head - st.tail > g->mask) {
                full_at = l;
                break;
            }
            sent |= 1u << l;
            head++;
        }
    }
    const uint32_t block = mesh_detail_warp_min(full_at);  // the first request of the batch that found no room
    const uint32_t done = block < n ? block : n;
    const uint32_t keep = done >= 32u ? 0xffffffffu : (1u << done) - 1u;
    sent &= keep;
    gone &= keep;
    // Each lane learns from its leader where its reply goes: the entry's head plus the replies its
    // leader sends before it.
    const uint32_t lead = valid ? (uint32_t)__ffs((int)same) - 1u : lane;
    const uint32_t sent_all = __shfl_sync(0xffffffffu, sent, lead);
    const uint64_t head0 = __shfl_sync(0xffffffffu, st.head, lead);
    __syncwarp();  // the leader's acquire load orders every lane's stores into the ring after meshd's reset
    const uint32_t words = g->msg_size / 4u;
    const bool go = (sent_all >> lane) & 1u;  // this lane's request gets its reply
    const uint64_t seq = head0 + (uint32_t)__popc(sent_all & below);
    // Pair q of the batch (16 bytes) is pair q % ppr of reply q / ppr: consecutive lanes write
    // consecutive pairs of a reply, so each store instruction fills whole lines of host memory, and a
    // lone reply is written by ppr lanes at once. q / ppr by a multiply, exact while q * ppr < 2^32:
    // q < 32 * ppr and ppr <= 8192 (64 KiB replies).
    const uint32_t ppr = words / 2u;
    const uint32_t pmagic = (uint32_t)(((1ull << 32) + ppr - 1u) / ppr);
    for (uint32_t q0 = 0; q0 < n * ppr; q0 += 32u) {
        const uint32_t q = q0 + lane;
        uint32_t r = ppr == 1u ? q : __umulhi(q, pmagic);
        if (r > 31u) r = 31u;  // q past the end (looked at below): any lane's values will do
        const uint64_t rseq = __shfl_sync(0xffffffffu, seq, r);
        const uint32_t rslot = __shfl_sync(0xffffffffu, slot, r);
        const bool rgo = __shfl_sync(0xffffffffu, (uint32_t)go, r) != 0u;
        if (q < n * ppr && rgo) {
            const uint32_t p = 2u * (q - r * ppr);  // the pair's first word in the reply
            const uint32_t* src = (const uint32_t*)msgs + (uint64_t)r * words + p;
            mesh_detail_st_volatile_v2(mesh_detail_group_slot(g, rslot, rseq) + p, (uint64_t)mesh_detail_tag(rseq) << 32 | src[0],
                                (uint64_t)mesh_detail_tag(rseq) << 32 | src[1]);
        }
    }
    if (leader) {
        const uint64_t half = (g->mask + 1u) / 2u;
        st.head += (uint32_t)__popc(sent);
        // Publish the head every half ring, and when the ring looked full (as mesh_reply does). One
        // store per entry, by its leader: different entries, different words.
        if (st.head != st.published && (st.head - st.published >= (half ? half : 1u) || full_at < 32u)) {
            mesh_detail_st_volatile_u64(mesh_detail_group_ring(g, slot) + MESH_RING_HEAD, st.head);
            st.published = st.head;
        }
        g->state[slot] = st;
    }
    uint32_t lost = mesh_detail_warp_or(gone);
    // A request whose id names no entry of the group (forged, or the group is unbound) is dropped too.
    lost |= __ballot_sync(0xffffffffu, mine && !valid) & keep;
    *dropped = lost;
    __syncwarp();  // every lane sees the new states next time
    return done;
}

// Acknowledges entry `slot`'s departure at `epoch`: its exact head first, then acked_epoch with
// st.release.sys. The __syncwarp orders every lane's reply stores before lane 0's release (release is
// cumulative over what lane 0 has observed), so meshd, once it sees the ack, resets a ring that holds
// every reply ever written to the departed client.
static __device__ __forceinline__ void mesh_detail_group_ack(mesh_group* g, uint32_t slot, uint32_t epoch) {
    mesh_reply_state st = g->state[slot];
    mesh_detail_group_flush(g, slot, &st);
    st.bound = 0u;  // any later reply to this epoch reads the entry again (and finds it not bound)
    __syncwarp();
    if (mesh_detail_lane0()) {
        g->state[slot] = st;
        mesh_detail_st_release_u32(mesh_detail_group_entry(g, slot) + MESH_GROUP_ENTRY_ACKED, epoch);
    }
    __syncwarp();
}

static __device__ __forceinline__ bool mesh_group_departed(mesh_group* g, uint32_t* gone) {
    if (g->msg_size == 0) return false;
    const uint32_t part = g->part, parts = g->parts;
    if (!g->scanning) {
        if (g->scanned) {
            const uint64_t now = mesh_globaltimer();
            if (now < g->changes_due) return false;
            g->changes_due = now + MESH_GROUP_PERIOD_NS;
            // Last period's load, lane 0's alone, arrived by now: the shuffle is where the warp first
            // uses its value, a period after it was issued (shuffling it as it is loaded would wait
            // for the PCIe read there, every period).
            const bool moved = __shfl_sync(0xffffffffu, g->changes_read != g->changes_seen, 0);
            if (!moved) {
                if (mesh_detail_lane0()) g->changes_read = mesh_detail_group_ld_relaxed_u64(g->header + MESH_GROUP_CHANGES);
                return false;
            }
        }
        uint64_t v = 0;
        if (mesh_detail_lane0()) v = mesh_detail_ld_acquire_u64(g->header + MESH_GROUP_CHANGES);
        g->scan_changes = __shfl_sync(0xffffffffu, v, 0);
        g->scanning = true;
        g->scan_at = 0;
    }
    const uint32_t lane = mesh_detail_lane();
    // scan_at counts this part's entries (part, part + parts, ...): a round trip loads 32 of its own.
    while (part + g->scan_at * parts < g->entries) {
        const uint32_t s = part + (g->scan_at + lane) * parts;
        uint64_t w = 0;
        uint32_t acked = 0;
        const bool mine = s < g->entries;
        if (mine) {
            char* e = mesh_detail_group_entry(g, s);
            w = mesh_detail_ld_acquire_u64(e + MESH_GROUP_ENTRY_BINDING);  // epoch and state: one load
            acked = *(volatile uint32_t*)(e + MESH_GROUP_ENTRY_ACKED);  // ours: what we (or a last launch) wrote
        }
        const bool due = mine && (uint32_t)(w >> 32) == MESH_GROUP_DEPARTED && acked != (uint32_t)w;
        const uint32_t ballot = __ballot_sync(0xffffffffu, due);
        if (ballot == 0) {
            g->scan_at += 32u;
            continue;
        }
        const uint32_t first = (uint32_t)__ffs((int)ballot) - 1u;
        const uint32_t epoch = __shfl_sync(0xffffffffu, (uint32_t)w, first);
        const uint32_t slot = part + (g->scan_at + first) * parts;
        mesh_detail_group_ack(g, slot, epoch);
        g->scan_at += first + 1u;
        *gone = slot | (epoch & 0xffffu) << 16;
        return true;
    }
    g->scanning = false;
    g->scanned = true;
    g->changes_seen = g->changes_read = g->scan_changes;
    return false;
}

static __device__ void mesh_group_close(mesh_group* g) {
    if (g->msg_size == 0) return;
    for (uint32_t s = g->part + mesh_detail_lane() * g->parts; s < g->entries; s += 32u * g->parts) {  // one store each
        mesh_reply_state st = g->state[s];
        if (st.head != st.published) {
            mesh_detail_st_volatile_u64(mesh_detail_group_ring(g, s) + MESH_RING_HEAD, st.head);
            st.published = st.head;
            g->state[s] = st;
        }
    }
    __syncwarp();
}
