"""What a staged chunk's cross-device handoff costs: events against stream memory operations.

A staged transfer moves each chunk device -> pinned host slot on the sender's stream, then
host slot -> device on the receiver's stream; the receiver must wait until the chunk has
landed and the sender until the slot is free again. This probe pipelines 0 -> 1 (and, with
--both, 1 -> 0 at the same time: the traffic of a two-rank all-reduce) through a ring of
`slots` slots of `chunk` bytes, with the handoffs done either by CUDA events (record, then
cuStreamWaitEvent on the other device's stream: what geforce-p2p's ring does) or by stream
memory operations on flags in the same pinned memory (cuStreamWriteValue32 after the DMA,
cuStreamWaitValue32 >= generation before it). Rates are GB/s per direction; every transfer
is checked against its source (fresh random data per run).

    python3 benches/probes/chunk_sync.py [--total 64M] [--both]
"""

import argparse
import ctypes
import statistics

import cupy as cp

CU_STREAM_WAIT_VALUE_GEQ = 0x0


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


cuda = ctypes.CDLL("libcuda.so.1")
for name in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
    fn = getattr(cuda, name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    fn.restype = ctypes.c_int


HOST_ALLOC_PORTABLE_MAPPED = 0x1 | 0x2


class Pinned:
    """Pinned host memory for every device's context (portable), mapped (under unified
    addressing its host address is its device address too)."""

    def __init__(self, nbytes):
        self.ptr = cp.cuda.runtime.hostAlloc(nbytes, HOST_ALLOC_PORTABLE_MAPPED)

    def __del__(self):
        cp.cuda.runtime.freeHost(self.ptr)


def check(code, what):
    if code != 0:
        raise RuntimeError("%s failed: CUresult %d" % (what, code))


class Pipe:
    """One direction: src on device a, dst on device b, a ring of slots in pinned memory."""

    def __init__(self, a, b, total, chunk, slots):
        self.a, self.b, self.total, self.chunk, self.slots = a, b, total, chunk, slots
        with cp.cuda.Device(a):
            self.src = cp.empty(total // 4, dtype=cp.uint32)
            self.sa = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.Device(b):
            self.dst = cp.empty(total // 4, dtype=cp.uint32)
            self.sb = cp.cuda.Stream(non_blocking=True)
        self.host = Pinned(slots * chunk)
        # Flags: landed[slot], free[slot] as u32, 64 bytes apart.
        self.flags = Pinned(2 * slots * 64)
        self.flag_view = (ctypes.c_uint32 * (2 * slots * 16)).from_address(self.flags.ptr)
        self.events = None
        self.generation_of = [0] * slots

    def fill(self, seed):
        with cp.cuda.Device(self.a):
            cp.random.seed(seed)
            self.src[...] = cp.random.randint(0, 2**32 - 1, size=self.src.size, dtype=cp.uint64).astype(cp.uint32)
            cp.cuda.Device(self.a).synchronize()

    def flag(self, kind, slot):
        return self.flags.ptr + (kind * self.slots + slot) * 64

    def chunks(self):
        return self.total // self.chunk

    def enqueue(self, mode, i):
        """Chunk i: D2H into its slot on device a, H2D out of it on device b."""
        if mode == "events":
            if self.events is None:
                self.events = {}
                for slot in range(self.slots):
                    with cp.cuda.Device(self.a):
                        landed = cp.cuda.Event(disable_timing=True)
                    with cp.cuda.Device(self.b):
                        free = cp.cuda.Event(disable_timing=True)
                    self.events[slot] = (landed, free, [False])
        slot = i % self.slots
        host = self.host.ptr + slot * self.chunk
        if mode == "events":
            landed, free, used = self.events[slot]
            with cp.cuda.Device(self.a):
                if used[0]:
                    self.sa.wait_event(free)
                cp.cuda.runtime.memcpyAsync(host, self.src.data.ptr + i * self.chunk, self.chunk, 2, self.sa.ptr)
                landed.record(self.sa)
            with cp.cuda.Device(self.b):
                self.sb.wait_event(landed)
                cp.cuda.runtime.memcpyAsync(self.dst.data.ptr + i * self.chunk, host, self.chunk, 1, self.sb.ptr)
                free.record(self.sb)
            used[0] = True
        else:
            # Generation g of a slot: landed reaches g when the chunk is in, free reaches g
            # when the receiver is done with it.
            g = self.generation_of[slot] + 1
            self.generation_of[slot] = g
            with cp.cuda.Device(self.a):
                if g > 1:
                    check(cuda.cuStreamWaitValue32_v2(self.sa.ptr, self.flag(1, slot), g - 1,
                                                      CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")
                cp.cuda.runtime.memcpyAsync(host, self.src.data.ptr + i * self.chunk, self.chunk, 2, self.sa.ptr)
                check(cuda.cuStreamWriteValue32_v2(self.sa.ptr, self.flag(0, slot), g, 0), "cuStreamWriteValue32")
            with cp.cuda.Device(self.b):
                check(cuda.cuStreamWaitValue32_v2(self.sb.ptr, self.flag(0, slot), g, CU_STREAM_WAIT_VALUE_GEQ),
                      "cuStreamWaitValue32")
                cp.cuda.runtime.memcpyAsync(self.dst.data.ptr + i * self.chunk, host, self.chunk, 1, self.sb.ptr)
                check(cuda.cuStreamWriteValue32_v2(self.sb.ptr, self.flag(1, slot), g, 0), "cuStreamWriteValue32")

    def reset_flags(self):
        for i in range(len(self.flag_view)):
            self.flag_view[i] = 0
        self.generation_of = [0] * self.slots

    def sync(self):
        self.sa.synchronize()
        self.sb.synchronize()

    def verify(self):
        with cp.cuda.Device(self.a):
            want = int(cp.sum(self.src.astype(cp.uint64))), int(cp.sum(self.src[::4097].astype(cp.uint64)))
        with cp.cuda.Device(self.b):
            got = int(cp.sum(self.dst.astype(cp.uint64))), int(cp.sum(self.dst[::4097].astype(cp.uint64)))
        if want != got:
            raise SystemExit("wrong data: %s -> %s, chunk %d, slots %d" % (self.a, self.b, self.chunk, self.slots))


class Gate:
    """A flag in pinned memory that streams wait on (cuStreamWaitValue32) until the host sets
    it: every chunk is enqueued before any DMA starts, so the host's enqueue speed (Python
    here) does not set the rate."""

    def __init__(self):
        self.memory = Pinned(64)
        self.value = ctypes.c_uint32.from_address(self.memory.ptr)

    def close(self, device, stream):
        self.value.value = 0
        with cp.cuda.Device(device):
            check(cuda.cuStreamWaitValue32_v2(stream.ptr, self.memory.ptr, 1, CU_STREAM_WAIT_VALUE_GEQ), "gate")

    def open(self):
        self.value.value = 1


def timed(pipes, mode, runs, warmup, gate):
    """GB/s per direction, host clock from the gate's opening to every direction done."""
    import time
    rates = []
    for r in range(warmup + runs):
        for p in pipes:
            p.fill(1000 * r + p.a)
            with cp.cuda.Device(p.b):
                p.dst.fill(0)
            p.reset_flags()
        for d in (0, 1):
            cp.cuda.Device(d).synchronize()
        for p in pipes:
            gate.close(p.a, p.sa)
            gate.close(p.b, p.sb)
        # The directions' chunks interleaved, as one host thread enqueues an all-reduce.
        for i in range(pipes[0].chunks()):
            for p in pipes:
                p.enqueue(mode, i)
        t0 = time.perf_counter()
        gate.open()
        for p in pipes:
            p.sync()
        dt = time.perf_counter() - t0
        for p in pipes:
            p.verify()
        if r >= warmup:
            rates.append(pipes[0].total / dt / 1e9)
    return statistics.median(rates)


def bulk(total, both):
    """One D2H of `total` on device 0 (and one on device 1 with --both): the one-way rate."""
    import time
    host = [Pinned(total) for _ in range(2)]
    srcs, streams = [], []
    for d in (0, 1) if both else (0,):
        with cp.cuda.Device(d):
            srcs.append(cp.ones(total // 4, dtype=cp.uint32))
            streams.append(cp.cuda.Stream(non_blocking=True))
    rates = []
    for _ in range(5):
        for d in range(len(srcs)):
            cp.cuda.Device(d).synchronize()
        t0 = time.perf_counter()
        for d, (s, st) in enumerate(zip(srcs, streams)):
            with cp.cuda.Device(d):
                cp.cuda.runtime.memcpyAsync(host[d].ptr, s.data.ptr, total, 2, st.ptr)
        for st in streams:
            st.synchronize()
        rates.append(total / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total", default="64M", help="bytes per direction (every chunk is queued at once)")
    ap.add_argument("--both", action="store_true", help="also 1 -> 0 at the same time")
    ap.add_argument("-n", "--runs", type=int, default=5)
    ap.add_argument("--chunks", default="1M,2M,4M", help="chunk sizes, comma-separated")
    ap.add_argument("--slots", default="2,4", help="slot counts, comma-separated")
    ap.add_argument("--modes", default="events,memops")
    args = ap.parse_args()
    total = parse_size(args.total)
    print("bulk D2H %s: %.1f GB/s per card" % (args.total, bulk(total, args.both)))
    print("%-8s %6s %5s %10s" % ("mode", "chunk", "slots", "GB/s/dir"))
    gate = Gate()
    for chunk in args.chunks.split(","):
        for slots in map(int, args.slots.split(",")):
            c = parse_size(chunk)
            pipes = [Pipe(0, 1, total, c, slots)] + ([Pipe(1, 0, total, c, slots)] if args.both else [])
            for mode in args.modes.split(","):
                rate = timed(pipes, mode, args.runs, 1, gate)
                print("%-8s %6s %5d %10.1f" % (mode, chunk, slots, rate), flush=True)
            del pipes


if __name__ == "__main__":
    main()
