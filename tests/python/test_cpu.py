"""CPU tests of the installed geforce_p2p package: no GPU, no driver, no torch needed.

What they cover: the package imports, the probe and the command line report the missing
driver as geforce_p2p.UnavailableError / exit code 3, the dtype and error tables agree with
the native module, every argument check refuses bad input by name before native code runs
(stand-ins with __cuda_array_interface__, __array_interface__ and DLPack, and a stand-in
torch module for the torch path), valid input reaches native code with the right
addresses, lengths and streams, and the native module's own checks refuse bad input
before touching the (absent) driver.
"""

import ctypes
import json
import math
import pathlib
import subprocess
import sys
import types
import unittest.mock

import pytest

import geforce_p2p as gp
from geforce_p2p import _api, _native, _tensors, ops

REPO = pathlib.Path(__file__).resolve().parents[2]

# ---- stand-ins ----------------------------------------------------------------------------

_next_address = [0x7F00_0000_0000]


def _address(nbytes):
    """A fresh, 256-byte aligned fake device address (never dereferenced: these tests stop
    before the driver)."""
    addr = _next_address[0]
    _next_address[0] += (nbytes + 255) // 256 * 256 + 256
    return addr


class CudaArray:
    """A device array as far as __cuda_array_interface__ (v3) goes."""

    def __init__(self, shape, typestr="<f4", device=0, strides=None, readonly=False, stream=None, ptr=None):
        size = int(typestr[2:])
        n = 1
        for d in shape:
            n *= d
        self.device = device
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (_address(n * size) if ptr is None else ptr, readonly),
            "strides": strides,
            "stream": stream,
            "version": 3,
        }

    @property
    def ptr(self):
        return self.__cuda_array_interface__["data"][0]


class HostArray:
    """Host memory as far as __array_interface__ goes (its pinning is unknown to Python)."""

    def __init__(self, shape, typestr="<f4"):
        self.__array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (_address(4096), False), "version": 3}


# A DLPack producer's structs, as dlpack.h lays them out (test_dlpack_structs_have_dlpacks_layout
# checks the offsets); the library reads them natively (_native.read_dlpack), so the tests
# below check its reader against this layout, and the GPU tests against torch's export.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="the offsets below are those of a 64-bit build")
def test_dlpack_structs_have_dlpacks_layout():
    # (field, byte offset) as dlpack.h lays out DLTensor and DLManagedTensor on 64-bit.
    tensor = [("data", 0), ("device", 8), ("ndim", 16), ("dtype", 20), ("shape", 24), ("strides", 32), ("byte_offset", 40)]
    for field, at in tensor:
        assert getattr(_DLTensor, field).offset == at, field
    assert ctypes.sizeof(_DLTensor) == 48
    for field, at in [("dl_tensor", 0), ("manager_ctx", 48), ("deleter", 56)]:
        assert getattr(_DLManagedTensor, field).offset == at, field
    assert (ctypes.sizeof(_DLDevice), ctypes.sizeof(_DLDataType)) == (8, 4)


class DLPackArray:
    """A DLPack producer built with ctypes: its capsule points at a DLManagedTensor this
    object owns (no deleter: the object outlives the capsule in these tests)."""

    def __init__(self, shape, code, bits, device_type=2, device_id=0, strides=None, byte_offset=0, lanes=1):
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.data = _address(1 << 16)
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = self.data
        t.device = _DLDevice(device_type, device_id)
        t.ndim = len(shape)
        t.dtype = _DLDataType(code, bits, lanes)
        t.shape = self._shape
        t.strides = self._strides
        t.byte_offset = byte_offset
        self.streams_asked = []

    def __dlpack_device__(self):
        return (self._managed.dl_tensor.device.device_type, self._managed.dl_tensor.device.device_id)

    def __dlpack__(self, stream=None):
        self.streams_asked.append(stream)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._managed), b"dltensor", None)


class FakeTorch:
    """Enough of torch for the package's torch path: tensors, dtypes, devices, current
    streams (handle 0x5000 + ordinal, so tests can see which stream was used), events."""

    def __init__(self):
        self.module = types.ModuleType("torch")
        m = self.module
        m.strided = "torch.strided"
        m.sparse_coo = "torch.sparse_coo"

        class Dtype:
            def __init__(self, name):
                self.name = name

            def __str__(self):
                return "torch." + self.name

        for name in ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32", "int64",
                     "uint64", "bool", "complex64", "int16"):
            setattr(m, name, Dtype(name))

        class Device:
            def __init__(self, text):
                kind, _, index = str(text).partition(":")
                self.type, self.index = kind, (int(index) if index else None)

            def __str__(self):
                return self.type if self.index is None else "%s:%d" % (self.type, self.index)

        sizes = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4,
                 "uint32": 4, "int64": 8, "uint64": 8, "bool": 1, "complex64": 8, "int16": 2}

        class Tensor:
            def __init__(self, shape, dtype=m.float32, device="cuda:0", pinned=False, strides=None,
                         layout=m.strided):
                self.shape, self.dtype, self.device = tuple(shape), dtype, Device(device)
                self.layout, self._pinned = layout, pinned
                n = 1
                for d in shape:
                    n *= d
                self._ptr = _address(n * sizes[dtype.name])
                self._strides = strides or tuple(_tensors._c_strides(shape, 1))

            def is_contiguous(self):
                return _tensors._contiguous(self.shape, self._strides, 1)

            def stride(self):
                return self._strides

            def data_ptr(self):
                return self._ptr

            def is_pinned(self):
                return self._pinned

            # What torch offers besides .device, read on the hot path.
            @property
            def is_cuda(self):
                return self.device.type == "cuda"

            @property
            def is_cpu(self):
                return self.device.type == "cpu"

            def get_device(self):
                if self.device.type != "cuda":
                    return -1
                return 0 if self.device.index is None else self.device.index

        m.Tensor = Tensor
        m.device = Device
        m.events = []

        class Stream:
            def __init__(self, device):
                self.cuda_stream = 0x5000 + device

        class ExternalStream:
            def __init__(self, stream_ptr, device=None):
                self.cuda_stream = stream_ptr

        class Event:
            def __init__(self):
                self.recorded, self.done = None, False
                m.events.append(self)

            def record(self, stream):
                self.recorded = stream.cuda_stream

            def query(self):
                return self.done

        def empty(shape, dtype, device, pin_memory=False):
            return Tensor(shape, dtype=dtype, device=device, pinned=pin_memory)

        m.empty = empty
        m.cuda = types.SimpleNamespace(
            current_stream=lambda device: Stream(device if isinstance(device, int) else device.index),
            current_device=lambda: 0,
            Event=Event,
            ExternalStream=ExternalStream,
        )


# The real torch where installed (CI has none), taken before the fixture below hides it: the
# fast-path test reads real tensors (torch cannot be imported again once it was removed).
try:
    import torch as _REAL_TORCH
except ImportError:
    _REAL_TORCH = None


@pytest.fixture(autouse=True)
def no_real_torch(monkeypatch):
    """These tests' world has no torch but the fake one the `torch` fixture brings, even
    where another test module loaded the real one (which would record CUDA events for the
    stand-ins, on a machine without a driver)."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)


@pytest.fixture
def torch(monkeypatch):
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake.module)
    return fake.module


class Recorder:
    """Stands in for the native module: records each call instead of running it, except the
    torch fast paths, which are the real ones (they decline every stand-in, so the calls
    the Python layer makes next are the ones recorded)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name.endswith("_torch"):
            return getattr(_native, name)

        def record(*args):
            self.calls.append((name, args))

        return record


