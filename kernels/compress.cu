// gp2p compress kernels: the compressed all-reduce's block codec on the GPU, computing the
// bits of its CPU reference (gp2p_kernels::compress) for f32, f16 and bf16 inputs.
//
// A wire is what one range of `n` values becomes (gp2p_kernels::compress::WireLayout): one
// 4-byte word per block of `block` values (the block's f32 scale, or EXACT_WORD for a block
// that travels exact), then one code byte per value, then, at the exact area, the f32 values
// of the blocks that travel exact, each at its own index (only those blocks' bytes are
// written or read, so only they cross the bus when the wire is mapped host memory).
//
// - encode:      wire = quantize(src)
// - fold_encode: wire = quantize(fold over ranks 0..ranks-1 of: the owner's own values as
//                they are, every other rank's values decoded from its wire), times the f32
//                reciprocal of `ranks` for avg
// - decode:      dst = T(decode(wire))
// - fold_decode: dst = T(fold over ranks 0..ranks-1 of every rank's values decoded from its
//                wire, times the f32 reciprocal of `ranks` for avg): the one-shot's result
// - copy_exact_blocks: the exact blocks' values a DMA of a wire's words and codes leaves out
//                (one kernel for every type and format)
//
// One warp per block, each lane holding a block's values at lane, lane + 32, ... in
// registers (a block is at most 256 values: 8 a lane). The arithmetic is the reference's:
// IEEE f32 division, products and sums each rounded to nearest even through the _rn
// intrinsics (so nothing is contracted into a fused multiply-add), subnormals kept, the fold
// in rank order. Wires may be device memory or mapped pinned host memory.
//
// Built by `cargo xtask ptx` like every kernels/*.cu (compress.ptx, compress.compute_75.ptx).

#include "common.cuh"

#define WARP 32
#define MAX_BLOCK 256
#define PER_LANE (MAX_BLOCK / WARP)
// The scale word of a block that travels exact: a NaN, which no scaled block's scale is.
#define EXACT_WORD 0xffffffffu
// Blocks whose largest magnitude is above zero and below 2^-100 travel exact
// (gp2p_kernels::compress::MIN_SCALED_BLOCK_MAX).
#define MIN_SCALED_BITS ((u32)(127 - 100) << 23)
#define MAX_WIRES 8

// Where the parts of a wire of `n` values in blocks of `block` start (WireLayout's offsets).
struct Wire {
    u8* base;
    u64 codes;
    u64 exact;
};

__device__ __forceinline__ u64 align16(u64 x) { return (x + 15) & ~(u64)15; }

__device__ __forceinline__ Wire wire_at(u8* base, u64 n, u32 block) {
    Wire w;
    w.base = base;
    w.codes = align16(4 * ((n + block - 1) / block));
    w.exact = align16(w.codes + n);
    return w;
}

struct Int8 {
    static __device__ __forceinline__ float code_max() { return 127.0f; }
    static __device__ __forceinline__ u8 encode(float scaled) {
        float q = rintf(scaled);
        q = fminf(fmaxf(q, -127.0f), 127.0f);
        return (u8)(i8)(i32)q;
    }
    static __device__ __forceinline__ float decode(u8 code) { return (float)(i8)code; }
};

struct Fp8 {
    static __device__ __forceinline__ float code_max() { return 448.0f; }
    static __device__ __forceinline__ u8 encode(float scaled) { return E4m3::from_f32(scaled); }
    static __device__ __forceinline__ float decode(u8 code) { return E4m3::to_f32(code); }
};

// The values of block `b` a lane holds: v[j] is value lane + 32 j of the block, where
// present[j] (the last block may be short).
struct BlockValues {
    float v[PER_LANE];
    bool present[PER_LANE];
};

__device__ __forceinline__ u64 value_index(u64 b, u32 block, int j) {
    return b * block + (u64)j * WARP + (threadIdx.x % WARP);
}

// Quantize the lane's share of block `b` into `w`, as Format::quantize does: exact where the
// block holds a NaN or an infinity or its largest magnitude is in (0, 2^-100); else scaled.
template <typename F>
__device__ __forceinline__ void quantize_block(const BlockValues& x, u64 b, u64 n, u32 block, const Wire& w) {
    float max = 0.0f;
    bool special = false;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
        if (!x.present[j]) continue;
        const float m = fabsf(x.v[j]);
        if (!(m <= 3.402823466e38f)) special = true;  // NaN or infinity
        else max = fmaxf(max, m);
    }
    special = __any_sync(0xffffffffu, special);
