"""Where the servers' object's host time goes, part by part: two ranks on one GPU (start an MPS
daemon first), 512 f32 (2 KiB). Every part is timed call by call, the parts taking turns call
by call (each part sees the same machine, the same GPU queue and the same peer), `CALLS`
calls a round, each turn through the parts in its own order; the figure is the median over every
call of every round after a warm-up round (host time a call: what the enqueue costs, not the
all-reduce).

    python3 -m torch.distributed.run --nproc-per-node 2 benches/python/server_host_parts.py [--inference-mode | --no-grad]

`--inference-mode`: everything under torch.inference_mode(), as vLLM's model runner calls the
object; `--no-grad`: under torch.no_grad(), as sglang's does (unless
SGLANG_ENABLE_TORCH_INFERENCE_MODE is set). In either, custom_all_reduce makes its small
outputs a batch at a time (crates/gp2p-python/src/outputs.rs), while
native.all_reduce_new_torch(empty_like) still calls torch.empty_like for each.

Parts: the communicator's in-place call and its native fast path; what a server calls,
should_custom_ar then custom_all_reduce, and each alone; the out-of-place native call with
torch.empty_like and with one preallocated output; the native check alone; torch.empty_like
alone. The servers' calls keep each output alive for the next four calls, as a layer's output
is held while the next ones run, so torch's allocator hands out five addresses in turn. Then
the differences the issue's target is about: what the servers' object adds to the
communicator's call. Every output the servers' object makes is checked at the end."""
import os, statistics, sys, torch, torch.distributed as dist
import geforce_p2p.distributed as gpd
from parts_in_turns import line, time_in_turns

ROUNDS, CALLS = 10, 200
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(0)
dist.init_process_group("gloo")
comm = gpd.Communicator.from_group(device=0, peer_timeout=60.0)
ca = gpd.CustomAllreduce(comm)
native = comm._native
# For the rest of the script: the guard lives as long as the context object does.
INFERENCE = torch.inference_mode("--inference-mode" in sys.argv)
INFERENCE.__enter__()
torch.set_grad_enabled("--no-grad" not in sys.argv and not torch.is_inference_mode_enabled())
torch.manual_seed(rank)
buf = torch.randn(512, device="cuda")      # summed in place by the communicator's parts
src = torch.randn(512, device="cuda")      # read, never written, by the out-of-place parts
every = [torch.empty(512) for _ in range(world)]
dist.all_gather(every, src.cpu())
want = sum(x.double() for x in every)
pre = torch.empty_like(src)
held = []


def keep(out):
    held.append(out)
    if len(held) > 4:
        held.pop(0)


def server():
    if ca.should_custom_ar(src):
        keep(ca.custom_all_reduce(src))


parts = [
    ("Communicator.all_reduce", lambda: comm.all_reduce(buf)),
    ("native.all_reduce_torch", lambda: native.all_reduce_torch(buf, "sum")),
    ("should_custom_ar + custom_all_reduce", server),
    ("ca.custom_all_reduce", lambda: keep(ca.custom_all_reduce(src))),
    ("native.all_reduce_new_torch(empty_like)", lambda: keep(native.all_reduce_new_torch(src, torch.empty_like, 1 << 20))),
    ("native.all_reduce_new_torch(preallocated)", lambda: native.all_reduce_new_torch(src, lambda t: pre, 1 << 20)),
    ("ca.should_custom_ar", lambda: ca.should_custom_ar(src)),
    ("native.serves_torch", lambda: native.serves_torch(src, 1 << 20)),
    ("torch.empty_like alone", lambda: keep(torch.empty_like(src))),
]
res = time_in_turns(parts, ROUNDS, CALLS)
for out in held:
    assert torch.allclose(out.double().cpu(), want, rtol=1e-5, atol=1e-5), "rank %d: a wrong sum" % rank
med = {name: statistics.median(v) for name, v in res.items()}
if rank == 0:
    print("inference mode: %s, gradients: %s" % (torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
    for name, _ in parts:
        print(line(name, res[name]))
    base = med["Communicator.all_reduce"]
    print("custom_all_reduce over Communicator.all_reduce: %+.2f us" % (med["ca.custom_all_reduce"] - base))
    print("should_custom_ar + custom_all_reduce over Communicator.all_reduce: %+.2f us"
          % (med["should_custom_ar + custom_all_reduce"] - base))
comm.close()
