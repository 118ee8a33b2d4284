#!/usr/bin/env bash
# Benchmarks on a device machine, each result as text and JSON under $OUT/bench; the last
# lines printed are a short table. Usage: benches/device/bench.sh SECTION...
# Sections: regress (same-card figures, one GPU visible), allreduce (x2 sweep, gp2p and NCCL
# in one call), tune (chunk x slots at 64M/256M/1G), others (reduce_scatter, all_gather,
# broadcast), copy (staged 0->1 sweep and chunk variants), spread (1 GiB all_reduce, 3 processes),
# mp (one process per GPU against NCCL SHM in the same processes: the default, then the line
# kernel to 4, 16 and 64 KiB; needs the wheel installed on PYTHONPATH), python (issue 14's
# comparison with torch, 4 KiB to 1 GiB, and the Python layer's host time per call split
# against the Rust call, legacy and side streams; needs the wheel on PYTHONPATH), trace (the
# driver calls of small enqueues, Rust and Python: where issue 12's and 16's host microseconds
# go; needs the wheel on PYTHONPATH), exchange (two-rank all_reduce 1 MiB-1 GiB by transport,
# the ring against the one-step exchange at every size, GP2P_EXCHANGE_MAX_BYTES, in turns).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BUNDLE:-bundle}
G=$B/bin/gp2p
R=$OUT/bench
mkdir -p "$R"
tag=x$(nvidia-smi -L | grep -c '^GPU')
run() { # name command...: run, keep stdout+stderr as $R/name.txt, print its data rows
  local name=$1
  shift
  { echo "# command: $*"; "$@"; } >"$R/$name.txt" 2>&1
  echo "== $name (rc $?)"
  grep -E '^ +[0-9.]+[KMG]? ' "$R/$name.txt" | head -40
}
for section in "$@"; do
  case $section in
  regress)
    CUDA_VISIBLE_DEVICES=0 run copy-1G-same-card-$tag $G bench copy --route staged -b 1G -e 1G -n 10 -w 3 --json "$R/copy-1G-same-card-$tag.json"
    for t in scratch zero-copy auto; do
      CUDA_VISIBLE_DEVICES=0 run all-reduce-256M-logical-$t-$tag $G bench all-reduce --ranks 2 --transport $t -b 256M -e 256M -n 10 -w 3 --json "$R/all-reduce-256M-logical-$t-$tag.json"
    done
    ;;
  allreduce)
    for t in scratch zero-copy auto; do
      run all-reduce-$t-$tag $G bench all-reduce --ranks 2 --transport $t -b 8 -e 1G -f 2 -n 20 -w 5 --json "$R/all-reduce-$t-$tag.json"
    done
    run nccl-shm-$tag python3 benches/nccl/nccl_shm.py -b 8 -e 1G -f 2 -n 20 -w 5 --json "$R/nccl-shm-$tag.json"
    ;;
  tune)
    for chunk in 1M 2M 4M; do
      for slots in 2 4; do
        run tune-all-reduce-c$chunk-s$slots-$tag $G bench all-reduce --ranks 2 --transport scratch --chunk $chunk --slots $slots -b 64M -e 1G -f 4 -n 10 -w 3
      done
    done
    ;;
  others)
    for b in reduce-scatter all-gather; do
      run $b-$tag $G bench $b --ranks 2 -b 1M -e 1G -f 4 -n 10 -w 3 --json "$R/$b-$tag.json"
    done
    run broadcast-$tag $G bench broadcast --ranks 2 -b 1M -e 1G -f 4 -n 10 -w 3 --json "$R/broadcast-$tag.json"
    ;;
  copy)
    run copy-staged-01-$tag $G bench copy --route staged --src 0 --dst 1 -b 4K -e 1G -f 4 -n 20 -w 5 --json "$R/copy-staged-01-$tag.json"
    for chunk in 1M 2M 4M; do
      run tune-copy-c$chunk-$tag $G bench copy --route staged --src 0 --dst 1 --chunk $chunk -b 64M -e 1G -f 4 -n 10 -w 3
    done
    ;;
  mp)
    run all-reduce-mp-default-$tag python3 -m torch.distributed.run --nproc-per-node 2 benches/python/mp_allreduce.py --json "$R/all-reduce-mp-default-$tag.json"
    for lines in 4096 16384 65536; do
      run all-reduce-mp-lines$lines-$tag python3 -m torch.distributed.run --nproc-per-node 2 benches/python/mp_allreduce.py --lines-max-bytes $lines --max-bytes 131072 --json "$R/all-reduce-mp-lines$lines-$tag.json"
    done
    ;;
  python)
    run compare-torch-$tag python3 benches/python/compare_torch.py --json "$R/compare-torch-$tag.json"
    for st in legacy side; do
      run python-overhead-parts-$st-$tag sh -c "cd benches/python && python3 overhead_parts.py --streams $st --rounds 5 --bind-cpus --json '$R/python-overhead-parts-$st-$tag.json'"
    done
    ;;
  exchange)
    for t in scratch zero-copy auto; do
      run all-reduce-ring-$t-$tag $G bench all-reduce --ranks 2 --transport $t -b 1M -e 1G -f 4 -n 10 -w 3 --json "$R/all-reduce-ring-$t-$tag.json"
      GP2P_EXCHANGE_MAX_BYTES=4294967296 run all-reduce-exchange-$t-$tag $G bench all-reduce --ranks 2 --transport $t -b 1M -e 1G -f 4 -n 10 -w 3 --json "$R/all-reduce-exchange-$t-$tag.json"
    done
    ;;
  trace)
    run trace-all-reduce-$tag $G bench all-reduce --ranks 2 -b 8 -e 64K -f 8 -n 20 --trace
    run trace-all-reduce-8M-$tag $G bench all-reduce --ranks 2 -b 8M -e 8M -n 10 --trace
    run trace-copy-$tag $G bench copy --route staged --src 0 --dst $(( $(nvidia-smi -L | grep -c '^GPU') - 1 )) -b 4 -e 64K -f 16 -n 20 --trace
    run trace-python-copy-$tag python3 benches/probes/trace_calls.py copy --devices 0,$(( $(nvidia-smi -L | grep -c '^GPU') - 1 ))
    run trace-python-comm-$tag python3 -m torch.distributed.run --nproc-per-node 2 benches/probes/trace_calls.py comm
    ;;
  spread)
    for p in 1 2 3; do
      run all-reduce-1G-process$p-$tag $G bench all-reduce --ranks 2 -b 64M -e 1G -f 2 -n 10 -w 3 --json "$R/all-reduce-1G-process$p-$tag.json"
    done
    ;;
  esac
done
(cd "$OUT" && tar czf "bench-$tag-$(date +%H%M%S).tgz" bench && rm -rf bench)
