"""Host time a call of several parts, each timed call by call with the parts taking turns call
by call, so that every part sees the same machine, GPU queue and peers (the figures of parts
timed loop after loop swung by 2 µs between neighbours on the device machines). Each turn
goes through the parts in a new order: in one fixed cycle a part always ran after the same
neighbour, and one that ran after a call down the same path (native.serves_torch after
should_custom_ar) came out 0.2-0.3 µs faster than the same call after another part. Shared by
server_host_parts.py and backend_host_parts.py, which run it on every rank of a torchrun job
(every rank draws the same orders, so the collectives among the parts pair up).
"""
import random
import statistics
import time

import torch
import torch.distributed as dist


def time_in_turns(parts, rounds, calls):
    """{name: [µs of each call]} for `parts` (a list of (name, function)), over `rounds` rounds
    of `calls` turns after a warm-up round, each turn in its own order (the same on every
    rank); every rank synchronises its GPU and meets the others before each round."""
    res = {name: [] for name, _ in parts}
    clock = time.perf_counter_ns
    orders = random.Random(20261202)
    turn = list(parts)
    for r in range(rounds + 1):
        torch.cuda.synchronize()
        dist.barrier()
        for _ in range(calls):
            orders.shuffle(turn)
            for name, f in turn:
                t0 = clock()
                f()
                if r:
                    res[name].append((clock() - t0) / 1e3)
    torch.cuda.synchronize()
    dist.barrier()
    return res


def line(name, times, width=45):
    """`name`, its median and quartiles, and how many calls."""
    q = statistics.quantiles(times, n=4)
    return "%-*s %6.2f us   (quartiles %.2f-%.2f, %d calls)" % (width, name, statistics.median(times), q[0], q[2],
                                                               len(times))
