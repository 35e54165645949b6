// mesh/detail/bulk.cuh: the definitions of mesh/bulk.cuh's calls and their helpers. Not for programs:
// names starting with mesh_detail_ may change.
#pragma once
#include "../bulk.cuh"

// Copies n 16-byte units from src to dst (global or shared memory) with every thread of the block, 4
// loads in flight per thread before its stores. The loads are volatile: they go past the SM's L1,
// which may still hold a ring slot's previous lap.
static __device__ __forceinline__ void mesh_detail_block_copy(uint4* dst, const uint4* src, uint32_t n) {
    const uint32_t s = mesh_block_threads();
    uint32_t i = mesh_block_rank();
    for (; i + 3u * s < n; i += 4u * s) {
        const uint4 a = mesh_detail_ld_volatile_v4(src + i), b = mesh_detail_ld_volatile_v4(src + i + s);
        const uint4 c = mesh_detail_ld_volatile_v4(src + i + 2u * s), d = mesh_detail_ld_volatile_v4(src + i + 3u * s);
        dst[i] = a;
        dst[i + s] = b;
        dst[i + 2u * s] = c;
        dst[i + 3u * s] = d;
    }
    for (; i < n; i += s) dst[i] = mesh_detail_ld_volatile_v4(src + i);
}

// The flag of part first + r of message seq's slot (r < count).
static __device__ __forceinline__ uint64_t* mesh_detail_bulk_flag(const mesh_bulk* ch, uint64_t seq, uint32_t r) {
    return ch->flags + (seq & ch->mask) * ch->parts + ch->first + r;
}
// This block's share of message seq's slot.
static __device__ __forceinline__ char* mesh_detail_bulk_slot(const mesh_bulk* ch, uint64_t seq) {
    return ch->payload + (seq & ch->mask) * (uint64_t)ch->stride;
}
// Part first + r's head line, and its tail line.
static __device__ __forceinline__ char* mesh_detail_bulk_head_line(const mesh_bulk* ch, uint32_t r) {
    return ch->lines + (uint64_t)r * ch->line_step;
}
static __device__ __forceinline__ char* mesh_detail_bulk_tail_line(const mesh_bulk* ch, uint32_t r) {
    return mesh_detail_bulk_head_line(ch, r) + (MESH_RING_TAIL - MESH_RING_HEAD);
}
static __device__ __forceinline__ uint64_t mesh_detail_bulk_ld_flag(const mesh_bulk* ch, const uint64_t* f) {
    return ch->placement == MESH_PLACEMENT_HOST ? mesh_detail_ld_acquire_u64(f) : mesh_detail_ld_acquire_gpu_u64(f);
}

static __device__ __forceinline__ uint32_t mesh_bulk_part_offset(const mesh_bulk* ch) {
    return ch->parts == 0 ? 0u : ch->first * (ch->stride / ch->parts);
}

