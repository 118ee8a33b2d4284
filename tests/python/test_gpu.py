"""GPU tests of the geforce_p2p package against torch: every op and dtype at odd lengths,
fresh random data, poisoned outputs, every element checked against a CPU reference (numpy),
on torch's current streams with torch kernels queued before and after and no
synchronisation between, and the refusals (nothing written, no CUDA error left behind).

Skipped as a whole without torch or CUDA. Collectives across devices need two visible
devices (the first two are used); with one device, a single rank must be a no-op and two
tensors on one device must be refused.

    python3 -m pytest -q tests/python/test_gpu.py
"""

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import geforce_p2p as gp  # noqa: E402

NDEV = torch.cuda.device_count()
two_devices = pytest.mark.skipif(NDEV < 2, reason="needs two CUDA devices")
one_device = pytest.mark.skipif(NDEV != 1, reason="checks the one-device behaviour")

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64"]
OPS = ["sum", "avg", "min", "max", "prod"]
FLOATS = {"float32", "float64", "float16", "bfloat16"}
# Odd lengths: one element, a few, around the kernels' vector width, the staged copy's
# one-chunk limit (1 MiB) passed for every dtype, and the collectives' exchange/ring switch.
COPY_LENGTHS = [1, 7, 4099, (1 << 20) + 3]
COLLECTIVE_LENGTHS = [1, 7, 4097, (1 << 19) + 3, (1 << 21) + 5]
SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
NUMPY_UNSIGNED = {"uint32": np.uint32, "uint64": np.uint64}


def dt(name):
    return getattr(torch, name)


def cuda(d):
    return torch.device("cuda", d)


def random(n, name, device):
    """Fresh random data of dtype `name`: normal floats; small integers, so that sums and
    products of two ranks stay meaningful (they wrap like C where they overflow)."""
    if name in FLOATS:
        return torch.randn(n, device=device).to(dt(name))
    if name == "uint32":
        return torch.randint(0, 16, (n,), device=device, dtype=torch.int32).view(torch.uint32)
    if name == "uint64":
        return torch.randint(0, 16, (n,), device=device, dtype=torch.int64).view(torch.uint64)
    low = 0 if name == "uint8" else -8
    return torch.randint(low, 16, (n,), device=device, dtype=torch.int64).to(dt(name))


def empty(n, name, device, pinned=False):
    """A poisoned output: every byte 0xA5, so an element left unwritten shows."""
    t = torch.empty(n, dtype=dt(name), device=device, pin_memory=pinned)
    t.view(torch.uint8).fill_(0xA5)
    return t


def bits(t):
    """The elements' bit patterns on the host, as signed integers of the same size."""
    return t.detach().cpu().view(SIGNED[t.element_size()]).numpy()


def values(t):
    """The elements on the host as numpy: float64 for floats, the integer type otherwise."""
    name = str(t.dtype).replace("torch.", "")
    if name in FLOATS:
        return t.detach().cpu().to(torch.float64).numpy()
    if name in NUMPY_UNSIGNED:
        return bits(t).view(NUMPY_UNSIGNED[name])
    return t.detach().cpu().numpy()


def to_torch(array, name):
    """numpy values back into a CPU tensor of dtype `name` (floats rounded via float32,
    as the kernels accumulate half types in float32)."""
    if name in FLOATS:
        t = torch.from_numpy(np.asarray(array, dtype=np.float64))
        return t if name == "float64" else t.to(torch.float32).to(dt(name))
    if name in NUMPY_UNSIGNED:
        signed = np.int64 if name == "uint64" else np.int32
        unsigned = np.ascontiguousarray(np.asarray(array, dtype=NUMPY_UNSIGNED[name]))
        return torch.from_numpy(unsigned.view(signed)).view(dt(name))
    return torch.from_numpy(np.asarray(array)).to(dt(name))