@pytest.fixture
def native(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(_api, "_native", recorder)
    monkeypatch.setattr(ops, "_native", recorder)
    return recorder


# ---- the package without a driver ------------------------------------------------------------


def test_probe_raises_no_driver():
    with pytest.raises(gp.UnavailableError, match="no NVIDIA") as raised:
        gp.probe()
    assert isinstance(raised.value, gp.Error)
    assert str(raised.value).startswith("no NVIDIA CUDA driver found")
    with pytest.raises(gp.UnavailableError):
        gp.device_count()


def test_the_pinned_cache_is_empty_and_its_release_needs_a_driver():
    assert gp.cached_host_bytes() == 0
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        gp.release_cached_host_memory()
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        gp.release_cached_host_memory("cuda:1")
    with pytest.raises(ValueError, match="device: 'cpu' is not a CUDA device"):
        gp.release_cached_host_memory("cpu")


def test_valid_input_reaches_the_library_and_gets_its_error():
    a, b = CudaArray((5,), device=0), CudaArray((5,), device=1)
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        gp.copy_(b, a)
    with pytest.raises(gp.UnavailableError):
        gp.all_reduce([a, b], op="avg")


def test_command_line_is_the_gp2p_one():
    run = lambda *args: subprocess.run([sys.executable, "-m", "geforce_p2p", *args], capture_output=True, text=True)
    probe = run("probe")
    assert probe.returncode == 3, probe
    assert "gp2p: no NVIDIA CUDA driver found" in probe.stderr
    devices = run("devices")
    assert devices.returncode == 3, devices
    assert "python -m geforce_p2p probe --example 2x4090" in devices.stderr, "every command names the next step"
    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == "gp2p " + gp.__version__
    usage = run("bogus")
    assert usage.returncode == 2 and "unrecognized subcommand" in usage.stderr
    bench = run("bench", "--help")
    assert bench.returncode == 0 and "all-reduce" in bench.stdout
    saved = REPO / "benches" / "results" / "h200" / "probe.json"
    rendered = run("probe", "--from", str(saved))
    assert rendered.returncode == 0, rendered.stderr
    assert "NVIDIA H200" in rendered.stdout


def test_probe_report_is_dicts_and_printable():
    saved = REPO / "benches" / "results" / "h200" / "probe.json"
    data = json.loads(saved.read_text())
    report = gp.ProbeReport(data, "table")
    assert report.devices[0]["name"] == "NVIDIA H200"
    assert report.verdicts == data["verdicts"] and report.pairs == data["facts"]["pairs"]
    assert str(report) == "table" and "1 device(s)" in repr(report)
    assert json.loads(report.to_json()) == data


def test_tables_agree_with_the_native_module():
    assert [(k, v[0]) for k, v in _tensors.KERNEL_DTYPES.items()] == list(map(tuple, _native.dtypes()))
    assert list(_api.REDUCE_OPS) == list(_native.reduce_ops())
    for name in _native.error_classes():
        assert issubclass(getattr(gp, name), gp.Error), name
    assert issubclass(gp.InvalidArgumentError, ValueError) and issubclass(gp.NotPinnedError, gp.InvalidArgumentError)
    assert gp.Error.__module__ == "geforce_p2p"


def test_native_checks_refuse_before_the_driver():
    """The Rust side checks what it cheaply can, before it looks for a driver."""
    cases = [
        (lambda: _native.copy("f32", 4, (0, 0x1002, 0), (1, 0x2000, 0)), "not aligned to 4 bytes"),
        (lambda: _native.copy("bool", 4, (0, 0x1000, 0), (1, 0x2000, 0)), "dtype"),
        (lambda: _native.copy("f32", 4, (0, 0x1000, 0), (1, 0x2000, 0), "p2p"), "route"),
        (lambda: _native.copy("f32", 4, (0, 0, 0), (1, 0x2000, 0)), "address 0"),
        (lambda: _native.all_reduce("f32", 4, [(0, 0x100, 0), (0, 0x200, 0)], "sum"), "both on cuda:0"),
        (lambda: _native.all_reduce("f32", 4, [(0, 0x100, 0)], "mean"), "op"),
        (lambda: _native.all_reduce("f32", 4, [(0, 0x100, 0)], "sum", "dma"), "transport"),
        (lambda: _native.all_reduce_compressed("f32", 4, [(0, 0x100, 0)], "sum", "int4", 64), "compress"),
        (lambda: _native.all_reduce_compressed("f32", 4, [(0, 0x100, 0)], "sum", "int8", 48), "block"),
        (lambda: _native.all_reduce_compressed("f32", 4, [(0, 0x100, 0), (0, 0x200, 0)], "sum", "fp8", 64), "both on cuda:0"),
        (lambda: _native.broadcast("f32", 4, [(0, 0x100, 0), (1, 0x100, 0)], 2), "root"),
        (lambda: _native.all_gather("f32", 4, [0x100], [(0, 0x104, 0)]), "overlaps"),
        (lambda: _native.reduce("f32", 4, (0, 0x100, 0), 0x108, "sum"), "overlaps"),
        (lambda: _native.copy("f32", 4, (0, 0x100, 0), (0, 0x108, 0)), "overlaps"),
        (lambda: _native.Gate(0, 0, -1.0), "deadline"),
        (lambda: _native.bench.RustCalls([0]), "devices"),
    ]
    for call, words in cases:
        with pytest.raises(gp.InvalidArgumentError, match=words):
            call()
    # The benches' aids are in their own submodule, not among the package's native names.
    aids = {"RustCalls", "read_torch_pair", "copy_call_only", "copy_timed", "trace_start", "trace_finish"}
    assert aids <= set(dir(_native.bench)) and not aids & set(dir(_native)), sorted(dir(_native))


# ---- argument checks: refused by name before native code ------------------------------------


def test_copy_refusals_name_the_argument(native):
    a, b = CudaArray((4, 3), device=0), CudaArray((4, 3), device=1)
    refusals = [
        (lambda: gp.copy_(b, CudaArray((4, 3), device=0, strides=(4, 16))), ValueError, "src: not contiguous"),
        (lambda: gp.copy_(b, CudaArray((3, 4), device=0)), ValueError, "dst: shape"),
        (lambda: gp.copy_(b, CudaArray((4, 3), "<f8", device=0)), TypeError, "dst: dtype float32, but src is float64"),
        (lambda: gp.copy_(b, CudaArray((4, 3), "<c8", device=0)), TypeError, "src: dtype '<c8' is not supported"),
        (lambda: gp.copy_(b, CudaArray((4, 3), ">f4", device=0)), TypeError, "src: dtype"),
        (lambda: gp.copy_(b, [1.0, 2.0]), TypeError, "src: expected a tensor"),
        (lambda: gp.copy_(CudaArray((4, 3), readonly=True), a), ValueError, "dst: read-only"),
        (lambda: gp.copy_(b, a, route="p2p"), ValueError, "route"),
        (lambda: gp.copy_(b, a, chunk_bytes=0), ValueError, "chunk_bytes"),
        (lambda: gp.copy_(b, a, slots=-1), ValueError, "slots"),
        (lambda: gp.copy_(HostArray((4, 3)), HostArray((4, 3))), ValueError, "both CPU"),
        (lambda: gp.copy_(a, CudaArray((4, 3), device=0, ptr=a.ptr + 8)), ValueError, "overlaps"),
        (lambda: gp.copy_(HostArray((4, 3)), a, route="peer"), ValueError, "route"),
        (lambda: ops.staged_copy(HostArray((4, 3)), a), ValueError, "dst: a CPU tensor"),
    ]
    for call, kind, words in refusals:
        with pytest.raises(kind, match=words):
            call()
    assert native.calls == [], "nothing reached native code"


def test_copy_hands_over_addresses_lengths_and_streams(native):
    a, b = CudaArray((4, 3), device=0, stream=0x77), CudaArray((4, 3), device=1)
    assert gp.copy_(b, a) is b
    ops.staged_copy(b, a, chunk_bytes=1 << 20, slots=3)
    host = HostArray((4, 3))
    gp.copy_(host, a)
    gp.copy_(b, host)
    assert native.calls == [
        ("copy", ("f32", 12, (0, a.ptr, 0x77), (1, b.ptr, 0), "auto", None, None)),
        ("copy", ("f32", 12, (0, a.ptr, 0x77), (1, b.ptr, 0), "staged", 1 << 20, 3)),
        ("copy_to_host", ("f32", 12, (0, a.ptr, 0x77), host.__array_interface__["data"][0])),
        ("copy_from_host", ("f32", 12, host.__array_interface__["data"][0], (1, b.ptr, 0))),
    ]


def test_collective_refusals_name_the_argument(native):
    x0, x1 = CudaArray((6,), device=0), CudaArray((6,), device=1)
    refusals = [
        (lambda: gp.all_reduce(x0), TypeError, "tensors: expected a list"),
        (lambda: gp.all_reduce([]), ValueError, "tensors: an empty list"),
        (lambda: gp.all_reduce([x0, CudaArray((6,), device=0)]), ValueError, r"tensors\[1\]: on cuda:0 like tensors\[0\]"),
        (lambda: gp.all_reduce([x0, CudaArray((7,), device=1)]), ValueError, r"tensors\[1\]: shape"),
        (lambda: gp.all_reduce([x0, CudaArray((6,), "<i4", device=1)]), TypeError, r"tensors\[1\]: dtype int32"),
        (lambda: gp.all_reduce([x0, CudaArray((2, 3), device=1, strides=(4, 8))]), ValueError, "not contiguous"),
        (lambda: gp.all_reduce([x0, HostArray((6,))]), ValueError, r"tensors\[1\]: a CPU tensor"),
        (lambda: gp.all_reduce([x0, CudaArray((6,), device=1, readonly=True)]), ValueError, r"tensors\[1\]: read-only"),
        (lambda: gp.all_reduce([x0, x1], op="mean"), ValueError, "op: 'mean' is not one of sum, avg, min, max, prod"),
        # Equal to every choice but not a string: refused, not passed on.
        (lambda: gp.all_reduce([x0, x1], op=unittest.mock.ANY), ValueError, "op: <ANY> is not one of"),
        (lambda: gp.all_reduce([x0, x1], transport="dma"), ValueError, "transport"),
        (lambda: gp.broadcast([x0, x1], root=2), ValueError, "root"),
        (lambda: gp.all_gather([x0, x1], [CudaArray((12,), device=0)]), ValueError, "inputs: 2 tensors for 1"),
        (lambda: gp.all_gather([x0, x1], [CudaArray((11,), device=0), CudaArray((11,), device=1)]), ValueError,
         r"outputs\[0\]: 11 elements, expected 12 \(2 inputs of 6\)"),
        (lambda: gp.all_gather([x0, x1], [CudaArray((12,), device=1), CudaArray((12,), device=0)]), ValueError,
         r"inputs\[0\]: on cuda:0, but outputs\[0\] is on cuda:1"),
        (lambda: gp.all_gather([CudaArray((6,), device=0, ptr=0x10000), x1],
                               [CudaArray((12,), device=0, ptr=0x10000 - 8), CudaArray((12,), device=1)]),
         ValueError, "overlaps"),
        (lambda: gp.reduce_scatter([x0, x1], [CudaArray((4,), device=0), CudaArray((4,), device=1)]), ValueError,
         r"inputs\[0\]: 6 elements, expected 8 \(2 outputs of 4\)"),
    ]
    for call, kind, words in refusals:
        with pytest.raises(kind, match=words):
            call()
    assert native.calls == []


def test_collectives_hand_over_one_rank_per_device(native):
    x = [CudaArray((2, 3), "<u8", device=d) for d in (1, 0)]
    gp.all_reduce(x, op="AVG")
    gp.broadcast(x, root=1, transport="zero-copy")
    outs = [CudaArray((4, 3), "<u8", device=d) for d in (1, 0)]
    gp.all_gather(x, outs)
    gp.reduce_scatter(outs, x, op="max", transport="scratch")
    ranks = [(1, x[0].ptr, 0), (0, x[1].ptr, 0)]
    out_ranks = [(1, outs[0].ptr, 0), (0, outs[1].ptr, 0)]
    assert native.calls == [
        ("all_reduce", ("u64", 6, ranks, "avg", "auto")),
        ("broadcast", ("u64", 6, ranks, 1, "zero-copy")),
        ("all_gather", ("u64", 6, [x[0].ptr, x[1].ptr], out_ranks, "auto")),
        ("reduce_scatter", ("u64", 6, [outs[0].ptr, outs[1].ptr], ranks, "max", "scratch")),
    ]


def test_compressed_all_reduce_checks_and_hands_over(native):
    x = [CudaArray((2, 3), "<f2", device=d) for d in (1, 0)]
    gp.all_reduce(x, op="AVG", compress="FP8", block=128)
    gp.all_reduce(x, compress="int8")
    ranks = [(1, x[0].ptr, 0), (0, x[1].ptr, 0)]
    assert native.calls == [
        ("all_reduce_compressed", ("f16", 6, ranks, "avg", "fp8", 128)),
        ("all_reduce_compressed", ("f16", 6, ranks, "sum", "int8", 64)),
    ]
    ints = [CudaArray((6,), "<i4", device=d) for d in (0, 1)]
    for call, kind, words in [
        (lambda: gp.all_reduce(x, compress="int4"), ValueError, "compress: 'int4' is not one of int8, fp8"),
        (lambda: gp.all_reduce(x, op="max", compress="int8"), ValueError, "op: compress='int8' takes 'sum' or 'avg', not 'max'"),
        (lambda: gp.all_reduce(x, compress="fp8", block=48), ValueError, "block: 48 is not one of 32, 64, 128, 256"),
        (lambda: gp.all_reduce(x, compress="fp8", block=True), ValueError, "block: True"),
        (lambda: gp.all_reduce(ints, compress="int8"), TypeError, "float32, float16 or bfloat16 tensors, not i32"),
        (lambda: gp.all_reduce([x[0], CudaArray((2, 3), "<f2", device=1)], compress="int8"), ValueError, "tensors"),
    ]:
        with pytest.raises(kind, match=words):
            call()
    assert len(native.calls) == 2


def test_ops_check_and_hand_over(native):
    d = CudaArray((8,), "|i1", device=0)
    host = HostArray((8,), "|i1")
    ops.reduce_from_host(d, host, op="avg", divide_by=2)
    ops.copy_to_host(host, d)
    ops.copy_from_host(d, host)
    ops.reduce(d, CudaArray((8,), "|i1", device=0), op="prod")
    assert [c[0] for c in native.calls] == ["reduce", "copy_to_host", "copy_from_host", "reduce"]
    assert native.calls[0][1] == ("i8", 8, (0, d.ptr, 0), host.__array_interface__["data"][0], "avg", 2, True)
    for call, kind, words in [
        (lambda: ops.reduce_from_host(d, host, divide_by=0), ValueError, "divide_by"),
        (lambda: ops.reduce_from_host(host, d), ValueError, "dst: a CPU tensor"),
        (lambda: ops.copy_to_host(d, d), ValueError, "dst: a tensor on cuda:0, expected a pinned CPU tensor"),
        (lambda: ops.reduce(d, CudaArray((8,), "|i1", device=1)), ValueError, "one device"),
        (lambda: ops.reduce(d, CudaArray((8,), "|i1", device=0, ptr=d.ptr + 4)), ValueError, "overlaps"),
    ]:
        with pytest.raises(kind, match=words):
            call()


# ---- the torch path, through a stand-in torch module ----------------------------------------


def test_torch_tensors_use_each_devices_current_stream(torch, native):
    a = torch.Tensor((3, 5), dtype=torch.bfloat16, device="cuda:1")
    b = gp.copy(a, device="cuda:0")
    assert isinstance(b, torch.Tensor) and str(b.device) == "cuda:0" and b.dtype is torch.bfloat16
    assert native.calls == [("copy", ("bf16", 15, (1, a.data_ptr(), 0x5001), (0, b.data_ptr(), 0x5000), "auto", None, None))]
    grads = [torch.Tensor((7,), device="cuda:%d" % d) for d in (0, 1)]
    gp.all_reduce(grads, op="avg")
    assert native.calls[-1] == ("all_reduce", ("f32", 7, [(0, grads[0].data_ptr(), 0x5000), (1, grads[1].data_ptr(), 0x5001)], "avg", "auto"))


def test_torch_refusals(torch, native):
    cuda0 = torch.Tensor((4,), device="cuda:0")
    for call, kind, words in [
        (lambda: gp.copy_(cuda0, torch.Tensor((4,), device="cpu")), ValueError, r"src: a CPU tensor that is not pinned; pass src.pin_memory\(\)"),
        (lambda: gp.copy(torch.Tensor((4,), device="cpu"), device="cuda:0"), ValueError, "pin_memory"),
        (lambda: gp.copy(torch.Tensor((4,), dtype=torch.bool), device="cuda:1"), TypeError, "src: dtype torch.bool is not supported"),
        (lambda: gp.copy(torch.Tensor((4,), dtype=torch.complex64), device="cuda:1"), TypeError, "complex64"),
        (lambda: gp.copy(torch.Tensor((2, 2), strides=(1, 2)), device="cuda:1"), ValueError, r"src: not contiguous.*src.contiguous\(\)"),
        (lambda: gp.copy(torch.Tensor((4,), layout=torch.sparse_coo), device="cuda:1"), TypeError, "strided"),
        (lambda: gp.copy(torch.Tensor((4,), device="meta"), device="cuda:1"), TypeError, "only cuda and cpu"),
        (lambda: gp.copy(cuda0, device="tpu:0"), ValueError, "device"),
        (lambda: gp.all_reduce([cuda0, torch.Tensor((4,), device="cuda:0")]), ValueError, "on cuda:0 like tensors"),
    ]:
        with pytest.raises(kind, match=words):
            call()
    assert native.calls == []


def test_pinned_host_tensors_are_held_until_their_copy_is_done(torch, native):
    _tensors._held.clear()
    host = torch.Tensor((4,), device="cpu", pinned=True)
    out = gp.copy(host, device="cuda:1")
    assert native.calls[-1] == ("copy_from_host", ("f32", 4, host.data_ptr(), (1, out.data_ptr(), 0x5001)))
    back = gp.copy(out, device="cpu")
    assert back._pinned, "a CPU result is allocated pinned"
    assert [o for _, o, _ in _tensors._held] == [host, back]
    assert [e.recorded for e in torch.events] == [0x5001, 0x5001], "recorded on the CUDA side's stream"
    torch.events[1].done = True
    gp.copy_(out, host)
    assert [o for _, o, _ in _tensors._held] == [host, back, host], "let go oldest first: the first is not done"
    torch.events[0].done = True
    torch.events[2].done = True
    gp.copy_(out, host)
    assert [o for _, o, _ in _tensors._held] == [host], "completed copies let go; the new one holds"


def test_host_arrays_of_other_frameworks_are_held_too(torch, native):
    # A pinned array that is not torch's goes back to its owner's allocator as soon as it
    # dies, like a torch tensor's: it is held until the copy is done, whenever torch can
    # record the event.
    _tensors._held.clear()
    arr = HostArray((4,))
    gp.copy_(torch.Tensor((4,), device="cuda:0"), arr)
    assert [o for _, o, _ in _tensors._held] == [arr]


# ---- reading DLPack ---------------------------------------------------------------------------


def test_dlpack_is_read_with_offset_dtype_device_and_strides():
    x = DLPackArray((2, 3), code=4, bits=16, device_id=1, byte_offset=64)
    t = _tensors.describe(x, "x")
    assert (t.device, t.ptr, t.shape, t.dtype, t.stream) == (1, x.data + 64, (2, 3), "bf16", 0)
    assert x.streams_asked == [1], "the producer orders itself before the legacy default stream"
    assert _tensors.describe(DLPackArray((4,), code=1, bits=64, strides=(1,)), "y").dtype == "u64"
    host = _tensors.describe(DLPackArray((4,), code=2, bits=32, device_type=3), "h")
    assert host.device is None and host.pinned is True
    with pytest.raises(ValueError, match="x: not contiguous"):
        _tensors.describe(DLPackArray((2, 3), code=2, bits=32, strides=(1, 2)), "x")
    with pytest.raises(TypeError, match="x: dtype DLPack code 5"):
        _tensors.describe(DLPackArray((2,), code=5, bits=64), "x")
    with pytest.raises(TypeError, match="device type 10"):
        _tensors.describe(DLPackArray((2,), code=2, bits=32, device_type=10), "x")
    with pytest.raises(ValueError, match=r"x: not contiguous \(shape \(2, 3\), strides \(1, 2\) elements\)"):
        _tensors.describe(DLPackArray((2, 3), code=2, bits=32, strides=(1, 2)), "x")
    with pytest.raises(TypeError, match="x: dtype with 4 lanes"):
        _tensors.describe(DLPackArray((2,), code=2, bits=32, lanes=4), "x")


def test_dlpack_capsules_are_read_natively_in_place():
    x = DLPackArray((3, 1, 4), code=2, bits=16, device_type=2, device_id=3, strides=(4, 9, 1), byte_offset=6)
    capsule = x.__dlpack__()
    read = _native.read_dlpack(capsule)
    assert read == (2, 3, x.data + 6, "f16", (2, 16, 1), [3, 1, 4], [4, 9, 1])
    assert _native.read_dlpack(capsule) == read, "not consumed: the capsule keeps its name"
    assert _native.read_dlpack(DLPackArray((5,), code=0, bits=16).__dlpack__())[3:5] == (None, (0, 16, 1))
    assert _native.read_dlpack(DLPackArray((), code=1, bits=8).__dlpack__())[5:] == ([], None)
    for not_a_capsule in (object(), b"dltensor"):
        with pytest.raises(TypeError):
            _native.read_dlpack(not_a_capsule)

    class Consumed(DLPackArray):
        def __dlpack__(self, stream=None):
            new = ctypes.pythonapi.PyCapsule_New
            new.restype = ctypes.py_object
            new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
            return new(ctypes.addressof(self._managed), b"used_dltensor", None)

    with pytest.raises(ValueError):
        _native.read_dlpack(Consumed((2,), code=2, bits=32).__dlpack__())
    corrupt = DLPackArray((2, 3), code=2, bits=32)
    for ndim, why in ((-1, "-1 dimensions"), (5000, "5000 dimensions")):
        corrupt._managed.dl_tensor.ndim = ndim
        with pytest.raises(ValueError, match=why):
            _native.read_dlpack(corrupt.__dlpack__())
    corrupt._managed.dl_tensor.ndim = 2
    corrupt._managed.dl_tensor.shape = None
    with pytest.raises(ValueError, match="2 dimensions but no shape"):
        _native.read_dlpack(corrupt.__dlpack__())
    past = DLPackArray((2,), code=2, bits=32, byte_offset=(1 << 64) - 1)
    with pytest.raises(ValueError, match="past the end of the address space"):
        _native.read_dlpack(past.__dlpack__())
    with pytest.raises(TypeError, match="x: __dlpack__ gave no readable 'dltensor' capsule"):
        _tensors.describe(Consumed((2,), code=2, bits=32), "x")


def test_dlpack_codes_that_another_torch_dtype_shares_are_not_trusted(monkeypatch):
    """The torch fast paths take a plain tensor's dtype from its DLPack code only where no
    other torch dtype is exported with that code: here bool shares uint8's (as torch before
    DLPack's kDLBool did), so a uint8 tensor's dtype is read by identity; complex64 is not
    exported at all, and changes nothing."""
    monkeypatch.setattr(_tensors, "_TORCH_DTYPE_NAMES", {})
    m = types.ModuleType("torch")

    class dtype:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return "torch." + self.name

    codes = {"float32": (2, 32), "uint8": (1, 8), "bool": (1, 8), "int8": (0, 8), "complex64": None}
    for name in codes:
        setattr(m, name, dtype(name))
    m.dtype = dtype
    m.empty = lambda n, dtype, device: dtype if device == "cpu" else None  # made on the CPU, whatever the default
    producers = []

    def to_dlpack(d):
        if codes[d.name] is None:
            raise BufferError("not exported")
        producers.append(DLPackArray((1,), *codes[d.name]))
        return producers[-1].__dlpack__()

    m._C = types.SimpleNamespace(_to_dlpack=to_dlpack)
    export, coded = _tensors._torch_dlpack_export(m)
    assert export is to_dlpack and sorted(coded) == ["f32", "i8"]
    m._C = types.SimpleNamespace()
    assert _tensors._torch_dlpack_export(m) == (None, ())


def test_the_fast_read_takes_a_plain_tensor_from_its_dlpack_export():
    """What the fast paths read of a plain tensor from its DLPack export (a stand-in export
    here, claiming CUDA memory): the device, the address past the byte offset, the shape,
    the dtype from a code no other dtype shares or else by identity, and each device's
    current stream, asked once for two tensors on one device. Anything else is declined
    (None) for the Python layer, which reads it again and names what is wrong."""

    class Plain:
        def __init__(self, array, dtype=None):
            self.array, self.dtype = array, dtype

    streams_asked = []

    def stream(device):
        streams_asked.append(device)
        return 0x700 + device

    f32, i8, int4, int16 = object(), object(), object(), object()
    names = {f32: "f32", i8: "i8", int4: None}  # int16: not learnt yet
    parts = (Plain, "strided", stream, names, lambda t: t.array.__dlpack__(), ("f32",))
    x = Plain(DLPackArray((3, 1, 4), code=2, bits=32, device_id=2, strides=(4, 99, 1), byte_offset=12))
    assert _native.read_torch(x, parts) == (2, x.array.data + 12, (3, 1, 4), "f32", 0x702)
    assert _native.read_torch(Plain(DLPackArray((4,), code=0, bits=8), i8), parts)[3] == "i8", "shared code: by identity"
    declined = {
        "a shared code, another dtype": Plain(DLPackArray((4,), code=0, bits=8), int4),
        "a code no kernel takes, not learnt": Plain(DLPackArray((4,), code=0, bits=16), int16),
        "host memory": Plain(DLPackArray((4,), code=2, bits=32, device_type=1)),
        "pinned host memory": Plain(DLPackArray((4,), code=2, bits=32, device_type=3)),
        "every other element": Plain(DLPackArray((4,), code=2, bits=32, strides=(2,))),
        "empty": Plain(DLPackArray((0,), code=2, bits=32)),
        "no export": Plain(None),
    }
    for why, t in declined.items():
        assert _native.read_torch(t, parts) is None, why

    class Sub(Plain):
        pass

    assert _native.read_torch(Sub(DLPackArray((4,), code=2, bits=32)), parts) is None, "a subclass: by attributes"
    del streams_asked[:]
    dst, src = Plain(DLPackArray((4,), code=2, bits=32, device_id=1)), Plain(DLPackArray((4,), code=2, bits=32, device_id=1))
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        _native.copy_torch(dst, src, "auto", parts)  # both read: the library is reached
    assert streams_asked == [1], "one device's current stream, asked once"


def test_torch_s_own_dlpack_export_is_read_natively():
    torch = _REAL_TORCH
    if torch is None:
        pytest.skip("needs torch (CPU is enough)")
    to_dlpack, coded = _tensors._torch_dlpack_export(torch)
    assert to_dlpack is torch._C._to_dlpack
    assert {"f32", "f64", "f16", "bf16", "i32", "i64"} <= set(coded)
    if hasattr(torch, "int4"):
        assert "i8" not in coded and "u8" not in coded, "int1..int7 and uint1..uint7 share their codes"
    x = torch.arange(12, dtype=torch.bfloat16)[2:].view(2, 5)
    device_type, _, ptr, name, code, shape, strides = _native.read_dlpack(to_dlpack(x))
    assert (device_type, ptr, name, code, shape, strides) == (1, x.data_ptr(), "bf16", (4, 16, 1), [2, 5], [5, 1])


def test_contiguity_ignores_extent_one_and_empty():
    assert _tensors._contiguous((1, 4), (999, 4), 4)
    assert _tensors._contiguous((0, 4), (4, 4), 4)
    assert not _tensors._contiguous((2, 4), (4, 8), 4)


# ---- one process per GPU (geforce_p2p.distributed) -------------------------------------------

needs_shm = pytest.mark.skipif(not pathlib.Path("/dev/shm").is_dir(), reason="needs /dev/shm")


@needs_shm
def test_unique_ids_are_fresh_text():
    from geforce_p2p import distributed as gpd

    a, b = gpd.unique_id(), gpd.unique_id()
    assert a != b and isinstance(a, str)
    assert all(c in "0123456789abcdef" for c in a), a


@needs_shm
def test_a_communicator_without_a_driver_fails_at_once_naming_it():
    import time

    from geforce_p2p import distributed as gpd

    started = time.monotonic()
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        gpd.Communicator(gpd.unique_id(), 0, 2, device="cuda:0", join_timeout=20)
    assert time.monotonic() - started < 5, "the device is opened before waiting for peers"
    with pytest.raises(gp.InvalidArgumentError, match="malformed unique id"):
        gpd.Communicator("not-an-id", 0, 2, device=0)
    with pytest.raises(ValueError, match="device"):
        gpd.Communicator(gpd.unique_id(), 0, 2, device="cpu")
    for name, bad in (("max_bytes", -1), ("slot_bytes", 0), ("slots", -2), ("slots", True), ("slot_bytes", 1.5),
                      ("chunk_blocks", 0)):
        with pytest.raises(ValueError, match="%s: .* is not a positive integer" % name):
            gpd.Communicator(gpd.unique_id(), 0, 2, device=0, **{name: bad})
    for bad in (-1, 1.5, True, "2048"):
        with pytest.raises(ValueError, match="lines_max_bytes: .* is not an integer >= 0"):
            gpd.Communicator(gpd.unique_id(), 0, 2, device=0, lines_max_bytes=bad)
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):  # 0 is taken: no lines at all
        gpd.Communicator(gpd.unique_id(), 0, 2, device=0, lines_max_bytes=0, join_timeout=1)
    with pytest.raises(TypeError, match="compress: expected 'int8', 'fp8'"):
        gpd.Communicator(gpd.unique_id(), 0, 2, device=0, compress=8)
    for bad in ("int4", "int8:48", "fp8:x"):
        with pytest.raises(gp.Error, match="expected int8, fp8 or off|48|not a number"):
            gpd.Communicator(gpd.unique_id(), 0, 2, device=0, compress=bad)
    for good in ("int8", "fp8:128", "off"):  # taken: the device is what fails
        with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
            gpd.Communicator(gpd.unique_id(), 0, 2, device=0, compress=good, join_timeout=1)
    with pytest.raises(TypeError, match="receive: expected 'auto', 'scratch', 'zero-copy'"):
        gpd.Communicator(gpd.unique_id(), 0, 2, device=0, receive=1)
    with pytest.raises(gp.InvalidArgumentError, match="receive: .*dma.*auto, scratch or zero-copy"):
        gpd.Communicator(gpd.unique_id(), 0, 2, device=0, receive="dma")
    for good in ("auto", "scratch", "Zero-Copy"):  # taken: the device is what fails
        with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
            gpd.Communicator(gpd.unique_id(), 0, 2, device=0, receive=good, join_timeout=1)


