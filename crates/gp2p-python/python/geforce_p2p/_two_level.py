"""A ``gp2p`` process group that spans several hosts: this library's communicator among each
host's ranks, an engine built for networks between hosts (NCCL by default for CUDA tensors,
gloo where chosen or for CPU ones), composed as :mod:`geforce_p2p._hosts` plans it.

:class:`TwoLevel` has the communicator's methods, so the process group calls it as it calls a
communicator. Imported only with torch, by the backend.
"""

import contextlib
import os
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

from ._hosts import Hosts

#: The environment variable that picks the engine between hosts: ``nccl`` or ``gloo``.
ACROSS_VAR = "GP2P_ACROSS_HOSTS"

_REDUCE = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
           "prod": dist.ReduceOp.PRODUCT}


def across_engine(device: torch.device) -> str:
    """The engine between hosts: ``GP2P_ACROSS_HOSTS`` where set, else NCCL for a CUDA group
    where this torch has it, gloo otherwise."""
    chosen = os.environ.get(ACROSS_VAR, "").strip().lower()
    if chosen:
        if chosen not in ("nccl", "gloo"):
            raise ValueError("%s=%s: expected nccl or gloo" % (ACROSS_VAR, chosen))
        return chosen
    return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"


def make_across(engine: str, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A process group of `engine` over `store` (already prefixed for this group)."""
    if engine == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


#: The environment variable that sets the chunk of the two-level all-reduce, bytes a rank.
CHUNK_VAR = "GP2P_ACROSS_CHUNK_BYTES"


def _chunk_bytes() -> int:
    """``GP2P_ACROSS_CHUNK_BYTES`` (at least 4096), else 4 MiB."""
    value = os.environ.get(CHUNK_VAR, "").strip()
    if not value:
        return 4 << 20
    try:
        chunk = int(value)
    except ValueError:
        chunk = 0
    if chunk < 4096:
        raise ValueError("%s=%s: expected a number of bytes, at least 4096" % (CHUNK_VAR, value))
    return chunk


def not_across(what: str) -> None:
    raise NotImplementedError("%s across hosts is not built yet in the gp2p backend; run it on a second process "
                              "group with backend='nccl'" % what)


class _Pending:
    """An all-reduce across hosts in flight: ``finish()`` waits for it (the current stream,
    for NCCL) through ``wait`` and divides by ``divide`` where it is an average's sum."""

    def __init__(self, work: Any, tensor: torch.Tensor, divide: int, wait: Callable[[Any], None]):
        self.work, self.tensor, self.divide, self.wait = work, tensor, divide, wait

    def finish(self) -> None:
        self.wait(self.work)
        t, count = self.tensor, self.divide
        if count:
            t.copy_(t / count if t.is_floating_point() else torch.div(t, count, rounding_mode="trunc"))


class TwoLevel:
    """Group rank ``rank`` of ``hosts``: ``local`` (this library's communicator among its
    host's ranks) and ``across`` (a process group among the ranks of its local rank on every
    host, host ``h`` its rank ``h``)."""

    def __init__(self, local: Any, across: Any, hosts: Hosts, rank: int, engine: str = "the engine between hosts"):
        self.local, self.across, self.hosts, self.rank = local, across, hosts, rank
        self.world_size = hosts.count * hosts.local
        self._orders: dict = {}
        self._across_peers = "%s among ranks %s, local rank %d of each of the %d hosts" % (
            engine, ", ".join(map(str, hosts.across(rank))), hosts.local_rank(rank), hosts.count)

    @contextlib.contextmanager
    def _named_across(self):
        """Around an exchange across hosts (its start or its wait): a failure (a host or its
        network gone, the group's timeout) raised again, of the engine's own exception type
        where it takes a message (torch's DistBackendError and the like, which fault handlers
        catch) else as a RuntimeError, saying which exchange failed and what to do."""
        try:
            yield
        except Exception as e:  # noqa: BLE001  (whatever the engine raises, with its text kept)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            text = ("gp2p: an exchange across hosts failed (%s): %s. A host or the network between hosts may be gone; "
                    "later calls on this group fail too: make a new group of the ranks left" % (self._across_peers, first))
            try:
                named = type(e)(text) if isinstance(e, RuntimeError) else RuntimeError(text)
            except Exception:  # noqa: BLE001  (an exception type that takes other arguments)
                named = RuntimeError(text)
            raise named from e

    def _wait_across(self, work: Any) -> None:
        """Wait for an exchange across hosts (see ``_named_across``)."""
        with self._named_across():
            work.wait()

    def _across_reduce(self, t: torch.Tensor, op: str) -> Any:
        """Start ``t`` becoming ``op`` over the hosts'; returns what finishes it. An average
        is summed at both levels and divided by every rank's count once, at the end: dividing
        each host's sum first would truncate integers twice (3 and 1 over two hosts of two
        ranks: 1 + 0 = 1, halved to 0, where 4 / 4 is 1)."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = _REDUCE["sum" if op == "avg" else op]
        with self._named_across():
            work = self.across.allreduce([t], opts)
        return _Pending(work, t, self.world_size if op == "avg" else 0, self._wait_across)

    @staticmethod
    def _local_op(op: str) -> str:
        """The op inside a host: an average sums there (see ``_across_reduce``)."""
        return "sum" if op == "avg" else op

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place: a reduce-scatter inside the host, an all-reduce of each shard across
        hosts, an all-gather inside the host (the buffer padded to ``local`` equal shards),
        in chunks of about ``GP2P_ACROSS_CHUNK_BYTES`` (default 4 MiB) a rank, each chunk's
        exchange across hosts in flight while the next chunk's reduce-scatter runs."""
        flat = tensor.view(-1)
        n, parts = flat.numel(), self.hosts.local
        if n == 0:
            return tensor
        chunk = max(parts, _chunk_bytes() // flat.element_size() // parts * parts)
        pending = None
        for start in range(0, n, chunk):
            piece = flat[start:start + chunk]
            staged = self._reduce_scatter_piece(piece, op)
            if pending is not None:
                self._all_gather_piece(*pending)
            pending = staged
        self._all_gather_piece(*pending)
        return tensor

    def _reduce_scatter_piece(self, piece: torch.Tensor, op: str) -> tuple:
        """The first two stages of one chunk: the local reduce-scatter, and the exchange
        across hosts started (not waited for)."""
        n, parts = piece.numel(), self.hosts.local
        size = -(-n // parts)
        whole = piece if size * parts == n else torch.empty(size * parts, dtype=piece.dtype, device=piece.device)
        if whole is not piece:
            whole[:n].copy_(piece)
        shard = torch.empty(size, dtype=piece.dtype, device=piece.device)
        self.local.reduce_scatter_tensor(shard, whole, self._local_op(op))
        return piece, whole, shard, self._across_reduce(shard, op)

    def _all_gather_piece(self, piece: torch.Tensor, whole: torch.Tensor, shard: torch.Tensor, across: Any) -> None:
        """The last stage of one chunk, once its exchange across hosts is done."""
        across.finish()
        self.local.all_gather_into_tensor(whole, shard)
        if whole is not piece:
            piece.copy_(whole[:piece.numel()])

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """In place: across hosts among the root's local rank, then inside each host from it."""
        host, local = self.hosts.host_of(src), self.hosts.local_rank(src)
        if self.hosts.local_rank(self.rank) == local:
            opts = dist.BroadcastOptions()
            opts.rootRank = host
            with self._named_across():
                work = self.across.broadcast([tensor], opts)
            self._wait_across(work)
        self.local.broadcast(tensor, local)
        return tensor

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        """``output`` becomes every rank's ``input`` in group-rank order: across hosts first
        (each rank's input among its local rank's peers), then inside the host, then each part
        put where its rank goes."""
        inp = input.reshape(-1)
        n, count, local = inp.numel(), self.hosts.count, self.hosts.local
        if n == 0:
            return output
        from_hosts = [torch.empty_like(inp) for _ in range(count)]
        with self._named_across():
            work = self.across.allgather([from_hosts], [inp.contiguous()])
        self._wait_across(work)
        mine = torch.cat(from_hosts)
        gathered = torch.empty(local * count * n, dtype=inp.dtype, device=inp.device)
        self.local.all_gather_into_tensor(gathered, mine)
        output.view(self.world_size, n).copy_(gathered.view(local * count, n).index_select(0, self._order(inp.device)))
        return output

    def _order(self, device: torch.device) -> torch.Tensor:
        """Where each rank's part lies in a two-level all-gather's result, on `device`: made
        once (a tensor made from a list is copied from pageable memory, which may wait for
        the device)."""
        if device not in self._orders:
            indices = [self.hosts.gathered_index(r) for r in range(self.world_size)]
            self._orders[device] = torch.tensor(indices, dtype=torch.int64).to(device)
        return self._orders[device]

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``output`` becomes ``op`` over every rank's part ``rank`` of ``input``: inside the
        host, local rank ``l`` folds the parts of its local rank's peers on every host; across
        hosts those are all-reduced and each rank keeps its own (the network carries
        ``hosts`` parts where a reduce-scatter between hosts would carry one)."""
        n, count, local = output.numel(), self.hosts.count, self.hosts.local
        if n == 0:
            return output
        parts = input.reshape(self.world_size, n)
        # Local rank l's share: the parts of across(l's rank on this host), host order.
        ranks = self.hosts.local_ranks(self.rank)
        # Rows by slicing, not by a list of indices (which torch copies to the device).
        arranged = torch.cat([parts[p] for r in ranks for p in self.hosts.across(r)])
        mid = torch.empty(count * n, dtype=input.dtype, device=input.device)
        self.local.reduce_scatter_tensor(mid, arranged, self._local_op(op))
        self._across_reduce(mid, op).finish()
        output.view(-1).copy_(mid.view(count, n)[self.hosts.host_of(self.rank)])
        return output

    # The rooted ops and the even all-to-all across hosts ride on the collectives above (sends
    # and receives across hosts are not built): each moves at least its bytes, up to N times.

    def reduce(self, tensor: torch.Tensor, root: int, op: str) -> None:
        """``tensor`` on ``root`` becomes ``op`` over every rank's; the others' stay (an
        all-reduce into a copy off the root)."""
        self.all_reduce(tensor if self.rank == root else tensor.clone(memory_format=torch.contiguous_format), op)

    def scatter(self, output: torch.Tensor, parts: Optional[List[torch.Tensor]], root: int) -> None:
        """``output`` becomes the root's ``parts[rank]`` (the parts broadcast as one tensor)."""
        if self.rank == root:
            whole = torch.cat([t.reshape(-1) for t in parts])
        else:
            whole = torch.empty((self.world_size * output.numel(),), dtype=output.dtype, device=output.device)
        self.broadcast(whole, root)
        output.copy_(whole.view(self.world_size, output.numel())[self.rank].view_as(output))

    def gather(self, outputs: Optional[List[torch.Tensor]], input: torch.Tensor, root: int) -> None:
        """The root's ``outputs[r]`` becomes rank r's ``input`` (an all-gather the root copies out)."""
        gathered = torch.empty((self.world_size * input.numel(),), dtype=input.dtype, device=input.device)
        self.all_gather_into_tensor(gathered, input.contiguous().view(-1))
        if self.rank == root:
            for out, part in zip(outputs, gathered.chunk(self.world_size)):
                out.copy_(part.view_as(out))

    def all_to_all_even(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """Part r of ``output`` becomes rank r's part ``rank`` of its ``input``, equal parts
        (an all-gather of the inputs, each rank keeping its parts)."""
        gathered = torch.empty((self.world_size * input.numel(),), dtype=input.dtype, device=input.device)
        self.all_gather_into_tensor(gathered, input.contiguous().view(-1))
        mine = gathered.view(self.world_size, self.world_size, input.numel() // self.world_size)[:, self.rank]
        output.copy_(mine.reshape(output.shape))

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        not_across("send")

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        not_across("recv")

    def check(self) -> None:
        self.local.check()

    def close(self) -> None:
        self.local.close()
        getattr(self.across, "shutdown", lambda: None)()


def join(store: Any, rank: int, world_size: int, timeout: timedelta, hosts: Hosts, *, device: torch.device,
         communicator: Callable[..., Any], unique_id: Callable[[], str], peer_timeout: float) -> TwoLevel:
    """This rank's :class:`TwoLevel`: the first rank of each host makes its communicator's id,
    every rank joins its host's communicator and its local rank's group across hosts."""
    host, local = hosts.host_of(rank), hosts.local_rank(rank)
    key = "gp2p/unique_id/host%d" % host
    if local == 0:
        store.set(key, unique_id())
    uid = store.get(key).decode()
    index = device.index if device.type == "cuda" else 0
    comm = communicator(uid, local, hosts.local, index, peer_timeout=peer_timeout,
                        join_timeout=timeout.total_seconds())
    engine = across_engine(device)
    across = make_across(engine, dist.PrefixStore("gp2p/across/%d" % local, store), host, hosts.count, timeout)
    return TwoLevel(comm, across, hosts, rank, engine)


def host_names(store: Any, rank: int, world_size: int, host: str) -> List[str]:
    """Every rank's host, through the group's store (each rank publishes its own)."""
    store.set("gp2p/host/%d" % rank, host)
    return [store.get("gp2p/host/%d" % r).decode() for r in range(world_size)]
