"""The gp2p torch.distributed backend's plumbing, on CPU: two processes run torch.distributed
calls through geforce_p2p._torch_backend.GP2PProcessGroup over a stand-in communicator that
does each collective through a file store, so every call torch makes reaches the right
communicator method with the right arguments, and results are checked element by element.
Needs torch (skipped without it: CI has none); the GPU test with the real communicator is in
test_gpu.py."""

import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not built in", allow_module_level=True)

_RANK = r"""
import io, os, sys, datetime
import torch, torch.distributed as dist
sys.path.insert(0, os.environ["GP2P_TEST_DIR"])
from test_torch_backend import run_rank
run_rank(int(sys.argv[1]), os.environ["GP2P_TEST_TMP"], sys.argv[2])
"""


class StoreCommunicator:
    """The communicator's duck type on CPU tensors, for any number of ranks: each call
    publishes this rank's tensor through a file store and reads every rank's, then computes
    its result from all of them."""

    calls = []

    def __init__(self, uid, rank, world_size, device, peer_timeout, join_timeout):
        self.rank, self.world_size, self.seq, self.p2p = rank, world_size, 0, {}
        self.store = dist.FileStore(os.path.join(os.environ["GP2P_TEST_TMP"], "comm-" + uid), world_size)
        StoreCommunicator.calls.append(("made", rank, world_size, device, peer_timeout, join_timeout))

    def _all(self, t):
        import io

        self.seq += 1
        out = io.BytesIO()
        torch.save(t.clone(), out)
        self.store.set("%d/%d" % (self.seq, self.rank), out.getvalue())
        return [t.clone() if r == self.rank else torch.load(io.BytesIO(self.store.get("%d/%d" % (self.seq, r))))
                for r in range(self.world_size)]

    @staticmethod
    def _fold(parts, op):
        acc = parts[0]
        for p in parts[1:]:
            acc = {"sum": torch.add, "avg": torch.add, "min": torch.minimum, "max": torch.maximum,
                   "prod": torch.mul}[op](acc, p)
        if op == "avg":
            n = len(parts)
            return acc / n if acc.is_floating_point() else torch.div(acc, n, rounding_mode="trunc")
        return acc

    def all_reduce(self, t, op="sum"):
        StoreCommunicator.calls.append(("all_reduce", op))
        t.copy_(self._fold(self._all(t), op))

    def all_gather_into_tensor(self, out, inp):
        StoreCommunicator.calls.append(("all_gather_into_tensor",))
        out.copy_(torch.cat(self._all(inp)))

    def reduce_scatter_tensor(self, out, inp, op="sum"):
        StoreCommunicator.calls.append(("reduce_scatter_tensor", op))
        out.copy_(self._fold(self._all(inp), op).chunk(self.world_size)[self.rank])

    def broadcast(self, t, src=0):
        StoreCommunicator.calls.append(("broadcast", src))
        t.copy_(self._all(t)[src])

    def _p2p_key(self, src, dst):
        """The store key of the next message from `src` to `dst` (one sequence a pair)."""
        k = self.p2p.get((src, dst), 0)
        self.p2p[src, dst] = k + 1
        return "p2p/%d-%d/%d" % (src, dst, k)

    def send(self, t, dst):
        import io

        StoreCommunicator.calls.append(("send", dst))
        assert dst != self.rank and 0 <= dst < self.world_size, dst
        out = io.BytesIO()
        torch.save(t.clone(), out)
        self.store.set(self._p2p_key(self.rank, dst), out.getvalue())

    def recv(self, t, src):
        import io

        StoreCommunicator.calls.append(("recv", src))
        assert src != self.rank and 0 <= src < self.world_size, src
        got = torch.load(io.BytesIO(self.store.get(self._p2p_key(src, self.rank))))
        assert got.dtype == t.dtype and got.numel() == t.numel(), (got, t)
        t.copy_(got.view_as(t))

    def check(self):
        pass

    def close(self):
        StoreCommunicator.calls.append(("close",))


def _group_on(device):
    """A creator of gp2p groups over the stand-in communicator whose device is `device`."""

    def make(store, rank, world_size, timeout):
        from geforce_p2p._torch_backend import GP2PProcessGroup

        return GP2PProcessGroup(store, rank, world_size, timeout, communicator=StoreCommunicator, device=device,
                                unique_id=lambda: "uid-%d" % os.getpid())

    return make


