"""Host time per call of the communicator's all_reduce (what the caller's thread spends
enqueueing it), by layer, two processes:

- `whole`: `Communicator.all_reduce(t)` as users call it;
- `python`: the Python layer's general path, its reading of the tensor then the native call
  (`whole` less the op check, until the native fast path: since then `whole` reads a torch
  tensor, and checks the op, natively);
- `native`: the native call alone, its arguments read once beforehand.

Launch with torchrun (two processes); `--same-device` puts both ranks on cuda:0, where the
GPU's times mean nothing (the two contexts take turns) but the host's still do:

    python3 -m torch.distributed.run --nproc-per-node 2 benches/probes/comm_enqueue.py [--same-device]

Each loop is `--calls` back-to-back max all-reduces after a barrier (max keeps the values
fixed, so the result is checked: every element equals the larger rank's); medians of
`--repeats` loops after one warm-up loop.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import geforce_p2p.distributed as gpd
from geforce_p2p._tensors import writable

SIZES = [8, 2 << 10, 64 << 10, 256 << 10]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--same-device", action="store_true")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = 0 if args.same_device else int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    comm = gpd.Communicator.from_group(device=device, peer_timeout=60.0)
    rows = []
    for size in SIZES:
        t = torch.full((size // 4,), float(rank + 1), device="cuda:%d" % device)
        d = writable(comm._mine(t, "tensor"))
        paths = {
            "whole": lambda: comm.all_reduce(t, "max"),
            "python": lambda: comm._native.all_reduce(*(lambda x: (x.dtype, x.numel, x.memory))(
                writable(comm._mine(t, "tensor"))), "max"),
            "native": lambda: comm._native.all_reduce(d.dtype, d.numel, d.memory, "max"),
        }
        row = {"bytes": size}
        for name, call in paths.items():
            times = []
            for rep in range(args.repeats + 1):
                dist.barrier()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    call()
                us = (time.perf_counter() - t0) * 1e6 / args.calls
                torch.cuda.synchronize()
                if rep:
                    times.append(us)
            if not bool((t == float(world)).all()):
                raise SystemExit("rank %d, %d B, %s: wrong result" % (rank, size, name))
            row[name] = statistics.median(times)
        rows.append(row)
    comm.close()
    if rank == 0:
        print("host us per call: bytes whole python native (python layer = python - native)")
        for r in rows:
            print("%8d %6.2f %6.2f %6.2f  layer %5.2f fast-path layer %5.2f" % (
                r["bytes"], r["whole"], r["python"], r["native"], r["python"] - r["native"], r["whole"] - r["native"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
