"""Where the Python layer's time per call goes, for a 4-byte staged copy and a 2-rank all_reduce:
the whole call, reading the tensors (``describe``), the native call alone with its arguments
made beforehand, and the Rust call alone (``_native.bench.RustCalls``: the library call ``gp2p
bench`` times, on buffers and streams made in Rust, timed in Rust). The copy has more parts,
which split the whole call's difference from the Rust call: the native fast path's
reading of the two tensors alone (``fast read x2``), the native call's own path without the
interpreter (``rust borrowed``: the Rust call with its streams borrowed from raw handles, as
the native call borrows torch's), and the native call on torch's tensors timed inside, in Rust
(``native timed in rust``); beside them, what the timing itself and a native call that enqueues
nothing cost in the same turns (``empty lambda``, ``native call, no copy``). With one GPU the
copy goes between two tensors on it (the all_reduce needs two). Host time per call, median of
``--calls``; the parts of one op take turns call by call, so a drift in the machine's speed
reaches them all alike (it moves separate runs by several microseconds).

Two ways: "queued", calls back to back behind a spinning kernel (the driver's queue fills as
they go; no Rust call), and "from idle", each call alone after both devices are idle, with its
first stream held closed by the host gate ``gp2p bench`` closes while it times an enqueue (the
other device's stream left idle, as in the bench: the library skips the cross-device ordering
an idle stream does not need). The from-idle parts are measured ``--rounds`` times, each round
followed by a ``gp2p bench`` run in this process for reference, and the differences are
reported per round and as the median over rounds.

Reading the differences: from idle, a part timed in Python also pays for caches gone cold
during the sync and the gate, which a part timed inside Rust mostly does not (on one H200 an
empty lambda took 0.26 us and a native call that enqueues nothing about 2 us, against 0.03
and 0.76 in a tight loop: benches/results/python-host-parts-h200/ at 912f16b). So "whole call - rust
call" is what a Python caller pays over a Rust caller after an idle spell, an upper bound for
calls made in a busy loop ("queued").

With ``--streams side`` each device's current torch stream is a side stream from torch's pool
(non-blocking) rather than the legacy default stream torch starts with; the Rust calls and the
bench run on streams of the same kind (the legacy default stream, or non-blocking ones).

    python3 benches/python/overhead_parts.py [--streams legacy|side] [--rounds N] [--bind-cpus] [--json parts.json]"""

import argparse
import json
import random
import statistics
import time

import torch

import geforce_p2p as gp
from geforce_p2p import _native
from geforce_p2p._tensors import describe

from compare_torch import bind_to_gpu_cpus, rust_enqueue_us, spin  # beside this script


