"""Host cost of the driver calls one enqueued operation makes, each timed alone in a loop
through ctypes (the loop's own overhead, a no-op ctypes call, is printed first), to tell the
driver's share of an enqueue from the library's bookkeeping.

    python3 benches/probes/driver_call_costs.py [--calls 20000]
"""

import argparse
import ctypes
import time

import cupy as cp

cuda = ctypes.CDLL("libcuda.so.1")


def timed(name, call, calls):
    for _ in range(100):
        call()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    us = (time.perf_counter() - t0) * 1e6 / calls
    print("%-34s %6.3f us" % (name, us), flush=True)
    return us


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args()
    cp.cuda.Device(0).use()
    mod = cp.RawModule(code='extern "C" __global__ void null_kernel(unsigned long long a, unsigned long long b) {}')
    fn = mod.get_function("null_kernel")
    stream = cp.cuda.Stream(non_blocking=True)
    raw = ctypes.c_void_p(stream.ptr)
    ctx = ctypes.c_void_p()
    assert cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    status = ctypes.c_int()
    sid = ctypes.c_ulonglong()
    event = ctypes.c_void_p()
    assert cuda.cuEventCreate(ctypes.byref(event), 2) == 0  # CU_EVENT_DISABLE_TIMING
    a, b = ctypes.c_ulonglong(1), ctypes.c_ulonglong(2)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(a), ctypes.c_void_p), ctypes.cast(ctypes.byref(b), ctypes.c_void_p))
    func = ctypes.c_void_p(fn.kernel.ptr)  # cupy.cuda.function.Function: the CUfunction
    launch = cuda.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    n = args.calls
    timed("ctypes no-op (cuDriverGetVersion)", lambda: cuda.cuDriverGetVersion(ctypes.byref(status)), n)
    timed("cuCtxSetCurrent", lambda: cuda.cuCtxSetCurrent(ctx), n)
    timed("cuStreamIsCapturing", lambda: cuda.cuStreamIsCapturing(raw, ctypes.byref(status)), n)
    timed("cuStreamGetId", lambda: cuda.cuStreamGetId(raw, ctypes.byref(sid)), n)
    timed("cuEventQuery", lambda: cuda.cuEventQuery(event), n)
    # Enqueues: in batches, with a synchronise between, so the queue never fills.
    for name, call in (
        ("cuEventRecord", lambda: cuda.cuEventRecord(event, raw)),
        ("cuStreamWaitEvent", lambda: cuda.cuStreamWaitEvent(raw, event, 0)),
        ("cuLaunchKernel (2 u64 params, 1x1)", lambda: launch(func, 1, 1, 1, 1, 1, 1, 0, raw, params, None)),
        ("cuLaunchKernel (2 u64 params, 64x256)", lambda: launch(func, 64, 1, 1, 256, 1, 1, 0, raw, params, None)),
    ):
        code = call()
        if code != 0:
            raise SystemExit("%s failed: CUresult %d" % (name, code))
        total = 0.0
        for _ in range(20):
            total += _batch(call, 500)
            stream.synchronize()
        print("%-34s %6.3f us (mean of 20 batches of 500)" % (name, total / 20), flush=True)
    # Launching work recorded once: a graph of k null kernels, one after another, captured
    # from the stream and launched with cuGraphLaunch (what replaying an enqueued plan costs).
    for k in (1, 2, 4):
        stream.begin_capture()
        with stream:
            for _ in range(k):
                fn((1,), (1,), (cp.uint64(1), cp.uint64(2)))
        graph = stream.end_capture()
        graph.upload(stream)
        exec_handle = ctypes.c_void_p(graph.graphExec)
        call = lambda: cuda.cuGraphLaunch(exec_handle, raw)
        if call() != 0:
            raise SystemExit("cuGraphLaunch failed")
        total = 0.0
        for _ in range(20):
            total += _batch(call, 200)
            stream.synchronize()
        print("cuGraphLaunch (%d null kernels)       %6.3f us (mean of 20 batches of 200)" % (k, total / 20), flush=True)
    # The GPU's side: back-to-back launches of a null kernel against replays of a one-kernel
    # graph, timed by events around 200 of each (GPU microseconds per launch), queued behind
    # a 20 ms spin so that the GPU, not the host, sets the pace.
    spin = cp.RawModule(code='''extern "C" __global__ void spin(long long cycles) {
        long long t0 = clock64(); while (clock64() - t0 < cycles) {} }''').get_function("spin")
    single = None
    stream.begin_capture()
    with stream:
        fn((1,), (1,), (cp.uint64(1), cp.uint64(2)))
    single = stream.end_capture()
    single.upload(stream)
    single_exec = ctypes.c_void_p(single.graphExec)
    for name, call in (
        ("null kernels launched", lambda: launch(func, 1, 1, 1, 1, 1, 1, 0, raw, params, None)),
        ("one-kernel graphs replayed", lambda: cuda.cuGraphLaunch(single_exec, raw)),
        ("event record + kernel launched", lambda: (cuda.cuEventRecord(event, raw), launch(func, 1, 1, 1, 1, 1, 1, 0, raw, params, None))),
        ("event record + graph replayed", lambda: (cuda.cuEventRecord(event, raw), cuda.cuGraphLaunch(single_exec, raw))),
    ):
        gpu = []
        for _ in range(5):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            stream.synchronize()
            with stream:
                spin((1,), (1,), (cp.int64(40_000_000),))
            start.record(stream)
            for _ in range(200):
                call()
            end.record(stream)
            end.synchronize()
            gpu.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / 200)
        gpu.sort()
        print("GPU time per op, %-32s %6.3f us (median of 5 x 200)" % (name, gpu[2]), flush=True)
    # Launch after the stream went idle (each launch then synchronised, not timed).
    total = 0.0
    for _ in range(200):
        stream.synchronize()
        t0 = time.perf_counter()
        launch(func, 1, 1, 1, 1, 1, 1, 0, raw, params, None)
        total += time.perf_counter() - t0
    print("cuLaunchKernel (1x1) on an idle stream %6.3f us (mean of 200)" % (total / 200 * 1e6), flush=True)


def _batch(call, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) * 1e6 / calls


if __name__ == "__main__":
    main()