class _Native:
    """What geforce_p2p.distributed.Communicator calls of its native side, recorded."""

    max_bytes = 64 << 10

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name,) + args)

    def all_reduce_torch(self, tensor, op):
        """The native fast path declines what is not a torch tensor (none is, here)."""
        return False


def _communicator_without_a_gpu():
    from geforce_p2p import distributed as gpd

    comm = gpd.Communicator.__new__(gpd.Communicator)
    comm.rank, comm.world_size, comm.device, comm._native = 0, 2, 0, _Native()
    comm.max_bytes = comm._native.max_bytes
    return comm


def test_communicator_collectives_pass_checked_tensors_to_the_native_calls():
    comm = _communicator_without_a_gpu()
    out, inp = CudaArray((8,)), CudaArray((4,))
    assert comm.all_gather_into_tensor(out, inp) is out
    small, big = CudaArray((3,), typestr="<i4"), CudaArray((6,), typestr="<i4")
    assert comm.reduce_scatter_tensor(small, big, op="max") is small
    t = CudaArray((5,), typestr="<f2")
    assert comm.broadcast(t, src=1) is t
    assert comm.all_reduce(t, op="avg") is t
    sent = CudaArray((7,), typestr="<i4", readonly=True)  # a send only reads
    assert comm.send(sent, 1) is None
    assert comm.recv(t, src=1) is t
    assert comm._native.calls == [
        ("all_gather", "f32", 4, inp.ptr, (0, out.ptr, 0)),
        ("reduce_scatter", "i32", 3, big.ptr, (0, small.ptr, 0), "max"),
        ("broadcast", "f16", 5, (0, t.ptr, 0), 1),
        ("all_reduce", "f16", 5, (0, t.ptr, 0), "avg"),
        ("send", "i32", 7, (0, sent.ptr, 0), 1),
        ("recv", "f16", 5, (0, t.ptr, 0), 1),
    ]