static __device__ mesh_bulk mesh_bulk_open_part(const mesh_ctx& c, uint32_t b, bool producer, uint32_t block,
                                                uint32_t blocks) {
    mesh_bulk ch = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, producer};
    if (b >= c.binding_count || b >= MESH_MAX_BINDINGS || c.bindings[b].ring_offset == 0 || c.bindings[b].slots == 0)
        return ch;
    const uint32_t word = c.bindings[b].protocol;
    const uint32_t parts = (word >> MESH_BULK_PARTS_SHIFT) == 0u ? 1u : word >> MESH_BULK_PARTS_SHIFT;
    if ((word & ((1u << MESH_BULK_PARTS_SHIFT) - 1u)) != MESH_PROTOCOL_BULK || parts > MESH_BULK_MAX_PARTS ||
        (parts & (parts - 1u)) != 0u || blocks == 0u || (blocks & (blocks - 1u)) != 0u || blocks > parts ||
        block >= blocks || c.bindings[b].msg_size % (16u * parts) != 0u)
        return ch;
    // A thread a part, for the calls' per-part work and the close's look at every part: a block of
    // fewer threads than the channel's parts is refused (32 threads always do).
    if (mesh_block_threads() < parts) return ch;
    const uint32_t capacity = c.bindings[b].capacity;
    const uint32_t part_bytes = c.bindings[b].msg_size / parts;
    ch.ring = mesh_detail_at(c, c.bindings[b].ring_offset);
    ch.flags = (uint64_t*)(uintptr_t)c.bindings[b].slots;
    ch.parts = parts;
    ch.count = parts / blocks;
    ch.first = block * ch.count;
    ch.stride = c.bindings[b].msg_size;
    ch.msg_size = ch.count * part_bytes;
    ch.mask = capacity - 1u;
    ch.placement = c.bindings[b].placement;
    const uint64_t flags_bytes = (uint64_t)capacity * parts * MESH_BULK_FLAG_SIZE;
    uint64_t end = flags_bytes;
    if (parts == 1u) {
        ch.lines = ch.ring + MESH_RING_HEAD;
        ch.line_step = 0;
    } else {
        const uint64_t lines = (flags_bytes + MESH_LINE - 1u) / MESH_LINE * MESH_LINE;
        ch.lines = (char*)ch.flags + lines + (uint64_t)ch.first * 2u * MESH_LINE;
        ch.line_step = 2u * MESH_LINE;
        end = lines + 2u * (uint64_t)parts * MESH_LINE;
    }
    ch.payload = (char*)ch.flags + (end + MESH_BULK_ALIGN - 1u) / MESH_BULK_ALIGN * MESH_BULK_ALIGN +
                 (uint64_t)ch.first * part_bytes;
    // Threads 0 .. count - 1 each read one part's indices (and, for a producer, its flags after the
    // published head), and the block takes the furthest: every copy of the channel must start equal.
    // Positions are compared as distances from part `first`'s tail, read by every thread.
    const uint32_t r = mesh_block_rank();
    const uint64_t base = mesh_detail_block_bcast(r == 0 ? mesh_detail_ld_acquire_u64(mesh_detail_bulk_tail_line(&ch, 0)) : 0u);
    int64_t pos = 0, tail_at = 0;
    uint64_t tail = base;
    if (r < ch.count) {
        tail = mesh_detail_ld_acquire_u64(mesh_detail_bulk_tail_line(&ch, r));
        uint64_t at = tail;
        if (producer) {
            uint64_t head = mesh_detail_ld_acquire_u64(mesh_detail_bulk_head_line(&ch, r));
            if ((int64_t)(tail - head) > 0) head = tail;
            while (head - tail <= ch.mask && mesh_detail_bulk_ld_flag(&ch, mesh_detail_bulk_flag(&ch, head, r)) == head + 1u) head++;
            at = head;
        }
        pos = (int64_t)(at - base);
        tail_at = (int64_t)(tail - base);
    }
    const int64_t furthest = mesh_detail_block_max_of(pos, ch.count);
    ch.mine = base + (uint64_t)furthest;
    ch.other = ch.mine;  // a consumer knows of no whole message yet (a producer's is set below)
    if (producer) {
        // The parts behind, completed: as far as room allows, then (rarely: the end was served by more
        // blocks and one part's consumer is a full ring behind) as its consumer frees slots, rereading
        // that tail. The flags between could otherwise never be written: the block's publishes flag
        // its own position, its close stores each part's head there, and a relaunch resumes past them.
        int64_t stopped = 0;
        if (r < ch.count) {
            uint64_t at = base + (uint64_t)pos;
            while (at != ch.mine) {
                if (at - tail > ch.mask) {  // no room: wait for this part's consumer, or a stop
                    if (mesh_detail_ld_acquire_u32(mesh_detail_slot_at(c, MESH_SLOT_STOP)) != 0u) {
                        stopped = 1;
                        break;
                    }
                    tail = mesh_detail_ld_acquire_u64(mesh_detail_bulk_tail_line(&ch, r));
                    continue;
                }
                if (ch.placement == MESH_PLACEMENT_HOST) mesh_detail_st_release_u64(mesh_detail_bulk_flag(&ch, at, r), at + 1u);
                else mesh_detail_st_release_gpu_u64(mesh_detail_bulk_flag(&ch, at, r), at + 1u);
                at++;
            }
            if (at != base + (uint64_t)pos) mesh_detail_st_volatile_u64(mesh_detail_bulk_head_line(&ch, r), at);
            tail_at = (int64_t)(tail - base);
        }
        // The slowest tail, for the room check (after the waits: they may have moved).
        ch.other = base - (uint64_t)mesh_detail_block_max_of(-tail_at, ch.count);
        if (mesh_detail_block_max_of(stopped, ch.count) != 0) ch.msg_size = 0;  // every call fails; close too
    } else if (r < ch.count && tail != ch.mine) {
        mesh_detail_st_release_u64(mesh_detail_bulk_tail_line(&ch, r), ch.mine);
    }
    __syncthreads();
    return ch;
}

