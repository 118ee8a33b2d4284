#!/usr/bin/env bash
# The GPU suite under compute-sanitizer on a device machine.
# Usage: GP2P_COMMIT=<hash> OUT=... bash benches/device/sanitize.sh [SECTION]...
# Sections (default: memcheck racecheck):
#   memcheck, racecheck  the bundle's runner under those tools, one test thread, short
#                        buffers, fewer stress ops (both given: one run, memcheck then
#                        racecheck)                                        -> sanitize.log
#   racecheck-each       racecheck binary by binary, each with its own time limit, and
#                        gpu_compress (at most 480 s) and gpu_collectives last with what the
#                        call has left (RACECHECK_END, default DEADLINE or 560 s), so a call
#                        cut off at the device's limit still brings back the binaries before;
#                        a binary killed at its limit has its leftover processes killed too;
#                        RACECHECK_BINARIES names some of them
#                        (default: every GPU binary)                       -> racecheck-each.log
#   synccheck            gpu_comm under synccheck (the chunk kernel's named barriers)
#                                                                          -> synccheck-gpu-comm.log
#   python               the Python fast paths' tests under memcheck (the wheel)
#                                                                          -> python-memcheck.log
#   many                 gpu_comm_many's flagged-chunk tests (3 and 8 processes) under memcheck
#                        and racecheck, every process watched, under an MPS daemon started
#                        for it (the runner's sanitized pass skips tests that need one)
#                                                                          -> {memcheck,racecheck}-chunks-many.log
#   door                 the NCCL door under memcheck: nccl-tests' seven tests (NCCL_TESTS: the
#                        build folder of benches/device/nccl-tests.sh) as two threads of one
#                        process, every op and type at small sizes; then torch's "nccl" backend
#                        and vLLM's pynccl calls between two processes under an MPS daemon
#                        (test_nccl_door_gpu.py's 2-rank tests), every process watched (the wheel)
#                                                                          -> memcheck-door-nccl-tests.log
#                                                                             memcheck-door-torch.log
# GP2P_TEST_MAX_LEN (default 65539), GP2P_TEST_TIMEOUT (default 430) pass to the runner. The
# environment, the bundle and where files go: common.sh.
source "$(dirname "$0")/common.sh"

max_len=${GP2P_TEST_MAX_LEN:-65539}
sections=("$@")
[ $# -eq 0 ] && sections=(memcheck racecheck)
tools=()
for section in "${sections[@]}"; do
  case $section in
  memcheck | racecheck) tools+=("$section") ;;
  esac
done
# The runner takes one tool or both (no tool named: both, memcheck first).
case "${tools[*]}" in
"") ;;
memcheck | racecheck) runner_tools=("${tools[0]}") ;;
*) runner_tools=() ;;
esac

