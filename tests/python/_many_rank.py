"""One rank of test_many.py's N-process tests: ``python _many_rank.py SCENARIO RANK WORLD INIT``
(``_door_rank.py`` imports its helpers, under the same arguments).

Every rank makes every rank's inputs from seeds and checks its results against a float64 CPU
reference; a failed check exits non-zero with the reason. Rank r runs on GPU r modulo the GPUs
visible (all on cuda:0 on a machine of one GPU, where an MPS daemon lets them run at once).
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import _package  # noqa: E402

gp = _package.load()
gpd = gp.distributed

SCENARIO, RANK, WORLD, INIT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# Up to eight ranks on one machine: torch's CPU threads per process times eight would
# oversubscribe its cores, and every collective waits for the slowest rank's inputs.
torch.set_num_threads(2)
DEVICE = torch.device("cuda", RANK % torch.cuda.device_count())
torch.cuda.set_device(DEVICE)

def step(what):
    """Progress on stderr, so a rank that stalls shows where."""
    print("rank %d: %s" % (RANK, what), file=sys.stderr, flush=True)


OPS = ("sum", "avg", "min", "max", "prod")
TORCH_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8,
          torch.int8)


def inputs(case, n, dtype, world=WORLD):
    """Every rank's input of case `case`: fresh random values, never zeros; products of
    values near 1 stay representable, integers stay small enough that sums do not wrap."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(case * 1009 + r)
        if dtype.is_floating_point:
            t = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
            t = torch.where(torch.rand(n, generator=g, dtype=torch.float64) < 0.5, -t, t)
        else:
            t = torch.randint(1, 4, (n,), generator=g, dtype=torch.int64)
        out.append(t.to(dtype))
    return out


def reference(parts, op):
    """`op` over `parts` in float64 (int64 for integers)."""
    wide = [p.to(torch.float64 if p.dtype.is_floating_point else torch.int64) for p in parts]
    acc = wide[0].clone()
    for p in wide[1:]:
        acc = {"sum": torch.add, "avg": torch.add, "min": torch.minimum, "max": torch.maximum,
               "prod": torch.mul}[op](acc, p)
    if op == "avg":
        acc = acc / len(parts) if acc.is_floating_point() else torch.div(acc, len(parts), rounding_mode="trunc")
    return acc


def check(what, got, want, parts=None):
    """`got` (a device tensor) against `want` (float64 or int64 on the CPU): exact for
    integers and for min/max, within the fold's rounding (N + 1 units of the dtype) of the sum
    of magnitudes for floats."""
    got = got.cpu()
    if not got.dtype.is_floating_point:
        bad = (got.to(torch.int64) != want.to(got.dtype).to(torch.int64)).nonzero()
        assert bad.numel() == 0, "%s: %d wrong, first at %s: got %s want %s" % (
            what, bad.numel(), bad[0].item(), got[bad[0]].item(), want.to(got.dtype)[bad[0]].item())
        return
    eps = torch.finfo(got.dtype).eps
    scale = torch.stack([p.abs().to(torch.float64) for p in parts]).sum(0) if parts else want.abs()
    if parts and len(parts) > 1 and "prod" in what:
        scale = torch.stack([p.abs().to(torch.float64) for p in parts]).prod(0)
    bound = (WORLD + 2) * eps * scale + 1e-300
    err = (got.to(torch.float64) - want).abs()
    bad = (err > bound).nonzero()
    assert bad.numel() == 0, "%s: %d wrong, first at %s: got %r want %r" % (
        what, bad.numel(), bad[0].item(), got[bad[0]].item(), want[bad[0]].item())


