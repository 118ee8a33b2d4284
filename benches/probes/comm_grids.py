"""Check the one-process-per-GPU communicator's one-kernel all-reduce at every chunk grid it
makes (32 blocks of 1-4 chunks, 64 of 4-8, 96-128 of 8 and more): two processes, each rank on
its own GPU where there are two, both on GPU 0 where there is one (their kernels then take
turns in time slices, so each wait lasts until the other's turn: slow, but every result is
the same). Every element is checked against a float64 sum (or max) computed on the CPU.

    python3 benches/probes/comm_grids.py

Prints one line per size and exits non-zero on the first wrong element.
"""

import os
import subprocess
import sys

import torch

import geforce_p2p.distributed as gpd

SIZES = [(128 << 10) + 4, 256 << 10, 512 << 10, 1 << 20, 2 << 20, (3 << 20) + 64, 4 << 20]


def rank_main(uid, rank):
    device = rank if torch.cuda.device_count() >= 2 else 0
    torch.cuda.set_device(device)
    comm = gpd.Communicator(uid, rank, 2, device=device, peer_timeout=30.0)
    for i, size in enumerate(SIZES):
        for op, dtype in (("sum", torch.float32), ("max", torch.bfloat16), ("sum", torch.int32)):
            n = size // torch.tensor([], dtype=dtype).element_size()
            gens = [torch.Generator().manual_seed(1000 * i + 10 * r + len(op)) for r in range(2)]
            inputs = [torch.randint(-1000, 1000, (n,), generator=g).to(dtype) for g in gens]
            t = inputs[rank].to("cuda:%d" % device)
            comm.all_reduce(t, op=op)
            a, b = (x.double() for x in inputs)
            want = (a + b) if op == "sum" else torch.maximum(a, b)
            got = t.cpu().double()
            bad = int((got != want.to(dtype).double()).sum())
            if rank == 0:
                print("%9d B %-4s %-14s %s" % (size, op, str(dtype), "ok" if bad == 0 else "%d wrong" % bad), flush=True)
            if bad:
                raise SystemExit("rank %d: %d B %s %s: %d of %d elements wrong" % (rank, size, op, dtype, bad, n))
    comm.close()


def main():
    if len(sys.argv) == 3:
        rank_main(sys.argv[1], int(sys.argv[2]))
        return
    uid = gpd.unique_id()
    peer = subprocess.Popen([sys.executable, __file__, uid, "1"], env=os.environ.copy())
    try:
        rank_main(uid, 0)
    finally:
        if peer.wait(timeout=120) != 0:
            raise SystemExit("rank 1 failed")
    print("every size, op and dtype right on both ranks")


if __name__ == "__main__":
    main()
