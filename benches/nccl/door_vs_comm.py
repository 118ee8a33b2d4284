"""nccl-tests through the NCCL door beside `gp2p bench comm` of the communicator itself, size
by size: the door's bus bandwidth (out of place and in place, the lower) over the
communicator's, and whether it reaches the NCCL door issue's 0.95 from 64 KiB on.

    python3 benches/nccl/door_vs_comm.py DOOR.txt COMM.json [--min-bytes 65536] [--want 0.95]

DOOR.txt: an nccl-tests run (`python3 -m geforce_p2p.nccl -- all_reduce_perf ...`, one type
and op); COMM.json: `gp2p bench comm <collective> --json` at the same ranks and sizes. Both
count busbw as nccl-tests does. Exit status 1 where a row misses the bar or a row has
`#wrong` other than 0, so a driver script can say so.
"""

import argparse
import json
import sys


def door_rows(path):
    """{bytes: (busbw out of place, busbw in place, wrong)} from nccl-tests' table."""
    rows = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) < 13 or line.startswith("#") or not f[0].isdigit():
            continue
        wrong = sum(int(w) for w in (f[8], f[12]) if w.isdigit())
        rows[int(f[0])] = (float(f[7]), float(f[11]), wrong)
    return rows


def comm_rows(path):
    """{bytes: busbw} from a gp2p bench report."""
    report = json.load(open(path))
    return {row["bytes"]: row["busbw"] for row in report["rows"] if row.get("wrong", 0) == 0}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("door")
    parser.add_argument("comm")
    parser.add_argument("--min-bytes", type=int, default=64 << 10)
    parser.add_argument("--want", type=float, default=0.95)
    args = parser.parse_args(argv)
    door, comm = door_rows(args.door), comm_rows(args.comm)
    print(f"{'bytes':>12} {'door oop':>9} {'door ip':>9} {'comm':>9} {'ratio':>7}  (door busbw / comm busbw, the lower of the two)")
    ok = True
    for size in sorted(set(door) & set(comm)):
        oop, inp, wrong = door[size]
        ratio = min(oop, inp) / comm[size] if comm[size] > 0 else float("nan")
        short = size >= args.min_bytes and not ratio >= args.want
        ok &= not short and wrong == 0
        mark = "  wrong %d" % wrong if wrong else ("  below %.2f" % args.want if short else "")
        print(f"{size:>12} {oop:>9.2f} {inp:>9.2f} {comm[size]:>9.2f} {ratio:>7.3f}{mark}")
    missing = sorted(set(door) ^ set(comm))
    if missing:
        print(f"sizes in one file only: {missing}")
    print("door/comm:", "every size from %d B at %.2f or more" % (args.min_bytes, args.want) if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