def reduce_ref(op, arrays, name):
    """`op` over the ranks' arrays, folded left to right, as the kernels do."""
    acc = arrays[0]
    n = len(arrays)
    with np.errstate(over="ignore", invalid="ignore"):
        for a in arrays[1:]:
            if op in ("sum", "avg"):
                acc = acc + a
            elif op == "prod":
                acc = acc * a
            elif op == "min":
                acc = np.fmin(acc, a) if name in FLOATS else np.minimum(acc, a)
            else:
                acc = np.fmax(acc, a) if name in FLOATS else np.maximum(acc, a)
        if op == "avg":
            if name in FLOATS:
                acc = acc / n
            elif name.startswith("u"):
                acc = acc // acc.dtype.type(n)
            else:
                wide = acc.astype(np.int64)
                acc = np.where(wide < 0, -((-wide) // n), wide // n).astype(acc.dtype)
    return to_torch(acc, name)


def assert_matches(out, ref, name, op="sum"):
    if op == "avg" and name in FLOATS:
        tol = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}[name]
        torch.testing.assert_close(out.cpu().to(torch.float64), ref.to(torch.float64), rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(bits(out), bits(ref))


def no_cuda_error():
    for d in range(NDEV):
        torch.cuda.synchronize(d)


# ---- copies -----------------------------------------------------------------------------


def pairs():
    yield (0, 0)
    if NDEV >= 2:
        yield (0, 1)
        yield (1, 0)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("n", COPY_LENGTHS)
@pytest.mark.parametrize("src_dev,dst_dev", list(pairs()))
@pytest.mark.parametrize("route", ["auto", "staged"])
def test_copy_between_devices(name, n, src_dev, dst_dev, route):
    torch.manual_seed(n)
    a = random(n, name, cuda(src_dev))
    expected = a.cpu()
    b = gp.copy(a, device="cuda:%d" % dst_dev, route=route)
    assert b.device == cuda(dst_dev) and b.dtype == a.dtype and b.shape == a.shape
    assert_matches(b, expected, name)
    into = empty(n, name, cuda(dst_dev))
    assert gp.copy_(into, a, route=route) is into
    assert_matches(into, expected, name)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("n", COPY_LENGTHS)
def test_staged_copy_and_host_copies(name, n):
    torch.manual_seed(n + 1)
    dst_dev = 1 if NDEV >= 2 else 0
    a = random(n, name, cuda(0))
    expected = a.cpu()
    out = empty(n, name, cuda(dst_dev))
    gp.ops.staged_copy(out, a, chunk_bytes=64 << 10, slots=3)
    assert_matches(out, expected, name)
    host = empty(n, name, "cpu", pinned=True)
    gp.ops.copy_to_host(host, a)
    torch.cuda.current_stream(0).synchronize()  # a CPU read waits, as with non_blocking=True
    assert_matches(host, expected, name)
    back = empty(n, name, cuda(dst_dev))
    gp.ops.copy_from_host(back, host)
    assert_matches(back, expected, name)
    # gp.copy to and from the CPU: pinned output, allocated by torch.
    cpu = gp.copy(a, device="cpu")
    assert cpu.is_pinned()
    torch.cuda.current_stream(0).synchronize()
    assert_matches(cpu, expected, name)
    assert_matches(gp.copy(cpu, device=cuda(dst_dev)), expected, name)


def test_two_dimensional_tensors_keep_their_shape():
    a = torch.randn(33, 17, device="cuda:0")
    b = gp.copy(a, device="cuda:%d" % (NDEV - 1))
    assert b.shape == (33, 17)
    assert torch.equal(b.cpu(), a.cpu())


def test_empty_tensors_copy_and_reduce():
    a = torch.empty(0, device="cuda:0")
    assert gp.copy(a, device="cuda:%d" % (NDEV - 1)).numel() == 0
    gp.all_reduce([torch.empty(0, device=cuda(d)) for d in range(min(NDEV, 2))])
    no_cuda_error()


# ---- the reduce primitives --------------------------------------------------------------


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 7, 4099, (1 << 20) + 3])
def test_reduce_from_host_and_reduce(name, op, n):
    torch.manual_seed(n + 2)
    dst = random(n, name, cuda(0))
    src = random(n, name, cuda(0))
    host = src.cpu().pin_memory()
    divide_by = 2 if op == "avg" else 1
    ref = reduce_ref(op, [values(dst), values(src)], name)
    d1, d2 = dst.clone(), dst.clone()
    gp.ops.reduce_from_host(d1, host, op=op, divide_by=divide_by)
    assert_matches(d1, ref, name, op)
    gp.ops.reduce(d2, src, op=op, divide_by=divide_by)
    assert_matches(d2, ref, name, op)


# ---- collectives --------------------------------------------------------------------------


def ranks_of(k):
    """Device ordinals of k ranks, in rank order: 0, 1 (and reversed, to check rank order
    is the list's, not the devices')."""
    return [[0, 1], [1, 0]] if k == 2 else [[0]]


@two_devices
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", COLLECTIVE_LENGTHS)
def test_all_reduce_two_devices(name, op, n):
    torch.manual_seed(n + 3)
    for devices in ranks_of(2):
        xs = [random(n, name, cuda(d)) for d in devices]
        ref = reduce_ref(op, [values(x) for x in xs], name)
        gp.all_reduce(xs, op=op)
        for x in xs:
            assert_matches(x, ref, name, op)


@two_devices
@pytest.mark.parametrize("transport", ["scratch", "zero-copy", "auto"])
@pytest.mark.parametrize("name", ["float32", "bfloat16", "int64"])
def test_all_reduce_each_receive_path(transport, name):
    n = (1 << 21) + 5
    xs = [random(n, name, cuda(d)) for d in (0, 1)]
    ref = reduce_ref("sum", [values(x) for x in xs], name)
    gp.all_reduce(xs, op="sum", transport=transport)
    for x in xs:
        assert_matches(x, ref, name)


@two_devices
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("n", COLLECTIVE_LENGTHS)
def test_all_gather_broadcast_two_devices(name, n):
    torch.manual_seed(n + 4)
    for devices in ranks_of(2):
        ins = [random(n, name, cuda(d)) for d in devices]
        outs = [empty(2 * n, name, cuda(d)) for d in devices]
        gp.all_gather(ins, outs)
        ref = torch.cat([i.cpu() for i in ins])
        for o in outs:
            assert_matches(o, ref, name)
        for root in (0, 1):
            ts = [random(n, name, cuda(d)) for d in devices]
            expected = ts[root].cpu()
            gp.broadcast(ts, root=root)
            for t in ts:
                assert_matches(t, expected, name)


@two_devices
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 7, 4097, (1 << 20) + 5])
def test_reduce_scatter_two_devices(name, op, n):
    torch.manual_seed(n + 5)
    for devices in ranks_of(2):
        ins = [random(2 * n, name, cuda(d)) for d in devices]
        kept = [i.cpu() for i in ins]
        outs = [empty(n, name, cuda(d)) for d in devices]
        gp.reduce_scatter(ins, outs, op=op)
        for r, o in enumerate(outs):
            part = [values(k[r * n:(r + 1) * n]) for k in kept]
            assert_matches(o, reduce_ref(op, part, name), name, op)
        for i, k in zip(ins, kept):
            assert_matches(i, k, name)  # inputs unchanged


@pytest.mark.parametrize("name", ["float32", "int8", "bfloat16"])
def test_a_single_rank_is_a_no_op(name):
    x = random(1001, name, cuda(0))
    before = x.cpu()
    for op in OPS:
        gp.all_reduce([x], op=op)
    gp.broadcast([x], root=0)
    assert_matches(x, before, name)
    out = empty(1001, name, cuda(0))
    gp.all_gather([x], [out])  # one rank: its own input is the whole output
    assert_matches(out, before, name)


