"""Host time per `dist.all_reduce` on the "nccl" backend through the NCCL door, against the
`gp2p` backend and the real NCCL with one rank, in the same processes and the same turns:

    python3 -m geforce_p2p.nccl -- python3 -m torch.distributed.run --nproc-per-node 2 \\
        benches/python/door_host_time.py [OUT.json]

N ranks share GPU 0 (start an MPS daemon first); the real NCCL refuses that ("Duplicate GPU"),
so its figure is a one-rank group per process (`new_subgroups(1)`), made while `GP2P_NCCL=off`
so that the door hands it to the real library (each of its calls then passes through the door's
forwarding, which the figure includes). Without the door preloaded, run with one process: the
script then times the real NCCL's one-rank group alone, for the same figure without the door.

Sizes 256 B to 64 KiB, int32 summed in place (sums wrap, so n calls give
sum(start) * world**(n - 1) modulo 2**32, checked at the end). The figure is the median host
time of a call (what enqueueing costs, not the all-reduce), the parts taking turns call by call
(`parts_in_turns.py`)."""
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
from parts_in_turns import line, time_in_turns

SIZES = [256, 1024, 4096, 16384, 65536]
ROUNDS, CALLS = 5, 100
DOOR_ON = "libnccl" in os.environ.get("LD_PRELOAD", "") or "geforce_p2p" in os.environ.get("LD_PRELOAD", "")

rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
if DOOR_ON:
    import geforce_p2p.distributed as gpd

    gpd.register_backend()
dist.init_process_group("nccl")
groups = {}
if DOOR_ON:
    groups["nccl (door)"] = dist.group.WORLD
    groups["gp2p backend"] = dist.new_group(backend="gp2p")
    old = os.environ.get("GP2P_NCCL")
    os.environ["GP2P_NCCL"] = "off"  # read by the door when it makes the next communicator
    one, _ = dist.new_subgroups(1, backend="nccl")
    dist.all_reduce(torch.ones(1, device="cuda"), group=one)  # made here, at its first call
    if old is None:
        del os.environ["GP2P_NCCL"]
    else:
        os.environ["GP2P_NCCL"] = old
    groups["real NCCL, one rank (through the door)"] = one
else:
    if world != 1:
        sys.exit("without the door preloaded, run one process: the real NCCL refuses ranks sharing a device")
    groups["real NCCL, one rank (no door)"] = dist.group.WORLD

gen = torch.Generator().manual_seed(20261205 + rank)
tensors, starts = {}, {}
for size in SIZES:
    for name, group in groups.items():
        t = torch.randint(-1000, 1000, (size // 4,), dtype=torch.int32, generator=gen).cuda()
        tensors[name, size] = t
        ranks = dist.get_world_size(group)
        every = [torch.empty_like(t) for _ in range(ranks)]
        dist.all_gather(every, t, group=group)
        starts[name, size] = (sum(x.long().cpu() for x in every), ranks)
        dist.all_reduce(t, group=group)  # warm: the communicator and any scratch it keeps


def part(name, size):
    t, group = tensors[name, size], groups[name]
    return ("%s %d B" % (name, size), lambda: dist.all_reduce(t, group=group))


parts = [part(name, size) for size in SIZES for name in groups]
res = time_in_turns(parts, ROUNDS, CALLS)
calls = (ROUNDS + 1) * CALLS + 1
for (name, size), t in tensors.items():
    start_sum, ranks = starts[name, size]
    want = (start_sum * pow(ranks, calls - 1, 1 << 32)) % (1 << 32)
    want = torch.where(want >= 1 << 31, want - (1 << 32), want).to(torch.int32)
    assert torch.equal(t.cpu(), want), "rank %d: %s at %d B summed wrong" % (rank, name, size)
if rank == 0:
    print("host time per dist.all_reduce, %d ranks, median of %d calls a part (all results checked)"
          % (world, ROUNDS * CALLS))
    for name, _ in parts:
        print(line(name, res[name], 50))
    rows = []
    for size in SIZES:
        row = {"bytes": size}
        for name in groups:
            row[name] = statistics.median(res["%s %d B" % (name, size)])
        rows.append(row)
    if DOOR_ON:
        for row in rows:
            door, gp2p = row["nccl (door)"], row["gp2p backend"]
            real = row["real NCCL, one rank (through the door)"]
            print("%6d B: door %.2f us = %.2fx the gp2p backend's, %.2fx the real NCCL's (one rank)"
                  % (row["bytes"], door, door / gp2p, door / real))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"ranks": world, "door": DOOR_ON, "median_us": rows}, f, indent=1)
dist.destroy_process_group()
