// kit_ring.h: the host client of the issue-16 kit (kit_echo.cu): mesh-shm's ring (crates/mesh-shm/src/ring.rs)
// ported line for line to C++, so that the standalone echo is driven exactly as mesh-shm drives it.
// Host code only (no CUDA), so that it can be checked without a GPU.
#pragma once
#include <stdint.h>
#include <algorithm>

#ifndef KIT_CAP
#define KIT_CAP 64u  // the bench's channel capacity
#endif
static const uint32_t CAP = KIT_CAP;

static inline uint32_t tag_of(uint64_t seq) { return (uint32_t)seq | 0x80000000u; }
static inline uint64_t word_of(uint64_t seq, uint32_t payload) { return ((uint64_t)tag_of(seq) << 32) | payload; }
static inline uint64_t ld_relaxed(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline uint64_t ld_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st_relaxed(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void st_release(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

struct HostProducer {  // ProducerCore
    uint64_t *head_line, *tail_line, *slots;
    uint32_t words;
    uint64_t head = 0, cached_tail = 0;
    bool try_send(const uint32_t* msg) {
        uint64_t used = head - cached_tail;
        if (CAP - std::min<uint64_t>(used, CAP) < 1) {
            cached_tail = ld_acquire(tail_line);
            used = head - cached_tail;
        }
        if (used >= CAP) return false;
        uint64_t* w = slots + (head & (CAP - 1)) * words;
        for (uint32_t k = 1; k < words; k++) st_relaxed(w + k, word_of(head, msg[k]));
        st_relaxed(w, word_of(head, msg[0]));  // first word last (ring.rs `write`)
        head++;
        st_release(head_line, head);
        return true;
    }
};

struct HostConsumer {  // ConsumerCore
    uint64_t *tail_line, *slots;
    uint32_t words;
    uint64_t tail = 0;
    bool try_recv(uint32_t* out) {
        const uint64_t* w = slots + (tail & (CAP - 1)) * words;
        const uint32_t t = tag_of(tail);
        const uint64_t first = ld_relaxed(w), last = ld_relaxed(w + words - 1);
        if ((uint32_t)(first >> 32) != t || (uint32_t)(last >> 32) != t) return false;
        for (uint32_t k = 1; k + 1 < words; k++) {
            const uint64_t v = ld_relaxed(w + k);
            if ((uint32_t)(v >> 32) != t) return false;
            out[k] = (uint32_t)v;
        }
        out[0] = (uint32_t)first;
        out[words - 1] = (uint32_t)last;
        tail++;
        st_release(tail_line, tail);
        return true;
    }
};