@two_devices
def test_all_reduce_of_torch_tensors_takes_the_native_fast_path(monkeypatch):
    """The usual case (contiguous CUDA tensors, one dtype and shape, one per device, on
    their current streams) is read by the native call itself; the general path is not
    reached. Anything else falls back and is refused by name as before."""
    from geforce_p2p import _api

    warm = [random(5, "int32", cuda(d)) for d in (0, 1)]
    gp.all_reduce(warm)  # a first call finds torch's parts and learns every dtype's name
    reached = []
    general = _api._native.all_reduce
    monkeypatch.setattr(_api._native, "all_reduce", lambda *a: reached.append(a) or general(*a))
    side = [torch.cuda.Stream(device=d) for d in (0, 1)]
    for n in (1, 4099):
        xs = [random(n, "int32", cuda(d)) for d in (0, 1)]
        want = values(xs[0]) * 2 + values(xs[1])
        with torch.cuda.stream(side[0]), torch.cuda.stream(side[1]):
            # Torch work on the current (side) streams: the doubling queued before must be
            # in the sum, the increment queued after must see it (exact in int32).
            spin(0, 20)
            xs[0].mul_(2)
            gp.all_reduce(tuple(xs), op="sum")
            xs[1].add_(1)
        for d in (0, 1):
            side[d].synchronize()
        assert np.array_equal(values(xs[0]), want), n
        assert np.array_equal(values(xs[1]), want + 1), n
    assert reached == [], "the general path was taken for plain torch tensors"
    odd = [random(6, "float32", cuda(0)).view(2, 3).t(), random(6, "float32", cuda(1)).view(3, 2)]
    with pytest.raises(ValueError, match=r"tensors\[0\]: not contiguous"):
        gp.all_reduce(odd)
    with pytest.raises(TypeError, match=r"tensors\[1\]: dtype"):
        gp.all_reduce([random(6, "float32", cuda(0)), random(6, "int32", cuda(1))])
    with pytest.raises(ValueError, match=r"tensors\[1\]: shape"):
        gp.all_reduce([random(6, "float32", cuda(0)), random(7, "float32", cuda(1))])
    assert len(reached) == 0, "refused before the native call"
    no_cuda_error()


@two_devices
def test_copy_of_torch_tensors_takes_the_native_fast_path(monkeypatch):
    """copy_ between two devices' plain torch tensors is read by the native call itself,
    ordered on both current streams; other cases fall back and are refused as before."""
    from geforce_p2p import _api

    gp.copy_(torch.empty(3, device="cuda:1", dtype=torch.int32), torch.ones(3, device="cuda:0", dtype=torch.int32))
    reached = []
    general = _api._native.copy
    monkeypatch.setattr(_api._native, "copy", lambda *a: reached.append(a) or general(*a))
    side = [torch.cuda.Stream(device=d) for d in (0, 1)]
    for n in (1, (1 << 20) + 3):
        for route in ("auto", "staged"):
            src = random(n, "int32", cuda(0))
            want = values(src) * 2 + 1
            dst = empty(n, "int32", cuda(1))
            torch.cuda.synchronize(1)  # its poison written before the side stream uses it
            with torch.cuda.stream(side[0]), torch.cuda.stream(side[1]):
                spin(0, 20)
                src.mul_(2)  # queued on the source's current stream before the copy
                assert gp.copy_(dst, src, route=route) is dst
                dst.add_(1)  # queued on the destination's after it
            for d in (0, 1):
                side[d].synchronize()
            assert np.array_equal(values(dst), want), route
    assert reached == [], "the general path was taken for plain torch tensors"
    with pytest.raises(ValueError, match="dst: shape"):
        gp.copy_(torch.empty(4, device="cuda:1"), torch.ones(3, device="cuda:0"))
    with pytest.raises(TypeError, match="dst: dtype"):
        gp.copy_(torch.empty(3, device="cuda:1", dtype=torch.int32), torch.ones(3, device="cuda:0"))
    assert reached == [], "refused before the native call"
    no_cuda_error()


def test_copy_on_one_device_takes_the_native_fast_path_and_overlap_is_refused(monkeypatch):
    """copy_ between two plain torch tensors of one device is read by the native call too,
    in stream order; overlapping ones fall back and are refused by name, nothing written."""
    from geforce_p2p import _api

    reached = []
    general = _api._native.copy
    monkeypatch.setattr(_api._native, "copy", lambda *a: reached.append(a) or general(*a))
    for n in (1, (1 << 20) + 3):
        for route in ("auto", "staged"):
            src = random(n, "int32", cuda(0))
            want = values(src) * 2 + 1
            dst = empty(n, "int32", cuda(0))
            spin(0, 20)
            src.mul_(2)  # queued on the current stream before the copy
            assert gp.copy_(dst, src, route=route) is dst
            dst.add_(1)  # and after it
            assert np.array_equal(values(dst), want), (n, route)
    assert reached == [], "the general path was taken for plain torch tensors"
    whole = torch.arange(16, dtype=torch.float32, device="cuda:0")
    for dst, src in ((whole[4:12], whole[0:8]), (whole[0:8], whole[0:8]), (whole[0:8], whole[7:15])):
        with pytest.raises(ValueError, match="dst: overlaps src in memory"):
            gp.copy_(dst, src)
    assert torch.equal(whole.cpu(), torch.arange(16, dtype=torch.float32)), "nothing written"
    assert reached == [], "refused before the native call"
    no_cuda_error()


