# shellcheck shell=bash
# What suite.sh, sanitize.sh and figures.sh share; sourced by them, not run.
#
# They run on a device machine (no Rust there), from the repository root, with:
# - the bundle from `cargo xtask test-gpu --bundle bundle` (bundle/run, bundle/bin/gp2p,
#   bundle/tests/*, bundle/benches/*), carried beside the tree, or as
#   target/carry/bundle.tar.xz (`tar cf - bundle | xz -9 > target/carry/bundle.tar.xz`: 6 MB,
#   where `tar cJf` makes 22), which is unpacked here;
# - for the Python parts, the package's wheel under .whl/, with the NCCL door inside
#   (tests/python/run-cpu-tests --release builds it into target/python-tests/wheels/).
#
# Environment:
#   OUT          where results go (the device runner's $OUT); required.
#   BUNDLE       the bundle folder (default: bundle).
#   WHEEL        the wheel file (default: the one .whl/*.whl).
#   GP2P_COMMIT  the commit the bundle and wheel were built from. The device has no .git, so
#                pass it: `GP2P_COMMIT=5c058f6 bash benches/device/figures.sh` (add +dirty for
#                a tree with uncommitted changes). Without it files say "unknown".
#   MACHINE      the results folder's name (default: from the GPUs: h200, h200-x2, h200-x4 ...).
#
# Results go to $OUT/$MACHINE/, named as in benches/results/<machine>/, each file headed by
# its command, commit and machine (`# command:` lines; JSON objects get "command", "commit"
# and "machine" fields first); copy that folder over benches/results/<machine>/ to keep them.
# Side logs (pip and the like) go to $OUT/logs, tarred at the end. The last lines printed are
# a summary.

set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

ROOT=$(pwd)
: "${OUT:?set OUT to the folder results go to}"
B=${BUNDLE:-bundle}
# Unpacked once, and again when a newer tarball comes (a warm machine keeps the last call's
# bundle, which would otherwise run under the new GP2P_COMMIT). The tarball holds bundle/, so
# only that folder is replaced, never one BUNDLE names elsewhere.
if [ "$B" = bundle ] && [ -f target/carry/bundle.tar.xz ] &&
  { [ ! -x "$B/run" ] || [ target/carry/bundle.tar.xz -nt "$B/.unpacked" ]; }; then
  rm -rf "$B" && tar xJf target/carry/bundle.tar.xz && touch "$B/.unpacked"
fi
if [ ! -x "$B/run" ]; then
  echo "no bundle at $B (build one with \`cargo xtask test-gpu --bundle bundle\` and carry it)" >&2
  exit 1
fi
B=$(cd "$B" && pwd)
G=$B/bin/gp2p
export S # compute-sanitizer, for sanitize.sh
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${GPUS:-0}" -lt 1 ]; then
  echo "no NVIDIA GPU found (nvidia-smi -L lists none)" >&2
  exit 1
fi
# h200 for one NVIDIA H200, h200-x2 for two: the GPU's name less its maker's words, lower case.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
machine_tag=$(echo "$gpu_name" | tr '[:upper:]' '[:lower:]' | sed -E 's/nvidia|geforce|tesla//g; s/[^a-z0-9]+//g')
[ "$GPUS" -gt 1 ] && machine_tag=$machine_tag-x$GPUS
MACHINE=${MACHINE:-$machine_tag}
COMMIT=${GP2P_COMMIT:-unknown}
[ "$COMMIT" = unknown ] && echo "warning: GP2P_COMMIT is not set; files will say commit unknown" >&2
export GP2P_MACHINE=$MACHINE GP2P_COMMIT=$COMMIT

RES=$OUT/$MACHINE
LOGS=$OUT/logs
mkdir -p "$RES" "$LOGS"
summary=()

# note TEXT: a line of the closing summary.
note() { summary+=("$*"); }

# finish: tar the side logs and print the summary.
finish() {
  if [ -n "$(ls -A "$LOGS" 2>/dev/null)" ]; then
    (cd "$OUT" && tar czf "logs-$(basename "$0" .sh)-$MACHINE.tgz" logs && rm -rf logs)
  else
    rmdir "$LOGS" 2>/dev/null
  fi
  echo "== $(basename "$0") on $MACHINE ($gpu_name x $GPUS), commit $COMMIT, $SECONDS s; results in $RES"
  printf '%s\n' "${summary[@]}"
}

