"""The host time of the whole Python ``copy_`` call for a 4-byte staged copy, of ``copy``
(the same copy into a new tensor it allocates with torch) and, where there are two GPUs, of
the in-process ``all_reduce``, timed as overhead_parts.py times its
parts: "queued", back to back behind a spinning kernel, and "from idle", each call alone after
the devices are idle with its first stream held closed by a host gate. Median µs of --calls.
Made for comparing two builds of the package in turns (one process each, ``--label`` names
the run), which overhead_parts.py cannot do across builds whose benchmark aids differ.

    python3 benches/python/copy_call_turns.py [--calls 300] [--bind-cpus] [--label A] [--json out.json]"""

import argparse
import json

import torch

import geforce_p2p as gp

from compare_torch import bind_to_gpu_cpus  # beside this script
from overhead_parts import per_call_us


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--bind-cpus", action="store_true")
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.bind_cpus:
        bind_to_gpu_cpus(0)
    n = torch.cuda.device_count()
    src, dst = 0, min(1, n - 1)
    devices = sorted({src, dst})
    a = torch.randn(1, device="cuda:%d" % src)
    b = torch.empty(1, device="cuda:%d" % dst)
    target = "cuda:%d" % dst
    parts = {"copy_": lambda: gp.copy_(b, a, route="staged"), "copy": lambda: gp.copy(a, device=target, route="staged")}
    if n >= 2:
        xs = [torch.randn(1, device="cuda:%d" % i) for i in (0, 1)]
        parts["all_reduce"] = lambda: gp.all_reduce(xs, op="sum")
    per_call_us(parts, devices, 20, True, expired={})  # warm-up
    rows = {}
    for name, us in per_call_us(parts, devices, args.calls, False).items():
        rows["%s queued" % name] = us
    for name, us in per_call_us(parts, devices, args.calls, True).items():
        rows["%s from idle" % name] = us
    fresh = torch.randn(1, device=a.device)
    a.copy_(fresh)
    gp.copy_(b, a, route="staged")
    new = gp.copy(a, device=target, route="staged")
    torch.cuda.synchronize()
    assert torch.equal(b.cpu(), fresh.cpu()) and torch.equal(new.cpu(), fresh.cpu()), "the copies' results"
    print("turn %-6s %s" % (args.label, "  ".join("%s %.2f us" % kv for kv in rows.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "gpus": [torch.cuda.get_device_name(i) for i in range(n)],
                       "calls": args.calls, "us_per_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
