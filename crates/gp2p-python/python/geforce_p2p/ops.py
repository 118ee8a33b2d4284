"""The public primitives, for building your own schedules (the facade's ``ops``).

Every function takes ``(dst, src, ...)`` like :func:`geforce_p2p.copy_`, is ordered on the
current torch stream of the CUDA tensor's device and does not block the host. CPU tensors
must be pinned (``tensor.pin_memory()``).

The names users of the Hugging Face ``kernels`` build are given are the prefixed ones
(``gp.ops.geforce_p2p_staged_copy`` and so on); the short names are the same functions.
Under ``torch.compile`` each is one custom op in the graph (``torch.ops.<package>``).
"""

from __future__ import annotations

from typing import Any, Optional

from . import _compile, _native
from ._api import REDUCE_OPS, copy_checked, pair, positive
from ._tensors import check_choice, describe, disjoint, hold_until_done, on_device, on_host, same_stream

__all__ = [
    "geforce_p2p_staged_copy",
    "geforce_p2p_reduce_from_host",
    "geforce_p2p_copy_to_host",
    "geforce_p2p_copy_from_host",
    "staged_copy",
    "reduce_from_host",
    "copy_to_host",
    "copy_from_host",
    "reduce",
]


def staged_copy(dst: Any, src: Any, *, chunk_bytes: Optional[int] = None, slots: Optional[int] = None) -> Any:
    """Copy CUDA tensor ``src`` into CUDA tensor ``dst`` by the pipelined copy through pinned
    host slots, whatever P2P the pair has (device to host on ``src``'s device, host to device
    on ``dst``'s, both at once). Returns ``dst``."""
    if _compile.tracing():
        _compile.ops.staged_copy(dst, src, chunk_bytes, slots)
        return dst
    d, s = on_device(describe(dst, "dst")), on_device(describe(src, "src"))
    copy_checked(d, s, "staged", chunk_bytes, slots)
    return dst


def copy_to_host(dst: Any, src: Any) -> Any:
    """DMA CUDA tensor ``src`` into pinned CPU tensor ``dst``. Returns ``dst``; read it after
    synchronising ``src``'s stream."""
    if _compile.tracing():
        _compile.ops.copy_to_host(dst, src)
        return dst
    d, s = on_host(describe(dst, "dst")), on_device(describe(src, "src"))
    copy_checked(d, s, "auto", None, None)
    return dst


def copy_from_host(dst: Any, src: Any) -> Any:
    """DMA pinned CPU tensor ``src`` into CUDA tensor ``dst``. Returns ``dst``."""
    if _compile.tracing():
        _compile.ops.copy_from_host(dst, src)
        return dst
    d, s = on_device(describe(dst, "dst")), on_host(describe(src, "src"))
    copy_checked(d, s, "auto", None, None)
    return dst


def reduce_from_host(dst: Any, src: Any, op: str = "sum", divide_by: int = 1) -> Any:
    """``dst = op(dst, src)`` elementwise, for CUDA tensor ``dst`` and pinned CPU tensor
    ``src``, which the kernel reads across PCIe (no copy into device memory first).
    ``divide_by`` (>= 1) divides the result of ``op="avg"``. Returns ``dst``."""
    if _compile.tracing():
        _compile.ops.reduce_from_host(dst, src, op, divide_by)
        return dst
    op = check_choice("op", op, REDUCE_OPS)
    divide_by = positive("divide_by", divide_by) or 1
    d, s = on_device(describe(dst, "dst")), on_host(describe(src, "src"))
    pair(d, s)
    _native.reduce(d.dtype, d.numel, d.memory, s.ptr, op, divide_by, True)
    hold_until_done(s, d)
    return dst


def reduce(dst: Any, src: Any, op: str = "sum", divide_by: int = 1) -> Any:
    """``dst = op(dst, src)`` elementwise for two CUDA tensors on one device (separate
    memory). ``divide_by`` as for :func:`reduce_from_host`. Returns ``dst``."""
    if _compile.tracing():
        _compile.ops.reduce(dst, src, op, divide_by)
        return dst
    op = check_choice("op", op, REDUCE_OPS)
    divide_by = positive("divide_by", divide_by) or 1
    d, s = on_device(describe(dst, "dst")), on_device(describe(src, "src"))
    pair(d, s)
    if d.device != s.device:
        raise ValueError("src: on %s, but dst is on %s; reduce works on one device" % (s.where(), d.where()))
    same_stream(s, d)
    disjoint(s, d)
    _native.reduce(d.dtype, d.numel, d.memory, s.ptr, op, divide_by)
    return dst


# The names the ``kernels`` build's users are given.
geforce_p2p_staged_copy = staged_copy
geforce_p2p_reduce_from_host = reduce_from_host
geforce_p2p_copy_to_host = copy_to_host
geforce_p2p_copy_from_host = copy_from_host
