"""One rank of test_nccl_door_gpu.py's tests: programs that call NCCL, run with the NCCL door in
NCCL's place (the test starts each rank in ``geforce_p2p.nccl.environment()``):
``python _door_rank.py SCENARIO RANK WORLD INIT``, INIT a ``file://`` path.

- ``nccl``: torch.distributed's ``"nccl"`` backend: every op of all_reduce on eight dtypes, the
  other collectives, a subgroup, DDP, device mesh, DTensor, FSDP2, reduce, scatter, gather,
  all_to_all_single even and uneven, batch_isend_irecv, a collective captured in a CUDA graph
  and replayed with new data; each against a float64 reference (``_many_rank.py``'s helpers).
- ``pynccl``: NCCL's C functions through ctypes, declared as vLLM's pynccl declares them (its
  ``VLLM_NCCL_SO_PATH`` names the door), on torch tensors and torch's current stream, eager and
  captured in a CUDA graph.
- ``killed``: the last rank kills itself (SIGKILL) inside a call; the others' calls must end
  (torch's watchdog aborts the communicator) within the group's timeout.
"""

import ctypes
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _many_rank import (  # noqa: E402
    DEVICE, DTYPES, INIT, RANK, SCENARIO, WORLD, backend_scenario, check, dist_collectives, inputs, reference, step,
)


def nccl_scenario():
    backend_scenario("nccl")
    step("all eight dtypes through every op")
    dist_collectives("nccl dtypes", 2000, DTYPES)
    step("batch_isend_irecv around the ring, both ways")
    parts = inputs(2100, 1001, torch.float32)
    send = parts[RANK].to(DEVICE)
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    from_left, from_right = torch.empty_like(send), torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.isend, send, left), dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    check("batch_isend_irecv from the left", from_left, parts[left].double())
    check("batch_isend_irecv from the right", from_right, parts[right].double())
    step("all_to_all_single with uneven splits")
    # Rank r sends (r + d) % 3 + 1 elements to rank d.
    sizes = [[(r + d) % 3 + 1 for d in range(WORLD)] for r in range(WORLD)]
    parts = [inputs(2200 + r, sum(sizes[r]), torch.float32)[r] for r in range(WORLD)]
    received = torch.empty(sum(sizes[r][RANK] for r in range(WORLD)), device=DEVICE)
    dist.all_to_all_single(received, parts[RANK].to(DEVICE), output_split_sizes=[sizes[r][RANK] for r in range(WORLD)],
                           input_split_sizes=sizes[RANK])
    want = torch.cat([parts[r][sum(sizes[r][:RANK]):sum(sizes[r][:RANK + 1])] for r in range(WORLD)])
    check("all_to_all_single uneven", received, want.double())
    step("an all_reduce captured in a CUDA graph, replayed with new data")
    t = torch.empty(4099, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # a warm-up call outside the capture, as torch asks
        dist.all_reduce(t.fill_(1.0))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(t)
    for replay in range(3):
        parts = inputs(2300 + replay, 4099, torch.float32)
        t.copy_(parts[RANK])
        graph.replay()
        check("replay %d" % replay, t, reference(parts, "sum"), parts)
    dist.barrier()
    dist.destroy_process_group()


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def pynccl_library():
    """The door as vLLM's pynccl opens it (VLLM_NCCL_SO_PATH), each function declared as the
    wrapper declares it (``vllm/distributed/device_communicators/pynccl_wrapper.py``)."""
    lib = ctypes.CDLL(os.environ["VLLM_NCCL_SO_PATH"])
    p, i, z, vp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "ncclGetErrorString": ([i], ctypes.c_char_p),
        "ncclGetVersion": ([ctypes.POINTER(i)], i),
        "ncclGetUniqueId": ([ctypes.POINTER(UniqueId)], i),
        "ncclCommInitRank": ([vp, i, UniqueId, i], i),
        "ncclAllReduce": ([p, p, z, i, i, p, p], i),
        "ncclAllGather": ([p, p, z, i, p, p], i),
        "ncclReduceScatter": ([p, p, z, i, i, p, p], i),
        "ncclBroadcast": ([p, p, z, i, i, p, p], i),
        "ncclSend": ([p, z, i, i, p, p], i),
        "ncclRecv": ([p, z, i, i, p, p], i),
        "ncclGroupStart": ([], i),
        "ncclGroupEnd": ([], i),
        "ncclCommDestroy": ([p], i),
    }
    for name, (args, res) in signatures.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


NCCL_TYPES = {torch.float32: 7, torch.float16: 6, torch.bfloat16: 9, torch.int32: 2}
NCCL_SUM = 0


