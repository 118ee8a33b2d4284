"""All-reduce latency among N processes, for regressions: eager and replayed from a CUDA graph,
and the host time a call costs through the communicator and through torch.distributed.

Launch with torchrun, N processes (GPU r modulo the GPUs visible; on one GPU start an MPS
daemon first, or the processes take turns in ~2 ms time slices):

    python3 -m torch.distributed.run --nproc-per-node 4 benches/python/many_latency.py --json many-4.json

For every size (8 B to 4 MiB by default, int32 sum): fresh random data, a synchronise, then
CUDA events around `--calls` back-to-back in-place all-reduces on the current stream (time per
call = elapsed / calls), and the same calls captured once into a CUDA graph and replayed;
medians over `--repeats`. Every timed loop is verified: `calls` in-place sums of N ranks give
sum(inputs) * N**(calls - 1), wrapping at 2**32. Host time per call: wall time of the loop
that enqueues the calls (no synchronisation inside it), through `Communicator.all_reduce`,
through `dist.all_reduce` on the `gp2p` backend (up to 64 KiB, where the host bounds a call),
and through what vLLM and sglang call, `should_custom_ar` then `custom_all_reduce` on a
`CustomAllreduce` over the same communicator (`host_server_us`, for the sizes it takes; its
result is a new tensor, not summed into `buf`), and its check alone (`host_server_check_us`).
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


def sizes(text):
    lo, hi = (int(x) for x in text.split(":"))
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8:4194304", help="bytes LO:HI, every 4x (default 8 B to 4 MiB)")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    gpd.register_backend()
    dist.init_process_group("gp2p")
    # The default group is gp2p's: the id goes over a gloo group of the same ranks.
    cpu = dist.new_group(backend="gloo")
    comm = gpd.Communicator.from_group(cpu, device, peer_timeout=60.0)
    # The object servers call, over the same communicator.
    server = gpd.CustomAllreduce(comm)
    rows = []
    for size in sizes(args.sizes):
        n = max(1, size // 4)
        calls = args.calls if size <= (1 << 20) else max(5, args.calls // 5)
        buf = torch.empty(n, dtype=torch.int32, device=device)
        row = {"bytes": n * 4, "calls": calls}
        for mode in ("eager", "graph"):
            graph = None
            if mode == "graph":
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    comm.all_reduce(buf)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        for _ in range(calls):
                            comm.all_reduce(buf)
            times = []
            for repeat in range(args.repeats + 1):
                g = torch.Generator().manual_seed(repeat * 7919 + size)
                inputs = [torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int64) for _ in range(world)]
                buf.copy_(inputs[rank].to(torch.int32))
                torch.cuda.synchronize()
                dist.barrier(group=cpu)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                if graph is not None:
                    graph.replay()
                else:
                    for _ in range(calls):
                        comm.all_reduce(buf)
                end.record()
                end.synchronize()
                want = (sum(inputs) * pow(world, calls - 1, 1 << 32)) & 0xFFFFFFFF
                got = buf.cpu().to(torch.int64) & 0xFFFFFFFF
                assert torch.equal(got, want), "rank %d: %s %d B repeat %d: wrong result" % (rank, mode, size, repeat)
                if repeat > 0:  # the first is the warm-up
                    times.append(start.elapsed_time(end) * 1000 / calls)
            row[mode + "_us"] = statistics.median(times)
        timed = [("comm", lambda: comm.all_reduce(buf))]
        if size <= (64 << 10):
            timed.append(("dist", lambda: dist.all_reduce(buf)))
        if server.should_custom_ar(buf):
            # What vLLM's and sglang's all-reduce calls on their custom all-reduce object.
            timed.append(("server", lambda: server.custom_all_reduce(buf) if server.should_custom_ar(buf) else None))
            timed.append(("server_check", lambda: server.should_custom_ar(buf)))
        if True:
            for what, call in timed:
                host = []
                for _ in range(args.repeats + 1):
                    torch.cuda.synchronize()
                    dist.barrier(group=cpu)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        call()
                    host.append((time.perf_counter() - t0) * 1e6 / calls)
                torch.cuda.synchronize()
                row["host_%s_us" % what] = statistics.median(host[1:])
        rows.append(row)
        if rank == 0:
            print(" ".join("%s=%s" % (k, round(v, 2) if isinstance(v, float) else v) for k, v in row.items()),
                  flush=True)
    comm.close()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"world": world, "gpus": torch.cuda.device_count(), "dtype": "int32", "op": "sum",
                       "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), "rows": rows}, f, indent=2)
            f.write("\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
