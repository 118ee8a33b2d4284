// gp2p chunk kernels: the two-rank all-reduce through mapped pinned host memory in flagged
// chunks, one kernel per rank, for messages up to a few MiB (the one-process-per-GPU
// communicator's and, between two devices of one process, gp2p-pinned's ChunkExchange). The
// buffer is cut into CHUNK_BYTES chunks, dealt to the blocks grid-stride, and each block
// splits into two teams of threads. The storing team stores each of the block's chunks into
// this rank's data area as it is, and once the team has passed its barrier its thread 0
// fences the team's stores to the system and writes the call's sequence number into the
// chunk's flag. The folding team follows chunk by chunk: it waits on a named barrier the
// storing team arrives at (bar.arrive, no wait) once it read the chunk (the fold overwrites
// it in place), its thread 0 polls the peer's flag, and once it read the number the team
// reads the peer's chunk and folds dst = op(own, peer) (own first on both ranks, as the
// line exchange folds; own is `src`, which is `dst` in place). Storing one chunk overlaps reading the one before, so both
// directions of the bus carry data at once. The handoff barriers are CHUNK_HANDOFF_DEPTH
// deep: before reusing one, the storing team waits on a second barrier that the folding
// team arrives at once it folded the chunk that last used it, so neither team arrives twice
// at a barrier before the other. (Until 2026-12-01 the folding team polled the chunk's own
// flag in host memory, as a shared count between teams is a race to compute-sanitizer's
// racecheck, which knows only barriers: one H200 with both ranks on it,
// benches/probes/small_exchange.py, the barriers against the host flag: 8 KiB 7.3 against
// 9.3 us, 64 KiB 11.7 against 14.3, as fast as the shared count.)
//
// Two H200s, one kernel per rank per call, f32 (benches/probes/small_exchange.py, `flagws`
// against `flagacq`, which is one team doing both in turn; 4 KiB chunks, 264 blocks of 512
// threads): 64 KiB 10.2 us against 10.4, 1 MiB 47.7 against 47.9, 4 MiB 150 against 172,
// 16 MiB 521 against 700. Against the line exchange (an 8-byte line per 4 data bytes, every
// thread polling), this moves half the bytes and polls with one thread per chunk: 8 KiB 8.3
// us against 20, 64 KiB 11.5 against 71; but 7.7 against 6.0 at 64 bytes (the fence), so the
// communicator keeps the lines up to 2 KiB.
//
// Numbering: every thread reads the count in `seq_counter[0]`; the call's number is the next
// one (next_seq), and the last block to finish (a ticket in `seq_counter[1]`) stores it back
// and resets the ticket, so the next kernel on the stream, which starts after this one ended,
// reads it: no host work numbers a call, and a captured graph's replays are numbered. Odd
// numbers use the areas `half_stride` bytes on; the flags lie `flags_offset` bytes after
// their data area's start, a word every CHUNK_FLAG_STRIDE bytes. Calls alternate halves, and
// a rank starts call k + 2 only after the peer's flags of call k + 1, which the peer sets
// after it finished reading call k: a half is rewritten only once the peer read it. (Not
// after a wait gave up: later calls may then rewrite a half the peer is still reading. With
// a shared `broken` word, set when a wait gives up, the next calls return at once and the
// communicator refuses every call once it is set; without one (ChunkExchange), the next
// call's host side reports the timeout.)
//
// A wait gives up `timeout_ns` after the peer's first flag of the call was seen, or
// `queue_timeout_ns` after it began (a peer still behind queued work), or once `broken` is
// set (read every GIVE_UP_CHECK_POLLS polls); the block then stops folding, and the ticket
// is still taken so the count stays right.
//
// Built by `cargo xtask ptx` with NVRTC 12.0 for compute_80 (chunks.ptx) and compute_75
// (chunks.compute_75.ptx); the ops, the clock and the sequence numbers are in common.cuh.

#include "common.cuh"

#define CHUNK_BYTES 4096
#define CHUNK_FLAG_STRIDE 64
#define CHUNK_POLL_GAP_NS 64
#define CHUNK_POLL_GAP_MAX_NS 2048

