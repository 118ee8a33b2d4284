// gp2p many-rank chunk kernels. Among 3 to 8 ranks: the two-shot all-reduce in one kernel per
// rank, through flagged chunks of mapped pinned host memory as chunks.cu's two-rank kernels
// use them (the same chunk size, flags, numbering, halves and bounded waits). Chunk c is
// folded by rank c % world, its owner, which waits for every rank's flag of the chunk, folds
// all of them in rank order, acc = op(...op(x0, x1)..., x(world-1)) (its own from `src`; avg
// divides at the last step), writes the result to `dst` and to its reduced area (slot c /
// world) and flags that; every other rank stores the chunk into its data area and flags it,
// waits for the owner's reduced flag and copies the folded chunk into `dst`. So each rank
// sends the chunks others fold and its share of the result once, and reads its share of every
// rank's chunks and the rest of the result once: the rounds' bytes, with no host work between
// the phases, and every rank's result the owner's bits.
//
// The unit of work is a warp, not a block: warp w of the grid's W takes chunks w, w + W, ...
// It first stores every one of them that others fold and flags each (a chunk it owns gets its
// flag only: peers see from a rank's first chunk's flag that its call began), then takes them
// in turn: it waits (an owner's lanes poll one peer's flag each, at once, and the warp's
// barrier passes on what they saw), then folds (two 16-byte groups of each rank a lane at a
// time) or copies (four), eight groups a lane in all. No warp waits on another, so a block
// keeps as many chunks' waits and reads in flight as it has warps, and no store waits on a
// fold. (Until 2026-12-07 a block split into a storing and a folding team as the two-rank
// kernel does, one chunk in flight per block and the stores at most four chunks ahead of the
// fold: about 40 us a block's chunk among 4 processes on one H200 and 90 among 8,
// benches/results/h200/many-chunks.txt.)
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
// peer sets only after its kernel of the call before ended; a call of the line kernel between
// (the counter numbers both) waits for every peer's lines likewise. Waits are bounded and end
// on `broken` as chunks.cu's are: one on a peer's data takes that peer's first flag as the
// sign it began; one on a folded chunk only the longer bound, as its owner waits on every
// rank. A warp whose wait gave up takes no more chunks.
//
// Built by `cargo xtask ptx` with NVRTC 12.0 for compute_80 (chunks_many.ptx) and compute_75
// (chunks_many.compute_75.ptx), apart from the two-rank kernels so that each family's PTX
// stays small.

#include "chunks.cuh"

#define CHUNKS_MANY_MAX_WORLD 8
#define WARP_THREADS 32
#define ALL_LANES 0xffffffffu
// The 16-byte groups of one rank an owner's lane folds at a time, its loads in flight
// together: more spill under the 64-register bound.
#define CHUNKS_MANY_FOLD_UNROLL 2

