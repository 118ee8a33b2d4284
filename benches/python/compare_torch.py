#!/usr/bin/env python3
"""geforce_p2p from Python against what torch offers, on a GPU machine with torch.

1. Copies between two GPUs, 4 KiB to 1 GiB: ``gp.copy(a, device="cuda:1", route="staged")``
   against ``a.cpu().to("cuda:1")`` (a host round trip) and ``a.to("cuda:1")`` (torch's
   device copy, P2P where the driver allows it, else the driver's own staging).
2. All-reduce (sum, float32) on two GPUs: ``gp.all_reduce`` against
   ``torch.cuda.nccl.all_reduce`` with ``NCCL_P2P_DISABLE=1`` (set before NCCL starts).
3. Python call overhead: host time per call of a tiny op (4 bytes) through Python, against
   the enqueue time ``gp2p bench`` reports for the same op through Rust (the same code,
   run in this process by ``python -m geforce_p2p``'s entry point).

Timing: CUDA events on the callers' streams; each size runs warm-up iterations first, then
timed ones, each on fresh random data, and reports the median; every timed result is
verified (bitwise: copies move bits, and a float32 sum of two values is exact once rounded).
With one GPU, copies run on that GPU (cuda:0 to cuda:0) and the two-GPU parts are skipped.

    python3 benches/python/compare_torch.py --json compare.json
    python3 benches/python/compare_torch.py -b 4K -e 64M -n 10 --json quick.json
"""

import os

# NCCL reads its environment when its first communicator starts: set before torch loads.
os.environ.setdefault("NCCL_P2P_DISABLE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import geforce_p2p as gp  # noqa: E402
from geforce_p2p import _native  # noqa: E402  (run_cli: the gp2p benches, in-process)

GB = 1e9


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1:] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def sizes(begin, end, factor):
    s = begin
    while s <= end:
        yield s
        s *= factor


def timed(run, devices, prepare, verify, warmup, iters):
    """Median milliseconds of `run()` over `iters` timed runs after `warmup` untimed ones.

    Each run: `prepare()` (fresh data, outside the timing), then a start event on the
    current stream of every device in `devices`, `run()`, an end event on each; the run's
    time is the longest start-to-end among the devices. `verify(result)` checks every
    result; the number of failures is returned beside the median."""
    times, wrong = [], 0
    for i in range(warmup + iters):
        prepared = prepare()
        for d in devices:
            torch.cuda.synchronize(d)
        starts = {d: torch.cuda.Event(enable_timing=True) for d in devices}
        ends = {d: torch.cuda.Event(enable_timing=True) for d in devices}
        for d in devices:
            starts[d].record(torch.cuda.current_stream(d))
        result = run(prepared)
        for d in devices:
            ends[d].record(torch.cuda.current_stream(d))
        for d in devices:
            torch.cuda.synchronize(d)
        if i >= warmup:
            times.append(max(starts[d].elapsed_time(ends[d]) for d in devices))
        if not verify(prepared, result):
            wrong += 1
    return statistics.median(times), wrong


def same_bits(a, b):
    return torch.equal(a.view(torch.int32), b.to(a.device).view(torch.int32))


def copy_rows(args, src, dst):
    rows = []
    dst_name = "cuda:%d" % dst
    ways = {
        "gp.copy staged": lambda a: gp.copy(a, device=dst_name, route="staged"),
        "a.cpu().to(dst)": lambda a: a.cpu().to(dst_name),
        "a.to(dst)": lambda a: a.to(dst_name),
    }
    for nbytes in sizes(args.begin, args.end, args.factor):
        n = nbytes // 4
        for name, way in ways.items():
            def prepare():
                return torch.randn(n, device="cuda:%d" % src)

            ms, wrong = timed(way, sorted({src, dst}), prepare, same_bits, args.warmup, args.iters)
            rows.append({"bench": "copy", "way": name, "src": src, "dst": dst, "bytes": nbytes,
                         "time_us": ms * 1e3, "GBps": nbytes / (ms * 1e-3) / GB, "wrong": wrong})
            print("copy %-16s %10d B %10.1f us %7.2f GB/s%s" % (
                name, nbytes, ms * 1e3, rows[-1]["GBps"], "  WRONG %d" % wrong if wrong else ""), flush=True)
    return rows


def all_reduce_rows(args):
    rows = []
    devices = [0, 1]

    def gp_sum(xs):
        gp.all_reduce(xs, op="sum")
        return xs

    def nccl_sum(xs):
        torch.cuda.nccl.all_reduce(xs)
        return xs

    ways = {"gp.all_reduce": gp_sum, "torch.cuda.nccl.all_reduce": nccl_sum}
    for nbytes in sizes(args.begin, args.end, args.factor):
        n = nbytes // 4
        for name, way in ways.items():
            def prepare():
                xs = [torch.randn(n, device="cuda:%d" % d) for d in devices]
                return xs, xs[0].cpu() + xs[1].cpu()  # the exact f32 sum, before the op

            def verify(prepared, result):
                _, expected = prepared
                return all(torch.equal(x.cpu().view(torch.int32), expected.view(torch.int32)) for x in result)

            ms, wrong = timed(lambda p: way(p[0]), devices, prepare, verify, args.warmup, args.iters)
            algbw = nbytes / (ms * 1e-3) / GB
            rows.append({"bench": "all_reduce", "way": name, "ranks": 2, "bytes": nbytes, "time_us": ms * 1e3,
                         "algbw": algbw, "busbw": algbw * 2 * (2 - 1) / 2, "wrong": wrong})
            print("all_reduce %-26s %10d B %10.1f us %7.2f GB/s busbw%s" % (
                name, nbytes, ms * 1e3, rows[-1]["busbw"], "  WRONG %d" % wrong if wrong else ""), flush=True)
    return rows


