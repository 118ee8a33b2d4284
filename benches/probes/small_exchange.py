"""Small two-rank all-reduces through mapped pinned host memory: which kernel shape is fastest.

Two devices, one process, f32 sum in place. Each variant is one kernel per rank per call:
- `ll`: the line exchange as the library had it until 2026-12-01 (8-byte lines of 4 data
  bytes and the call's number, a group's four lines side by side; every thread publishes
  its 16-byte groups, then polls the peer's in batches);
- `llp`: `ll` with the lines in two planes (a group's first two lines in one, its last two
  in the other), so a warp's 16-byte stores and loads cover 512 contiguous bytes instead of
  every other 16 bytes of 1 KiB: the library's layout since;
- `flag`: plain 16-byte stores of a chunk, a system fence, then one flag per chunk; the
  reader's thread 0 polls the flag, then the block reads the chunk (half the bytes of `ll`,
  one poller per block);
- `flagacq`: `flag`, the reader polling with a system-scope acquire load (as the library's
  chunk kernel does) in place of a volatile load and a fence;
- `flagws`: `flagacq` with warp roles in each block: half the threads store and flag chunks,
  half fold the peer's, so stores of one chunk overlap reads of the one before; the folding
  team learns that its own chunk was read (the fold overwrites it) from a shared count;
- `flagwh`: `flagws` learning it from the chunk's own flag in host memory, across the bus
  (the library's chunk kernel);
- `flagwb`: `flagws` learning it from named barriers (the storing team arrives, the folding
  team syncs), four chunks deep (the library's chunk kernel since).
Every timed loop enqueues `--calls` back-to-back calls on each device behind a gate kernel
(so the host's launch rate is not what is timed), opens the gate, and times with events on
each device; the figure is the slower device's time per call. Results are checked: after k
calls of in-place sum, fl(a0 + a1) * 2**(k - 1) on both devices (inputs scaled by 2**-60 so nothing
overflows; at 2**-100 one input in 10**8 was subnormal, and a 16 MiB run then saw one wrong
element, which a flush to zero somewhere in the toolchain explains). A null kernel gives the launch floor.

    python3 benches/probes/small_exchange.py [--calls 100] [--repeats 5]
        [--sizes 64,2048,...] [--kinds null,ll,flag,flagacq,flagws,flagwh,flagwb] [--blocks 1,4,16,64]
        [--chunks 512,...] [--threads 256,512]
"""

import argparse
import ctypes
import mmap
import statistics
import tempfile

import cupy as cp
import numpy as np

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ void st2(u64* at, u64 a, u64 b) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void ld2(const u64* at, u64& a, u64& b) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(at) : "memory");
}
__device__ __forceinline__ uint4 ld4(const uint4* at) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(at) : "memory");
    return v;
}

