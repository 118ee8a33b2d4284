#!/usr/bin/env bash
# The GPU suite on a device machine: plain on every GPU, the lifetime/stress/line tests again
# with one GPU visible, then (with `sanitize`) memcheck and racecheck at reduced sizes.
# Usage: benches/device/suite.sh [plain|sanitize]  (bundle from `cargo xtask test-gpu --bundle bundle`)
# Logs go to $OUT/logs; the last lines printed are the summary.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BUNDLE:-bundle}
L=$OUT/logs
mkdir -p "$L"
tag=x${GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
summary=()
case "${1:-plain}" in
plain)
  { nvidia-smi -L; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv; } >"$L/machine-$tag.txt" 2>&1
  start=$SECONDS
  GP2P_TEST_TIMEOUT=${GP2P_TEST_TIMEOUT:-240} "$B/run" >"$L/suite-$tag.log" 2>&1
  summary+=("suite ($tag, $((SECONDS - start)) s): $(tail -1 "$L/suite-$tag.log")")
  for t in gpu_lifetime gpu_stress gpu_lines; do
    start=$SECONDS
    CUDA_VISIBLE_DEVICES=0 timeout --signal=KILL 120 "$B/tests/$t" --include-ignored --test-threads=1 --nocapture >"$L/$t-one-gpu.log" 2>&1
    summary+=("$t on one GPU ($((SECONDS - start)) s): $(grep -E '^test result' "$L/$t-one-gpu.log" | tail -1)")
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
esac
(cd "$OUT" && tar czf "logs-${1:-plain}-$tag.tgz" logs && rm -rf logs)
printf '%s\n' "${summary[@]}"
