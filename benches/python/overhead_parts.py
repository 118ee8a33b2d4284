"""Where the Python layer's time per call goes, for a 4-byte staged copy and a 2-rank
all_reduce: the whole call, reading the tensors (``describe``), and the native call alone
with its arguments made beforehand; beside them, the enqueue time ``gp2p bench`` reports for
the same op (run in this process). Host time per call, median of ``--calls``; the parts of one
op take turns call by call, so a drift in the machine's speed reaches them all alike. Two ways:
"queued", calls back to back behind a spinning kernel (the driver's queue fills as they go), and
"from idle", each call alone after both devices are idle, with device 0's current stream
held closed by the same host gate ``gp2p bench`` closes while it times an enqueue (device 0
synchronised and its stream held, the other device's stream left idle: the library skips the
cross-device ordering an idle stream does not need, so the two are timed alike only if the
other device is idle too). The
from-idle parts and the Rust bench are measured ``--rounds`` times, in turns, to show the
spread of the difference.

With ``--streams side`` each device's current torch stream is a side stream from torch's pool
(non-blocking) rather than the legacy default stream torch starts with; the Rust bench runs on
streams of the same kind (``--stream legacy`` or its own non-blocking ones).

``--hold spin`` holds it with a short spin kernel instead of the gate.

    python3 benches/python/overhead_parts.py [--streams legacy|side] [--hold gate|spin] [--json parts.json]"""

import argparse
import json
import statistics
import time

import torch

import geforce_p2p as gp
from geforce_p2p import _native
from geforce_p2p._tensors import describe

from compare_torch import rust_enqueue_us, spin  # beside this script: the Rust bench in-process, a busy kernel


def per_call_us(parts, devices, calls, from_idle, hold="gate"):
    """Median host microseconds per call of each part, the parts taking turns."""
    times = {name: [] for name in parts}
    if not from_idle:
        for d in devices:
            spin(d, 200)
    for _ in range(calls):
        for name, call in parts.items():
            gate = None
            if from_idle:
                for d in devices:
                    torch.cuda.synchronize(d)
                if hold == "gate":
                    gate = _native.Gate(devices[0], torch.cuda.current_stream(devices[0]).cuda_stream, 2.0)
                else:
                    spin(devices[0], 0.3)
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
            if gate is not None:
                gate.open()
    for d in devices:
        torch.cuda.synchronize(d)
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="from-idle and Rust bench measurements, in turns")
    parser.add_argument("--hold", choices=("gate", "spin"), default="gate",
                        help="from idle, device 0's stream held by the bench's host gate or by a short spin kernel")
    parser.add_argument("--streams", choices=("legacy", "side"), default="legacy")
    parser.add_argument("--json")
    args = parser.parse_args()
    n = torch.cuda.device_count()
    src, dst = 0, min(1, n - 1)
    devices = sorted({src, dst})
    # The Rust bench on streams of the same kind: the legacy default stream, or new
    # non-blocking streams (torch's pool streams are non-blocking).
    bench_stream = "legacy" if args.streams == "legacy" else "own"
    if args.streams == "side":
        for d in range(n):
            torch.cuda.set_stream(torch.cuda.Stream(device=d))
    a = torch.randn(1, device="cuda:%d" % src)
    b = torch.empty(1, device="cuda:%d" % dst)
    rows = {}
    s, d = describe(a, "src"), describe(b, "dst")
    ops = {"copy_": {
        "whole call": lambda: gp.copy_(b, a, route="staged"),
        "describe x2": lambda: (describe(b, "dst"), describe(a, "src")),
        "native only": lambda: _native.copy(s.dtype, s.numel, s.memory, d.memory, "staged", None, None),
    }}
    if n >= 2:
        xs = [torch.randn(1, device="cuda:%d" % i) for i in (0, 1)]
        ms = [describe(x, "t").memory for x in xs]
        ops["all_reduce"] = {
            "whole call": lambda: gp.all_reduce(xs, op="sum"),
            "describe x2": lambda: [describe(x, "t") for x in xs],
            "native only": lambda: _native.all_reduce("f32", 1, ms, "sum", "auto"),
        }
    rust_args = {"copy_": ["copy", "--route", "staged", "--src", str(src), "--dst", str(dst)],
                 "all_reduce": ["all-reduce", "--ranks", "2", "--op", "sum", "--dtype", "f32"]}
    for op, parts in ops.items():
        per_call_us(parts, devices, 20, False)  # warm-up: caches and the library's state
        for part, us in per_call_us(parts, devices, args.calls, False).items():
            rows["%s queued: %s" % (op, part)] = us
        rows["%s queued: python layer" % op] = rows["%s queued: whole call" % op] - rows["%s queued: native only" % op]
        for r in range(1, args.rounds + 1):
            way = "from idle %d" % r
            for part, us in per_call_us(parts, devices, args.calls, True, args.hold).items():
                rows["%s %s: %s" % (op, way, part)] = us
            rows["%s %s: python layer" % (op, way)] = (
                rows["%s %s: whole call" % (op, way)] - rows["%s %s: native only" % (op, way)])
            bench = rust_enqueue_us(rust_args[op] + ["--stream", bench_stream], min(args.calls, 100))
            rows["%s %s: gp2p bench enqueue" % (op, way)] = bench
            if bench is not None:
                rows["%s %s: whole call - bench" % (op, way)] = rows["%s %s: whole call" % (op, way)] - bench
    for name, us in rows.items():
        print("parts %-40s %6.2f us/call" % (name, us if us is not None else float("nan")))
    # Across rounds: the machine's speed drifts between rounds far more than within one.
    for op in ops:
        for part in ("python layer", "whole call - bench"):
            each = [rows.get("%s from idle %d: %s" % (op, r, part)) for r in range(1, args.rounds + 1)]
            each = [x for x in each if x is not None]
            if each:
                rows["%s from idle, median of rounds: %s" % (op, part)] = statistics.median(each)
                print("rounds %-12s %-20s median %6.2f us, each %s" % (
                    op, part, statistics.median(each), " ".join("%.2f" % x for x in each)))
    # The timed calls' results are not kept (the all-reduces double their inputs each time):
    # one call of each op on fresh data is checked instead.
    torch.cuda.synchronize()
    a.copy_(torch.randn(1, device=a.device))
    want = a.cpu()
    gp.copy_(b, a, route="staged")
    torch.cuda.synchronize()
    assert torch.equal(b.cpu(), want), "the copy's result"
    if n >= 2:
        fresh = [torch.randn(5, device="cuda:%d" % i) for i in (0, 1)]
        total = fresh[0].cpu() + fresh[1].cpu()
        gp.all_reduce(fresh, op="sum")
        torch.cuda.synchronize()
        assert all(torch.equal(x.cpu(), total) for x in fresh), "the all_reduce's result"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpus": [torch.cuda.get_device_name(i) for i in range(n)], "torch": torch.__version__,
                       "calls": args.calls, "streams": args.streams, "hold": args.hold, "us_per_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
