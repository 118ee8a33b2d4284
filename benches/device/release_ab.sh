#!/usr/bin/env bash
# Do the reclaimer's releases stall other threads? Device memory from the library's own pool
# (merged from branch pool-device-memory in the sixth session) does not; pinned host memory
# still does. One call, any number of bundles side by side.
#
# Build each here (`cargo xtask test-gpu --bundle DIR` from its checkout), carry them, then
# on the device: BUNDLES="bundle-a bundle-b" benches/device/release_ab.sh
#
# For each bundle:
# - the release tests alone, the pinned one included (they print how long the next driver call took after each kind of
#   release, with another stream held);
# - gpu_lifetime and gpu_lines whole, three times each with the suite's 4 test threads (the
#   gated tests failed only when they ran after tests that dropped many buffers);
# - gpu_two and gpu_copy (the P2P route, whose copies into pool memory need the pool grant;
#   they check every element);
# - gpu_lifetime, gpu_two and gpu_copy under compute-sanitizer memcheck (a GPU use the
#   lifetime records miss was hidden by cuMemFree's wait for the whole device);
# - the same-card regression figures (bench.sh regress).
# Logs go to $OUT/release-ab/<bundle>/; the last lines printed are a table.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
table=()
for B in ${BUNDLES:-bundle}; do
  L=$OUT/release-ab/$(basename "$B")
  mkdir -p "$L"
  GP2P_KNOWN_DEFECTS=1 timeout --signal=KILL 60 "$B/tests/gpu_lifetime" --include-ignored --nocapture \
    release_never_stalls_other_threads >"$L/release-test.log" 2>&1
  table+=("$B release test: $(grep -E '^test result' "$L/release-test.log" | cut -c14-40) | $(grep -oE 'release of .*took [0-9.]+[a-zµ]+' "$L/release-test.log" | sed 's/ while a stream is held: the next driver call took/:/' | tr '\n' ';')")
  for t in gpu_lifetime gpu_lines; do
    ok=0
    for i in 1 2 3; do
      timeout --signal=KILL 120 "$B/tests/$t" --include-ignored --test-threads=4 >>"$L/$t-x3.log" 2>&1 && ok=$((ok + 1))
    done
    table+=("$B $t, 3 runs with 4 test threads: $ok passed; failed: $(grep -E '^test .* FAILED' "$L/$t-x3.log" | awk '{print $2}' | sort | uniq -c | tr '\n' ' ')")
  done
  for t in gpu_two gpu_copy; do
    timeout --signal=KILL 120 "$B/tests/$t" --include-ignored --test-threads=1 >"$L/$t.log" 2>&1
    table+=("$B $t: $(grep -E '^test result' "$L/$t.log" | cut -c1-60)")
  done
  for t in gpu_lifetime gpu_two gpu_copy; do
    GP2P_SANITIZER=memcheck GP2P_TEST_MAX_LEN=1048579 GP2P_DROP_LIMIT_US=100000 timeout --signal=KILL 150 \
      "$S" --tool memcheck --error-exitcode 86 "$B/tests/$t" --include-ignored --test-threads=1 >"$L/memcheck-$t.log" 2>&1
    table+=("$B memcheck $t: rc $? $(grep -E '^test result' "$L/memcheck-$t.log" | cut -c1-40) $(grep 'ERROR SUMMARY' "$L/memcheck-$t.log" | tail -1)")
  done
  OUT=$L BUNDLE=$B bash "$(dirname "$0")/bench.sh" regress >"$L/regress.txt" 2>&1
  table+=("$B regress: $(grep -E '^ +[0-9.]+[KMG]? ' "$L/regress.txt" | tr -s ' ' | tr '\n' ';')")
done
printf '%s\n' "${table[@]}"
