#!/usr/bin/env bash
# One call for the closing figures: the suite (lengths capped), the lifetime/stress/line
# tests with one GPU visible, both sanitizers at reduced sizes, and the two all-reduce rows
# that changed. At most six files under $OUT, written as it goes (a cut-off call keeps them).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BUNDLE:-bundle}
tag=x$(nvidia-smi -L | grep -c '^GPU')
s=$SECONDS
GP2P_TEST_TIMEOUT=150 GP2P_TEST_MAX_LEN=${MAX_LEN:-4194307} "$B/run" >"$OUT/suite-$tag.log" 2>&1
echo "suite ($tag, $((SECONDS - s)) s): $(tail -1 "$OUT/suite-$tag.log")"
for t in gpu_lifetime gpu_stress gpu_lines; do
  s=$SECONDS
  CUDA_VISIBLE_DEVICES=0 timeout --signal=KILL 90 "$B/tests/$t" --include-ignored --test-threads=1 --nocapture >>"$OUT/one-gpu.log" 2>&1
  echo "$t, one GPU ($((SECONDS - s)) s): $(grep -E '^test result' "$OUT/one-gpu.log" | tail -1)"
done
s=$SECONDS
GP2P_TEST_TIMEOUT=150 GP2P_TEST_MAX_LEN=1048579 GP2P_STRESS_OPS=200 GP2P_DROP_LIMIT_US=100000 "$B/run" --sanitize >"$OUT/sanitize-$tag.log" 2>&1
echo "sanitize ($tag, $((SECONDS - s)) s): $(tail -1 "$OUT/sanitize-$tag.log")"
echo "memcheck 0-error summaries: $(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/sanitize-$tag.log"), racecheck 0-hazard summaries: $(grep -c 'RACECHECK SUMMARY: 0 hazards' "$OUT/sanitize-$tag.log"), nonzero: $(grep -cE 'ERROR SUMMARY: [1-9]|hazards displayed \([1-9]' "$OUT/sanitize-$tag.log")"
{ $B/bin/gp2p bench all-reduce --ranks 2 -b 8 -e 8K -f 2 -n 20 -w 5 --json "$OUT/all-reduce-small-$tag.json";
  $B/bin/gp2p bench all-reduce --ranks 2 -b 64M -e 1G -f 2 -n 10 -w 3 --json "$OUT/all-reduce-large-$tag.json"; } >"$OUT/bench-$tag.txt" 2>&1
grep -E '^ +[0-9]' "$OUT/bench-$tag.txt"
grep -hE '^(stress|drop of)' "$OUT"/*.log | head -20