// The pause after a chunk poll that found nothing, `polls` polls into a wait: 64 ns, doubling
// every 16 polls up to 2 us. Every waiting block polls across the bus, and a rank that starts
// well ahead of its peer (two processes) would otherwise keep a read per block in flight the
// whole time. (Added against the two-mode timing seen between processes, which it did not
// cure: see CommOptions::small_max_bytes.)
__device__ __forceinline__ u32 chunk_poll_gap(u32 polls) {
    const u32 doublings = min(polls / 16, 5u);
    return min(CHUNK_POLL_GAP_NS << doublings, CHUNK_POLL_GAP_MAX_NS);
}

__device__ __forceinline__ uint4 load_volatile16(const uint4* at) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(at)
                 : "memory");
    return v;
}

// A system-scope acquire load: the peer's data stores, fenced before its flag store on the
// other GPU, are visible to whatever this block reads after seeing the flag (thread 0 loads,
// the block's barrier passes it on to the other threads).
__device__ __forceinline__ u32 load_acquire_sys(const u32* at) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
    return v;
}

// Thread 0's bounded wait for the peer's flag of a chunk: whether it arrived. Two bounds: the
// wait gives up `timeout_ns` after the peer was first seen in this call (its first chunk's
// flag, `first_flag`, looked at every GIVE_UP_CHECK_POLLS polls), or `queue_timeout_ns` after
// the wait began whether or not it was: a peer still behind queued work is given the longer
// bound, a peer that began the call and stopped the shorter one.
__device__ __forceinline__ bool await_flag(const u32* flag, const u32* first_flag, u32 seq, u64 timeout_ns,
                                           u64 queue_timeout_ns, u32* failed, u32* broken) {
    u64 deadline = 0;
    u64 queue_deadline = 0;
    u32 polls = 0;
    while (load_acquire_sys(flag) != seq) {
        const u64 now = global_ns();
        if (++polls % GIVE_UP_CHECK_POLLS == 0) {
            if (broken != 0 && *(volatile u32*)broken != 0) return false;
            if (deadline == 0 && *(const volatile u32*)first_flag == seq) deadline = now + timeout_ns;
        }
        if (queue_deadline == 0) {
            queue_deadline = now + queue_timeout_ns;
        } else if (now > queue_deadline || (deadline != 0 && now > deadline)) {
            *(volatile u32*)failed = 1;
            if (broken != 0) *(volatile u32*)broken = 1;
            return false;
        }
        __nanosleep(chunk_poll_gap(polls));
    }
    return true;
}

