// mesh/detail/channel.cuh: the definitions of mesh/channel.cuh's calls and the helpers they share (the
// fan-in consumer of mesh/service.cuh reuses the index publication). Not for programs: names starting
// with mesh_detail_ may change.
#pragma once
#include "../channel.cuh"

static __device__ __forceinline__ volatile uint64_t* mesh_detail_chan_slot(const mesh_chan* ch, uint64_t seq) {
    return (volatile uint64_t*)(ch->slots + (seq & ch->mask) * (uint64_t)ch->msg_size * MESH_RING_WIRE_FACTOR);
}

// Stores this end's index (head for a producer, committed tail for a consumer). A plain store: the
// other end needs it only as credit (or to resume), never to validate a message.
static __device__ __forceinline__ void mesh_detail_chan_flush(mesh_chan* ch) {
    if (ch->msg_size == 0) return;
    uint64_t v = ch->producer ? ch->mine : ch->other;
    if (v != ch->published) {
        // One store, from the lowest active lane: when a whole warp calls this, 32 stores of one word
        // would each cross PCIe. A lone thread is its own lowest active lane.
        if ((__activemask() & ((1u << mesh_detail_lane()) - 1u)) == 0)
            mesh_detail_st_volatile_u64(ch->ring + (ch->producer ? MESH_RING_HEAD : MESH_RING_TAIL), v);
        ch->published = v;
    }
}

// Publishes this end's index when half a ring has gone by since the last time.
static __device__ __forceinline__ void mesh_detail_chan_progress(mesh_chan* ch) {
    uint64_t v = ch->producer ? ch->mine : ch->other;
    uint64_t batch = (ch->mask + 1u) / 2u;
    if (v - ch->published >= (batch ? batch : 1u)) mesh_detail_chan_flush(ch);
}

// A receive that commits as it takes, once it moved ch->mine past what it took: publishes (every half
// ring) what earlier calls took (ch->other) first, then counts these as consumed. The program handled
// the earlier ones before it called again, so a launch that dies between this take and the handling
// resumes before these messages: at-least-once after a crash, never lost. The next call, an empty poll
// or mesh_chan_close publishes them.
static __device__ __forceinline__ void mesh_detail_chan_took(mesh_chan* ch) {
    mesh_detail_chan_progress(ch);
    ch->other = ch->mine;
}

static __device__ __forceinline__ mesh_chan mesh_chan_open(const mesh_ctx& c, uint32_t b, bool producer) {
    mesh_chan ch = {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, producer};
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return ch;
    if (c.bindings[b].protocol != MESH_PROTOCOL_LL) return ch;  // a bulk channel: mesh_bulk_open
    ch.ring = mesh_detail_at(c, c.bindings[b].ring_offset);
    ch.slots = (char*)(uintptr_t)c.bindings[b].slots;
    ch.msg_size = c.bindings[b].msg_size;
    ch.mask = c.bindings[b].capacity - 1;
    ch.magic = (uint32_t)(((1ull << 32) + ch.msg_size / 4u - 1u) / (ch.msg_size / 4u));
    uint64_t tail = mesh_detail_ld_volatile_u64(ch.ring + MESH_RING_TAIL);
    if (producer) {
        uint64_t head = mesh_detail_ld_volatile_u64(ch.ring + MESH_RING_HEAD);
        ch.published = head;
        if ((int64_t)(tail - head) > 0) head = tail;
        // Skip messages written after the published head (a producer that stopped without closing, or
        // died): whole ones only, every word tagged, as mesh-shm's ProducerCore::resume judges them; one
        // cut off mid-write is written again. Every word, not the first and last: a warp's lanes store
        // their words at once, so a launch killed mid-send can leave both ends of a message and miss a
        // word between, and skipping that message would leave its consumer waiting for the word for
        // good. The first word alone decides the usual case (after an orderly close, the next slot is
        // empty), and a crash costs a read of each message written since the last publication.
        const uint32_t words = ch.msg_size / 4u;
        while (head - tail <= ch.mask) {
            const volatile uint64_t* w = mesh_detail_chan_slot(&ch, head);
            const uint32_t t = mesh_detail_tag(head);
            if ((uint32_t)(mesh_detail_ld_volatile_u64(w) >> 32) != t) break;
            bool whole = true;
            for (uint32_t i = 1; i < words; i++) whole &= (uint32_t)(mesh_detail_ld_volatile_u64(w + i) >> 32) == t;
            if (!whole) break;
            head++;
        }
        ch.mine = head;
        ch.other = tail;
    } else {
        ch.mine = ch.other = ch.published = tail;
    }
    return ch;
}

