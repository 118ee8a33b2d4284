"""Where the `gp2p` backend's host time goes, part by part, against NCCL's in the same run: N
ranks on one GPU (start an MPS daemon first), 512 elements (2 KiB). Every part is timed call
by call, the parts taking turns call by call (so all see the same machine, GPU queue and
peers), `CALLS` calls a round, each turn through the parts in its own order; the figure is the
median over every call of every round after a warm-up round (host time a call: what the
enqueue costs, not the all-reduce).

    python3 -m torch.distributed.run --nproc-per-node 2 benches/python/backend_host_parts.py

NCCL refuses two ranks on one GPU, so its figure is `dist.all_reduce` on a group of one rank
per process (`new_subgroups(1)`): torch's ProcessGroupNCCL path, host side, with NCCL's
enqueue of a one-rank all-reduce. Parts: `dist.all_reduce` on the `gp2p` group; the group's
own `allreduce` method and its Work's `wait()`; the communicator's call it makes; its device
check and its Work; other ways to make a Work and to read the current stream."""
import os, statistics, torch, torch.distributed as dist
import geforce_p2p.distributed as gpd
from parts_in_turns import line, time_in_turns

ROUNDS, CALLS = 10, 200
REDUCING = 4  # the first four parts sum `t` in place over the ranks
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(0)
gpd.register_backend()
dist.init_process_group("gp2p")
pg = dist.group.WORLD
nccl_self, _ = dist.new_subgroups(1, backend="nccl")
torch.manual_seed(rank)
# int32, so that the sums wrap instead of overflowing: n in-place sums of the ranks' values
# give sum(start) * world**(n - 1) modulo 2**32, checked at the end.
t = torch.randint(-1000, 1000, (512,), dtype=torch.int32, device="cuda")
every = [torch.empty(512, dtype=torch.int32) for _ in range(world)]
dist.all_gather(every, t.cpu(), group=dist.new_group(backend="gloo"))
start_sum = sum(x.long() for x in every)
one = torch.randn(512, device="cuda")
one_start = one.clone()
dist.all_reduce(one, group=nccl_self)  # NCCL's communicator is made at its first call
parts = [
    ("dist.all_reduce (gp2p)", lambda: dist.all_reduce(t)),
    ("pg.allreduce([t]).wait()", lambda: pg.allreduce([t]).wait()),
    ("pg.allreduce([t])", lambda: pg.allreduce([t])),
    ("Communicator.all_reduce", lambda: pg._comm.all_reduce(t, "sum")),
    ("dist.all_reduce (NCCL, one rank)", lambda: dist.all_reduce(one, group=nccl_self)),
    ("pg._ours([t])", lambda: pg._ours([t])),
    ("pg._done([t])", lambda: pg._done([t])),
    ("pg._done([t]).wait()", lambda: pg._done([t]).wait()),
]

# Other ways to make the Work an op returns, for comparison: a completed CPU future's, and a
# Python Work subclass's (what torch's own tests of Python process groups make).
from torch._C._distributed_c10d import _create_work_from_future


def cpu_future_work(result):
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


try:
    class _Quick(dist.Work):
        def __init__(self, result):
            super().__init__()
            self._result = result

        def wait(self, timeout=None):
            return True

        def result(self):
            return self._result

    _Quick([t]).wait()
    parts += [("Work subclass", lambda: _Quick([t])), ("Work subclass .wait()", lambda: _Quick([t]).wait())]
except Exception as e:  # noqa: BLE001  (a probe: say why the part is missing)
    print("rank %d: no Work subclass part: %r" % (rank, e))
raw_stream = torch._C._cuda_getCurrentRawStream
parts += [
    ("CPU future work", lambda: cpu_future_work([t])),
    ("CPU future work .wait()", lambda: cpu_future_work([t]).wait()),
    ("_cuda_getCurrentRawStream(0)", lambda: raw_stream(0)),
    ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream()),
]
res = time_in_turns(parts, ROUNDS, CALLS)
sums = (ROUNDS + 1) * CALLS * REDUCING
want = (start_sum * pow(world, sums - 1, 1 << 32)) % (1 << 32)
want = torch.where(want >= 1 << 31, want - (1 << 32), want).to(torch.int32)
assert torch.equal(t.cpu(), want), "rank %d: the in-place sums went wrong" % rank
assert torch.equal(one, one_start), "rank %d: NCCL's one-rank sum changed its tensor" % rank
if rank == 0:
    for name, _ in parts:
        print(line(name, res[name], 40))
    print("dist.all_reduce, gp2p over NCCL's: %+.2f us" % (statistics.median(res["dist.all_reduce (gp2p)"])
                                                          - statistics.median(res["dist.all_reduce (NCCL, one rank)"])))
dist.destroy_process_group()
