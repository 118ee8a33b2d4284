"""One rank of test_many.py's compressed all-reduce tests: ``python _compress_rank.py SCENARIO
RANK WORLD INIT`` (the arguments of ``_many_rank.py``, whose helpers it uses).

- ``compress-mlp``: a tensor-parallel MLP block (two linears, one all-reduce, bfloat16) on a
  communicator made with ``compress="int8"``: the compressed output against the exact sum of
  every rank's partial output (float64), every rank the same bits, and the same call captured
  in a CUDA graph and replayed with new activations. Prints the relative errors.
- ``compress-ddp``: DDP on the ``gp2p`` backend, 200 steps exact, then the same 200 steps with
  ``GP2P_COMPRESS=int8`` (the gradients' all-reduces compressed): the losses end within 1 %.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _many_rank import DEVICE, INIT, RANK, SCENARIO, WORLD, gp, gpd, step  # noqa: E402

TOKENS, HIDDEN, FFN = 1024, 1024, 4096


def mlp_partials(seed):
    """Every rank's partial output of the block for activations of `seed` (the weights are
    fixed): gelu(x W1[:, shard]) W2[shard, :] in bfloat16, rank r's shard of the FFN width."""
    g = torch.Generator().manual_seed(1234)
    w1 = (torch.randn(HIDDEN, FFN, generator=g) * HIDDEN ** -0.5).to(torch.bfloat16).to(DEVICE)
    w2 = (torch.randn(FFN, HIDDEN, generator=g) * FFN ** -0.5).to(torch.bfloat16).to(DEVICE)
    # Layer-normed activations with a few outlier channels, as transformer activations have.
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(seed))
    x[:, :8] *= 20.0
    x = x.to(torch.bfloat16).to(DEVICE)
    shard = FFN // WORLD
    return [torch.nn.functional.gelu(x @ w1[:, r * shard:(r + 1) * shard]) @ w2[r * shard:(r + 1) * shard]
            for r in range(WORLD)]


def relative_errors(got, parts):
    """Max |got - exact| over max |exact|, and RMS(got - exact) over RMS(exact), exact in f64."""
    exact = torch.stack([p.double() for p in parts]).sum(0)
    err = got.double() - exact
    return (err.abs().max() / exact.abs().max()).item(), (err.square().mean() / exact.square().mean()).sqrt().item()


def same_bits_everywhere(comm, what, t):
    everyone = torch.empty(WORLD * t.numel(), dtype=t.dtype, device=DEVICE)
    comm.all_gather_into_tensor(everyone, t.reshape(-1))
    mine = t.reshape(-1).view(torch.int16)
    for r, theirs in enumerate(everyone.view(torch.int16).chunk(WORLD)):
        assert torch.equal(theirs, mine), "%s: rank %d's bits differ from rank %d's" % (what, r, RANK)


def mlp_scenario():
    comm = gpd.Communicator(INIT, RANK, WORLD, DEVICE, peer_timeout=60.0, join_timeout=120.0, compress="int8")
    step("joined")
    parts = mlp_partials(1)
    out = parts[RANK].clone()
    comm.all_reduce(out, "sum")
    torch.cuda.synchronize()
    worst, rms = relative_errors(out, parts)
    step("tp-mlp bf16 int8/64, %d ranks: max rel err %.3e, rms rel err %.3e" % (WORLD, worst, rms))
    # int8 with 64 values a scale: a few tenths of a percent (docs/compression.md).
    assert rms < 1e-2 and worst < 5e-2, "errors %.3e %.3e" % (worst, rms)
    same_bits_everywhere(comm, "eager", out)
    step("capture")
    static = parts[RANK].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        comm.all_reduce(static, "sum")  # warm-up outside the graph
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            comm.all_reduce(static, "sum")
    for replay in range(3):
        fresh = mlp_partials(10 + replay)
        static.copy_(fresh[RANK])
        graph.replay()
        torch.cuda.synchronize()
        worst, rms = relative_errors(static, fresh)
        assert rms < 1e-2 and worst < 5e-2, "replay %d: errors %.3e %.3e" % (replay, worst, rms)
        same_bits_everywhere(comm, "replay %d" % replay, static)
    comm.check()
    comm.close()


def train(init, steps=200):
    """DDP on the gp2p backend: a student MLP fits a fixed teacher, every rank its own batches;
    the last ten steps' mean loss."""
    dist.init_process_group("gp2p", init_method=init, rank=RANK, world_size=WORLD)
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 16)).to(DEVICE)
    student = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                  torch.nn.ReLU(), torch.nn.Linear(1024, 16)).to(DEVICE)
    model = torch.nn.parallel.DistributedDataParallel(student, device_ids=[DEVICE.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator(device=DEVICE).manual_seed(100 + RANK)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 256, device=DEVICE, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    dist.barrier()
    dist.destroy_process_group()
    return sum(losses[-10:]) / 10


def ddp_scenario():
    gpd.register_backend()
    os.environ.pop("GP2P_COMPRESS", None)
    exact = train(INIT)
    step("exact: last loss %.5f" % exact)
    # The student's gradients (about 5 MiB of float32, in buckets of 1 and 4 MiB, below the
    # cost model's minimum among 2 and 4) travel compressed from here on.
    os.environ["GP2P_COMPRESS"] = "int8@64K"
    compressed = train(INIT + "-compressed")
    step("compressed: last loss %.7f (exact %.7f, %+.3f %%)" % (compressed, exact, 100 * (compressed / exact - 1)))
    assert abs(compressed / exact - 1) < 0.01, "compressed training ends at %.5f, exact at %.5f" % (compressed, exact)
    # The same loss to the last bit would mean the gradients were never compressed.
    assert compressed != exact, "the compressed run's loss equals the exact run's bit for bit: nothing was compressed"


if __name__ == "__main__":
    {"compress-mlp": mlp_scenario, "compress-ddp": ddp_scenario}[SCENARIO]()
    print("rank %d of %d: %s passed" % (RANK, WORLD, SCENARIO))
    sys.stdout.flush()