static __device__ __forceinline__ void mesh_chan_close(mesh_chan* ch) {
    mesh_detail_chan_flush(ch);
}

static __device__ __forceinline__ uint32_t mesh_chan_room(mesh_chan* ch) {
    if (ch->msg_size == 0 || !ch->producer) return 0;
    if (ch->mine - ch->other > ch->mask) {
        ch->other = mesh_detail_ld_volatile_u64(ch->ring + MESH_RING_TAIL);
        mesh_detail_chan_flush(ch);  // the ring looked full: a good moment to say how far we are
    }
    uint64_t used = ch->mine - ch->other;
    return used > ch->mask ? 0u : (uint32_t)(ch->mask + 1u - used);
}

// A receiver waiting on an empty ring publishes its position: all of it, or without
// MESH_PUBLISH_ON_DRAIN once half a ring is owed. A receive publishes only what earlier receives took
// (mesh_detail_chan_took), so a consumer that took every message in flight in one call would otherwise leave
// the producer without credit for good.
static __device__ __forceinline__ void mesh_detail_chan_publish_waiting(mesh_chan* ch) {
    if (MESH_PUBLISH_ON_DRAIN) mesh_detail_chan_flush(ch);
    else mesh_detail_chan_progress(ch);
}

// A receive found the ring empty.
static __device__ __forceinline__ void mesh_detail_chan_drained(mesh_chan* ch) {
    ch->hint = 1;
    mesh_detail_chan_publish_waiting(ch);
}

// How long a receiver waits for the rest of a message whose first words have arrived, in ns of
// %globaltimer, before it gives up for this call (a producer that died mid-message must not keep a
// kernel from seeing its stop request).
#define MESH_PARTIAL_WAIT_NS 100000u

static __device__ __forceinline__ bool mesh_try_send(mesh_chan* ch, const void* msg) {
    if (mesh_chan_room(ch) == 0) return false;
    volatile uint64_t* dst = mesh_detail_chan_slot(ch, ch->mine);
    const uint32_t* src = (const uint32_t*)msg;
    const uint64_t t = (uint64_t)mesh_detail_tag(ch->mine) << 32;
    for (uint32_t i = 0; i < ch->msg_size / 4u; i += 2) mesh_detail_st_volatile_v2(dst + i, t | src[i], t | src[i + 1]);
    ch->mine += 1;
    mesh_detail_chan_progress(ch);
    return true;
}

static __device__ __forceinline__ bool mesh_try_recv_deferred(mesh_chan* ch, void* out) {
    if (ch->msg_size == 0 || ch->producer) return false;
    const volatile uint64_t* src = mesh_detail_chan_slot(ch, ch->mine);
    const uint32_t t = mesh_detail_tag(ch->mine);
    uint32_t* dst = (uint32_t*)out;
    uint64_t since = 0;
    for (uint32_t i = 0; i < ch->msg_size / 4u;) {
        uint64_t a, b;
        mesh_detail_ld_volatile_v2(src + i, &a, &b);
        if ((uint32_t)(a >> 32) == t && (uint32_t)(b >> 32) == t) {
            dst[i] = (uint32_t)a;
            dst[i + 1] = (uint32_t)b;
            i += 2;
        } else if (i == 0) {
            mesh_detail_chan_drained(ch);
            return false;
        } else if (since == 0) {
            ch->partial++;
            since = mesh_globaltimer();
        } else if (mesh_globaltimer() - since > MESH_PARTIAL_WAIT_NS) {
            return false;
        }
    }
    ch->mine += 1;
    return true;
}

static __device__ __forceinline__ void mesh_chan_commit(mesh_chan* ch) {
    if (ch->msg_size == 0 || ch->producer) return;
    ch->other = ch->mine;
    mesh_detail_chan_progress(ch);
}

static __device__ __forceinline__ bool mesh_try_recv(mesh_chan* ch, void* out) {
    if (!mesh_try_recv_deferred(ch, out)) return false;
    mesh_detail_chan_took(ch);
    return true;
}

// Words each lane keeps in flight: a warp moves 32 x 32 words (4 KiB of payload) per round trip, as
// MESH_DETAIL_WARP_PAIRS 16-byte loads per lane.
#define MESH_DETAIL_WARP_LOADS 32u
#define MESH_DETAIL_WARP_PAIRS (MESH_DETAIL_WARP_LOADS / 2u)

// Message index of word `idx` of a batch: idx / words without the ~40 instructions of a division. Exact
// while idx * words < 2^32 (the error, magic * words - 2^32, is below words); batches keep idx < 2^16.
static __device__ __forceinline__ uint32_t mesh_detail_chan_msg_of(const mesh_chan* ch, uint32_t idx) {
    return __umulhi(idx, ch->magic);
}

