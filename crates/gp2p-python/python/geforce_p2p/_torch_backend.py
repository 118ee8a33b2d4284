"""The ``gp2p`` backend of torch.distributed: a process group over :class:`Communicator`.

Imported only by :func:`geforce_p2p.distributed.register_backend`, so that the package
never needs torch to import. Tensors on the group's device go to the communicator (1 to 8
ranks: all_reduce, all_gather, reduce_scatter, broadcast, send and recv), each op enqueued on the device's
current stream at the call, like NCCL's; its Work objects are complete on the host, and
``wait()`` makes the then-current stream wait for the op, as NCCL's does (``_Enqueued``). Everything else
goes to a gloo group the process group keeps beside it: CPU tensors (torch hands a
``ProcessGroup`` its creator returns every device's tensors, even under
``"cpu:gloo,cuda:gp2p"``), the barrier (a host barrier) and, for CPU tensors, the ops the
communicator does not run. Reduce, scatter, gather and ``all_to_all_single`` (even splits)
on the group's device run through the collectives (see the methods); the list
``all_to_all``, uneven splits and recv from any source raise ``NotImplementedError`` naming
the op. Sends and receives
pair with the peer's calls in call order (tags are not matched); as with NCCL, two ranks that
both send before they receive stall once a message outgrows the staging slots (three of 8 MiB
by default), until the peer timeout.

A group whose ranks sit on several hosts (``geforce_p2p._hosts.host_id``: host name and boot
id, or ``GP2P_HOST_ID``) runs this library's communicator among each host's ranks and an
engine for networks between hosts (NCCL for CUDA tensors, or gloo: ``GP2P_ACROSS_HOSTS``):
all_reduce (in chunks, each chunk's exchange across hosts in flight while the next chunk's
reduce-scatter is enqueued), broadcast, all_gather and reduce_scatter in two levels
(:mod:`geforce_p2p._two_level`); every host must hold the same number of ranks, at most 8;
send and recv across hosts raise ``NotImplementedError``.

The group's name: torch names a group through its ``ProcessGroup``'s registered backends, and
a ``ProcessGroup`` subclass has none of its own, so the name stayed unset and everything that
looks a group up by name failed with "ProcessGroup name not set" (``init_device_mesh``,
DTensor, FSDP2's ``fully_shard``, the functional collectives). The gloo group is registered
as its CPU backend, which carries the name (and is where CPU tensors go anyway). A c10d
``Backend`` subclass would be torch's other door, but torch 2.11's binding cannot be
subclassed from Python ("No constructor defined").
"""

from datetime import timedelta
from typing import Any, Callable, Iterator, List

import torch
import torch.distributed as dist

from . import _hosts, _two_level

# torch's reduce ops by the names the communicator takes; the rest are refused by name.
_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MIN: "min",
        dist.ReduceOp.MAX: "max", dist.ReduceOp.PRODUCT: "prod"}

# The most ranks a communicator takes (geforce_p2p.distributed.MAX_RANKS).
_MAX_RANKS = 8

# Where rank 0 publishes the communicator's id, in the group's own (prefixed) store.
UNIQUE_ID_KEY = "gp2p/unique_id"

# The longest wait for a peer the communicator takes (CommOptions' bound).
_LONGEST_PEER_TIMEOUT = timedelta(hours=1)

_NOT_BUILT = ("not built yet in the gp2p backend for CUDA tensors; run it on a second process group with "
              "backend='nccl' (NCCL uses shared memory where P2P is off)")


def op_name(reduce_op: Any) -> str:
    for op, name in _OPS.items():
        if reduce_op == op:
            return name
    raise ValueError("op: %s is not one the gp2p backend runs; use one of SUM, AVG, MIN, MAX, PRODUCT" % reduce_op)


def _op(opts: Any) -> str:
    """The reduce op an op's options name (sum without options)."""
    return op_name(opts.reduceOp) if opts is not None else "sum"