#pragma unroll
    for (int off = WARP / 2; off > 0; off /= 2) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, off));
    const bool tiny = max != 0.0f && __float_as_uint(max) < MIN_SCALED_BITS;
    u32* scales = reinterpret_cast<u32*>(w.base);
    if (special || tiny) {
        float* exact = reinterpret_cast<float*>(w.base + w.exact);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            if (x.present[j]) exact[value_index(b, block, j)] = x.v[j];
        }
        if (threadIdx.x % WARP == 0) scales[b] = EXACT_WORD;
        return;
    }
    const float scale = __fdiv_rn(max, F::code_max());
    u8* codes = w.base + w.codes;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
        if (x.present[j]) codes[value_index(b, block, j)] = scale == 0.0f ? 0 : F::encode(__fdiv_rn(x.v[j], scale));
    }
    if (threadIdx.x % WARP == 0) scales[b] = __float_as_uint(scale);
}

// The lane's values of block `b` decoded from `w` (scale word read once per lane).
template <typename F>
__device__ __forceinline__ void decode_block(BlockValues& x, u64 b, u32 block, const Wire& w) {
    const u32 word = reinterpret_cast<const u32*>(w.base)[b];
    if (word == EXACT_WORD) {
        const float* exact = reinterpret_cast<const float*>(w.base + w.exact);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            if (x.present[j]) x.v[j] = exact[value_index(b, block, j)];
        }
        return;
    }
    const float scale = __uint_as_float(word);
    const u8* codes = w.base + w.codes;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
        if (x.present[j]) x.v[j] = __fmul_rn(F::decode(codes[value_index(b, block, j)]), scale);
    }
}

template <typename T>
__device__ __forceinline__ void load_block(BlockValues& x, const T* src, u64 b, u64 n, u32 block) {
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
        const u64 i = value_index(b, block, j);
        x.present[j] = (u32)j * WARP < block && i < n;
        x.v[j] = x.present[j] ? Lane<T>::load(src[i]) : 0.0f;
    }
}

__device__ __forceinline__ u64 first_block() { return ((u64)blockIdx.x * blockDim.x + threadIdx.x) / WARP; }
__device__ __forceinline__ u64 block_stride() { return (u64)gridDim.x * blockDim.x / WARP; }

template <typename T, typename F>
__device__ __forceinline__ void encode(const T* src, u64 n, u32 block, u8* wire) {
    const Wire w = wire_at(wire, n, block);
    const u64 blocks = (n + block - 1) / block;
    for (u64 b = first_block(); b < blocks; b += block_stride()) {
        BlockValues x;
        load_block(x, src, b, n, block);
        quantize_block<F>(x, b, n, block, w);
    }
}

// The wires a fold reads: rank r's at at[r] (the owner's entry unused). The kernel takes them
// as eight arguments, since launches pass each argument in one 64-bit slot.
struct Wires {
    u8* at[MAX_WIRES];
};

template <typename T, typename F>
__device__ __forceinline__ void fold_encode(const T* own, u64 n, u32 block, Wires wires, u32 ranks, u32 owner,
                                            u32 average, u8* out) {
    const Wire w = wire_at(out, n, block);
    const u64 blocks = (n + block - 1) / block;
    const float reciprocal = __fdiv_rn(1.0f, (float)ranks);
    for (u64 b = first_block(); b < blocks; b += block_stride()) {
        BlockValues acc, part;
        load_block(acc, own, b, n, block);
        part = acc;
        for (u32 r = 0; r < ranks; ++r) {
            if (r == owner) {
                load_block(part, own, b, n, block);
            } else {
                decode_block<F>(part, b, block, wire_at(wires.at[r], n, block));
            }
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) {
                // The first rank's value starts the fold (so -0 + -0 stays -0).
                acc.v[j] = r == 0 ? part.v[j] : __fadd_rn(acc.v[j], part.v[j]);
            }
        }
        if (average) {
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) acc.v[j] = __fmul_rn(acc.v[j], reciprocal);
        }
        quantize_block<F>(acc, b, n, block, w);
    }
}