def per_call_us(parts, devices, calls, from_idle, expired=None):
    """Median host microseconds per call of each part, the parts taking turns. A part is a
    call, or (call, handle of the stream to hold from idle instead of device 0's current torch
    stream); a call that returns a float has timed itself (seconds), in Rust. A call that
    waited for its held stream until the gate's deadline ends the script, unless `expired` is
    a dict: then the part's name is counted there."""
    times = {name: [] for name in parts}
    if not from_idle:
        for d in devices:
            spin(d, 200)
    for _ in range(calls):
        for name, part in parts.items():
            call, held = part if isinstance(part, tuple) else (part, None)
            gate = None
            if from_idle:
                for d in devices:
                    torch.cuda.synchronize(d)
                if held is None:
                    held = torch.cuda.current_stream(devices[0]).cuda_stream
                gate = _native.Gate(devices[0], held, 2.0)
            t0 = time.perf_counter()
            result = call()
            elapsed = time.perf_counter() - t0
            times[name].append(result if isinstance(result, float) else elapsed)
            if gate is not None:
                gate.open()
                if gate.expired() and expired is not None:
                    expired[name] = expired.get(name, 0) + 1
                elif gate.expired():
                    raise SystemExit("%s: the call waited for its held stream until the gate's deadline; "
                                     "its time would include that wait" % name)
    for d in devices:
        torch.cuda.synchronize(d)
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="from-idle and Rust bench measurements, in turns")
    parser.add_argument("--streams", choices=("legacy", "side"), default="legacy")
    parser.add_argument("--json")
    parser.add_argument("--bind-cpus", action="store_true",
                        help="run on the CPUs local to the first GPU (the PCI device's local_cpulist): "
                             "fewer moves between sockets, steadier host times")
    args = parser.parse_args()
    n = torch.cuda.device_count()
    if args.bind_cpus:
        bind_to_gpu_cpus(0)
    src, dst = 0, min(1, n - 1)
    devices = sorted({src, dst})
    # The Rust calls on streams of the same kind: the legacy default stream, or new
    # non-blocking streams (torch's pool streams are non-blocking).
    bench_stream = "legacy" if args.streams == "legacy" else "own"
    rust = _native.bench.RustCalls([src, dst], legacy=args.streams == "legacy")
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
        "fast read x2": lambda: _native.bench.read_torch_pair(b, a),
        "native only": lambda: _native.copy(s.dtype, s.numel, s.memory, d.memory, "staged", None, None),
        "native timed in rust": lambda: _native.bench.copy_timed(s.dtype, s.numel, s.memory, d.memory, "staged"),
        "native call, no copy": lambda: _native.bench.copy_call_only(s.dtype, s.numel, s.memory, d.memory, "staged",
                                                               None, None, True),
        "empty lambda": lambda: None,
        "rust borrowed": (rust.copy_borrowed, rust.first_stream()),
        "rust call": (rust.copy, rust.first_stream()),
    }}
    if n >= 2:
        xs = [torch.randn(1, device="cuda:%d" % i) for i in (0, 1)]
        ms = [describe(x, "t").memory for x in xs]
        ops["all_reduce"] = {
            "whole call": lambda: gp.all_reduce(xs, op="sum"),
            "describe x2": lambda: [describe(x, "t") for x in xs],
            "native only": lambda: _native.all_reduce("f32", 1, ms, "sum", "auto"),
            "rust call": (rust.all_reduce, rust.first_stream()),
        }
    rust_args = {"copy_": ["copy", "--route", "staged", "--src", str(src), "--dst", str(dst)],
                 "all_reduce": ["all-reduce", "--ranks", "2", "--op", "sum", "--dtype", "f32"]}
    for op, parts in ops.items():
        # The queued way leaves the Rust calls out: with --streams side they would run on
        # idle streams of their own, not behind the spin.
        python_parts = {name: part for name, part in parts.items() if not name.startswith("rust")}
        # Warm-up (caches and the library's state): a first call that waits for its stream
        # (a driver call waiting for the device to go idle) is reported, not timed.
        first = {}
        per_call_us(parts, devices, 20, True, expired=first)
        for part, count in first.items():
            print("warm-up: %s %s waited for its held stream until the gate's deadline in %d of 20 calls"
                  % (op, part, count))
            rows["%s warm-up: %s calls that waited for the held stream" % (op, part)] = count
        for part, us in per_call_us(python_parts, devices, args.calls, False).items():
            rows["%s queued: %s" % (op, part)] = us
        rows["%s queued: python layer" % op] = rows["%s queued: whole call" % op] - rows["%s queued: native only" % op]
        for r in range(1, args.rounds + 1):
            way = "from idle %d" % r
            for part, us in per_call_us(parts, devices, args.calls, True).items():
                rows["%s %s: %s" % (op, way, part)] = us
            rows["%s %s: python layer" % (op, way)] = (
                rows["%s %s: whole call" % (op, way)] - rows["%s %s: native only" % (op, way)])
            rows["%s %s: whole call - rust call" % (op, way)] = (
                rows["%s %s: whole call" % (op, way)] - rows["%s %s: rust call" % (op, way)])
            if "rust borrowed" in parts:
                # The whole call's difference in parts: the Python function around the
                # native call, the interpreter's call and argument conversion, the borrows.
                row = lambda part: rows["%s %s: %s" % (op, way, part)]  # noqa: E731
                rows["%s %s: python function" % (op, way)] = (
                    row("whole call") - row("fast read x2") - row("native only"))
                rows["%s %s: native call - rust borrowed" % (op, way)] = row("native only") - row("rust borrowed")
                rows["%s %s: native call - timed in rust" % (op, way)] = (
                    row("native only") - row("native timed in rust"))
                rows["%s %s: timed in rust - rust borrowed" % (op, way)] = (
                    row("native timed in rust") - row("rust borrowed"))
                rows["%s %s: rust borrowed - rust call" % (op, way)] = row("rust borrowed") - row("rust call")
            bench = rust_enqueue_us(rust_args[op] + ["--stream", bench_stream], min(args.calls, 100))
            rows["%s %s: gp2p bench enqueue" % (op, way)] = bench
            if bench is not None:
                rows["%s %s: whole call - bench" % (op, way)] = rows["%s %s: whole call" % (op, way)] - bench
    for name, us in rows.items():
        print("parts %-40s %6.2f us/call" % (name, us if us is not None else float("nan")))
    # Across rounds: the machine's speed drifts between rounds far more than within one.
    for op in ops:
        for part in ("python layer", "whole call - rust call", "whole call - bench", "python function",
                     "native call - rust borrowed", "native call - timed in rust", "timed in rust - rust borrowed",
                     "rust borrowed - rust call", "native call, no copy", "empty lambda"):
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
    # The Rust calls' results too, on fresh values (eighths: exact in f32).
    values = [v / 8 for v in random.sample(range(1, 4000), 2)]  # distinct: a copy that did nothing shows
    rust.fill(values)
    rust.copy()
    assert rust.read() == [values[0], values[0]], "the Rust copy's result"
    if n >= 2:
        rust.fill(values)
        rust.all_reduce()
        assert rust.read() == [sum(values)] * 2, "the Rust all_reduce's result"
    if n >= 2:
        fresh = [torch.randn(5, device="cuda:%d" % i) for i in (0, 1)]
        total = fresh[0].cpu() + fresh[1].cpu()
        gp.all_reduce(fresh, op="sum")
        torch.cuda.synchronize()
        assert all(torch.equal(x.cpu(), total) for x in fresh), "the all_reduce's result"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpus": [torch.cuda.get_device_name(i) for i in range(n)], "torch": torch.__version__,
                       "calls": args.calls, "streams": args.streams, "us_per_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
