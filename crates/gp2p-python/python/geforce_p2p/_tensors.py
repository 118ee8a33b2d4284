"""Reading tensors without importing torch, and the checks every op makes before native code.

A tensor is read through torch's own attributes when it is a torch tensor (torch is looked
up in ``sys.modules``, never imported here), else through ``__cuda_array_interface__``
(device memory), ``__array_interface__`` (host memory) or DLPack (``__dlpack__``).

Streams: a torch tensor's op is ordered on the current torch stream of its device; an
array-interface object's on the stream it names (the legacy default stream when it names
none); a DLPack object's on the legacy default stream, which the producer is asked to
order its own work before.

Every refusal here is a ``TypeError`` (not a tensor, a dtype the kernels lack, mismatched
dtypes) or a ``ValueError`` (non-contiguous, mismatched shapes, two tensors on one device,
a CPU tensor that is not pinned), its message starting with the argument's name.
"""

from __future__ import annotations

import collections
import math
import sys
from typing import Any, NamedTuple, Optional, Sequence, Tuple

from . import _native

# The kernels' dtypes (kernels/src/dtype.rs) with their sizes and torch's names for them.
KERNEL_DTYPES = {
    "f32": (4, "float32"),
    "f64": (8, "float64"),
    "f16": (2, "float16"),
    "bf16": (2, "bfloat16"),
    "i8": (1, "int8"),
    "u8": (1, "uint8"),
    "i32": (4, "int32"),
    "u32": (4, "uint32"),
    "i64": (8, "int64"),
    "u64": (8, "uint64"),
    "f8e4m3": (1, "float8_e4m3fn"),
    "f8e5m2": (1, "float8_e5m2"),
}

# Array-interface type strings (numpy's) of each kernel dtype; bfloat16 and fp8 have none.
_TYPESTR = {
    "f4": "f32",
    "f8": "f64",
    "f2": "f16",
    "i1": "i8",
    "u1": "u8",
    "i4": "i32",
    "u4": "u32",
    "i8": "i64",
    "u8": "u64",
}

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3

# Stream handles with a fixed meaning (the driver API's CU_STREAM_LEGACY is 0x1; 0 is the
# NULL stream, the legacy default stream too).
LEGACY_DEFAULT_STREAM = 0
_DLPACK_LEGACY_STREAM = 1


def supported_torch_dtypes() -> Tuple[str, ...]:
    """Torch's names of the dtypes the kernels support."""
    return tuple(torch_name for _, torch_name in KERNEL_DTYPES.values())


class Tensor(NamedTuple):
    """What an op needs of one tensor argument."""

    obj: Any  # the object itself, held so its memory stays alive during the call
    name: str  # the argument's name for messages, such as "tensors[1]"
    device: Optional[int]  # CUDA ordinal, or None for host memory
    ptr: int  # address of the first element
    shape: Tuple[int, ...]  # for torch tensors its torch.Size (a tuple), not copied
    dtype: str  # kernel dtype name
    pinned: Optional[bool]  # host memory: page-locked? None where only the library can tell
    stream: int  # raw CUstream the op is ordered on (device memory)
    keep: Any = None  # anything else to hold during the call (a DLPack capsule)
    readonly: bool = False  # the producer marked the memory read-only

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * KERNEL_DTYPES[self.dtype][0]

    @property
    def memory(self) -> Tuple[int, int, int]:
        """(device, address, stream): what the native calls take for device memory."""
        assert self.device is not None
        return (self.device, self.ptr, self.stream)

    def where(self) -> str:
        return "cpu" if self.device is None else "cuda:%d" % self.device


def _torch():
    return sys.modules.get("torch")


_TORCH_DTYPE_NAMES: dict = {}


def torch_dtype_name(dtype: Any) -> Optional[str]:
    """The kernel name of a torch dtype, or None (memoised: torch dtypes are singletons, and
    this runs for every tensor of every call)."""
    try:
        return _TORCH_DTYPE_NAMES[dtype]
    except KeyError:
        pass
    text = str(dtype)
    found = None
    for name, (_, torch_name) in KERNEL_DTYPES.items():
        if text == "torch." + torch_name:
            found = name
    _TORCH_DTYPE_NAMES[dtype] = found
    return found


def torch_dtype(name: str) -> Any:
    """The torch dtype of a kernel dtype name."""
    import torch  # only callers that allocate with torch get here

    return getattr(torch, KERNEL_DTYPES[name][1])


def _unsupported(name: str, what: str) -> TypeError:
    return TypeError(
        "%s: dtype %s is not supported; the kernels take %s"
        % (name, what, ", ".join(supported_torch_dtypes()))
    )