def test_communicator_hands_nccls_in_place_forms_to_the_native_side_as_they_are():
    # The native side tells the in-place form (the part is exactly this rank's part of the
    # whole) from any other overlap, which it refuses; Python passes the addresses through.
    comm = _communicator_without_a_gpu()
    comm.rank = 1
    out = CudaArray((8,))
    comm.all_gather_into_tensor(out, CudaArray((4,), ptr=out.ptr + 16))  # rank 1's part of out
    whole = CudaArray((8,), typestr="<i4")
    comm.reduce_scatter_tensor(CudaArray((4,), typestr="<i4", ptr=whole.ptr + 16), whole, op="min")
    assert comm._native.calls == [
        ("all_gather", "f32", 4, out.ptr + 16, (0, out.ptr, 0)),
        ("reduce_scatter", "i32", 4, whole.ptr, (0, whole.ptr + 16, 0), "min"),
    ]
    with pytest.raises(ValueError, match="read-only"):
        comm.reduce_scatter_tensor(CudaArray((4,), ptr=out.ptr + 16, readonly=True), CudaArray((8,), ptr=out.ptr))


def test_communicator_collectives_refuse_bad_arguments_by_name_before_any_native_call():
    comm = _communicator_without_a_gpu()
    refused = [
        ("output: 6 elements", ValueError,
         lambda: comm.all_gather_into_tensor(CudaArray((6,)), CudaArray((4,)))),
        ("output must hold input / world_size", ValueError,
         lambda: comm.reduce_scatter_tensor(CudaArray((4,)), CudaArray((6,)))),
        ("dtype", TypeError, lambda: comm.all_gather_into_tensor(CudaArray((8,)), CudaArray((4,), typestr="<i4"))),
        ("input: on cuda:1", ValueError, lambda: comm.all_gather_into_tensor(CudaArray((8,)), CudaArray((4,), device=1))),
        ("output: on cuda:1", ValueError, lambda: comm.reduce_scatter_tensor(CudaArray((4,), device=1), CudaArray((8,)))),
        ("read-only", ValueError, lambda: comm.reduce_scatter_tensor(CudaArray((4,), readonly=True), CudaArray((8,)))),
        ("op", ValueError, lambda: comm.reduce_scatter_tensor(CudaArray((4,)), CudaArray((8,)), op="median")),
        ("src", ValueError, lambda: comm.broadcast(CudaArray((4,)), src=2)),
        ("dst: 0 is not another rank", ValueError, lambda: comm.send(CudaArray((4,)), 0)),
        ("dst: 2 is not another rank", ValueError, lambda: comm.send(CudaArray((4,)), 2)),
        ("dst: True is not another rank", ValueError, lambda: comm.send(CudaArray((4,)), True)),
        ("src: '1' is not another rank", ValueError, lambda: comm.recv(CudaArray((4,)), "1")),
        ("read-only", ValueError, lambda: comm.recv(CudaArray((4,), readonly=True), 1)),
        ("tensor: a CPU tensor", ValueError, lambda: comm.broadcast(HostArray((4,)))),
    ]
    for match, error, call in refused:
        with pytest.raises(error, match=match):
            call()
    assert comm._native.calls == [], "nothing reached the native side"


