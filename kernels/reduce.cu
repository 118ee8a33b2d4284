// gp2p reduce kernels: dst[i] = op(dst[i], src[i]) for every op x dtype.
//
// `src` is either device memory (the scratch path) or mapped pinned host memory that the
// kernel reads across PCIe (the zero-copy path); the kernel does not care which.
//
// Built by `cargo xtask ptx` with NVRTC 12.0 twice, like every kernels/*.cu: for compute_80
// (reduce.ptx) and for compute_75 (reduce.compute_75.ptx, Turing). The types and ops it
// shares with the other families are in common.cuh.
//
// Layout of the work: when dst and src share their offset modulo 16 bytes, the bulk moves
// as 16-byte vectors (`uint4`), UNROLL of them per thread per step so that enough loads are
// in flight to cover PCIe latency on the zero-copy path; the unaligned head and the short
// tail go element by element. When the offsets differ, everything goes element by element.

#include "common.cuh"

#define UNROLL 4

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

#define GP2P_REDUCE(opname, Op, tname, T)                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                        \
    gp2p_reduce_##opname##_##tname(T* dst, const T* src, u64 n, u32 divisor) {               \
        reduce<T, Op>(dst, src, n, divisor);                                                 \
    }

#define GP2P_REDUCE_ALL_OPS(tname, T) GP2P_FOR_EACH_OP(GP2P_REDUCE, tname, T)

GP2P_FOR_EACH_DTYPE(GP2P_REDUCE_ALL_OPS)
