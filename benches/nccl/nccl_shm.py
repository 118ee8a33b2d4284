#!/usr/bin/env python3
"""NCCL beside gp2p: all_reduce and all_gather through PyTorch's single-process NCCL
binding (torch.cuda.nccl) over every visible GPU, with P2P disabled so NCCL takes its
shared-memory path through host memory -- what a GeForce pair gets.

Timed like `gp2p bench`: each stream held by a spin kernel until the run is enqueued, CUDA
events around the collective only, median of --iters runs after --warmup, fresh random data,
every result checked. Prints nccl-tests columns and writes --json (same row fields as
gp2p's reports: bench, route, dtype, op, ranks, bytes, time_us, algbw, busbw, wrong).

Usage (on a machine with two or more GPUs):
    python3 benches/nccl/nccl_shm.py -b 8 -e 1G -f 4 --json nccl.json
Written for the issue-6 run; not yet run (no two-GPU machine so far).
"""
import argparse
import json
import os

# Must be set before NCCL initialises: no P2P, so NCCL goes through host shared memory.
os.environ.setdefault("NCCL_P2P_DISABLE", "1")

import torch  # noqa: E402
import torch.cuda.nccl as nccl  # noqa: E402


# Spin long enough (about 2 ms at 2 GHz) for Python to enqueue one timed run behind it.
GATE_CYCLES = 4_000_000


def parse_size(text):
    text = text.strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def sweep(begin, end, factor):
    size = begin
    while size <= end:
        yield size
        size *= factor


def median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def timed(devices, fn, warmup, iters, setup=lambda: None):
    """Median seconds of fn() across all devices, timed as `gp2p bench` times: each device's
    current stream is held by a spin kernel while setup(), the start events, fn() and the
    end events are enqueued, so the events bracket GPU work only (not Python's enqueueing,
    which `gp2p bench` reports apart); a run lasts from the earliest start to the latest end."""
    for _ in range(warmup):
        setup()
        fn()
    times = []
    for _ in range(iters):
        for d in devices:
            with torch.cuda.device(d):
                torch.cuda._sleep(GATE_CYCLES)
        setup()
        starts, ends = [], []
        for d in devices:
            with torch.cuda.device(d):
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                starts.append(e)
        fn()
        for d in devices:
            with torch.cuda.device(d):
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                ends.append(e)
        for d in devices:
            torch.cuda.synchronize(d)
        # Events of different devices cannot be compared; take the slowest device.
        times.append(max(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3)
    return median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-b", "--begin", default="8")
    ap.add_argument("-e", "--end", default="1G")
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    devices = list(range(torch.cuda.device_count()))
    n = len(devices)
    if n < 2:
        raise SystemExit(f"needs two or more GPUs, found {n}")
    rows = []
    print(f"# NCCL {torch.cuda.nccl.version()} via torch {torch.__version__}, {n} GPUs, "
          f"NCCL_P2P_DISABLE={os.environ['NCCL_P2P_DISABLE']}")
    print(f"# {'bench':>10} {'size':>12} {'count':>11} {'time us':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6}")
    for bench in ("all_reduce", "all_gather"):
        for size in sweep(parse_size(args.begin), parse_size(args.end), args.factor):
            count = size // 4
            if bench == "all_gather":
                count = count // n
            if count == 0:
                continue
            gen = torch.Generator(device="cpu").manual_seed(size)
            host = [torch.rand(count, generator=gen) * 4 - 2 for _ in devices]
            inputs = [h.to(f"cuda:{d}") for h, d in zip(host, devices)]
            if bench == "all_reduce":
                pristine = [t.clone() for t in inputs]

                def restore():
                    for t, p in zip(inputs, pristine):
                        t.copy_(p)

                # In place: every run starts from the inputs, restored before the start events.
                seconds = timed(devices, lambda: nccl.all_reduce(inputs), args.warmup, args.iters, restore)
                want = sum(h.double() for h in host)
                wrong = sum(int(((t.cpu().double() - want).abs() > 1e-5 * n * (want.abs() + 1)).sum())
                            for t in inputs)
                total = count * 4
                factor = 2 * (n - 1) / n
            else:
                outputs = [torch.empty(count * n, device=f"cuda:{d}") for d in devices]
                seconds = timed(devices, lambda: nccl.all_gather(inputs, outputs), args.warmup, args.iters)
                want = torch.cat(host)
                wrong = sum(int((o.cpu() != want).sum()) for o in outputs)
                total = count * 4 * n
                factor = (n - 1) / n
            algbw = total / seconds / 1e9
            row = {"bench": bench, "route": "nccl-shm", "dtype": "f32",
                   "op": "sum" if bench == "all_reduce" else "none", "ranks": n, "bytes": total,
                   "count": count, "time_us": seconds * 1e6, "algbw": algbw, "busbw": algbw * factor,
                   "wrong": wrong}
            rows.append(row)
            print(f"  {bench:>10} {total:>12} {count:>11} {seconds * 1e6:>10.1f} {algbw:>8.2f} "
                  f"{algbw * factor:>8.2f} {wrong:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
