"""Why the native all_reduce call (geforce_p2p._native.all_reduce, arguments made beforehand)
takes longer on the host than `gp2p bench all-reduce` reports for its enqueue, for a 4-byte
all_reduce over two devices. Each variant changes one thing against the first:

- legacy/side: the ranks' streams are torch's current streams (the legacy default stream) or
  a non-blocking torch stream per device, as the Rust bench's streams are;
- queued/idle/spinning: calls back to back behind a 200 ms kernel, or each alone on an idle
  device (synchronised before), or each behind a 0.3 ms kernel that is running;
- the receive path (auto, scratch, zero-copy).

Host microseconds per call, medians of --calls; the 4-byte staged copy beside it, and the
Rust bench's enqueue figure run in this process. One all_reduce on fresh data is checked.
With one GPU only the staged copy runs, between two tensors of that GPU (on two streams with
side streams): enough to compare two builds' native layers on the one-H200 machine, run in
turns (`--label` names each run in the JSON).

    python3 benches/probes/native_overhead.py [--calls 200] [--json out.json]"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

import geforce_p2p as gp
from geforce_p2p import _native

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from compare_torch import rust_enqueue_us, spin  # noqa: E402


def host_us(call, streams, calls, way):
    """Median host µs per call of `call`, the streams (device, torch stream) prepared by `way`."""
    times = []
    if way == "queued":
        for d, s in streams:
            with torch.cuda.stream(s):
                spin(d, 200)
    for _ in range(calls):
        if way != "queued":
            for d, _ in streams:
                torch.cuda.synchronize(d)
            if way == "spinning":
                for d, s in streams:
                    with torch.cuda.stream(s):
                        spin(d, 0.3)
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    for d, _ in streams:
        torch.cuda.synchronize(d)
    return statistics.median(times) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json")
    parser.add_argument("--label", default="", help="a name for this run, kept in the JSON")
    args = parser.parse_args()
    two = torch.cuda.device_count() >= 2
    devices = (0, 1) if two else (0, 0)
    xs = [torch.randn(1, device="cuda:%d" % i) for i in devices]
    legacy = [(i, torch.cuda.default_stream(i)) for i in devices]
    side = [(i, torch.cuda.Stream(device=i)) for i in devices]
    rows = {}
    for sname, streams in (("legacy", legacy), ("side", side)):
        ms = [(i, x.data_ptr(), s.cuda_stream) for (i, s), x in zip(streams, xs)]
        copy = lambda ms=ms: _native.copy("f32", 1, ms[0], ms[1], "staged", None, None)  # noqa: E731
        parts = {"copy staged": copy}
        if two:
            parts.update({
                "all_reduce auto": lambda ms=ms: _native.all_reduce("f32", 1, ms, "sum", "auto"),
                "all_reduce scratch": lambda ms=ms: _native.all_reduce("f32", 1, ms, "sum", "scratch"),
                "all_reduce zero-copy": lambda ms=ms: _native.all_reduce("f32", 1, ms, "sum", "zero-copy")})
        for pname, call in parts.items():
            host_us(call, streams, 20, "queued")  # warm-up
            for way in ("queued", "idle", "spinning"):
                rows["%s, %s streams, %s" % (pname, sname, way)] = host_us(call, streams, args.calls, way)
    if two:
        rows["rust bench all_reduce enqueue"] = rust_enqueue_us(["all-reduce", "--ranks", "2", "--op", "sum",
                                                                 "--dtype", "f32"])
    rows["rust bench copy staged enqueue"] = rust_enqueue_us(["copy", "--route", "staged", "--src", "0",
                                                              "--dst", str(devices[1])])
    for name, us in rows.items():
        print("native %-48s %7.2f us/call" % (name, us if us is not None else float("nan")))
    # The timed calls' results are not kept: one call of each op on fresh data is checked.
    src, dst = torch.randn(7, device="cuda:0"), torch.empty(7, device="cuda:%d" % devices[1])
    gp.copy_(dst, src, route="staged")
    torch.cuda.synchronize(devices[1])
    assert torch.equal(dst.cpu(), src.cpu()), "the copy's result"
    if two:
        fresh = [torch.randn(7, device="cuda:%d" % i) for i in devices]
        total = fresh[0].cpu() + fresh[1].cpu()
        gp.all_reduce(fresh, op="sum")
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        assert all(torch.equal(x.cpu(), total) for x in fresh), "the all_reduce's result"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "torch": torch.__version__, "gpus": torch.cuda.device_count(),
                       "calls": args.calls, "us_per_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