// Wait at named barrier `id` of `threads` threads (a multiple of 32): one team's own barrier,
// or, with the whole block counted, the handoff barriers one team arrives at and the other
// syncs on. `id` > 0, so it is not __syncthreads' barrier 0.
__device__ __forceinline__ void team_barrier(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

#define STORE_TEAM_BARRIER 1
#define FOLD_TEAM_BARRIER 2
// The teams' handoff: the storing team arrives at CHUNK_READ_BARRIER(i) once it read its
// i-th chunk, the folding team at CHUNK_FOLDED_BARRIER(i) once it folded it (only when the
// storing team will reuse that barrier, at chunk i + CHUNK_HANDOFF_DEPTH). Both count the
// whole block: one team arrives, the other syncs. Barriers 3 to 10 of the 16.
#define CHUNK_HANDOFF_DEPTH 4
#define CHUNK_READ_BARRIER(i) (3 + (i) % CHUNK_HANDOFF_DEPTH)
#define CHUNK_FOLDED_BARRIER(i) (3 + CHUNK_HANDOFF_DEPTH + (i) % CHUNK_HANDOFF_DEPTH)

// Arrive at named barrier `id` of `threads` threads without waiting for it (the other
// threads counted sync on it).
__device__ __forceinline__ void barrier_arrive(u32 id, u32 threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// 16-byte peer loads each folding thread keeps in flight: a load across the bus takes about
// a microsecond, and volatile loads are not moved past the stores that fold them in.
#define CHUNK_FOLD_UNROLL 4

// The storing team's work: each of the block's chunks (grid-stride; the i-th of them) of
// `src` into `out` as it is, then its flag set to `seq`, then the handoff to the folding team;
// a chunk c with c % skip_every == skip_at (none where skip_every is 0) gets its flag only.
// Before reusing a handoff barrier it waits for the folding team's, which comes once the fold
// of the chunk CHUNK_HANDOFF_DEPTH back ended: folded, or given up on a peer that did not come
// within its bounds. So every wait here ends, and the folding team's for this team's reads
// does too.
template <typename T>
__device__ __forceinline__ void store_chunks(const T* src, u64 n, uint4* out, u32* out_flags, u64 chunks, u32 team,
                                             u32 seq, u64 skip_every, u64 skip_at) {
    const int PER = VEC_BYTES / sizeof(T);
    const u64 FLAG_WORDS = CHUNK_FLAG_STRIDE / sizeof(u32);
    const u64 per_chunk = CHUNK_BYTES / VEC_BYTES;
    const u64 groups = (n + PER - 1) / PER;
    u32 i = 0;
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
        if (i >= CHUNK_HANDOFF_DEPTH) team_barrier(CHUNK_FOLDED_BARRIER(i), blockDim.x);
        const bool skip = skip_every != 0 && c % skip_every == skip_at;
        const u64 end = skip ? c * per_chunk : min(groups, (c + 1) * per_chunk);
        for (u64 g = c * per_chunk + threadIdx.x; g < end; g += team) {
            Group16<T> own;
            own.v = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int l = 0; l < PER; ++l) {
                if (g * PER + l < n) own.e[l] = src[g * PER + l];
            }
            out[g] = own.v;
        }
        // The barrier orders the team's stores before thread 0's system fence, which
        // (cumulative, as NCCL's flags rely on) puts them all before the flag. One fence
        // after the barrier, not one per thread before it: both ranks on one H200, the
        // library's kernel (tests/examples/exchange_one_device.rs, three rounds) took
        // 7.3-7.6 us against 8.5-8.8 at 8 KiB, 7.9 against 9.0-9.2 at 16 KiB, 11.7-11.8
        // against 12.4 at 64 KiB, but 26.8 against 26.3-26.6 at 256 KiB.
        team_barrier(STORE_TEAM_BARRIER, team);
        if (threadIdx.x == 0) {
            __threadfence_system();
            *(volatile u32*)(out_flags + c * FLAG_WORDS) = seq;
        }
        // This thread's loads of the chunk are done: the fold may overwrite it.
        barrier_arrive(CHUNK_READ_BARRIER(i), blockDim.x);
    }
}

// The end of a flagged-chunk call: the last block to finish stores the call's number `seq`
// in the counter's first word (every block has read it by then) and zeroes the count of
// finished blocks in its second.
__device__ __forceinline__ void store_call_count(u32* seq_counter, u32 seq) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(seq_counter + 1, 1) == gridDim.x - 1) {
            seq_counter[1] = 0;
            *(volatile u32*)seq_counter = seq;
            __threadfence();
        }
    }
}