def lengths(max_bytes, itemsize):
    """Odd lengths on both paths: the one kernel (up to max_bytes) and the rounds above."""
    return (1, 7, 255, max_bytes // itemsize, max_bytes // itemsize + 1, (300 << 10) // itemsize + 3)


def comm_scenario():
    """The communicator itself: every op and dtype at odd lengths, the other collectives,
    capture and replays with new data, and calls back to back."""
    # INIT is the id the test made (every rank is handed it, as rank 0 would hand it out).
    comm = gpd.Communicator(INIT, RANK, WORLD, DEVICE, peer_timeout=60.0, join_timeout=120.0)
    step("joined")
    case, pending = 0, []
    for dtype in DTYPES:
        step("all_reduce %s" % dtype)
        for n in lengths(comm.max_bytes, torch.empty((), dtype=dtype).element_size()):
            for op in OPS:
                case += 1
                parts = inputs(case, n, dtype)
                t = parts[RANK].to(DEVICE)
                comm.all_reduce(t, op)
                pending.append(("all_reduce %s %s n=%d" % (op, dtype, n), t, reference(parts, op), parts))
    part = (100 << 10) // 4 + 5
    step("reduce_scatter, all_gather, broadcast, send")
    for op in OPS:
        case += 1
        parts = inputs(case, WORLD * part, torch.float32)
        out = torch.empty(part, dtype=torch.float32, device=DEVICE)
        comm.reduce_scatter_tensor(out, parts[RANK].to(DEVICE), op)
        mine = [p[RANK * part:(RANK + 1) * part] for p in parts]
        pending.append(("reduce_scatter %s" % op, out, reference(mine, op), mine))
    step("all_gather")
    case += 1
    parts = inputs(case, part, torch.bfloat16)
    out = torch.empty(WORLD * part, dtype=torch.bfloat16, device=DEVICE)
    comm.all_gather_into_tensor(out, parts[RANK].to(DEVICE))
    pending.append(("all_gather", out, torch.cat(parts).to(torch.float64), None))
    for root in (0, WORLD - 1):
        step("broadcast from %d" % root)
        case += 1
        parts = inputs(case, 100_001, torch.float16)
        t = parts[RANK].to(DEVICE)
        comm.broadcast(t, root)
        pending.append(("broadcast from %d" % root, t, parts[root].to(torch.float64), None))
    # A ring of sends: rank r sends to r + 1, in an order that cannot stall (even ranks send
    # first, odd ranks receive first; with an odd world the last rank receives first too).
    case += 1
    parts = inputs(case, 70_001, torch.float32)
    got = torch.empty(70_001, dtype=torch.float32, device=DEVICE)
    send_first = RANK % 2 == 0 and not (WORLD % 2 == 1 and RANK == WORLD - 1)
    for way in ("send", "recv") if send_first else ("recv", "send"):
        step(way)
        if way == "send":
            comm.send(parts[RANK].to(DEVICE), (RANK + 1) % WORLD)
        else:
            comm.recv(got, (RANK - 1) % WORLD)
    pending.append(("recv from %d" % ((RANK - 1) % WORLD), got, parts[(RANK - 1) % WORLD].to(torch.float64), None))
    step("checking")
    for what, got, want, parts in pending:
        check(what, got, want, parts)
    step("capture")
    # Captured once, replayed ten times with new data in the captured tensors.
    small = torch.zeros(999, dtype=torch.float32, device=DEVICE)
    large = torch.zeros(200_003, dtype=torch.float32, device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        comm.all_reduce(small, "sum")  # warm-up outside the graph, as torch asks
        comm.all_reduce(large, "max")
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            comm.all_reduce(small, "sum")
            comm.all_reduce(large, "max")
    for replay in range(10):
        case += 1
        a, b = inputs(case, 999, torch.float32), inputs(case + 5000, 200_003, torch.float32)
        small.copy_(a[RANK])
        large.copy_(b[RANK])
        graph.replay()
        torch.cuda.synchronize()
        check("replay %d sum" % replay, small, reference(a, "sum"), a)
        check("replay %d max" % replay, large, reference(b, "max"), b)
    comm.check()
    step("back to back")
    # Two hundred calls back to back, no synchronisation, each on a tensor of its own.
    calls = []
    for c in range(200):
        n = 70_001 if c % 10 == 9 else 333
        parts = inputs(100_000 + c, n, torch.int32)
        t = parts[RANK].to(DEVICE)
        comm.all_reduce(t, "sum")
        calls.append((t, parts))
    for c, (t, parts) in enumerate(calls):
        check("back to back %d" % c, t, reference(parts, "sum"))
    comm.close()


def dist_collectives(what, first_case, dtypes):
    """torch.distributed's collectives on the default group, each against the float64
    reference: every op of all_reduce for `dtypes` at odd lengths, then all_gather_into_tensor,
    reduce_scatter_tensor and broadcast. `what` names the group in failures; cases are
    numbered from `first_case`."""
    case = first_case
    for dtype in dtypes:
        for n in (5, 3001, 100_003):
            for op in OPS:
                case += 1
                parts = inputs(case, n, dtype)
                t = parts[RANK].to(DEVICE)
                dist.all_reduce(t, TORCH_OPS[op])
                check("%s all_reduce %s %s n=%d" % (what, op, dtype, n), t, reference(parts, op), parts)
    parts = inputs(first_case + 900, 4099, torch.float32)
    out = torch.empty(WORLD * 4099, device=DEVICE)
    dist.all_gather_into_tensor(out, parts[RANK].to(DEVICE))
    check("%s all_gather_into_tensor" % what, out, torch.cat(parts).to(torch.float64))
    parts = inputs(first_case + 901, WORLD * 4099, torch.float32)
    out = torch.empty(4099, device=DEVICE)
    dist.reduce_scatter_tensor(out, parts[RANK].to(DEVICE))
    mine = [p[RANK * 4099:(RANK + 1) * 4099] for p in parts]
    check("%s reduce_scatter_tensor" % what, out, reference(mine, "sum"), mine)
    parts = inputs(first_case + 902, 777, torch.float32)
    t = parts[RANK].to(DEVICE)
    dist.broadcast(t, src=WORLD - 1)
    check("%s broadcast" % what, t, parts[WORLD - 1].to(torch.float64))


def backend_scenario(backend="gp2p"):
    """torch.distributed on the gp2p backend (or `backend`: "nccl" through the NCCL door,
    _door_rank.py): its ops, a subgroup, and DDP against a one-process reference."""
    if backend == "gp2p":
        gpd.register_backend()
    dist.init_process_group(backend, init_method=INIT, rank=RANK, world_size=WORLD)
    dist_collectives("dist", 0, (torch.float32, torch.bfloat16, torch.int64))
    # A subgroup of the even ranks (new_group makes it through the backend's creator).
    evens = list(range(0, WORLD, 2))
    sub = dist.new_group(evens, backend=backend)
    if RANK in evens:
        parts = inputs(903, 5000, torch.float32, world=WORLD)
        t = parts[RANK].to(DEVICE)
        dist.all_reduce(t, group=sub)
        chosen = [parts[r] for r in evens]
        check("subgroup all_reduce", t, reference(chosen, "sum"), chosen)
    work_waits_on_another_stream()
    # DDP on a small model: every rank a different batch; the gradients averaged by the
    # backend must equal those of one process over the whole batch.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(DEVICE)
    reference_model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    reference_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    reference_model = reference_model.double()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[DEVICE.index])
    g = torch.Generator().manual_seed(4)
    batches = [torch.randn(16, 64, generator=g) for _ in range(WORLD)]
    ddp(batches[RANK].to(DEVICE)).square().mean().backward()
    loss = sum(reference_model(b.double()).square().mean() for b in batches) / WORLD
    loss.backward()
    for (name, p), ref in zip(model.named_parameters(), reference_model.parameters()):
        err = (p.grad.double().cpu() - ref.grad).abs().max().item()
        assert err < 1e-4, "DDP gradient of %s off by %g" % (name, err)
    step("device mesh, DTensor, FSDP2, the rooted ops and all_to_all_single")
    mesh_components()
    if backend != "gp2p":
        return
    dist.barrier()
    dist.destroy_process_group()


def work_waits_on_another_stream():
    """An async op's Work orders the stream current at wait() after the op, as NCCL's does:
    the op is enqueued on a side stream behind a ~20 ms sleep kernel, and the stream that
    waits reads the result at once (without the order it would read the input). The same
    through get_future(), which DDP's hooks read, and on the op's own stream."""
    side = torch.cuda.Stream()
    for how in ("wait", "get_future", "same stream"):
        parts = inputs(905, 3001, torch.float32)
        t = parts[RANK].to(DEVICE)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # cycles: ~10-20 ms, far longer than the host's next steps
            work = dist.all_reduce(t, async_op=True)
            if how == "same stream":
                work.wait()
                got = t.clone()
        if how == "wait":
            work.wait()
            got = t.clone()  # on the current (default) stream
        elif how == "get_future":
            got = work.get_future().wait()[0].clone()
        torch.cuda.current_stream().wait_stream(side)
        check("Work.%s ordered" % how, got, reference(parts, "sum"), parts)


def mesh_components():
    """What looks the group up by its name (a ProcessGroup without one failed here with
    "ProcessGroup name not set"): init_device_mesh, DTensor redistributions, FSDP2's
    fully_shard against a one-process float64 reference; and the ops built on the collectives
    (reduce, scatter, gather, all_to_all_single, all_to_all)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cuda", (WORLD,))
    whole = torch.cat(inputs(910, 6 * 5, torch.float64)).view(WORLD * 6, 5)
    sharded = distribute_tensor(whole.to(DEVICE), mesh, [Shard(0)])
    check("DTensor shard", sharded.to_local().flatten(), whole[RANK * 6:(RANK + 1) * 6].flatten())
    check("DTensor Shard -> Replicate", sharded.redistribute(mesh, [Replicate()]).to_local().flatten(),
          whole.flatten())
    parts = inputs(911, 4 * WORLD, torch.float64)
    partial = torch.distributed.tensor.DTensor.from_local(parts[RANK].to(DEVICE), mesh, [Partial()])
    check("DTensor Partial -> Shard", partial.redistribute(mesh, [Shard(0)]).to_local(),
          reference(parts, "sum")[RANK * 4:(RANK + 1) * 4], [p[RANK * 4:(RANK + 1) * 4] for p in parts])

    def model():
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).double()

    g = torch.Generator().manual_seed(6)
    batch = torch.randn(4 * WORLD, 32, generator=g, dtype=torch.float64)
    one = model()
    one(batch).square().mean().backward()
    fsdp = model().to(DEVICE)
    for layer in fsdp:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    fsdp(batch.chunk(WORLD)[RANK].to(DEVICE)).square().mean().backward()
    for (name, p), q in zip(fsdp.named_parameters(), one.parameters()):
        err = (p.grad.full_tensor().cpu() - q.grad).abs().max().item()
        assert err < 1e-12, "FSDP2 gradient of %s off by %g" % (name, err)
    parts = inputs(912, 301, torch.float32)
    t = parts[RANK].to(DEVICE)
    dist.reduce(t, dst=WORLD - 1, op=dist.ReduceOp.MAX)
    check("dist.reduce", t, reference(parts, "max") if RANK == WORLD - 1 else parts[RANK].double())
    parts = inputs(913, WORLD * 7, torch.float32)
    got = torch.empty(7, device=DEVICE)
    dist.scatter(got, [c.to(DEVICE) for c in parts[0].chunk(WORLD)] if RANK == 0 else None, src=0)
    check("dist.scatter", got, parts[0][RANK * 7:(RANK + 1) * 7].double())
    outs = [torch.empty(7, device=DEVICE) for _ in range(WORLD)] if RANK == 1 else None
    dist.gather(got, outs, dst=1)
    if RANK == 1:
        check("dist.gather", torch.cat(outs), parts[0].double())
    parts = inputs(914, WORLD * 9, torch.float32)
    swapped = torch.empty(WORLD * 9, device=DEVICE)
    dist.all_to_all_single(swapped, parts[RANK].to(DEVICE))
    check("dist.all_to_all_single", swapped, torch.cat([p[RANK * 9:(RANK + 1) * 9] for p in parts]).double())
    # Sends and receives straight to each rank since the rooted ops and all-to-alls stopped
    # riding on the collectives: uneven splits (some empty), in place, the list form, a reduce
    # whose length the ranks divide (its shards land in place) and a sum.
    sizes = [[(3 * s + 5 * r) % 4 for r in range(WORLD)] for s in range(WORLD)]  # rank s's rows to r
    mine = [inputs(915 + s, sum(sizes[s]) * 3, torch.float32)[s].view(-1, 3) for s in range(WORLD)]
    out = torch.empty(sum(sizes[s][RANK] for s in range(WORLD)), 3, device=DEVICE)
    dist.all_to_all_single(out, mine[RANK].to(DEVICE), output_split_sizes=[sizes[s][RANK] for s in range(WORLD)],
                           input_split_sizes=sizes[RANK])
    want = torch.cat([mine[s][sum(sizes[s][:RANK]):sum(sizes[s][:RANK + 1])] for s in range(WORLD)])
    check("dist.all_to_all_single, uneven splits", out.flatten(), want.flatten().double())
    parts = inputs(916, WORLD * 5, torch.float32)
    t = parts[RANK].to(DEVICE)
    dist.all_to_all_single(t, t)
    check("dist.all_to_all_single in place", t, torch.cat([p[RANK * 5:(RANK + 1) * 5] for p in parts]).double())
    outs = [torch.empty(4, device=DEVICE) for _ in range(WORLD)]
    dist.all_to_all(outs, [c.to(DEVICE) for c in parts[RANK][:4 * WORLD].chunk(WORLD)])
    check("dist.all_to_all", torch.cat(outs), torch.cat([p[RANK * 4:(RANK + 1) * 4] for p in parts]).double())
    parts = inputs(917, WORLD * 64, torch.float32)
    t = parts[RANK].to(DEVICE)
    dist.reduce(t, dst=0)
    check("dist.reduce, sum", t, reference(parts, "sum") if RANK == 0 else parts[RANK].double(),
          parts if RANK == 0 else None)


def server_calls(ca, server):
    """The calls `server` makes on its custom all-reduce object `ca`, eager and captured,
    each result checked; then what it must refuse."""
    world, max_bytes = WORLD, ca.comm.max_bytes
    assert not ca.disabled and ca.fully_connected is False, "built over %d ranks" % world
    step("%s: eager all-reduces" % server)
    case = 100
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        size = torch.finfo(dtype).bits // 8
        # Every path of the one kernel: lines, and (two ranks) flagged chunks up to the limit.
        for n in sorted({16 // size, 1000 * 16 // size, 2048 // size, 8192 // size, max_bytes // size}):
            case += 1
            parts = inputs(case, n, dtype)
            inp = parts[RANK].to(DEVICE)
            assert not ca.disabled and ca.should_custom_ar(inp), "%s n=%d %s" % (server, n, dtype)
            out = ca.custom_all_reduce(inp)
            assert out is not None and out.data_ptr() != inp.data_ptr(), "a new tensor"
            assert out.shape == inp.shape and out.dtype == inp.dtype and out.device == inp.device
            check("%s custom_all_reduce n=%d %s" % (server, n, dtype), out, reference(parts, "sum"), parts)
            assert torch.equal(inp.cpu(), parts[RANK]), "the input is left as it was"
    if server == "vllm":
        step("vllm: all-gather and reduce-scatter members")
        for dtype, rows in ((torch.bfloat16, 3), (torch.float32, 5 * world)):
            case += 1
            parts = inputs(case, rows * 8, dtype)
            inp = parts[RANK].to(DEVICE).view(rows, 8)
            gathered = ca.custom_all_gather(inp)
            assert gathered is not None and gathered.shape == (rows * world, 8)
            check("custom_all_gather %s" % dtype, gathered.flatten(), torch.cat(parts).to(torch.float64))
            if rows % world == 0:
                scattered = ca.custom_reduce_scatter(inp)
                share = rows // world * 8
                want = reference(parts, "sum")[RANK * share:(RANK + 1) * share]
                assert scattered is not None and scattered.shape == (rows // world, 8)
                check("custom_reduce_scatter %s" % dtype, scattered.flatten(), want,
                      [p[RANK * share:(RANK + 1) * share] for p in parts])
            else:
                assert ca.custom_reduce_scatter(inp) is None, "%d rows among %d ranks" % (rows, world)
    case = made_ahead_calls(ca, server, case)
    step("%s: bad input" % server)
    other = "cuda:%d" % ((DEVICE.index + 1) % torch.cuda.device_count()) if torch.cuda.device_count() > 1 else "cpu"
    bad = {
        "non-contiguous": torch.ones(64, 8, device=DEVICE).t(),
        "too big": torch.ones(max_bytes // 4 + 4, device=DEVICE),
        "not a 16-byte multiple": torch.ones(3, device=DEVICE),
        "another device (%s)" % other: torch.ones(64, device=other),
        "complex64": torch.ones(64, dtype=torch.complex64, device=DEVICE),
        "bool": torch.ones(64, dtype=torch.bool, device=DEVICE),
        "empty": torch.ones(0, device=DEVICE),
        "not a tensor": [1.0] * 64,
    }
    for why, t in bad.items():
        before = t.clone() if isinstance(t, torch.Tensor) else list(t)
        assert ca.should_custom_ar(t) is False, why
        assert ca.custom_all_reduce(t) is None, why
        if server == "vllm":
            assert ca.custom_all_gather(t) is None and ca.custom_reduce_scatter(t) is None, why
        same = torch.equal(t.cpu(), before.cpu()) if isinstance(t, torch.Tensor) else t == before
        assert same, "%s: written" % why
    step("%s: capture and replays" % server)
    # As each server's model runner captures (vLLM under inference mode, sglang under no_grad):
    # the outputs come from the graph's pool even so, never from those made ahead.
    no_grad = torch.inference_mode() if server == "vllm" else torch.no_grad()
    no_grad.__enter__()
    n = min(4096, max_bytes // 2)
    inp = torch.zeros(n, dtype=torch.float16, device=DEVICE)
    rows_in = torch.zeros(world, 16, dtype=torch.bfloat16, device=DEVICE)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    # As vLLM does: capture() around the whole capture, its warm-up included.
    with ca.capture(), torch.cuda.stream(stream):
        assert ca.should_custom_ar(inp)
        ca.custom_all_reduce(inp)
        torch.cuda.synchronize()
        ready = ca.comm._native.outputs_ready
        with torch.cuda.graph(graph, stream=stream):
            assert ca.should_custom_ar(inp)
            out = ca.custom_all_reduce(inp)
            twice = ca.custom_all_reduce(out)
            gathered = ca.custom_all_gather(rows_in) if server == "vllm" else None
    assert out.untyped_storage().nbytes() == out.nbytes, "a captured output is its own allocation"
    assert ca.comm._native.outputs_ready == ready, "nothing made ahead while capturing"
    for replay in range(10):
        case += 1
        parts = inputs(case, n, torch.float16)
        inp.copy_(parts[RANK])
        rows = inputs(case + 5000, world * 16, torch.bfloat16)
        rows_in.copy_(rows[RANK].view(world, 16))
        graph.replay()
        torch.cuda.synchronize()
        ca.comm.check()
        want = reference(parts, "sum")
        check("%s replay %d" % (server, replay), out, want, parts)
        check("%s replay %d, its result reduced again" % (server, replay), twice, (out.cpu().to(torch.float64) * world),
              [out.cpu()] * world)
        if gathered is not None:
            check("vllm replay %d all-gather" % replay, gathered.flatten(), torch.cat(rows).to(torch.float64))
    no_grad.__exit__(None, None, None)


def made_ahead_calls(ca, server, case):
    """Eager calls as the servers' model runners make them, with no gradients recorded (vLLM
    under inference mode, sglang under no_grad): small outputs are made a batch at a time.
    Every output is its own memory, held by the caller as long as it likes: 70 results of
    three shapes and two dtypes in turn, all kept, each checked against the reference after
    all were made, then one overwritten and the rest checked again; outputs past 64 KiB and
    those made with gradients on are made one by one."""
    step("%s: eager all-reduces without gradients, outputs made ahead" % server)
    native = ca.comm._native
    kinds = [((512,), torch.float32), ((8, 64), torch.bfloat16), ((4, 100), torch.float32)]
    held = []
    with torch.inference_mode() if server == "vllm" else torch.no_grad():
        for call in range(70):
            shape, dtype = kinds[call % 3] if call < 45 else kinds[0]
            case += 1
            parts = inputs(case, math.prod(shape), dtype)
            inp = parts[RANK].to(DEVICE).view(shape)
            out = ca.custom_all_reduce(inp)
            assert out is not None and out.shape == inp.shape and out.dtype == dtype and out.is_contiguous()
            held.append((out, parts))
        assert native.outputs_ready > 0, "outputs made ahead"
        spans = sorted((o.data_ptr(), o.data_ptr() + o.nbytes) for o, _ in held)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start, "two outputs share memory"
        assert any(o.untyped_storage().nbytes() > o.nbytes for o, _ in held), "some share a batch"
        for call, (out, parts) in enumerate(held):
            check("%s made-ahead output %d" % (server, call), out.flatten(), reference(parts, "sum"), parts)
        held[0][0].fill_(7)
        for call, (out, parts) in enumerate(held[1:], 1):
            check("%s made-ahead output %d after another was written" % (server, call), out.flatten(),
                  reference(parts, "sum"), parts)
        big = (ca.comm.max_bytes // 4) if ca.comm.max_bytes > 64 << 10 else None
        for n, grad in ((big, False), (512, True)):
            if n is None:
                continue
            with torch.inference_mode(False), torch.set_grad_enabled(grad):
                case += 1
                parts = inputs(case, n, torch.float32)
                out = ca.custom_all_reduce(parts[RANK].to(DEVICE))
                assert out.untyped_storage().nbytes() == out.nbytes, "%d elements, gradients %s: one by one" % (n, grad)
                check("%s output of %d, gradients %s" % (server, n, grad), out, reference(parts, "sum"), parts)
    return case


def server_scenario():
    """The calls vLLM and sglang make on their custom all-reduce object, built as each builds
    it over a gloo group of the ranks, and dropped without close() as each drops it."""
    import gc

    dist.init_process_group("gloo", init_method=INIT, rank=RANK, world_size=WORLD)
    # vLLM: keywords only, two it passes that this object does not need.
    ca = gpd.CustomAllreduce(group=dist.group.WORLD, device=DEVICE, symm_mem_enabled=False,
                             register_graph_buffers=True)
    server_calls(ca, "vllm")
    del ca  # dropped, never closed
    gc.collect()
    # sglang: CAClass(group=cpu_group, device=device).
    ca = gpd.CustomAllreduce(group=dist.group.WORLD, device=DEVICE)
    server_calls(ca, "sglang")
    del ca
    gc.collect()
    dist.destroy_process_group()


def hosts_scenario():
    """Two fake hosts of WORLD / 2 ranks (GP2P_HOST_ID by rank, set before the group is made),
    gloo between them (NCCL refuses ranks that share a GPU): every op and dtype at odd lengths
    against the float64 reference, the other collectives, and 200 all-reduces back to back."""
    os.environ["GP2P_HOST_ID"] = "fake-host-%d" % (RANK * 2 // WORLD)
    os.environ["GP2P_ACROSS_HOSTS"] = "gloo"
    os.environ["GP2P_ACROSS_CHUNK_BYTES"] = str(64 << 10)
    gpd.register_backend()
    dist.init_process_group("gp2p", init_method=INIT, rank=RANK, world_size=WORLD)
    dist_collectives("two-level", 5000, DTYPES)
    bufs = []
    for call in range(200):
        parts = inputs(2000 + call, 1001, torch.int64)
        t = parts[RANK].to(DEVICE)
        dist.all_reduce(t)
        bufs.append((t, reference(parts, "sum")))
    for call, (t, want) in enumerate(bufs):
        check("two-level call %d of 200" % call, t, want)
    dist.barrier()
    dist.destroy_process_group()


def host_killed_scenario():
    """Two fake hosts as in hosts_scenario, every rank making the same all-reduces one after
    another, each checked; half a second in, a timer on each of the second host's ranks kills
    it with SIGKILL, inside a call (a host losing power): the first host's ranks must raise
    within the group's timeout from the start of the call that meets the dead host, and again
    on the call after. (test_many.py checks that the killed ranks died of the signal and that
    no segment is left in /dev/shm.)"""
    import signal
    import threading
    import time
    from datetime import timedelta

    os.environ["GP2P_HOST_ID"] = "fake-host-%d" % (RANK * 2 // WORLD)
    os.environ["GP2P_ACROSS_HOSTS"] = "gloo"
    os.environ["GP2P_ACROSS_CHUNK_BYTES"] = str(64 << 10)
    timeout = 20.0
    gpd.register_backend()
    dist.init_process_group("gp2p", init_method=INIT, rank=RANK, world_size=WORLD, timeout=timedelta(seconds=timeout))
    n = (1 << 18) + 3  # 1 MiB of int32 and an odd tail: 17 chunks, every stage in flight
    dist.barrier()
    if RANK >= WORLD // 2:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    deadline, calls = time.monotonic() + 60, 0
    while True:
        parts = inputs(3000 + calls, n, torch.int32)
        t = parts[RANK].to(DEVICE)
        started = time.monotonic()
        try:
            dist.all_reduce(t)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (whatever the engine between hosts raises)
            took = time.monotonic() - started
            step("call %d, the first to meet the dead host, raised after %.2f s: %s"
                 % (calls, took, str(e).splitlines()[0][:300]))
            assert "an exchange across hosts failed (gloo among ranks" in str(e), "rank %d: %s" % (RANK, e)
            break
        check("call %d before the kill" % calls, t, reference(parts, "sum"))
        calls += 1
        assert time.monotonic() < deadline, "rank %d: %d calls in 60 s, none raised" % (RANK, calls)
    assert RANK < WORLD // 2, "rank %d: alive past its kill" % RANK
    assert calls > 0, "rank %d: no call completed before the kill" % RANK
    assert took < timeout + 5, "rank %d: raised after %.1f s, past the %.0f s timeout" % (RANK, took, timeout)
    started = time.monotonic()
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        took = time.monotonic() - started
        step("the call after raised after %.2f s: %s" % (took, str(e).splitlines()[0][:200]))
        assert took < timeout + 5, "rank %d: the call after raised after %.1f s" % (RANK, took)
    else:
        raise AssertionError("rank %d: the call after a dead host returned" % RANK)
    # No destroy_process_group: its barrier would wait for the dead host.


if __name__ == "__main__":
    {"comm": comm_scenario, "backend": backend_scenario, "server": server_scenario,
     "hosts": hosts_scenario, "host-killed": host_killed_scenario}[SCENARIO]()
    print("rank %d of %d: %s passed" % (RANK, WORLD, SCENARIO))
    sys.stdout.flush()
    if SCENARIO == "host-killed":
        os._exit(0)  # the group's teardown would wait for the dead host's ranks
