#!/usr/bin/env bash
# The session's closing run on nvidia-h200-x2, one call: the suite (gpu_comm included: two
# processes, one GPU each) with the newest kernels
# and with the Turing build forced (GP2P_PTX_TARGET=compute_75), the one-GPU lifetime/stress/
# line tests, the Python GPU tests and call overhead, memcheck over the GPU suite, and
# racecheck per binary (gpu_lifetime's thread-concurrency test skipped: under racecheck,
# which runs one kernel at a time, its gated streams wait out their deadlines one by one).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BUNDLE:-bundle}
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
s=$SECONDS; GP2P_TEST_TIMEOUT=150 GP2P_TEST_MAX_LEN=4194307 "$B/run" >"$OUT/suite-x2.log" 2>&1
echo "suite, compute_80 ($((SECONDS - s)) s): $(tail -1 "$OUT/suite-x2.log")"
s=$SECONDS; GP2P_PTX_TARGET=compute_75 GP2P_TEST_TIMEOUT=150 GP2P_TEST_MAX_LEN=4194307 "$B/run" >"$OUT/suite-compute75-x2.log" 2>&1
echo "suite, compute_75 forced ($((SECONDS - s)) s): $(tail -1 "$OUT/suite-compute75-x2.log")"
for t in gpu_lifetime gpu_stress gpu_lines; do
  CUDA_VISIBLE_DEVICES=0 timeout --signal=KILL 90 "$B/tests/$t" --include-ignored --test-threads=1 --nocapture >>"$OUT/one-gpu.log" 2>&1
  echo "$t, one GPU: $(grep -E '^test result' "$OUT/one-gpu.log" | tail -1)"
done
grep -hE '^stress' "$OUT"/one-gpu.log
# Run the line exchange's tests a few times (in libtest's order they once stalled 6 of 6).
for i in 1 2 3; do
  timeout --signal=KILL 60 "$B/tests/gpu_lines" --include-ignored --test-threads=1 >>"$OUT/lines-repeat.log" 2>&1
  echo "gpu_lines run $i: $(grep -E '^test result' "$OUT/lines-repeat.log" | tail -1 | cut -c1-60)"
done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
PYTHONPATH=/tmp/site timeout --signal=KILL 200 python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu.py tests/python/test_torch_backend.py >"$OUT/python-gpu-x2.log" 2>&1
echo "python GPU tests: $(tail -1 "$OUT/python-gpu-x2.log")"
PYTHONPATH=/tmp/site timeout --signal=KILL 60 python3 benches/python/compare_torch.py --skip copy,all_reduce --json "$OUT/python-overhead-x2.json" 2>&1 | grep -E '^overhead'
PYTHONPATH=/tmp/site timeout --signal=KILL 60 python3 benches/python/overhead_parts.py --json "$OUT/python-overhead-parts-x2.json" 2>&1 | grep -E 'python layer|native only'
PYTHONPATH=/tmp/site timeout --signal=KILL 200 python3 -m torch.distributed.run --nproc-per-node 2 \
  benches/python/mp_allreduce.py --json "$OUT/all-reduce-mp-x2.json" >"$OUT/mp.log" 2>&1
echo "all_reduce, one process per GPU (rc $?): bytes:gp2p/nccl us"
grep -E "^ +[0-9]+ " "$OUT/mp.log" | awk '{printf "%s:%s/%s ", $1, $3, $2} END {print ""}'
s=$SECONDS; GP2P_TEST_TIMEOUT=120 GP2P_TEST_MAX_LEN=1048579 GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 "$B/run" --sanitize memcheck >"$OUT/sanitize-memcheck-x2.log" 2>&1
echo "memcheck ($((SECONDS - s)) s): $(tail -1 "$OUT/sanitize-memcheck-x2.log")"
for t in gpu_copy gpu_cudarc gpu_lifetime gpu_lines gpu_pinned gpu_reduce gpu_stress gpu_two gpu_collectives; do
  echo "== racecheck $t" >>"$OUT/sanitize-racecheck-x2.log"
  # gpu_collectives' every-op-and-dtype sweep on up to four ranks outlasts 100 s under
  # racecheck at 64 Ki elements: shorter buffers there.
  len=65539; [ "$t" = gpu_collectives ] && len=4099
  GP2P_SANITIZER=racecheck GP2P_TEST_MAX_LEN=$len GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 timeout --signal=KILL 150 \
    "$S" --tool racecheck --error-exitcode 86 --print-limit 20 "$B/tests/$t" --include-ignored --test-threads=1 \
    --skip concurrent_reduce_scatters >>"$OUT/sanitize-racecheck-x2.log" 2>&1
  echo "racecheck $t: rc $? $(grep -E '^test result' "$OUT/sanitize-racecheck-x2.log" | tail -1 | cut -c1-40) $(grep -E 'RACECHECK SUMMARY' "$OUT/sanitize-racecheck-x2.log" | tail -1)"
done
# At most 8 files come back: the logs go in one archive beside the JSON figures.
(cd "$OUT" && tar czf closing-logs.tgz ./*.log && rm -f ./*.log)
