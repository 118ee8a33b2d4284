// gp2p many-rank exchange kernels: the line exchange of exchange.cu for 2 to 8 ranks, one
// kernel per rank, for small all-reduces of the one-process-per-GPU communicator among more
// than two ranks. Its own family (and PTX module): a line of every rank is kept in registers,
// unrolled for 8, which takes more PTX than every other family together.
//
// Built by `cargo xtask ptx` with NVRTC 12.0 for compute_80 (exchange_many.ptx) and
// compute_75 (exchange_many.compute_75.ptx); the lines, the ops, the clock and the sequence
// numbers are in common.cuh.

#include "common.cuh"

// One-shot: every rank reads every other's lines. Rank r's lines start `r * area_stride` bytes
// after `lines`, rank 0's, in two planes as in exchange.cu, and calls alternate halves
// `half_stride` bytes apart. Every rank folds all of them in rank order,
// acc = op(...op(op(x0, x1), x2)..., x(world-1)), its own from `src`, into `dst` (`src`
// itself in place), so every rank computes the same bits; avg divides at the last step. Numbered from `seq_counter` only (one block).
// Per group, a thread loads every peer's lines before it checks any: one round trip across
// the link for data that has arrived, whatever the number of ranks.

#define EXCHANGE_MANY_MAX_WORLD 8

template <typename T, typename Op>
__device__ __forceinline__ void exchange_many(const T* src, T* dst, u64 n, u64* lines, u64 area_stride, u32 rank, u32 world,
                                              u32 divisor, u64 timeout_ns, u32* failed, u32* seq_counter,
                                              u64 half_stride, u32* broken) {
    if (world < 2 || world > EXCHANGE_MANY_MAX_WORLD || rank >= world) return;
    const u32 seq = next_seq(*(volatile u32*)seq_counter);
    __syncthreads();
    if (threadIdx.x == 0) *(volatile u32*)seq_counter = seq;
    if (seq & 1) lines += half_stride / sizeof(u64);
    const int PER = VEC_BYTES / sizeof(T);
    const u64 groups = (n + PER - 1) / PER;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tag = ((u64)seq) << 32;
    const u64 mine = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 area = area_stride / sizeof(u64);
    u64* const out = lines + rank * area;
    for (u64 g = mine; g < groups; g += stride) {
        Group16<T> own;
        own.v = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int l = 0; l < PER; ++l) {
            if (g * PER + l < n) own.e[l] = src[g * PER + l];
        }
        store_lines(out + 2 * g, tag | own.w[0], tag | own.w[1]);
        store_lines(out + 2 * groups + 2 * g, tag | own.w[2], tag | own.w[3]);
    }
    u64 deadline = 0;
    u32 polls = 0;
    for (u64 g = mine; g < groups; g += stride) {
        u64 got[EXCHANGE_MANY_MAX_WORLD][4];
#pragma unroll
        for (u32 q = 0; q < EXCHANGE_MANY_MAX_WORLD; ++q) {
            if (q < world && q != rank) {
                const u64* in = lines + q * area;
                load_lines(in + 2 * g, got[q][0], got[q][1]);
                load_lines(in + 2 * groups + 2 * g, got[q][2], got[q][3]);
            }
        }
        Group16<T> acc;
        acc.v = make_uint4(0, 0, 0, 0);
        const u64 first = g * PER;
#pragma unroll
        for (u32 q = 0; q < EXCHANGE_MANY_MAX_WORLD; ++q) {
            if (q >= world) break;
            Group16<T> x;
            if (q == rank) {
                x.v = make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int l = 0; l < PER; ++l) {
                    if (first + l < n) x.e[l] = src[first + l];
                }
            } else {
                const u64* in = lines + q * area;
                for (int plane = 0; plane < 2; ++plane) {
                    if (!await_lines(in + 2 * plane * groups + 2 * g, got[q][2 * plane], got[q][2 * plane + 1], seq,
                                     deadline, polls, timeout_ns, failed, broken))
                        return;
                }
#pragma unroll
                for (int w = 0; w < 4; ++w) x.w[w] = (u32)got[q][w];
            }
            if (q == 0) {
                acc = x;
            } else {
                const u32 d = q + 1 == world ? divisor : 1;
                combine_group<T, Op>(acc, x, d);
            }
        }
#pragma unroll
        for (int l = 0; l < PER; ++l) {
            if (first + l < n) dst[first + l] = acc.e[l];
        }
    }
}

#define GP2P_EXCHANGE_MANY(opname, Op, tname, T)                                                  \
    extern "C" __global__ void __launch_bounds__(512, 1) gp2p_exchange_many_##opname##_##tname(   \
        const T* src, T* dst, u64 n, u64* lines, u64 area_stride, u32 rank, u32 world,           \
        u32 divisor, u64 timeout_ns, u32* failed, u32* seq_counter, u64 half_stride,              \
        u32* broken) {                                                                            \
        exchange_many<T, Op>(src, dst, n, lines, area_stride, rank, world, divisor, timeout_ns, failed, \
                             seq_counter, half_stride, broken);                                   \
    }

#define GP2P_EXCHANGE_MANY_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_EXCHANGE_MANY, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_EXCHANGE_MANY_ALL_OPS)
