"""All-reduce with one process per GPU: geforce_p2p.distributed against NCCL, same processes.

Launch with torchrun, one process per GPU (2 to 8):

    python3 -m torch.distributed.run --nproc-per-node 4 benches/python/mp_allreduce.py --json mp.json

NCCL runs with NCCL_P2P_DISABLE=1 (its shared-memory path, what GeForce cards get); the gp2p
communicator is the one-process-per-GPU all-reduce (between two ranks one kernel up to its
max_bytes and the staged pipeline above; among more, the line kernel up to 64 KiB and the
two-shot legs above, as its cost model chooses). For every size: sum, fresh random data per
repeat, a barrier and a synchronise, then CUDA events around back-to-back in-place
all-reduces on the current stream (`--calls`, fewer for large sizes; time per call = elapsed /
calls, as nccl-tests reports), median over `--repeats`. Every timed loop is verified. Two
ranks sum float32 and check fl(a0 + a1) * 2**(calls - 1) exactly (doubling is exact in
binary); more ranks sum int32, whose sums wrap at 2**32 in any order, and check
sum(inputs) * N**(calls - 1) mod 2**32 exactly. busbw is nccl-tests': bytes / time * 2(N-1)/N.

From 1 MiB up the same run also times the duplex ceiling: every rank copies the size device
to pinned host and pinned host to device at once, on two streams, all ranks together (the
links' and the host's rates, measured in the run). `ceiling_over_gp2p` is that time over
gp2p's; `model_bound_us` is what the cost model's two-shot needs at those rates: a card
lands 2(N-1)/N of the buffer (the most it moves either way; two ranks: the buffer), so the
ceiling's time times max(1, 2(N-1)/N); `bound_over_gp2p` is that over gp2p's time.

Through the NCCL door, `--door` times the door (the "nccl" columns: torch's "nccl" backend
served by this library) against the communicator in the same processes and run, the door's
busbw figure, with ranks sharing a GPU where there are fewer GPUs than ranks:

    python3 -m geforce_p2p.nccl -- python3 -m torch.distributed.run --nproc-per-node 4 \
        benches/python/mp_allreduce.py --door --min-bytes 65536 --max-bytes 268435456 --json door-4.json
"""

import os
import sys

# NCCL reads its environment when its first communicator starts: set before torch loads.
# Forced, not defaulted: the comparison is with NCCL's shared-memory path (no P2P, no NVLS).
os.environ["NCCL_P2P_DISABLE"] = "1"
os.environ["NCCL_NVLS_ENABLE"] = "0"
# --one-visible-gpu: each rank sees its own GPU only (as device 0), so no process can make a
# context on the other's GPU; set before torch loads, as CUDA reads it once.
ONE_VISIBLE_GPU = "--one-visible-gpu" in sys.argv
if ONE_VISIBLE_GPU:
    _local = int(os.environ.get("LOCAL_RANK", "0"))
    _visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = _visible.split(",")[_local] if _visible else str(_local)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from compare_torch import bind_to_gpu_cpus  # noqa: E402  (beside this script)

import geforce_p2p.distributed as gpd  # noqa: E402