static __device__ mesh_bulk mesh_bulk_open(const mesh_ctx& c, uint32_t b, bool producer) {
    return mesh_bulk_open_part(c, b, producer, 0u, 1u);
}

static __device__ __forceinline__ void mesh_bulk_close(mesh_bulk* ch) {
    __syncthreads();
    if (ch->msg_size == 0) return;
    const uint32_t r = mesh_block_rank();
    const uint32_t side = ch->producer ? 0u : MESH_RING_TAIL - MESH_RING_HEAD;
    if (r < ch->count) {
        if (ch->producer) mesh_detail_st_release_u64(mesh_detail_bulk_head_line(ch, r), ch->mine);
        else mesh_detail_st_release_u64(mesh_detail_bulk_tail_line(ch, r), ch->mine);
    }
    if (ch->parts == 1u || ch->first != 0u) return;
    // Block 0's threads read every part's line (other blocks' too: reading needs no ownership).
    const char* line0 = ch->lines;
    int64_t behind = 0;
    if (r < ch->parts) behind = (int64_t)(ch->mine - mesh_detail_ld_acquire_u64(line0 + (uint64_t)r * ch->line_step + side));
    const int64_t most = mesh_detail_block_max_of(behind, ch->parts);
    if (r == 0) mesh_detail_st_release_u64(ch->ring + (ch->producer ? MESH_RING_HEAD : MESH_RING_TAIL), ch->mine - (uint64_t)most);
}

// Free slots a producer can fill now (the same on every thread; reads its parts' tails, one round
// trip, only when the ring looks full). The tails are loaded with acquire semantics, and the barrier
// of the reduction passes that on to the block: the consumers' reads of a slot's last lap (before
// their release of the tail) are then ordered before the block's stores into it. A relaxed or volatile
// load would leave that to the hardware not issuing a store before the load it depends on has
// returned, which the PTX memory model does not promise (the payload accesses are weak, so that would
// be a data race); once per ring that looked full, the acquire costs nothing that matters. A tail
// ahead of this end (its consumer skipped messages when it resumed) moves the producer there.
// mesh_detail_bulk_room_for(ch, want) reads the tails when fewer than `want` slots look free (mesh_bulk_room:
// when none does), so that a caller that needs `want` at once sees the room the consumer made.
static __device__ __forceinline__ uint32_t mesh_detail_bulk_room_for(mesh_bulk* ch, uint32_t want) {
    if (ch->msg_size == 0 || !ch->producer) return 0;
    if (ch->mine - ch->other + (want ? want - 1u : 0u) > ch->mask) {
        const uint32_t r = mesh_block_rank();
        int64_t used = INT64_MIN;
        if (r < ch->count) used = (int64_t)(ch->mine - mesh_detail_ld_acquire_u64(mesh_detail_bulk_tail_line(ch, r)));
        const int64_t most = mesh_detail_block_max_of(used, ch->count);
        if (most < 0) ch->mine -= (uint64_t)most;  // every tail ahead: jump to the nearest
        ch->other = ch->mine - (uint64_t)(most < 0 ? 0 : most);
    }
    const uint64_t used = ch->mine - ch->other;
    return used > ch->mask ? 0u : (uint32_t)(ch->mask + 1u - used);
}
static __device__ __forceinline__ uint32_t mesh_bulk_room(mesh_bulk* ch) {
    return mesh_detail_bulk_room_for(ch, 1u);
}

static __device__ __forceinline__ void* mesh_block_reserve(mesh_bulk* ch) {
    return mesh_bulk_room(ch) == 0 ? (void*)0 : (void*)mesh_detail_bulk_slot(ch, ch->mine);
}

