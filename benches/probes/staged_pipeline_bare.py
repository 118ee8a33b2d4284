# A bare staged pipeline (cupy, runtime API) beside the duplex ceiling, alternating in one
# process: tells whether run-to-run spread of `gp2p bench copy` at 1 GiB is the library's
# or the machine's. Run on the GPU machine: python3 benches/probes/staged_pipeline_bare.py [rounds]
# Pipeline: 1 GiB device -> 4 pinned slots of 16 MiB -> device; D2H on one stream, H2D on
# another, one event from landing to upload and one from upload to slot reuse (as the issue's
# calibration pipeline). Duplex: 64 transfers of 16 MiB each way on two streams, no
# dependencies, rate over the middle half (as gp2p's measure.rs). Data is random and checked.
import sys, statistics as st
import cupy as cp
rt = cp.cuda.runtime
MB = 1 << 20
N, C, SLOTS = 1 << 30, 16 * MB, 4
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
spin = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64(); while (clock64() - t0 < cycles) {}
}""", "spin")
src = cp.random.randint(0, 2**31, N // 4, dtype=cp.int32)
dst = cp.zeros(N // 4, dtype=cp.int32)
dup_dev = cp.empty(N // 4, dtype=cp.int32)
slots = rt.hostAlloc(SLOTS * C, 0)
dup_host = rt.hostAlloc(SLOTS * C, 0)
main = cp.cuda.Stream(non_blocking=True)
up, down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
landed = [cp.cuda.Event(disable_timing=True) for _ in range(SLOTS)]
free = [cp.cuda.Event(disable_timing=True) for _ in range(SLOTS)]

def gate():
    # ~2 ms of spinning so everything after is enqueued before the GPU reaches it.
    spin((1,), (1,), (cp.int64(4_000_000),), stream=main)

def pipeline():
    gate()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(main); up.wait_event(start); down.wait_event(start)
    for k in range(N // C):
        s = k % SLOTS
        if k >= SLOTS:
            up.wait_event(free[s])
        rt.memcpyAsync(slots + s * C, src.data.ptr + k * C, C, 2, up.ptr)
        landed[s].record(up)
        down.wait_event(landed[s])
        rt.memcpyAsync(dst.data.ptr + k * C, slots + s * C, C, 1, down.ptr)
        free[s].record(down)
    ends = cp.cuda.Event(disable_timing=True); ends.record(up); main.wait_event(ends)
    ends2 = cp.cuda.Event(disable_timing=True); ends2.record(down); main.wait_event(ends2)
    end.record(main); end.synchronize()
    return N / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e9

def duplex():
    gate()
    start = cp.cuda.Event(); start.record(main)
    marks = []
    for d, s in enumerate((up, down)):
        s.wait_event(start)
        m = []
        for i in range(64):
            host = dup_host + (i % SLOTS) * C
            if d == 0:
                rt.memcpyAsync(host, src.data.ptr + i * C, C, 2, s.ptr)
            else:
                host = dup_host + ((i + SLOTS // 2) % SLOTS) * C
                rt.memcpyAsync(dup_dev.data.ptr + i * C, host, C, 1, s.ptr)
            e = cp.cuda.Event(); e.record(s); m.append(e)
        marks.append(m)
    for m in marks: m[-1].synchronize()
    rates = [(48 - 16) * C / (cp.cuda.get_elapsed_time(m[16], m[48]) / 1e3) / 1e9 for m in marks]
    return (rates[0] + rates[1]) / 2

pipeline(); duplex()
rows = []
for r in range(ROUNDS):
    dst.fill(0); main.synchronize()
    p = pipeline()
    ok = bool((dst == src).all())
    d = duplex()
    rows.append((d, p, ok))
    print(f"round {r}: duplex {d:.2f} GB/s  bare pipeline {p:.2f} GB/s  ratio {p / d:.3f}  verified {ok}", flush=True)
print(f"median: duplex {st.median(x[0] for x in rows):.2f}  pipeline {st.median(x[1] for x in rows):.2f}  "
      f"ratio {st.median(x[1] / x[0] for x in rows):.3f}  min ratio {min(x[1] / x[0] for x in rows):.3f}")