def _init(rank, tmp, device, world_size=2):
    dist.Backend.register_backend("gp2p_stand_in", _group_on(device), devices=["cpu", "cuda"])
    dist.init_process_group("gp2p_stand_in", init_method="file://" + os.path.join(tmp, "init"), rank=rank,
                            world_size=world_size)


def run_rank(rank, tmp, mode):
    """One rank's side: with the group's device the CPU (`mode` "comm"), every op torch routes
    to the communicator, each result checked; with the group's device a GPU (`mode` "gloo"),
    CPU tensors, which go to the gloo group beside it."""
    if mode == "gloo":
        return run_rank_on_gloo(rank, tmp)
    if mode == "hosts":
        return run_rank_across_hosts(rank, tmp)
    if mode == "mesh":
        return run_rank_on_a_host_by_local_mesh(rank, tmp)
    if mode == "host-killed":
        return run_rank_when_a_host_dies(rank, tmp)
    _init(rank, tmp, "cpu")
    both = [torch.arange(1, 7, dtype=torch.int64) * (r + 2) for r in range(2)]  # 2,4,..  3,6,..
    mine = both[rank]
    for op, want in [(dist.ReduceOp.SUM, both[0] + both[1]), (dist.ReduceOp.MIN, both[0]),
                     (dist.ReduceOp.MAX, both[1]), (dist.ReduceOp.PRODUCT, both[0] * both[1]),
                     (dist.ReduceOp.AVG, torch.div(both[0] + both[1], 2, rounding_mode="trunc"))]:
        t = mine.clone()
        dist.all_reduce(t, op=op)
        assert torch.equal(t, want), (op, t, want)
    t = mine.clone()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert torch.equal(t, both[0] + both[1]), "async all_reduce"
    gathered = torch.empty(12, dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, mine)
    assert torch.equal(gathered, torch.cat(both))
    parts = [torch.empty(2, 3, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(parts, mine.view(2, 3))
    assert all(torch.equal(p, b.view(2, 3)) for p, b in zip(parts, both)), "list all_gather"
    half = torch.empty(3, dtype=torch.int64)
    dist.reduce_scatter_tensor(half, mine, op=dist.ReduceOp.MAX)
    assert torch.equal(half, torch.maximum(both[0], both[1]).chunk(2)[rank])
    out = torch.empty(3, dtype=torch.int64)
    dist.reduce_scatter(out, list(mine.chunk(2)))
    assert torch.equal(out, (both[0] + both[1]).chunk(2)[rank]), "list reduce_scatter"
    t = mine.clone()
    dist.broadcast(t, src=1)
    assert torch.equal(t, both[1])
    # Point to point, both ways: each rank's send pairs with the other's receive.
    for sender in range(2):
        if rank == sender:
            dist.send(mine, 1 - rank)
        else:
            got = torch.zeros(6, dtype=torch.int64)
            dist.recv(got, sender)
            assert torch.equal(got, both[sender]), ("recv", got)
    assert [c for c in StoreCommunicator.calls if c[0] in ("send", "recv")] == (
        [("send", 1), ("recv", 1)] if rank == 0 else [("recv", 0), ("send", 0)])
    dist.barrier()
    # The rooted ops and the all-to-alls: a reduce-scatter then sends, or sends alone, each
    # rank's in the order of the pairs (sender, receiver).
    first = len(StoreCommunicator.calls)
    t = mine.clone()
    dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
    assert torch.equal(t, torch.maximum(both[0], both[1]) if rank == 1 else mine), "reduce"
    t = torch.arange(5, dtype=torch.int64) * (rank + 1)  # 5 elements: shards of 3 and 2, padded
    dist.reduce(t, dst=0)
    assert torch.equal(t, torch.arange(5) * 3 if rank == 0 else torch.arange(5) * 2), ("reduce, padded", t)
    got = torch.empty(3, dtype=torch.int64)
    dist.scatter(got, list(both[0].chunk(2)) if rank == 0 else None, src=0)
    assert torch.equal(got, both[0].chunk(2)[rank]), "scatter"
    parts = [torch.empty(6, dtype=torch.int64) for _ in range(2)] if rank == 1 else None
    dist.gather(mine, parts, dst=1)
    assert rank == 0 or all(torch.equal(p, b) for p, b in zip(parts, both)), "gather"
    swapped = torch.empty(6, dtype=torch.int64)
    dist.all_to_all_single(swapped, mine)
    assert torch.equal(swapped, torch.cat([b.chunk(2)[rank] for b in both])), "all_to_all_single"
    p2p = [c for c in StoreCommunicator.calls[first:] if c[0] in ("send", "recv")]
    assert p2p[-2:] == ([("send", 1), ("recv", 1)] if rank == 0 else [("recv", 0), ("send", 0)]), p2p
    rows = torch.empty(2, 3, dtype=torch.int64)
    dist.all_to_all_single(rows, mine.view(2, 3))
    assert torch.equal(rows, torch.stack([b.view(2, 3)[rank] for b in both])), "all_to_all_single of rows"
    # Uneven: rank 0 keeps 2 and sends 4, rank 1 sends 1 and keeps 5.
    splits = [[2, 4], [1, 5]]
    uneven = torch.empty(splits[0][rank] + splits[1][rank], dtype=torch.int64)
    dist.all_to_all_single(uneven, mine, [splits[0][rank], splits[1][rank]], splits[rank])
    want = torch.cat([both[s][sum(splits[s][:rank]):sum(splits[s][:rank + 1])] for s in range(2)])
    assert torch.equal(uneven, want), ("all_to_all_single, uneven", uneven, want)
    t = mine.clone()
    dist.all_to_all_single(t, t)
    assert torch.equal(t, torch.cat([b.chunk(2)[rank] for b in both])), "all_to_all_single in place"
    outs = [torch.empty(3, dtype=torch.int64) for _ in range(2)]
    dist.all_to_all(outs, list(mine.chunk(2)))
    assert torch.equal(torch.cat(outs), torch.cat([b.chunk(2)[rank] for b in both])), "all_to_all"
    for call, what in [(lambda: dist.all_to_all_single(torch.empty(6, dtype=torch.int64), mine, [2, 4], [3, 4]),
                        "input_split_sizes: [3, 4] for 6 rows"),
                       (lambda: dist.all_to_all_single(torch.empty(3, 2, dtype=torch.int64), mine.view(3, 2)),
                        "output: 3 rows in dim 0"),
                       (lambda: dist.all_reduce(mine.clone(), op=dist.ReduceOp.BAND), "op:")]:
        try:
            call()
        except (NotImplementedError, ValueError, RuntimeError) as e:
            assert what in str(e), str(e)
        else:
            raise AssertionError("%s: not refused" % what)
    made = [c for c in StoreCommunicator.calls if c[0] == "made"]
    assert made == [("made", rank, 2, 0, 1800.0, 1800.0)], made
    names = [c[0] for c in StoreCommunicator.calls]
    # The collectives' own calls; the reduces add a reduce-scatter each, nothing else rides on them.
    assert names.count("all_gather_into_tensor") == 2 and names.count("reduce_scatter_tensor") == 4, names
    # What looks the group up by its name: a device mesh, the functional collectives, DTensor
    # (a ProcessGroup subclass left the name unset: "ProcessGroup name not set").
    assert dist.group.WORLD.group_name, "the group is named"
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    summed = funcol.all_reduce(mine.clone(), "sum", mesh)
    assert torch.equal(summed, both[0] + both[1]), "functional all_reduce"
    sharded = distribute_tensor(torch.cat(both).view(4, 3), mesh, [Shard(0)])
    assert torch.equal(sharded.to_local(), both[rank].view(2, 3)), "each rank's shard"
    assert torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), torch.cat(both).view(4, 3))
    after = [c[0] for c in StoreCommunicator.calls]
    assert after.count("all_reduce") > names.count("all_reduce"), after  # the functional all-reduce
    assert after.count("all_gather_into_tensor") == names.count("all_gather_into_tensor") + 1, after
    fsdp2_matches_one_process(rank, mesh)
    assert dist.group.WORLD._get_backend(torch.device("cpu")).supports_splitting is False
    dist.destroy_process_group()
    assert StoreCommunicator.calls[-1] == ("close",), "destroy_process_group lets go of the communicator"