__device__ __forceinline__ u32 ld_acquire_sys(const u32* at) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
    return v;
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Every spin gives up after SPIN_LIMIT_NS (a wrong variant or a launch that failed on the
// other rank), setting *failed, so the probe reports instead of hanging.
#define SPIN_LIMIT_NS 300000000ull
__device__ u32 failed_word;
__device__ __forceinline__ bool given_up(u64& deadline) {
    if (*(volatile u32*)&failed_word) return true;
    const u64 t = now_ns();
    if (deadline == 0) deadline = t + SPIN_LIMIT_NS;
    if (t > deadline) { failed_word = 1; return true; }
    return false;
}

extern "C" __global__ void gate(const volatile u32* flag) {
    u64 deadline = 0;
    while (*flag == 0 && !given_up(deadline)) __nanosleep(1000);
}

extern "C" __global__ void null_kernel() {}

// n: floats, a multiple of 4.
extern "C" __global__ void __launch_bounds__(1024) ll(float* buf, u64 n, u64* out_lines, const u64* in_lines, u32 seq, u32 batch, u32 gap, u64 half) {
    if (seq & 1) { out_lines += half / 8; in_lines += half / 8; }
    const u64 groups = n / 4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tag = ((u64)seq) << 32;
    const u64 mine = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (u64 g = mine; g < groups; g += stride) {
        uint4 v = ((const uint4*)buf)[g];
        st2(out_lines + 4 * g, tag | v.x, tag | v.y);
        st2(out_lines + 4 * g + 2, tag | v.z, tag | v.w);
    }
    for (u64 g0 = mine; g0 < groups; g0 += 8 * stride) {
        u64 l[8][4];
        #pragma unroll
        for (int k = 0; k < 8; ++k) {
            const u64 g = g0 + k * stride;
            if (k < batch && g < groups) { ld2(in_lines + 4 * g, l[k][0], l[k][1]); ld2(in_lines + 4 * g + 2, l[k][2], l[k][3]); }
        }
        #pragma unroll
        for (int k = 0; k < 8; ++k) {
            const u64 g = g0 + k * stride;
            if (g >= groups) break;
            if (k >= batch) { ld2(in_lines + 4 * g, l[k][0], l[k][1]); ld2(in_lines + 4 * g + 2, l[k][2], l[k][3]); }
            for (int h = 0; h < 2; ++h) {
                u64 deadline = 0;
                while ((u32)(l[k][2 * h] >> 32) != seq || (u32)(l[k][2 * h + 1] >> 32) != seq) {
                    if (given_up(deadline)) return;
                    __nanosleep(gap);
                    ld2(in_lines + 4 * g + 2 * h, l[k][2 * h], l[k][2 * h + 1]);
                }
            }
            float4 own = ((float4*)buf)[g];
            own.x += __uint_as_float((u32)l[k][0]); own.y += __uint_as_float((u32)l[k][1]);
            own.z += __uint_as_float((u32)l[k][2]); own.w += __uint_as_float((u32)l[k][3]);
            ((float4*)buf)[g] = own;
        }
    }
}

// `ll` with planar lines: group g's lines 0-1 at 16 g bytes into the first plane, its lines 2-3
// at 16 g bytes into the second (2 * groups lines on), so a warp's stores and loads are
// contiguous. Same area size, same batches and polls.
extern "C" __global__ void __launch_bounds__(1024) llp(float* buf, u64 n, u64* out_lines, const u64* in_lines, u32 seq, u32 batch, u32 gap, u64 half) {
    if (seq & 1) { out_lines += half / 8; in_lines += half / 8; }
    const u64 groups = n / 4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 tag = ((u64)seq) << 32;
    const u64 mine = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64* const out_plane[2] = {out_lines, out_lines + 2 * groups};
    const u64* const in_plane[2] = {in_lines, in_lines + 2 * groups};
    for (u64 g = mine; g < groups; g += stride) {
        uint4 v = ((const uint4*)buf)[g];
        st2(out_plane[0] + 2 * g, tag | v.x, tag | v.y);
        st2(out_plane[1] + 2 * g, tag | v.z, tag | v.w);
    }
    for (u64 g0 = mine; g0 < groups; g0 += 8 * stride) {
        u64 l[8][4];
        #pragma unroll
        for (int k = 0; k < 8; ++k) {
            const u64 g = g0 + k * stride;
            if (k < batch && g < groups) { ld2(in_plane[0] + 2 * g, l[k][0], l[k][1]); ld2(in_plane[1] + 2 * g, l[k][2], l[k][3]); }
        }
        #pragma unroll
        for (int k = 0; k < 8; ++k) {
            const u64 g = g0 + k * stride;
            if (g >= groups) break;
            if (k >= batch) { ld2(in_plane[0] + 2 * g, l[k][0], l[k][1]); ld2(in_plane[1] + 2 * g, l[k][2], l[k][3]); }
            for (int h = 0; h < 2; ++h) {
                u64 deadline = 0;
                while ((u32)(l[k][2 * h] >> 32) != seq || (u32)(l[k][2 * h + 1] >> 32) != seq) {
                    if (given_up(deadline)) return;
                    __nanosleep(gap);
                    ld2(in_plane[h] + 2 * g, l[k][2 * h], l[k][2 * h + 1]);
                }
            }
            float4 own = ((float4*)buf)[g];
            own.x += __uint_as_float((u32)l[k][0]); own.y += __uint_as_float((u32)l[k][1]);
            own.z += __uint_as_float((u32)l[k][2]); own.w += __uint_as_float((u32)l[k][3]);
            ((float4*)buf)[g] = own;
        }
    }
}

// Chunks of `chunk` floats (a multiple of 4); block b takes chunks b, b + grid, ...
extern "C" __global__ void __launch_bounds__(256) flag(float* buf, u64 n, float* out_data, const float* in_data, u32* out_flags,
                                const u32* in_flags, u32 seq, u64 chunk, u32 gap, u64 half, u64 flags_half, u32 acquire) {
    // Calls alternate halves: a rank publishes call k + 2 only after the peer read call k.
    if (seq & 1) { out_data += half / 4; in_data += half / 4; out_flags += flags_half; in_flags += flags_half; }
    const u64 chunks = (n + chunk - 1) / chunk;
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        const u64 end = min(n, (c + 1) * chunk) / 4;
        for (u64 g = c * chunk / 4 + threadIdx.x; g < end; g += blockDim.x)
            ((uint4*)out_data)[g] = ((const uint4*)buf)[g];
        // Every thread's stores are out before the flag: each fences its own.
        __threadfence_system();
        __syncthreads();
        if (threadIdx.x == 0) *(volatile u32*)(out_flags + 16 * c) = seq;
    }
    for (u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        if (threadIdx.x == 0) {
            u64 deadline = 0;
            if (acquire) {
                while (ld_acquire_sys(in_flags + 16 * c) != seq && !given_up(deadline)) __nanosleep(gap);
            } else {
                while (*(const volatile u32*)(in_flags + 16 * c) != seq && !given_up(deadline)) __nanosleep(gap);
                __threadfence_system();
            }
        }
        __syncthreads();
        const u64 end = min(n, (c + 1) * chunk) / 4;
        for (u64 g = c * chunk / 4 + threadIdx.x; g < end; g += blockDim.x) {
            uint4 p = ld4((const uint4*)in_data + g);
            float4 own = ((float4*)buf)[g];
            own.x += __uint_as_float(p.x); own.y += __uint_as_float(p.y);
            own.z += __uint_as_float(p.z); own.w += __uint_as_float(p.w);
            ((float4*)buf)[g] = own;
        }
    }
}
// `flag` with warp roles: the block's first half stores its chunks and flags them; the second
// half waits for each chunk's own store (a shared count) and the peer's flag (thread 0), then
// folds, four 16-byte loads in flight per thread. Storing chunk i + 1 overlaps reading chunk i,
// so both directions of the link carry data at once.
//
// `handoff` says how the folding team learns that chunk i's own values were read (the fold
// overwrites them): 0 (`flagws`) a shared count; 1 (`flagwh`) the chunk's own flag in host
// memory, polled across the bus (the library's chunk kernel since b733047, racecheck-clean);
// 2 (`flagwb`) named barriers, the storing team arriving (bar.arrive) once it read a chunk and
// the folding team syncing on it, four chunks deep (the library's chunk kernel since
// 2026-12-01's fourteenth session). (A per-block word in device memory, released and
// acquired at GPU scope, came between the shared count and the host flag: 8 KiB 8.1 us
// against 7.3 and 9.3; `git show 40305e5:benches/results/chunk-handoff-h200/probe-handoff-1-ec77dc4.txt`.)
extern "C" __global__ void __launch_bounds__(1024) flagws(float* buf, u64 n, float* out_data, const float* in_data, u32* out_flags,
                                const u32* in_flags, u32 seq, u64 chunk, u32 gap, u64 half, u64 flags_half, u32 handoff) {
    __shared__ volatile u32 stored;
    if (seq & 1) { out_data += half / 4; in_data += half / 4; out_flags += flags_half; in_flags += flags_half; }
    if (threadIdx.x == 0) stored = 0;
    __syncthreads();
    const u32 team = blockDim.x / 2;
    const u64 chunks = (n + chunk - 1) / chunk;
    if (threadIdx.x < team) {
        u32 i = 0;
        for (u64 c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
            if (handoff == 2 && i >= 4) asm volatile("bar.sync %0, %1;" ::"r"(7 + i % 4), "r"(blockDim.x) : "memory");
            const u64 end = min(n, (c + 1) * chunk) / 4;
            for (u64 g = c * chunk / 4 + threadIdx.x; g < end; g += team)
                ((uint4*)out_data)[g] = ((const uint4*)buf)[g];
            __threadfence_system();
            asm volatile("bar.sync 1, %0;" ::"r"(team) : "memory");
            if (threadIdx.x == 0) {
                *(volatile u32*)(out_flags + 16 * c) = seq;
                __threadfence_block();
                stored = i + 1;
            }
            if (handoff == 2) asm volatile("bar.arrive %0, %1;" ::"r"(3 + i % 4), "r"(blockDim.x) : "memory");
        }
    } else {
        const u32 t = threadIdx.x - team;
        u32 i = 0;
        for (u64 c = blockIdx.x; c < chunks; c += gridDim.x, ++i) {
            if (handoff == 2) asm volatile("bar.sync %0, %1;" ::"r"(3 + i % 4), "r"(blockDim.x) : "memory");
            if (t == 0) {
                u64 deadline = 0;
                if (handoff == 0) while (stored <= i && !given_up(deadline)) __nanosleep(32);
                while (ld_acquire_sys(in_flags + 16 * c) != seq && !given_up(deadline)) __nanosleep(gap);
                __threadfence_block();
            } else if (t == 1 && handoff == 1) {
                u64 deadline = 0;
                while (ld_acquire_sys(out_flags + 16 * c) != seq && !given_up(deadline)) __nanosleep(gap);
            }
            asm volatile("bar.sync 2, %0;" ::"r"(team) : "memory");
            const u64 end = min(n, (c + 1) * chunk) / 4;
            for (u64 g0 = c * chunk / 4 + t; g0 < end; g0 += 4 * team) {
                uint4 p[4];
                #pragma unroll
                for (int k = 0; k < 4; ++k) if (g0 + k * team < end) p[k] = ld4((const uint4*)in_data + g0 + k * team);
                #pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const u64 g = g0 + k * team;
                    if (g >= end) break;
                    float4 own = ((float4*)buf)[g];
                    own.x += __uint_as_float(p[k].x); own.y += __uint_as_float(p[k].y);
                    own.z += __uint_as_float(p[k].z); own.w += __uint_as_float(p[k].w);
                    ((float4*)buf)[g] = own;
                }
            }
            if (handoff == 2 && c + 4 * gridDim.x < chunks)
                asm volatile("bar.arrive %0, %1;" ::"r"(7 + i % 4), "r"(blockDim.x) : "memory");
        }
    }
}
"""

# The two-team variants, by how the folding team learns its own chunk was read (the kernel's
# `handoff`).
HANDOFFS = {"flagws": 0, "flagwh": 1, "flagwb": 2}
MAPPED_PORTABLE = 0x1 | 0x2
SIZES = [64, 2 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10]
# Flag words per half: one flag every 16 words for each chunk of the smallest chunk size at
# the largest size (set in main).
FLAG_WORDS_HALF = 8192


class Rank:
    def __init__(self, index, dev, module_src, max_bytes):
        self.index, self.dev = index, dev
        with cp.cuda.Device(dev):
            self.mod = cp.RawModule(code=module_src, options=("-arch=compute_80",))
            self.k = {n: self.mod.get_function(n) for n in ("gate", "null_kernel", "ll", "llp", "flag", "flagws")}
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.buf = cp.empty(max_bytes // 4, dtype=cp.float32)


def run(ranks, host, variant, size, calls, seq0, gate_word, max_bytes):
    """Enqueue `calls` calls of `variant` on both ranks behind gates; returns (us per call, next seq)."""
    n = size // 4
    kind, shape = variant
    gate_word[0] = 0
    starts, ends = [], []
    for r in ranks:
        with cp.cuda.Device(r.dev):
            r.k["gate"]((1,), (1,), (np.uint64(host["gate"]),), stream=r.stream)
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(r.stream)
            starts.append(e0)
            ends.append(e1)
    seq = seq0
    try:
        seq = enqueue(ranks, host, variant, size, calls, seq, max_bytes, n)
    finally:
        for r, e1 in zip(ranks, ends):
            with cp.cuda.Device(r.dev):
                e1.record(r.stream)
        gate_word[0] = 1
    us = []
    for r, e0, e1 in zip(ranks, starts, ends):
        with cp.cuda.Device(r.dev):
            e1.synchronize()
            us.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / calls)
    return max(us), seq


def enqueue(ranks, host, variant, size, calls, seq, max_bytes, n):
    kind, shape = variant
    for i in range(calls):
        seq += 1
        for r in ranks:
            me, peer = r.index, 1 - r.index
            with cp.cuda.Device(r.dev):
                if kind == "null":
                    r.k["null_kernel"]((1,), (1,), (), stream=r.stream)
                elif kind in ("ll", "llp"):
                    grid, threads, batch, gap = shape
                    args = (r.buf, np.uint64(n), np.uint64(host["lines"][me]), np.uint64(host["lines"][peer]),
                            np.uint32(seq), np.uint32(batch), np.uint32(gap), np.uint64(2 * max_bytes))
                    r.k[kind]((grid,), (threads,), args, stream=r.stream)
                else:
                    blocks, chunk, gap = shape[:3]
                    wide = kind in HANDOFFS
                    threads = shape[3] if wide else 256
                    chunks = (size + chunk - 1) // chunk
                    args = (r.buf, np.uint64(n), np.uint64(host["data"][me]), np.uint64(host["data"][peer]),
                            np.uint64(host["flags"][me]), np.uint64(host["flags"][peer]), np.uint32(seq),
                            np.uint64(chunk // 4), np.uint32(gap), np.uint64(max_bytes),
                            np.uint64(FLAG_WORDS_HALF), np.uint32(HANDOFFS[kind] if wide else kind == "flagacq"))
                    r.k["flagws" if wide else "flag"]((min(blocks, chunks),), (threads,), args, stream=r.stream)
    return seq


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--devices", default="0,1", help="the two ranks' devices (0,0: both on one, two streams)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes per call, comma-separated")
    p.add_argument("--kinds", default="null,ll,flag", help="variants to time: null, ll, llp, flag, flagacq, flagws, flagwh, flagwb")
    p.add_argument("--blocks", default="1,4,16,64", help="grid sizes of the flag variants")
    p.add_argument("--threads", default="256,512", help="threads per block of the two-team variants")
    p.add_argument("--chunks", default="512,1024,2048,4096,8192", help="chunk bytes of the flag variants")
    p.add_argument("--host", choices=("alloc", "registered"), default="alloc",
                   help="host areas from cudaHostAlloc, or /dev/shm pages registered with cudaHostRegister "
                        "(the one-process-per-GPU communicator's kind of memory)")
    args = p.parse_args()
    global FLAG_WORDS_HALF
    sizes = [int(x) for x in args.sizes.split(",")]
    kinds = args.kinds.split(",")
    chunk_sizes = [int(x) for x in args.chunks.split(",")]
    max_bytes = max(sizes)
    FLAG_WORDS_HALF = 16 * max(8192 // 16, -(-max_bytes // min(chunk_sizes)))
    ranks = [Rank(i, int(d), SOURCE, max_bytes) for i, d in enumerate(args.devices.split(","))]
    kept = []  # the registered mappings, alive for the run

    def alloc(nbytes):
        if args.host == "alloc":
            return cp.cuda.runtime.hostAlloc(nbytes, MAPPED_PORTABLE)
        nbytes = -(-nbytes // 4096) * 4096
        with tempfile.NamedTemporaryFile(dir="/dev/shm") as f:
            f.truncate(nbytes)
            m = mmap.mmap(f.fileno(), nbytes)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        cp.cuda.runtime.hostRegister(ptr, nbytes, 1 | 2)  # portable | mapped
        kept.append(m)
        return ptr

    areas = {"lines": 4 * max_bytes, "data": 2 * max_bytes, "flags": 2 * 4 * FLAG_WORDS_HALF}
    host = {"gate": alloc(64)}
    for k, nbytes in areas.items():
        host[k] = [alloc(nbytes) for _ in range(2)]
        for ptr in host[k]:
            ctypes.memset(ptr, 0, nbytes)
    gate_word = (ctypes.c_uint32 * 1).from_address(host["gate"])
    variants = [("null", ())]
    for kind in ("ll", "llp"):
        if kind in kinds:
            variants += [(kind, (g, t, b, 64)) for g in (1, 2, 4, 8) for t in (256, 512, 1024) for b in (4, 8)]
    for kind in ("flag", "flagacq"):
        if kind in kinds:
            variants += [(kind, (int(bl), ch, 64)) for bl in args.blocks.split(",") for ch in chunk_sizes]
    for kind in HANDOFFS:
        if kind in kinds:
            variants += [(kind, (int(bl), ch, 64, int(th))) for bl in args.blocks.split(",") for ch in chunk_sizes
                         for th in args.threads.split(",")]
    seqbox = [0]
    rng = np.random.default_rng(7)
    results = {}
    for size in sizes:
        for v in variants:
            if v[0] in ("ll", "llp") and size <= 2048 and v[1][0] > 1:
                continue
            times = []
            try:
                measure(ranks, host, v, size, args, rng, gate_word, max_bytes, times, seqbox)
            except Exception as e:  # a variant that cannot launch or gives wrong results
                print("%d %s%s FAILED: %s" % (size, v[0], v[1], str(e)[:200]), flush=True)
                continue
            results[(size, v)] = statistics.median(times)
            print("%d %s%s %.2f (each: %s)" % (size, v[0], v[1], results[(size, v)],
                                                 " ".join("%.1f" % t for t in times)), flush=True)
        best = sorted(((t, v) for (s, v), t in results.items() if s == size and v[0] != "null"))[:4]
        base = results.get((size, ("ll", (1, 256, 4, 64))))
        print("%7d B: null %.2f us; ll(1 block, batch 4, gap 64) %s us; best: %s" % (
            size, results[(size, ("null", ()))], base,
            ", ".join("%s%s %.2f" % (v[0], v[1], t) for t, v in best)), flush=True)


def measure(ranks, host, v, size, args, rng, gate_word, max_bytes, times, seqbox):
    n = size // 4
    for rep in range(args.repeats + 1):
        a = [(rng.standard_normal(n).astype(np.float32) * np.float32(2.0 ** -60)) for _ in range(2)]
        for r in ranks:
            with cp.cuda.Device(r.dev):
                r.buf[:n].set(a[r.index])
                cp.cuda.Device(r.dev).synchronize()
        us, seqbox[0] = run(ranks, host, v, size, args.calls, seqbox[0], gate_word, max_bytes)
        for r in ranks:
            with cp.cuda.Device(r.dev):
                word = cp.ndarray((1,), cp.uint32, memptr=r.mod.get_global("failed_word"))
                if int(word.get()[0]):
                    word.fill(0)
                    cp.cuda.Device(r.dev).synchronize()
                    raise RuntimeError("a spin gave up (rank %d)" % r.index)
        if v[0] != "null":
            want = (a[0] + a[1]) * np.float32(2.0 ** (args.calls - 1))
            for r in ranks:
                with cp.cuda.Device(r.dev):
                    got = r.buf[:n].get()
                if not np.array_equal(got, want):
                    raise RuntimeError("%s %s %d B: rank %d wrong (%d of %d)" % (v[0], v[1], size, r.index, int((got != want).sum()), n))
        if rep:
            times.append(us)

if __name__ == "__main__":
    main()
