"""The torch-facing operations: copies and collectives on tensors, on torch's current streams.

Stream semantics, for every op: its work is ordered after the work already queued on the
current stream of each tensor's device, and work queued there afterwards sees its result,
with no synchronisation; the host is not blocked. The library's internal streams join back
into those streams before the call returns, so torch may free or reuse a tensor's memory in
stream order as usual. As with torch's own ops, a tensor used under a stream other than the
one it was allocated on (``with torch.cuda.stream(s)``) needs ``t.record_stream(s)`` before it
is freed. Pinned CPU tensors that a copy reads or writes are held by this
module until the copy is done (torch would otherwise hand their memory out again at once);
read a CPU result only after synchronising its stream, as with ``non_blocking=True``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

from . import _compile, _native
from ._tensors import (
    Tensor,
    check_choice,
    describe,
    disjoint,
    hold_until_done,
    on_device,
    on_host,
    one_per_device,
    same_dtype,
    same_shape,
    tensor_list,
    torch_dtype,
    same_stream,
    writable,
)

REDUCE_OPS = ("sum", "avg", "min", "max", "prod")
ROUTES = ("auto", "peer", "staged")
TRANSPORTS = ("auto", "scratch", "zero-copy")


def at_least(name: str, value: Any, least: int) -> Optional[int]:
    """``value``: None, or an integer (not a bool) of at least ``least``; else ValueError
    naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        what = "a positive integer" if least == 1 else "an integer >= %d" % least
        raise ValueError("%s: %r is not %s" % (name, value, what))
    return value


def positive(name: str, value: Any) -> Optional[int]:
    return at_least(name, value, 1)


def target_device(device: Any) -> Optional[int]:
    """A CUDA ordinal of a device that exists, or None for pinned host memory, from 1,
    "cuda:1", "cuda", "cpu" or a torch.device; else ValueError naming ``device``."""
    if isinstance(device, bool):
        raise TypeError("device: expected a device such as 'cuda:1', got %r" % (device,))
    if isinstance(device, int):
        if device < 0:
            raise ValueError("device: %d is not a CUDA ordinal" % device)
        return _existing(device)
    text = str(device)
    if text == "cpu":
        return None
    if text == "cuda":
        import torch

        return torch.cuda.current_device()
    if text.startswith("cuda:") and text[5:].isdigit():
        return _existing(int(text[5:]))
    raise ValueError("device: %r is not a device; expected 'cuda:N', N or 'cpu'" % (device,))


_visible_devices: Optional[int] = None
_device_count = _native.device_count


def _existing(ordinal: int) -> int:
    """``ordinal`` if this process sees such a CUDA device, else ValueError naming
    ``device``. Without a driver it is let through: the call then raises UnavailableError."""
    global _visible_devices
    if _visible_devices is None:
        try:
            count = _device_count()
        except Exception:  # noqa: BLE001  (no driver: UnavailableError comes from the op)
            return ordinal
        if not isinstance(count, int):
            return ordinal
        # Fixed for the process's life (CUDA_VISIBLE_DEVICES is read once, at init).
        _visible_devices = count
    if ordinal >= _visible_devices:
        seen = "no CUDA device" if _visible_devices == 0 else "%d CUDA device%s (cuda:0%s)" % (
            _visible_devices, "" if _visible_devices == 1 else "s",
            "" if _visible_devices == 1 else "..cuda:%d" % (_visible_devices - 1))
        raise ValueError("device: cuda:%d does not exist; this process sees %s" % (ordinal, seen))
    return ordinal


def _device_text(device: Any) -> str:
    """``device`` as the text the custom op ``copy`` takes ("cuda:1", "cpu")."""
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda:%d" % device
    return str(device)


def device_index(device: Any) -> int:
    """``device`` as a CUDA ordinal; ValueError naming it where it is not a CUDA device."""
    index = target_device(device)
    if index is None:
        raise ValueError("device: %r is not a CUDA device; pass an ordinal, 'cuda:N' or a torch.device" % (device,))
    return index