// The one-shot's fold: every rank's wire decoded and folded in rank order, times the f32
// reciprocal of `ranks` for avg, rounded once into `dst` (all_reduce_one_shot's bits).
template <typename T, typename F>
__device__ __forceinline__ void fold_decode(u64 n, u32 block, Wires wires, u32 ranks, u32 average, T* dst) {
    const u64 blocks = (n + block - 1) / block;
    const float reciprocal = __fdiv_rn(1.0f, (float)ranks);
    for (u64 b = first_block(); b < blocks; b += block_stride()) {
        BlockValues acc, part;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            acc.present[j] = (u32)j * WARP < block && value_index(b, block, j) < n;
            acc.v[j] = 0.0f;
        }
        part = acc;
        for (u32 r = 0; r < ranks; ++r) {
            decode_block<F>(part, b, block, wire_at(wires.at[r], n, block));
#pragma unroll
            for (int j = 0; j < PER_LANE; ++j) {
                // The first rank's value starts the fold (so -0 + -0 stays -0).
                acc.v[j] = r == 0 ? part.v[j] : __fadd_rn(acc.v[j], part.v[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            if (average) acc.v[j] = __fmul_rn(acc.v[j], reciprocal);
            if (acc.present[j]) dst[value_index(b, block, j)] = Lane<T>::store(acc.v[j]);
        }
    }
}

template <typename T, typename F>
__device__ __forceinline__ void decode(const u8* wire, u64 n, u32 block, T* dst) {
    const Wire w = wire_at(const_cast<u8*>(wire), n, block);
    const u64 blocks = (n + block - 1) / block;
    for (u64 b = first_block(); b < blocks; b += block_stride()) {
        BlockValues x;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            x.present[j] = (u32)j * WARP < block && value_index(b, block, j) < n;
            x.v[j] = 0.0f;
        }
        decode_block<F>(x, b, block, w);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            if (x.present[j]) dst[value_index(b, block, j)] = Lane<T>::store(x.v[j]);
        }
    }
}

// The exact area's values of the blocks of the wire of `n` values at `src` that travel exact,
// into the wire at `dst`, the blocks told by the words at `words_at` (`src`'s, or `dst`'s once a
// DMA has put its words and codes there): what a DMA of a wire's words and codes leaves out.
// The rest of the exact area is left as it is, so between device memory and mapped host memory
// only those values cross the bus, where a copy of the whole room would carry 4 bytes a value.
extern "C" __global__ void gp2p_compress_copy_exact_blocks(const u8* src, u64 n, u32 block, u8* dst,
                                                           const u8* words_at) {
    const Wire w = wire_at(const_cast<u8*>(src), n, block);
    const u32* words = reinterpret_cast<const u32*>(words_at);
    const float* exact_from = reinterpret_cast<const float*>(src + w.exact);
    float* exact_to = reinterpret_cast<float*>(dst + w.exact);
    const u64 blocks = (n + block - 1) / block;
    bool wrote = false;
    for (u64 b = first_block(); b < blocks; b += block_stride()) {
        if (words[b] != EXACT_WORD) continue;
        const u64 end = (b + 1) * block < n ? (b + 1) * block : n;
        for (u64 i = b * block + threadIdx.x % WARP; i < end; i += WARP) exact_to[i] = exact_from[i];
        wrote = true;
    }
    // Into mapped host memory, stores from the multiprocessors may reach it after a flag that
    // the stream writes once the kernel ends (the link orders them weakly): a thread that
    // stored fences them to the system first, as the flagged chunks do before their flag.
    if (wrote) __threadfence_system();
}

#define GP2P_COMPRESS_KERNELS(fname, F, tname, T)                                                              \
    extern "C" __global__ void gp2p_compress_encode_##fname##_##tname(const T* src, u64 n, u32 block,          \
                                                                        u8* wire) {                            \
        encode<T, F>(src, n, block, wire);                                                                     \
    }                                                                                                          \
    extern "C" __global__ void gp2p_compress_fold_encode_##fname##_##tname(                                    \
        const T* own, u64 n, u32 block, u8* w0, u8* w1, u8* w2, u8* w3, u8* w4, u8* w5, u8* w6, u8* w7,         \
        u32 ranks, u32 owner, u32 average, u8* out) {                                                          \
        const Wires wires = {{w0, w1, w2, w3, w4, w5, w6, w7}};                                                \
        fold_encode<T, F>(own, n, block, wires, ranks, owner, average, out);                                   \
    }                                                                                                          \
    extern "C" __global__ void gp2p_compress_decode_##fname##_##tname(const u8* wire, u64 n, u32 block,       \
                                                                        T* dst) {                              \
        decode<T, F>(wire, n, block, dst);                                                                     \
    }                                                                                                          \
    extern "C" __global__ void gp2p_compress_fold_decode_##fname##_##tname(                                    \
        u64 n, u32 block, u8* w0, u8* w1, u8* w2, u8* w3, u8* w4, u8* w5, u8* w6, u8* w7, u32 ranks,            \
        u32 average, T* dst) {                                                                                 \
        const Wires wires = {{w0, w1, w2, w3, w4, w5, w6, w7}};                                                \
        fold_decode<T, F>(n, block, wires, ranks, average, dst);                                               \
    }

#define GP2P_COMPRESS_FORMATS(tname, T)          \
    GP2P_COMPRESS_KERNELS(int8, Int8, tname, T)  \
    GP2P_COMPRESS_KERNELS(fp8, Fp8, tname, T)

GP2P_COMPRESS_FORMATS(f32, float)
GP2P_COMPRESS_FORMATS(f16, f16)
GP2P_COMPRESS_FORMATS(bf16, bf16)