def test_the_fast_read_takes_every_dtype_view_and_subclass_as_torch_has_them(monkeypatch):
    """The native fast path reads a plain tensor through torch's DLPack export and a subclass
    (a Parameter) attribute by attribute: each gives the address, offset, shape and dtype
    torch has, for every kernel dtype (int8 and uint8, whose DLPack codes torch's sub-byte
    ints share, by identity), for views with a storage offset and several dimensions, and for
    tensors that require grad. Every element is checked; nothing reaches the general path."""
    from geforce_p2p import _api, _native, _tensors

    fast = _tensors.torch_fast_parts(torch)
    assert fast[4] is torch._C._to_dlpack, "plain tensors are read through torch's export"
    if hasattr(torch, "int4"):  # exported with int8's code: int8 and uint8 by identity
        assert "i8" not in fast[5] and "u8" not in fast[5] and "f32" in fast[5], fast[5]
        int4 = torch.empty(4, dtype=torch.int8, device="cuda:0").view(torch.int4)
        assert _native.read_torch(int4) is None, "int4 is not int8"
        with pytest.raises(TypeError, match="dtype torch.int4"):
            gp.copy_(int4, int4.clone())
    gp.copy_(empty(2, "int32", cuda(0)), random(2, "int32", cuda(0)))  # torch's parts found, dtype names learnt
    reached = []
    general = _api._native.copy
    monkeypatch.setattr(_api._native, "copy", lambda *a: reached.append(a) or general(*a))
    for name in DTYPES:
        whole = random(3 * 4099 + 5, name, cuda(0))
        src = whole[5:].view(3, 4099)  # a storage offset of 5 elements, two dimensions
        out = empty(3 * 4099 + 3, name, cuda(0))
        dst = out[3:].view(3, 4099)
        assert gp.copy_(dst, src) is dst
        assert np.array_equal(bits(dst), bits(src)), name
        assert np.array_equal(bits(out[:3]), bits(empty(3, name, cuda(0)))), "nothing before the view"
    grads = random(4099, "float32", cuda(0)).requires_grad_()
    param = torch.nn.Parameter(random(4099, "float32", cuda(0)))
    for dst, src in ((empty(4099, "float32", cuda(0)), grads), (param, random(4099, "float32", cuda(0)))):
        with torch.no_grad():
            gp.copy_(dst, src)
        assert np.array_equal(bits(dst), bits(src))
    assert reached == [], "the general path was taken"
    with pytest.raises(ValueError, match="dst: shape"):  # one length, other shapes
        gp.copy_(empty(6, "float32", cuda(0)).view(2, 3), random(6, "float32", cuda(0)).view(3, 2))
    with pytest.raises(TypeError, match="dst: dtype torch.bool"):
        gp.copy_(torch.zeros(4, dtype=torch.bool, device="cuda:0"), torch.ones(4, dtype=torch.bool, device="cuda:0"))
    with pytest.raises(ValueError, match="src: not contiguous"):
        gp.copy_(empty(6, "float32", cuda(0)).view(2, 3), random(6, "float32", cuda(0)).view(3, 2).t())
    assert reached == [], "refused before the native call"
    no_cuda_error()


def test_copy_to_a_new_tensor_takes_the_native_fast_path(monkeypatch):
    """gp.copy of a plain CUDA tensor to a GPU allocates its output like the source and goes
    by copy_'s fast path: a new contiguous tensor of the source's shape and dtype on the
    target, ordered after the work queued on the source's current stream. Options and host
    targets go by the general path; refusals are named as before."""
    from geforce_p2p import _api

    gp.copy(random(2, "int32", cuda(0)), device=cuda(0))  # torch's parts found, dtype names learnt
    reached = []
    general = _api._native.copy
    monkeypatch.setattr(_api._native, "copy", lambda *a: reached.append(a) or general(*a))
    target = NDEV - 1
    side = {d: torch.cuda.Stream(device=d) for d in (0, target)}
    for i, name in enumerate(DTYPES):
        src = random(3 * 4099, name, cuda(0)).view(3, 4099)
        fresh = random(3 * 4099, name, cuda(0)).view(3, 4099)
        torch.cuda.synchronize(0)  # made on the default stream; used on a side stream below
        with torch.cuda.stream(side[0]), torch.cuda.stream(side[target]):
            spin(0, 20)
            src.copy_(fresh)  # queued on the source's current (side) stream before the copy
            out = gp.copy(src, device="cuda:%d" % target, route=("auto", "staged")[i % 2])
            got = out.view(torch.uint8).clone()  # queued on the target's current stream after it
        side[target].synchronize()
        assert (out.shape, out.dtype, out.device, out.is_contiguous()) == (src.shape, src.dtype, cuda(target), True)
        assert out.data_ptr() != src.data_ptr()
        assert np.array_equal(got.cpu().numpy(), fresh.view(torch.uint8).cpu().numpy()), name
    assert reached == [], "the general path was taken for a plain tensor"
    src = random(4099, "float32", cuda(0))
    assert np.array_equal(bits(gp.copy(src, device=cuda(target), chunk_bytes=4096)), bits(src))
    assert len(reached) == 1, "with options: the general path"
    with pytest.raises(ValueError, match="src: not contiguous"):
        gp.copy(random(6, "float32", cuda(0)).view(2, 3).t(), device=cuda(target))
    with pytest.raises(ValueError, match="route: 'sideways'"):
        gp.copy(src, device=cuda(target), route="sideways")
    assert len(reached) == 1, "refused before the native call"
    no_cuda_error()


def test_two_tensors_on_one_device_are_refused():
    a, b = torch.ones(8, device="cuda:0"), torch.ones(8, device="cuda:0")
    with pytest.raises(ValueError, match=r"tensors\[1\]: on cuda:0 like tensors\[0\]"):
        gp.all_reduce([a, b])
    with pytest.raises(ValueError, match="one tensor per device"):
        gp.broadcast([a, b])
    assert torch.equal(a.cpu(), torch.ones(8)) and torch.equal(b.cpu(), torch.ones(8))
    no_cuda_error()


# ---- stream semantics ----------------------------------------------------------------------


