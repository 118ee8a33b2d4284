# Zero-copy kernel beside a D2H stream: how the grid size shares the PCIe link (256 MiB each way).
# Run on the GPU machine: python3 benches/probes/zero_copy_beside_d2h.py (needs cupy). Results:
# `git show 135766c:benches/results/zero-copy-beside-d2h-h200.txt` (benches/probes/README.md); the reduce launch
# shape for mapped sources follows them.
import cupy as cp, numpy as np, statistics as st
rt = cp.cuda.runtime
MB = 1 << 20
N = 256 * MB
src = r"""
extern "C" __global__ void addh(float4* __restrict__ dst, const float4* __restrict__ src, size_t n4) {
  size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, T = (size_t)gridDim.x * blockDim.x;
  for (size_t i = t; i < n4; i += 4 * T) {
    float4 v[4];
    #pragma unroll
    for (int k = 0; k < 4; k++) { size_t j = i + k * T; if (j < n4) v[k] = src[j]; }
    #pragma unroll
    for (int k = 0; k < 4; k++) { size_t j = i + k * T; if (j < n4) { float4 d = dst[j]; d.x += v[k].x; d.y += v[k].y; d.z += v[k].z; d.w += v[k].w; dst[j] = d; } }
  }
}"""
k = cp.RawKernel(src, "addh")
hA = rt.hostAlloc(N, 3); hB = rt.hostAlloc(N, 3)
dA = cp.random.random(N // 4, dtype=cp.float32); dB = cp.random.random(N // 4, dtype=cp.float32)
s1 = cp.cuda.Stream(non_blocking=True); s2 = cp.cuda.Stream(non_blocking=True)
sms = cp.cuda.Device().attributes["MultiProcessorCount"]
def kern(stream, chunk, gps):
    n4 = chunk // 16
    for off in range(0, N, chunk):
        g = min(max(1, n4 // 1024), sms * gps)
        k((g,), (256,), (cp.uint64(dA.data.ptr + off), cp.uint64(hA + off), cp.uint64(n4)), stream=stream)
def d2h(stream, chunk):
    for off in range(0, N, chunk):
        rt.memcpyAsync(hB + off, dB.data.ptr + off, chunk, 2, stream.ptr)
def h2d(stream, chunk):
    for off in range(0, N, chunk):
        rt.memcpyAsync(dB.data.ptr + off, hA + off, chunk, 1, stream.ptr)
def timeit(fns, reps=7):
    out = []
    for r in range(reps + 2):
        ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in fns]
        for (a, b), (f, s) in zip(ev, fns):
            a.record(s); f(s); b.record(s)
        for (a, b) in ev: b.synchronize()
        if r >= 2: out.append([cp.cuda.get_elapsed_time(a, b) / 1e3 for a, b in ev])
    return [st.median(x[i] for x in out) for i in range(len(fns))]
G = lambda t: N / t / 1e9
a, b = timeit([(lambda s: h2d(s, 8 * MB), s1), (lambda s: d2h(s, 8 * MB), s2)])
print("dma duplex 8 MiB chunks: h2d %.1f d2h %.1f both-done %.1f" % (G(a), G(b), G(max(a, b))))
for gps in [1, 2, 4, 8]:
    a, b = timeit([(lambda s: kern(s, 8 * MB, gps), s1), (lambda s: d2h(s, 8 * MB), s2)])
    print("grid/sm %d, 8 MiB chunks, with d2h: kernel %.1f d2h %.1f both-done %.1f" % (gps, G(a), G(b), G(max(a, b))))