static __device__ uint32_t mesh_warp_try_recv_batch(mesh_chan* ch, void* buf, uint32_t max) {
    if (ch->msg_size == 0 || ch->producer || max == 0) return 0;
    const uint32_t lane = mesh_detail_lane();
    const uint32_t words = ch->msg_size / 4u;  // even: messages are multiples of 8 bytes
    const uint32_t round = 32u * MESH_DETAIL_WARP_LOADS;
    uint32_t n = 1;
    if (words <= round) {
        n = round / words;
        if (n > max) n = max;
        if (n > ch->hint) n = ch->hint;
        const uint32_t to_end = ch->mask + 1u - (uint32_t)(ch->mine & ch->mask);  // slots are contiguous until the ring's end
        if (n > to_end) n = to_end;
    }
    const uint32_t total = n * words;
    const volatile uint64_t* src = mesh_detail_chan_slot(ch, ch->mine);
    uint32_t* dst = (uint32_t*)buf;
    const uint32_t seq = (uint32_t)ch->mine;
    uint32_t got = n;
    // Each lane loads pairs of words with one 16-byte load (16-byte loads of mapped memory move several
    // times the bytes of 8-byte ones per round trip); each word of a pair is checked on its own,
    // since only 8 bytes arrive whole. Pair k of a lane: words base + 2 * (lane + 32k) and the next.
    for (uint32_t base = 0; base < total && got == n; base += round) {
        uint64_t a[MESH_DETAIL_WARP_PAIRS], b[MESH_DETAIL_WARP_PAIRS];
        uint32_t stale = 0;  // bit k: pair k is still to be seen with its tags
#pragma unroll
        for (uint32_t k = 0; k < MESH_DETAIL_WARP_PAIRS; k++)
            if (base + 2u * (lane + 32u * k) < total) stale |= 1u << k;
        uint64_t since = 0;
        for (bool first = true;; first = false) {
#pragma unroll
            for (uint32_t k = 0; k < MESH_DETAIL_WARP_PAIRS; k++)
                if ((stale >> k) & 1u) mesh_detail_ld_volatile_v2(src + base + 2u * (lane + 32u * k), &a[k], &b[k]);
            if (first && base == 0) {
                // Empty? Decided on the first pair of each lane alone (it holds the first message's first
                // words), so an empty poll waits for one round trip, not for every word it asked for.
                const bool mine0 = (stale & 1u) && 2u * lane < words && (uint32_t)(a[0] >> 32) == (seq | 0x80000000u);
                if (!__any_sync(0xffffffffu, mine0)) {
                    mesh_detail_chan_drained(ch);
                    return 0;
                }
            }
            uint32_t bad = n;  // the first message with a word missing, as this lane sees it
#pragma unroll
            for (uint32_t k = 0; k < MESH_DETAIL_WARP_PAIRS; k++) {
                if (!((stale >> k) & 1u)) continue;
                const uint32_t j = mesh_detail_chan_msg_of(ch, base + 2u * (lane + 32u * k));  // both words: one message
                const uint32_t t = (seq + j) | 0x80000000u;
                if ((uint32_t)(a[k] >> 32) == t && (uint32_t)(b[k] >> 32) == t) {
                    stale &= ~(1u << k);
                } else if (j < bad) {
                    bad = j;
                }
            }
            bad = mesh_detail_warp_min(bad);
            if (bad == n) break;  // every message of this round is whole
            if (bad > 0) {        // take the whole messages in front of the first incomplete one
                got = bad;
                break;
            }
            // The first message is on its way: wait for its other words, within a bound.
            if (since == 0) {
                ch->partial++;
                since = mesh_globaltimer();
            }
            if (__shfl_sync(0xffffffffu, mesh_globaltimer() - since > MESH_PARTIAL_WAIT_NS, 0)) return 0;
        }
#pragma unroll
        for (uint32_t k = 0; k < MESH_DETAIL_WARP_PAIRS; k++) {
            const uint32_t idx = base + 2u * (lane + 32u * k);
            if (idx < total && mesh_detail_chan_msg_of(ch, idx) < got) {
                dst[idx] = (uint32_t)a[k];
                dst[idx + 1] = (uint32_t)b[k];
            }
        }
    }
    __syncwarp();
    ch->hint = got == n ? 2u * n : got;
    ch->mine += got;
    mesh_detail_chan_took(ch);
    return got;
}

// 16-byte loads per lane on mesh_warp_try_recv's short path: messages up to 64 x this many wire words
// (1 KiB) take it.
#define MESH_DETAIL_LEAN_PAIRS 4u

