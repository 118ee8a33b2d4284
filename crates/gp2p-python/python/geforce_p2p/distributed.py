"""One process per GPU (torchrun, vLLM and sglang tensor parallelism) on cards without P2P.

Every rank joins one communicator: rank 0 makes an id with :func:`unique_id`, the caller hands
it to the other ranks (an environment variable, or a torch.distributed group, as
:meth:`Communicator.from_group` does), and each rank makes a :class:`Communicator` with
the id, its rank, the world size and its GPU. The ranks share one POSIX shared-memory segment
(mode 0600, unlinked once everyone has mapped it); after that nothing on the host waits for
another process: each call is enqueued on the tensor's current torch stream, its waits for
the peer run on the GPU, and a peer that never arrives makes them give up after
``peer_timeout`` seconds (the next call raises).

It runs **1 to 8** ranks: all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
broadcast, send and recv, called on a :class:`Communicator` or through torch.distributed (the ``gp2p``
backend, :func:`register_backend`). More than 8 ranks are refused at creation, naming the limit.

Among more than two ranks an all-reduce of up to ``lines_max_bytes`` (64 KiB by default
there) is one kernel per rank that writes its tensor into its lines of the segment and reads
every other rank's (one-shot, every rank folds all N in rank order, so all get the same
bits); above that, up to ``max_bytes`` (1 MiB by default among 3 to 8), it is two-shot in one
kernel per rank: each rank stores its tensor in flagged 4 KiB chunks, the owner of each chunk
folds every rank's copy of it and flags the result, and the others copy that
(``GP2P_MANY_CHUNKS=off`` turns this kernel off). Above ``max_bytes`` it is two-shot in rounds:
in N-1 rounds each rank hands every other rank that rank's share of its tensor (a 1/N slice)
and folds the shares it receives into its own, then in one more it copies its folded share
out once, for every other rank to read. Each card's link
carries the tensor up and 2(N-1)/N of it down, in N handoffs where a ring takes 2(N-1)
dependent trips through host memory per chunk. Which of the two a size takes is the cost
model's choice (``gp2p plan --ranks N``: the lines priced at twice the data's bytes, the
rounds at N handoffs); with the rates measured on H200s it keeps the lines up to their 64 KiB,
and ``GP2P_ALGORITHM=one-shot|two-shot`` (or ``algorithm=``) forces one. all_gather and
reduce_scatter are the second and first half, broadcast is the root copying the tensor out
once for every rank to read, send/recv one handoff. The slots take about 256 MiB of /dev/shm among 3 to 8
ranks (64 MiB / N each, four per rank), less where /dev/shm is smaller.

Between two ranks an all-reduce of up to ``max_bytes`` (4 MiB by
default; where both ranks share one GPU, the attribute reads the smaller size past which the
cost model prices the pipeline cheaper) is one kernel that hands the tensor over through the shared memory (8-byte lines of
data and sequence number up to ``lines_max_bytes``, 2 KiB by default; flagged 4 KiB chunks
above); everything else goes through a pipeline of DMA copies via slots of the segment,
handed over chunk by chunk by flags the GPUs set and wait on. On two H200s, one process each, an all-reduce took 6.7-13.2
us a call up to 64 KiB, 16 at 128 KiB, 48-49 at 1 MiB and 148 at 4 MiB, 0.31-0.87 of the
time NCCL's shared-memory path took in the same runs; replayed from a CUDA graph, 4.8-5.7 us
up to 2 KiB; from 64 MiB the pipeline moves 0.84-0.91 of what the two links carry both ways
at once (``benches/python/mp_allreduce.py``). Calls made while torch captures a CUDA graph are
captured too (tested: every collective captured, then 10 replays on new data), and each
launch of the graph runs them again on whatever the captured tensors hold then (every rank
must capture and launch the same graphs in the same order; :meth:`Communicator.check` says
whether a launch's waits gave up). :class:`CustomAllreduce` serves what the one kernel
serves (up to ``max_bytes``: 1 MiB among 3 to 8 ranks by default, 64 KiB with
``GP2P_MANY_CHUNKS=off``) and says no to the rest
(``should_custom_ar``), so callers fall back to what they used before.

    import geforce_p2p.distributed as gpd
    comm = gpd.Communicator.from_group()                     # every rank of a gloo group, on its device
                                                             # (or Communicator(uid, rank, world, device))
    comm.all_reduce(t)                                       # in place, on t's current stream
    comm.all_gather_into_tensor(out, t)                      # out: world x t's elements

As a torch.distributed backend (CUDA tensors; CPU ones go to a gloo group beside it)::

    gpd.register_backend()                                   # once per process, before init
    torch.cuda.set_device(local_rank)                        # the group's device, as for NCCL
    dist.init_process_group("gp2p")                          # torchrun's env:// rendezvous
    dist.all_reduce(t)                                       # on t's current stream

vLLM and sglang call their custom all-reduce through an object with ``disabled``,
``should_custom_ar(t)``, ``custom_all_reduce(t)`` and ``capture()`` (vLLM also
``custom_all_gather``, ``custom_reduce_scatter`` and ``fully_connected``), built as they build
their own; :class:`CustomAllreduce` is one::

    ca = gpd.CustomAllreduce(group=cpu_group, device=device)  # a gloo group of the TP ranks
    if ca.should_custom_ar(t):
        t = ca.custom_all_reduce(t)
"""

