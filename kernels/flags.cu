// gp2p flag kernels: a bounded wait on a flag (or on several at once, gp2p_wait_flags) in mapped pinned host memory, for pipelines
// between processes that share staging memory (the communicator's large messages): one
// thread waits until `*flag == value`, then the stream goes on. The flags are handshakes (a
// slot's sender sets its flag to 1 once the slot holds a chunk, its receiver back to 0 once
// it has read it), so a call waits for the same values every time and a CUDA graph that
// captured it can be replayed. A wait longer than `timeout_ns` sets `*failed` (this rank's)
// and `*broken` (the communicator's, which every rank's waits read) to 1 and returns; a
// wait that finds either set (it looks every GIVE_UP_CHECK_POLLS polls) returns: the
// handshakes may no longer pair up, so one lost peer costs one timeout, not one per chunk,
// and both ranks' hosts report it at their next call.
//
// Built by `cargo xtask ptx` with NVRTC 12.0 for compute_80 (flags.ptx) and compute_75
// (flags.compute_75.ptx); the clock and the give-up cadence are in common.cuh.

#include "common.cuh"

#define WAIT_POLL_GAP_NS 256

// Polls `*flag` until it equals `value`: true then; false once the wait gave up (past its
// deadline, which the first poll that misses sets: `*failed` and `*broken` are set to 1) or
// found either word set. `deadline` and `polls` carry over from one flag to the next.
__device__ __forceinline__ bool poll_flag(const u32* flag, u32 value, u64 timeout_ns, u32* failed, u32* broken,
                                          u64& deadline, u32& polls) {
    while (*(const volatile u32*)flag != value) {
        if (++polls % GIVE_UP_CHECK_POLLS == 0 && (*(volatile u32*)failed != 0 || *(volatile u32*)broken != 0))
            return false;
        const u64 now = global_ns();
        if (deadline == 0) {
            deadline = now + timeout_ns;
        } else if (now > deadline) {
            *(volatile u32*)failed = 1;
            *(volatile u32*)broken = 1;
            return false;
        }
        __nanosleep(WAIT_POLL_GAP_NS);
    }
    return true;
}

extern "C" __global__ void gp2p_wait_flag(const u32* flag, u32 value, u64 timeout_ns, u32* failed, u32* broken) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u64 deadline = 0;
    u32 polls = 0;
    if (!poll_flag(flag, value, timeout_ns, failed, broken, deadline, polls)) return;
    // Whatever this stream does next reads what the flag guards.
    __threadfence_system();
}

// The same wait on `count` consecutive flags at once: the stream goes on once every one is
// `value` (a pipeline slot read by one of several ranks, each with its own flag: the writer
// waits until every reader has let go of it). One thread, one launch however many readers.
extern "C" __global__ void gp2p_wait_flags(const u32* flags, u32 count, u32 value, u64 timeout_ns, u32* failed,
                                           u32* broken) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u64 deadline = 0;
    u32 polls = 0;
    for (u32 i = 0; i < count; ++i) {
        if (!poll_flag(flags + i, value, timeout_ns, failed, broken, deadline, polls)) return;
    }
    __threadfence_system();
}

// A stamp of the GPU's global clock (nanoseconds, one clock for every context on the device,
// so the stamps of processes sharing it line up) into `*at`, once the work queued before it on
// its stream is done: the marks of a call's timeline (gp2p_cuda::Timeline), which say where a
// call's time goes on the GPU, where no profiler runs.
extern "C" __global__ void gp2p_stamp(u64* at) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    *at = global_ns();
}