// The block synchronises (every thread's stores are ordered before the flag stores), then each of
// threads 0 .. count - 1 stores one part's flag with release semantics (system scope for a host channel,
// GPU scope for a device one), which orders what the block stored before it: NCCL's Simple protocol does
// the same (a barrier, then one thread's fence.acq_rel.sys and the step store), so one fence per part and
// message, not one per thread. Then each stores its part's head.
static __device__ __forceinline__ void mesh_block_publish(mesh_bulk* ch) {
    const bool host = ch->placement == MESH_PLACEMENT_HOST;
    __syncthreads();
    const uint32_t r = mesh_block_rank();
    if (r < ch->count) {
        const uint64_t flag = ch->mine + 1u;
        if (host) mesh_detail_st_release_u64(mesh_detail_bulk_flag(ch, ch->mine, r), flag);
        else mesh_detail_st_release_gpu_u64(mesh_detail_bulk_flag(ch, ch->mine, r), flag);
        mesh_detail_st_volatile_u64(mesh_detail_bulk_head_line(ch, r), flag);
    }
    ch->mine += 1u;
}

static __device__ __forceinline__ bool mesh_block_try_send(mesh_bulk* ch, const void* msg) {
    void* slot = mesh_block_reserve(ch);
    if (slot == 0) return false;
    mesh_detail_block_copy((uint4*)slot, (const uint4*)msg, ch->msg_size / 16u);
    mesh_block_publish(ch);
    return true;
}

// The first warp's lanes load the flags of up to MESH_BULK_LOOKAHEAD messages (lane r: message mine +
// r / count, part r % count) with acquire semantics; the messages found whole in a row are remembered
// (`other`), and the peeks that follow return them with no load and no barrier: the acquires and the
// barrier after them already order every thread's reads of those slots after the producer's stores.
static __device__ __forceinline__ const void* mesh_block_peek(mesh_bulk* ch) {
    if (ch->msg_size == 0 || ch->producer) return 0;
    if ((int64_t)(ch->other - ch->mine) > 0) return (const void*)mesh_detail_bulk_slot(ch, ch->mine);
    const uint32_t r = mesh_block_rank(), threads = mesh_block_threads();
    const uint32_t lanes_n = threads < 32u ? threads : 32u;  // the voters: a thread a flag
    uint32_t ahead = MESH_BULK_LOOKAHEAD < lanes_n / ch->count ? MESH_BULK_LOOKAHEAD : lanes_n / ch->count;
    if (ahead > ch->mask + 1u) ahead = ch->mask + 1u;
    uint64_t whole = 0;
    if (r < 32u) {
        bool missing = false;
        if (r < ch->count * ahead) {
            const uint64_t m = ch->mine + r / ch->count;
            missing = mesh_detail_bulk_ld_flag(ch, mesh_detail_bulk_flag(ch, m, r % ch->count)) != m + 1u;
        }
        const uint32_t lanes = threads >= 32u ? 0xffffffffu : (1u << threads) - 1u;
        const uint32_t gaps = __ballot_sync(lanes, missing);
        // Whole messages in a row: those before the first with a part missing.
        whole = gaps == 0u ? ahead : ((uint32_t)__ffs((int)gaps) - 1u) / ch->count;
    }
    whole = mesh_detail_block_bcast(whole);
    ch->other = ch->mine + whole;
    return whole ? (const void*)mesh_detail_bulk_slot(ch, ch->mine) : (const void*)0;
}

static __device__ __forceinline__ uint32_t mesh_block_reserve_n(mesh_bulk* ch, uint32_t n) {
    if (n > MESH_BULK_SEND_MAX) n = MESH_BULK_SEND_MAX;
    const uint32_t room = mesh_detail_bulk_room_for(ch, n);
    return room < n ? room : n;
}

static __device__ __forceinline__ void* mesh_block_reserved(const mesh_bulk* ch, uint32_t k) {
    return (void*)mesh_detail_bulk_slot(ch, ch->mine + k);
}