def _import_torch(what: str):
    try:
        import torch
    except ImportError:
        raise TypeError(
            "%s allocates its output with torch, which is not installed: "
            "pass an output of your own to copy_(dst, src)" % what
        ) from None
    return torch


def copy(src: Any, device: Any, *, route: str = "auto", chunk_bytes: Optional[int] = None,
         slots: Optional[int] = None) -> Any:
    """A new tensor on ``device`` (``"cuda:1"``, ``1``, a ``torch.device``, or ``"cpu"`` for a
    pinned CPU tensor) holding a copy of ``src``, allocated by torch (torch owns it).

    Between two GPUs it goes by P2P where the pair has it (``route="auto"``), else staged
    through pinned host memory; ``route="staged"`` forces the staged pipeline and
    ``route="peer"`` P2P (an error without it). ``chunk_bytes`` and ``slots`` tune the
    staged pipeline. A CPU source must be pinned. Stream-ordered; see the module docs.
    """
    if _compile.tracing():
        return _compile.ops.copy(src, _device_text(device), route, chunk_bytes, slots)
    target = target_device(device)
    where = "cpu" if target is None else "cuda:%d" % target
    out = None
    torch = sys.modules.get("torch")
    if target is not None and chunk_bytes is None and slots is None and torch is not None \
            and isinstance(src, torch.Tensor) and src.is_cuda and src.layout is torch.strided and src.is_contiguous():
        # GPU to GPU, the usual case: allocated like src, then copy_'s fast path, which reads
        # both natively (it declines anything else, untouched: read and refused below). Only
        # a dense contiguous src is allocated for here: a view's or a sparse tensor's shape may
        # be far larger than its memory, and is refused by name below before anything is made.
        out = torch.empty(src.shape, dtype=src.dtype, device=where)
        if _native.copy_torch(out, src, route):
            return out
    s = describe(src, "src")
    if s.device is None and target is None:
        raise ValueError("src: a CPU tensor copied to the CPU; use torch's copy_")
    if out is None:
        torch = _import_torch("copy")
        out = torch.empty(s.shape, dtype=torch_dtype(s.dtype), device=where, pin_memory=target is None)
    copy_checked(describe(out, "dst"), s, route, chunk_bytes, slots)
    return out


def copy_(dst: Any, src: Any, *, route: str = "auto", chunk_bytes: Optional[int] = None,
          slots: Optional[int] = None) -> Any:
    """Copy ``src`` into ``dst`` (same shape and dtype; any two devices, or a pinned CPU
    tensor on one side) and return ``dst``. Options as for :func:`copy`."""
    if _compile.tracing():
        _compile.ops.copy_(dst, src, route, chunk_bytes, slots)
        return dst
    # Two torch CUDA tensors are read by the native call itself (see all_reduce); it returns
    # False for anything else, overlapping tensors and a route it does not know, untouched.
    if chunk_bytes is None and slots is None and _native.copy_torch(dst, src, route):
        return dst
    copy_checked(describe(dst, "dst"), describe(src, "src"), route, chunk_bytes, slots)
    return dst


def copy_checked(d: Tensor, s: Tensor, route: str, chunk_bytes: Optional[int], slots: Optional[int]) -> None:
    route = check_choice("route", route, ROUTES)
    chunk_bytes, slots = positive("chunk_bytes", chunk_bytes), positive("slots", slots)
    pair(d, s)
    if d.device is not None and s.device is not None:
        disjoint(d, s)
        _native.copy(s.dtype, s.numel, s.memory, d.memory, route, chunk_bytes, slots)
        return
    if route == "peer":
        raise ValueError("route: 'peer' needs two CUDA tensors; a host copy is one DMA")
    if d.device is None and s.device is None:
        raise ValueError("dst: src and dst are both CPU tensors; use torch's copy_")
    if d.device is not None:
        on_host(s)
        _native.copy_from_host(s.dtype, s.numel, s.ptr, d.memory)
        hold_until_done(s, d)
    else:
        on_host(d)
        _native.copy_to_host(s.dtype, s.numel, s.memory, d.ptr)
        hold_until_done(d, s)