def describe(obj: Any, name: str) -> Tensor:
    """Read one tensor argument, or raise TypeError naming it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj, name, torch)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_interface(obj, name, obj.__cuda_array_interface__, device_memory=True)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, name)
    if hasattr(obj, "__array_interface__"):
        return _from_interface(obj, name, obj.__array_interface__, device_memory=False)
    raise TypeError(
        "%s: expected a tensor (torch, __cuda_array_interface__ or DLPack), got %s"
        % (name, type(obj).__name__)
    )


# What the package takes from the torch module it last saw, found once, not per call:
# [module, its raw-stream getter or None, the parts the native fast paths ask for (see
# torch_fast_parts) or None].
_TORCH: list = [None, None, None]


def _torch_parts(torch: Any) -> list:
    """`_TORCH` for `torch`, found again only when the module changes."""
    if _TORCH[0] is not torch:
        getter = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        fast = None
        if getter is not None:
            to_dlpack, unshared = _torch_dlpack_export(torch)
            fast = (torch.Tensor, torch.strided, getter, _TORCH_DTYPE_NAMES, to_dlpack, unshared)
        _TORCH[:] = [torch, getter, fast]
    return _TORCH


def _torch_dlpack_export(torch: Any) -> Tuple[Any, Tuple[str, ...]]:
    """torch's ``_to_dlpack``, which the fast paths read a plain tensor with in one call, and
    the kernel dtypes whose DLPack type code no other torch dtype is exported with, which may
    then stand for the torch dtype (torch 2.11 exports int1 .. int7 with int8's code: an int8
    tensor has its dtype read by identity instead). Found by exporting a one-element CPU
    tensor of each torch dtype, once per torch module; ``(None, ())`` where torch has no
    export. Complex dtypes are left out: no kernel dtype has their code, and making a
    complex32 tensor warns."""
    to_dlpack = getattr(getattr(torch, "_C", None), "_to_dlpack", None)
    dtype_type = getattr(torch, "dtype", None)
    if to_dlpack is None or not isinstance(dtype_type, type):
        return None, ()
    exported = {}  # DLPack type code -> (the kernel dtype it names, the kernel names of the torch dtypes given it)
    for dtype in [v for v in vars(torch).values() if isinstance(v, dtype_type)]:
        if getattr(dtype, "is_complex", False):
            continue
        try:
            _, _, _, named, code, _, _ = _native.read_dlpack(to_dlpack(torch.empty(1, dtype=dtype, device="cpu")))
        except Exception:
            continue  # not exported: a tensor of it fails the export and is read by attributes
        exported.setdefault(code, (named, set()))[1].add(torch_dtype_name(dtype))
    unshared = tuple(named for named, names in exported.values() if named is not None and names == {named})
    return to_dlpack, unshared


def _current_raw_stream(torch: Any, device: int) -> int:
    """The handle of `device`'s current torch stream."""
    raw = _torch_parts(torch)[1]
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def torch_fast_parts(torch: Any) -> Optional[tuple]:
    """What the native fast paths read tensors of the module ``torch`` with: ``torch.Tensor``,
    ``torch.strided``, the current-raw-stream getter, the dtype names learnt so far, and
    torch's DLPack export with the dtypes its type codes may stand for
    (``_torch_dlpack_export``); None where torch has no raw-stream getter (its tensors are
    read here). The native side asks
    once per torch module and keeps the answer."""
    return _torch_parts(torch)[2]


# Tensor's fields in order, without NamedTuple's keyword-handling constructor (this runs
# for every tensor of every call).
_new_tensor = tuple.__new__


def _from_torch(t: Any, name: str, torch: Any) -> Tensor:
    # Not read natively (_native.read_torch) as the fast paths read: a native call of its own
    # per tensor cost as much host time as these lookups (git show 0d3275b:benches/results/python-dlpack-read-h200/README.md).
    if t.layout != torch.strided:
        raise TypeError("%s: a %s tensor; only dense (strided) tensors are supported" % (name, t.layout))
    dtype = _TORCH_DTYPE_NAMES.get(t.dtype) or torch_dtype_name(t.dtype)
    if dtype is None:
        raise _unsupported(name, str(t.dtype))
    # is_cuda / get_device() / the raw stream getter instead of t.device and
    # torch.cuda.current_stream(): each of those builds a Python object per call, and this
    # runs for every tensor of every call (a few microseconds against a 4-byte copy's ~15).
    is_cuda = t.is_cuda
    if not is_cuda and not t.is_cpu:
        raise TypeError("%s: a tensor on %s; only cuda and cpu tensors are supported" % (name, t.device))
    if not t.is_contiguous():
        raise ValueError(
            "%s: not contiguous (shape %s, strides %s); pass %s.contiguous()"
            % (name, tuple(t.shape), tuple(t.stride()), name)
        )
    if is_cuda:
        device = t.get_device()
        stream = _current_raw_stream(torch, device)
        pinned = None
    else:
        device, stream, pinned = None, LEGACY_DEFAULT_STREAM, bool(t.is_pinned())
    return _new_tensor(Tensor, (t, name, device, t.data_ptr(), t.shape, dtype, pinned, stream, None, False))


