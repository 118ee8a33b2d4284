// gp2p reduce kernels: dst[i] = op(dst[i], src[i]) for every op x dtype.
//
// `src` is either device memory (the scratch path) or mapped pinned host memory that the
// kernel reads across PCIe (the zero-copy path); the kernel does not care which.
//
// Built by `cargo xtask ptx` with NVRTC 12.0 twice: for compute_80 (reduce.ptx) and for
// compute_75 (reduce.compute_75.ptx, Turing). No CUDA headers are used, so the PTX depends
// on this file alone: half goes through PTX `cvt` instructions (sm_53 and up), bfloat16
// through `cvt` where the hardware has it (sm_80 and up) and integer rounding below.
//
// Layout of the work: when dst and src share their offset modulo 16 bytes, the bulk moves
// as 16-byte vectors (`uint4`), UNROLL of them per thread per step so that enough loads are
// in flight to cover PCIe latency on the zero-copy path; the unaligned head and the short
// tail go element by element. When the offsets differ, everything goes element by element.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define VEC_BYTES 16
#define UNROLL 4

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

// Each storage type names its accumulation type and how to convert to and from it.
// Half types accumulate in f32 so one rounding happens per element, at the store.
template <typename T> struct Lane {
    typedef T Acc;
    static __device__ __forceinline__ Acc load(T v) { return v; }
    static __device__ __forceinline__ T store(Acc v) { return v; }
};
template <> struct Lane<f16> {
    typedef float Acc;
    static __device__ __forceinline__ float load(f16 v) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
        return f;
    }
    static __device__ __forceinline__ f16 store(float f) {
        f16 v;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v.bits) : "f"(f));
        return v;
    }
};
template <> struct Lane<bf16> {
    typedef float Acc;
    static __device__ __forceinline__ float load(bf16 v) {
        return __uint_as_float(((u32)v.bits) << 16);
    }
    static __device__ __forceinline__ bf16 store(float f) {
        bf16 v;
#if __CUDA_ARCH__ >= 800
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v.bits) : "f"(f));
#else
        // Round to nearest even in the integer domain (what cvt.rn does): add half an ulp of
        // bf16, plus one if the kept part is odd, then truncate. A NaN stays a (quiet) NaN
        // instead of rounding into infinity.
        const u32 x = __float_as_uint(f);
        if ((x & 0x7fffffffu) > 0x7f800000u) {
            v.bits = (u16)((x >> 16) | 0x40u);
        } else {
            v.bits = (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
        }
#endif
        return v;
    }
};

// Integer sums and products wrap (two's complement), computed in the unsigned type so the
// signed ones have no undefined overflow.
template <typename A> struct Wrap { typedef A U; };
template <> struct Wrap<i8> { typedef u8 U; };
template <> struct Wrap<i32> { typedef u32 U; };
template <> struct Wrap<i64> { typedef u64 U; };

template <typename A> __device__ __forceinline__ A add(A a, A b) {
    typedef typename Wrap<A>::U U;
    return (A)((U)a + (U)b);
}
template <> __device__ __forceinline__ float add<float>(float a, float b) { return a + b; }
template <> __device__ __forceinline__ double add<double>(double a, double b) { return a + b; }

template <typename A> __device__ __forceinline__ A mul(A a, A b) {
    typedef typename Wrap<A>::U U;
    return (A)((U)a * (U)b);
}
template <> __device__ __forceinline__ float mul<float>(float a, float b) { return a * b; }
template <> __device__ __forceinline__ double mul<double>(double a, double b) { return a * b; }

template <typename A> __device__ __forceinline__ A min_of(A a, A b) { return b < a ? b : a; }
template <> __device__ __forceinline__ float min_of<float>(float a, float b) { return fminf(a, b); }
template <> __device__ __forceinline__ double min_of<double>(double a, double b) { return fmin(a, b); }
template <typename A> __device__ __forceinline__ A max_of(A a, A b) { return a < b ? b : a; }
template <> __device__ __forceinline__ float max_of<float>(float a, float b) { return fmaxf(a, b); }
template <> __device__ __forceinline__ double max_of<double>(double a, double b) { return fmax(a, b); }