sanitized=0
for section in "${sections[@]}"; do
  case $section in
  memcheck | racecheck)
    [ $sanitized = 1 ] && continue # both tools ran in one run
    sanitized=1
    record sanitize.log GP2P_TEST_MAX_LEN="$max_len" GP2P_TEST_TIMEOUT="${GP2P_TEST_TIMEOUT:-430}" GP2P_STRESS_OPS=200 \
      GP2P_DROP_LIMIT_US=100000 "$B/run" --sanitize "${runner_tools[@]}" >/dev/null
    note "sanitize (${tools[*]}): $(result "$RES/sanitize.log")"
    note "  $(grep -c 'ERROR SUMMARY: 0 errors' "$RES/sanitize.log") memcheck logs with 0 errors, $(grep -c 'RACECHECK SUMMARY: 0 hazards' "$RES/sanitize.log") racecheck logs with 0 hazards"
    grep -E 'ERROR SUMMARY: [1-9]|hazards displayed \([1-9]|FAILED|panicked' "$RES/sanitize.log" | head -20
    ;;
  racecheck-each)
    log=$RES/racecheck-each.log
    header "GP2P_SANITIZER=racecheck compute-sanitizer --tool racecheck --error-exitcode 86 --print-limit 20 bundle/tests/<each GPU binary> --include-ignored --test-threads=1 --skip concurrent_reduce_scatters" >"$log"
    # The slow ones last, with whatever time the call has left: gpu_compress (its 8 tests
    # took 299 s after the other binaries and 249 s alone at 48aab23, the engine's compressed
    # all-reduce most), then gpu_collectives, whose
    # every-op-and-dtype sweep makes thousands of launches, each slow under racecheck, so
    # short buffers there. gpu_lifetime's thread-concurrency test is skipped: under
    # racecheck, which runs one kernel at a time, its gated streams wait out their deadlines
    # one by one.
    slow=(gpu_compress gpu_collectives)
    wanted() { [ -z "${RACECHECK_BINARIES:-}" ] || [[ " $RACECHECK_BINARIES " == *" $1 "* ]]; }
    binaries=()
    final=()
    for t in "$B"/tests/gpu_*; do
      t=$(basename "$t")
      wanted "$t" && [[ " ${slow[*]} " != *" $t "* ]] && binaries+=("$t")
    done
    for t in "${slow[@]}"; do
      wanted "$t" && final+=("$t")
    done
    for t in "${binaries[@]}" "${final[@]}"; do
      [ -x "$B/tests/$t" ] || continue
      len=65539
      left=$((${RACECHECK_END:-${DEADLINE:-560}} - SECONDS))
      limit=$((left > 150 ? 150 : left))
      case $t in
      gpu_compress) limit=$((left > 480 ? 480 : left)) ;;
      gpu_collectives)
        limit=$left
        len=1027
        ;;
      esac
      if [ "$limit" -lt 60 ]; then
        note "racecheck $t: skipped, the call is at $SECONDS s"
        continue
      fi
      echo "== racecheck $t" >>"$log"
      # This binary's lines only, for its note (a binary killed at its limit prints no result).
      from=$(($(wc -l <"$log") + 1))
      GP2P_SANITIZER=racecheck GP2P_TEST_MAX_LEN=$len GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 GP2P_CHUNK_EXCHANGE_MAX_BYTES=0 \
        timeout --signal=KILL "$limit" "$S" --tool racecheck --error-exitcode 86 --print-limit 20 "$B/tests/$t" \
        --include-ignored --test-threads=1 --skip concurrent_reduce_scatters >>"$log" 2>&1
      rc=$?
      own=$(tail -n +"$from" "$log")
      result_line=$(grep -E '^test result' <<<"$own" | tail -1 | cut -c1-40)
      if [ "$rc" = 137 ]; then
        result_line="killed at its $limit s limit"
        # The test binary (and the ranks it starts) may outlive its killed sanitizer and
        # keep the GPU busy; matched by name, as the ranks run it from its resolved path.
        pkill -KILL -f "/tests/$t( |\$)"
        sleep 1
      fi
      note "racecheck $t: rc $rc ${result_line:-no test result} $(grep -E 'RACECHECK SUMMARY' <<<"$own" | tail -1)"
    done
    ;;
  synccheck)
    record synccheck-gpu-comm.log GP2P_SANITIZER=synccheck GP2P_TEST_MAX_LEN="$max_len" GP2P_CHUNK_EXCHANGE_MAX_BYTES=0 \
      timeout --signal=KILL 300 "$S" --tool synccheck --error-exitcode 86 "$B/tests/gpu_comm" --include-ignored --test-threads=1 >/dev/null
    note "synccheck gpu_comm: rc $? $(result "$RES/synccheck-gpu-comm.log") $(grep -E 'ERROR SUMMARY' "$RES/synccheck-gpu-comm.log" | tail -1)"
    ;;
  python)
    wheel || continue
    record python-memcheck.log timeout --signal=KILL 300 "$S" --tool memcheck --error-exitcode 86 python3 -m pytest -q -x -p no:cacheprovider \
      tests/python/test_gpu.py -k "fast_path or fast_read or one_device or copy_between_devices" >/dev/null
    note "python fast paths under memcheck: rc $? $(grep -E 'passed' "$RES/python-memcheck.log" | tail -1) $(grep -E 'ERROR SUMMARY' "$RES/python-memcheck.log" | tail -1)"
    ;;
  many)
    mps_start || continue
    for tool in memcheck racecheck; do
      late && break
      record "$tool-chunks-many.log" GP2P_TEST_MAX_LEN="$max_len" timeout --signal=KILL 240 "$S" --tool "$tool" \
        --target-processes all --error-exitcode 86 --print-limit 20 "$B/tests/gpu_comm_many" --include-ignored \
        --test-threads=1 two_shot_in_flagged_chunks >/dev/null
      note "$tool gpu_comm_many flagged chunks under MPS: rc $? $(result "$RES/$tool-chunks-many.log")" \
        "$(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$RES/$tool-chunks-many.log") clean process summaries," \
        "$(grep -cE 'ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]|hazards displayed \([1-9]' "$RES/$tool-chunks-many.log") not"
    done
    mps_stop
    ;;
  door)
    if [ ! -x "${NCCL_TESTS:-}/build/all_reduce_perf" ]; then
      note "door: no nccl-tests in NCCL_TESTS/build: build them with benches/device/nccl-tests.sh"
      continue
    fi
    wheel || continue
    log=$RES/memcheck-door-nccl-tests.log
    header "python3 -m geforce_p2p.nccl -- compute-sanitizer --tool memcheck --error-exitcode 86 --print-limit 20 build/<test>_perf -t 2 -b 8 -e 256K -f 32 -c 1 -n 1 -w 1 -o all -d all, for each of the seven tests" >"$log"
    # Threads need no MPS daemon: the launcher gives the process the hardware queues they need.
    for t in all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv; do
      late && break
      echo "== $t" >>"$log"
      from=$(($(wc -l <"$log") + 1))
      timeout -k 5 150 python3 -m geforce_p2p.nccl -- "$S" --tool memcheck --error-exitcode 86 --print-limit 20 \
        "$NCCL_TESTS/build/${t}_perf" -t 2 -b 8 -e 256K -f 32 -c 1 -n 1 -w 1 -o all -d all >>"$log" 2>&1
      rc=$?
      own=$(tail -n +"$from" "$log")
      note "memcheck door $t (2 threads): rc $rc, $(grep -cE '^ +[0-9]+ ' <<<"$own") rows, $(grep -E 'Out of bounds' <<<"$own" | tr -s ' ')$(grep -E 'ERROR SUMMARY' <<<"$own" | tail -1)"
    done
    late && continue
    mps_start || continue
    record memcheck-door-torch.log timeout --signal=KILL $((${DEADLINE:-540} - SECONDS)) "$S" --tool memcheck --target-processes all \
      --error-exitcode 86 --print-limit 20 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_nccl_door_gpu.py -k "2]" >/dev/null
    note "memcheck door, torch and pynccl among 2 processes: rc $? $(tail -1 "$RES/memcheck-door-torch.log")" \
      "$(grep -c 'ERROR SUMMARY: 0 errors' "$RES/memcheck-door-torch.log") clean process summaries," \
      "$(grep -cE 'ERROR SUMMARY: [1-9]' "$RES/memcheck-door-torch.log") not"
    mps_stop
    ;;
  *)
    echo "sanitize.sh: no section $section (memcheck, racecheck, racecheck-each, synccheck, python, many, door)" >&2
    exit 2
    ;;
  esac
done
finish