class _CaNative:
    """What CustomAllreduce calls of a communicator's native side, without a GPU: it serves
    the tensors ``serves`` says it does, and records every call."""

    def __init__(self, serves, max_bytes):
        self.serves, self.max_bytes, self.calls = serves, max_bytes, []

    def serves_torch(self, t, max_bytes=None):
        self.calls.append(("serves", t.name, max_bytes))
        return self.serves(t)

    def all_reduce_new_torch(self, t, empty_like=None, max_bytes=None):
        self.calls.append(("all_reduce_new", t.name, max_bytes))
        empty_like = empty_like or sys.modules["torch"].empty_like
        return empty_like(t) if self.serves(t) else None


class _Comm:
    """What CustomAllreduce reads of a communicator, without a GPU."""

    def __init__(self, world_size=2, device=0, max_bytes=64 << 10, serves=lambda t: t.name.startswith("ok")):
        self.world_size, self.device, self.max_bytes, self.calls = world_size, device, max_bytes, []
        self._native = _CaNative(serves, max_bytes)

    def all_gather_into_tensor(self, out, inp):
        self.calls.append(("all_gather", out.shape, inp.name))
        return out

    def reduce_scatter_tensor(self, out, inp):
        self.calls.append(("reduce_scatter", out.shape, inp.name))
        return out

    def close(self):
        self.calls.append("closed")


