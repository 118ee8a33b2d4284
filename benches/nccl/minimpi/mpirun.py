#!/usr/bin/env python3
"""Start N processes of one command as the ranks of minimpi (mpi.h, mpi.c beside this file).

    python3 benches/nccl/minimpi/mpirun.py -n 4 -- build/all_reduce_perf -b 1M -e 64M

Each rank gets MINIMPI_RANK, MINIMPI_SIZE, MINIMPI_SLOT_BYTES and MINIMPI_SEG, a file in a
folder only this user can open, made here and removed at the end. When a rank exits with an
error, the others are stopped (TERM, then KILL after 5 s) and that rank's status is returned;
a signal to this launcher goes to every rank. Everything else in the environment passes on, so
`python3 -m geforce_p2p.nccl -- python3 benches/nccl/minimpi/mpirun.py -n 2 -- ...` runs every
rank through the NCCL door.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

# Kept equal to mpi.c's HEADER_BYTES and MAX_RANKS.
HEADER_BYTES = 16 * 64 * 64
MAX_RANKS = 64


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "-np", dest="ranks", type=int, required=True, help="number of ranks (1 to 64)")
    parser.add_argument("--slot-bytes", type=int, default=1 << 20,
                        help="bytes a rank may pass in one collective (default 1 MiB)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run: give it after --")
    if not 1 <= args.ranks <= MAX_RANKS:
        parser.error(f"-n {args.ranks}: minimpi runs 1 to {MAX_RANKS} ranks")
    if args.slot_bytes < 64:
        parser.error(f"--slot-bytes {args.slot_bytes}: at least 64")

    folder = tempfile.mkdtemp(prefix="minimpi-")  # mode 0700: no other user opens the segment
    segment = os.path.join(folder, "segment")
    with open(segment, "wb") as f:
        f.truncate(HEADER_BYTES + args.ranks * args.slot_bytes)
    ranks = []

    def forward(signum, _frame):
        for p in ranks:
            if p.poll() is None:
                p.send_signal(signum)
        if len(ranks) < args.ranks:  # still starting them: start no more
            raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    try:
        for rank in range(args.ranks):
            env = dict(os.environ, MINIMPI_SEG=segment, MINIMPI_RANK=str(rank), MINIMPI_SIZE=str(args.ranks),
                       MINIMPI_SLOT_BYTES=str(args.slot_bytes))
            ranks.append(subprocess.Popen(command, env=env))
        return wait(ranks)
    except FileNotFoundError as e:
        print(f"mpirun.py: cannot start {command[0]}: {e}", file=sys.stderr)
        return 127
    except KeyboardInterrupt:
        print("mpirun.py: stopped by a signal while starting the ranks", file=sys.stderr)
        return 130
    finally:
        stop(ranks)
        os.unlink(segment)
        os.rmdir(folder)


def wait(ranks):
    """Every rank's end; the first failure's status (the lowest rank among those found failed
    at one look), after stopping the rest."""
    while True:
        statuses = [p.poll() for p in ranks]
        failed = [(i, s) for i, s in enumerate(statuses) if s not in (None, 0)]
        if failed:
            rank, status = failed[0]
            if any(s is None for s in statuses):
                print(f"mpirun.py: rank {rank} ended with status {status}; stopping the others", file=sys.stderr)
            stop(ranks)
            return status if status > 0 else 128 - status
        if all(s == 0 for s in statuses):
            return 0
        time.sleep(0.02)


def stop(ranks):
    for p in ranks:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in ranks:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