template <typename T, typename Op>
__device__ __forceinline__ void exchange_chunks(const T* src, T* dst, u64 n, char* out_area, const char* in_area, u32 divisor,
                                                u64 timeout_ns, u64 queue_timeout_ns, u32* failed, u32* seq_counter,
                                                u64 half_stride, u64 flags_offset, u32* broken) {
    __shared__ bool arrived;
    const u32 seq = next_seq(*(volatile u32*)seq_counter);
    if (seq & 1) {
        out_area += half_stride;
        in_area += half_stride;
    }
    uint4* out_data = reinterpret_cast<uint4*>(out_area);
    const uint4* in_data = reinterpret_cast<const uint4*>(in_area);
    u32* out_flags = reinterpret_cast<u32*>(out_area + flags_offset);
    const u32* in_flags = reinterpret_cast<const u32*>(in_area + flags_offset);
    const int PER = VEC_BYTES / sizeof(T);
    const u64 FLAG_WORDS = CHUNK_FLAG_STRIDE / sizeof(u32);
    const u64 per_chunk = CHUNK_BYTES / VEC_BYTES;
    const u64 groups = (n + PER - 1) / PER;
    const u64 chunks = (groups + per_chunk - 1) / per_chunk;
    const u32 team = blockDim.x / 2;
    if (threadIdx.x < team) {
        store_chunks(src, n, out_data, out_flags, chunks, team, seq, 0, 0);
    } else {
        const u32 t = threadIdx.x - team;
        bool live = true;  // false once a wait gave up: the rest only keeps the handoff going
        u32 i = 0;
        for (u64 c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
            team_barrier(CHUNK_READ_BARRIER(i), blockDim.x);
            if (live) {
                if (t == 0) {
                    arrived = await_flag(in_flags + c * FLAG_WORDS, in_flags, seq, timeout_ns, queue_timeout_ns, failed,
                                         broken);
                }
                team_barrier(FOLD_TEAM_BARRIER, team);
                live = arrived;  // the same for the whole team: read after the barrier
                // Thread 0 sets `arrived` again only after every thread of the team read it.
                team_barrier(FOLD_TEAM_BARRIER, team);
            }
            if (live) {
                const u64 end = min(groups, (c + 1) * per_chunk);
                for (u64 g0 = c * per_chunk + t; g0 < end; g0 += CHUNK_FOLD_UNROLL * team) {
                    Group16<T> peer[CHUNK_FOLD_UNROLL];
#pragma unroll
                    for (int k = 0; k < CHUNK_FOLD_UNROLL; ++k) {
                        if (g0 + k * team < end) peer[k].v = load_volatile16(in_data + g0 + k * team);
                    }
#pragma unroll
                    for (int k = 0; k < CHUNK_FOLD_UNROLL; ++k) {
                        const u64 g = g0 + k * team;
                        if (g >= end) break;
#pragma unroll
                        for (int l = 0; l < PER; ++l) {
                            if (g * PER + l < n) dst[g * PER + l] = combine<T, Op>(src[g * PER + l], peer[k].e[l], divisor);
                        }
                    }
                }
            }
            if (c + (u64)CHUNK_HANDOFF_DEPTH * gridDim.x < chunks) barrier_arrive(CHUNK_FOLDED_BARRIER(i), blockDim.x);
        }
    }
    store_call_count(seq_counter, seq);
}

// Two blocks of 512 threads a multiprocessor (CHUNK_BLOCKS_PER_SM), so at most 64 registers
// a thread: every block of a launch must be resident at once, polling. Reading `src` and
// writing `dst` (out of place) took the avg kernels to 75-98 registers unbounded; bounded,
// ptxas 12.4 spills 8-38 bytes in a few avg kernels for sm_80 and sm_90, none elsewhere.
#define GP2P_CHUNKS(opname, Op, tname, T)                                                      \
    extern "C" __global__ void __launch_bounds__(512, 2) gp2p_chunks_##opname##_##tname(          \
        const T* src, T* dst, u64 n, char* out_area, const char* in_area, u32 divisor,         \
        u64 timeout_ns, u64 queue_timeout_ns, u32* failed, u32* seq_counter, u64 half_stride,  \
        u64 flags_offset, u32* broken) {                                                       \
        exchange_chunks<T, Op>(src, dst, n, out_area, in_area, divisor, timeout_ns, queue_timeout_ns, \
                               failed, seq_counter, half_stride, flags_offset, broken);        \
    }

#define GP2P_CHUNKS_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_CHUNKS, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_CHUNKS_ALL_OPS)

// Among 3 to 8 ranks: the two-shot all-reduce in one kernel per rank, through the same
// flagged chunks. Every rank stores each of its chunks into its own data area and flags it,
// as above; chunk c is folded by rank c % world, its owner, which waits for every rank's
// flag of the chunk, folds all of them in rank order, acc = op(...op(x0, x1)..., x(world-1))
// (its own from `src`; avg divides at the last step), writes the result to `dst` and to its
// reduced area (slot c / world) and flags that; every other rank waits for the owner's
// reduced flag and copies the folded chunk into `dst`. So each rank sends the chunks others
// fold and its share of the result once, and reads its share of every rank's chunks and the
// rest of the result once: the rounds' bytes, with no host work between the phases, and
// every rank's result the owner's bits.
//
// Rank q's area for a call starts `q * area_stride` bytes after `areas` (plus `half_stride`
// for odd numbers), with room for `area_chunks` chunks: the data's chunks first (a rank's own
// chunks left unwritten: it folds them from `src`), then the chunks it owns folded (one in
// `world`, rounded up), then the data's flags and the folded chunks' flags, a word every
// CHUNK_FLAG_STRIDE bytes (gp2p_kernels::chunks_many_area).
//
// A half is rewritten only once every peer read it: a rank's next call on it comes two calls
// later, and in the call between, each rank waits for every peer's flags of that call (each
// rank owns a chunk: `n` spans at least `world` chunks, which the host checks), which each
// peer sets only after its kernel of the call before ended; a call of the line kernel
// between (the counter numbers both) waits for every peer's lines likewise. Waits are
// bounded and end on `broken` as above: one on a peer's data takes that peer's first flag as
// the sign it began; one on a folded chunk only the longer bound, as its owner waits on
// every rank.
#define CHUNKS_MANY_MAX_WORLD 8

