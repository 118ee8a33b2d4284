"""The ``gp2p`` backend of torch.distributed: a process group over :class:`Communicator`.

Imported only by :func:`geforce_p2p.distributed.register_backend`, so that the package
never needs torch to import. Tensors on the group's device go to the communicator (1 to 8
ranks: all_reduce, all_gather, reduce_scatter, broadcast, send and recv), each op enqueued on the device's
current stream at the call, like NCCL's; its Work objects are complete on the host, and
``wait()`` makes the then-current stream wait for the op, as NCCL's does (``_Enqueued``). Everything else
goes to a gloo group the process group keeps beside it: CPU tensors (torch hands a
``ProcessGroup`` its creator returns every device's tensors, even under
``"cpu:gloo,cuda:gp2p"``), the barrier (a host barrier) and, for CPU tensors, the ops the
communicator does not run. Scatter, gather, ``all_to_all`` and ``all_to_all_single`` (any
splits) on the group's device are sends and receives, each part straight to its rank; reduce
is a reduce-scatter whose shards go to the root. recv from any source raises
``NotImplementedError``. Sends and receives
pair with the peer's calls in call order (tags are not matched); as with NCCL, two ranks that
both send before they receive stall once a message outgrows the staging slots (three of 8 MiB
by default between two ranks, four of 64 MiB / N among more, three larger ones where
/dev/shm is small), until the peer timeout.

A group whose ranks sit on several hosts (``geforce_p2p._hosts.host_id``: host name and boot
id, or ``GP2P_HOST_ID``) runs this library's communicator among each host's ranks and an
engine for networks between hosts (NCCL for CUDA tensors, or gloo: ``GP2P_ACROSS_HOSTS``):
all_reduce (in chunks, each chunk's exchange across hosts in flight while the next chunk's
reduce-scatter is enqueued), broadcast, all_gather and reduce_scatter in two levels
(:mod:`geforce_p2p._two_level`); every host must hold the same number of ranks, at most 8;
send and recv across hosts raise ``NotImplementedError``; there reduce, scatter, gather and
the even ``all_to_all_single`` ride on the collectives (moving up to N times their bytes), and
the rest of the all-to-alls raise.

The group's name: torch names a group through its ``ProcessGroup``'s registered backends, and
a ``ProcessGroup`` subclass has none of its own, so the name stayed unset and everything that
looks a group up by name failed with "ProcessGroup name not set" (``init_device_mesh``,
DTensor, FSDP2's ``fully_shard``, the functional collectives). The gloo group is registered
as its CPU backend, which carries the name (and is where CPU tensors go anyway). A c10d
``Backend`` subclass would be torch's other door, but torch 2.11's binding cannot be
subclassed from Python ("No constructor defined").
"""

from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List

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


