"""What the pieces of a Python copy_ call cost on the host, none of which enqueues GPU work:
each torch tensor attribute or method the native fast path reads a subclass with, torch's
DLPack export that it reads a plain tensor with, torch's current-stream getter, the fast
path's reading of two tensors (``_native.bench.read_torch_pair``, and the same attribute by
attribute), and the native
call around the copy (``_native.bench.copy_call_only``: its arguments converted, the GIL released
and taken back, nothing enqueued), with and without the release.

Two ways. "tight": each piece called in batches of --calls through a lambda, the empty
lambda's time taken off, median over --batches, the pieces taking turns batch by batch so that
a drift in the machine's speed reaches them all alike. "after idle": each call alone, timed
as overhead_parts.py times its from-idle parts (the device synchronised and its current
stream held closed by a host gate first), median of --calls, the pieces taking turns call by
call; and "after idle, again": the same, the piece called once more before the timed call
(what is left of the cold call's cost once the piece's own code and data are warm). Needs one
CUDA device.

    python3 benches/probes/python_call_costs.py [--calls 2000] [--batches 15] [--bind-cpus] [--json out.json]"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

from geforce_p2p import _native
from geforce_p2p._tensors import describe, torch_fast_parts

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from compare_torch import bind_to_gpu_cpus  # noqa: E402


def python_function(dtype, n, src, dst, route, chunk_bytes, slots, detach):
    """A Python function taking what copy_call_only takes, for scale."""
    return route if detach else dtype


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--json")
    parser.add_argument("--bind-cpus", action="store_true", help="run on the CPUs local to the GPU")
    args = parser.parse_args()
    if args.bind_cpus:
        bind_to_gpu_cpus(0)
    a = torch.randn(1, device="cuda:0")
    b = torch.empty(1, device="cuda:0")
    fast = torch_fast_parts(torch)
    s, d = describe(a, "src"), describe(b, "dst")
    raw_stream = torch._C._cuda_getCurrentRawStream
    to_dlpack = torch._C._to_dlpack
    tensor = torch.Tensor
    pieces = {
        "empty lambda": lambda: None,
        "isinstance(t, torch.Tensor)": lambda: isinstance(a, tensor),
        "t.layout": lambda: a.layout,
        "t.is_cuda": lambda: a.is_cuda,
        "t.is_contiguous()": lambda: a.is_contiguous(),
        "t.dtype": lambda: a.dtype,
        "t.numel()": lambda: a.numel(),
        "t.shape": lambda: a.shape,
        "t.get_device()": lambda: a.get_device(),
        "t.device": lambda: a.device,
        "t.data_ptr()": lambda: a.data_ptr(),
        "t.stride()": lambda: a.stride(),
        "_cuda_getCurrentRawStream(0)": lambda: raw_stream(0),
        "torch.cuda.current_stream(0)": lambda: torch.cuda.current_stream(0),
        "_native.bench.read_torch_pair, parts given": lambda: _native.bench.read_torch_pair(b, a, fast),
        "_native.bench.read_torch_pair, parts kept": lambda: _native.bench.read_torch_pair(b, a),
        "read_torch_pair, by attributes": lambda: _native.bench.read_torch_pair(b, a, None, True),
        "torch._C._to_dlpack(t)": lambda: to_dlpack(a),
        "describe x2": lambda: (describe(b, "dst"), describe(a, "src")),
        "_native.dtypes()": _native.dtypes,
        "python function, 8 arguments": lambda: python_function(s.dtype, s.numel, s.memory, d.memory, "staged",
                                                                None, None, True),
        "copy_call_only, GIL kept": lambda: _native.bench.copy_call_only(
            s.dtype, s.numel, s.memory, d.memory, "staged", None, None, False),
        "copy_call_only, GIL released": lambda: _native.bench.copy_call_only(
            s.dtype, s.numel, s.memory, d.memory, "staged", None, None, True),
    }
    rows = {"tight": tight(pieces, args.calls, args.batches)}
    for again in (False, True):
        way = "after idle, again" if again else "after idle"
        rows[way] = after_idle(pieces, min(args.calls, 500), again)
    for name in pieces:
        print("%-34s %s" % (name, "  ".join("%s %6.3f us" % (way, ws[name]) for way, ws in rows.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls": args.calls,
                       "batches": args.batches, "us_per_call": rows}, f, indent=1)


def tight(pieces, calls, batches):
    """Median µs per call in batches of `calls`, less the empty lambda's (but its own)."""
    times = {name: [] for name in pieces}
    for batch in range(batches + 1):
        for name, piece in pieces.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                piece()
            if batch:  # the first batch warms up
                times[name].append((time.perf_counter() - t0) / calls * 1e6)
    base = statistics.median(times["empty lambda"])
    return {name: statistics.median(ts) - (base if name != "empty lambda" else 0) for name, ts in times.items()}


def after_idle(pieces, calls, again):
    """Median µs of one call after the device is idle and its stream held by a gate."""
    times = {name: [] for name in pieces}
    stream = torch.cuda.current_stream(0).cuda_stream
    for _ in range(calls):
        for name, piece in pieces.items():
            torch.cuda.synchronize(0)
            gate = _native.Gate(0, stream, 2.0)
            if again:
                piece()
            t0 = time.perf_counter()
            piece()
            elapsed = time.perf_counter() - t0
            gate.open()
            times[name].append(elapsed * 1e6)
    torch.cuda.synchronize(0)
    return {name: statistics.median(ts) for name, ts in times.items()}


if __name__ == "__main__":
    main()