def fsdp2_matches_one_process(rank, mesh):
    """FSDP2's fully_shard over the group: a step of a two-layer model, each rank on half the
    batch, gives the gradients of the whole batch in one process (float64)."""
    from torch.distributed.fsdp import fully_shard

    def model():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()

    torch.manual_seed(4)
    batch = torch.randn(6, 8, dtype=torch.float64)
    whole = model()
    whole(batch).square().mean().backward()
    sharded = model()
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    before = len(StoreCommunicator.calls)
    sharded(batch.chunk(2)[rank]).square().mean().backward()
    names = [c[0] for c in StoreCommunicator.calls[before:]]
    assert "all_gather_into_tensor" in names and "reduce_scatter_tensor" in names, names
    for (name, p), q in zip(sharded.named_parameters(), whole.parameters()):
        full = p.grad.full_tensor()
        assert torch.allclose(full, q.grad, rtol=1e-12, atol=1e-12), (name, full, q.grad)


def run_rank_on_gloo(rank, tmp):
    """CPU tensors of a group whose device is a GPU: gloo's, the communicator never called."""
    _init(rank, tmp, "cuda:0")  # never touched: no CUDA work is made on this machine
    both = [torch.arange(1, 7, dtype=torch.float32) * (r + 2) for r in range(2)]
    t = both[rank].clone()
    dist.all_reduce(t)
    assert torch.equal(t, both[0] + both[1])
    gathered = torch.empty(12)
    dist.all_gather_into_tensor(gathered, both[rank])
    assert torch.equal(gathered, torch.cat(both))
    t = both[rank].clone()
    dist.broadcast(t, src=1)
    assert torch.equal(t, both[1])
    if rank == 0:
        dist.send(both[0], 1)
    else:
        got = torch.empty(6)
        dist.recv(got, 0)
        assert torch.equal(got, both[0])
    dist.barrier()
    # An op torch calls without options (older torch's list all-gather does) reaches gloo too.
    parts = [torch.empty(6), torch.empty(6)]
    dist.group.WORLD.allgather([parts], [both[rank]]).wait()
    assert all(torch.equal(p, b) for p, b in zip(parts, both))
    assert [c[0] for c in StoreCommunicator.calls] == ["made"], StoreCommunicator.calls
    dist.destroy_process_group()