def _gloo_only(what: str, name: str) -> Callable[..., Any]:
    """Gloo's op `name` for CPU tensors; for the group's device, NotImplementedError naming
    `what`."""

    def op(self: "GP2PProcessGroup", *args: Any) -> Any:
        if self._ours(args):
            raise NotImplementedError("%s is %s" % (what, _NOT_BUILT))
        return self._to_gloo(name, *args)

    op.__name__ = name
    return op


def _tensors_in(args: Any) -> Iterator[Any]:
    """Every tensor in an op's arguments (tensors, lists of them, lists of lists)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors_in(a)


class _Enqueued(dist.Work):
    """The Work of an op this backend enqueued on the device's current stream (``stream``, a
    raw handle; None for CPU tensors): complete on the host at once. ``wait()`` orders the
    then-current stream after the op, as NCCL's does: nothing to do on the op's own stream;
    on another, it waits for an event recorded on the op's stream (after the op, and after
    whatever was enqueued there since, which only orders it later).

    Made this way because a completed CUDA-aware future wrapped in a Work
    (``_create_work_from_future``) cost 12-17 us of host time a call, and its ``wait()`` 2-7
    more, against about 1.6 for this object and 1.5 for its wait (one H200, two and four
    ranks under MPS: ``benches/python/backend_host_parts.py``)."""

    def __init__(self, result: List[Any], device: Any, stream: Any):
        super().__init__()
        self._result, self._device, self._stream = result, device, stream

    def wait(self, timeout: Any = None) -> bool:
        if self._stream is not None and _current_raw_stream(self._device.index) != self._stream:
            _order_after(self._device, self._stream)
        return True

    def get_future(self) -> Any:
        """A completed CUDA-aware future of the result, ordered after the op on the
        then-current stream (DDP's communication hooks read it)."""
        self.wait()
        future = torch.futures.Future(devices=[self._device] if self._stream is not None else [])
        future.set_result(self._result)
        return future

    def result(self) -> List[Any]:
        return self._result

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Any:
        return None

    def synchronize(self) -> None:
        self.wait()


def _current_raw_stream(index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(index)


def _order_after(device: Any, stream: int) -> None:
    """Make ``device``'s current stream wait for the work enqueued so far on ``stream`` (a raw
    handle of that device; 0 is its default stream)."""
    with torch.cuda.device(device):
        op_stream = torch.cuda.default_stream(device) if stream == 0 else torch.cuda.ExternalStream(stream)
        event = torch.cuda.Event()
        event.record(op_stream)
        torch.cuda.current_stream(device).wait_event(event)


class _Unsplittable:
    """The answer of :meth:`GP2PProcessGroup._get_backend`: a backend that cannot split."""

    supports_splitting = False


class GP2PProcessGroup(dist.ProcessGroup):
    """One rank of a ``gp2p`` process group (see the module docs).

    Made by torch.distributed through the creator :func:`register_backend` registers.
    ``communicator`` makes the :class:`Communicator` (replaceable for tests), ``device`` is
    this rank's device: the current CUDA device at creation, as for NCCL. The group's timeout
    is also how long a collective waits for its peer (at most an hour).
    """

    def __init__(self, store: Any, rank: int, world_size: int, timeout: timedelta, *,
                 communicator: Callable[..., Any], device: Any, unique_id: Callable[[], str]):
        super().__init__(rank, world_size)
        if world_size < 1:
            raise ValueError("world_size: %d ranks; the gp2p backend runs 1 to %d ranks a host"
                             % (world_size, _MAX_RANKS))
        # Every rank's host first (store.get waits, up to the store's timeout, for each).
        hosts = _hosts.Hosts(_two_level.host_names(store, rank, world_size, _hosts.host_id()))
        if hosts.local > _MAX_RANKS:
            raise ValueError("world_size: %d ranks on one host; the gp2p backend runs 1 to %d ranks a host (use "
                             "NCCL, or subgroups of at most %d, for more)"
                             % (hosts.local, _MAX_RANKS, _MAX_RANKS))
        self._device = torch.device(device)
        # Plain CUDA tensors on a CUDA group are told apart with one attribute (see `_ours`).
        self._on_cuda = self._device.type == "cuda"
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size, timeout)
        # The backend that carries the group's name (see the module docs).
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        peer_timeout = min(timeout, _LONGEST_PEER_TIMEOUT).total_seconds()
        if hosts.count > 1:
            # Several hosts: this library inside each, an engine for networks between them.
            self._comm = _two_level.join(store, rank, world_size, timeout, hosts, device=self._device,
                                         communicator=communicator, unique_id=unique_id,
                                         peer_timeout=peer_timeout)
            return
        if rank == 0:
            store.set(UNIQUE_ID_KEY, unique_id())
        # get() waits (up to the store's timeout) until rank 0 has set it.
        uid = store.get(UNIQUE_ID_KEY).decode()
        index = self._device.index if self._device.type == "cuda" else 0
        self._comm = communicator(uid, rank, world_size, index, peer_timeout=peer_timeout,
                                  join_timeout=timeout.total_seconds())

    def getBackendName(self) -> str:  # noqa: N802  (torch's name)
        return "gp2p"

    def __repr__(self) -> str:
        return "GP2PProcessGroup(rank %d of %d on %s)" % (self.rank(), self.size(), self._device)

    def _ours(self, *args: Any) -> bool:
        """Whether the op's tensors are on the group's device (the communicator's), or
        elsewhere (gloo's); refuses a mix."""
        if self._on_cuda and len(args) == 1 and type(args[0]) is list and len(args[0]) == 1:
            # The usual call, [tensor]: one attribute read, not a device object and a set.
            (t,) = args[0]
            if type(t) is torch.Tensor:
                return t.is_cuda
        kinds = {t.device.type == self._device.type for t in _tensors_in(args)}
        if len(kinds) > 1:
            raise ValueError("tensors: some on %s, some not; give one op tensors of one device type"
                             % self._device.type)
        return kinds != {False}

    def _to_gloo(self, name: str, *args: Any, opts: Any = None) -> Any:
        """Gloo's op `name` (its bindings refuse None for options: they go only when given)."""
        return getattr(self._gloo, name)(*args, *([opts] if opts is not None else []))

    def _done(self, result: List[Any]) -> Any:
        """A Work already complete on the host whose ``wait()`` orders the then-current
        stream after the op, which is on the device's current stream by now (the
        communicator enqueues there; across hosts, the second level's work is waited for on
        it before the op returns): see :class:`_Enqueued`."""
        stream = _current_raw_stream(self._device.index) if self._on_cuda else None
        return _Enqueued(result, self._device, stream)

    # -- the ops the communicator runs --------------------------------------------------------

    def allreduce(self, tensors: List[Any], opts: Any = None) -> Any:
        if not self._ours(tensors):
            return self._to_gloo("allreduce", tensors, opts=opts)
        op = _op(opts)
        for t in tensors:
            self._comm.all_reduce(t, op)
        return self._done(tensors)

    def allreduce_coalesced(self, tensors: List[Any], opts: Any = None) -> Any:
        if not self._ours(tensors):
            return self._to_gloo("allreduce_coalesced", tensors, opts=opts)
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: List[Any], opts: Any = None) -> Any:
        if not self._ours(tensors):
            return self._to_gloo("broadcast", tensors, opts=opts)
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            self._comm.broadcast(t, root)
        return self._done(tensors)

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        if not self._ours(output, input):
            return self._to_gloo("_allgather_base", output, input, opts=opts)
        self._comm.all_gather_into_tensor(output, input)
        return self._done([output])

    _allgather_base = all_gather_single  # its name before torch 2.12

    def allgather(self, outputs: List[List[Any]], inputs: List[Any], opts: Any = None) -> Any:
        """The list form: ``outputs[i][r]`` becomes rank r's ``inputs[i]``, through one
        gathered tensor per input."""
        if not self._ours(outputs, inputs):
            return self._to_gloo("allgather", outputs, inputs, opts=opts)
        for outs, inp in zip(outputs, inputs):
            gathered = torch.empty((len(outs) * inp.numel(),), dtype=inp.dtype, device=inp.device)
            self._comm.all_gather_into_tensor(gathered, inp.contiguous().view(-1))
            for out, part in zip(outs, gathered.chunk(len(outs))):
                out.copy_(part.view_as(out))
        return self._done([t for outs in outputs for t in outs])

    def allgather_into_tensor_coalesced(self, outputs: List[Any], inputs: List[Any], opts: Any = None) -> Any:
        if not self._ours(outputs, inputs):
            return self._to_gloo("allgather_into_tensor_coalesced", outputs, inputs, opts=opts)
        for out, inp in zip(outputs, inputs):
            self._comm.all_gather_into_tensor(out, inp)
        return self._done(list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        if not self._ours(output, input):
            return self._to_gloo("_reduce_scatter_base", output, input, opts=opts)
        op = _op(opts)
        self._comm.reduce_scatter_tensor(output, input, op)
        return self._done([output])

    _reduce_scatter_base = reduce_scatter_single  # its name before torch 2.12

    def reduce_scatter(self, outputs: List[Any], inputs: List[List[Any]], opts: Any = None) -> Any:
        """The list form: ``outputs[i]`` becomes op over ranks of their ``inputs[i][rank]``,
        through one concatenated input per output."""
        if not self._ours(outputs, inputs):
            return self._to_gloo("reduce_scatter", outputs, inputs, opts=opts)
        op = _op(opts)
        for out, ins in zip(outputs, inputs):
            whole = torch.cat([t.reshape(-1) for t in ins])
            # Straight into `out` where it is one run of memory (the usual case).
            mine = out.view(-1) if out.is_contiguous() else torch.empty((out.numel(),), dtype=out.dtype,
                                                                        device=out.device)
            self._comm.reduce_scatter_tensor(mine, whole, op)
            if mine.data_ptr() != out.data_ptr():
                out.copy_(mine.view_as(out))
        return self._done(list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs: List[Any], inputs: List[Any], opts: Any = None) -> Any:
        if not self._ours(outputs, inputs):
            return self._to_gloo("reduce_scatter_tensor_coalesced", outputs, inputs, opts=opts)
        op = _op(opts)
        for out, inp in zip(outputs, inputs):
            self._comm.reduce_scatter_tensor(out, inp, op)
        return self._done(list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def barrier(self, opts: Any = None) -> Any:
        """Every rank has reached it once its Work is waited for: gloo's host barrier (the
        GPU work queued before it is not waited for; synchronise for that)."""
        return self._to_gloo("barrier", opts=opts)

    def _get_backend(self, device: Any) -> Any:
        """What torch asks of a group made with ``device_id`` (and of one it may split): the
        backend of that device. This group has none it could split, so it says so, and
        torch makes new groups through the creator instead."""
        return _Unsplittable()

    def shutdown(self) -> None:
        """Let go of the communicator (its memory is released once the GPU work of its calls
        is done) and of the gloo group: ``destroy_process_group`` calls this."""
        self._comm.close()
        getattr(self._gloo, "shutdown", lambda: None)()

    def abort(self) -> None:
        self.shutdown()

    # -- the ops it runs for CPU tensors only ---------------------------------------------

    def send(self, tensors: List[Any], dst: int, tag: int = 0) -> Any:
        if not self._ours(tensors):
            return self._gloo.send(tensors, dst, tag)
        for t in tensors:
            self._comm.send(t, dst)
        return self._done(tensors)

    def recv(self, tensors: List[Any], src: int, tag: int = 0) -> Any:
        if not self._ours(tensors):
            return self._gloo.recv(tensors, src, tag)
        for t in tensors:
            self._comm.recv(t, src)
        return self._done(tensors)

    # -- rooted ops and the all-to-all, through the collectives above ---------------------------
    # Rare in training and serving (DTensor's distribute_tensor scatters once, a checkpoint
    # gathers): each runs as the collective that moves at least its bytes, not a rooted
    # schedule of its own. Among N ranks scatter and gather move N times their data through the
    # links, the all-to-all N times.

    def reduce(self, tensors: List[Any], opts: Any = None) -> Any:
        """The root's tensor becomes op over every rank's; the others' are left as they were
        (an all-reduce, into a copy off the root)."""
        if not self._ours(tensors):
            return self._to_gloo("reduce", tensors, opts=opts)
        root, op = opts.rootRank, _op(opts)
        for t in tensors:
            self._comm.all_reduce(t if self.rank() == root else t.clone(memory_format=torch.contiguous_format), op)
        return self._done(tensors)

    def scatter(self, outputs: List[Any], inputs: List[List[Any]], opts: Any = None) -> Any:
        """``outputs[i]`` becomes the root's ``inputs[i][rank]`` (the root's parts broadcast
        as one tensor, each rank keeping its own)."""
        if not self._ours(outputs, inputs):
            return self._to_gloo("scatter", outputs, inputs, opts=opts)
        root, world = opts.rootRank, self.size()
        for i, out in enumerate(outputs):
            if self.rank() == root:
                parts = inputs[i]
                if len(parts) != world or any(p.numel() != out.numel() or p.dtype != out.dtype for p in parts):
                    # Torch checks this before the op; a root that raised here after the others
                    # began the broadcast would leave them waiting until the peer timeout.
                    raise ValueError("scatter_list: needs %d tensors like the output" % world)
                whole = torch.cat([t.reshape(-1) for t in parts])
            else:
                whole = torch.empty((world * out.numel(),), dtype=out.dtype, device=out.device)
            self._comm.broadcast(whole, root)
            out.copy_(whole.view(world, out.numel())[self.rank()].view_as(out))
        return self._done(list(outputs))

    def gather(self, outputs: List[List[Any]], inputs: List[Any], opts: Any = None) -> Any:
        """The root's ``outputs[i][r]`` becomes rank r's ``inputs[i]`` (an all-gather, which the
        root copies out)."""
        if not self._ours(outputs, inputs):
            return self._to_gloo("gather", outputs, inputs, opts=opts)
        world = self.size()
        for i, inp in enumerate(inputs):
            gathered = torch.empty((world * inp.numel(),), dtype=inp.dtype, device=inp.device)
            self._comm.all_gather_into_tensor(gathered, inp.contiguous().view(-1))
            if self.rank() == opts.rootRank:
                for out, part in zip(outputs[i], gathered.chunk(world)):
                    out.copy_(part.view_as(out))
        return self._done([t for outs in outputs for t in outs])

    def alltoall_base(self, output: Any, input: Any, output_splits: List[int], input_splits: List[int],
                      opts: Any = None) -> Any:
        """``all_to_all_single`` with equal splits: part r of ``output`` becomes rank r's part
        ``rank`` of its ``input`` (an all-gather of the inputs, each rank keeping its parts).
        Uneven splits raise ``NotImplementedError``."""
        if not self._ours(output, input):
            return self._to_gloo("alltoall_base", output, input, output_splits, input_splits, opts=opts)
        world = self.size()
        for name, t, splits in (("output", output, output_splits), ("input", input, input_splits)):
            rows = t.shape[0] if t.dim() else 0
            if rows % world or t.dim() == 0:
                raise ValueError("%s: %d rows in dim 0; all_to_all_single needs a multiple of the world size %d"
                                 % (name, rows, world))
            if splits and list(splits) != [rows // world] * world:
                raise NotImplementedError("all_to_all_single with uneven splits is %s" % _NOT_BUILT)
        if output.numel() != input.numel() or output.dtype != input.dtype:
            raise ValueError("output: %d elements of %s, input %d of %s; all_to_all_single needs both alike"
                             % (output.numel(), output.dtype, input.numel(), input.dtype))
        if input.numel() == 0:
            return self._done([output])
        gathered = torch.empty((world * input.numel(),), dtype=input.dtype, device=input.device)
        self._comm.all_gather_into_tensor(gathered, input.contiguous().view(-1))
        mine = gathered.view(world, world, input.numel() // world)[:, self.rank()]
        output.copy_(mine.reshape(output.shape))
        return self._done([output])

    all_to_all_single = alltoall_base  # its name from torch 2.12
    recv_anysource = _gloo_only("recv", "recv_anysource")
    alltoall = _gloo_only("all_to_all", "alltoall")