// The short path: predicated loads, one vote; a half-arrived message is polled again on the next call.
static __device__ __forceinline__ bool mesh_detail_warp_recv_lean(mesh_chan* ch, void* buf, uint32_t words) {
    const uint32_t lane = mesh_detail_lane(), t = mesh_detail_tag(ch->mine);
    const volatile uint64_t* src = mesh_detail_chan_slot(ch, ch->mine);
    uint64_t a[MESH_DETAIL_LEAN_PAIRS], b[MESH_DETAIL_LEAN_PAIRS];
#pragma unroll
    for (uint32_t k = 0; k < MESH_DETAIL_LEAN_PAIRS; k++) {
        a[k] = b[k] = 0;
        if (2u * (lane + 32u * k) < words) mesh_detail_ld_volatile_v2(src + 2u * (lane + 32u * k), &a[k], &b[k]);
    }
    bool whole = true;
#pragma unroll
    for (uint32_t k = 0; k < MESH_DETAIL_LEAN_PAIRS; k++)
        if (2u * (lane + 32u * k) < words) whole &= (uint32_t)(a[k] >> 32) == t && (uint32_t)(b[k] >> 32) == t;
    if (!__all_sync(0xffffffffu, whole)) {
        if (__shfl_sync(0xffffffffu, (uint32_t)(a[0] >> 32) == t, 0)) ch->partial++;  // word 0 is there: half-arrived
        else mesh_detail_chan_drained(ch);                                                  // nothing yet
        return false;
    }
    uint32_t* dst = (uint32_t*)buf;
#pragma unroll
    for (uint32_t k = 0; k < MESH_DETAIL_LEAN_PAIRS; k++) {
        const uint32_t idx = 2u * (lane + 32u * k);
        if (idx < words) {
            dst[idx] = (uint32_t)a[k];
            dst[idx + 1u] = (uint32_t)b[k];
        }
    }
    __syncwarp();
    ch->mine += 1;
    mesh_detail_chan_took(ch);
    return true;
}

static __device__ __forceinline__ bool mesh_warp_try_recv(mesh_chan* ch, void* buf) {
    const uint32_t words = ch->msg_size / 4u;  // wire words (8 B), 4 payload bytes each; even
    if (words > 64u * MESH_DETAIL_LEAN_PAIRS) return mesh_warp_try_recv_batch(ch, buf, 1) == 1;  // never waits
    if (words == 0 || ch->producer) return false;
    return mesh_detail_warp_recv_lean(ch, buf, words);
}

static __device__ uint32_t mesh_warp_try_send_batch(mesh_chan* ch, const void* buf, uint32_t count) {
    uint32_t room = __shfl_sync(0xffffffffu, mesh_chan_room(ch), 0);
    ch->other = __shfl_sync(0xffffffffu, ch->other, 0);
    const uint32_t words = ch->msg_size / 4u;
    uint32_t n = count < room ? count : room;
    if (n * (uint64_t)words > 65536u) n = 65536u / words;  // see mesh_detail_chan_msg_of
    const uint32_t* src = (const uint32_t*)buf;
    // Pairs of words, one 16-byte store each (a pair never straddles two messages: words is even).
    for (uint32_t idx = 2u * mesh_detail_lane(); idx < n * words; idx += 64u) {
        const uint32_t j = mesh_detail_chan_msg_of(ch, idx);
        const uint64_t seq = ch->mine + j;
        const uint64_t t = (uint64_t)mesh_detail_tag(seq) << 32;
        mesh_detail_st_volatile_v2(mesh_detail_chan_slot(ch, seq) + (idx - j * words), t | src[idx], t | src[idx + 1]);
    }
    ch->mine += n;
    if (n) mesh_detail_chan_progress(ch);
    return n;
}

static __device__ __forceinline__ bool mesh_warp_try_send(mesh_chan* ch, const void* buf) {
    if (ch->msg_size == 0 || !ch->producer) return false;
    // Every lane reads the same tail (one request) when the ring looks full, so they agree; with
    // credit cached, one compare (no call).
    if (ch->mine - ch->other > ch->mask && mesh_chan_room(ch) == 0) return false;
    const uint32_t words = ch->msg_size / 4u;
    volatile uint64_t* dst = mesh_detail_chan_slot(ch, ch->mine);
    const uint64_t t = (uint64_t)mesh_detail_tag(ch->mine) << 32;
    const uint32_t* src = (const uint32_t*)buf;
    for (uint32_t idx = 2u * mesh_detail_lane(); idx < words; idx += 64u) mesh_detail_st_volatile_v2(dst + idx, t | src[idx], t | src[idx + 1]);
    ch->mine += 1;
    mesh_detail_chan_progress(ch);
    return true;
}