import contextlib
import operator
from typing import Any, Optional

from . import _compile, _native
from ._api import REDUCE_OPS, at_least, device_index, positive
from ._tensors import check_choice, describe, on_device, same_dtype, same_stream, writable

__all__ = ["unique_id", "Communicator", "CustomAllreduce", "register_backend", "MAX_RANKS"]

#: The most ranks a communicator takes (larger groups are refused at creation, naming it).
MAX_RANKS = 8


def unique_id() -> str:
    """A new communicator id, as text: make it on one rank and hand it to every other."""
    return _native.unique_id()


_REGISTERED: set = set()


def register_backend(name: str = "gp2p") -> str:
    """Make ``name`` a torch.distributed backend (``init_process_group(backend="gp2p")``):
    CUDA tensors go to this package's communicator (1 to 8 ranks: all_reduce, all_gather,
    reduce_scatter, broadcast, send, recv, and reduce, scatter, gather, all_to_all and
    all_to_all_single built on them; recv from any source raises ``NotImplementedError``), CPU
    tensors and the barrier to a gloo group it keeps beside it.
    The group has a name, so device meshes, DTensor and FSDP2 work on it. Each rank's device is the
    current CUDA device when its group is made, and the group's timeout is also how long a
    collective waits for its peer (at most an hour). Calling it again does nothing. Returns
    ``name``."""
    import torch.distributed as dist

    if name not in _REGISTERED:
        dist.Backend.register_backend(name, _create_process_group, devices=["cpu", "cuda"])
        _REGISTERED.add(name)
    return name