// avg is a sum whose last step divides by the number of ranks: floats multiply by the
// reciprocal, integers divide (truncating toward zero). `divisor` is 1 on every other step.
// Integers divide in a type wide enough for the divisor, so i8/u8 never see it overflow.
template <typename A> struct Wide { typedef i32 W; };
template <> struct Wide<u8> { typedef u32 W; };
template <> struct Wide<u32> { typedef u32 W; };
template <> struct Wide<i64> { typedef i64 W; };
template <> struct Wide<u64> { typedef u64 W; };
template <typename A> __device__ __forceinline__ A scale(A v, u32 divisor) {
    typedef typename Wide<A>::W W;
    return (A)((W)v / (W)divisor);
}
template <> __device__ __forceinline__ float scale<float>(float v, u32 divisor) {
    return v * (1.0f / (float)divisor);
}
template <> __device__ __forceinline__ double scale<double>(double v, u32 divisor) {
    return v * (1.0 / (double)divisor);
}

struct OpSum { template <typename A> static __device__ __forceinline__ A apply(A a, A b, u32) { return add(a, b); } };
struct OpAvg {
    template <typename A> static __device__ __forceinline__ A apply(A a, A b, u32 divisor) {
        A s = add(a, b);
        return divisor == 1 ? s : scale(s, divisor);
    }
};
struct OpMin { template <typename A> static __device__ __forceinline__ A apply(A a, A b, u32) { return min_of(a, b); } };
struct OpMax { template <typename A> static __device__ __forceinline__ A apply(A a, A b, u32) { return max_of(a, b); } };
struct OpProd { template <typename A> static __device__ __forceinline__ A apply(A a, A b, u32) { return mul(a, b); } };

template <typename T, typename Op>
__device__ __forceinline__ T combine(T d, T s, u32 divisor) {
    typedef Lane<T> L;
    return L::store(Op::apply(L::load(d), L::load(s), divisor));
}

template <typename T, typename Op>
__device__ __forceinline__ void reduce_scalar(T* dst, const T* src, u64 begin, u64 end, u32 divisor) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = begin + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < end; i += stride) {
        dst[i] = combine<T, Op>(dst[i], src[i], divisor);
    }
}

template <typename T, typename Op>
__device__ __forceinline__ void reduce_vec(uint4* dst, const uint4* src, u64 nvec, u32 divisor) {
    const int LANES = VEC_BYTES / sizeof(T);
    u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = tid;
    // Full steps: UNROLL vectors per thread, all loads issued before any arithmetic.
    for (; i + (UNROLL - 1) * stride < nvec; i += UNROLL * stride) {
        uint4 d[UNROLL], s[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            s[u] = src[i + u * stride];
            d[u] = dst[i + u * stride];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            T* dl = reinterpret_cast<T*>(&d[u]);
            const T* sl = reinterpret_cast<const T*>(&s[u]);
#pragma unroll
            for (int l = 0; l < LANES; ++l) dl[l] = combine<T, Op>(dl[l], sl[l], divisor);
            dst[i + u * stride] = d[u];
        }
    }
    for (; i < nvec; i += stride) {
        uint4 d = dst[i];
        uint4 s = src[i];
        T* dl = reinterpret_cast<T*>(&d);
        const T* sl = reinterpret_cast<const T*>(&s);
#pragma unroll
        for (int l = 0; l < LANES; ++l) dl[l] = combine<T, Op>(dl[l], sl[l], divisor);
        dst[i] = d;
    }
}

