#!/usr/bin/env bash
# The session's closing run on nvidia-h200-x2, one call: the suite (gpu_comm included: two
# processes, one GPU each, and two sharing one GPU) with the newest kernels and with the
# Turing build forced (GP2P_PTX_TARGET=compute_75), the one-GPU lifetime/stress/line tests,
# the Python GPU and torch-backend tests and call overhead, the one-process-per-GPU all-reduce
# against NCCL (8 B - 1 GiB), memcheck over the GPU suite, and racecheck per binary
# (gpu_lifetime's thread-concurrency test skipped: under racecheck, which runs one kernel at a
# time, its gated streams wait out their deadlines one by one).
#
# Logs gather in a folder outside $OUT and are tarred into $OUT/closing-logs.tgz after every
# section, so a call cut off at its limit still brings back what ran (at most 8 files come
# back: the archive and the JSON figures). Racecheck is skipped once the call is late.
# TURING=0 leaves out the compute_75 suite, LINE_REPEATS=N repeats the line tests N times
# (default 3), SUITE_RUNS=N runs the suite N times (default 2), RACECHECK_END=S ends
# gpu_collectives' racecheck S seconds into the call.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BUNDLE:-bundle}
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
L=/tmp/closing-logs
rm -rf "$L" && mkdir -p "$L"
save() { (cd "$L" && tar czf "$OUT/closing-logs.tgz" ./*.log 2>/dev/null); }
nvidia-smi --query-gpu=index,name,compute_mode --format=csv >"$L/gpus.log" 2>&1
# The suite's test threads (4) order a binary's tests differently from run to run, and a
# test can fail only after another (a gated test after one that dropped many buffers): run
# it SUITE_RUNS times (default 2).
for i in $(seq 1 "${SUITE_RUNS:-2}"); do
  log="$L/suite-x2.log"; [ "$i" -gt 1 ] && log="$L/suite-x2-run$i.log"
  s=$SECONDS; GP2P_TEST_TIMEOUT=150 GP2P_TEST_MAX_LEN=4194307 "$B/run" >"$log" 2>&1
  echo "suite, compute_80, run $i ($((SECONDS - s)) s): $(tail -1 "$log")"
  grep -E '^test .* FAILED' "$log" | sed 's/^/  /'
done
save
if [ "${TURING:-1}" != 0 ]; then
  s=$SECONDS; GP2P_PTX_TARGET=compute_75 GP2P_TEST_TIMEOUT=150 GP2P_TEST_MAX_LEN=4194307 "$B/run" >"$L/suite-compute75-x2.log" 2>&1
  echo "suite, compute_75 forced ($((SECONDS - s)) s): $(tail -1 "$L/suite-compute75-x2.log")"
fi
for t in gpu_lifetime gpu_stress gpu_lines; do
  CUDA_VISIBLE_DEVICES=0 timeout --signal=KILL 90 "$B/tests/$t" --include-ignored --test-threads=1 --nocapture >>"$L/one-gpu.log" 2>&1
  echo "$t, one GPU: $(grep -E '^test result' "$L/one-gpu.log" | tail -1)"
done
grep -hE '^stress' "$L"/one-gpu.log
# Run the line exchange's tests a few times (in libtest's order they once stalled 6 of 6).
for i in $(seq 1 "${LINE_REPEATS:-3}"); do
  timeout --signal=KILL 60 "$B/tests/gpu_lines" --include-ignored --test-threads=1 >>"$L/lines-repeat.log" 2>&1
  echo "gpu_lines run $i: $(grep -E '^test result' "$L/lines-repeat.log" | tail -1 | cut -c1-60)"
done
save
rm -rf /tmp/site
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >"$L/pip.log" 2>&1 ||
  echo "wheel install FAILED: $(tail -2 "$L/pip.log")"
PYTHONPATH=/tmp/site timeout --signal=KILL 200 python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu.py tests/python/test_torch_backend.py >"$L/python-gpu-x2.log" 2>&1
echo "python GPU tests: $(tail -1 "$L/python-gpu-x2.log")"
PYTHONPATH=/tmp/site timeout --signal=KILL 60 python3 benches/python/compare_torch.py --skip copy,all_reduce --json "$OUT/python-overhead-x2.json" 2>&1 | grep -E '^overhead'
PYTHONPATH=/tmp/site timeout --signal=KILL 60 python3 benches/python/overhead_parts.py --json "$OUT/python-overhead-parts-x2.json" 2>&1 | grep -E 'python layer|native only'
PYTHONPATH=/tmp/site timeout --signal=KILL 200 python3 -m torch.distributed.run --nproc-per-node 2 \
  benches/python/mp_allreduce.py --json "$OUT/all-reduce-mp-x2.json" >"$L/mp.log" 2>&1
echo "all_reduce, one process per GPU (rc $?): bytes:gp2p/nccl us[:of duplex]"
grep -E "^ *[0-9]+ " "$L/mp.log" | awk '{printf "%s:%s/%s%s ", $1, $3, $2, (NF >= 6 ? ":" $6 : "")} END {print ""}'
save
s=$SECONDS; GP2P_TEST_TIMEOUT=120 GP2P_TEST_MAX_LEN=1048579 GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 "$B/run" --sanitize memcheck >"$L/sanitize-memcheck-x2.log" 2>&1
echo "memcheck ($((SECONDS - s)) s): $(tail -1 "$L/sanitize-memcheck-x2.log")"
save
# gpu_collectives last, with whatever time the call has left (RACECHECK_END, default 560 s):
# its every-op-and-dtype sweep on up to four ranks makes thousands of launches, each slow
# under racecheck (it outlasted 150 s at 4 Ki elements, 16 chunks a part): short buffers there.
for t in gpu_copy gpu_cudarc gpu_lifetime gpu_lines gpu_pinned gpu_reduce gpu_stress gpu_two gpu_collectives; do
  limit=150; len=65539
  [ "$t" = gpu_collectives ] && limit=$((${RACECHECK_END:-560} - SECONDS)) && len=1027
  if [ "$limit" -lt 60 ] || [ "$SECONDS" -gt 450 ]; then
    echo "racecheck $t: skipped, the call is at ${SECONDS} s"
    continue
  fi
  echo "== racecheck $t" >>"$L/sanitize-racecheck-x2.log"
  GP2P_SANITIZER=racecheck GP2P_TEST_MAX_LEN=$len GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 timeout --signal=KILL $limit \
    "$S" --tool racecheck --error-exitcode 86 --print-limit 20 "$B/tests/$t" --include-ignored --test-threads=1 \
    --skip concurrent_reduce_scatters >>"$L/sanitize-racecheck-x2.log" 2>&1
  echo "racecheck $t: rc $? $(grep -E '^test result' "$L/sanitize-racecheck-x2.log" | tail -1 | cut -c1-40) $(grep -E 'RACECHECK SUMMARY' "$L/sanitize-racecheck-x2.log" | tail -1)"
  save
done
save