class _T:
    """A tensor as CustomAllreduce's Python side reads it: a name, a shape, dtype, device."""

    def __init__(self, name, shape, dtype="f16", device="cuda:0"):
        self.name, self.shape, self.dtype, self.device = name, shape, dtype, device

    def numel(self):
        return math.prod(self.shape)


def _fake_torch(monkeypatch):
    """A torch module with the two functions CustomAllreduce calls, recording what it made."""
    made = []
    torch = types.ModuleType("torch")

    def empty_like(t):
        made.append(("empty_like", t.name))
        return _T("out of " + t.name, t.shape, t.dtype, t.device)

    def empty(shape, dtype, device):
        made.append(("empty", shape, dtype, device))
        return _T("new", shape, dtype, device)

    torch.empty_like, torch.empty = empty_like, empty
    monkeypatch.setitem(sys.modules, "torch", torch)
    return made


def test_custom_allreduce_asks_the_native_side_and_never_when_disabled(monkeypatch):
    from geforce_p2p.distributed import CustomAllreduce

    made = _fake_torch(monkeypatch)
    ca = CustomAllreduce(_Comm(max_bytes=4096))
    native = ca.comm._native
    assert not ca.disabled and ca.max_bytes == 4096
    # The two members servers call once or twice a layer are the native calls themselves,
    # which take the communicator's own limit (None here: its default).
    assert ca.should_custom_ar == native.serves_torch and ca.custom_all_reduce == native.all_reduce_new_torch
    assert ca.should_custom_ar(_T("ok", (8, 8))) and not ca.should_custom_ar(_T("refused", (8, 8)))
    assert native.calls == [("serves", "ok", None), ("serves", "refused", None)]
    native.calls.clear()
    out = ca.custom_all_reduce(_T("ok", (8, 8)))
    assert out.name == "out of ok" and made == [("empty_like", "ok")], "a new tensor, made by torch.empty_like"
    assert ca.custom_all_reduce(_T("refused", (3,))) is None
    assert native.calls == [("all_reduce_new", "ok", None), ("all_reduce_new", "refused", None)]
    # The methods they stand over say the same, passing the object's limit.
    native.calls.clear()
    assert CustomAllreduce.should_custom_ar(ca, _T("ok", (8,))) and CustomAllreduce.custom_all_reduce(ca, _T("ok", (8,)))
    assert not CustomAllreduce.should_custom_ar(ca, _T("refused", (8,)))
    assert native.calls == [("serves", "ok", 4096), ("all_reduce_new", "ok", 4096), ("serves", "refused", 4096)]
    with ca.capture():
        assert ca.should_custom_ar(_T("ok", (8,))), "captured calls replay"
    assert not CustomAllreduce(_Comm(world_size=4)).disabled, "four ranks are served"
    for world in (9, 1):
        off = CustomAllreduce(_Comm(world_size=world))
        assert off.disabled, "more than MAX_RANKS are not, nor one rank alone"
        assert not off.should_custom_ar(_T("ok", (8,))) and off.custom_all_reduce(_T("ok", (8,))) is None
        assert off.custom_all_gather(_T("ok", (8,))) is None and off.custom_reduce_scatter(_T("ok", (8,))) is None
        assert off.comm._native.calls == [], "a disabled object asks nothing"
    comm = ca.comm
    ca.close()
    assert comm.calls[-1] == "closed" and ca.comm is None and ca.disabled
    assert not ca.should_custom_ar(_T("ok", (8,))) and ca.custom_all_reduce(_T("ok", (8,))) is None
    ca.close()  # again, as __del__ will: nothing more happens
    assert comm.calls.count("closed") == 1
    off = CustomAllreduce(None)  # what from_group gives where this version cannot serve
    assert off.disabled and not off.should_custom_ar(_T("ok", (8,))) and off.custom_all_reduce(_T("ok", (4,))) is None
    off.close()


def test_custom_all_gather_and_reduce_scatter_work_along_the_first_dimension_or_say_none(monkeypatch):
    from geforce_p2p.distributed import CustomAllreduce

    made = _fake_torch(monkeypatch)
    ca = CustomAllreduce(_Comm(world_size=4))
    out = ca.custom_all_gather(_T("ok", (3, 8), dtype="bf16"))
    assert out.shape == (12, 8) and made == [("empty", (12, 8), "bf16", "cuda:0")]
    out = ca.custom_reduce_scatter(_T("ok", (8, 5)))
    assert out.shape == (2, 5)
    assert ca.comm.calls == [("all_gather", (12, 8), "ok"), ("reduce_scatter", (2, 5), "ok")]
    assert ca.custom_reduce_scatter(_T("ok", (6, 5))) is None, "4 ranks do not divide 6 rows"
    assert ca.custom_reduce_scatter(_T("ok", ())) is None and ca.custom_all_gather(_T("ok", ())) is None, "0-d"
    assert ca.custom_all_gather(_T("refused", (4,))) is None and ca.custom_reduce_scatter(_T("refused", (4,))) is None
    assert len(ca.comm.calls) == 2 and len(made) == 2, "nothing made or enqueued for what is refused"


