"""Where a Python call's host time goes, driver call by driver call.

Traces (``_native.bench.trace_start`` / ``trace_finish``, the library's per-thread driver-call trace)
each of ``--calls`` calls and prints, for every mark of the call (each driver call as it
returns, then ``finish`` when control is back in Python), the median microseconds since the
previous mark: the driver call itself plus the code before it (for the first mark, the Python
layer and the native argument reading). Two ways, as ``overhead_parts.py`` times them:
``tight`` (calls back to back, the GPU synchronised every 20) and ``idle`` (each call after a
synchronise and a 2 ms sleep, so the host's caches are cold as after real work).

    python3 trace_calls.py copy [--devices 0,1] # gp.copy_ of 4 bytes (default: within device 0)
    python3 -m torch.distributed.run --nproc-per-node 2 trace_calls.py comm
                                                # Communicator.all_reduce of 8 bytes, two
                                                # processes (sharing the GPU where there is one)
    python3 -m torch.distributed.run --nproc-per-node 2 trace_calls.py server
                                                # CustomAllreduce: should_custom_ar, then
                                                # custom_all_reduce of 2 KiB, as servers call them

Every call's result is checked at the end of each way.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import geforce_p2p as gp
from geforce_p2p import _native


def traced(call, calls, way):
    """Per mark position: (name, median us since the previous mark), over `calls` traced calls."""
    traces = []
    for i in range(calls):
        if way == "idle":
            torch.cuda.synchronize()
            time.sleep(0.002)
        elif i % 20 == 0:
            torch.cuda.synchronize()
        _native.bench.trace_start()
        call()
        traces.append(_native.bench.trace_finish())
    torch.cuda.synchronize()
    shapes = {tuple(name for name, _ in t) for t in traces}
    if len(shapes) != 1:
        # Calls that took different paths (a first use that allocates, say): keep the commonest.
        common = statistics.mode([tuple(name for name, _ in t) for t in traces])
        traces = [t for t in traces if tuple(name for name, _ in t) == common]
    names = [name for name, _ in traces[0]]
    medians = [statistics.median(t[i][1] for t in traces) for i in range(len(names))]
    totals = [sum(us for _, us in t) for t in traces]
    return list(zip(names, medians)), statistics.median(totals), len(traces)


def report(title, call, calls, check):
    for way in ("tight", "idle"):
        marks, total, kept = traced(call, calls, way)
        check()
        print("%s, %s: %.2f us median per call (%d of %d calls had this sequence)" % (title, way, total, kept, calls))
        for name, us in marks:
            print("  %8.2f  %s" % (us, name))
    sys.stdout.flush()


def report_on_rank_0(rank, title, call, calls, check):
    """`report` on rank 0; every other rank makes the same calls, traced the same ways, so the
    ranks keep in step (each call of a collective waits for every rank's)."""
    if rank == 0:
        return report(title, call, calls, check)
    for way in ("tight", "idle"):
        traced(call, calls, way)
        check()


def copy_case(args):
    src, dst = (int(d) for d in args.devices.split(","))
    a = torch.randn(1, device="cuda:%d" % src)
    b = torch.empty(1, device="cuda:%d" % dst)
    for _ in range(20):
        gp.copy_(b, a, route="staged")

    def check():
        if not torch.equal(a.cpu(), b.cpu()):
            raise SystemExit("copy_: wrong result")

    report("copy_ of 4 bytes, staged, device %d -> %d" % (src, dst), lambda: gp.copy_(b, a, route="staged"),
           args.calls, check)


def joined():
    """This torchrun rank's (rank, world, GPU, communicator): a gloo group carries the id."""
    import torch.distributed as dist
    import geforce_p2p.distributed as gpd

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    local = local if local < torch.cuda.device_count() else 0
    torch.cuda.set_device(local)
    dist.init_process_group("gloo")
    return rank, world, local, gpd.Communicator.from_group(device=local)


def comm_case(args):
    import torch.distributed as dist

    rank, world, local, comm = joined()
    t = torch.ones(2, device="cuda:%d" % local)
    for _ in range(20):
        comm.all_reduce(t, "sum")
    torch.cuda.synchronize()
    dist.barrier()
    t.fill_(1.0)
    done = [0]

    def call():
        comm.all_reduce(t, "sum")
        done[0] += 1

    def check():
        # Every call doubles each element (two ranks' equal values summed).
        want = 2.0 ** done[0]
        if not torch.all(t == want):
            raise SystemExit("all_reduce: rank %d wrong after %d calls" % (rank, done[0]))
        dist.barrier()
        t.fill_(1.0)
        done[0] = 0
        dist.barrier()

    report_on_rank_0(rank, "Communicator.all_reduce of 8 bytes, rank 0", call, args.calls, check)
    comm.close()
    dist.destroy_process_group()


def server_case(args):
    import torch.distributed as dist
    import geforce_p2p.distributed as gpd

    rank, world, local, comm = joined()
    ca = gpd.CustomAllreduce(comm)
    t = torch.randn(512, device="cuda:%d" % local) + rank
    every = [torch.empty(512) for _ in range(world)]
    dist.all_gather(every, t.cpu())
    want = sum(x.double() for x in every).float()
    outs, addresses = [], set()

    def call():
        assert ca.should_custom_ar(t)
        out = ca.custom_all_reduce(t)
        addresses.add(out.data_ptr())
        outs.append(out)
        if len(outs) > 4:
            outs.pop(0)

    for _ in range(20):
        call()

    def check():
        torch.cuda.synchronize()
        for out in outs:
            if not torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-5):
                raise SystemExit("custom_all_reduce: rank %d wrong" % rank)
        dist.barrier()

    report_on_rank_0(rank, "CustomAllreduce.should_custom_ar + custom_all_reduce of 2 KiB, rank 0", call, args.calls,
                     check)
    if rank == 0:
        print("outputs came at %d distinct addresses" % len(addresses))
    ca.close()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=["copy", "comm", "server"])
    parser.add_argument("--calls", type=int, default=60, help="traced calls per way")
    parser.add_argument("--devices", default="0,0", help="copy: source and destination device ordinals")
    args = parser.parse_args()
    if args.case == "comm":
        comm_case(args)
    elif args.case == "server":
        server_case(args)
    else:
        copy_case(args)


if __name__ == "__main__":
    main()