def _c_strides(shape: Sequence[int], size: int) -> Tuple[int, ...]:
    strides, step = [], size
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def _contiguous(shape: Sequence[int], strides: Optional[Sequence[int]], size: int) -> bool:
    """Row-major contiguity; strides of extent-1 dimensions do not matter, nor any of an
    empty array."""
    if strides is None or 0 in shape:
        return True
    expected = _c_strides(shape, size)
    return all(d == 1 or s == e for d, s, e in zip(shape, strides, expected))


def _from_interface(obj: Any, name: str, interface: dict, device_memory: bool) -> Tensor:
    which = "__cuda_array_interface__" if device_memory else "__array_interface__"
    try:
        shape = tuple(int(d) for d in interface["shape"])
        typestr = str(interface["typestr"])
        ptr = int(interface["data"][0])
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise TypeError("%s: malformed %s (%s)" % (name, which, e)) from None
    if typestr[:1] not in ("<", "|", "="):
        raise _unsupported(name, "%r (only little-endian data)" % typestr)
    dtype = _TYPESTR.get(typestr[1:])
    if dtype is None:
        raise _unsupported(name, repr(typestr))
    readonly = bool(interface["data"][1])
    strides = interface.get("strides")
    if not _contiguous(shape, strides, KERNEL_DTYPES[dtype][0]):
        raise ValueError(
            "%s: not contiguous (shape %s, strides %s); pass a contiguous copy"
            % (name, shape, tuple(strides or ()))
        )
    if device_memory:
        device = _device_of(obj, name)
        stream = interface.get("stream")
        stream = LEGACY_DEFAULT_STREAM if stream is None else int(stream)
        return Tensor(obj, name, device, ptr, shape, dtype, None, stream, None, readonly)
    return Tensor(obj, name, None, ptr, shape, dtype, None, LEGACY_DEFAULT_STREAM, None, readonly)


def _device_of(obj: Any, name: str) -> int:
    """The CUDA ordinal of a ``__cuda_array_interface__`` object, which the interface does not
    say: its ``device`` attribute (an int, or an object with an int ``id`` or ``index``, as
    CuPy's and torch's are), else device 0 when it is the only one."""
    value = getattr(obj, "device", None)
    if isinstance(value, int):
        return value
    for field in ("id", "index"):
        inner = getattr(value, field, None)
        if isinstance(inner, int):
            return inner
    if _native.device_count() == 1:
        return 0
    raise TypeError(
        "%s: cannot tell which CUDA device holds it (__cuda_array_interface__ does not say): "
        "give it a `device` attribute with the ordinal, or pass a torch tensor" % name
    )


def _from_dlpack(obj: Any, name: str) -> Tensor:
    device_type, device_id = obj.__dlpack_device__()
    if device_type not in (_DL_CPU, _DL_CUDA, _DL_CUDA_HOST):
        raise TypeError("%s: a DLPack tensor on device type %d; only CUDA and CPU memory" % (name, device_type))
    if device_type == _DL_CUDA:
        capsule = obj.__dlpack__(stream=_DLPACK_LEGACY_STREAM)
    else:
        capsule = obj.__dlpack__()
    # The capsule is not consumed (not renamed): its producer frees the managed tensor when
    # the capsule goes, after the call, while the object itself keeps the memory.
    try:
        _, _, ptr, dtype, (code, bits, lanes), shape, strides = _native.read_dlpack(capsule)
    except (TypeError, ValueError) as e:
        raise TypeError("%s: __dlpack__ gave no readable 'dltensor' capsule (%s)" % (name, e)) from None
    if dtype is None:
        what = "with %d lanes" % lanes if lanes != 1 else "DLPack code %d, %d bits" % (code, bits)
        raise _unsupported(name, what)
    shape = tuple(shape)
    size = KERNEL_DTYPES[dtype][0]
    if not _contiguous(shape, None if strides is None else [s * size for s in strides], size):
        raise ValueError("%s: not contiguous (shape %s, strides %s elements)" % (name, shape, tuple(strides)))
    if device_type == _DL_CUDA:
        return Tensor(obj, name, int(device_id), ptr, shape, dtype, None, LEGACY_DEFAULT_STREAM, capsule)
    pinned = True if device_type == _DL_CUDA_HOST else None
    return Tensor(obj, name, None, ptr, shape, dtype, pinned, LEGACY_DEFAULT_STREAM, capsule)


# ---- checks shared by the ops ----


