#!/usr/bin/env bash
# The GPU suite on a device machine, plain (the sanitizers are sanitize.sh's).
# Usage: GP2P_COMMIT=<hash> OUT=... bash benches/device/suite.sh [SECTION]...
# Sections (default: plain one-gpu python):
#   plain    the bundle's runner, every test                          -> suite.log
#            (SUITE_RUNS=N runs it N times, suite-run2.log ...: the test threads order a
#            binary's tests differently from run to run, and a test can fail only after another)
#   one-gpu  gpu_lifetime, gpu_stress and gpu_lines with one GPU visible (two or more GPUs)
#                                                                     -> one-gpu.log
#   turing   the suite with the Turing build forced (GP2P_PTX_TARGET=compute_75)
#                                                                     -> suite-compute75.log
#   lines    gpu_lines LINE_REPEATS times (default 3), in libtest's order -> lines-repeat.log
#   python   the Python GPU, torch-backend and torch.compile tests against the wheel, and the
#            kernels door (test_kernels_door.py) where HUB and KWHEELS are there -> python-gpu.log
#   many     the communicator among 3, 4 and 8 processes sharing the GPU (gpu_comm_many), and
#            the Python N-rank tests (test_many.py, where a wheel is there), under an MPS
#            daemon started for it                                    -> many.log, python-many.log
#   latency  host time a call and latency among 2, 4 and 8 processes under MPS, 32 B to 64 KiB
#            (many_latency.py: the communicator, dist.all_reduce on gp2p, the servers' object)
#                                                                     -> many-latency-host-N.{txt,json}
#   door     the NCCL door under an MPS daemon: torch's "nccl" backend, vLLM's pynccl calls and
#            a killed rank, 2 to 8 processes (test_nccl_door_gpu.py, against the wheel's door)
#                                                                     -> python-door.log
#   door-reset  nccl-tests through the NCCL door among 4 processes under MPS (NCCL_TESTS: the build
#            folder of benches/device/nccl-tests.sh), alltoall and reduce_scatter RESET_RUNS times
#            each (default 8), with benches/probes/fault_thread.c preloaded: nccl-tests resets
#            the device right after ncclCommDestroy, so a destroy that returned before its
#            releases faults there; counts the runs that faulted or failed -> door-destroy-fault.txt
#   door-matrix  nccl-tests' seven tests through the NCCL door with every op and type (-o all -d all),
#            -b 8 -e MATRIX_MAX_BYTES (default 64M) -f 8, ranks as threads of one process (-t N)
#            and as devices of one thread (-g N: ncclCommInitAll), for N in MATRIX_RANKS (default
#            2 4 8) and the modes in MATRIX_MODES (default t g); NCCL_TESTS as for door-reset;
#            each run at most 120 s, none started past DEADLINE; then (MATRIX_OFF=1, the default) the
#            seven with GP2P_NCCL=off and one rank (-g 1): the door hands them to the real NCCL
#                                                       -> door-matrix-<mode><N>-<test>.txt door-matrix-off1-<test>.txt
#                                                                      door-matrix.txt (a line a run)
#   kernels  test_gpu.py and test_compile.py against the copy Hugging Face kernels loads from
#            HUB (a `cargo xtask hub` repository; kernels 0.17.2's wheels in KWHEELS)
#                                                                     -> python-gpu-kernels.log
# GP2P_TEST_TIMEOUT (default 240) and any other GP2P_ variable pass to the runner. The environment,
# the bundle and where files go: common.sh.
source "$(dirname "$0")/common.sh"

