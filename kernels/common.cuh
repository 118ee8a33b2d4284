// Shared by every kernel family (kernels/*.cu include it): the storage types, the reduce
// ops applied element by element, the op and dtype lists kernels are stamped out from, and
// the clock, give-up cadence and sequence numbers of the kernels that wait across the bus.
//
// Only __forceinline__ functions, templates and macros: a family's PTX holds what its own
// kernels use and nothing else. No CUDA headers are used, so the PTX depends on kernels/
// alone: half goes through PTX `cvt` instructions (sm_53 and up), bfloat16 through `cvt`
// where the hardware has it (sm_80 and up) and integer rounding below, fp8 in software
// everywhere (its `cvt` needs sm_89, above both PTX targets).

#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define VEC_BYTES 16

struct f16 { u16 bits; };
struct bf16 { u16 bits; };
struct f8e4m3 { u8 bits; };
struct f8e5m2 { u8 bits; };

// 2^e as f32, for the exponents the fp8 conversions use (well inside the normal range).
__device__ __forceinline__ float pow2(int e) { return __uint_as_float((u32)(127 + e) << 23); }

// The two fp8 formats, converted in software as gp2p_kernels::fp8 does (its module doc has
// the layout): M mantissa bits, MIN_EXP the smallest normal exponent, MAX_CODE the largest
// finite magnitude's code, INF_CODE infinity's (0 where the format has none).
template <int M, int MIN_EXP, u32 MAX_CODE, u32 INF_CODE> struct Fp8Format {
    // Nearest, ties to the even code; from the largest finite magnitude up (infinity
    // included) saturating to it, as NCCL's fp8 stores do; NaN to the all-ones code, sign kept.
    static __device__ __forceinline__ u8 from_f32(float v) {
        const u8 sign = (__float_as_uint(v) >> 31) ? 0x80 : 0;
        const float m = fabsf(v);
        if (m != m) return sign | 0x7f;
        if (m >= to_f32(MAX_CODE)) return sign | (u8)MAX_CODE;
        int binade = (int)(__float_as_uint(m) >> 23) - 127;
        if (binade < MIN_EXP) binade = MIN_EXP;
        // Exact (a power of two), then one rounding to an integer: the whole conversion.
        const u32 steps = (u32)rintf(__fmul_rn(m, pow2(M - binade)));
        return sign | (u8)(((u32)(binade - MIN_EXP) << M) + steps);
    }
    static __device__ __forceinline__ float to_f32(u32 code) {
        const u32 magnitude = code & 0x7f;
        float value;
        if (INF_CODE != 0 && magnitude == INF_CODE) {
            value = __uint_as_float(0x7f800000u);
        } else if (magnitude > MAX_CODE) {
            value = __uint_as_float(0x7fc00000u);
        } else if ((magnitude >> M) == 0) {
            value = __fmul_rn((float)(magnitude & ((1u << M) - 1)), pow2(MIN_EXP - M));
        } else {
            const int field = (int)(magnitude >> M);
            value = __fmul_rn((float)((1u << M) + (magnitude & ((1u << M) - 1))), pow2(field - 1 + MIN_EXP - M));
        }
        return (code & 0x80) ? -value : value;
    }
};
typedef Fp8Format<3, -6, 0x7e, 0> E4m3;
typedef Fp8Format<2, -14, 0x7b, 0x7c> E5m2;

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

template <typename Format, typename T> struct Fp8Lane {
    typedef float Acc;
    static __device__ __forceinline__ float load(T v) { return Format::to_f32(v.bits); }
    static __device__ __forceinline__ T store(float f) {
        T v;
        v.bits = Format::from_f32(f);
        return v;
    }
};
template <> struct Lane<f8e4m3> : Fp8Lane<E4m3, f8e4m3> {};
template <> struct Lane<f8e5m2> : Fp8Lane<E5m2, f8e5m2> {};

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
__device__ __forceinline__ T combine_inline(T d, T s, u32 divisor) {
    typedef Lane<T> L;
    return L::store(Op::apply(L::load(d), L::load(s), divisor));
}

// fp8's conversions are dozens of instructions each: inlined into every unrolled lane of
// every kernel they doubled the PTX (and the driver's JIT work); a call per element keeps each
// kernel small, and the folds stay bound by the bytes they move.
template <typename T> struct OutOfLine { enum { value = 0 }; };
template <> struct OutOfLine<f8e4m3> { enum { value = 1 }; };
template <> struct OutOfLine<f8e5m2> { enum { value = 1 }; };