def on_device(t: Tensor, what: str = "a CUDA tensor") -> Tensor:
    if t.device is None:
        raise ValueError("%s: a CPU tensor, expected %s" % (t.name, what))
    return t


def writable(t: Tensor) -> Tensor:
    if t.readonly:
        raise ValueError("%s: read-only memory cannot be written" % t.name)
    return t


def on_host(t: Tensor) -> Tensor:
    if t.device is not None:
        raise ValueError("%s: a tensor on %s, expected a pinned CPU tensor" % (t.name, t.where()))
    if t.pinned is False:
        raise ValueError("%s: a CPU tensor that is not pinned; pass %s.pin_memory()" % (t.name, t.name))
    return t


def same_dtype(t: Tensor, like: Tensor) -> None:
    if t.dtype != like.dtype:
        raise TypeError(
            "%s: dtype %s, but %s is %s; give both one dtype"
            % (t.name, KERNEL_DTYPES[t.dtype][1], like.name, KERNEL_DTYPES[like.dtype][1])
        )


def same_stream(t: Tensor, like: Tensor) -> None:
    """Refuse a read tensor ordered on another stream of its device than the op's: the op runs
    on ``like``'s stream, and would neither wait for ``t``'s producer nor hold off its free.
    (Torch tensors of one device share the current stream, so they always pass.)"""
    if t.device is not None and t.device == like.device and t.stream != like.stream:
        raise ValueError(
            "%s: ordered on stream %#x, but %s on stream %#x of the same device; give both one stream"
            % (t.name, t.stream, like.name, like.stream)
        )


def same_shape(t: Tensor, like: Tensor) -> None:
    if t.shape != like.shape:
        raise ValueError("%s: shape %s, but %s has shape %s" % (t.name, tuple(t.shape), like.name, tuple(like.shape)))


def one_per_device(ts: Sequence[Tensor]) -> None:
    seen = {}
    for t in ts:
        if t.device in seen:
            raise ValueError(
                "%s: on %s like %s; give one tensor per device" % (t.name, t.where(), seen[t.device].name)
            )
        seen[t.device] = t


def disjoint(a: Tensor, b: Tensor) -> None:
    """Refuse two tensors whose memory overlaps (one read while the other is written)."""
    if a.device != b.device or a.nbytes == 0 or b.nbytes == 0:
        return
    if a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes:
        raise ValueError("%s: overlaps %s in memory; give separate tensors" % (a.name, b.name))


# "tensors[1]" and the like, made once per (list name, index).
_ITEM_NAMES: dict = {}


def _item_name(name: str, i: int) -> str:
    try:
        return _ITEM_NAMES[name, i]
    except KeyError:
        text = _ITEM_NAMES[name, i] = "%s[%d]" % (name, i)
        return text


def tensor_list(objs: Any, name: str) -> list:
    """Read a list argument (one tensor per device)."""
    if isinstance(objs, (str, bytes)) or not isinstance(objs, (list, tuple)):
        raise TypeError("%s: expected a list of tensors, one per device, got %s" % (name, type(objs).__name__))
    if not objs:
        raise ValueError("%s: an empty list; give one tensor per device" % name)
    return [describe(o, _item_name(name, i)) for i, o in enumerate(objs)]


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if type(value) is str and value in choices:  # the usual case: already a lower-case choice
        return value
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError("%s: %r is not one of %s" % (name, value, ", ".join(choices)))
    return value.lower()


# ---- keeping host memory alive ----

# Host memory that a copy or a reduce still reads or writes, each with a torch event recorded
# after the op on its stream, oldest first. Torch frees device memory in stream order, but
# pinned host memory goes back to its cache as soon as the tensor dies and may be handed out
# and written by the CPU at once; other frameworks' host arrays likewise: so the object (and
# any DLPack capsule behind it) is held until its op is done.
_held: collections.deque = collections.deque()


def hold_until_done(t: Tensor, stream_of: Tensor) -> None:
    """Keep host memory ``t`` (its object and capsule) alive until the work queued so far on
    the stream of ``stream_of`` (a CUDA tensor) is done. Needs torch for the event; without
    torch loaded the memory is its owner's to keep until the stream is synchronised."""
    _release_done()
    torch = _torch()
    if torch is None or stream_of.device is None:
        return
    # The stream the op ran on (what the native call was given), not the current one: for
    # an array naming its own stream, or DLPack's legacy stream, they differ.
    stream = torch.cuda.ExternalStream(stream_of.stream, device=stream_of.device)
    event = torch.cuda.Event()
    event.record(stream)
    _held.append((event, t.obj, t.keep))


def _release_done() -> None:
    """Let go of what finished ops held, oldest first: a call costs one query when nothing
    finished, not one per op in flight."""
    while _held and _held[0][0].query():
        _held.popleft()