def spin(device, ms=50):
    """Hold the current stream of `device` busy, so an op that did not wait for it would
    read or write too early (torch.cuda._sleep spins a kernel for a number of cycles)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(int(ms * 1e6))


@pytest.mark.parametrize("route", ["auto", "staged"])
@pytest.mark.parametrize("n", [7, (1 << 22) + 1])
def test_copies_order_with_torch_work_on_current_streams(route, n):
    src_dev, dst_dev = 0, NDEV - 1
    streams = [torch.cuda.Stream(device=d) for d in (src_dev, dst_dev)]
    with torch.cuda.stream(streams[0]), torch.cuda.stream(streams[-1]):
        a = torch.zeros(n, device=cuda(src_dev))
        spin(src_dev)
        a.add_(3)  # queued after the spin: the copy must see 3
        spin(dst_dev)
        b = gp.copy(a, device=cuda(dst_dev), route=route)
        b.mul_(2)  # queued after the copy: must see its result
        a.fill_(-1)  # a later write to the source must not reach b
        c = torch.empty(n, device=cuda(dst_dev))
        gp.copy_(c, b, route=route)
        c.add_(1)
    for d in {src_dev, dst_dev}:
        torch.cuda.synchronize(d)
    assert torch.all(b.cpu() == 6) and torch.all(c.cpu() == 7)


@two_devices
@pytest.mark.parametrize("n", [7, (1 << 21) + 5])
def test_collectives_order_with_torch_work_on_current_streams(n):
    streams = [torch.cuda.Stream(device=d) for d in (0, 1)]
    with torch.cuda.stream(streams[0]), torch.cuda.stream(streams[1]):
        xs = [torch.zeros(n, device=cuda(d)) for d in (0, 1)]
        for d, x in enumerate(xs):
            spin(d)
            x.add_(d + 1)  # 1 and 2, written after the spin
        gp.all_reduce(xs, op="sum")
        for x in xs:
            x.mul_(10)  # 30 everywhere if the all_reduce is ordered between
        outs = [torch.empty(2 * n, device=cuda(d)) for d in (0, 1)]
        gp.all_gather(xs, outs)
        for o in outs:
            o.add_(1)
    for d in (0, 1):
        torch.cuda.synchronize(d)
    assert all(torch.all(x.cpu() == 30) for x in xs)
    assert all(torch.all(o.cpu() == 31) for o in outs)


def test_freed_source_memory_is_reused_only_after_the_copy():
    """Torch may hand a freed tensor's memory out again at once, in stream order: the copy
    must be done with it by then."""
    n = 1 << 22
    dst_dev = NDEV - 1
    a = torch.full((n,), 5.0, device="cuda:0")
    spin(0)
    b = gp.copy(a, device=cuda(dst_dev), route="staged")
    del a
    junk = torch.full((n,), 9.0, device="cuda:0")  # likely a's memory, written after the copy
    torch.cuda.synchronize(dst_dev)
    torch.cuda.synchronize(0)
    assert torch.all(b.cpu() == 5.0)
    del junk


def test_pinned_source_is_kept_until_its_copy_is_done():
    n = 1 << 22
    spin(0)
    host = torch.full((n,), 4.0).pin_memory()
    out = gp.copy(host, device="cuda:0")
    del host  # the package holds it until the copy is done
    again = torch.full((n,), 8.0).pin_memory()  # might reuse the block
    torch.cuda.synchronize(0)
    assert torch.all(out.cpu() == 4.0)
    del again


# ---- other producers ---------------------------------------------------------------------


class DLPackOnly:
    """Shows a torch tensor through DLPack alone."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class InterfaceOnly:
    """Shows a torch tensor through __cuda_array_interface__ alone, with its device."""

    def __init__(self, t):
        self.t = t
        self.device = t.device.index
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def test_dlpack_and_array_interface_objects():
    a = torch.arange(1001, dtype=torch.float32, device="cuda:0")
    torch.cuda.synchronize(0)  # the stand-ins order on the legacy default stream
    dst_dev = NDEV - 1
    out = torch.empty(1001, device=cuda(dst_dev))
    gp.copy_(out, DLPackOnly(a))
    torch.cuda.synchronize(dst_dev)
    assert torch.equal(out.cpu(), a.cpu())
    out2 = torch.empty(1001, device=cuda(dst_dev))
    gp.copy_(InterfaceOnly(out2), InterfaceOnly(a))
    torch.cuda.synchronize(dst_dev)
    assert torch.equal(out2.cpu(), a.cpu())
    bf = torch.randn(99, device="cuda:0").to(torch.bfloat16)
    torch.cuda.synchronize(0)
    assert torch.equal(gp.copy(DLPackOnly(bf), device=cuda(dst_dev)).cpu().view(torch.int16), bf.cpu().view(torch.int16))


# ---- refusals: by name, nothing written, no CUDA error -------------------------------------


def test_refusals_write_nothing_and_leave_no_cuda_error():
    dst_dev = NDEV - 1
    a = torch.randn(64, device="cuda:0")
    dst = torch.full((64,), 7.0, device=cuda(dst_dev))
    cases = [
        (lambda: gp.copy_(dst, torch.randn(8, 8, device="cuda:0").t()), ValueError, "src: not contiguous"),
        (lambda: gp.copy_(dst, torch.randn(65, device="cuda:0")), ValueError, "dst: shape"),
        (lambda: gp.copy_(dst, torch.randn(8, 8, device="cuda:0")), ValueError, "dst: shape"),
        (lambda: gp.copy_(dst, a.double()), TypeError, "dst: dtype float32, but src is float64"),
        (lambda: gp.copy_(dst, a > 0), TypeError, "src: dtype torch.bool is not supported"),
        (lambda: gp.copy_(dst, a.to(torch.complex64)), TypeError, "complex64"),
        (lambda: gp.copy_(dst, torch.randn(64)), ValueError, r"pin_memory\(\)"),
        (lambda: gp.copy(torch.randn(64), device=cuda(dst_dev)), ValueError, r"pin_memory\(\)"),
        (lambda: gp.ops.copy_to_host(torch.empty(64), a), ValueError, "dst: a CPU tensor that is not pinned"),
        (lambda: gp.ops.reduce_from_host(dst, torch.randn(64), op="sum"), ValueError, "src: a CPU tensor that is not pinned"),
        (lambda: gp.all_reduce([dst], op="mean"), ValueError, "op"),
        (lambda: gp.copy_(dst, a, chunk_bytes=0), ValueError, "chunk_bytes"),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind, match=words):
            call()
    no_cuda_error()
    assert torch.all(dst.cpu() == 7.0), "nothing written"