def bind_to_gpu_cpus(local):
    """Pin this process to the CPUs the kernel lists as local to GPU `local`'s PCI device (for
    the host-time benches: a process the scheduler moves between sockets times slower and more
    unevenly)."""
    props = torch.cuda.get_device_properties(local)
    bus = "%04x:%02x:%02x.0" % (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    with open("/sys/bus/pci/devices/%s/local_cpulist" % bus) as f:
        spans = f.read().strip()
    cpus = set()
    for span in spans.split(","):
        first, _, last = span.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    os.sched_setaffinity(0, cpus)
    print("process on GPU %d (%s): CPUs %s" % (local, bus, spans), flush=True)


def spin(device, ms):
    with torch.cuda.device(device):
        torch.cuda._sleep(int(ms * 1e6))


def python_call_us(call, devices, calls):
    """Median host time per call, with the devices' streams held busy by a spinning kernel
    so calls only enqueue (as gp2p bench measures its enqueue time)."""
    for d in devices:
        spin(d, 200)
    per_call = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        per_call.append(time.perf_counter() - t0)
    for d in devices:
        torch.cuda.synchronize(d)
    return statistics.median(per_call) * 1e6


def rust_enqueue_us(args_list, iters=50):
    """The enqueue time `gp2p bench` reports for one 4-byte row (median of `iters` runs),
    run in this process."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rust.json")
        sys.stdout.flush()
        code = _native.run_cli(["gp2p", "bench", *args_list, "-b", "4", "-e", "4", "-n", str(iters), "-w", "5",
                                "--json", path])
        if code != 0:
            return None
        with open(path) as f:
            rows = json.load(f)["rows"]
    return rows[0].get("enqueue_us") if rows else None


def overhead_rows(args, src, dst):
    rows = []
    a = torch.randn(1, device="cuda:%d" % src)
    b = torch.empty(1, device="cuda:%d" % dst)
    py = python_call_us(lambda: gp.copy_(b, a, route="staged"), sorted({src, dst}), args.calls)
    rust = rust_enqueue_us(["copy", "--route", "staged", "--src", str(src), "--dst", str(dst)])
    rows.append({"bench": "overhead", "op": "copy staged 4 B", "python_us_per_call": py, "rust_enqueue_us": rust})
    if torch.cuda.device_count() >= 2:
        xs = [torch.randn(1, device="cuda:%d" % d) for d in (0, 1)]
        py = python_call_us(lambda: gp.all_reduce(xs, op="sum"), [0, 1], args.calls)
        rust = rust_enqueue_us(["all-reduce", "--ranks", "2", "--op", "sum", "--dtype", "f32"])
        rows.append({"bench": "overhead", "op": "all_reduce sum f32 4 B, 2 ranks", "python_us_per_call": py,
                     "rust_enqueue_us": rust})
    for r in rows:
        print("overhead %-32s python %.1f us/call, rust enqueue %s us" % (
            r["op"], r["python_us_per_call"], "%.1f" % r["rust_enqueue_us"] if r["rust_enqueue_us"] else "?"),
            flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--begin", type=parse_size, default=4 << 10)
    parser.add_argument("-e", "--end", type=parse_size, default=1 << 30)
    parser.add_argument("-f", "--factor", type=int, default=4)
    parser.add_argument("-n", "--iters", type=int, default=10, help="timed runs per row (median)")
    parser.add_argument("-w", "--warmup", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200, help="calls timed for the overhead rows")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: copy,all_reduce,overhead")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    ndev = torch.cuda.device_count()
    if ndev == 0:
        sys.exit("needs a CUDA GPU")
    src, dst = 0, min(1, ndev - 1)
    result = {
        "gpus": [torch.cuda.get_device_name(d) for d in range(ndev)],
        "torch": torch.__version__,
        "geforce_p2p": gp.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if ndev >= 2 else None,
        "env": {"NCCL_P2P_DISABLE": os.environ.get("NCCL_P2P_DISABLE")},
        "probe": [dict(a=v["a"], b=v["b"], code=v["code"]) for v in gp.probe().verdicts],
        "repeats": {"warmup": args.warmup, "timed": args.iters},
        "rows": [],
    }
    if "copy" not in skip:
        result["rows"] += copy_rows(args, src, dst)
    if "all_reduce" not in skip:
        if ndev >= 2:
            result["rows"] += all_reduce_rows(args)
        else:
            print("all_reduce: skipped, needs two GPUs", flush=True)
    if "overhead" not in skip:
        result["rows"] += overhead_rows(args, src, dst)
    wrong = sum(r.get("wrong", 0) for r in result["rows"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print("wrote %s" % args.json)
    if wrong:
        sys.exit("%d timed results were wrong" % wrong)


if __name__ == "__main__":
    main()