template <typename T, typename Op>
__device__ __forceinline__ void chunks_many(const T* src, T* dst, u64 n, char* areas, u64 area_stride, u32 rank, u32 world,
                                            u32 divisor, u64 timeout_ns, u64 queue_timeout_ns, u32* failed,
                                            u32* seq_counter, u64 half_stride, u64 area_chunks, u32* broken) {
    __shared__ bool arrived;
    const u32 seq = next_seq(*(volatile u32*)seq_counter);
    if (seq & 1) areas += half_stride;
    const int PER = VEC_BYTES / sizeof(T);
    const u64 FLAG_WORDS = CHUNK_FLAG_STRIDE / sizeof(u32);
    const u64 per_chunk = CHUNK_BYTES / VEC_BYTES;
    const u64 groups = (n + PER - 1) / PER;
    const u64 chunks = (groups + per_chunk - 1) / per_chunk;
    const u32 team = blockDim.x / 2;
    // The area's parts, as gp2p_kernels::chunks_many_area lays them out for `area_chunks`.
    const u64 reduced_offset = area_chunks * CHUNK_BYTES;
    const u64 flags_offset = reduced_offset + (area_chunks + world - 1) / max(world, 1u) * CHUNK_BYTES;
    const u64 reduced_flags_offset = flags_offset + area_chunks * CHUNK_FLAG_STRIDE;
    // Rank q's data, folded chunks and their flags.
    auto data = [&](u32 q) { return reinterpret_cast<uint4*>(areas + q * area_stride); };
    auto reduced = [&](u32 q) { return reinterpret_cast<uint4*>(areas + q * area_stride + reduced_offset); };
    auto flags = [&](u32 q) { return reinterpret_cast<u32*>(areas + q * area_stride + flags_offset); };
    auto reduced_flags = [&](u32 q) { return reinterpret_cast<u32*>(areas + q * area_stride + reduced_flags_offset); };
    const bool valid = world >= 3 && world <= CHUNKS_MANY_MAX_WORLD && rank < world && chunks >= world && chunks <= area_chunks;
    if (!valid) {
        // The host refuses such calls; a kernel launched with them anyway says so.
        if (blockIdx.x == 0 && threadIdx.x == 0) *(volatile u32*)failed = 1;
    } else if (threadIdx.x < team) {
        // A chunk this rank owns is folded from `src`, so only its flag is stored (peers see
        // from its first chunk's that the call began).
        store_chunks(src, n, data(rank), flags(rank), chunks, team, seq, world, rank);
    } else {
        const u32 t = threadIdx.x - team;
        bool live = true;
        u32 i = 0;
        for (u64 c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
            team_barrier(CHUNK_READ_BARRIER(i), blockDim.x);
            const u32 owner = (u32)(c % world);
            const u64 slot = c / world;
            if (live) {
                if (t == 0) {
                    bool ok = true;
                    if (owner == rank) {
                        for (u32 q = 0; ok && q < world; ++q) {
                            if (q != rank)
                                ok = await_flag(flags(q) + c * FLAG_WORDS, flags(q), seq, timeout_ns, queue_timeout_ns,
                                                failed, broken);
                        }
                    } else {
                        // The owner's flag waits on every rank, the slowest included: only the
                        // longer bound applies (the flag itself as "first seen").
                        const u32* folded_flag = reduced_flags(owner) + slot * FLAG_WORDS;
                        ok = await_flag(folded_flag, folded_flag, seq, timeout_ns, queue_timeout_ns, failed, broken);
                    }
                    arrived = ok;
                }
                team_barrier(FOLD_TEAM_BARRIER, team);
                live = arrived;
                team_barrier(FOLD_TEAM_BARRIER, team);
            }
            if (live) {
                const u64 first = c * per_chunk;
                const u64 end = min(groups, first + per_chunk);
                if (owner == rank) {
                    uint4* const folded = reduced(rank) + slot * per_chunk;
                    for (u64 g = first + t; g < end; g += team) {
                        // Rank by rank, each load folded before the next is issued: the
                        // team's many threads keep the bus busy. Loading every peer first
                        // (514ac93) spilled 90-220 bytes a thread at 64 registers, grew the
                        // PTX by a quarter and changed only 1 MiB among 8 processes on one
                        // H200 (1026 against 1158-1261 us; benches/results/h200/many-chunks.txt).
                        Group16<T> acc;
                        acc.v = make_uint4(0, 0, 0, 0);
                        for (u32 q = 0; q < world; ++q) {
                            Group16<T> x;
                            if (q == rank) {
                                x.v = make_uint4(0, 0, 0, 0);
#pragma unroll
                                for (int l = 0; l < PER; ++l) {
                                    if (g * PER + l < n) x.e[l] = src[g * PER + l];
                                }
                            } else {
                                x.v = load_volatile16(data(q) + g);
                            }
                            if (q == 0) {
                                acc = x;
                            } else {
                                combine_group<T, Op>(acc, x, q + 1 == world ? divisor : 1);
                            }
                        }
#pragma unroll
                        for (int l = 0; l < PER; ++l) {
                            if (g * PER + l < n) dst[g * PER + l] = acc.e[l];
                        }
                        folded[g - first] = acc.v;
                    }
                    team_barrier(FOLD_TEAM_BARRIER, team);
                    if (t == 0) {
                        __threadfence_system();
                        *(volatile u32*)(reduced_flags(rank) + slot * FLAG_WORDS) = seq;
                    }
                } else {
                    const uint4* const folded = reduced(owner) + slot * per_chunk;
                    for (u64 g0 = first + t; g0 < end; g0 += CHUNK_FOLD_UNROLL * team) {
                        Group16<T> got[CHUNK_FOLD_UNROLL];
#pragma unroll
                        for (int k = 0; k < CHUNK_FOLD_UNROLL; ++k) {
                            if (g0 + k * team < end) got[k].v = load_volatile16(folded + (g0 + k * team - first));
                        }
#pragma unroll
                        for (int k = 0; k < CHUNK_FOLD_UNROLL; ++k) {
                            const u64 g = g0 + k * team;
                            if (g >= end) break;
#pragma unroll
                            for (int l = 0; l < PER; ++l) {
                                if (g * PER + l < n) dst[g * PER + l] = got[k].e[l];
                            }
                        }
                    }
                }
            }
            if (c + (u64)CHUNK_HANDOFF_DEPTH * gridDim.x < chunks) barrier_arrive(CHUNK_FOLDED_BARRIER(i), blockDim.x);
        }
    }
    store_call_count(seq_counter, seq);
}

#define GP2P_CHUNKS_MANY(opname, Op, tname, T)                                                       \
    extern "C" __global__ void __launch_bounds__(512, 2) gp2p_chunks_many_##opname##_##tname(           \
        const T* src, T* dst, u64 n, char* areas, u64 area_stride, u32 rank, u32 world, u32 divisor,  \
        u64 timeout_ns, u64 queue_timeout_ns, u32* failed, u32* seq_counter, u64 half_stride,          \
        u64 area_chunks, u32* broken) {                                                               \
        chunks_many<T, Op>(src, dst, n, areas, area_stride, rank, world, divisor, timeout_ns, queue_timeout_ns, \
                           failed, seq_counter, half_stride, area_chunks, broken);                   \
    }

#define GP2P_CHUNKS_MANY_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_CHUNKS_MANY, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_CHUNKS_MANY_ALL_OPS)
