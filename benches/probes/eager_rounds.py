"""Why the communicator's rounds run slower eager than replayed among processes sharing one GPU
under MPS (many_rounds.py: 4 ranks, 256 KiB broadcast 1.3 ms a call eager, 78 us replayed,
while the all-gather is as fast eager as replayed; the host enqueues either in 30-90 us).

Launch with torchrun (one GPU, an MPS daemon running):

    python3 -m torch.distributed.run --nproc-per-node 4 benches/probes/eager_rounds.py [--slot-bytes N]

For each op (broadcast from the last rank, in-place all-reduce, all-gather) at `--bytes` a rank,
by CUDA events on the current stream, the slowest rank's time per call, median of 5 after a
warm-up:
- `back-to-back`: 10 calls in a row after a barrier (as many_rounds.py times them);
- `isolated`: one call after a synchronise and a barrier;
- `synced`: 10 calls, each followed by a synchronise of this rank's GPU work (no barrier);
- `replayed`: the 10 calls captured into a CUDA graph.
Then the driver calls of one eager call on rank 0 and on the last rank, by name. Every result
of every timed loop is checked (int32, exact).
"""

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

import geforce_p2p.distributed as gpd
from geforce_p2p import _native

CALLS, REPEATS = 10, 5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=256 << 10)
    ap.add_argument("--slot-bytes", type=int)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    options = {"slot_bytes": args.slot_bytes} if args.slot_bytes else {}
    comm = gpd.Communicator.from_group(device=device, peer_timeout=60.0, **options)
    n = args.bytes // 4
    buf = torch.empty(n, dtype=torch.int32, device=device)
    out = torch.empty(n * world, dtype=torch.int32, device=device)
    ops = {
        "broadcast": lambda: comm.broadcast(buf, src=world - 1),
        "all_gather": lambda: comm.all_gather_into_tensor(out, buf),
        "all_reduce": lambda: comm.all_reduce(buf, op="max"),
    }
    for name, call in ops.items():
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=side):
                for _ in range(CALLS):
                    call()
        torch.cuda.synchronize()
        line = []
        for way in ("back-to-back", "isolated", "synced", "replayed"):
            times = []
            for repeat in range(REPEATS + 1):
                g = torch.Generator().manual_seed(repeat * 31 + len(name))
                inputs = [torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32) for _ in range(world)]
                buf.copy_(inputs[rank])
                calls = 1 if way == "isolated" else CALLS
                torch.cuda.synchronize()
                dist.barrier()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                if way == "replayed":
                    graph.replay()
                else:
                    for _ in range(calls):
                        call()
                        if way == "synced":
                            torch.cuda.synchronize()
                end.record()
                end.synchronize()
                if name == "broadcast":
                    ok = torch.equal(buf.cpu(), inputs[world - 1])
                elif name == "all_gather":
                    ok = torch.equal(out.cpu(), torch.cat(inputs))
                else:
                    ok = torch.equal(buf.cpu(), torch.stack(inputs).max(0).values)
                assert ok, "rank %d: %s %s repeat %d: wrong result" % (rank, name, way, repeat)
                slowest = torch.tensor([start.elapsed_time(end) * 1000 / calls])
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if repeat:
                    times.append(slowest.item())
            line.append("%s %.1f" % (way, statistics.median(times)))
        _native.bench.trace_start()
        call()
        trace = _native.bench.trace_finish()
        torch.cuda.synchronize()
        if rank == 0:
            print("%s %d B, us a call: %s" % (name, args.bytes, ", ".join(line)), flush=True)
        for r in (0, world - 1):
            dist.barrier()
            if rank == r:
                names = [call_name for call_name, _ in trace[:-1]]
                print("  rank %d: %d driver calls: %s" % (rank, len(names), " ".join(names)), flush=True)
        del graph
    comm.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
