"""Can pinned host memory come from a stream-ordered pool (cuMemPoolCreate with a host
location) instead of cuMemHostAlloc, whose free (cuMemFreeHost) waits for the whole device?
Asks the driver directly (ctypes), beside torch for device memory and a spinning kernel:

- does a host pool exist on this driver, and can each device be granted access to it;
- what cuPointerGetAttributes says the memory is, and whether cuMemHostGetDevicePointer
  knows it (the library maps pinned memory into kernels that way);
- DMA rates into and out of it against cuMemHostAlloc memory (64 MiB, medians of 10);
- a kernel on each device reading it directly (zero-copy), checked element by element;
- a cuMemFreeAsync of it while another stream spins for 300 ms: how long the free and the
  next driver call on this thread take (cuMemFreeHost waits out the spin).

    python3 benches/probes/host_pool_probe.py"""

import ctypes
import statistics
import time

import torch

cu = ctypes.CDLL("libcuda.so.1")
c_u64, c_int, c_size = ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t


def check(code, what):
    if code != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(code, ctypes.byref(name))
        raise RuntimeError("%s: %d %s" % (what, code, name.value))


class Location(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


class PoolProps(ctypes.Structure):
    _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("location", Location),
                ("win32", ctypes.c_void_p), ("maxSize", c_size), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 54)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", c_int)]


PINNED, LOC_DEVICE, LOC_HOST, RW = 1, 1, 2, 3
MEMTYPE, RANGE_START, RANGE_SIZE = 2, 11, 12


def main():
    n = torch.cuda.device_count()
    for d in range(n):
        torch.zeros(1, device="cuda:%d" % d)  # primary contexts up
    torch.cuda.set_device(0)
    pool = ctypes.c_void_p()
    props = PoolProps(allocType=PINNED, handleTypes=0, location=Location(LOC_HOST, 0))
    check(cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(props)), "cuMemPoolCreate(host)")
    keep = c_u64(256 << 20)
    check(cu.cuMemPoolSetAttribute(pool, 4, ctypes.byref(keep)), "release threshold")  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    for d in range(n):
        desc = AccessDesc(Location(LOC_DEVICE, d), RW)
        check(cu.cuMemPoolSetAccess(pool, ctypes.byref(desc), c_size(1)), "cuMemPoolSetAccess(cuda:%d)" % d)
    print("host pool made, access granted to %d device(s)" % n)
    stream = ctypes.c_void_p()
    check(cu.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    size = 64 << 20
    ptr = c_u64()
    check(cu.cuMemAllocFromPoolAsync(ctypes.byref(ptr), c_size(size), pool, stream), "cuMemAllocFromPoolAsync")
    check(cu.cuStreamSynchronize(stream), "sync")
    mtype, start, rsize = ctypes.c_uint(0), c_u64(0), c_size(0)
    attrs = (c_int * 3)(MEMTYPE, RANGE_START, RANGE_SIZE)
    data = (ctypes.c_void_p * 3)(ctypes.cast(ctypes.byref(mtype), ctypes.c_void_p),
                                 ctypes.cast(ctypes.byref(start), ctypes.c_void_p),
                                 ctypes.cast(ctypes.byref(rsize), ctypes.c_void_p))
    code = cu.cuPointerGetAttributes(3, attrs, data, ptr)
    print("cuPointerGetAttributes: code %d, memory type %d (1 host, 2 device), range %#x + %d (alloc %#x)"
          % (code, mtype.value, start.value, rsize.value, ptr.value))
    dptr = c_u64()
    code = cu.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(ptr.value), 0)
    print("cuMemHostGetDevicePointer: code %d, device pointer %#x (host %#x)" % (code, dptr.value, ptr.value))
    # CPU access.
    ctypes.memset(ptr.value, 0x5A, size)
    assert ctypes.string_at(ptr.value + size - 16, 16) == b"\x5a" * 16, "the CPU reads back what it wrote"
    # DMA rates against cuMemHostAlloc memory.
    legacy = ctypes.c_void_p()
    check(cu.cuMemHostAlloc(ctypes.byref(legacy), c_size(size), 3), "cuMemHostAlloc")  # PORTABLE | DEVICEMAP
    for d in range(n):
        dev = torch.empty(size, dtype=torch.uint8, device="cuda:%d" % d)
        s = torch.cuda.Stream(device=d)
        raw = ctypes.c_void_p(s.cuda_stream)
        for name, host in (("pool", ptr.value), ("cuMemHostAlloc", legacy.value)):
            rates = {}
            for way in ("d2h", "h2d"):
                ts = []
                for i in range(12):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(s)
                    if way == "d2h":
                        check(cu.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(host), c_u64(dev.data_ptr()), c_size(size), raw), way)
                    else:
                        check(cu.cuMemcpyHtoDAsync_v2(c_u64(dev.data_ptr()), ctypes.c_void_p(host), c_size(size), raw), way)
                    b.record(s)
                    s.synchronize()
                    if i >= 2:
                        ts.append(a.elapsed_time(b) / 1e3)
                rates[way] = size / statistics.median(ts) / 1e9
            print("cuda:%d %-15s d2h %.1f GB/s, h2d %.1f GB/s" % (d, name, rates["d2h"], rates["h2d"]))
    # Zero-copy: a kernel on each device reads the pool memory through a torch view of it.
    words = size // 4
    want = torch.randint(-2**31, 2**31 - 1, (words,), dtype=torch.int32)
    ctypes.memmove(ptr.value, want.data_ptr(), size)
    for d in range(n):
        storage = torch.cuda.Stream(device=d)
        dst = torch.empty(words, dtype=torch.int32, device="cuda:%d" % d)
        with torch.cuda.stream(storage):
            # cuMemcpyDtoD from the pool address reads it as device-visible memory.
            check(cu.cuMemcpyDtoDAsync_v2(c_u64(dst.data_ptr()), ptr, c_size(size), ctypes.c_void_p(storage.cuda_stream)), "dtod")
        storage.synchronize()
        print("cuda:%d reads the pool memory by its address: %s" % (d, torch.equal(dst.cpu(), want)))
    # A free while another stream spins.
    spinner = torch.cuda.Stream(device=0)
    with torch.cuda.stream(spinner):
        torch.cuda._sleep(int(300e6))
    t0 = time.perf_counter()
    check(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
    t1 = time.perf_counter()
    ev = ctypes.c_void_p()
    check(cu.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")
    check(cu.cuEventRecord(ev, stream), "cuEventRecord")
    t2 = time.perf_counter()
    print("cuMemFreeAsync while another stream spins 300 ms: %.1f us; the next driver call %.1f us"
          % ((t1 - t0) * 1e6, (t2 - t1) * 1e6))
    spinner.synchronize()
    with torch.cuda.stream(spinner):
        torch.cuda._sleep(int(300e6))
    t0 = time.perf_counter()
    check(cu.cuMemFreeHost(legacy), "cuMemFreeHost")
    t1 = time.perf_counter()
    print("cuMemFreeHost while another stream spins 300 ms: %.1f us" % ((t1 - t0) * 1e6))
    spinner.synchronize()


if __name__ == "__main__":
    main()
