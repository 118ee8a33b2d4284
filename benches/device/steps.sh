#!/usr/bin/env bash
# Several of suite.sh, sanitize.sh and figures.sh in one device call, within one budget.
# Usage (device machine, repository root):
#   GP2P_COMMIT=<hash> OUT=... bash benches/device/steps.sh BUDGET_S "figures.sh comm compress" "suite.sh many" ...
# Each step is a script of benches/device/ with its sections; it runs with DEADLINE set to what
# is left of BUDGET_S (less 20 s for its own end), in a session of its own that is ended at that
# limit, and a step with under 40 s left is skipped and said. After each step every process of
# its session (ranks, test binaries, Python and nccl-tests, inner timeouts' children too) and
# every MPS daemon a step started (common.sh's /tmp/gp2p-mps-pipe.* folders) are ended, so the
# next step's figures stand for a quiet GPU. Each step's output is in $OUT/steps/<n>.log (its
# last lines printed); then everything under $OUT is put into $OUT/all.tgz, one file to bring
# back, unless that is past the device's size limit for a file (then the files stay as they
# are). The bundle and wheel come as common.sh says (target/carry/bundle.tar.xz and
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
mkdir -p "$OUT/steps"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader

# quit_mps: end every MPS daemon a step's mps_start left (its pipe folder names it).
quit_mps() {
  local d
  for d in /tmp/gp2p-mps-pipe.*; do
    [ -d "$d" ] || continue
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$d nvidia-cuda-mps-control >/dev/null 2>&1
    rm -rf "$d"
  done
  rm -rf /tmp/gp2p-mps-log.*
}

n=0
for step in "$@"; do
  n=$((n + 1))
  read -r -a words <<<"$step"
  if [ ${#words[@]} -eq 0 ]; then
    echo "== step $n is empty: skipped"
    continue
  fi
  left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 40 ]; then
    echo "== skipped $step: $left s left of $budget"
    continue
  fi
  echo "== $step ($left s left)"
  log=$OUT/steps/$n.log
  # A session of its own (setsid runs the script itself: a background job is no group leader),
  # so its every process can be ended at the limit and after.
  DEADLINE=$((left - 20)) setsid bash "benches/device/${words[0]}" "${words[@]:1}" >"$log" 2>&1 &
  sid=$!
  (
    sleep "$left"
    pkill -TERM -s "$sid"
    sleep 5
    pkill -KILL -s "$sid"
  ) >/dev/null 2>&1 &
  watchdog=$!
  wait "$sid"
  rc=$?
  kill "$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null
  pkill -KILL -s "$sid" 2>/dev/null
  quit_mps
  tail -60 "$log"
  echo "== $step: exit status $rc$([ "$rc" -ge 128 ] && echo ' (ended at its limit)')"
done
(cd "$OUT" && tar czf /tmp/steps-all.tgz . && mv /tmp/steps-all.tgz all.tgz)
# The device brings back files up to its limit (16 MiB, its README says): past it, keep the files.
if [ "$(stat -c %s "$OUT/all.tgz")" -le $((15 << 20)) ]; then
  find "$OUT" -mindepth 1 ! -name all.tgz -delete
else
  rm -f "$OUT/all.tgz"
  echo "== all.tgz would pass the device's file limit: the files stay as they are"
fi
echo "== steps done in $((SECONDS - start)) s"