template <typename T, typename Op>
__device__ __forceinline__ void chunks_many(const T* src, T* dst, u64 n, char* areas, u64 area_stride, u32 rank, u32 world,
                                            u32 divisor, u64 timeout_ns, u64 queue_timeout_ns, u32* failed,
                                            u32* seq_counter, u64 half_stride, u64 area_chunks, u32* broken) {
    const u32 seq = next_seq(*(volatile u32*)seq_counter);
    if (seq & 1) areas += half_stride;
    const int PER = VEC_BYTES / sizeof(T);
    const u64 FLAG_WORDS = CHUNK_FLAG_STRIDE / sizeof(u32);
    const u64 per_chunk = CHUNK_BYTES / VEC_BYTES;
    const u64 groups = (n + PER - 1) / PER;
    const u64 chunks = (groups + per_chunk - 1) / per_chunk;
    const u32 lane = threadIdx.x % WARP_THREADS;
    const u64 warps = (u64)gridDim.x * (blockDim.x / WARP_THREADS);
    const u64 warp = (u64)blockIdx.x * (blockDim.x / WARP_THREADS) + threadIdx.x / WARP_THREADS;
    // The area's parts, as gp2p_kernels::chunks_many_area lays them out for `area_chunks`.
    const u64 reduced_offset = area_chunks * CHUNK_BYTES;
    const u64 flags_offset = reduced_offset + (area_chunks + world - 1) / max(world, 1u) * CHUNK_BYTES;
    const u64 reduced_flags_offset = flags_offset + area_chunks * CHUNK_FLAG_STRIDE;
    // Rank q's data, folded chunks and their flags.
    auto data = [&](u32 q) { return reinterpret_cast<uint4*>(areas + q * area_stride); };
    auto reduced = [&](u32 q) { return reinterpret_cast<uint4*>(areas + q * area_stride + reduced_offset); };
    auto flags = [&](u32 q) { return reinterpret_cast<u32*>(areas + q * area_stride + flags_offset); };
    auto reduced_flags = [&](u32 q) { return reinterpret_cast<u32*>(areas + q * area_stride + reduced_flags_offset); };
    // This rank's 16-byte group g of `src`, zero past `n`.
    auto own_group = [&](u64 g) {
        Group16<T> own;
        own.v = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int l = 0; l < PER; ++l) {
            if (g * PER + l < n) own.e[l] = src[g * PER + l];
        }
        return own;
    };
    auto store_dst = [&](u64 g, const Group16<T>& x) {
#pragma unroll
        for (int l = 0; l < PER; ++l) {
            if (g * PER + l < n) dst[g * PER + l] = x.e[l];
        }
    };
    const bool valid = world >= 3 && world <= CHUNKS_MANY_MAX_WORLD && rank < world && chunks >= world && chunks <= area_chunks;
    if (!valid) {
        // The host refuses such calls; a kernel launched with them anyway says so.
        if (blockIdx.x == 0 && threadIdx.x == 0) *(volatile u32*)failed = 1;
    } else if (warp < chunks) {
        // Every chunk of this warp's that others fold, into this rank's data area, each
        // flagged as soon as it is stored (a chunk this rank owns gets its flag only). The
        // warp's barrier orders its lanes' stores before lane 0's system fence, which
        // (cumulative) puts them all before the flag.
        for (u64 c = warp; c < chunks; c += warps) {
            if (c % world != rank) {
                const u64 end = min(groups, (c + 1) * per_chunk);
                for (u64 g = c * per_chunk + lane; g < end; g += WARP_THREADS) data(rank)[g] = own_group(g).v;
            }
            __syncwarp();
            if (lane == 0) {
                __threadfence_system();
                *(volatile u32*)(flags(rank) + c * FLAG_WORDS) = seq;
            }
        }
        for (u64 c = warp; c < chunks; c += warps) {
            const u32 owner = (u32)(c % world);
            const u64 slot = c / world;
            const u64 first = c * per_chunk;
            const u64 end = min(groups, first + per_chunk);
            bool arrived = true;
            if (owner == rank) {
                if (lane < world && lane != rank)
                    arrived = await_flag(flags(lane) + c * FLAG_WORDS, flags(lane), seq, timeout_ns, queue_timeout_ns,
                                         failed, broken);
            } else if (lane == 0) {
                // The owner's flag waits on every rank, the slowest included: only the longer
                // bound applies (the flag itself as "first seen").
                const u32* folded_flag = reduced_flags(owner) + slot * FLAG_WORDS;
                arrived = await_flag(folded_flag, folded_flag, seq, timeout_ns, queue_timeout_ns, failed, broken);
            }
            const bool live = __all_sync(ALL_LANES, arrived);
            // What a lane's acquire load made visible, every lane's loads below see.
            __syncwarp();
            if (!live) break;
            if (owner == rank) {
                uint4* const folded = reduced(rank) + slot * per_chunk;
                for (u64 g0 = first + lane; g0 < end; g0 += CHUNKS_MANY_FOLD_UNROLL * WARP_THREADS) {
                    Group16<T> acc[CHUNKS_MANY_FOLD_UNROLL];
                    // Rank by rank, each rank's CHUNKS_MANY_FOLD_UNROLL loads in flight together.
                    for (u32 q = 0; q < world; ++q) {
                        Group16<T> x[CHUNKS_MANY_FOLD_UNROLL];
#pragma unroll
                        for (int k = 0; k < CHUNKS_MANY_FOLD_UNROLL; ++k) {
                            const u64 g = g0 + k * WARP_THREADS;
                            x[k].v = make_uint4(0, 0, 0, 0);
                            if (g < end) x[k] = q == rank ? own_group(g) : Group16<T>{load_volatile16(data(q) + g)};
                        }
#pragma unroll
                        for (int k = 0; k < CHUNKS_MANY_FOLD_UNROLL; ++k) {
                            if (q == 0) {
                                acc[k] = x[k];
                            } else {
                                combine_group<T, Op>(acc[k], x[k], q + 1 == world ? divisor : 1);
                            }
                        }
                    }
#pragma unroll
                    for (int k = 0; k < CHUNKS_MANY_FOLD_UNROLL; ++k) {
                        const u64 g = g0 + k * WARP_THREADS;
                        if (g >= end) break;
                        store_dst(g, acc[k]);
                        folded[g - first] = acc[k].v;
                    }
                }
                __syncwarp();
                if (lane == 0) {
                    __threadfence_system();
                    *(volatile u32*)(reduced_flags(rank) + slot * FLAG_WORDS) = seq;
                }
            } else {
                const uint4* const folded = reduced(owner) + slot * per_chunk;
                for (u64 g0 = first + lane; g0 < end; g0 += CHUNK_FOLD_UNROLL * WARP_THREADS) {
                    Group16<T> got[CHUNK_FOLD_UNROLL];
#pragma unroll
                    for (int k = 0; k < CHUNK_FOLD_UNROLL; ++k) {
                        const u64 g = g0 + k * WARP_THREADS;
                        if (g < end) got[k].v = load_volatile16(folded + (g - first));
                    }
#pragma unroll
                    for (int k = 0; k < CHUNK_FOLD_UNROLL; ++k) {
                        const u64 g = g0 + k * WARP_THREADS;
                        if (g < end) store_dst(g, got[k]);
                    }
                }
            }
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