def test_a_read_tensor_on_another_stream_of_its_device_is_refused(native):
    # The op runs on the written tensor's stream: an input ordered on another stream of the
    # same device would be read before its producer is done, and could be freed under it.
    src = CudaArray((8,), device=0, stream=0x11)
    with pytest.raises(ValueError, match="src: ordered on stream 0x11, but dst on stream 0x22"):
        ops.reduce(CudaArray((8,), device=0, stream=0x22), src)
    ins = [CudaArray((4,), device=d, stream=0x30 + d) for d in (0, 1)]
    outs = [CudaArray((8,), device=d, stream=0x40 + d) for d in (0, 1)]
    with pytest.raises(ValueError, match=r"inputs\[0\]: ordered on stream 0x30"):
        gp.all_gather(ins, outs)
    assert native.calls == [], "refused before the library"


def test_torch_fast_paths_take_only_plain_cuda_tensors(monkeypatch):
    """The native fast paths read torch tensors themselves: with tensors that only say they
    are on CUDA (no driver here), the plain case reaches the library (and its no-driver
    error), everything else falls back (False) for the Python layer to refuse by name, and an
    exception that is not an Exception (Ctrl-C) is raised, not swallowed."""
    torch = _REAL_TORCH
    if torch is None:
        pytest.skip("needs torch (CPU is enough)")
    monkeypatch.setitem(sys.modules, "torch", torch)

    class Pretend(torch.Tensor):
        @property
        def is_cuda(self):
            return True

        def get_device(self):
            return self._dev

        def data_ptr(self):
            return getattr(self, "_dev_ptr", 0x10000 * (self._dev + 1))

    class Interrupted(Pretend):
        def get_device(self):
            raise KeyboardInterrupt

    class Failing(Pretend):
        def get_device(self):
            raise RuntimeError("boom")

    def on(dev, n=4, dtype=torch.float32, kind=Pretend):
        t = torch.zeros(n, dtype=dtype).as_subclass(kind)
        t._dev = dev
        return t

    monkeypatch.setitem(_tensors._TORCH_DTYPE_NAMES, torch.float32, "f32")
    monkeypatch.setitem(_tensors._TORCH_DTYPE_NAMES, torch.bool, None)
    args = list(_tensors.torch_fast_parts(torch))
    args[2] = lambda device: 0  # every device's current stream: the legacy default one
    args = tuple(args)
    fast = lambda xs: _native.all_reduce_torch(xs, "sum", "auto", args)  # noqa: E731
    for xs in ([on(0), on(1)], (on(0), on(1))):
        with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
            fast(xs)
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        _native.copy_torch(on(1), on(0), "auto", args)
    fall_back = {
        "cpu": [torch.zeros(4), torch.zeros(4)],
        "one device": [on(0), on(0)],
        "shapes": [on(0), on(1, 5)],
        "dtypes": [on(0), on(1, dtype=torch.float64)],
        "not learnt": [on(0, dtype=torch.int16), on(1, dtype=torch.int16)],
        "not taken": [on(0, dtype=torch.bool), on(1, dtype=torch.bool)],
        "empty": [on(0, 0), on(1, 0)],
        "alone": [on(0)],
        "strided": [on(0, 8)[::2], on(1)],
        "sparse": [torch.zeros(4).to_sparse(), torch.zeros(4).to_sparse()],
        "not a list": on(0),
        "raises": [on(0, kind=Failing), on(1)],
    }
    for name, xs in fall_back.items():
        assert fast(xs) is False, name
    overlapping = _native.copy_torch(on(0), on(0), "auto", args)
    assert overlapping is False, "overlapping on one device: the Python layer refuses"
    apart = on(0)
    apart._dev_ptr = 0x80000
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        _native.copy_torch(apart, on(0), "auto", args)  # one device, apart: the library's
    for route in ("sideways", 3, None):
        assert _native.copy_torch(on(1), on(0), route, args) is False, route
    for op, transport in (("mean", "auto"), ("sum", "zero_copy"), (None, "auto")):
        assert _native.all_reduce_torch([on(0), on(1)], op, transport, args) is False, (op, transport)
    with pytest.raises(KeyboardInterrupt):
        fast([on(0, kind=Interrupted), on(1)])


def test_torch_fast_paths_find_torch_themselves(monkeypatch, torch):
    """Without parts given, the fast paths find torch in sys.modules: none there, or a torch
    without a raw-stream getter (the fake one), and they decline, for the Python layer."""
    monkeypatch.delitem(sys.modules, "torch")
    assert _native.copy_torch(object(), object(), "auto") is False
    assert _native.all_reduce_torch([object(), object()], "sum", "auto") is False
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert _tensors.torch_fast_parts(torch) is None
    assert _native.copy_torch(object(), object(), "auto") is False
    assert _native.all_reduce_torch([object(), object()], "sum", "auto") is False


def _torch_with_a_stream_getter():
    """A stand-in torch module with what the fast paths read: tensors that say they are
    contiguous, strided and on CUDA, dtypes compared by identity, a raw-stream getter."""
    torch = types.ModuleType("torch")
    torch.strided = object()
    torch.float32 = type("dtype", (), {"__str__": lambda self: "torch.float32"})()

    class Tensor:
        layout, is_cuda, dtype = torch.strided, True, torch.float32

        def __init__(self, device, ptr, n=4):
            self.device_index, self.ptr, self.shape = device, ptr, (n,)

        def is_contiguous(self):
            return True

        def numel(self):
            return self.shape[0]

        def get_device(self):
            return self.device_index

        def data_ptr(self):
            return self.ptr

    torch.Tensor = Tensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0)
    return torch


def test_torch_fast_paths_keep_torch_parts_and_dtypes_per_module(monkeypatch, torch):
    """Without parts given, the fast paths take a torch with a raw-stream getter and read
    its plain tensors up to the library (no driver here); what they learnt of its dtypes
    stays while the module does; another torch module is looked at afresh. A list or str
    subclass and a range past the address space are declined, for the Python layer."""
    fake = _torch_with_a_stream_getter()
    T = fake.Tensor
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(_tensors._TORCH_DTYPE_NAMES, fake.float32, "f32")
    no_driver = lambda: pytest.raises(gp.UnavailableError, match="no NVIDIA")  # noqa: E731
    with no_driver():
        _native.copy_torch(T(1, 0x10000), T(0, 0x20000), "auto")
    with no_driver():
        _native.all_reduce_torch([T(0, 0x10000), T(1, 0x20000)], "sum", "auto")

    class Items(list):
        def __iter__(self):  # what the Python layer reads: both on cuda:0
            return iter([self[0], self[0]])

    class Name(str):
        def lower(self):
            return "sideways"

    assert _native.all_reduce_torch(Items([T(0, 0x10000), T(1, 0x20000)]), "sum", "auto") is False
    assert _native.all_reduce_torch((T(0, 0x10000), T(1, 0x20000)), Name("sum"), "auto") is False
    assert _native.copy_torch(T(1, 0x10000), T(0, 0x20000), Name("auto")) is False
    assert _native.copy_torch(T(1, 0x10000), T(0, (1 << 64) - 16), "auto") is False, "past the address space"
    monkeypatch.delitem(_tensors._TORCH_DTYPE_NAMES, fake.float32)
    with no_driver():
        _native.copy_torch(T(1, 0x10000), T(0, 0x20000), "auto")  # float32 was learnt
    monkeypatch.setitem(sys.modules, "torch", torch)  # no raw-stream getter
    assert _native.copy_torch(T(1, 0x10000), T(0, 0x20000), "auto") is False
    monkeypatch.setitem(sys.modules, "torch", _torch_with_a_stream_getter())  # float32 not learnt
    assert _native.copy_torch(T(1, 0x10000), T(0, 0x20000), "auto") is False