def pair(d: Tensor, s: Tensor) -> None:
    """``dst`` and ``src`` of a two-tensor op: ``dst`` writable, same dtype and shape."""
    writable(d)
    same_dtype(d, s)
    same_shape(d, s)


def _ranks(objs: Any, name: str, write: bool = True) -> list:
    """A list of CUDA tensors of one dtype and shape, one per device."""
    ts = tensor_list(objs, name)
    first = ts[0]
    devices = set()
    for t in ts:
        # One test for the usual case; the checks below name what is wrong otherwise.
        if t.device is None or (write and t.readonly) or t.dtype != first.dtype or t.shape != first.shape:
            on_device(t)
            if write:
                writable(t)
            same_dtype(t, first)
            same_shape(t, first)
        devices.add(t.device)
    if len(devices) != len(ts):
        one_per_device(ts)
    return ts


def all_reduce(
    tensors: Sequence[Any],
    op: str = "sum",
    *,
    transport: str = "auto",
    compress: Optional[str] = None,
    block: int = 64,
) -> None:
    """In place: every tensor becomes ``op`` (sum, avg, min, max, prod) over all of them.
    ``tensors``: one CUDA tensor per device, same shape and dtype. One tensor is a no-op.
    ``transport`` picks how received chunks are folded in (auto, scratch, zero-copy).

    ``compress="int8"`` or ``"fp8"``: lossy, sum or avg of float32, float16 or bfloat16 only.
    Values travel as one-byte codes in blocks of ``block`` values (a power of two from 32 to
    256) sharing a scale, about half the bytes of bfloat16; every tensor ends with the same
    bits, each element within the bound docs/compression.md states (blocks with NaN or an
    infinity travel exact). Never chosen by itself: ask for it where that error is acceptable."""
    # Torch tensors in the usual shape are read by the native call itself (about half the
    # host time of reading them here); it returns False for anything else and for an op or
    # transport it does not know, untouched, and they are read and checked here.
    if compress is not None:
        _all_reduce_compressed(tensors, op, compress, block)
        return
    if _compile.tracing():
        _compile.ops.all_reduce(list(tensors), op, transport)
        return
    if _native.all_reduce_torch(tensors, op, transport):
        return
    op = check_choice("op", op, REDUCE_OPS)
    transport = check_choice("transport", transport, TRANSPORTS)
    ts = _ranks(tensors, "tensors")
    _native.all_reduce(ts[0].dtype, ts[0].numel, [t.memory for t in ts], op, transport)


COMPRESS_FORMATS = ("int8", "fp8")
COMPRESSIBLE_DTYPES = ("f32", "f16", "bf16")


def _all_reduce_compressed(tensors: Sequence[Any], op: str, compress: Any, block: Any) -> None:
    compress = check_choice("compress", compress, COMPRESS_FORMATS)
    op = check_choice("op", op, REDUCE_OPS)
    if op not in ("sum", "avg"):
        raise ValueError("op: compress=%r takes 'sum' or 'avg', not %r" % (compress, op))
    if isinstance(block, bool) or not isinstance(block, int) or block not in (32, 64, 128, 256):
        raise ValueError("block: %r is not one of 32, 64, 128, 256 (values per scale)" % (block,))
    if _compile.tracing():
        raise NotImplementedError("compress=: the compressed all-reduce has no torch.compile op yet; call it eagerly")
    ts = _ranks(tensors, "tensors")
    if ts[0].dtype not in COMPRESSIBLE_DTYPES:
        raise TypeError("tensors: compress=%r takes float32, float16 or bfloat16 tensors, not %s" % (compress, ts[0].dtype))
    _native.all_reduce_compressed(ts[0].dtype, ts[0].numel, [t.memory for t in ts], op, compress, block)


