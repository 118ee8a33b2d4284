#!/usr/bin/env bash
# Several of suite.sh, sanitize.sh and figures.sh in one device call, within one budget.
# Usage (device machine, repository root):
#   GP2P_COMMIT=<hash> OUT=... bash benches/device/steps.sh BUDGET_S "figures.sh comm compress" "suite.sh many" ...
# Each step is a script of benches/device/ with its sections; it runs with DEADLINE set to what
# is left of BUDGET_S (less 20 s for its own end) and is killed at that limit, and a step with
# under 40 s left is skipped and said. After each step the processes it may have left behind on
# the GPU (gp2p benches and test binaries) and an MPS daemon are ended, so the next step's
# figures stand for a quiet GPU. Then everything under $OUT is put into $OUT/all.tgz, one file
# to bring back. The bundle and wheel come as common.sh says (target/carry/bundle.tar.xz and
# .whl/*.whl); nccl-tests' source, where carried as target/carry/nccl-tests.tgz, is unpacked
# under /tmp/nt for the door's steps (NCCL_TESTS: build it there with nccl-tests.sh first).
set -u
: "${OUT:?set OUT to the folder results go to}"
budget=${1:?BUDGET_S: the seconds every step together may take}
shift
start=$SECONDS
if [ -f target/carry/nccl-tests.tgz ] && [ ! -d /tmp/nt ]; then
  mkdir -p /tmp/nt && tar xzf target/carry/nccl-tests.tgz -C /tmp/nt
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
for step in "$@"; do
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 40 ]; then
    echo "== skipped $step: $left s left of $budget"
    continue
  fi
  echo "== $step ($left s left)"
  read -r -a words <<<"$step"
  DEADLINE=$((left - 20)) timeout -k 5 "$left" bash "benches/device/${words[0]}" "${words[@]:1}" 2>&1 | tail -60
  # What a step killed at its limit may leave: ranks of a bench, a sanitized test binary.
  pkill -9 -f '[b]undle/(bin/gp2p|tests/)' 2>/dev/null
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
done
(cd "$OUT" && tar czf /tmp/steps-all.tgz . && find . -mindepth 1 -delete && mv /tmp/steps-all.tgz all.tgz)
echo "== steps done in $((SECONDS - start)) s; results in $OUT/all.tgz"