def test_unpinned_host_memory_from_numpy_is_refused_by_the_library():
    host = np.zeros(64, dtype=np.float32)  # __array_interface__: only the driver can tell
    dst = torch.full((64,), 7.0, device="cuda:0")
    with pytest.raises(gp.NotPinnedError, match="not pinned") as raised:
        gp.copy_(dst, host)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, gp.Error)
    no_cuda_error()
    assert torch.all(dst.cpu() == 7.0)


def test_probe_reports_every_device():
    report = gp.probe()
    assert len(report.devices) == NDEV
    assert len(report.verdicts) == NDEV * (NDEV - 1)
    assert "geforce-p2p probe" in str(report)
    assert gp.device_count() == NDEV


@two_devices
def test_forced_peer_route_without_p2p_is_an_error_or_works():
    a = torch.randn(1001, device="cuda:0")
    try:
        b = gp.copy(a, device="cuda:1", route="peer")
    except gp.InvalidArgumentError as e:
        assert "no P2P" in str(e)
    else:
        assert torch.equal(b.cpu(), a.cpu())
    no_cuda_error()


# One process per GPU: this process is rank 0 on cuda:0, a second Python process rank 1 on
# cuda:1; both sum the same seeded inputs and check every element.
_RANK1 = r"""
import os, sys, torch
import geforce_p2p.distributed as gpd
sys.path.insert(0, os.environ["GP2P_TEST_DIR"])
from test_gpu import _distributed_rank
_distributed_rank(os.environ["GP2P_TEST_UID"], 1, int(os.environ.get("GP2P_TEST_DEVICE", "1")))
"""


def _distributed_rank(uid, rank, device):
    import geforce_p2p.distributed as gpd

    torch.cuda.set_device(device)
    comm = gpd.Communicator(uid, rank, 2, device=device)
    results = []
    for i, (name, n) in enumerate((d, n) for d in ("float32", "bfloat16", "int32", "uint8") for n in (1, 7, 4099)):
        inputs = [torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(1000 * i + r)).to(dt(name))
                  for r in range(2)]
        t = inputs[rank].to("cuda:%d" % device)
        comm.all_reduce(t)
        results.append((t, (inputs[0].double() + inputs[1].double())))
    # Through the staged pipeline: an all-reduce above max_bytes (two 8 MiB chunks, the
    # last one partial) and the other collectives, at odd lengths.
    n = 3 * (1 << 20) + 7
    gen = lambda r, i: torch.Generator().manual_seed(7000 + 10 * i + r)  # noqa: E731
    inputs = [torch.randint(-50, 50, (n,), generator=gen(r, 0)).float() for r in range(2)]
    t = inputs[rank].to("cuda:%d" % device)
    comm.all_reduce(t, op="max")
    results.append((t, torch.maximum(inputs[0], inputs[1]).double()))
    parts = [torch.randint(0, 50, (n,), generator=gen(r, 1)).to(torch.int32) for r in range(2)]
    gathered = torch.empty(2 * n, dtype=torch.int32, device="cuda:%d" % device)
    comm.all_gather_into_tensor(gathered, parts[rank].to("cuda:%d" % device))
    results.append((gathered, torch.cat(parts).double()))
    whole = [torch.randint(0, 50, (2 * n,), generator=gen(r, 2)).to(torch.bfloat16) for r in range(2)]
    mine = torch.empty(n, dtype=torch.bfloat16, device="cuda:%d" % device)
    comm.reduce_scatter_tensor(mine, whole[rank].to("cuda:%d" % device), op="sum")
    results.append((mine, (whole[0].double() + whole[1].double())[rank * n:(rank + 1) * n]))
    sent = [torch.randint(0, 50, (n,), generator=gen(r, 3)).to(torch.float16) for r in range(2)]
    b = sent[rank].to("cuda:%d" % device)
    comm.broadcast(b, src=1)
    results.append((b, sent[1].double()))
    # Point to point both ways: the receiver's tensor becomes the sender's.
    for sender in range(2):
        mine = [torch.randint(-50, 50, (n,), generator=gen(r, 4 + sender)).to(torch.int32) for r in range(2)]
        p = mine[rank].to("cuda:%d" % device)
        if rank == sender:
            comm.send(p, 1 - rank)
        else:
            comm.recv(p, sender)
        results.append((p, mine[sender].double()))
    for bad in (rank, 2, -1):
        try:
            comm.send(p, bad)
        except ValueError as e:
            assert "not another rank" in str(e), str(e)
        else:
            raise AssertionError("send to %r: not refused" % bad)
    # A usual CUDA tensor is read natively (the fast path all_reduce tries first, with the
    # torch parts the native side keeps) and enqueued; an op it does not know is declined.
    t = torch.full((33,), float(rank + 1), device="cuda:%d" % device)
    assert comm._native.all_reduce_torch(t, "mean") is False
    assert comm._native.all_reduce_torch(t, "sum") is True
    results.append((t, torch.full((33,), 3.0, dtype=torch.float64)))
    # What the native read of a torch tensor declines, the Python layer reads and refuses by
    # name, before anything is enqueued (both ranks refuse alike, so they stay paired).
    dev, other = "cuda:%d" % device, (device + 1) % torch.cuda.device_count()
    refused = [(torch.zeros(16, device=dev)[::2], "not contiguous"), (torch.zeros(4), "a CPU tensor"),
               (torch.zeros(4, dtype=torch.complex64, device=dev), "is not supported")]
    if other != device:
        refused.append((torch.zeros(4, device="cuda:%d" % other), "this rank's communicator"))
    for bad, words in refused:
        try:
            comm.all_reduce(bad)
        except (TypeError, ValueError) as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError("all_reduce of %s: not refused" % words)
    for t, want in results:
        got = t.cpu().double()
        assert torch.equal(got, want.to(t.dtype).double()), (t.dtype, t.numel())
    _captured_and_replayed(comm, rank, device)
    comm.close()


