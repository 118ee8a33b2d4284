#!/usr/bin/env bash
# The GPU suite on a device machine: plain on every GPU, the lifetime/stress/line tests again
# with one GPU visible, then (with `sanitize`) memcheck and racecheck at reduced sizes.
# Usage: benches/device/suite.sh [plain|sanitize|python|probe]...  (bundle from `cargo xtask test-gpu --bundle bundle`)
# Logs go to $OUT/logs; the last lines printed are the summary.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BUNDLE:-bundle}
L=$OUT/logs
mkdir -p "$L"
tag=x${GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
summary=()
for mode in "${@:-plain}"; do
case "$mode" in
plain)
  { nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; } >"$L/machine-$tag.txt" 2>&1
  start=$SECONDS
  GP2P_TEST_TIMEOUT=${GP2P_TEST_TIMEOUT:-240} "$B/run" >"$L/suite-$tag.log" 2>&1
  summary+=("suite ($tag, $((SECONDS - start)) s): $(tail -1 "$L/suite-$tag.log")")
  for t in gpu_lifetime gpu_stress gpu_lines; do
    start=$SECONDS
    # Tests needing two GPUs print a gp2p-not-run line and return, which libtest counts as
    # passed: the count of those lines goes beside the result line.
    CUDA_VISIBLE_DEVICES=0 timeout --signal=KILL 120 "$B/tests/$t" --include-ignored --test-threads=1 --nocapture >"$L/$t-one-gpu.log" 2>&1
    summary+=("$t on one GPU ($((SECONDS - start)) s): $(grep -E '^test result' "$L/$t-one-gpu.log" | tail -1) ($(grep -o 'gp2p-not-run: .*' "$L/$t-one-gpu.log" | wc -l) of them not run)")
  done
  grep -hE '^(stress|drop of|Auto|Staged|auto|staged).*' "$L"/*.log | sort -u | head -40
  ;;
sanitize)
  start=$SECONDS
  GP2P_TEST_TIMEOUT=${GP2P_TEST_TIMEOUT:-240} GP2P_TEST_MAX_LEN=1048579 GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 "$B/run" --sanitize >"$L/sanitize-$tag.log" 2>&1
  summary+=("sanitize ($tag, $((SECONDS - start)) s): $(tail -1 "$L/sanitize-$tag.log")")
  summary+=("$(grep -cE 'ERROR SUMMARY: 0 errors' "$L/sanitize-$tag.log") memcheck logs with 0 errors, $(grep -cE 'RACECHECK SUMMARY: 0 hazards' "$L/sanitize-$tag.log") racecheck logs with 0 hazards")
  grep -E 'ERROR SUMMARY: [1-9]|hazards displayed \([1-9]|FAILED|panicked' "$L/sanitize-$tag.log" | head -20
  ;;
python)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >"$L/pip.log" 2>&1
  start=$SECONDS
  PYTHONPATH=/tmp/site timeout --signal=KILL 300 python3 -m pytest -q -p no:cacheprovider tests/python/test_gpu.py >"$L/python-gpu-$tag.log" 2>&1
  summary+=("python GPU tests ($tag, $((SECONDS - start)) s): $(tail -1 "$L/python-gpu-$tag.log")")
  ;;
probe)
  G=$B/bin/gp2p
  $G probe >"$L/probe-$tag.txt" 2>&1; $G probe --json "$L/probe-$tag.json" >/dev/null 2>&1
  $G probe --measure >"$L/probe-measure-$tag.txt" 2>&1
  CUDA_VISIBLE_DEVICES=0 $G probe >"$L/probe-one-gpu.txt" 2>&1
  CUDA_VISIBLE_DEVICES=0 $G probe --measure >"$L/probe-measure-one-gpu.txt" 2>&1
  summary+=("probe: $(grep -cE '' "$L/probe-$tag.txt") lines; one GPU: $(grep -cE '' "$L/probe-one-gpu.txt") lines")
  cat "$L/probe-$tag.txt" | head -30
  ;;
esac
done
(cd "$OUT" && tar czf "logs-$(echo "${@:-plain}" | tr ' ' '-')-$tag.tgz" logs && rm -rf logs)
printf '%s\n' "${summary[@]}"