SMALL = [8, 32, 128, 512, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10]
LARGE = [256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
# Bytes moved per timed loop at most (calls shrink for large sizes, to at least 3).
LOOP_BYTES = 1 << 30
CEILING_FROM = 1 << 20


def dtype_for(world):
    """float32 between two ranks (checked exactly by doubling), int32 among more."""
    return torch.float32 if world == 2 else torch.int32


def inputs(numel, seed, world, device):
    """Every rank's input for one repeat (every rank makes all of them, to check results),
    drawn on the GPU: the same seed gives the same numbers on every rank's device."""
    out = []
    for r in range(world):
        g = torch.Generator(device=device).manual_seed(seed * 131 + r)
        if world == 2:
            out.append(torch.randn(numel, generator=g, dtype=torch.float32, device=device))
        else:
            out.append(torch.randint(-1000, 1000, (numel,), generator=g, dtype=torch.int32, device=device))
    return out


def wanted(data, world, calls):
    """What `calls` in-place sums of `data` leave in every rank's buffer."""
    if world == 2:
        return (data[0] + data[1]) * 2.0 ** (calls - 1)
    total = torch.stack([d.to(torch.int64) for d in data]).sum(0)
    wrapped = (total * pow(world, calls - 1, 1 << 32)) % (1 << 32)
    return torch.where(wrapped >= 1 << 31, wrapped - (1 << 32), wrapped).to(torch.int32)


def calls_for(size, args):
    return max(3, min(args.calls, LOOP_BYTES // size))


def duplex_us(size, device, repeats):
    """Median microseconds for `size` bytes device -> pinned host and pinned host -> device at
    once on two streams, every rank together (after a barrier)."""
    numel = size // 4
    dev_src = torch.randn(numel, device=device)
    dev_dst = torch.empty(numel, device=device)
    host_dst = torch.empty(numel, pin_memory=True)
    host_src = torch.randn(numel).pin_memory()
    up, down = torch.cuda.Stream(device), torch.cuda.Stream(device)
    times = []
    for rep in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        for s in (up, down):
            s.wait_event(start)
        with torch.cuda.stream(up):
            host_dst.copy_(dev_src, non_blocking=True)
        with torch.cuda.stream(down):
            dev_dst.copy_(host_src, non_blocking=True)
        for s in (up, down):
            torch.cuda.current_stream().wait_stream(s)
        end.record()
        end.synchronize()
        if rep > 0:
            times.append(start.elapsed_time(end) * 1e3)
    if not (torch.equal(host_dst, dev_src.cpu()) and torch.equal(dev_dst.cpu(), host_src)):
        raise SystemExit("duplex ceiling: a copy came back wrong")
    return statistics.median(times)


def timed(op, buf, calls):
    """Microseconds per call of `calls` back-to-back `op(buf)`, by CUDA events, and the
    host's microseconds per call to enqueue them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        op(buf)
    host = (time.perf_counter() - t0) * 1e6 / calls
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, host


class Graphed:
    """`calls` back-to-back `op(buf)` captured once as a CUDA graph (after one call on a side
    stream, as NCCL asks), replayed on `buf` refilled with fresh data: the GPU's own time per
    call, without the host's enqueue (how CUDA-graph users such as vLLM's decode call it)."""

    def __init__(self, op, numel, calls, device):
        self.buf = torch.zeros(numel, dtype=dtype_for(dist.get_world_size()), device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            op(self.buf)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        dist.barrier()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for _ in range(calls):
                op(self.buf)
        torch.cuda.synchronize()

    def __call__(self, buf, calls):
        self.buf.copy_(buf)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        self.graph.replay()
        end.record()
        end.synchronize()
        buf.copy_(self.buf)
        return start.elapsed_time(end) * 1e3 / calls, 0.0


def run(name, op, numel, args, rank, world, device, graphed=False):
    per_call, host_us = [], []
    calls = calls_for(numel * 4, args)
    if graphed:
        replay = Graphed(op, numel, calls, device)
        op_timed = lambda b, c: replay(b, c)
    else:
        op_timed = lambda b, c: timed(op, b, c)
    for rep in range(args.warmup + args.repeats):
        data = inputs(numel, numel * 1000 + rep, world, device)
        buf = data[rank].clone()
        us, host = op_timed(buf, calls)
        want = wanted(data, world, calls)
        got = buf
        if not torch.equal(got, want):
            bad = int((got != want).sum())
            raise SystemExit("%s: rank %d, %d B: %d of %d elements wrong" % (name, rank, numel * 4, bad, numel))
        if rep >= args.warmup:
            per_call.append(us)
            host_us.append(host)
    return statistics.median(per_call), per_call, statistics.median(host_us), host_us


def fmt(value, form="%.1f"):
    """`value` in `form`, or "-" where it was not measured."""
    return "-" if value is None else form % value


def list_contexts(rank):
    """Print which processes hold a context on which GPU (a process with a context on the
    other rank's GPU makes that GPU time-slice between the two)."""
    import subprocess

    dist.barrier()
    if rank == 0:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv"],
                             capture_output=True, text=True)
        print("compute processes (pid %d and its peer):\n%s" % (os.getpid(), out.stdout or out.stderr), flush=True)
    dist.barrier()


def main():
    # No abbreviations: --one-visible-gpu is read from sys.argv before torch loads, whole.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--calls", type=int, default=50, help="back-to-back calls per timed loop")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per size (median)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--max-bytes", type=int, default=1 << 30, help="the largest size timed")
    parser.add_argument("--small-max-bytes", type=int,
                        help="the communicator's one-kernel path up to this size (its max_bytes; "
                             "default the library's)")
    parser.add_argument("--slot-bytes", type=int, help="the pipeline's slot size (default the library's)")
    parser.add_argument("--chunk-blocks", type=int,
                        help="the most blocks of the one-kernel path's chunk kernel (default the library's)")
    parser.add_argument("--slots", type=int, help="the pipeline's slots per rank (default the library's)")
    parser.add_argument("--lines-max-bytes", type=int,
                        help="the largest all-reduce the one-kernel path runs with its line kernel (default the library's)")
    parser.add_argument("--min-bytes", type=int, default=0, help="the smallest size timed")
    parser.add_argument("--graph-max-bytes", type=int, default=0,
                        help="also time sizes up to this as CUDA-graph replays (GPU time only)")
    parser.add_argument("--one-visible-gpu", action="store_true",
                        help="each rank sees only its own GPU (CUDA_VISIBLE_DEVICES=LOCAL_RANK)")
    parser.add_argument("--list-contexts", action="store_true",
                        help="print nvidia-smi's compute processes per GPU once the communicator exists")
    parser.add_argument("--skip-nccl", action="store_true",
                        help="time the gp2p communicator only, with no NCCL communicator in the processes "
                             "(barriers through gloo): whether NCCL's presence changes gp2p's times")
    parser.add_argument("--door", action="store_true",
                        help="NCCL is the geforce-p2p door (launched under python -m geforce_p2p.nccl): ranks may "
                             "share a GPU, and the nccl columns are the door's")
    parser.add_argument("--bind-cpus", action="store_true",
                        help="run each rank on the CPUs local to its GPU (the PCI device's local_cpulist)")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 2 <= world <= 8:
        raise SystemExit("the gp2p communicator runs 2 to 8 ranks: launch with --nproc-per-node 2 to 8")
    local = 0 if ONE_VISIBLE_GPU else int(os.environ.get("LOCAL_RANK", rank))
    if world > torch.cuda.device_count():
        # Fewer GPUs than ranks (the one-H200 machine): ranks share them. NCCL refuses two
        # ranks on one GPU, and the times are the host's and the shared GPUs', not N links'.
        if not (args.skip_nccl or args.door):
            raise SystemExit("%d GPU(s) for %d ranks: pass --skip-nccl to share them (NCCL refuses to), "
                             "or --door under python -m geforce_p2p.nccl" % (torch.cuda.device_count(), world))
        local %= torch.cuda.device_count()
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    if args.bind_cpus:
        bind_to_gpu_cpus(local)
    if args.skip_nccl:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=device)
    limit = {} if args.small_max_bytes is None else {"max_bytes": args.small_max_bytes}
    comm = gpd.Communicator.from_group(device=local, **limit, slot_bytes=args.slot_bytes, slots=args.slots,
                                       chunk_blocks=args.chunk_blocks, lines_max_bytes=args.lines_max_bytes)
    if args.list_contexts:
        list_contexts(rank)
    rows = []
    for size in [s for s in SMALL + LARGE if args.min_bytes <= s <= args.max_bytes]:
        numel = size // 4
        nccl_op, gp2p_op = (lambda b: dist.all_reduce(b)), (lambda b: comm.all_reduce(b, "sum"))
        nccl = nccl_all = nccl_host = nccl_host_all = None
        if not args.skip_nccl:
            nccl, nccl_all, nccl_host, nccl_host_all = run("nccl", nccl_op, numel, args, rank, world, device)
        gp2p, gp2p_all, gp2p_host, gp2p_host_all = run("gp2p", gp2p_op, numel, args, rank, world, device)
        busbw = lambda us: size / us / 1e3 * max(1.0, 2.0 * (world - 1) / world) if us else None  # noqa: E731
        row = {"bytes": size, "dtype": "f32" if world == 2 else "i32", "op": "sum", "calls_per_loop": calls_for(size, args),
               "nccl_busbw_gbps": busbw(nccl), "gp2p_busbw_gbps": busbw(gp2p),
               "nccl_us": nccl, "gp2p_us": gp2p, "gp2p_over_nccl": gp2p / nccl if nccl else None,
               "nccl_us_all": nccl_all, "gp2p_us_all": gp2p_all,
               "nccl_host_us": nccl_host, "gp2p_host_us": gp2p_host,
               "nccl_host_us_all": nccl_host_all, "gp2p_host_us_all": gp2p_host_all}
        if size <= args.graph_max_bytes:
            g_gp2p = run("gp2p graph", gp2p_op, numel, args, rank, world, device, graphed=True)[0]
            row.update(gp2p_graph_us=g_gp2p)
            if not args.skip_nccl:
                g_nccl = run("nccl graph", nccl_op, numel, args, rank, world, device, graphed=True)[0]
                row.update(nccl_graph_us=g_nccl, graph_gp2p_over_nccl=g_gp2p / g_nccl)
        if size >= CEILING_FROM:
            ceiling = duplex_us(size, device, args.repeats)
            bound = ceiling * max(1.0, 2.0 * (world - 1) / world)
            row.update(duplex_us=ceiling, ceiling_over_gp2p=ceiling / gp2p,
                       ceiling_over_nccl=ceiling / nccl if nccl else None,
                       model_bound_us=bound, bound_over_gp2p=bound / gp2p)
        rows.append(row)
        torch.cuda.empty_cache()
    comm.close()
    if rank == 0:
        print("%d ranks, %s sum%s" % (world, rows[0]["dtype"] if rows else "-",
                                      " (nccl: the geforce-p2p door)" if args.door else ""))
        print("%10s %10s %10s %8s %9s %9s %10s %8s %8s" % ("bytes", "nccl us", "gp2p us", "ratio", "nccl bus", "gp2p bus",
                                                         "duplex us", "of dplx", "of bound"))
        for r in rows:
            ceiling = ("%10.1f %8.3f %8.3f" % (r["duplex_us"], r["ceiling_over_gp2p"], r["bound_over_gp2p"])
                       if "duplex_us" in r else "")
            nccl, ratio = ("%10.1f" % r["nccl_us"], "%8.3f" % r["gp2p_over_nccl"]) if r["nccl_us"] else ("-", "-")
            print("%10d %10s %10.1f %8s %9s %9.2f %s" % (r["bytes"], nccl, r["gp2p_us"], ratio,
                                                       fmt(r["nccl_busbw_gbps"], "%.2f"), r["gp2p_busbw_gbps"], ceiling))
        print("host enqueue us per call (nccl/gp2p), graph replays (nccl/gp2p us, ratio), gp2p's loops (us per call):")
        for r in rows:
            graph = ("  graph %s/%.1f %s" % (fmt(r.get("nccl_graph_us")), r["gp2p_graph_us"],
                                             fmt(r.get("graph_gp2p_over_nccl"), "%.3f"))
                     if "gp2p_graph_us" in r else "")
            loops = " ".join("%.1f" % us for us in r["gp2p_us_all"])
            print("%10d host %s/%.1f%s  loops %s" % (r["bytes"], fmt(r["nccl_host_us"]), r["gp2p_host_us"], graph, loops))
        if args.json:
            meta = {"gpus": [torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())],
                    "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                    "env": {k: os.environ.get(k) for k in ("NCCL_P2P_DISABLE", "NCCL_NVLS_ENABLE")},
                    "nccl_is_the_door": args.door,
                    "processes": world, "calls_per_loop": args.calls, "repeats": args.repeats,
                    "warmup": args.warmup, "small_max_bytes": comm.max_bytes,
                    "slot_bytes": args.slot_bytes, "slots": args.slots, "chunk_blocks": args.chunk_blocks,
                    "lines_max_bytes": args.lines_max_bytes,
                    "rows": rows}
            with open(args.json, "w") as f:
                json.dump(meta, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