def run_rank_across_hosts(rank, tmp):
    """Four ranks on two hosts (GP2P_HOST_ID: ranks 0 and 2 on host-a, 1 and 3 on host-b):
    a communicator of two ranks on each host, gloo between them, every result against the
    flat fold of all four ranks."""
    _init(rank, tmp, "cpu", world_size=4)
    world = 4
    made = [c for c in StoreCommunicator.calls if c[0] == "made"]
    assert made == [("made", rank // 2, 2, 0, 1800.0, 1800.0)], made  # local rank, of 2 a host
    for dtype in (torch.int64, torch.float64):
        # 2001 elements in chunks of 4096 bytes (GP2P_ACROSS_CHUNK_BYTES): four, the last odd.
        for n in (1, 7, 12, 2001):
            ins = [((torch.arange(n, dtype=torch.int64) % 13) * (r + 2) - 3 * r).to(dtype) for r in range(world)]
            for op, fold in ((dist.ReduceOp.SUM, lambda a, b: a + b), (dist.ReduceOp.MAX, torch.maximum),
                             (dist.ReduceOp.MIN, torch.minimum), (dist.ReduceOp.PRODUCT, torch.mul)):
                t = ins[rank].clone()
                dist.all_reduce(t, op=op)
                want = ins[0]
                for x in ins[1:]:
                    want = fold(want, x)
                assert torch.equal(t, want), (dtype, n, op, t, want)
            t = ins[rank].clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            total = sum(ins)
            # Host sums of 3 and 1 (each host's two ranks) must average to 1, not to 0.
            odd = torch.tensor([[2, 1, 1, 0][rank]], dtype=torch.int64)  # host-a: ranks 0, 2
            dist.all_reduce(odd, op=dist.ReduceOp.AVG)
            assert odd.item() == 1, ("integer avg truncated once", odd)
            want = total / world if dtype.is_floating_point else torch.div(total, world, rounding_mode="trunc")
            assert torch.allclose(t, want), ("avg", dtype, n, t, want)
    before = len(StoreCommunicator.calls)
    t = torch.arange(2001, dtype=torch.int64)
    dist.all_reduce(t)
    stages = [c[0] for c in StoreCommunicator.calls[before:]]
    assert stages.count("reduce_scatter_tensor") == stages.count("all_gather_into_tensor") == 4, stages
    assert stages[:3] == ["reduce_scatter_tensor", "reduce_scatter_tensor", "all_gather_into_tensor"], (
        "the next chunk's reduce-scatter goes before this one's all-gather", stages)
    assert torch.equal(t, torch.arange(2001, dtype=torch.int64) * world)
    ins = [torch.arange(6, dtype=torch.int64) + 100 * r for r in range(world)]
    t = ins[rank].clone()
    dist.broadcast(t, src=3)
    assert torch.equal(t, ins[3]), "broadcast from rank 3 (host-b, local rank 1)"
    out = torch.empty(world * 6, dtype=torch.int64)
    dist.all_gather_into_tensor(out, ins[rank])
    assert torch.equal(out, torch.cat(ins)), ("all_gather in rank order", out)
    whole = [torch.arange(world * 3, dtype=torch.int64) * (r + 1) for r in range(world)]
    part = torch.empty(3, dtype=torch.int64)
    dist.reduce_scatter_tensor(part, whole[rank])
    assert torch.equal(part, sum(whole)[rank * 3:(rank + 1) * 3]), ("reduce_scatter", part)
    # The rooted ops and the even all-to-all ride on the collectives across hosts.
    t = ins[rank].clone()
    dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
    assert torch.equal(t, ins[3] if rank == 1 else ins[rank]), ("reduce across hosts", t)
    got = torch.empty(6, dtype=torch.int64)
    dist.scatter(got, ins if rank == 2 else None, src=2)
    assert torch.equal(got, ins[rank]), ("scatter across hosts", got)
    outs = [torch.empty(6, dtype=torch.int64) for _ in range(world)] if rank == 3 else None
    dist.gather(ins[rank], outs, dst=3)
    assert rank != 3 or torch.equal(torch.cat(outs), torch.cat(ins)), ("gather across hosts", outs)
    swapped = torch.empty(8, dtype=torch.int64)
    dist.all_to_all_single(swapped, torch.arange(8, dtype=torch.int64) + 10 * rank)
    want = torch.cat([torch.arange(2 * rank, 2 * rank + 2) + 10 * r for r in range(world)])
    assert torch.equal(swapped, want), ("all_to_all_single across hosts", swapped)
    try:
        dist.send(ins[rank], (rank + 1) % world)
    except (NotImplementedError, RuntimeError) as e:
        assert "across hosts is not built yet" in str(e), str(e)
    else:
        raise AssertionError("send across hosts was not refused")
    dist.destroy_process_group()


def run_rank_on_a_host_by_local_mesh(rank, tmp):
    """Two fake hosts x two ranks (ranks 0, 1 on host-a; 2, 3 on host-b) as a device mesh
    ("host", "local"): the "local" groups are each one host's ranks (this library's
    communicator alone), the "host" groups one rank of each host (one rank a host: the engine
    between hosts does it all); results against the fold of each group's ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    _init(rank, tmp, "cpu", world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("host", "local"))
    ins = [torch.arange(5, dtype=torch.int64) * (r + 1) + 7 * r for r in range(4)]
    host, local = rank // 2, rank % 2
    t = ins[rank].clone()
    dist.all_reduce(t, group=mesh.get_group("local"))
    assert torch.equal(t, ins[2 * host] + ins[2 * host + 1]), ("local", t)
    t = ins[rank].clone()
    dist.all_reduce(t, group=mesh.get_group("host"))
    assert torch.equal(t, ins[local] + ins[2 + local]), ("host", t)
    made = sorted(c[1:3] for c in StoreCommunicator.calls if c[0] == "made")
    # The world group's (local rank of two a host), the "local" group's (two ranks of one
    # host), the "host" group's (one rank a host).
    assert made == sorted([(local, 2), (local, 2), (0, 1)]), made
    dist.destroy_process_group()


def run_rank_when_a_host_dies(rank, tmp):
    """Two fake hosts x two ranks (host-b: ranks 1 and 3), gloo between them; after one checked
    all-reduce host-b's ranks die of SIGKILL: host-a's next all-reduce raises within seconds, a
    RuntimeError naming the exchange across hosts, its engine and its ranks."""
    import time

    _init(rank, tmp, "cpu", world_size=4)
    t = torch.arange(9, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(9, dtype=torch.int64) * 10), t
    if rank % 2:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        took, text = time.monotonic() - started, str(e)
        assert "an exchange across hosts failed (gloo among ranks %d, %d, local rank %d" % (rank, rank + 1, rank // 2) \
            in text, text
        assert "make a new group" in text and took < 30, (took, text)
        assert type(e) is type(e.__cause__), ("the engine's exception type kept", type(e), type(e.__cause__))
    else:
        raise AssertionError("rank %d: an all-reduce with a dead host returned" % rank)
    os._exit(0)  # the group's teardown would wait for the dead host


def _run_two(tmp_path, mode, world=2):
    env = dict(os.environ, GP2P_TEST_DIR=os.path.dirname(__file__), GP2P_TEST_TMP=str(tmp_path))
    ranks = []
    for r in range(world):
        if mode in ("hosts", "host-killed"):
            env = dict(env, GP2P_HOST_ID="host-%s" % "ab"[r % 2], GP2P_ACROSS_HOSTS="gloo",
                       GP2P_ACROSS_CHUNK_BYTES="4096")
        if mode == "mesh":
            env = dict(env, GP2P_HOST_ID="host-%s" % "ab"[r // 2], GP2P_ACROSS_HOSTS="gloo")
        ranks.append(subprocess.Popen([sys.executable, "-c", _RANK, str(r), mode], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=120)[0] for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(ranks, outputs)):
        killed = mode == "host-killed" and r % 2
        assert p.returncode == (-signal.SIGKILL if killed else 0), "rank %d: exit %s:\n%s" % (r, p.returncode, out)


def test_torch_distributed_calls_reach_the_communicator_and_give_right_results(tmp_path):
    _run_two(tmp_path, "comm")


def test_cpu_tensors_of_a_gpu_group_go_to_the_gloo_group_beside_it(tmp_path):
    _run_two(tmp_path, "gloo")


def test_a_group_across_two_hosts_runs_two_levels(tmp_path):
    _run_two(tmp_path, "hosts", world=4)


def test_a_host_by_local_device_mesh_puts_local_on_this_library_and_host_between_hosts(tmp_path):
    _run_two(tmp_path, "mesh", world=4)


def test_a_host_that_dies_makes_the_others_raise_an_error_that_names_the_exchange(tmp_path):
    _run_two(tmp_path, "host-killed", world=4)


def test_a_group_of_more_ranks_than_a_communicator_takes_is_refused_at_creation():
    from datetime import timedelta

    from geforce_p2p._torch_backend import GP2PProcessGroup

    for world, said in ((0, "0 ranks"), (9, "9 ranks on one host"), (16, "16 ranks on one host")):
        store = dist.HashStore()
        for r in range(1, world):  # the other ranks' hosts: this one's
            store.set("gp2p/host/%d" % r, geforce_p2p_hosts().host_id())
        with pytest.raises(ValueError, match="world_size: %s; the gp2p backend runs 1 to 8 ranks a host" % said):
            GP2PProcessGroup(store, 0, world, timedelta(seconds=1), communicator=StoreCommunicator,
                             device="cpu", unique_id=lambda: "x")
    # Across hosts a group may hold more than 8, as long as no host holds more.
    store = dist.HashStore()
    for r in range(1, 18):
        store.set("gp2p/host/%d" % r, "host-%d" % (r % 2))
    with pytest.raises(ValueError, match="9 ranks on one host"):
        os.environ["GP2P_HOST_ID"] = "host-0"
        try:
            GP2PProcessGroup(store, 0, 18, timedelta(seconds=1), communicator=StoreCommunicator, device="cpu",
                             unique_id=lambda: "x")
        finally:
            del os.environ["GP2P_HOST_ID"]


def geforce_p2p_hosts():
    from geforce_p2p import _hosts

    return _hosts


def test_every_op_the_communicator_runs_has_its_torch_op():
    from geforce_p2p._api import REDUCE_OPS
    from geforce_p2p._torch_backend import _OPS, op_name

    assert sorted(_OPS.values()) == sorted(REDUCE_OPS)
    assert op_name(dist.ReduceOp.PRODUCT) == "prod"
    with pytest.raises(ValueError, match="op: .*SUM, AVG"):
        op_name(dist.ReduceOp.BXOR)


def test_register_backend_is_idempotent_and_names_the_backend():
    from geforce_p2p import distributed as gpd

    assert gpd.register_backend("gp2p_registered_twice") == "gp2p_registered_twice"
    assert gpd.register_backend("gp2p_registered_twice") == "gp2p_registered_twice"
    assert hasattr(dist.Backend, "GP2P_REGISTERED_TWICE")