def _shares_memory(a: Any, b: Any) -> bool:
    """Whether tensors ``a`` and ``b`` are views of one storage (so writing one may change
    what the other reads)."""
    return bool(a.numel() and b.numel()) and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


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
        self._across_hosts = hosts.count > 1
        if self._across_hosts:
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

    # -- rooted ops and the all-to-alls, as sends and receives ------------------------------------
    # Each rank makes its sends and receives in one order every rank agrees on: the pairs
    # (sender, receiver) in ascending order, as the communicator's point-to-point calls among
    # more than two ranks need (every pair's two calls then meet; the NCCL door orders a group's
    # sends and receives the same way). So no part moves through a rank it is not for.

    def _exchange(self, sends: Dict[int, Any], recvs: Dict[int, Any]) -> None:
        """Send ``sends[r]`` to rank r and receive ``recvs[s]`` from rank s (contiguous tensors
        on the group's device; empty ones skipped, as their peers skip theirs), in the order
        of the pairs (sender, receiver)."""
        me = self.rank()
        for peer in sorted(recvs):
            if peer < me and recvs[peer].numel():
                self._comm.recv(recvs[peer], peer)
        for peer in sorted(sends):
            if sends[peer].numel():
                self._comm.send(sends[peer], peer)
        for peer in sorted(recvs):
            if peer > me and recvs[peer].numel():
                self._comm.recv(recvs[peer], peer)

    def reduce(self, tensors: List[Any], opts: Any = None) -> Any:
        """The root's tensor becomes op over every rank's; the others' are left as they were.
        A reduce-scatter, then every rank's folded shard to the root: the root takes in
        (N - 1)/N of the tensor once more, not an all-reduce's second half on every rank."""
        if not self._ours(tensors):
            return self._to_gloo("reduce", tensors, opts=opts)
        root, op = opts.rootRank, _op(opts)
        me, world = self.rank(), self.size()
        for t in tensors:
            if self._across_hosts:
                self._comm.reduce(t, root, op)
                continue
            n = t.numel()
            if n == 0:
                continue
            per = -(-n // world)

            def size(r: int) -> int:  # shard r's elements, past the padding
                return max(0, min(per, n - r * per))

            flat = t.view(-1) if t.is_contiguous() else None
            if flat is not None and n == per * world:
                whole = flat  # the root's shards land in place
            else:  # padded to N equal shards: the padding's fold is dropped
                whole = torch.cat([t.reshape(-1), t.new_zeros(per * world - n)])
            shard = torch.empty(per, dtype=t.dtype, device=t.device)
            self._comm.reduce_scatter_tensor(shard, whole, op)
            if me != root:
                self._exchange({root: shard[:size(me)]}, {})
                continue
            self._exchange({}, {r: whole[r * per:r * per + size(r)] for r in range(world) if r != root})
            whole[root * per:root * per + size(root)].copy_(shard[:size(root)])
            if whole is not flat:
                t.copy_(whole[:n].view_as(t))
        return self._done(tensors)

    def scatter(self, outputs: List[Any], inputs: List[List[Any]], opts: Any = None) -> Any:
        """``outputs[i]`` becomes the root's ``inputs[i][rank]``: the root sends each rank its
        part, nothing more."""
        if not self._ours(outputs, inputs):
            return self._to_gloo("scatter", outputs, inputs, opts=opts)
        root, world, me = opts.rootRank, self.size(), self.rank()
        for i, out in enumerate(outputs):
            if me == root:
                parts = inputs[i]
                if len(parts) != world or any(p.numel() != out.numel() or p.dtype != out.dtype for p in parts):
                    # Torch checks this before the op; a root that raised here after the others
                    # began would leave them waiting until the peer timeout.
                    raise ValueError("scatter_list: needs %d tensors like the output" % world)
            if self._across_hosts:
                self._comm.scatter(out, inputs[i] if me == root else None, root)
            elif me == root:
                self._exchange({r: parts[r].contiguous() for r in range(world) if r != root}, {})
                out.copy_(parts[root].reshape(out.shape))
            else:
                self._receive_into({}, {root: out})
        return self._done(list(outputs))

    def gather(self, outputs: List[List[Any]], inputs: List[Any], opts: Any = None) -> Any:
        """The root's ``outputs[i][r]`` becomes rank r's ``inputs[i]``: each rank sends the
        root its input, nothing more."""
        if not self._ours(outputs, inputs):
            return self._to_gloo("gather", outputs, inputs, opts=opts)
        root, world, me = opts.rootRank, self.size(), self.rank()
        for i, inp in enumerate(inputs):
            outs = outputs[i] if me == root else None
            if outs is not None and (len(outs) != world or any(o.numel() != inp.numel() or o.dtype != inp.dtype
                                                                for o in outs)):
                raise ValueError("gather_list: needs %d tensors like the input" % world)
            if self._across_hosts:
                self._comm.gather(outs, inp, root)
                continue
            if me != root:
                self._exchange({root: inp.contiguous()}, {})
                continue
            self._receive_into({}, {r: outs[r] for r in range(world) if r != root})
            outs[root].copy_(inp.reshape(outs[root].shape))
        return self._done([t for outs in outputs for t in outs])

    def _receive_into(self, sends: Dict[int, Any], recvs: Dict[int, Any]) -> None:
        """:meth:`_exchange` into tensors that may not be contiguous: those receive into a
        contiguous copy, copied back after."""
        landing = {r: t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
                   for r, t in recvs.items()}
        self._exchange(sends, landing)
        for r, t in recvs.items():
            if landing[r] is not t:
                t.copy_(landing[r])

    def alltoall_base(self, output: Any, input: Any, output_splits: List[int], input_splits: List[int],
                      opts: Any = None) -> Any:
        """``all_to_all_single``: rank r gets this rank's ``input_splits[r]`` rows (dim 0) of
        ``input``, in order, and this rank's ``output`` gets ``output_splits[s]`` rows from each
        rank s (empty splits: equal parts). Each part goes straight to its rank."""
        if not self._ours(output, input):
            return self._to_gloo("alltoall_base", output, input, output_splits, input_splits, opts=opts)
        world, me = self.size(), self.rank()
        cuts = {}
        for name, t, splits in (("output", output, output_splits), ("input", input, input_splits)):
            rows = t.shape[0] if t.dim() else 0
            if not splits:
                if t.dim() == 0 or rows % world:
                    raise ValueError("%s: %d rows in dim 0; all_to_all_single without splits needs a multiple of "
                                     "the world size %d" % (name, rows, world))
                splits = [rows // world] * world
            if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
                raise ValueError("%s_split_sizes: %s for %d rows in dim 0; give %d sizes >= 0 that add up to the rows"
                                 % (name, list(splits), rows, world))
            row = t[0].numel() if rows else 0
            offsets = [sum(splits[:r]) * row for r in range(world + 1)]
            cuts[name] = [(offsets[r], offsets[r + 1]) for r in range(world)]
        if output.dtype != input.dtype:
            raise ValueError("output: %s, input %s; all_to_all_single needs one dtype" % (output.dtype, input.dtype))
        (a, b), (c, d) = cuts["output"][me], cuts["input"][me]
        if b - a != d - c:
            raise ValueError("output_split_sizes[%d] and input_split_sizes[%d]: this rank's part to itself must be "
                             "as long both ways" % (me, me))
        if self._across_hosts:
            part = cuts["input"][0][1] - cuts["input"][0][0]
            if any(b - a != part for a, b in cuts["input"] + cuts["output"]):
                _two_level.not_across("all_to_all_single with uneven splits")
            self._comm.all_to_all_even(output, input)
            return self._done([output])
        src = input.contiguous().view(-1)
        dst = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
        flat = dst.view(-1)
        if src.numel() and _shares_memory(src, flat):
            src = src.clone()  # in place: every part is sent from a copy (NCCL's in-place form)
        self._exchange({r: src[cuts["input"][r][0]:cuts["input"][r][1]] for r in range(world) if r != me},
                       {r: flat[cuts["output"][r][0]:cuts["output"][r][1]] for r in range(world) if r != me})
        flat[a:b].copy_(src[c:d])
        if dst is not output:
            output.copy_(dst)
        return self._done([output])

    def alltoall(self, outputs: List[Any], inputs: List[Any], opts: Any = None) -> Any:
        """``all_to_all``: ``outputs[s]`` becomes rank s's ``inputs[rank]``; each tensor goes
        straight to its rank."""
        if not self._ours(outputs, inputs):
            return self._to_gloo("alltoall", outputs, inputs, opts=opts)
        world, me = self.size(), self.rank()
        if len(outputs) != world or len(inputs) != world:
            raise ValueError("output_tensor_list and input_tensor_list: %d and %d tensors; all_to_all needs %d each"
                             % (len(outputs), len(inputs), world))
        if self._across_hosts:
            _two_level.not_across("all_to_all")
        sends = {r: inputs[r].contiguous() for r in range(world) if r != me}
        if any(_shares_memory(o, i) for o in outputs for i in inputs):
            sends = {r: t.clone() for r, t in sends.items()}  # outputs over inputs: send copies
        self._receive_into(sends, {r: outputs[r] for r in range(world) if r != me})
        outputs[me].copy_(inputs[me].reshape(outputs[me].shape))
        return self._done(list(outputs))

    all_to_all_single = alltoall_base  # its name from torch 2.12
    recv_anysource = _gloo_only("recv", "recv_anysource")