sections=("$@")
[ $# -eq 0 ] && sections=(plain one-gpu python)
for section in "${sections[@]}"; do
  case $section in
  plain)
    for i in $(seq 1 "${SUITE_RUNS:-1}"); do
      log=suite.log
      [ "$i" -gt 1 ] && log=suite-run$i.log
      record "$log" GP2P_TEST_TIMEOUT="${GP2P_TEST_TIMEOUT:-240}" "$B/run" >/dev/null
      note "suite run $i: $(result "$RES/$log")"
      grep -E '^test .* FAILED|^!!' "$RES/$log" | sed 's/^/  /' | head -10
    done
    grep -hE '^(stress|drop of)' "$RES/suite.log" | sort -u | head -10
    ;;
  one-gpu)
    if [ "$GPUS" -lt 2 ]; then
      note "one-gpu: this machine has one GPU, which the suite covered"
      continue
    fi
    : >"$RES/one-gpu.log"
    header "CUDA_VISIBLE_DEVICES=0 bundle/tests/{gpu_lifetime,gpu_stress,gpu_lines} --include-ignored --test-threads=1 --nocapture" >>"$RES/one-gpu.log"
    for t in gpu_lifetime gpu_stress gpu_lines; do
      echo "== $t" >>"$RES/one-gpu.log"
      CUDA_VISIBLE_DEVICES=0 timeout --signal=KILL 120 "$B/tests/$t" --include-ignored --test-threads=1 --nocapture >>"$RES/one-gpu.log" 2>&1
      # Tests that need two GPUs print a gp2p-not-run line and return, which libtest
      # counts as passed: their count goes beside the result line.
      note "$t, one GPU: $(grep -E '^test result' "$RES/one-gpu.log" | tail -1 | cut -c1-60) ($(sed -n "/^== $t/,\$p" "$RES/one-gpu.log" | grep -c 'gp2p-not-run: ') not run)"
    done
    grep -hE '^stress' "$RES/one-gpu.log" | head -5
    ;;
  turing)
    record suite-compute75.log GP2P_PTX_TARGET=compute_75 GP2P_TEST_TIMEOUT="${GP2P_TEST_TIMEOUT:-240}" "$B/run" >/dev/null
    note "suite, compute_75 forced: $(result "$RES/suite-compute75.log")"
    ;;
  lines)
    : >"$RES/lines-repeat.log"
    header "bundle/tests/gpu_lines --include-ignored --test-threads=1, ${LINE_REPEATS:-3} times" >>"$RES/lines-repeat.log"
    for i in $(seq 1 "${LINE_REPEATS:-3}"); do
      timeout --signal=KILL 60 "$B/tests/gpu_lines" --include-ignored --test-threads=1 >>"$RES/lines-repeat.log" 2>&1
      note "gpu_lines run $i: $(grep -E '^test result' "$RES/lines-repeat.log" | tail -1 | cut -c1-60)"
    done
    ;;
  python)
    wheel || continue
    tests=(tests/python/test_gpu.py tests/python/test_torch_backend.py tests/python/test_compile.py)
    kernels_wheels && tests+=(tests/python/test_kernels_door.py)
    record python-gpu.log GP2P_HUB_REPO="$HUB" timeout --signal=KILL 400 python3 -m pytest -q -rs -p no:cacheprovider "${tests[@]}" >/dev/null
    note "python GPU tests: $(tail -1 "$RES/python-gpu.log")"
    ;;
  door)
    if ! wheel || ! mps_start; then continue; fi
    record python-door.log timeout --signal=KILL 540 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_nccl_door_gpu.py >/dev/null
    note "NCCL door tests under MPS: $(tail -1 "$RES/python-door.log")"
    mps_stop
    ;;
  many)
    mps_start || continue
    record many.log timeout --signal=KILL 500 "$B/tests/gpu_comm_many" --include-ignored --test-threads=1 >/dev/null
    note "gpu_comm_many under MPS: $(result "$RES/many.log") ($(grep -c 'gp2p-not-run: ' "$RES/many.log") not run)"
    grep -E '^test .* FAILED|panicked' "$RES/many.log" | head -10
    if [ -f tests/python/test_many.py ] && wheel; then
      record python-many.log timeout --signal=KILL 400 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_many.py >/dev/null
      note "python N-rank tests under MPS: $(tail -1 "$RES/python-many.log")"
    fi
    mps_stop
    ;;
  latency)
    if ! wheel || ! mps_start; then continue; fi
    for n in 2 4 8; do
      late && break
      name=many-latency-host-$n
      record "$name.txt" timeout --signal=KILL 90 python3 -m torch.distributed.run --nproc-per-node "$n" \
        --master-port $((29700 + n)) benches/python/many_latency.py --sizes 32:65536 --calls 200 --repeats 5 \
        --json "$RES/$name.json" >/dev/null
      json_head "$RES/$name.json" "python3 -m torch.distributed.run --nproc-per-node $n benches/python/many_latency.py --sizes 32:65536 --calls 200 --repeats 5 --json $name.json (under an MPS daemon)"
      grep '^bytes' "$RES/$name.txt" | cut -c1-200
    done
    mps_stop
    ;;
  door-reset)
    if [ ! -x "${NCCL_TESTS:-}/build-mp/alltoall_perf" ]; then
      note "door-reset: no nccl-tests in NCCL_TESTS/build-mp: build them with benches/device/nccl-tests.sh"
      continue
    fi
    if ! wheel || ! mps_start; then continue; fi
    cc -shared -fPIC -O1 -o /tmp/fault_thread.so benches/probes/fault_thread.c -ldl
    log=$RES/door-destroy-fault.txt
    header "LD_PRELOAD=fault_thread.so python3 -m geforce_p2p.nccl -- python3 benches/nccl/minimpi/mpirun.py -n 4 -- build-mp/{alltoall,reduce_scatter}_perf -b 16K -e 16M -f 4 -c 1 -n 20 -w 5 -d float, ${RESET_RUNS:-8} times each (under an MPS daemon)" >"$log"
    faulted=0 failed=0 runs=0
    for i in $(seq 1 "${RESET_RUNS:-8}"); do
      late && break
      for t in alltoall reduce_scatter; do
        LD_PRELOAD=/tmp/fault_thread.so timeout -k 5 60 python3 -m geforce_p2p.nccl -- python3 benches/nccl/minimpi/mpirun.py -n 4 -- \
          "$NCCL_TESTS/build-mp/${t}_perf" -b 16K -e 16M -f 4 -c 1 -n 20 -w 5 -d float >"$LOGS/reset-run.txt" 2>&1
        rc=$?
        runs=$((runs + 1))
        [ "$rc" = 0 ] || failed=$((failed + 1))
        grep -q 'FAULT pid' "$LOGS/reset-run.txt" && faulted=$((faulted + 1))
        echo "run $i $t: rc $rc, $(grep -c 'FAULT pid' "$LOGS/reset-run.txt") fault(s), $(grep -E 'Out of bounds' "$LOGS/reset-run.txt" | tr -s ' ')" >>"$log"
        grep 'FAULT' "$LOGS/reset-run.txt" | head -12 >>"$log"
      done
    done
    rm -f "$LOGS/reset-run.txt"
    note "door-reset: of $runs nccl-tests runs among 4 processes, $faulted faulted and $failed ended non-zero"
    mps_stop
    ;;
  door-matrix)
    if [ ! -x "${NCCL_TESTS:-}/build/all_reduce_perf" ]; then
      note "door-matrix: no nccl-tests in NCCL_TESTS/build: build them with benches/device/nccl-tests.sh"
      continue
    fi
    wheel || continue
    summary_file=$RES/door-matrix.txt
    header "python3 -m geforce_p2p.nccl -- build/<test>_perf -<mode> <N> -b 8 -e ${MATRIX_MAX_BYTES:-64M} -f 8 -c 1 -o all -d all -n 2 -w 1 (no MPS daemon), a line a run" >"$summary_file"
    runs=0 bad=0 runs_list=()
    for n in ${MATRIX_RANKS:-2 4 8}; do
      for mode in ${MATRIX_MODES:-t g}; do
        runs_list+=("$mode $n")
      done
    done
    [ "${MATRIX_OFF:-1}" = 1 ] && runs_list+=("off 1")
    for run in "${runs_list[@]}"; do
      read -r mode n <<<"$run"
      # off: the door hands the one rank's communicator to the real NCCL (-g 1).
      door=(GP2P_NCCL=auto) flag=-$mode
      [ "$mode" = off ] && door=(GP2P_NCCL=off) flag=-g
      for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv; do
        late && break 2
        name=door-matrix-$mode$n-$t.txt
        record "$name" "${door[@]}" timeout -k 10 120 python3 -m geforce_p2p.nccl -- "$NCCL_TESTS/build/${t}_perf" "$flag" "$n" \
          -b 8 -e "${MATRIX_MAX_BYTES:-64M}" -f 8 -c 1 -o all -d all -n 2 -w 1 >/dev/null
        rc=$?
        # Columns 9 and 13 of a row are the out-of-place and in-place #wrong.
        wrong=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13 { w += $9 + $13 } END { print w + 0 }' "$RES/$name")
        rows=$(grep -cE '^ +[0-9]+ ' "$RES/$name")
        runs=$((runs + 1))
        { [ "$rc" = 0 ] && [ "$wrong" = 0 ] && [ "$rows" -gt 0 ]; } || bad=$((bad + 1))
        echo "${door[*]} $flag $n $t: rc $rc, $rows rows, #wrong $wrong" >>"$summary_file"
      done
    done
    note "door-matrix: $runs runs, $bad with an error, a wrong element or no rows (door-matrix.txt)"
    ;;
  kernels)
    # The same tests against the copy Hugging Face kernels loads from the Hub build (HUB).
    if ! wheel || ! kernels_wheels; then continue; fi
    record python-gpu-kernels.log GP2P_TEST_VIA_KERNELS=geforce-p2p/geforce-p2p LOCAL_KERNELS="geforce-p2p/geforce-p2p=$HUB" \
      timeout --signal=KILL 400 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_gpu.py tests/python/test_compile.py >/dev/null
    note "python GPU tests, kernels copy: $(tail -1 "$RES/python-gpu-kernels.log")"
    ;;
  *)
    echo "suite.sh: no section $section (plain, one-gpu, turing, lines, python, many, latency, door, door-reset, door-matrix, kernels)" >&2
    exit 2
    ;;
  esac
done
finish
