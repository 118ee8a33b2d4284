"""Which communicator call survives a torch CUDA-graph capture, by capture mode, with and
without an uncaptured call before it: every case makes a fresh communicator, captures one
call, replays it once and checks the communicator. Two processes, one GPU each:

    python3 -m torch.distributed.run --nproc-per-node 2 benches/probes/capture_probe.py

Each line: rank, warm (an uncaptured call first), torch's capture_error_mode, the call, ok or
FAIL with torch's message. On driver 580 every case failed until borrowing a capturing stream
stopped asking the driver for its id (f07e84f)."""
import os
import torch, torch.distributed as dist
import geforce_p2p.distributed as gpd

rank = int(os.environ["RANK"]); torch.cuda.set_device(rank); dev = "cuda:%d" % rank
dist.init_process_group("gloo")

def comm_new():
    return gpd.Communicator.from_group(device=rank, peer_timeout=3.0)

ops = {
  "small": lambda c, t: c.all_reduce(t["x"]),
  "pipe": lambda c, t: c.all_reduce(t["y"], op="max"),
  "gather": lambda c, t: c.all_gather_into_tensor(t["gout"], t["gin"]),
  "bcast": lambda c, t: c.broadcast(t["b"], src=1),
}
def tensors():
    return dict(x=torch.ones(1001, device=dev), y=torch.ones((1 << 20) + 3, device=dev),
                gin=torch.ones(1001, dtype=torch.int32, device=dev), gout=torch.zeros(2002, dtype=torch.int32, device=dev),
                b=torch.ones(5003, dtype=torch.float16, device=dev))

for warm in (False, True):
  for mode in ("global", "thread_local", "relaxed"):
    for name, op in ops.items():
        dist.barrier()
        c = comm_new(); t = tensors()
        if warm:
            side = torch.cuda.Stream(dev); side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                op(c, t)
            torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph(); res = "ok"
        try:
            with torch.cuda.graph(g, capture_error_mode=mode):
                op(c, t)
            g.replay(); torch.cuda.synchronize(); c.check()
        except Exception as e:
            res = "FAIL " + str(e).splitlines()[0][:110]
        print("rank %d warm=%d mode=%-12s %-6s %s" % (rank, warm, mode, name, res), flush=True)
        try: c.close()
        except Exception: pass
        torch.cuda.synchronize()
dist.destroy_process_group()