def pynccl_scenario():
    lib = pynccl_library()

    def ok(code, what):
        assert code == 0, "%s: %s (%s)" % (what, code, lib.ncclGetErrorString(code))

    store = dist.FileStore(INIT[len("file://"):], WORLD)
    if RANK == 0:
        uid = UniqueId()
        ok(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        store.set("id", bytes(uid.internal))
    uid = UniqueId()
    ctypes.memmove(ctypes.byref(uid), store.get("id"), 128)
    comm = ctypes.c_void_p()
    ok(lib.ncclCommInitRank(ctypes.byref(comm), WORLD, uid, RANK), "ncclCommInitRank")
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # noqa: E731
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    for case, dtype in enumerate(NCCL_TYPES):
        for n in (1, 1023, 300_001):
            parts = inputs(3000 + case * 7 + n % 7, n, dtype)
            src, out = parts[RANK].to(DEVICE), torch.empty(n, dtype=dtype, device=DEVICE)
            ok(lib.ncclAllReduce(ptr(src), ptr(out), n, NCCL_TYPES[dtype], NCCL_SUM, comm, stream()), "ncclAllReduce")
            check("pynccl all_reduce %s n=%d" % (dtype, n), out, reference(parts, "sum"), parts)
    parts = inputs(3100, 777, torch.float16)
    whole = torch.empty(WORLD * 777, dtype=torch.float16, device=DEVICE)
    ok(lib.ncclAllGather(ptr(parts[RANK].to(DEVICE)), ptr(whole), 777, 6, comm, stream()), "ncclAllGather")
    check("pynccl all_gather", whole, torch.cat(parts).double())
    parts = inputs(3101, WORLD * 513, torch.float32)
    out = torch.empty(513, device=DEVICE)
    ok(lib.ncclReduceScatter(ptr(parts[RANK].to(DEVICE)), ptr(out), 513, 7, NCCL_SUM, comm, stream()),
       "ncclReduceScatter")
    mine = [p[RANK * 513:(RANK + 1) * 513] for p in parts]
    check("pynccl reduce_scatter", out, reference(mine, "sum"), mine)
    parts = inputs(3102, 4097, torch.int32)
    t = parts[RANK].to(DEVICE)
    ok(lib.ncclBroadcast(ptr(t), ptr(t), 4097, 2, WORLD - 1, comm, stream()), "ncclBroadcast")
    check("pynccl broadcast", t, parts[WORLD - 1].to(torch.int64))
    # vLLM's send/recv pairs, grouped: every rank sends to the next and receives from the last.
    parts = inputs(3103, 65_537, torch.float32)
    got = torch.empty(65_537, device=DEVICE)
    ok(lib.ncclGroupStart(), "ncclGroupStart")
    ok(lib.ncclSend(ptr(parts[RANK].to(DEVICE)), 65_537, 7, (RANK + 1) % WORLD, comm, stream()), "ncclSend")
    ok(lib.ncclRecv(ptr(got), 65_537, 7, (RANK - 1) % WORLD, comm, stream()), "ncclRecv")
    ok(lib.ncclGroupEnd(), "ncclGroupEnd")
    check("pynccl send/recv", got, parts[(RANK - 1) % WORLD].double())
    # Captured in a CUDA graph, as vLLM captures its all-reduces, and replayed with new data.
    src, out = torch.empty(8191, device=DEVICE), torch.empty(8191, device=DEVICE)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ok(lib.ncclAllReduce(ptr(src), ptr(out), 8191, 7, NCCL_SUM, comm, stream()), "captured ncclAllReduce")
    for replay in range(3):
        parts = inputs(3200 + replay, 8191, torch.float32)
        src.copy_(parts[RANK])
        graph.replay()
        check("pynccl replay %d" % replay, out, reference(parts, "sum"), parts)
    torch.cuda.synchronize()
    ok(lib.ncclCommDestroy(comm), "ncclCommDestroy")


def killed_scenario():
    import signal
    import threading
    import time

    timeout = 20.0
    dist.init_process_group("nccl", init_method=INIT, rank=RANK, world_size=WORLD, timeout=timedelta(seconds=timeout))
    n = (1 << 20) + 3
    dist.barrier()
    if RANK == WORLD - 1:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    started = time.monotonic()
    for call in range(100_000):
        parts = inputs(4000 + call % 10, n, torch.float32)
        t = parts[RANK].to(DEVICE)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        step("call %d done after %.2f s" % (call, time.monotonic() - started))
        assert time.monotonic() - started < 3 * timeout, "rank %d: still calling after %.0f s" % (RANK, 3 * timeout)


if __name__ == "__main__":
    {"nccl": nccl_scenario, "pynccl": pynccl_scenario, "killed": killed_scenario}[SCENARIO]()
    print("rank %d of %d: %s passed" % (RANK, WORLD, SCENARIO))
    sys.stdout.flush()
