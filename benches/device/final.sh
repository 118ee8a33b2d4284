#!/usr/bin/env bash
# The closing figures, in sections: `suite` (the suite with lengths capped, then the
# lifetime/stress/line tests with one GPU visible), `sanitize` (memcheck at reduced sizes,
# racecheck at smaller ones: it checks shared-memory hazards, which need a few blocks, not
# long buffers), `bench` (the small and large all-reduce rows). Usage: final.sh SECTION...
# (default: all three). Files go under $OUT as each section runs, so a cut-off call keeps them.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BUNDLE:-bundle}
tag=x$(nvidia-smi -L | grep -c '^GPU')
sections=("$@"); [ $# -eq 0 ] && sections=(suite sanitize bench)
for section in "${sections[@]}"; do
  case $section in
  suite)
    s=$SECONDS
    GP2P_TEST_TIMEOUT=150 GP2P_TEST_MAX_LEN=${MAX_LEN:-4194307} "$B/run" >"$OUT/suite-$tag.log" 2>&1
    echo "suite ($tag, $((SECONDS - s)) s): $(tail -1 "$OUT/suite-$tag.log")"
    for t in gpu_lifetime gpu_stress gpu_lines; do
      s=$SECONDS
      # Every test runs; those needing two GPUs print a gp2p-not-run line and return (libtest
      # counts them as passed, so the count of those lines is given beside its result line).
      log=$(mktemp)
      CUDA_VISIBLE_DEVICES=0 timeout --signal=KILL 90 "$B/tests/$t" --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
      cat "$log" >>"$OUT/one-gpu.log"
      echo "$t, one GPU ($((SECONDS - s)) s): $(grep -E '^test result' "$log" | tail -1) ($(grep -o 'gp2p-not-run: .*' "$log" | wc -l) of them not run)"
      rm -f "$log"
    done
    grep -hE '^(stress|drop of)' "$OUT"/*.log | head -20
    ;;
  sanitize)
    for tool in memcheck racecheck; do
      len=1048579
      [ "$tool" = racecheck ] && len=65539
      s=$SECONDS
      GP2P_TEST_TIMEOUT=200 GP2P_TEST_MAX_LEN=$len GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 "$B/run" --sanitize $tool >"$OUT/sanitize-$tool-$tag.log" 2>&1
      echo "$tool ($tag, $((SECONDS - s)) s): $(tail -1 "$OUT/sanitize-$tool-$tag.log")"
    done
    echo "memcheck 0-error summaries: $(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/sanitize-memcheck-$tag.log"), racecheck 0-hazard summaries: $(grep -c 'RACECHECK SUMMARY: 0 hazards' "$OUT/sanitize-racecheck-$tag.log"), nonzero: $(cat "$OUT"/sanitize-*-$tag.log | grep -cE 'ERROR SUMMARY: [1-9]|hazards displayed \([1-9]')"
    ;;
  bench)
    { $B/bin/gp2p bench all-reduce --ranks 2 -b 8 -e 8K -f 2 -n 20 -w 5 --json "$OUT/all-reduce-small-$tag.json";
      $B/bin/gp2p bench all-reduce --ranks 2 -b 64M -e 1G -f 2 -n 10 -w 3 --json "$OUT/all-reduce-large-$tag.json"; } >"$OUT/bench-$tag.txt" 2>&1
    grep -E '^ +[0-9]' "$OUT/bench-$tag.txt"
    ;;
  esac
done