# ---- the kernels door: names, a device that does not exist, torch.compile's switch ---------


def test_a_device_that_does_not_exist_is_refused_by_name_before_anything(torch, native, monkeypatch):
    monkeypatch.setattr(_api, "_visible_devices", None)
    monkeypatch.setattr(_api, "_device_count", lambda: 1)
    src = torch.Tensor((4,), device="cuda:0")
    for device in ("cuda:8", 8, "cuda:1"):
        with pytest.raises(ValueError, match=r"^device: cuda:\d does not exist; this process sees 1 CUDA device \(cuda:0\)$"):
            gp.copy(src, device=device)
    with pytest.raises(ValueError, match="device: cuda:3 does not exist"):
        gp.release_cached_host_memory("cuda:3")
    assert native.calls == [], "refused before any native call"
    monkeypatch.setattr(_api, "_visible_devices", None)
    monkeypatch.setattr(_api, "_device_count", lambda: 3)
    with pytest.raises(ValueError, match=r"sees 3 CUDA devices \(cuda:0\.\.cuda:2\)"):
        gp.copy(src, device=3)


def test_the_ops_carry_the_names_kernels_users_are_given():
    for name in ("staged_copy", "reduce_from_host", "copy_to_host", "copy_from_host"):
        assert getattr(gp.ops, "geforce_p2p_" + name) is getattr(gp.ops, name)
        assert "geforce_p2p_" + name in gp.ops.__all__
    assert _native.package_name() == "geforce_p2p"
    assert gp.distributed.__name__ == "geforce_p2p.distributed"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        gp.nothing  # noqa: B018


def test_probe_measure_is_a_bool_and_needs_a_driver():
    with pytest.raises(TypeError, match="measure: expected True or False"):
        gp.probe(measure="yes")
    with pytest.raises(gp.UnavailableError, match="no NVIDIA"):
        gp.probe(measure=True)


def test_a_torch_without_custom_ops_leaves_every_call_eager(torch, native):
    from geforce_p2p import _compile

    # The stand-in torch has no torch.library: it is judged once and nothing is registered,
    # and the calls run as they did (a real torch imported later is judged afresh).
    assert not _compile.tracing() and _compile.ops is None
    assert not _compile.register() and _compile._judged is torch
    gp.ops.staged_copy(torch.Tensor((4,), device="cuda:1"), torch.Tensor((4,), device="cuda:0"))
    assert native.calls and native.calls[-1][0] == "copy"


def test_custom_allreduce_is_built_as_the_servers_build_theirs_and_never_raises(monkeypatch):
    """vLLM: CustomAllreduce(group=, device=, symm_mem_enabled=, register_graph_buffers=);
    sglang: CAClass(group=, device=). Without a driver the join fails on this rank, every rank
    agrees, and the object is disabled: the server keeps its own path."""
    import gc

    from geforce_p2p.distributed import CustomAllreduce

    calls = []

    def fake_dist(world):
        dist = types.ModuleType("torch.distributed")
        dist.get_rank = lambda group=None: 0
        dist.get_world_size = lambda group=None: world
        dist.get_global_rank = lambda group, rank: rank
        dist.broadcast_object_list = lambda box, src=0, group=None: calls.append(("broadcast", box[0][:4]))
        dist.all_gather_object = lambda out, obj, group=None: out.__setitem__(slice(None), [obj] * len(out))
        return dist

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist(2))
    ca = CustomAllreduce(group="tp-cpu-group", device=0, symm_mem_enabled=False, register_graph_buffers=True)
    assert ca.disabled and ca.comm is None, "no driver: disabled, not raised"
    assert calls and calls[0][0] == "broadcast", "rank 0 made an id and broadcast it"
    assert ca.should_custom_ar(CudaArray((1024,))) is False and ca.custom_all_reduce(CudaArray((4,))) is None
    assert ca.fully_connected is False and ca.mnnvl_lamport_ag_multicast_ptr == 0
    assert ca.custom_all_gather(CudaArray((1024,))) is None and ca.custom_reduce_scatter(CudaArray((1024,))) is None
    calls.clear()
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist(4))
    assert CustomAllreduce(group="tp-cpu-group", device=0).disabled, "no driver"
    assert [c[0] for c in calls] == ["broadcast"], "four ranks are served: an id is made and handed out"
    calls.clear()
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist(9))
    assert CustomAllreduce(group="tp-cpu-group", device=0).disabled
    assert calls == [], "nine ranks: more than a communicator takes, so no id is made"
    # Servers drop it without close(): the communicator is released then, once.
    _fake_torch(monkeypatch)
    comm = _Comm()
    ca = CustomAllreduce(comm)
    assert not ca.disabled
    del ca
    gc.collect()
    assert comm.calls == ["closed"]


def _fake_dist(monkeypatch, rank, joined):
    """torch and torch.distributed as Communicator.from_group calls them, for rank `rank` of a
    group whose ranks report `joined` (this rank's own entry is what it reports itself)."""
    calls = []
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(current_device=lambda: 3)
    dist = types.ModuleType("torch.distributed")
    dist.group = types.SimpleNamespace(WORLD="world")
    dist.get_rank = lambda group: rank
    dist.get_world_size = lambda group: len(joined)
    dist.get_global_rank = lambda group, r: 10 + r

    def broadcast_object_list(box, src, group):
        calls.append(("broadcast", box[0] is not None, src, group))
        box[0] = box[0] if box[0] is not None else "id-from-rank-0"

    def all_gather_object(out, mine, group):
        calls.append(("all_gather", mine, group))
        out[:] = [mine if r == rank else ok for r, ok in enumerate(joined)]

    dist.broadcast_object_list, dist.all_gather_object = broadcast_object_list, all_gather_object
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return calls


def test_communicator_from_group_hands_the_id_over_and_every_rank_raises_where_one_failed(monkeypatch):
    from geforce_p2p import distributed as gpd

    made = []

    class Recorded(gpd.Communicator):
        def __init__(self, uid, rank, world, device, **options):
            made.append((uid, rank, world, device, options))
            if options.get("fail"):
                raise ValueError("slot_bytes: bad")

        def close(self):
            made.append("closed")

    calls = _fake_dist(monkeypatch, 1, [True, True, True])
    comm = Recorded.from_group(peer_timeout=9.0)
    assert isinstance(comm, Recorded)
    assert made == [("id-from-rank-0", 1, 3, 3, {"peer_timeout": 9.0})], "rank 0's id, torch's current device"
    assert calls == [("broadcast", False, 10, "world"), ("all_gather", True, "world")], "from the group's first rank"
    # Another rank failed: this one joined, closes its communicator and raises too.
    made.clear()
    _fake_dist(monkeypatch, 1, [True, True, False])
    with pytest.raises(RuntimeError, match=r"rank\(s\) 2 of the group's 3 failed to join$"):
        Recorded.from_group("g", device=0)
    assert made[-1] == "closed"
    # This rank failed: the message carries its own error, chained.
    _fake_dist(monkeypatch, 0, [True, True])
    with pytest.raises(RuntimeError, match="rank\\(s\\) 0 of the group's 2 failed to join: this rank's error: slot_bytes") as raised:
        Recorded.from_group("g", device=0, fail=True)
    assert isinstance(raised.value.__cause__, ValueError)
    # What the servers' object builds on: a failed join disables it on every rank, no raise.
    monkeypatch.setattr(gpd, "Communicator", Recorded)
    made.clear()
    _fake_dist(monkeypatch, 1, [False, True])
    assert gpd._join("g", 0, {}) is None and made[-1] == "closed"
    assert made[0][4] == {"slot_bytes": 64 << 10, "slots": 2}, "the servers' small slots"


def test_every_python_file_of_the_repository_compiles():
    # The scripts that only GPU runs start (ranks, benches, probes) are compiled here, so a
    # syntax error in one fails CI rather than a device run.
    files = [p for top in ("tests", "benches", "crates", "xtask") for p in (REPO / top).rglob("*.py")
             if "target" not in p.parts and ".venv" not in p.parts]
    assert len(files) > 20, files
    broken = []
    for path in files:
        try:
            compile(path.read_text(), str(path), "exec")
        except SyntaxError as e:
            broken.append("%s:%s: %s" % (path.relative_to(REPO), e.lineno, e.msg))
    assert not broken, "\n".join(broken)
