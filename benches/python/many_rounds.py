"""Time per call of the communicator's rounds among N processes (the sizes above the lines):
all_reduce, all_gather_into_tensor and broadcast, eager and replayed from a CUDA graph, for
regressions and for comparing two builds on one machine.

Launch with torchrun, N processes (GPU r modulo the GPUs visible; on one GPU start an MPS
daemon first):

    python3 -m torch.distributed.run --nproc-per-node 4 benches/python/many_rounds.py --json rounds-4.json

For every collective and size (bytes per rank; the all-gather's output is N times that):
fresh random int32 data, a synchronise and a barrier, then CUDA events around `--calls`
back-to-back calls on the current stream (eager), or the same calls captured once into a CUDA
graph and replayed; time per call = elapsed / calls, the slowest rank's, median over
`--repeats` after a warm-up. Every timed loop is verified on every rank: the
in-place sums give sum(inputs) * N**(calls - 1) wrapping at 2**32, the all-gather every rank's
input in rank order, the broadcast the root's input. On one GPU every rank's copies share its
one link, so the figures say how much the rounds move through it, not what N cards do; and
under MPS there, eager calls of the rounds made back to back take milliseconds where graph
replays take a fraction of one, though the host enqueues them in a fraction (the calls'
work on several hardware queues: benches/probes/eager_rounds.py), so compare builds by the
graph column.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import geforce_p2p.distributed as gpd
from geforce_p2p import _native


def parse_sizes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for item in text.split(","):
        item = item.strip().upper()
        out.append(int(item[:-1]) * units[item[-1]] if item[-1] in units else int(item))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256K,1M,4M,16M", help="bytes per rank, comma-separated (K, M suffixes)")
    ap.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    comm = gpd.Communicator.from_group(device=device, peer_timeout=60.0)
    rows = []
    for op in args.ops.split(","):
        for size in parse_sizes(args.sizes):
            n = size // 4
            buf = torch.empty(n, dtype=torch.int32, device=device)
            out = torch.empty(n * world, dtype=torch.int32, device=device) if op == "all_gather" else None

            def call():
                if op == "all_reduce":
                    comm.all_reduce(buf)
                elif op == "all_gather":
                    comm.all_gather_into_tensor(out, buf)
                else:
                    comm.broadcast(buf, src=world - 1)

            row = {"op": op, "bytes": size, "calls": args.calls}
            for mode in ("eager", "graph"):
                graph = None
                if mode == "graph":
                    # Captured on a side stream after one call there; replayed on fresh data.
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        call()
                        torch.cuda.synchronize()
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, stream=stream):
                            for _ in range(args.calls):
                                call()
                    torch.cuda.synchronize()
                times, host = [], []
                for repeat in range(args.repeats + 1):
                    g = torch.Generator().manual_seed(repeat * 7919 + size + world)
                    inputs = [torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int64) for _ in range(world)]
                    buf.copy_(inputs[rank].to(torch.int32))
                    torch.cuda.synchronize()
                    dist.barrier()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    enqueue = time.perf_counter()
                    if graph is not None:
                        graph.replay()
                    else:
                        for _ in range(args.calls):
                            call()
                    enqueue = time.perf_counter() - enqueue
                    end.record()
                    end.synchronize()
                    if op == "all_reduce":
                        want = (sum(inputs) * pow(world, args.calls - 1, 1 << 32)) & 0xFFFFFFFF
                        ok = torch.equal(buf.cpu().to(torch.int64) & 0xFFFFFFFF, want)
                    elif op == "all_gather":
                        ok = torch.equal(out.cpu().to(torch.int64), torch.cat(inputs))
                    else:
                        ok = torch.equal(buf.cpu().to(torch.int64), inputs[world - 1])
                    assert ok, "rank %d: %s %s %d B repeat %d: wrong result" % (rank, op, mode, size, repeat)
                    slowest = torch.tensor([start.elapsed_time(end) * 1000, enqueue * 1e6]) / args.calls
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                    if repeat > 0:  # the first is the warm-up
                        times.append(slowest[0].item())
                        host.append(slowest[1].item())
                row[mode + "_us"] = statistics.median(times)
                row[mode + "_host_us"] = statistics.median(host)
                if mode == "eager":
                    _native.bench.trace_start()
                    call()
                    row["eager_driver_calls"] = len(_native.bench.trace_finish()) - 1  # less its "finish" mark
                    torch.cuda.synchronize()
                del graph
            rows.append(row)
            if rank == 0:
                print("op=%s bytes=%d eager_us=%.1f (host %.1f, %d driver calls) graph_us=%.1f (host %.1f) "
                      "graph_GB/s-per-rank=%.2f"
                      % (op, size, row["eager_us"], row["eager_host_us"], row["eager_driver_calls"], row["graph_us"],
                         row["graph_host_us"], size / row["graph_us"] / 1e3), flush=True)
    comm.close()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"world": world, "gpus": torch.cuda.device_count(), "dtype": "int32",
                       "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), "rows": rows}, f, indent=2)
            f.write("\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