def _captured_and_replayed(comm, rank, device):
    """Every collective captured into one CUDA graph (the one-kernel all-reduce, by its line
    kernel and by its flagged chunks, and the pipeline), then 10 replays, each with new data
    copied into the captured tensors and every element checked."""
    dev = "cuda:%d" % device
    small, big, half = 1001, (1 << 20) + 3, 150_001
    tiny = torch.zeros(301, dtype=torch.int32, device=dev)  # the line kernel (up to 2 KiB)
    x = torch.zeros(small, device=dev)  # the flagged chunks
    y = torch.zeros(big, device=dev)
    gin, gout = torch.zeros(small, dtype=torch.int32, device=dev), torch.zeros(2 * small, dtype=torch.int32, device=dev)
    rsin, rsout = torch.zeros(2 * half, device=dev), torch.zeros(half, device=dev)
    b = torch.zeros(5003, dtype=torch.float16, device=dev)

    def step():
        comm.all_reduce(tiny, op="max")
        comm.all_reduce(x)
        comm.all_reduce(y, op="max")
        comm.all_gather_into_tensor(gout, gin)
        comm.reduce_scatter_tensor(rsout, rsin, op="sum")
        comm.broadcast(b, src=1)

    side = torch.cuda.Stream(dev)  # torch's recipe: run once on a side stream before capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(10):
        gen = lambda r, i: torch.Generator().manual_seed(50_000 + 100 * replay + 10 * i + r)  # noqa: E731
        xs = [torch.randint(-99, 99, (small,), generator=gen(r, 0)).float() for r in range(2)]
        ys = [torch.randint(-99, 99, (big,), generator=gen(r, 1)).float() for r in range(2)]
        gs = [torch.randint(-99, 99, (small,), generator=gen(r, 2)).to(torch.int32) for r in range(2)]
        rs = [torch.randint(-99, 99, (2 * half,), generator=gen(r, 3)).float() for r in range(2)]
        bs = [torch.randint(-99, 99, (5003,), generator=gen(r, 4)).to(torch.float16) for r in range(2)]
        ts = [torch.randint(-99, 99, (301,), generator=gen(r, 5)).to(torch.int32) for r in range(2)]
        for t, values in ((tiny, ts), (x, xs), (y, ys), (gin, gs), (rsin, rs), (b, bs)):
            t.copy_(values[rank])
        graph.replay()
        checks = [(tiny, torch.maximum(ts[0], ts[1])), (x, xs[0] + xs[1]), (y, torch.maximum(ys[0], ys[1])),
                  (gout, torch.cat(gs)), (rsout, (rs[0] + rs[1])[rank * half:(rank + 1) * half]), (b, bs[1])]
        for i, (t, want) in enumerate(checks):
            assert torch.equal(t.cpu(), want), "replay %d, output %d" % (replay, i)
    comm.check()  # no wait of any replay gave up


# The same through torch.distributed: init_process_group("gp2p") in two processes.
_BACKEND_RANK1 = r"""
import os, sys, torch
sys.path.insert(0, os.environ["GP2P_TEST_DIR"])
from test_gpu import _backend_rank
_backend_rank(1, os.environ["GP2P_TEST_INIT"])
"""


