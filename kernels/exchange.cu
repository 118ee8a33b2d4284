// gp2p exchange kernels: the two-rank exchange in 8-byte lines through mapped pinned host
// memory, one kernel per rank, for small all-reduces (the idea of NCCL's LL protocol). Each
// rank writes its buffer (`src`) into its own lines and reads the peer's: an 8-byte line
// holds 4 bytes of data and the call's sequence number, so a reader knows a line has arrived
// when the number matches, with no separate flag, fence or DMA engine on the critical path.
// Then dst = op(own, peer), the order in which the ring's two-rank exchange folds (own first
// on both ranks): in place where `dst` is `src`; out of place, a server's custom all-reduce,
// which returns a new tensor, needs no copy of its input first.
//
// The sequence number is the kernel's `seq`, or, where `seq_counter` is given, the next one
// after the count in device memory there, which the kernel stores back: then the call needs
// no host work to be numbered, so a CUDA graph that captured it can be replayed (one block
// only: every thread reads the count before thread 0 stores it). The call's lines are
// `out_lines` and `in_lines` plus `half_stride` bytes for odd numbers: calls alternate halves.
//
// A thread owns 16-byte groups of the buffer (grid-stride): it publishes all of them (two
// 16-byte stores of two lines each per group), then polls the peer's same groups. The lines
// lie in two planes: group g's first two lines at 16 g bytes into the first, its last two at
// 16 g bytes into the second, which starts 16 bytes per group on. So a warp's stores and
// loads cover 512 contiguous bytes of host memory; with a group's four lines side by side
// they covered every other 16 bytes of 1 KiB, and a call took 17-28 % longer (64 B-2 KiB,
// both ranks on one H200: benches/results/small-exchange-llp-h200.txt at 7774b2d). Every
// thread publishes before it waits, so the two kernels cannot wait on each other. A thread
// gives up `timeout_ns` after its first wait began (a peer that never arrives): it sets
// `*failed` (and `*broken`, where given) and returns, leaving the buffer partly folded, for
// the host to report. Where `broken` is given, a thread that finds it set while it waits
// returns (it looks every GIVE_UP_CHECK_POLLS polls): another wait of the communicator gave
// up, and the peer may never come.
//
// Built by `cargo xtask ptx` with NVRTC 12.0 for compute_80 (exchange.ptx) and compute_75
// (exchange.compute_75.ptx); the ops, the clock and the sequence numbers are in common.cuh.

#include "common.cuh"

// Groups a thread loads before it checks any (see exchange). The lines' stores and loads,
// and the wait for lines not there yet, are in common.cuh (exchange_many.cu uses them too).
#define EXCHANGE_BATCH 4

template <typename T, typename Op>
__device__ __forceinline__ void exchange(const T* src, T* dst, u64 n, u64* out_lines, const u64* in_lines, u32 seq,
                                         u32 divisor, u64 timeout_ns, u32* failed, u32* seq_counter,
                                         u64 half_stride, u32* broken) {
    if (seq_counter != 0) {
        seq = next_seq(*(volatile u32*)seq_counter);
        __syncthreads();
        if (threadIdx.x == 0) *(volatile u32*)seq_counter = seq;
    }
    if (seq & 1) {
        out_lines += half_stride / sizeof(u64);
        in_lines += half_stride / sizeof(u64);
    }
    const int PER = VEC_BYTES / sizeof(T);
    const u64 groups = (n + PER - 1) / PER;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tag = ((u64)seq) << 32;
    const u64 mine = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // The two planes of lines, two u64 lines per group in each.
    u64* const out_plane[2] = {out_lines, out_lines + 2 * groups};
    const u64* const in_plane[2] = {in_lines, in_lines + 2 * groups};
    // Publish every group first, then wait: all of a rank's stores are on their way before
    // any poll, so the peer's polls mostly find data the first time, and a thread's later
    // groups never wait for the round trip of its earlier ones.
    for (u64 g = mine; g < groups; g += stride) {
        Group16<T> own;
        own.v = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int l = 0; l < PER; ++l) {
            if (g * PER + l < n) own.e[l] = src[g * PER + l];
        }
        store_lines(out_plane[0] + 2 * g, tag | own.w[0], tag | own.w[1]);
        store_lines(out_plane[1] + 2 * g, tag | own.w[2], tag | own.w[3]);
    }
    // Then fold, EXCHANGE_BATCH groups at a time: their loads go out together, so data
    // that has arrived costs one round trip across PCIe per batch, not one per group. A
    // group whose lines are not there yet is polled alone, a little apart (each poll is a
    // read across the link, and many threads polling at once, as with 16 blocks, slow the
    // writes they wait for).
    u64 deadline = 0;
    u32 polls = 0;
    for (u64 g0 = mine; g0 < groups; g0 += EXCHANGE_BATCH * stride) {
        u64 lines[EXCHANGE_BATCH][4];
#pragma unroll
        for (int k = 0; k < EXCHANGE_BATCH; ++k) {
            const u64 g = g0 + k * stride;
            if (g < groups) {
                load_lines(in_plane[0] + 2 * g, lines[k][0], lines[k][1]);
                load_lines(in_plane[1] + 2 * g, lines[k][2], lines[k][3]);
            }
        }
#pragma unroll
        for (int k = 0; k < EXCHANGE_BATCH; ++k) {
            const u64 g = g0 + k * stride;
            if (g >= groups) break;
            for (int plane = 0; plane < 2; ++plane) {
                if (!await_lines(in_plane[plane] + 2 * g, lines[k][2 * plane], lines[k][2 * plane + 1], seq, deadline,
                                 polls, timeout_ns, failed, broken))
                    return;
            }
            Group16<T> peer;
#pragma unroll
            for (int w = 0; w < 4; ++w) peer.w[w] = (u32)lines[k][w];
            // This thread's own group is still in src (in place, src is dst): only this
            // thread writes it, below.
            const u64 first = g * PER;
#pragma unroll
            for (int l = 0; l < PER; ++l) {
                if (first + l < n) dst[first + l] = combine<T, Op>(src[first + l], peer.e[l], divisor);
            }
        }
    }
}

// Up to 512 threads a block (past 4 KiB: gp2p_cuda's exchange_launch_config), at one block per
// multiprocessor, so the compiler keeps the 66-76 registers a batch of loads takes (every op
// and dtype, none spilled: benches/results/h200/exchange-registers.txt): bounds of 512 alone
// made it spill to fit two blocks (git show 29a67de:benches/results/exchange-registers-h200.txt).
#define GP2P_EXCHANGE(opname, Op, tname, T)                                                  \
    extern "C" __global__ void __launch_bounds__(512, 1) gp2p_exchange_##opname##_##tname(   \
        const T* src, T* dst, u64 n, u64* out_lines, const u64* in_lines, u32 seq,           \
        u32 divisor, u64 timeout_ns, u32* failed, u32* seq_counter, u64 half_stride,         \
        u32* broken) {                                                                       \
        exchange<T, Op>(src, dst, n, out_lines, in_lines, seq, divisor, timeout_ns, failed,       \
                        seq_counter, half_stride, broken);                                   \
    }

#define GP2P_EXCHANGE_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_EXCHANGE, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_EXCHANGE_ALL_OPS)