// ONE block barrier and, per part, ONE fence and a relaxed flag store per message (a release pattern
// each), where n calls of mesh_block_publish pay n barriers and n release stores; then each part's head.
static __device__ __forceinline__ void mesh_block_publish_n(mesh_bulk* ch, uint32_t n) {
    if (n == 0) return;
    __syncthreads();
    const uint32_t r = mesh_block_rank();
    if (r < ch->count) {
        const bool host = ch->placement == MESH_PLACEMENT_HOST;
        if (host) mesh_detail_fence_acq_rel_sys();
        else mesh_detail_fence_acq_rel_gpu();
        for (uint32_t k = 0; k < n; k++) {
            const uint64_t flag = ch->mine + k + 1u;
            if (host) mesh_detail_st_relaxed_sys_u64(mesh_detail_bulk_flag(ch, ch->mine + k, r), flag);
            else mesh_detail_st_relaxed_gpu_u64(mesh_detail_bulk_flag(ch, ch->mine + k, r), flag);
        }
        mesh_detail_st_volatile_u64(mesh_detail_bulk_head_line(ch, r), ch->mine + n);
    }
    ch->mine += n;
}

static __device__ __forceinline__ uint32_t mesh_block_try_send_n(mesh_bulk* ch, const void* const* msgs, uint32_t n) {
    n = mesh_block_reserve_n(ch, n);
    for (uint32_t k = 0; k < n; k++)
        mesh_detail_block_copy((uint4*)mesh_block_reserved(ch, k), (const uint4*)msgs[k], ch->msg_size / 16u);
    mesh_block_publish_n(ch, n);
    return n;
}

// The block synchronises (every thread's reads are done) and each of threads 0 .. count - 1 publishes
// one part's tail with a relaxed store, no fence. A release there would wait until every store the block
// made before it had reached memory, and on the copy path those are the whole share copied out. The
// tail orders only the block's *loads* of the slot, and those are done: each copied value was stored (a
// store cannot issue before the load it stores has returned), and in-place readers are past the
// barrier. NCCL's Simple protocol posts a receiver's step the same way (`postPeer`: a barrier, then
// `st_relaxed_sys_global`, with `fence_acq_rel_sys` only on the sender's side). The producer's room
// check acquires the tail, and its next stores into the slot come after that.
static __device__ __forceinline__ void mesh_block_release_n(mesh_bulk* ch, uint32_t n) {
    __syncthreads();
    ch->mine += n;
    if (mesh_block_rank() < ch->count) mesh_detail_st_relaxed_sys_u64(mesh_detail_bulk_tail_line(ch, mesh_block_rank()), ch->mine);
}
static __device__ __forceinline__ void mesh_block_release(mesh_bulk* ch) {
    mesh_block_release_n(ch, 1u);
}

static __device__ __forceinline__ uint32_t mesh_block_peek_n(mesh_bulk* ch, uint32_t n) {
    if (n == 0 || mesh_block_peek(ch) == 0) return 0;
    if (n > MESH_BULK_SEND_MAX) n = MESH_BULK_SEND_MAX;
    const uint64_t known = ch->other - ch->mine;
    return known < n ? (uint32_t)known : n;
}

static __device__ __forceinline__ const void* mesh_block_peeked(const mesh_bulk* ch, uint32_t k) {
    return (const void*)mesh_detail_bulk_slot(ch, ch->mine + k);
}

static __device__ __forceinline__ bool mesh_block_try_recv(mesh_bulk* ch, void* out) {
    const void* msg = mesh_block_peek(ch);
    if (msg == 0) return false;
    mesh_detail_block_copy((uint4*)out, (const uint4*)msg, ch->msg_size / 16u);
    mesh_block_release(ch);
    return true;
}

static __device__ __forceinline__ uint32_t mesh_block_try_recv_n(mesh_bulk* ch, void* const* outs, uint32_t n) {
    n = mesh_block_peek_n(ch, n);
    if (n == 0) return 0;
    for (uint32_t k = 0; k < n; k++)
        mesh_detail_block_copy((uint4*)outs[k], (const uint4*)mesh_block_peeked(ch, k), ch->msg_size / 16u);
    mesh_block_release_n(ch, n);
    return n;
}

static __device__ __forceinline__ bool mesh_block_send(mesh_ctx& c, mesh_bulk* ch, const void* msg) {
    if (ch->msg_size == 0 || !ch->producer) return false;
    while (!mesh_block_try_send(ch, msg))
        if (mesh_block_should_stop(c)) return false;
    return true;
}

static __device__ __forceinline__ bool mesh_block_recv(mesh_ctx& c, mesh_bulk* ch, void* out) {
    if (ch->msg_size == 0 || ch->producer) return false;
    while (!mesh_block_try_recv(ch, out))
        if (mesh_block_should_stop(c)) return false;
    return true;
}