template <typename T, typename Op>
__device__ __forceinline__ void reduce(T* dst, const T* src, u64 n, u32 divisor) {
    const u64 dst_addr = (u64)dst;
    const u64 src_addr = (u64)src;
    if (((dst_addr ^ src_addr) & (VEC_BYTES - 1)) != 0) {
        reduce_scalar<T, Op>(dst, src, 0, n, divisor);
        return;
    }
    // Elements before the first 16-byte boundary, the vector body, then the tail.
    u64 head = ((VEC_BYTES - (dst_addr & (VEC_BYTES - 1))) & (VEC_BYTES - 1)) / sizeof(T);
    if (head > n) head = n;
    const u64 lanes = VEC_BYTES / sizeof(T);
    const u64 nvec = (n - head) / lanes;
    const u64 body_end = head + nvec * lanes;
    reduce_scalar<T, Op>(dst, src, 0, head, divisor);
    reduce_vec<T, Op>(reinterpret_cast<uint4*>(dst + head),
                      reinterpret_cast<const uint4*>(src + head), nvec, divisor);
    reduce_scalar<T, Op>(dst, src, body_end, n, divisor);
}

// Every op, as (name in kernel names, functor), applied to one dtype by X.
#define GP2P_FOR_EACH_OP(X, tname, T) \
    X(sum, OpSum, tname, T)           \
    X(avg, OpAvg, tname, T)           \
    X(min, OpMin, tname, T)           \
    X(max, OpMax, tname, T)           \
    X(prod, OpProd, tname, T)

// Every dtype the kernels are built for, as (name in kernel names, storage type): one list
// for each kernel family, in the order of gp2p_kernels::DType::ALL.
#define GP2P_FOR_EACH_DTYPE(X) \
    X(f32, float)              \
    X(f64, double)             \
    X(f16, f16)                \
    X(bf16, bf16)              \
    X(i8, i8)                  \
    X(u8, u8)                  \
    X(i32, i32)                \
    X(u32, u32)                \
    X(i64, i64)                \
    X(u64, u64)

#define GP2P_REDUCE(opname, Op, tname, T)                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                        \
    gp2p_reduce_##opname##_##tname(T* dst, const T* src, u64 n, u32 divisor) {               \
        reduce<T, Op>(dst, src, n, divisor);                                                 \
    }

#define GP2P_REDUCE_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_REDUCE, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_REDUCE_ALL_OPS)

// ---------------------------------------------------------------------------------------
// Two-rank exchange through mapped pinned host memory, one kernel per rank, for small
// all-reduces (the idea of NCCL's LL protocol). Each rank writes its buffer into its own
// lines and reads the peer's: an 8-byte line holds 4 bytes of data and the call's sequence
// number, so a reader knows a line has arrived when the number matches, with no separate
// flag, fence or DMA engine on the critical path. Then buf = op(own, peer) in place, the
// order in which the ring's two-rank exchange folds (own first on both ranks).
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
// both ranks on one H200: benches/results/small-exchange-llp-h200.txt). Every
// thread publishes before it waits, so the two kernels cannot wait on each other. A thread
// gives up `timeout_ns` after its first wait began (a peer that never arrives): it sets
// `*failed` (and `*broken`, where given) and returns, leaving the buffer partly folded, for
// the host to report. Where `broken` is given, a thread that finds it set while it waits
// returns (it looks every GIVE_UP_CHECK_POLLS polls): another wait of the communicator gave
// up, and the peer may never come.

// Groups a thread loads before it checks any (see exchange), and the pause between polls
// of a group whose lines have not arrived.
#define EXCHANGE_BATCH 4
#define EXCHANGE_POLL_GAP_NS 64

// A wait reads the shared give-up words (in host memory, a round trip across PCIe each) only
// every this many polls: read at every poll they doubled each poll's latency, and a 32 KiB
// all-reduce between processes took 82 us instead of 29 (two H200s). A lost peer is caught by
// each wait's own deadline, checked at every poll; the words only tell a wait that another
// one gave up, now a few tens of microseconds later (so after a failure each remaining wait of
// a pipeline costs that much, not one poll).
#define GIVE_UP_CHECK_POLLS 16

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void store_lines(u64* at, u64 a, u64 b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void load_lines(const u64* at, u64& a, u64& b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(at) : "memory");
}

template <typename T> union Group16 {
    uint4 v;
    u32 w[4];
    T e[VEC_BYTES / sizeof(T)];
};

// The next sequence number after `count`: never 0 (the tag of lines never written), and odd
// and even in turn (after 0xffffffff comes 2), as gp2p_kernels::next_exchange_seq counts.
__device__ __forceinline__ u32 next_seq(u32 count) {
    const u32 next = count + 1;
    return next == 0 ? 2 : next;
}