def _backend_rank(rank, init):
    import datetime

    import torch.distributed as dist

    import geforce_p2p.distributed as gpd

    torch.cuda.set_device(rank)
    gpd.register_backend()
    # A short timeout: it is also how long a collective waits for its peer, and a test that
    # hangs should fail well before the runner kills it.
    dist.init_process_group("gp2p", init_method=init, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    dev = "cuda:%d" % rank
    n = 300_007  # the pipeline's chunks are 8 MiB: this is one partial chunk, odd
    gen = lambda r, i: torch.Generator().manual_seed(900 + 10 * i + r)  # noqa: E731
    both = [torch.randint(-1000, 1000, (n,), generator=gen(r, 0)).float() for r in range(2)]
    t = both[rank].to(dev)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), both[0] + both[1]), "all_reduce"
    small = [torch.randint(-9, 9, (1001,), generator=gen(r, 1)).to(torch.int32) for r in range(2)]
    s = small[rank].to(dev)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    assert torch.equal(s.cpu(), torch.maximum(small[0], small[1])), "all_reduce max, one kernel"
    out = torch.empty(2 * n, device=dev)
    dist.all_gather_into_tensor(out, both[rank].to(dev))
    assert torch.equal(out.cpu(), torch.cat(both)), "all_gather_into_tensor"
    half = torch.empty(n // 2 + 1, device=dev)
    whole = torch.cat([b[: n // 2 + 1] for b in both])  # 2 x (n // 2 + 1) elements on each rank
    dist.reduce_scatter_tensor(half, (whole * (rank + 1)).to(dev))
    want = (whole * 1 + whole * 2).chunk(2)[rank]
    assert torch.equal(half.cpu(), want), "reduce_scatter_tensor"
    b = both[rank].to(dev)
    dist.broadcast(b, src=1)
    assert torch.equal(b.cpu(), both[1]), "broadcast"
    cpu = torch.tensor([rank + 1])
    dist.all_reduce(cpu)  # the gloo group beside the communicator
    assert int(cpu) == 3
    dist.barrier()
    dist.destroy_process_group()


def _rank0_here_rank1_in_a_child(rank1_script, rank0, tmp_path):
    """Run ``rank0(0, init)`` in this process and ``rank1_script`` (rank 1) in a child, both
    meeting at a ``file://`` rendezvous; never leave the child behind."""
    import os
    import subprocess
    import sys

    init = "file://" + str(tmp_path / "init")
    env = dict(os.environ, GP2P_TEST_INIT=init, GP2P_TEST_DIR=os.path.dirname(__file__))
    child = subprocess.Popen([sys.executable, "-c", rank1_script], env=env)
    try:
        rank0(0, init)
        assert child.wait(timeout=120) == 0, "rank 1 failed (its output is above)"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@two_devices
def test_two_processes_through_init_process_group_with_the_gp2p_backend(tmp_path):
    _rank0_here_rank1_in_a_child(_BACKEND_RANK1, _backend_rank, tmp_path)


def _two_ranks_through_the_distributed_communicator(devices):
    import os
    import subprocess
    import sys

    import geforce_p2p.distributed as gpd

    uid = gpd.unique_id()
    env = dict(os.environ, GP2P_TEST_UID=uid, GP2P_TEST_DIR=os.path.dirname(__file__),
               GP2P_TEST_DEVICE=str(devices[1]))
    child = subprocess.Popen([sys.executable, "-c", _RANK1], env=env)
    try:
        _distributed_rank(uid, 0, devices[0])
        assert child.wait(timeout=120) == 0, "rank 1 failed (its output is above)"
    finally:
        if child.poll() is None:  # rank 0 failed, or rank 1 hangs: never leave it behind
            child.kill()
            child.wait()


@two_devices
def test_two_processes_all_reduce_through_the_distributed_communicator():
    _two_ranks_through_the_distributed_communicator((0, 1))


def test_two_processes_sharing_one_gpu_run_the_distributed_communicator():
    # Both ranks on cuda:0 (their kernels take turns on it): every path, and capture.
    _two_ranks_through_the_distributed_communicator((0, 0))


def test_an_op_on_a_capturing_stream_is_refused_before_anything_is_captured():
    # Only the communicator's calls can be captured: any other op on a stream that torch is
    # capturing is refused before it enqueues anything, so torch's capture stays valid.
    a = random(1001, "float32", 0)
    host = torch.empty(1001, pin_memory=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # on torch's own capture stream, current meanwhile
        with pytest.raises(gp.Error, match="capturing a CUDA graph"):
            gp.ops.copy_to_host(host, a)
        b = a * 2
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(b, a * 2), "the graph was made and runs what was captured"
    gp.ops.copy_to_host(host, a)  # outside the capture it runs
    torch.cuda.synchronize()
    assert torch.equal(host, a.cpu())
    no_cuda_error()


# vLLM's and sglang's custom all-reduce, built as they build it, two ranks sharing cuda:0:
# this process is rank 0, a child rank 1; a gloo group between them, as the servers' CPU group.
_SERVER_RANK1 = r"""
import os, sys, torch
sys.path.insert(0, os.environ["GP2P_TEST_DIR"])
from test_gpu import _server_rank
_server_rank(1, os.environ["GP2P_TEST_INIT"])
"""


def _server_rank(rank, init):
    import datetime
    import gc

    import torch.distributed as dist

    from geforce_p2p.distributed import CustomAllreduce

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    # vLLM's keywords; sglang passes only group= and device=.
    ca = CustomAllreduce(group=dist.group.WORLD, device=torch.device("cuda:0"), symm_mem_enabled=False,
                         register_graph_buffers=True)
    assert not ca.disabled and ca.fully_connected is False
    gen = lambda r, i: torch.Generator().manual_seed(500 + 10 * i + r)  # noqa: E731
    for i, (dtype, n) in enumerate([(torch.float32, 1024), (torch.bfloat16, 4096), (torch.int32, 260),
                                    (torch.float16, (1 << 20) + 8)]):
        parts = [torch.randint(-50, 50, (n,), generator=gen(r, i)).to(dtype) for r in range(2)]
        t = parts[rank].to("cuda:0")
        assert ca.should_custom_ar(t), (dtype, n)
        out = ca.custom_all_reduce(t)
        torch.cuda.synchronize()
        assert out is not t and out.data_ptr() != t.data_ptr()
        assert torch.equal(t.cpu(), parts[rank]), "the input is left as it was"
        assert torch.equal(out.cpu(), (parts[0].double() + parts[1].double()).to(dtype)), (dtype, n)
    # Bad input as a server would send it: refused, nothing written, nothing raised.
    x = torch.arange(64, dtype=torch.float32, device="cuda:0")
    before = x.clone()
    for bad in (x[::2], torch.zeros(3, device="cuda:0"), x.cpu(), x.to(torch.bool), torch.empty(2 << 20, device="cuda:0")):
        assert not ca.should_custom_ar(bad) and ca.custom_all_reduce(bad) is None
    assert torch.equal(x, before)
    # vLLM's other members, along the first dimension (x is the same on both ranks).
    assert torch.equal(ca.custom_all_gather(x).cpu(), torch.cat([before, before]).cpu())
    assert torch.equal(ca.custom_reduce_scatter(x).cpu(), 2 * before[32 * rank:32 * (rank + 1)].cpu())
    # Inside capture(), as the servers capture: a warm-up on a side stream, then the graph;
    # replays on new data.
    static = torch.zeros(2048, device="cuda:0")
    graph = torch.cuda.CUDAGraph()
    with ca.capture():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ca.custom_all_reduce(static)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = ca.custom_all_reduce(static)
    for i in range(3):
        parts = [torch.randint(-50, 50, (2048,), generator=gen(r, 10 + i)).float() for r in range(2)]
        static.copy_(parts[rank].to("cuda:0"))
        graph.replay()
        torch.cuda.synchronize()
        ca.comm.check()
        assert torch.equal(out.cpu(), parts[0] + parts[1]), "replay %d" % i
    del graph, out
    del ca  # dropped, never closed, as the servers do
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def test_custom_allreduce_built_as_the_servers_build_it_serves_two_ranks_sharing_one_gpu(tmp_path):
    _rank0_here_rank1_in_a_child(_SERVER_RANK1, _server_rank, tmp_path)
