"""The two-level plan of a gp2p group across hosts (geforce_p2p._hosts), on plain Python
numbers, no torch: for 1-4 hosts x 1-8 ranks, ranks in host order and interleaved, lengths
smaller than, equal to and not divisible by the ranks, every stage run as the backend runs it
(geforce_p2p._two_level) and every rank's result checked against the flat collective."""

import itertools
import random

import pytest

from geforce_p2p._hosts import HOST_ID_VAR, Hosts, host_id, shards

FOLDS = {"sum": lambda a, b: a + b, "max": max, "min": min, "prod": lambda a, b: a * b}


def layouts(hosts, local):
    """Each rank's host name: grouped by host, interleaved, and shuffled."""
    world = hosts * local
    grouped = ["h%d" % (r // local) for r in range(world)]
    interleaved = ["h%d" % (r % hosts) for r in range(world)]
    shuffled = list(grouped)
    random.Random(hosts * 31 + local).shuffle(shuffled)
    return [grouped, interleaved, shuffled]


def fold(values, op):
    acc = values[0]
    for v in values[1:]:
        acc = FOLDS[op](acc, v)
    return acc


def local_reduce_scatter(plan, wholes, op):
    """Each host's reduce-scatter: rank r's shard l of its host's fold, its local rank l."""
    out = {}
    for ranks in plan.members:
        n = len(wholes[ranks[0]])
        parts = len(ranks)
        size = n // parts
        for l, r in enumerate(ranks):
            out[r] = [fold([wholes[q][i] for q in ranks], op) for i in range(l * size, (l + 1) * size)]
    return out


def two_level_all_reduce(plan, inputs, op):
    """What TwoLevel.all_reduce computes on every rank: pad to `local` shards, reduce-scatter
    inside each host, all-reduce each shard across hosts, all-gather inside each host."""
    n, local = len(inputs[0]), plan.local
    size = -(-n // local)
    padded = {r: list(x) + [0] * (size * local - n) for r, x in enumerate(inputs)}
    shard = local_reduce_scatter(plan, padded, op)
    across = {r: [fold([shard[q][i] for q in plan.across(r)], op) for i in range(size)] for r in shard}
    return {r: sum((across[q] for q in plan.local_ranks(r)), [])[:n] for r in across}


def two_level_all_gather(plan, inputs):
    """TwoLevel.all_gather_into_tensor: across hosts first, then inside the host, then each
    part put where its rank goes (gathered_index)."""
    from_hosts = {r: sum((inputs[q] for q in plan.across(r)), []) for r in range(len(inputs))}
    out = {}
    for r in from_hosts:
        gathered = sum((from_hosts[q] for q in plan.local_ranks(r)), [])
        n = len(inputs[0])
        out[r] = sum((gathered[plan.gathered_index(q) * n:(plan.gathered_index(q) + 1) * n]
                      for q in range(len(inputs))), [])
    return out


def two_level_reduce_scatter(plan, wholes, op):
    """TwoLevel.reduce_scatter_tensor: each host's ranks fold, for local rank l, the parts of
    l's peers on every host; across hosts those are all-reduced; each rank keeps its own."""
    world, count = len(wholes), plan.count
    n = len(wholes[0]) // world
    out = {}
    for r in range(world):
        ranks = plan.local_ranks(r)
        arranged = {q: sum((wholes[q][p * n:(p + 1) * n] for s in ranks for p in plan.across(s)), [])
                    for q in ranks}
        mid = local_reduce_scatter(Hosts(["x"] * len(ranks)), [arranged[q] for q in ranks], op)
        out[r] = mid[plan.local_rank(r)]
    result = {}
    for r in range(world):
        summed = [fold([out[q][i] for q in plan.across(r)], op) for i in range(count * n)]
        h = plan.host_of(r)
        result[r] = summed[h * n:(h + 1) * n]
    return result


@pytest.mark.parametrize("hosts,local", list(itertools.product(range(1, 5), range(1, 9))))
def test_two_levels_give_every_rank_the_flat_result(hosts, local):
    world = hosts * local
    rng = random.Random(hosts * 100 + local)
    for names in layouts(hosts, local):
        plan = Hosts(names)
        assert (plan.count, plan.local) == (hosts, local)
        # Each local rank's group across hosts holds one rank of every host, and together
        # they hold every rank once.
        groups = {tuple(plan.across(r)) for r in range(world)}
        assert sorted(r for g in groups for r in g) == list(range(world))
        assert all(sorted({plan.host_of(r) for r in g}) == list(range(hosts)) for g in groups)
        for n in sorted({1, max(1, local - 1), local, world + 1, 3 * world + 2}):
            inputs = [[rng.randint(-9, 9) for _ in range(n)] for _ in range(world)]
            for op in FOLDS:
                want = [fold([x[i] for x in inputs], op) for i in range(n)]
                got = two_level_all_reduce(plan, inputs, op)
                assert all(got[r] == want for r in range(world)), (names, n, op)
            gathered = two_level_all_gather(plan, inputs)
            assert all(gathered[r] == sum(inputs, []) for r in range(world)), (names, n)
        wholes = [[rng.randint(-9, 9) for _ in range(world * 3)] for _ in range(world)]
        got = two_level_reduce_scatter(plan, wholes, "sum")
        for r in range(world):
            assert got[r] == [sum(w[r * 3 + i] for w in wholes) for i in range(3)], (names, r)


def test_shards_cover_the_buffer_in_order_with_equal_sizes_first():
    for n in range(0, 40):
        for parts in range(1, 9):
            bounds = shards(n, parts)
            assert len(bounds) == parts and bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), (n, parts)
            size = -(-n // parts)
            assert all(stop - start in (size, 0) or stop == n for start, stop in bounds), (n, parts, bounds)
    assert shards(7, 2) == [(0, 4), (4, 7)] and shards(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    with pytest.raises(ValueError, match="parts >= 1"):
        shards(4, 0)


def test_hosts_holding_different_numbers_of_ranks_are_refused_by_name():
    with pytest.raises(ValueError, match="ranks per host: 2 on a, 1 on b; .* the same number on every host"):
        Hosts(["a", "b", "a"])
    with pytest.raises(ValueError, match="empty"):
        Hosts([])
    plan = Hosts(["b", "a", "b", "a"])
    assert plan.names == ["b", "a"], "hosts in the order their first rank appears"
    assert [plan.gathered_index(r) for r in range(4)] == [0, 1, 2, 3]


def test_the_host_is_the_environments_where_set_else_the_name_and_boot_id():
    assert host_id({HOST_ID_VAR: " fake-host-1 "}) == "fake-host-1"
    here = host_id({})
    assert here == host_id({HOST_ID_VAR: ""}), "empty counts as unset"
    import socket

    assert here.split(":")[0] == socket.gethostname()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    assert here == (socket.gethostname() + ":" + boot if boot else socket.gethostname())
