// stress.cuh: the message content the channel stress programs (source.cu, sink.cu) write and check;
// mesh-gpu-tests' `stress` module computes the same in Rust.
//
// Message `seq` of W = msg_size/4 words: w[0] = low half of seq, w[1..W-1] = stress_word(seq, k),
// w[W-1] = stress_checksum over w[0..W-1] and the high half of seq. Every payload byte and its position
// count in the checksum, so a lost, repeated, reordered or torn message cannot pass.
#pragma once
#include "mesh.cuh"

static __device__ __forceinline__ uint32_t stress_word(uint64_t seq, uint32_t k) {
    return (uint32_t)((seq * 0x9E3779B97F4A7C15ull) >> 32) ^ (k * 0x85EBCA77u);
}
// One word's share of the checksum: position-dependent, so that swapped words do not cancel.
static __device__ __forceinline__ uint32_t stress_term(uint32_t w, uint32_t k) {
    return (w + 0x7F4A7C15u * k) * (2u * k + 1u);
}
static __device__ __forceinline__ uint32_t stress_finish(uint32_t sum, uint64_t seq) {
    return sum ^ ((uint32_t)(seq >> 32) * 0x85EBCA6Bu) ^ 0xC2B2AE35u;
}
// Word k < W-1 of message seq, as the producer writes it (word W-1 is the checksum).
static __device__ __forceinline__ uint32_t stress_value(uint64_t seq, uint32_t k) {
    return k == 0 ? (uint32_t)seq : stress_word(seq, k);
}
// Writes message seq (W words) into buf, the lanes of a warp (lanes = 32) or one thread (lanes = 1) together.
static __device__ __forceinline__ void stress_fill(uint32_t* buf, uint64_t seq, uint32_t words, uint32_t lanes) {
    uint32_t sum = 0;
    for (uint32_t k = threadIdx.x; k + 1 < words; k += lanes) {
        buf[k] = stress_value(seq, k);
        sum += stress_term(buf[k], k);
    }
    if (lanes == 32)
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x == 0) buf[words - 1] = stress_finish(sum, seq);
}
// Whether buf holds message seq whole (same lanes convention; the answer on every lane).
static __device__ __forceinline__ bool stress_check(const uint32_t* buf, uint64_t seq, uint32_t words, uint32_t lanes) {
    uint32_t sum = 0;
    for (uint32_t k = threadIdx.x; k + 1 < words; k += lanes) sum += stress_term(buf[k], k);
    if (lanes == 32)
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return buf[0] == (uint32_t)seq && buf[words - 1] == stress_finish(sum, seq);
}
// A user word, written without a fence (the host reads it as a progress report).
static __device__ __forceinline__ void stress_set(const mesh_ctx& ctx, uint32_t i, uint32_t v) {
    *(volatile uint32_t*)(mesh_detail_slot_at(ctx, MESH_SLOT_USER) + 4u * i) = v;
}
static __device__ __forceinline__ void stress_set_count(const mesh_ctx& ctx, uint64_t count) {
    stress_set(ctx, 0, (uint32_t)count);
    stress_set(ctx, 1, (uint32_t)(count >> 32));
}
// Knobs a stress program reads from its optional knob binding (one 8-byte message, never consumed, so
// every relaunch sees it again): a pause per message, in ns; the most messages per warp call (low 16
// bits of the second word); STRESS_FIXED (bit 16): a source fills its buffer once and then changes only
// word 0, a sink counts without checking (what a throughput benchmark wants: the channel's cost, not
// the generator's or the checker's).
#define STRESS_FIXED (1u << 16)
typedef struct {
    uint32_t pause_ns;
    uint32_t batch;
    uint32_t flags;
} stress_knobs;

static __device__ __forceinline__ stress_knobs stress_read_knobs(const mesh_ctx& ctx, uint32_t binding) {
    stress_knobs k = {0, 64, 0};
    mesh_chan ch = mesh_chan_open(ctx, binding, false);
    uint32_t m[2];
    if (ch.msg_size == 8 && mesh_try_recv_deferred(&ch, m)) {
        k.pause_ns = m[0];
        k.batch = (m[1] & 0xffffu) ? (m[1] & 0xffffu) : 1u;
        k.flags = m[1] & ~0xffffu;
    }
    return k;
}
static __device__ __forceinline__ void stress_pause(uint32_t ns) {
    if (ns == 0) return;
    uint64_t t = mesh_globaltimer();
    while (mesh_globaltimer() - t < ns) {}
}
// User words of the stress programs (the host reads them from the program's slot).
#define STRESS_COUNT_LO 0u   // messages passed (sink) or sent (source), all launches together
#define STRESS_COUNT_HI 1u
#define STRESS_ERRORS 2u     // messages that failed the check (sink)
#define STRESS_FIRST_BAD 3u  // low half of the first failing position (sink)
#define STRESS_LAUNCHES 4u   // launches of the kernel
#define STRESS_RESUME 5u     // launches that found the channel position differ from the count kept (sink)