def _create_process_group(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
    import torch

    from ._torch_backend import GP2PProcessGroup

    device = torch.device("cuda", torch.cuda.current_device())
    return GP2PProcessGroup(store, rank, world_size, timeout, communicator=Communicator, device=device,
                            unique_id=unique_id)


class Communicator:
    """This process's rank of a communicator (see the module docs).

    ``unique_id``: the text :func:`unique_id` gave on one rank; ``rank`` in
    ``0..world_size``; ``device``: this rank's GPU (ordinal, ``"cuda:N"`` or a
    ``torch.device``). Waits until every rank has joined, at most ``join_timeout`` seconds.
    ``world_size``: 1 to 8. ``max_bytes``: the largest all-reduce run as one kernel (default 4 MiB
    between two ranks, and the attribute of that name may read less where both share one GPU;
    1 MiB among 3 to 8, the line kernel up to ``lines_max_bytes`` and the two-shot in flagged
    chunks above, unless ``GP2P_MANY_CHUNKS=off``: then the line kernel alone, which
    ``lines_max_bytes`` bounds); ``slot_bytes`` and ``slots`` (every rank must give the same): the staged
    pipeline's slot size (a multiple of 4096 in 64 KiB..256 MiB, default 8 MiB for two ranks,
    64 MiB / N for N, made smaller where /dev/shm has not the room) and slots per rank (2..16, default 3 for two ranks, 4 for more: where /dev/shm
    has not the room for four of the default slot, three larger ones, 4 given counting as the
    default), for tuning; ``chunk_blocks``: the most blocks the one-kernel path's kernel runs
    (1..256, default 128); ``lines_max_bytes`` (every rank the same): the largest all-reduce
    whose one kernel hands data over in 8-byte lines of data and sequence number rather than
    in flagged 4 KiB chunks (0 to 65536, default 2048 for two ranks, 65536 for more), for tuning;
    ``algorithm`` (every rank the same): among more than two ranks ``"one-shot"`` (the line
    kernel wherever the tensor fits its lines) or ``"two-shot"`` (the rounds at every size)
    instead of the cost model's choice per call, which the environment variable
    ``GP2P_ALGORITHM`` also forces (with H200 rates the model keeps the lines up to their 64
    KiB); between two ranks above ``max_bytes`` the exchange runs on cards of their own and
    the rounds where both share one GPU (one link), and ``"two-shot"`` forces the rounds,
    ``"one-shot"`` the exchange. ``receive`` (each rank its own): ``"zero-copy"`` folds each chunk that lands
    by reading it from host memory in place, ``"scratch"`` copies it into device memory first;
    ``None`` or ``"auto"`` what ``GP2P_RECEIVE`` says, else zero-copy for landings up to 256 KiB and
    scratch above (each measured faster there). ``compress`` (every
    rank the same): ``"int8"`` or ``"fp8"`` (``":BLOCK"`` after either for 32 to 256 values a
    scale, 64 without) sends every all-reduce of float32, float16 or bfloat16 under sum or avg,
    from the cost model's minimum size on (``gp2p plan``; ``"@MIN"`` last names your own, in
    bytes or with K, M or G: ``"int8@4M"``), as one-byte codes in scaled blocks:
    about half the bytes from bf16, every rank the same bits, each element within the bound of
    docs/compression.md; ``"off"`` never, ``None`` (the default) what the environment variable
    ``GP2P_COMPRESS`` says (off where it is unset). With the defaults the
    shared segment takes about 65 MiB of /dev/shm between two ranks (about 200 MiB where they
    compress) and about 260 MiB among 3 to 8; where /dev/shm is smaller the default slots
    shrink until the segment takes three quarters of it at most (Docker's 64 MiB: slots of
    about 16 MiB / N less the flagged chunks' areas, three a rank, 5 MiB between two; the areas,
    9-20 MiB among 3 to 8, are left out where they would take half the room), each communicator on its own, so several at once
    may still find no room: give the container ``--shm-size`` (or ``--ipc=host``), or pass
    ``slots=2`` or a smaller ``slot_bytes``; too little room is an error at creation that
    names /dev/shm.
    """

    def __init__(self, unique_id: str, rank: int, world_size: int, device: Any, *, max_bytes: Optional[int] = None,
                 peer_timeout: float = 5.0, join_timeout: float = 30.0, slot_bytes: Optional[int] = None,
                 slots: Optional[int] = None, chunk_blocks: Optional[int] = None,
                 lines_max_bytes: Optional[int] = None, algorithm: Optional[str] = None,
                 compress: Optional[str] = None, receive: Optional[str] = None):
        if not isinstance(unique_id, str):
            raise TypeError("unique_id: expected the text geforce_p2p.distributed.unique_id() returned")
        max_bytes, slot_bytes, slots, chunk_blocks = (
            positive(name, value) for name, value in
            (("max_bytes", max_bytes), ("slot_bytes", slot_bytes), ("slots", slots), ("chunk_blocks", chunk_blocks)))
        lines_max_bytes = at_least("lines_max_bytes", lines_max_bytes, 0)
        if algorithm is not None and not isinstance(algorithm, str):
            raise TypeError("algorithm: expected 'one-shot', 'two-shot' or None, got %r" % (algorithm,))
        if compress is not None and not isinstance(compress, str):
            raise TypeError("compress: expected 'int8', 'fp8' (either with ':BLOCK' and '@MIN'), 'off' or None, "
                            "got %r" % (compress,))
        if receive is not None and not isinstance(receive, str):
            raise TypeError("receive: expected 'auto', 'scratch', 'zero-copy' or None, got %r" % (receive,))
        self.rank, self.world_size, self.device = int(rank), int(world_size), device_index(device)
        self._native = _native.Communicator(unique_id, self.rank, self.world_size, self.device, max_bytes,
                                            float(peer_timeout), float(join_timeout), slot_bytes, slots,
                                            chunk_blocks, lines_max_bytes, algorithm, compress, receive)
        #: The largest tensor, in bytes, :meth:`all_reduce` runs as one kernel (larger ones
        #: go through the staged pipeline).
        self.max_bytes = self._native.max_bytes
        # What the custom op under torch.compile names this communicator by.
        self._handle = _compile.remember_communicator(self)

    @classmethod
    def from_group(cls, group: Any = None, device: Any = None, **options: Any) -> "Communicator":
        """Every rank of torch.distributed group ``group`` (default: the default group) makes
        this call and joins one communicator: the group's first rank makes the id and
        broadcasts it over the group, so the group must carry Python objects (gloo's and
        NCCL's do; where the default group is the ``gp2p`` backend's, pass a gloo group of its
        ranks, ``dist.new_group(backend="gloo")``). ``device``: this rank's GPU (default:
        torch's current device); ``options``: the constructor's keywords. Raises
        ``RuntimeError`` on every rank where any rank failed to join, naming those ranks
        (and, on a rank that failed, chained to its own error)::

            dist.init_process_group("gloo")                  # torchrun's env:// rendezvous
            torch.cuda.set_device(local_rank)
            comm = gpd.Communicator.from_group()
        """
        import torch
        import torch.distributed as dist

        group = dist.group.WORLD if group is None else group
        device = torch.cuda.current_device() if device is None else device
        rank, world = dist.get_rank(group=group), dist.get_world_size(group=group)
        box = [unique_id() if rank == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        comm, error = None, None
        try:
            comm = cls(box[0], rank, world, device, **options)
        except Exception as e:  # noqa: BLE001  (every rank must learn of it before raising)
            error = e
        joined = [None] * world
        dist.all_gather_object(joined, error is None, group=group)
        failed = [r for r, ok in enumerate(joined) if not ok]
        if failed:
            if comm is not None:
                comm.close()
            why = ": this rank's error: %s" % error if error is not None else ""
            raise _JoinFailed("Communicator.from_group: rank(s) %s of the group's %d failed to join%s"
                              % (", ".join(map(str, failed)), world, why)) from error
        return comm

    def _mine(self, obj: Any, name: str) -> Any:
        """``obj`` read as a tensor on this rank's device."""
        t = on_device(describe(obj, name))
        if t.device != self.device:
            raise ValueError("%s: on %s, but this rank's communicator is on cuda:%d" % (name, t.where(), self.device))
        return t

    def _pair(self, output: Any, input: Any, gathers: bool) -> tuple:
        """``output`` and ``input`` read and checked for an all-gather (``gathers``: the output
        holds ``world_size`` inputs) or a reduce-scatter (the input holds ``world_size``
        outputs). Overlap is the native side's to judge: exactly this rank's part runs in
        place (NCCL's form), any other overlap is refused."""
        out, inp = writable(self._mine(output, "output")), self._mine(input, "input")
        same_dtype(inp, out)
        same_stream(inp, out)
        whole, part = (out, inp) if gathers else (inp, out)
        if whole.numel != part.numel * self.world_size:
            raise ValueError(
                "output: %d elements, but input has %d; output must hold %s"
                % (out.numel, inp.numel, "world_size x input" if gathers else "input / world_size")
            )
        return out, inp

    def all_reduce(self, tensor: Any, op: str = "sum") -> Any:
        """In place: ``tensor`` becomes ``op`` (sum, avg, min, max, prod) over every rank's,
        ordered on its device's current torch stream. Every rank must make the same calls, in
        the same order, with tensors of one dtype and length. Returns ``tensor``."""
        # A torch tensor in the usual shape is read by the native call itself (with fewer
        # driver queries, 9.9 -> 8.1 us of host time a call on one H200); it returns False for
        # anything else and for an op it does not know, untouched.
        if _compile.tracing():
            _compile.ops.comm_all_reduce(tensor, self._handle, op)
            return tensor
        if self._native.all_reduce_torch(tensor, op):
            return tensor
        op = check_choice("op", op, REDUCE_OPS)
        t = writable(self._mine(tensor, "tensor"))
        self._native.all_reduce(t.dtype, t.numel, t.memory, op)
        return tensor

    def all_gather_into_tensor(self, output: Any, input: Any) -> Any:
        """``output`` (``world_size`` times ``input``'s elements) becomes every rank's
        ``input`` in rank order, as ``torch.distributed.all_gather_into_tensor`` (``input`` may
        be ``output``'s part ``rank``: in place). Returns ``output``."""
        out, inp = self._pair(output, input, gathers=True)
        self._native.all_gather(out.dtype, inp.numel, inp.ptr, out.memory)
        return output

    def reduce_scatter_tensor(self, output: Any, input: Any, op: str = "sum") -> Any:
        """``output`` becomes ``op`` over every rank's part ``rank`` of ``input``
        (``world_size`` times ``output``'s elements), as
        ``torch.distributed.reduce_scatter_tensor`` (``output`` may be ``input``'s part
        ``rank``: in place). Returns ``output``."""
        op = check_choice("op", op, REDUCE_OPS)
        out, inp = self._pair(output, input, gathers=False)
        self._native.reduce_scatter(out.dtype, out.numel, inp.ptr, out.memory, op)
        return output

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        """In place: ``tensor`` becomes rank ``src``'s. Returns ``tensor``."""
        t = writable(self._mine(tensor, "tensor"))
        self._native.broadcast(t.dtype, t.numel, t.memory, self._rank("src", src))
        return tensor

    def send(self, tensor: Any, dst: int) -> None:
        """Send ``tensor`` to rank ``dst``, which calls :meth:`recv` with a tensor of the
        same dtype and size at the same place in its sequence of calls; ordered on
        ``tensor``'s current stream (work queued there afterwards may overwrite it)."""
        t = self._mine(tensor, "tensor")
        self._native.send(t.dtype, t.numel, t.memory, self._rank("dst", dst, other=True))

    def recv(self, tensor: Any, src: int) -> Any:
        """In place: ``tensor`` becomes what rank ``src`` sends (:meth:`send`), ordered on its
        current stream. Returns ``tensor``."""
        t = writable(self._mine(tensor, "tensor"))
        self._native.recv(t.dtype, t.numel, t.memory, self._rank("src", src, other=True))
        return tensor

    def _rank(self, name: str, rank: Any, *, other: bool = False) -> int:
        """``rank`` as a rank of this communicator (``other``: not this one), or ValueError
        naming ``name``."""
        try:
            index = operator.index(rank)
        except TypeError:
            index = None
        if index is None or isinstance(rank, bool) or not 0 <= index < self.world_size or (other and index == self.rank):
            raise ValueError("%s: %r is not %s rank in 0..%d (this is rank %d)"
                             % (name, rank, "another" if other else "a", self.world_size, self.rank))
        return index

    def check(self) -> None:
        """Raise if a wait of any rank gave up on its peer, after which every call raises.
        Calls check this themselves; launches of captured CUDA graphs do not, so call it once
        they are synchronised."""
        self._native.check()

    def close(self) -> None:
        """Let go of the communicator (never blocking: its memory is released once the GPU
        work of its calls is done). Later calls raise."""
        self._native.close()


class CustomAllreduce:
    """The custom all-reduce object vLLM and sglang call (``disabled``,
    ``should_custom_ar``, ``custom_all_reduce``, ``capture``, and vLLM's
    ``custom_all_gather``, ``custom_reduce_scatter``, ``fully_connected``), over a
    :class:`Communicator`.

    Built the way each server builds its own: ``CustomAllreduce(group=cpu_group,
    device=device, ...)`` (vLLM passes more keywords, which are accepted and not needed), or
    over a communicator of yours, ``CustomAllreduce(comm)``. Building never raises: where this
    version cannot serve the group (more than 8 ranks, a rank that failed to join) the object is
    ``disabled`` and the server keeps its own path. Dropping it releases the communicator
    without blocking (servers never call :meth:`close`).

    It takes what this version runs in one kernel (contiguous CUDA tensors of a supported
    dtype on this rank's device, 16-byte multiples up to ``max_bytes``: 4 MiB between two
    ranks, 1 MiB among 3 to 8, or 64 KiB with ``GP2P_MANY_CHUNKS=off``), inside :meth:`capture` too, and says no to the rest; the
    all-gather and reduce-scatter members take inputs of the same kind along their first
    dimension (through the communicator's staged path). Anything refused gives ``False`` or
    ``None``, never an exception, and nothing is enqueued for it.
    """

    #: Whether every GPU reaches every other directly (NVLink): never here, where every byte
    #: goes through host memory.
    fully_connected = False
    #: vLLM's multicast all-gather buffer: none.
    mnnvl_lamport_ag_multicast_ptr = 0

    def __init__(self, comm: Optional[Any] = None, *, group: Any = None, device: Any = None, **server_options: Any):
        """Over ``comm`` (a :class:`Communicator`; None: disabled), or, with ``group`` (a
        torch.distributed CPU group of the ranks) and ``device`` (this rank's GPU), over a
        communicator made as :meth:`from_group` makes it. ``server_options`` (vLLM's
        ``symm_mem_enabled``, ``register_graph_buffers`` and the like) are accepted and
        ignored."""
        del server_options  # nothing here needs them
        if comm is None and group is not None:
            comm = _join(group, device, {})
        self.comm = comm
        self.disabled = comm is None or not 2 <= comm.world_size <= MAX_RANKS
        #: The largest tensor, in bytes, this object takes (the communicator's one kernel).
        #: Read-only: the bound members below take the communicator's own.
        self.max_bytes = 0 if self.disabled else comm.max_bytes
        # The all-gather and reduce-scatter members go through the pipeline's (small) slots:
        # up to max_bytes between two ranks, and among more up to the lines' 64 KiB, though the
        # one kernel there takes 1 MiB by default.
        self._part_max = self.max_bytes if self.disabled or comm.world_size == 2 else min(self.max_bytes, 64 << 10)
        if not self.disabled:
            import torch

            self._torch, self._serves = torch, comm._native.serves_torch
            # Servers call these two once or twice a layer: the native calls themselves,
            # bound over the methods below (same arguments, same answers, closed included),
            # save a Python frame each, 0.2 us of host time a call.
            self.should_custom_ar = comm._native.serves_torch
            self.custom_all_reduce = comm._native.all_reduce_new_torch

    @classmethod
    def from_group(cls, group: Any, device: Any, **options: Any) -> "CustomAllreduce":
        """Make the communicator over a torch.distributed CPU (gloo) group: its first rank
        makes the id and broadcasts it to the others. Disabled (never raising) where this
        version cannot serve the group: one rank or more than 8, or a rank that failed to join (every
        rank then agrees to disable it, so none waits on a peer that is not there).
        ``options`` go to :class:`Communicator`; its pipeline, which only the all-gather and
        reduce-scatter members use, gets the smallest slots unless given (the segment then
        takes about 17 MiB of /dev/shm between two ranks, not 65, and 9-20 MiB more among 3
        to 8 for the flagged chunks unless ``GP2P_MANY_CHUNKS=off``: containers often have 64
        MiB, shared with NCCL)."""
        return cls(_join(group, device, options))

    def should_custom_ar(self, inp: Any) -> bool:
        """Whether :meth:`custom_all_reduce` takes ``inp`` (a cheap check, no GPU work, never
        raising): a contiguous CUDA torch tensor of a dtype the kernels take, on this rank's
        device, of 16-byte multiples up to ``max_bytes``."""
        return not self.disabled and self._serves(inp, self.max_bytes)

    def custom_all_reduce(self, inp: Any) -> Optional[Any]:
        """A new tensor holding the sum of ``inp`` over every rank (``inp`` is left as it
        was), or None for a tensor :meth:`should_custom_ar` refuses. One native call reads
        ``inp``, makes the output on the current stream (during a capture, from the graph's
        pool) and enqueues one kernel that reads the one and writes the other. The output comes
        from ``torch.empty_like``, or, where no gradients are recorded (``torch.no_grad()``,
        ``torch.inference_mode()``: the servers' model runners) and it is at most 64 KiB, from
        a batch made ahead in one allocation: each handed out once, so it is the caller's
        alone, though its storage holds others of the batch (and, under ``no_grad``, it is a
        view of it). At most 4 MiB is made ahead; :meth:`close` lets it go."""
        if self.disabled:
            return None
        return self.comm._native.all_reduce_new_torch(inp, None, self.max_bytes)

    def _part(self, inp: Any, gathers: bool) -> Optional[tuple]:
        """The output shape of the all-gather (``gathers``) or reduce-scatter of ``inp`` along
        its first dimension, where this object serves it: as :meth:`should_custom_ar` says
        for the input (the reduce-scatter's output too), though among more than two ranks
        only up to 64 KiB, and, for the reduce-scatter, a
        first dimension the world size divides. None otherwise."""
        if self.disabled or not self._serves(inp, self._part_max):
            return None
        shape, world = tuple(inp.shape), self.comm.world_size
        if not shape:
            return None
        if gathers:
            return (shape[0] * world,) + shape[1:]
        if shape[0] % world:
            return None
        return (shape[0] // world,) + shape[1:]

    def custom_all_gather(self, inp: Any) -> Optional[Any]:
        """vLLM's all-gather member: a new tensor of every rank's ``inp`` stacked along the
        first dimension, in rank order, or None (the server gathers by its own path) where
        :meth:`should_custom_ar` would refuse ``inp``."""
        shape = self._part(inp, gathers=True)
        if shape is None:
            return None
        out = self._torch.empty(shape, dtype=inp.dtype, device=inp.device)
        return self.comm.all_gather_into_tensor(out, inp)

    def custom_reduce_scatter(self, inp: Any) -> Optional[Any]:
        """vLLM's reduce-scatter member: a new tensor holding this rank's part (its
        ``1/world`` of the first dimension) of the sum of every rank's ``inp``, or None (the
        server uses its own path) where :meth:`should_custom_ar` would refuse ``inp`` or the
        world size does not divide its first dimension."""
        shape = self._part(inp, gathers=False)
        if shape is None:
            return None
        out = self._torch.empty(shape, dtype=inp.dtype, device=inp.device)
        return self.comm.reduce_scatter_tensor(out, inp)

    @contextlib.contextmanager
    def capture(self):
        """Around CUDA graph capture, as vLLM and sglang call it. Nothing to set up: the
        communicator numbers its calls on the GPU, so captured calls replay, and
        ``custom_all_reduce``'s output is allocated during the capture, from the graph's
        memory pool, which keeps it for the graph's life."""
        yield

    def close(self) -> None:
        """Let go of the communicator, without blocking; every later call falls back."""
        self.disabled = True  # callers fall back from now on
        for bound in ("should_custom_ar", "custom_all_reduce"):
            self.__dict__.pop(bound, None)  # the methods again, which say no once disabled
        comm, self.comm = getattr(self, "comm", None), None
        if comm is not None:
            comm.close()

    def __del__(self) -> None:
        # Servers drop the object rather than close it. Closing never blocks, and the
        # communicator's memory goes once the GPU work of its calls is done.
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown: nothing left to release)
            pass


class _JoinFailed(RuntimeError):
    """A rank of the group failed to join (:meth:`Communicator.from_group`): every rank raises it."""


def _join(group: Any, device: Any, options: dict) -> Optional[Communicator]:
    """A communicator of the ranks of torch.distributed CPU group ``group`` on ``device``,
    or None where this version cannot serve them (see :meth:`CustomAllreduce.from_group`);
    never raises for a failed join, on any rank."""
    import torch.distributed as dist

    options.setdefault("slot_bytes", 64 << 10)
    options.setdefault("slots", 2)
    if not 2 <= dist.get_world_size(group=group) <= MAX_RANKS:
        return None
    try:
        return Communicator.from_group(group, device, **options)
    except _JoinFailed:  # every rank learnt it, so every rank disables the object
        return None