def _paired(inputs: Any, outputs: Any) -> tuple:
    ins = _ranks(inputs, "inputs", write=False)
    outs = _ranks(outputs, "outputs")
    if len(ins) != len(outs):
        raise ValueError("inputs: %d tensors for %d outputs; give one per output" % (len(ins), len(outs)))
    for i, o in zip(ins, outs):
        same_dtype(i, outs[0])
        if i.device != o.device:
            raise ValueError("%s: on %s, but %s is on %s" % (i.name, i.where(), o.name, o.where()))
        same_stream(i, o)
    for i in ins:
        for o in outs:
            disjoint(i, o)
    return ins, outs


def _check_n_times(whole: str, numel: int, parts: str, part_numel: int, n: int) -> None:
    """Refuse ``whole[0]`` unless it holds ``n`` times ``parts[0]``'s elements (the gather's
    outputs and the scatter's inputs hold one segment per rank)."""
    if numel != n * part_numel:
        raise ValueError(
            "%s[0]: %d elements, expected %d (%d %s of %d)" % (whole, numel, n * part_numel, n, parts, part_numel)
        )


def all_gather(inputs: Sequence[Any], outputs: Sequence[Any], *, transport: str = "auto") -> None:
    """Every ``outputs[r]`` (n times the elements of an input) becomes the concatenation of
    all ``inputs`` in rank order; ``inputs[r]`` is on ``outputs[r]``'s device."""
    if _compile.tracing():
        _compile.ops.all_gather(list(inputs), list(outputs), transport)
        return
    transport = check_choice("transport", transport, TRANSPORTS)
    ins, outs = _paired(inputs, outputs)
    _check_n_times("outputs", outs[0].numel, "inputs", ins[0].numel, len(ins))
    _native.all_gather(ins[0].dtype, ins[0].numel, [i.ptr for i in ins], [o.memory for o in outs], transport)


def reduce_scatter(inputs: Sequence[Any], outputs: Sequence[Any], op: str = "sum", *,
                   transport: str = "auto") -> None:
    """``outputs[r]`` becomes ``op`` over part r of every input (each input n times the
    elements of an output); ``inputs[r]`` is on ``outputs[r]``'s device and is unchanged."""
    if _compile.tracing():
        _compile.ops.reduce_scatter(list(inputs), list(outputs), op, transport)
        return
    op = check_choice("op", op, REDUCE_OPS)
    transport = check_choice("transport", transport, TRANSPORTS)
    ins, outs = _paired(inputs, outputs)
    _check_n_times("inputs", ins[0].numel, "outputs", outs[0].numel, len(ins))
    _native.reduce_scatter(outs[0].dtype, outs[0].numel, [i.ptr for i in ins], [o.memory for o in outs], op, transport)


def broadcast(tensors: Sequence[Any], root: int = 0, *, transport: str = "auto") -> None:
    """Every tensor becomes a copy of ``tensors[root]``; one CUDA tensor per device."""
    if _compile.tracing():
        _compile.ops.broadcast(list(tensors), root, transport)
        return
    transport = check_choice("transport", transport, TRANSPORTS)
    ts = _ranks(tensors, "tensors", write=False)
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < len(ts):
        raise ValueError("root: %r is not a rank of %d tensors" % (root, len(ts)))
    for r, t in enumerate(ts):
        if r != root:
            writable(t)
    _native.broadcast(ts[0].dtype, ts[0].numel, [t.memory for t in ts], root, transport)


def device_count() -> int:
    """The number of visible CUDA devices; raises UnavailableError without a driver."""
    return _native.device_count()


def cached_host_bytes() -> int:
    """Bytes of pinned host memory the library keeps for reuse: its staging buffers, once
    dropped and their GPU work done, are kept for the next of about their size rather than
    freed (freeing pinned memory waits for the whole device, and other threads' CUDA calls
    wait behind it), as torch's pinned-memory allocator does."""
    return _native.cached_host_bytes()


def release_cached_host_memory(device: Any = 0) -> int:
    """Hand the pinned host memory kept for reuse back to the driver and return how many
    bytes that was (``device``: whose context makes the calls; an ordinal, ``"cuda:N"`` or a
    ``torch.device``). This blocks until the device is idle: call it between phases of work,
    like ``torch.cuda.empty_cache()``. Raises UnavailableError without a driver."""
    return _native.release_cached_host_memory(device_index(device))