# shown WORD...: the command as a reader would type it, from the repository root: the
# bundle as bundle/, results by their file names.
shown() {
  local line="$*"
  line=${line//"$B/"/bundle/}
  line=${line//"$RES/"/}
  line=${line//"$ROOT/"/}
  echo "$line"
}

# header COMMAND: the lines every text result starts with.
header() {
  printf '# command: %s\n# commit: %s\n# machine: %s (%s x %s)\n' "$1" "$COMMIT" "$MACHINE" "$gpu_name" "$GPUS"
}

# record NAME [VAR=value...] COMMAND...: run COMMAND (with those variables set), its output
# (stdout and stderr) in $RES/NAME after the header that names it; print the data rows;
# return its exit status. Other processes on the GPU as it starts (gpu_others) are noted and
# named at the end of NAME, as what it measured does not stand for a quiet GPU.
record() {
  local name=$1 start=$SECONDS rc vars=() others
  shift
  while [ $# -gt 0 ] && [[ $1 =~ ^[A-Z_][A-Z0-9_]*= ]]; do
    vars+=("$1")
    shift
  done
  others=$(gpu_others)
  { header "$(shown "${vars[@]}" "$@")"; env "${vars[@]}" "$@"; } >"$RES/$name" 2>&1
  rc=$?
  if [ -n "$others" ]; then
    others=${others//$'\n'/; }
    note "$name: other processes on the GPU as it started: $others"
    printf '# other processes on the GPU as this started (not a quiet GPU): %s\n' "$others" >>"$RES/$name"
  fi
  echo "== $name (rc $rc, $((SECONDS - start)) s)"
  [ $rc -eq 0 ] || note "$name: exit status $rc (the file says why)"
  grep -E '^ +[0-9.]+[KMG]? ' "$RES/$name" | head -40
  return $rc
}

# json_head FILE COMMAND: put "command", "commit" and "machine" first in the JSON object FILE
# (replacing those fields where the writer set them already).
json_head() {
  [ -f "$1" ] || return 0
  python3 - "$1" "$2" "$COMMIT" "$MACHINE" <<'PY'
import json, sys
path, command, commit, machine = sys.argv[1:5]
try:
    with open(path) as f:
        doc = json.load(f)
except ValueError as e:
    sys.exit("%s: not JSON (%s), left as it is" % (path, e))
if isinstance(doc, dict):
    rest = {k: v for k, v in doc.items() if k not in ("command", "commit", "machine")}
    doc = {"command": command, "commit": commit, "machine": machine, **rest}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
PY
}

# gpu_others: the processes on the GPU other than an MPS server, "pid name" a line; none on
# a quiet GPU. A process a killed run left behind (a sanitized test outlives a sanitizer
# killed at its limit) takes the GPU in turns with what runs next and slows every figure.
gpu_others() {
  nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null |
    grep -v 'nvidia-cuda-mps-server' | tr -d ',' || true
}

# bench NAME [VAR=value...] ARGS...: `gp2p bench ARGS... --json NAME.json`, its text in
# NAME.txt, both headed.
bench() {
  local name=$1 vars=() rc
  shift
  while [ $# -gt 0 ] && [[ $1 =~ ^[A-Z_][A-Z0-9_]*= ]]; do
    vars+=("$1")
    shift
  done
  record "$name.txt" "${vars[@]}" "$G" bench "$@" --json "$RES/$name.json"
  rc=$?
  json_head "$RES/$name.json" "$(shown "${vars[@]}" "$G" bench "$@" --json "$name.json")"
  return $rc
}

# late: true (and noted) once this call has run more than DEADLINE seconds (default 540):
# what would not finish inside the device's 10-minute limit is skipped.
late() {
  if [ "$SECONDS" -gt "${DEADLINE:-540}" ]; then
    note "skipped ${FUNCNAME[1]:-a section}: the call is at $SECONDS s"
    return 0
  fi
  return 1
}

# wheel: install the package's wheel once into /tmp/site and put it on PYTHONPATH; false (and
# noted) where there is none.
wheel() {
  [ -n "${PYTHONPATH_SET:-}" ] && return 0
  local whl
  # shellcheck disable=SC2086 # WHEEL is a glob, matched here
  whl=$(compgen -G "${WHEEL:-.whl/*.whl}" | head -1)
  if [ -z "$whl" ]; then
    note "no wheel (${WHEEL:-.whl/*.whl}): the Python parts are not run"
    return 1
  fi
  rm -rf /tmp/site
  if ! python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$whl" >"$LOGS/pip.log" 2>&1; then
    note "wheel install failed: $(tail -2 "$LOGS/pip.log")"
    return 1
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONPATH_SET=1
}

# kernels_wheels: install Hugging Face kernels 0.17.2 from the wheels in KWHEELS (default
# .kwheels, from `pip download kernels==0.17.2 --only-binary=:all: --python-version 3.12 ...`)
# into /tmp/ksite once, and put it on PYTHONPATH; false (and noted) where there are none or
# the Hub build HUB (default .hub, from `cargo xtask hub .hub`) is missing.
HUB=$(cd "${HUB:-.hub}" 2>/dev/null && pwd || echo "${HUB:-.hub}")
kernels_wheels() {
  [ -n "${KSITE_SET:-}" ] && return 0
  if [ ! -d "${KWHEELS:-.kwheels}" ] || [ ! -d "$HUB/build" ]; then
    note "no kernels wheels (${KWHEELS:-.kwheels}) or Hub build ($HUB): the kernels door is not tested"
    return 1
  fi
  rm -rf /tmp/ksite
  if ! python3 -m pip install -q --no-index --find-links "${KWHEELS:-.kwheels}" --target /tmp/ksite kernels==0.17.2 >>"$LOGS/pip.log" 2>&1; then
    note "kernels install failed: $(tail -2 "$LOGS/pip.log")"
    return 1
  fi
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/ksite KSITE_SET=1
}

# mps_start / mps_stop: an MPS control daemon for processes sharing a GPU, started as a plain
# process with fresh pipe and log folders (no GPU setting is changed), so N ranks on one GPU
# run at once instead of taking turns in ~2 ms time slices. mps_start exports
# CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY for what runs after it; mps_stop quits
# the daemon and unsets them. False (and noted) where the daemon does not start.
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/gp2p-mps-pipe.XXXXXX)
  CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/gp2p-mps-log.XXXXXX)
  if ! nvidia-cuda-mps-control -d >"$LOGS/mps-start.log" 2>&1; then
    note "MPS daemon did not start: $(tail -1 "$LOGS/mps-start.log")"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
  fi
  sleep 1
}
mps_stop() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  sleep 1
  cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$LOGS/" 2>/dev/null
  rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# result LOG: the bundle runner's closing line, or libtest's last result line.
result() {
  grep -E '^gp2p GPU suite' "$1" | tail -1 | grep . || grep -E '^test result' "$1" | tail -1
}