template <typename T, typename Op>
__device__ __forceinline__ void exchange(T* buf, u64 n, u64* out_lines, const u64* in_lines, u32 seq,
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
            if (g * PER + l < n) own.e[l] = buf[g * PER + l];
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
                u64& a = lines[k][2 * plane];
                u64& b = lines[k][2 * plane + 1];
                while ((u32)(a >> 32) != seq || (u32)(b >> 32) != seq) {
                    // Another wait of the communicator gave up: the peer's lines may never come.
                    if (broken != 0 && ++polls % GIVE_UP_CHECK_POLLS == 0 && *(volatile u32*)broken != 0) return;
                    const u64 now = global_ns();
                    if (deadline == 0) {
                        deadline = now + timeout_ns;
                    } else if (now > deadline) {
                        *(volatile u32*)failed = 1;
                        if (broken != 0) *(volatile u32*)broken = 1;
                        return;
                    }
                    __nanosleep(EXCHANGE_POLL_GAP_NS);
                    load_lines(in_plane[plane] + 2 * g, a, b);
                }
            }
            Group16<T> peer;
#pragma unroll
            for (int w = 0; w < 4; ++w) peer.w[w] = (u32)lines[k][w];
            // This thread's own group is still in buf: only this thread writes it, below.
            const u64 first = g * PER;
#pragma unroll
            for (int l = 0; l < PER; ++l) {
                if (first + l < n) buf[first + l] = combine<T, Op>(buf[first + l], peer.e[l], divisor);
            }
        }
    }
}

// Up to 512 threads a block (past 4 KiB: gp2p_cuda's exchange_launch_config), at one block per
// multiprocessor, so the compiler keeps the 72-80 registers a batch of loads takes (every op
// and dtype, none spilled): bounds of 512 alone made it spill to fit two blocks
// (benches/results/exchange-registers-h200.txt).
#define GP2P_EXCHANGE(opname, Op, tname, T)                                                  \
    extern "C" __global__ void __launch_bounds__(512, 1) gp2p_exchange_##opname##_##tname(   \
        T* buf, u64 n, u64* out_lines, const u64* in_lines, u32 seq, u32 divisor,            \
        u64 timeout_ns, u32* failed, u32* seq_counter, u64 half_stride, u32* broken) {       \
        exchange<T, Op>(buf, n, out_lines, in_lines, seq, divisor, timeout_ns, failed,       \
                        seq_counter, half_stride, broken);                                   \
    }

#define GP2P_EXCHANGE_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_EXCHANGE, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_EXCHANGE_ALL_OPS)

// ---------------------------------------------------------------------------------------
// Two-rank all-reduce through mapped pinned host memory in flagged chunks, one kernel per
// rank, for messages up to a few MiB (the one-process-per-GPU communicator's and, between two
// devices of one process, gp2p-pinned's ChunkExchange). The buffer is
// cut into CHUNK_BYTES chunks, dealt to the blocks grid-stride, and each block splits into
// two teams of threads. The storing team stores each of the block's chunks into this rank's
// data area as it is, and once the team has passed its barrier its thread 0 fences the
// team's stores to the system and writes the call's sequence number into the chunk's flag.
// The folding team follows chunk by chunk: it waits on a named barrier the storing team
// arrives at (bar.arrive, no wait) once it read the chunk (the fold overwrites it in place),
// its thread 0 polls the peer's flag, and once it read the number the team reads the peer's
// chunk and folds buf = op(own, peer) (own first on both ranks, as the line exchange folds).
// Storing one chunk overlaps reading the one before, so both directions of the bus carry
// data at once. The handoff barriers are CHUNK_HANDOFF_DEPTH deep: before reusing one, the
// storing team waits on a second barrier that the folding team arrives at once it folded the
// chunk that last used it, so neither team arrives twice at a barrier before the other.
// (Until 2026-12-01 the folding team polled the chunk's own flag in host memory, as a shared
// count between teams is a race to compute-sanitizer's racecheck, which knows only barriers:
// one H200 with both ranks on it, benches/probes/small_exchange.py, the barriers against the
// host flag: 8 KiB 7.3 against 9.3 us, 64 KiB 11.7 against 14.3, as fast as the shared count.)
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

