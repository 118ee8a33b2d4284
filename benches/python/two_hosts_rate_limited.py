"""Two fake hosts joined by a rate-limited link, on one machine: the cost model of
`gp2p plan --hosts` (crates/gp2p-collectives/src/hosts.rs) checked against the two-level
all-reduce of the `gp2p` backend, and against one flat gloo ring over every rank.

Each fake host is a network namespace holding two ranks (GP2P_HOST_ID by host); the two are
joined by a veth pair whose ends send at most `--gbps` each way (a tbf queue on each end), so
everything between the hosts crosses that link and nothing else does (inside a host the ranks
share this library's communicator, and gloo's own connections stay inside the namespace).
Every rank runs on cuda:0 (start an MPS daemon first). Sizes are bytes per rank; every call
gets fresh values (the inputs plus the call's number), its result checked on every rank, and
a call's time is the slowest rank's, median over `--calls` calls after one warm-up.

    python3 benches/python/two_hosts_rate_limited.py --gbps 1,4 --sizes 16M,64M --gp2p bundle/bin/gp2p

Needs root (namespaces, links, queues), pyroute2 and torch. `--cpu`: no GPU, the flat ring
only (checks the namespaces and the link here)."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HOSTS, LOCAL = 2, 2
WORLD = HOSTS * LOCAL
NETNS = ["gp2p-fake-host-%d" % h for h in range(HOSTS)]
ADDRESS = ["10.77.0.%d" % (h + 1) for h in range(HOSTS)]
LINK = ["gp2pv%d" % h for h in range(HOSTS)]


def size(text):
    """Bytes from 16M, 4K, 1G or a plain number."""
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError("%r: a size such as 64M" % text)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def link_up(gbps):
    """The two namespaces, the veth pair between them, a tbf queue of `gbps` on each end."""
    from pyroute2 import IPRoute, NetNS, netns

    link_down()
    for name in NETNS:
        netns.create(name)
    with IPRoute() as ip:
        ip.link("add", ifname=LINK[0], kind="veth", peer=LINK[1])
        for h in range(HOSTS):
            ip.link("set", index=ip.link_lookup(ifname=LINK[h])[0], net_ns_fd=NETNS[h])
    # A burst of a millisecond at the rate (at least 64 KiB): TCP keeps the link full.
    burst = max(64 << 10, int(gbps * 1e9 / 8 / 1000))
    for h in range(HOSTS):
        with NetNS(NETNS[h]) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            i = ns.link_lookup(ifname=LINK[h])[0]
            ns.addr("add", index=i, address=ADDRESS[h], prefixlen=24)
            ns.link("set", index=i, state="up")
            ns.tc("add", "tbf", i, rate="%dmbit" % int(gbps * 1000), burst=burst, latency="200ms")


def link_down():
    from pyroute2 import netns

    for name in NETNS:
        if name in netns.listnetns():
            netns.remove(name)


def model(gp2p, gbps, sizes):
    """{bytes: (two-level s, pipelined s, flat s)} from `gp2p plan --hosts`."""
    out = subprocess.run([gp2p, "plan", "--ranks", str(LOCAL), "--hosts", str(HOSTS), "--network-gbps", str(gbps),
                          "--sizes", ",".join(str(s) for s in sizes)], check=True, capture_output=True, text=True).stdout
    rows, across = {}, False
    for line in out.splitlines():
        across = across or line.startswith("Across")
        cells = line.split()
        if across and len(cells) >= 4 and cells[0][0].isdigit():
            rows[size(cells[0])] = tuple(float(c) * 1e-6 for c in cells[1:4])
    return rows, out


def run(args, gbps):
    """Every rank as a process in its host's namespace; rank 0's rows."""
    from pyroute2 import netns

    init = "file://" + os.path.join(tempfile.mkdtemp(), "init")
    ranks = []
    for r in range(WORLD):
        h = r // LOCAL
        env = dict(os.environ, GP2P_HOST_ID="fake-host-%d" % h, GP2P_ACROSS_HOSTS="gloo", GLOO_SOCKET_IFNAME=LINK[h])
        cmd = [sys.executable, __file__, "--worker", str(r), init, "--sizes", ",".join(map(str, args.sizes)),
               "--calls", str(args.calls)] + (["--cpu"] if args.cpu else [])
        ranks.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True,
                                      preexec_fn=lambda ns=NETNS[h]: netns.setns(ns)))
    outs = [p.communicate(timeout=600)[0] for p in ranks]
    if any(p.returncode for p in ranks):
        sys.exit("a rank failed: exit %s" % [p.returncode for p in ranks])
    return [json.loads(line) for line in outs[0].splitlines() if line.startswith("{")]


def worker(rank, init, sizes, calls, cpu):
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    torch.set_num_threads(4)
    timeout = timedelta(seconds=300)
    if cpu:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD, timeout=timeout)
        flat = dist.group.WORLD
    else:
        import geforce_p2p.distributed as gpd

        torch.cuda.set_device(0)
        gpd.register_backend()
        dist.init_process_group("gp2p", init_method=init, rank=rank, world_size=WORLD, timeout=timeout)
        flat = dist.new_group(backend="gloo")
    for nbytes in sizes:
        n = nbytes // 4
        parts = [torch.randint(1, 1000, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(r))
                 for r in range(WORLD)]
        want = torch.stack(parts).sum(0, dtype=torch.int32)
        ways = [("flat", "cpu", flat)] if cpu else [("two-level", "cuda", None), ("flat", "cpu", flat)]
        for name, device, group in ways:
            times = []
            for call in range(calls + 1):
                t = (parts[rank] + call).to(device)
                if device == "cuda":
                    torch.cuda.synchronize()
                dist.barrier(group=flat)
                t0 = time.perf_counter()
                dist.all_reduce(t, group=group)
                if device == "cuda":
                    torch.cuda.synchronize()
                took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                if not torch.equal(t.cpu(), want + WORLD * call):
                    sys.exit("rank %d: %s all-reduce of %d bytes, call %d: a wrong sum" % (rank, name, nbytes, call))
                slowest = [torch.zeros(1, dtype=torch.float64) for _ in range(WORLD)]
                dist.all_gather(slowest, took, group=flat)
                if call:
                    times.append(max(x.item() for x in slowest))
            if rank == 0:
                print(json.dumps({"way": name, "bytes": nbytes, "seconds": times}), flush=True)
    dist.barrier(group=flat)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gbps", default="1,4", help="link rates, Gb/s each way, comma-separated")
    p.add_argument("--sizes", default="16M,64M", type=lambda s: [size(x) for x in s.split(",")])
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--gp2p", default="bundle/bin/gp2p", help="the gp2p CLI, for the model's figures")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--worker", nargs=2, metavar=("RANK", "INIT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(int(args.worker[0]), args.worker[1], args.sizes, args.calls, args.cpu)
    print("# %d fake hosts x %d ranks, veth between them with a tbf queue each way; slowest rank's time, median of %d "
          "calls after a warm-up; model: gp2p plan --ranks %d --hosts %d --network-gbps G" % (HOSTS, LOCAL, args.calls,
                                                                                          LOCAL, HOSTS))
    print("%6s %6s %-9s %10s %10s %10s %9s" % ("Gb/s", "MiB", "way", "measured", "model", "pipelined", "measured/model"))
    try:
        for gbps in [float(g) for g in args.gbps.split(",")]:
            predicted, _ = model(args.gp2p, gbps, args.sizes)
            link_up(gbps)
            for row in run(args, gbps):
                two, piped, flat = predicted[row["bytes"]]
                got = statistics.median(row["seconds"])
                if row["way"] == "two-level":
                    print("%6g %6d %-9s %9.1f ms %7.1f ms %7.1f ms %9.2f" % (gbps, row["bytes"] >> 20, row["way"], got * 1e3,
                                                                           two * 1e3, piped * 1e3, got / two))
                else:
                    print("%6g %6d %-9s %9.1f ms %7.1f ms %10s %9.2f" % (gbps, row["bytes"] >> 20, row["way"], got * 1e3,
                                                                       flat * 1e3, "", got / flat))
                sys.stdout.flush()
    finally:
        link_down()


if __name__ == "__main__":
    main()
