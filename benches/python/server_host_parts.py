"""Where the servers' object's host time goes, part by part: two ranks on one GPU (start an MPS
daemon first), 512 f32, each part 200 calls in a loop, the parts in turns, median of seven
after a warm-up (host time a call: what the enqueue costs, not the all-reduce).

    python3 -m torch.distributed.run --nproc-per-node 2 benches/python/server_host_parts.py

Parts: the communicator's in-place call and its native fast path; the out-of-place native
call with torch.empty_like and with one preallocated output (its address never changes, so
the kernel's cached graph is replayed as it is); CustomAllreduce's custom_all_reduce and
should_custom_ar; the native check alone; torch.empty_like alone."""
import os, statistics, time, torch, torch.distributed as dist
import geforce_p2p.distributed as gpd
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(0)
dist.init_process_group("gloo")
box = [gpd.unique_id() if rank == 0 else None]
dist.broadcast_object_list(box, src=0)
comm = gpd.Communicator(box[0], rank, world, 0, peer_timeout=60.0)
ca = gpd.CustomAllreduce(comm)
native = comm._native
buf = torch.randn(512, device="cuda")
pre = torch.empty_like(buf)
parts = [
    ("Communicator.all_reduce", lambda: comm.all_reduce(buf)),
    ("native.all_reduce_torch", lambda: native.all_reduce_torch(buf, "sum")),
    ("native.all_reduce_new_torch(empty_like)", lambda: native.all_reduce_new_torch(buf, torch.empty_like, 1 << 20)),
    ("native.all_reduce_new_torch(preallocated)", lambda: native.all_reduce_new_torch(buf, lambda t: pre, 1 << 20)),
    ("ca.custom_all_reduce", lambda: ca.custom_all_reduce(buf)),
    ("ca.should_custom_ar", lambda: ca.should_custom_ar(buf)),
    ("native.serves_torch", lambda: native.serves_torch(buf, 1 << 20)),
    ("torch.empty_like alone", lambda: torch.empty_like(buf)),
]
res = {name: [] for name, _ in parts}
for rep in range(8):
    for name, f in parts:
        torch.cuda.synchronize(); dist.barrier()
        t0 = time.perf_counter()
        for _ in range(200):
            f()
        res[name].append((time.perf_counter() - t0) * 1e6 / 200)
torch.cuda.synchronize(); dist.barrier()
if rank == 0:
    for name, _ in parts:
        print("%-45s %.2f us" % (name, statistics.median(res[name][1:])))
comm.close()
