"""What the host's memory delivers, three ways, to tell whether `gp2p plan --measure`'s DRAM
figure (every core copying 512 MiB) is the memory controllers' limit or the cores':

1. cores copying: GB/s (read + written) by thread count and buffer size;
2. the GPU's DMAs: D2H into one pinned buffer while H2D reads another, by buffer size;
3. both at once: the DMAs of 2 while every core copies as in 1.

If the cores' rate keeps growing with threads, or the DMAs lose nothing while the cores copy,
the cores, not the controllers, set the measured figure.

    python3 benches/probes/dram_rate.py [--sizes 48M,192M,512M]
"""

import argparse
import os
import threading
import time

import cupy as cp
import numpy as np


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def cores_copy_gbps(src, dst, threads, repeats=5, stop=None):
    """Fastest of `repeats` copies of src into dst split among `threads` threads (numpy
    releases the GIL for the copy); with `stop`, copy until it is set and return the mean."""
    share = -(-src.size // threads)
    parts = [(dst[i : i + share], src[i : i + share]) for i in range(0, src.size, share)]

    def one_copy():
        workers = [threading.Thread(target=np.copyto, args=p) for p in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    if stop is not None:
        copies, t0 = 0, time.perf_counter()
        while not stop.is_set():
            one_copy()
            copies += 1
        return 2.0 * src.nbytes * copies / (time.perf_counter() - t0) / 1e9
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        one_copy()
        best = min(best, time.perf_counter() - t0)
    assert np.array_equal(dst[:: 1 << 16], src[:: 1 << 16])
    return 2.0 * src.nbytes / best / 1e9


def pinned(nbytes):
    mem = cp.cuda.alloc_pinned_memory(nbytes)
    return mem, np.frombuffer(mem, dtype=np.uint8, count=nbytes)


def dma_gbps(nbytes, rounds=10):
    """D2H into one pinned buffer and H2D from another at once, each on its own stream:
    GB/s each way (the slower direction's time)."""
    _, up_host = pinned(nbytes)
    _, down_host = pinned(nbytes)
    down_host[:] = 7
    dev_a = cp.empty(nbytes, dtype=cp.uint8)
    dev_b = cp.empty(nbytes, dtype=cp.uint8)
    dev_a.fill(3)
    s_up, s_down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    for _ in range(rounds):
        cp.cuda.runtime.memcpyAsync(up_host.ctypes.data, dev_a.data.ptr, nbytes, 2, s_up.ptr)
        cp.cuda.runtime.memcpyAsync(dev_b.data.ptr, down_host.ctypes.data, nbytes, 1, s_down.ptr)
    s_up.synchronize()
    s_down.synchronize()
    seconds = time.perf_counter() - t0
    assert up_host[nbytes // 2] == 3 and int(dev_b[nbytes // 2]) == 7
    return nbytes * rounds / seconds / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="48M,192M,512M")
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    threads = sorted({1, 2, 4, 8, cores // 2, cores} - {0})
    print("host: %d cores usable; GB/s = bytes read + written per second" % cores)
    for size in args.sizes.split(","):
        nbytes = parse_size(size)
        src = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
        dst = np.zeros(nbytes, dtype=np.uint8)
        row = ["%d threads %.1f" % (t, cores_copy_gbps(src, dst, t)) for t in threads]
        print("cores copying %-5s: %s" % (size, ", ".join(row)), flush=True)
        each_way = dma_gbps(nbytes)
        print("DMA alone     %-5s: %.1f GB/s each way (%.1f GB/s of host memory)" % (size, each_way, 2 * each_way))
        stop = threading.Event()
        result = {}
        copier = threading.Thread(target=lambda: result.setdefault("cores", cores_copy_gbps(src, dst, cores, stop=stop)))
        copier.start()
        time.sleep(0.05)
        each_way = dma_gbps(nbytes, rounds=20)
        stop.set()
        copier.join()
        print(
            "both at once  %-5s: DMA %.1f GB/s each way + cores %.1f GB/s = %.1f GB/s of host memory"
            % (size, each_way, result["cores"], 2 * each_way + result["cores"]),
            flush=True,
        )


if __name__ == "__main__":
    main()
