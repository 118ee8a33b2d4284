"""All-reduce with one process per GPU: geforce_p2p.distributed against NCCL, same processes.

Launch with torchrun, one process per GPU:

    python3 -m torch.distributed.run --nproc-per-node 2 benches/python/mp_allreduce.py --json mp.json

NCCL runs with NCCL_P2P_DISABLE=1 (its shared-memory path, what GeForce pairs get); the gp2p
communicator is the one-process-per-GPU small all-reduce. For every size: f32 sum, fresh
random data per repeat, a barrier and a synchronise, then CUDA events around `--calls`
back-to-back in-place all-reduces on the current stream (time per call = elapsed / calls,
as nccl-tests reports), median over `--repeats`. Every timed loop is verified: two ranks'
in-place sums give fl(a0 + a1) * 2**(calls - 1) exactly (doubling is exact in binary).
"""

import os

# NCCL reads its environment when its first communicator starts: set before torch loads.
# Forced, not defaulted: the comparison is with NCCL's shared-memory path (no P2P, no NVLS).
os.environ["NCCL_P2P_DISABLE"] = "1"
os.environ["NCCL_NVLS_ENABLE"] = "0"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import geforce_p2p.distributed as gpd  # noqa: E402

SIZES = [8, 32, 128, 512, 2 << 10, 8 << 10, 32 << 10, 64 << 10]


def inputs(numel, seed, world):
    """Every rank's input for one repeat (every rank makes all of them, to check results)."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 131 + r)
        out.append(torch.randn(numel, generator=g, dtype=torch.float32))
    return out


def timed(op, buf, calls):
    """Microseconds per call of `calls` back-to-back `op(buf)`, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        op(buf)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def run(name, op, numel, args, rank, world, device):
    per_call = []
    for rep in range(args.warmup + args.repeats):
        data = inputs(numel, numel * 1000 + rep, world)
        buf = data[rank].to(device)
        us = timed(op, buf, args.calls)
        want = (data[0] + data[1]) * 2.0 ** (args.calls - 1)
        got = buf.cpu()
        if not torch.equal(got, want):
            bad = int((got != want).sum())
            raise SystemExit("%s: rank %d, %d B: %d of %d elements wrong" % (name, rank, numel * 4, bad, numel))
        if rep >= args.warmup:
            per_call.append(us)
    return statistics.median(per_call), per_call


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="back-to-back calls per timed loop")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per size (median)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="write the results here (rank 0)")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != 2:
        raise SystemExit("the gp2p communicator runs two ranks: launch with --nproc-per-node 2")
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    box = [gpd.unique_id() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    comm = gpd.Communicator(box[0], rank, world, local)
    rows = []
    for size in SIZES:
        numel = size // 4
        nccl, nccl_all = run("nccl", lambda b: dist.all_reduce(b), numel, args, rank, world, device)
        gp2p, gp2p_all = run("gp2p", lambda b: comm.all_reduce(b, "sum"), numel, args, rank, world, device)
        rows.append({"bytes": size, "dtype": "f32", "op": "sum", "nccl_us": nccl, "gp2p_us": gp2p,
                     "gp2p_over_nccl": gp2p / nccl, "nccl_us_all": nccl_all, "gp2p_us_all": gp2p_all})
    comm.close()
    if rank == 0:
        print("%10s %10s %10s %8s" % ("bytes", "nccl us", "gp2p us", "ratio"))
        for r in rows:
            print("%10d %10.1f %10.1f %8.3f" % (r["bytes"], r["nccl_us"], r["gp2p_us"], r["gp2p_over_nccl"]))
        if args.json:
            meta = {"gpus": [torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())],
                    "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                    "env": {k: os.environ.get(k) for k in ("NCCL_P2P_DISABLE", "NCCL_NVLS_ENABLE")},
                    "processes": world, "calls_per_loop": args.calls, "repeats": args.repeats,
                    "warmup": args.warmup, "rows": rows}
            with open(args.json, "w") as f:
                json.dump(meta, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
