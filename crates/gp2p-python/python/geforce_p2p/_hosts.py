"""Several hosts in one ``gp2p`` process group: which rank is on which host, and the two-level
plan the backend runs across them (this library inside each host, an engine built for networks
between hosts, as Horovod's hierarchical all-reduce does). No torch.

A host is what ``host_id()`` says: the host name and the boot id, as NCCL tells hosts apart,
or ``GP2P_HOST_ID`` where it is set (so one machine can act as several hosts in tests). Every
host must hold the same number of the group's ranks (``local`` each); the group's ranks need
not be grouped by host.

An all-reduce of ``n`` elements over ``hosts`` x ``local`` ranks runs in three stages:

1. inside each host, a reduce-scatter: local rank ``l`` gets shard ``l`` of its host's fold
   (``shards(n, local)``: ``ceil(n / local)`` elements each, the last ones shorter or empty;
   the buffer is padded to ``local`` equal parts);
2. across hosts, among the ranks of local rank ``l``, an all-reduce of shard ``l``;
3. inside each host, an all-gather of the shards.

The network carries all-reduces of ``1/local`` of the buffer, one per local rank at once;
every card's PCIe link carries what a flat group of ``local`` ranks would. An all-gather runs
across hosts first (each rank's input among its local rank's peers) and then inside each host;
a broadcast across hosts among the root's local rank, then inside each host from it.

    >>> plan = Hosts(["a", "b", "a", "b"])          # ranks 0, 2 on host a; 1, 3 on host b
    >>> plan.local, plan.across(3), plan.local_ranks(3)
    (2, [2, 3], [1, 3])
    >>> shards(7, 2)
    [(0, 4), (4, 7)]
"""

import os
from typing import List, Mapping, Optional, Sequence, Tuple

from . import _native

#: The environment variable that names this process's host instead of ``host_id``'s default.
HOST_ID_VAR = "GP2P_HOST_ID"

def host_id(env: Optional[Mapping[str, str]] = None) -> str:
    """This process's host: ``GP2P_HOST_ID`` (in ``env``, default ``os.environ``) where set
    and not blank, else the host name and the boot id (the name alone on a machine without
    one). The definition is the library's own (``gp2p_comm::host_id``), which the NCCL door
    decides by too, so a group and the door agree on which ranks share a host."""
    env = os.environ if env is None else env
    return _native.host_id(env.get(HOST_ID_VAR))


def shards(n: int, parts: int) -> List[Tuple[int, int]]:
    """``[start, stop)`` of each of ``parts`` shards of ``n`` elements: ``ceil(n / parts)``
    each in order, the last ones shorter or empty, so every shard but the empty ones starts on
    a multiple of that size."""
    if parts < 1 or n < 0:
        raise ValueError("shards: %d elements in %d parts; need n >= 0 and parts >= 1" % (n, parts))
    size = -(-n // parts)
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(parts)]


class Hosts:
    """The hosts of a group, from each rank's host (``host_of_rank[r]`` for group rank ``r``).

    Hosts are numbered in the order their first rank appears, and a host's ranks are its local
    ranks in group-rank order. Refuses hosts that hold different numbers of ranks (the stages
    pair local rank ``l`` of every host), naming them."""

    def __init__(self, host_of_rank: Sequence[str]):
        if not host_of_rank:
            raise ValueError("host_of_rank: empty; a group has at least one rank")
        self.names: List[str] = []
        self.members: List[List[int]] = []
        for rank, name in enumerate(host_of_rank):
            if name not in self.names:
                self.names.append(name)
                self.members.append([])
            self.members[self.names.index(name)].append(rank)
        counts = {len(m) for m in self.members}
        if len(counts) > 1:
            held = ", ".join("%d on %s" % (len(m), n) for n, m in zip(self.names, self.members))
            raise ValueError("ranks per host: %s; a gp2p group across hosts needs the same number on every host "
                             "(or one process group per host)" % held)
        #: Ranks on each host.
        self.local = len(self.members[0])
        self._where = {r: (h, l) for h, ranks in enumerate(self.members) for l, r in enumerate(ranks)}

    @property
    def count(self) -> int:
        """How many hosts."""
        return len(self.members)

    def host_of(self, rank: int) -> int:
        """The host index of group rank ``rank``."""
        return self._where[rank][0]

    def local_rank(self, rank: int) -> int:
        """Group rank ``rank``'s rank among its host's."""
        return self._where[rank][1]

    def local_ranks(self, rank: int) -> List[int]:
        """The group ranks on ``rank``'s host, in local-rank order."""
        return list(self.members[self.host_of(rank)])

    def gathered_index(self, rank: int) -> int:
        """Where group rank ``rank``'s part lies in a two-level all-gather's result before it
        is put in rank order: local rank major, host minor (the all-gather across hosts runs
        first, then the one inside the host)."""
        host, local = self._where[rank]
        return local * self.count + host

    def across(self, rank: int) -> List[int]:
        """The group ranks of ``rank``'s local rank on every host, in host order: the group
        between hosts that ``rank`` joins."""
        local = self.local_rank(rank)
        return [ranks[local] for ranks in self.members]