template <typename T, typename Op>
__device__ __forceinline__ void exchange_chunks(T* buf, u64 n, char* out_area, const char* in_area, u32 divisor,
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
        // The storing team waits only for the folding team's handoff, which comes once the
        // fold of the chunk CHUNK_HANDOFF_DEPTH back ended: folded, or given up on a peer that
        // did not come within its bounds. So every wait here ends, and the folding team's for
        // this team's reads does too.
        u32 i = 0;
        for (u64 c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
            if (i >= CHUNK_HANDOFF_DEPTH) team_barrier(CHUNK_FOLDED_BARRIER(i), blockDim.x);
            const u64 end = min(groups, (c + 1) * per_chunk);
            for (u64 g = c * per_chunk + threadIdx.x; g < end; g += team) {
                Group16<T> own;
                own.v = make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int l = 0; l < PER; ++l) {
                    if (g * PER + l < n) own.e[l] = buf[g * PER + l];
                }
                out_data[g] = own.v;
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
                            if (g * PER + l < n) buf[g * PER + l] = combine<T, Op>(buf[g * PER + l], peer[k].e[l], divisor);
                        }
                    }
                }
            }
            if (c + (u64)CHUNK_HANDOFF_DEPTH * gridDim.x < chunks) barrier_arrive(CHUNK_FOLDED_BARRIER(i), blockDim.x);
        }
    }
    // The last block to finish stores the count: every block has read it by then.
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

#define GP2P_CHUNKS(opname, Op, tname, T)                                                      \
    extern "C" __global__ void __launch_bounds__(512) gp2p_chunks_##opname##_##tname(          \
        T* buf, u64 n, char* out_area, const char* in_area, u32 divisor, u64 timeout_ns,       \
        u64 queue_timeout_ns, u32* failed, u32* seq_counter, u64 half_stride, u64 flags_offset, \
        u32* broken) {                                                                         \
        exchange_chunks<T, Op>(buf, n, out_area, in_area, divisor, timeout_ns, queue_timeout_ns, \
                               failed, seq_counter, half_stride, flags_offset, broken);        \
    }

#define GP2P_CHUNKS_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_CHUNKS, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_CHUNKS_ALL_OPS)

// ---------------------------------------------------------------------------------------
// A bounded wait on a flag in mapped pinned host memory, for pipelines between processes
// that share staging memory (the communicator's large messages): one thread waits until
// `*flag == value`, then the stream goes on. The flags are handshakes (a slot's sender sets
// its flag to 1 once the slot holds a chunk, its receiver back to 0 once it has read it), so
// a call waits for the same values every time and a CUDA graph that captured it can be
// replayed. A wait longer than `timeout_ns` sets `*failed` (this rank's) and `*broken` (the
// communicator's, which every rank's waits read) to 1 and returns; a wait that finds either
// set (it looks every GIVE_UP_CHECK_POLLS polls) returns: the handshakes may no longer pair
// up, so one lost peer costs one timeout, not one per chunk, and both ranks' hosts report it
// at their next call.

#define WAIT_POLL_GAP_NS 256

extern "C" __global__ void gp2p_wait_flag(const u32* flag, u32 value, u64 timeout_ns, u32* failed, u32* broken) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u64 deadline = 0;
    u32 polls = 0;
    while (*(const volatile u32*)flag != value) {
        if (++polls % GIVE_UP_CHECK_POLLS == 0 && (*(volatile u32*)failed != 0 || *(volatile u32*)broken != 0)) return;
        const u64 now = global_ns();
        if (deadline == 0) {
            deadline = now + timeout_ns;
        } else if (now > deadline) {
            *(volatile u32*)failed = 1;
            *(volatile u32*)broken = 1;
            return;
        }
        __nanosleep(WAIT_POLL_GAP_NS);
    }
    // Whatever this stream does next reads what the flag guards.
    __threadfence_system();
}
