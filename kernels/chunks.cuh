// gp2p flagged-chunk kernels' shared parts: the chunk and flag sizes, the bounded wait for a
// flag across the bus, the 16-byte volatile load, and the end of a call's numbering. Included
// by chunks.cu (two ranks) and chunks_many.cu (3 to 8), whose headers say how they use them.

#pragma once

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
// other GPU, are visible to whatever this thread reads after seeing the flag, and to the
// threads a barrier after the load passes it on to (the block's in chunks.cu, the warp's in
// chunks_many.cu).
__device__ __forceinline__ u32 load_acquire_sys(const u32* at) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(at) : "memory");
    return v;
}

// One thread's bounded wait for a peer's flag of a chunk: whether it arrived. Two bounds: the
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
// 16-byte peer loads a thread keeps in flight (the two-rank fold, the many-rank copy): a
// load across the bus takes about a microsecond, and volatile loads are not moved past the
// stores that use them.
#define CHUNK_FOLD_UNROLL 4

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
