"""The package's functions as torch custom ops, under ``torch.ops.<package>``, so that
``torch.compile(fullgraph=True)`` keeps one graph through them (see ``_compile.py``).

Each op runs the eager function when the graph runs; its fake implementation describes
the result for tracing (a new tensor for ``copy``, nothing for the ops that write into
their arguments, which ``mutates_args`` names). Imported only once torch is.
"""

# No ``from __future__ import annotations``: torch reads each op's schema from its real
# annotations.
from typing import List, Optional

import torch
from torch import Tensor

from . import _api, _compile
from . import ops as _ops

#: ``geforce_p2p`` when pip-installed; the build's unique id when loaded through ``kernels``.
NAMESPACE = __package__


def _qualified(name: str) -> str:
    return "%s::%s" % (NAMESPACE, name)


@torch.library.custom_op(_qualified("copy"), mutates_args=())
def _copy(src: Tensor, device: str, route: str, chunk_bytes: Optional[int], slots: Optional[int]) -> Tensor:
    return _api.copy(src, device, route=route, chunk_bytes=chunk_bytes, slots=slots)


@_copy.register_fake
def _(src: Tensor, device: str, route: str, chunk_bytes: Optional[int], slots: Optional[int]) -> Tensor:
    # The same device check as eager, so a bad device fails while tracing, by name.
    target = _api.target_device(device)
    where = "cpu" if target is None else "cuda:%d" % target
    return torch.empty(src.shape, dtype=src.dtype, device=where)


# Not ``copy_``: a trailing underscore is the name of an in-place op returning its argument.
@torch.library.custom_op(_qualified("copy_into"), mutates_args=("dst",))
def _copy_(dst: Tensor, src: Tensor, route: str, chunk_bytes: Optional[int], slots: Optional[int]) -> None:
    _api.copy_(dst, src, route=route, chunk_bytes=chunk_bytes, slots=slots)


@torch.library.custom_op(_qualified("staged_copy"), mutates_args=("dst",))
def _staged_copy(dst: Tensor, src: Tensor, chunk_bytes: Optional[int], slots: Optional[int]) -> None:
    _ops.staged_copy(dst, src, chunk_bytes=chunk_bytes, slots=slots)


@torch.library.custom_op(_qualified("copy_to_host"), mutates_args=("dst",))
def _copy_to_host(dst: Tensor, src: Tensor) -> None:
    _ops.copy_to_host(dst, src)


@torch.library.custom_op(_qualified("copy_from_host"), mutates_args=("dst",))
def _copy_from_host(dst: Tensor, src: Tensor) -> None:
    _ops.copy_from_host(dst, src)


@torch.library.custom_op(_qualified("reduce_from_host"), mutates_args=("dst",))
def _reduce_from_host(dst: Tensor, src: Tensor, op: str, divide_by: int) -> None:
    _ops.reduce_from_host(dst, src, op, divide_by)


@torch.library.custom_op(_qualified("reduce"), mutates_args=("dst",))
def _reduce(dst: Tensor, src: Tensor, op: str, divide_by: int) -> None:
    _ops.reduce(dst, src, op, divide_by)


@torch.library.custom_op(_qualified("all_reduce"), mutates_args=("tensors",))
def _all_reduce(tensors: List[Tensor], op: str, transport: str) -> None:
    _api.all_reduce(tensors, op, transport=transport)


@torch.library.custom_op(_qualified("all_gather"), mutates_args=("outputs",))
def _all_gather(inputs: List[Tensor], outputs: List[Tensor], transport: str) -> None:
    _api.all_gather(inputs, outputs, transport=transport)


@torch.library.custom_op(_qualified("reduce_scatter"), mutates_args=("outputs",))
def _reduce_scatter(inputs: List[Tensor], outputs: List[Tensor], op: str, transport: str) -> None:
    _api.reduce_scatter(inputs, outputs, op, transport=transport)


@torch.library.custom_op(_qualified("broadcast"), mutates_args=("tensors",))
def _broadcast(tensors: List[Tensor], root: int, transport: str) -> None:
    _api.broadcast(tensors, root, transport=transport)


@torch.library.custom_op(_qualified("comm_all_reduce"), mutates_args=("tensor",))
def _comm_all_reduce(tensor: Tensor, comm: int, op: str) -> None:
    communicator = _compile.communicator(comm)
    if communicator is None:
        raise ValueError("comm: communicator %d is gone (closed and collected); make a new one" % comm)
    communicator.all_reduce(tensor, op)


# The ops that write into their arguments return nothing: their fakes do nothing.
for _op in (_copy_, _staged_copy, _copy_to_host, _copy_from_host, _reduce_from_host, _reduce, _all_reduce,
            _all_gather, _reduce_scatter, _broadcast, _comm_all_reduce):
    _op.register_fake(lambda *args, **kwargs: None)
del _op

# What the public functions call while dynamo traces: the ops' overloads, which dynamo puts
# into the graph as they are.
_namespace = getattr(torch.ops, NAMESPACE)
copy = _namespace.copy.default
copy_ = _namespace.copy_into.default
staged_copy = _namespace.staged_copy.default
copy_to_host = _namespace.copy_to_host.default
copy_from_host = _namespace.copy_from_host.default
reduce_from_host = _namespace.reduce_from_host.default
reduce = _namespace.reduce.default
all_reduce = _namespace.all_reduce.default
all_gather = _namespace.all_gather.default
reduce_scatter = _namespace.reduce_scatter.default
broadcast = _namespace.broadcast.default
comm_all_reduce = _namespace.comm_all_reduce.default
