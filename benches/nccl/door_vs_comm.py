"""nccl-tests through the NCCL door beside `gp2p bench comm` of the communicator itself, size
by size: the door's bus bandwidth (out of place and in place, the lower) over the
communicator's, and whether it reaches the NCCL door issue's 0.95 from 64 KiB on.

    python3 benches/nccl/door_vs_comm.py DOOR.txt... COMM.json... [--min-bytes 65536] [--want 0.95]

DOOR.txt: nccl-tests runs (`python3 -m geforce_p2p.nccl -- all_reduce_perf ...`, one type and
op; several tables in one file count as several runs); COMM.json: `gp2p bench comm
<collective> --json` at the same ranks and sizes. Given several runs of either, each size takes
the median of its runs (the door's out of place and in place apart), so runs taken in turns
on one machine compare as a whole rather than by their luckiest or unluckiest run. Both count
busbw as nccl-tests does. Exit status 1 where a row misses the bar or a row of either has
wrong elements, so a driver script can say so.
"""

import argparse
import json
import statistics
import sys


def door_rows(path):
    """{bytes: [(busbw out of place, busbw in place, wrong), ...]}, a tuple per table row."""
    rows = {}
    for line in open(path, errors="replace"):
        f = line.split()
        if len(f) < 13 or line.startswith("#") or not f[0].isdigit():
            continue
        wrong = sum(int(w) for w in (f[8], f[12]) if w.isdigit())
        rows.setdefault(int(f[0]), []).append((float(f[7]), float(f[11]), wrong))
    return rows


def comm_rows(path):
    """{bytes: [(busbw, wrong)]} from a gp2p bench report."""
    report = json.load(open(path))
    return {row["bytes"]: [(row["busbw"], row.get("wrong", 0))] for row in report["rows"]}


def merged(per_file):
    """Each size's runs over every file: {bytes: [run, ...]}."""
    runs = {}
    for rows in per_file:
        for size, found in rows.items():
            runs.setdefault(size, []).extend(found)
    return runs


def door_medians(runs):
    """{bytes: (median oop, median ip, total wrong, runs)} over the door's runs."""
    return {
        size: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs), sum(r[2] for r in rs), len(rs))
        for size, rs in runs.items()
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="nccl-tests outputs (any name) and gp2p bench reports (.json), one or more of each")
    parser.add_argument("--min-bytes", type=int, default=64 << 10)
    parser.add_argument("--want", type=float, default=0.95)
    args = parser.parse_args(argv)
    reports = [f for f in args.files if f.endswith(".json")]
    tables = [f for f in args.files if not f.endswith(".json")]
    if not reports or not tables:
        parser.error("give at least one nccl-tests output and one gp2p bench report (.json)")
    door = door_medians(merged(door_rows(f) for f in tables))
    comm_runs = merged(comm_rows(f) for f in reports)
    # A run with wrong elements counts as wrong, not as a rate.
    comm = {size: statistics.median(bw for bw, _ in rs) for size, rs in comm_runs.items()}
    comm_wrong = {size: sum(w for _, w in rs) for size, rs in comm_runs.items()}
    print(f"{'bytes':>12} {'door oop':>9} {'door ip':>9} {'comm':>9} {'ratio':>7}  runs  (door busbw / comm busbw, the lower of the two; medians)")
    ok = True
    for size in sorted(set(door) & set(comm)):
        oop, inp, wrong, runs = door[size]
        wrong += comm_wrong[size]
        ratio = min(oop, inp) / comm[size] if comm[size] > 0 else float("nan")
        short = size >= args.min_bytes and not ratio >= args.want
        ok &= not short and wrong == 0
        mark = "  wrong %d" % wrong if wrong else ("  below %.2f" % args.want if short else "")
        print(f"{size:>12} {oop:>9.2f} {inp:>9.2f} {comm[size]:>9.2f} {ratio:>7.3f} {runs:>2}/{len(comm_runs[size]):<2}{mark}")
    missing = sorted(set(door) ^ set(comm))
    if missing:
        print(f"sizes in one file only: {missing}")
    print("door/comm:", "every size from %d B at %.2f or more" % (args.min_bytes, args.want) if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
