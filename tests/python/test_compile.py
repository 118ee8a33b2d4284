"""GPU tests of ``torch.compile(fullgraph=True)`` through the package: every copy, the four
ops and the collectives compile into one graph with the package's custom op in it (checked
with ``torch._dynamo.explain``: one graph, no break), run, and give what eager gives; the
one-process-per-GPU communicator's all_reduce too, with two ranks sharing the GPU, and inside
a CUDA graph that captures the compiled function (the communicator's calls are the ones
that can be captured).

Fresh random data, every element checked. Needs torch and a CUDA GPU.
"""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import _package  # noqa: E402

gp = _package.load()
NAMESPACE = gp.__name__
DEV = "cuda:0"


def one_graph(fn, *args):
    """``fn(*args)`` traced by dynamo: one graph, no break, and the package's op in it."""
    explanation = torch._dynamo.explain(fn)(*args)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1, explanation
    code = "\n".join(g.code for g in explanation.graphs)
    assert "torch.ops.%s." % NAMESPACE in code, code
    return code


def randn(n, device=DEV):
    return torch.randn(n, device=device)


def test_copy_compiles_into_one_graph_and_equals_eager():
    def f(a):
        return gp.copy(a * 2, device=DEV) + 1

    a = randn(4099)
    assert "%s.copy.default" % NAMESPACE in one_graph(f, a)
    eager = f(a)
    compiled = torch.compile(f, fullgraph=True)(a)
    torch.cuda.synchronize()
    assert torch.equal(compiled, eager) and torch.equal(eager, a * 2 + 1)


def test_copy_to_pinned_host_compiles():
    def f(a):
        return gp.copy(a, device="cpu")

    a = randn(1001)
    one_graph(f, a)
    out = torch.compile(f, fullgraph=True)(a)
    torch.cuda.synchronize()
    assert out.device.type == "cpu" and torch.equal(out, a.cpu())


@pytest.mark.parametrize("route", ["auto", "staged"])
def test_copy_into_compiles_and_writes_its_destination(route):
    def f(dst, src):
        gp.copy_(dst, src * 3, route=route)
        return dst + 1

    src = randn((1 << 20) + 3)
    one_graph(f, torch.empty_like(src), src)
    dst = torch.full_like(src, float("nan"))
    out = torch.compile(f, fullgraph=True)(dst, src)
    torch.cuda.synchronize()
    assert torch.equal(dst, src * 3), "the mutation reaches the caller's tensor"
    assert torch.equal(out, src * 3 + 1)


def test_the_four_ops_compile_into_one_graph_and_equal_eager():
    def f(dst, src, host, back, acc):
        gp.ops.geforce_p2p_staged_copy(dst, src * 2)
        gp.ops.geforce_p2p_copy_to_host(host, dst)
        gp.ops.geforce_p2p_copy_from_host(back, host)
        gp.ops.geforce_p2p_reduce_from_host(acc, host, "sum")
        return back - 1, acc * 1

    n = 4099

    def args():
        return (torch.full((n,), float("nan"), device=DEV), src, torch.empty(n, pin_memory=True),
                torch.full((n,), float("nan"), device=DEV), acc0.clone())

    src, acc0 = randn(n), randn(n)
    code = one_graph(f, *args())
    for op in ("staged_copy", "copy_to_host", "copy_from_host", "reduce_from_host"):
        assert "%s.%s.default" % (NAMESPACE, op) in code
    eager_args, compiled_args = args(), args()
    eager = f(*eager_args)
    compiled = torch.compile(f, fullgraph=True)(*compiled_args)
    torch.cuda.synchronize()
    want_acc = (acc0.double() + (src * 2).double()).float()
    for got in (eager, compiled):
        assert torch.equal(got[0], src * 2 - 1)
        assert torch.equal(got[1], want_acc)
    assert torch.equal(compiled_args[2], (src * 2).cpu()), "the pinned host tensor was written"


def test_the_collectives_compile_into_one_graph_with_one_rank():
    def f(x, out, part):
        y = x * 2
        gp.all_reduce([y], op="sum")
        gp.broadcast([y], root=0)
        gp.all_gather([y], [out])
        gp.reduce_scatter([y], [part], op="max")
        return y + 1, out * 1, part * 1

    n = 4097
    x = randn(n)
    code = one_graph(f, x, torch.empty(n, device=DEV), torch.empty(n, device=DEV))
    for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
        assert "%s.%s.default" % (NAMESPACE, op) in code
    out, part = torch.full((n,), float("nan"), device=DEV), torch.full((n,), float("nan"), device=DEV)
    y, gathered, scattered = torch.compile(f, fullgraph=True)(x, out, part)
    torch.cuda.synchronize()
    assert torch.equal(y, x * 2 + 1)
    assert torch.equal(gathered, x * 2) and torch.equal(out, x * 2)
    assert torch.equal(scattered, x * 2) and torch.equal(part, x * 2)


def test_a_device_that_does_not_exist_is_a_value_error_naming_device():
    missing = "cuda:%d" % torch.cuda.device_count()
    before = torch.cuda.memory_allocated()
    with pytest.raises(ValueError, match="^device: %s does not exist" % missing):
        gp.copy(randn(8), device=missing)
    assert torch.cuda.memory_allocated() - before <= 512, "refused before allocating"


# Two ranks sharing cuda:0, one process each: rank 0 is this process, rank 1 a child.
_RANK1 = r"""
import os, sys
sys.path.insert(0, os.environ["GP2P_TEST_DIR"])
import test_compile
test_compile._compiled_rank(os.environ["GP2P_TEST_UID"], 1)
"""


def _compiled_rank(uid, rank):
    # Compiling takes each rank its own few seconds, and a rank's first call waits for the
    # other on the GPU: give the peer longer than the compiler takes.
    comm = gp.distributed.Communicator(uid, rank, 2, device=0, peer_timeout=300)

    def f(t):
        u = t * 2
        comm.all_reduce(u)
        return u + 1

    def inputs(i):
        gens = [torch.Generator().manual_seed(100 * i + r) for r in range(2)]
        parts = [torch.randint(-500, 500, (4099,), generator=g).float() for g in gens]
        return parts[rank].to(DEV), (2 * (parts[0].double() + parts[1].double()) + 1).float()

    t, want = inputs(0)
    one_graph(f, t)
    compiled = torch.compile(f, fullgraph=True)
    for i in range(1, 3):
        t, want = inputs(i)
        assert torch.equal(f(t).cpu(), want), "eager"
        assert torch.equal(compiled(t).cpu(), want), "compiled"
    # The compiled function captured into a CUDA graph, replayed on new data.
    static, _ = inputs(3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        compiled(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(static)
    for i in range(4, 8):
        fresh, want = inputs(i)
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        comm.check()
        assert torch.equal(out.cpu(), want), "replay %d" % i
    comm.close()


def test_the_communicators_all_reduce_compiles_and_replays_in_a_cuda_graph_with_two_ranks():
    uid = gp.distributed.unique_id()
    env = dict(os.environ, GP2P_TEST_UID=uid, GP2P_TEST_DIR=os.path.dirname(__file__))
    child = subprocess.Popen([sys.executable, "-c", _RANK1], env=env)
    try:
        _compiled_rank(uid, 0)
        assert child.wait(timeout=300) == 0, "rank 1 failed (its output is above)"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