template <typename T, typename Op, int = OutOfLine<T>::value> struct Combine {
    static __device__ __forceinline__ T apply(T d, T s, u32 divisor) { return combine_inline<T, Op>(d, s, divisor); }
};
template <typename T, typename Op> struct Combine<T, Op, 1> {
    static __device__ __noinline__ T apply(T d, T s, u32 divisor) { return combine_inline<T, Op>(d, s, divisor); }
};

template <typename T, typename Op>
__device__ __forceinline__ T combine(T d, T s, u32 divisor) {
    return Combine<T, Op>::apply(d, s, divisor);
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
    X(u64, u64)                \
    X(f8e4m3, f8e4m3)          \
    X(f8e5m2, f8e5m2)

// ---------------------------------------------------------------------------------------
// Waiting across the bus (exchange.cu, chunks.cu, flags.cu).

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

// A 16-byte group of the buffer, as a vector, as four 4-byte words (the data of four lines)
// and as elements.
template <typename T> union Group16 {
    uint4 v;
    u32 w[4];
    T e[VEC_BYTES / sizeof(T)];
};

// `acc = op(acc, x)` over every lane of two 16-byte groups, as `combine` is over one element.
// For fp8, exchange_many.cu's fold (unrolled over eight ranks' groups) makes one out-of-line
// call a group instead of one a lane: a call a lane took its PTX past 4 MiB.
template <typename T, typename Op, int = OutOfLine<T>::value> struct CombineGroup {
    static __device__ __forceinline__ void apply(Group16<T>& acc, const Group16<T>& x, u32 divisor) {
#pragma unroll
        for (int l = 0; l < VEC_BYTES / (int)sizeof(T); ++l) acc.e[l] = combine<T, Op>(acc.e[l], x.e[l], divisor);
    }
};
template <typename T, typename Op> struct CombineGroup<T, Op, 1> {
    static __device__ __forceinline__ void apply(Group16<T>& acc, const Group16<T>& x, u32 divisor) {
        acc.v = out_of_line(acc.v, x.v, divisor);
    }
    static __device__ __noinline__ uint4 out_of_line(uint4 acc, uint4 x, u32 divisor) {
        Group16<T> a, b;
        a.v = acc;
        b.v = x;
        CombineGroup<T, Op, 0>::apply(a, b, divisor);
        return a.v;
    }
};

template <typename T, typename Op>
__device__ __forceinline__ void combine_group(Group16<T>& acc, const Group16<T>& x, u32 divisor) {
    CombineGroup<T, Op>::apply(acc, x, divisor);
}

// The next sequence number after `count`: never 0 (the tag of lines never written), and odd
// and even in turn (after 0xffffffff comes 2), as gp2p_kernels::next_exchange_seq counts.
__device__ __forceinline__ u32 next_seq(u32 count) {
    const u32 next = count + 1;
    return next == 0 ? 2 : next;
}

// ---------------------------------------------------------------------------------------
// The exchanges' 8-byte lines (exchange.cu, exchange_many.cu): two lines stored or loaded at
// once, volatile (another rank's kernel reads or writes them across the bus), the pause
// between polls of lines that have not arrived, and the wait for them (await_lines).

#define EXCHANGE_POLL_GAP_NS 64

__device__ __forceinline__ void store_lines(u64* at, u64 a, u64 b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ void load_lines(const u64* at, u64& a, u64& b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(at) : "memory");
}

// A wait for two lines at `at` to carry `seq`, `a` and `b` holding what was loaded from there
// last (a thread loads a batch of lines at once before it waits for any). Polls EXCHANGE_POLL_GAP_NS
// apart until both arrive (true, `a` and `b` holding them), the thread's deadline passes
// (`deadline`: 0 until its first wait starts it, `timeout_ns` later; `failed` and, where given,
// `broken` are set) or another wait of the communicator gave up (`broken` found set, every
// GIVE_UP_CHECK_POLLS polls): false then, and the caller returns.
__device__ __forceinline__ bool await_lines(const u64* at, u64& a, u64& b, u32 seq, u64& deadline, u32& polls,
                                            u64 timeout_ns, u32* failed, u32* broken) {
    while ((u32)(a >> 32) != seq || (u32)(b >> 32) != seq) {
        if (broken != 0 && ++polls % GIVE_UP_CHECK_POLLS == 0 && *(volatile u32*)broken != 0) return false;
        const u64 now = global_ns();
        if (deadline == 0) {
            deadline = now + timeout_ns;
        } else if (now > deadline) {
            *(volatile u32*)failed = 1;
            if (broken != 0) *(volatile u32*)broken = 1;
            return false;
        }
        __nanosleep(EXCHANGE_POLL_GAP_NS);
        load_lines(at, a, b);
    }
    return true;
}
