#!/usr/bin/env bash
# A machine's whole results set (benches/results/<machine>/), measured on a device machine.
# Usage: GP2P_COMMIT=<hash> OUT=... bash benches/device/figures.sh [SECTION]...
#        bash benches/device/figures.sh redraw DIR   (anywhere, no GPU: DIR's plots again)
#
# Every file goes to $OUT/<machine>/ under its name in benches/results/<machine>/, headed by
# its command, commit and machine (common.sh); copy the folder over benches/results/<machine>/.
# Ranks: every GPU (two logical ranks on one GPU where there is one).
# Sections (default: bench python mp; a section the call is too late for is skipped and said):
#   probe        gp2p probe, --json, --measure          -> probe.txt probe.json probe-measure.txt
#   copy         staged copy 4 KiB-1 GiB (0 -> 1 where two GPUs or more), and 1 GiB with one
#                GPU visible (the same-card figure)     -> copy-staged.* copy-staged-1G.*
#   host         copy_to_host / copy_from_host          -> host.*
#   reduce       the reduce kernels, every dtype        -> reduce.*
#   codec        the compressed all-reduce's codec kernels alone (gp2p bench codec), bf16, int8 and
#                fp8, 64 KiB-64 MiB, folds of 2 wires; int8 folds of 8 from 1 MiB
#                                                       -> codec-bf16-{int8,fp8}.* codec-bf16-int8-8.*
#   all-reduce   8 B-1 GiB by transport; 256 MiB of two logical ranks with one GPU visible
#                                                       -> all-reduce-{auto,scratch,zero-copy}.*
#                                                          all-reduce-256M-{auto,scratch,zero-copy}.*
#   collectives  all_gather, reduce_scatter, broadcast 1 MiB-1 GiB
#                                                       -> all-gather.* reduce-scatter.* broadcast.*
#   nccl         NCCL 2.x SHM all_reduce and all_gather, same sizes (two GPUs or more)
#                                                       -> nccl-shm.*
#   criterion    host-side costs (the bundle's criterion benches) -> criterion.txt
#   python       torch beside us (a.cpu().to(), a.to(), torch.cuda.nccl), the Python layer's
#                host time per call, legacy and side streams (the wheel)
#                                                       -> compare-torch.* python-overhead-{legacy,side}.*
#   mp           one process per GPU against NCCL in the same processes, MP_RUNS runs (default 2;
#                the wheel, two GPUs or more) of two processes and, with more GPUs, of one per GPU
#                                                       -> all-reduce-mp-2-pair<i>.* all-reduce-mp-<N>-run<i>.*
#   comm         the one-process-per-GPU communicator (gp2p bench comm) among 2, 4 and 8
#                processes, under an MPS daemon where they share a GPU: all_reduce 1 MiB-256 MiB,
#                and the other collectives 16-256 MiB at 8, each against its bound
#                                                       -> comm-all-reduce-<N>.* comm-<collective>-8.*
#   door         the NCCL door against the communicator it serves (the wheel; NCCL_TESTS: the build
#                folder of benches/device/nccl-tests.sh, holding build/ and build-mp/): for N in
#                DOOR_RANKS (default 2 4 8), nccl-tests with ranks as DOOR_RANKS_AS (default
#                processes: N processes under an MPS daemon through benches/nccl/minimpi/mpirun.py,
#                as the communicator's bench runs them and users run the door; threads: one
#                process, -t N, no MPS daemon, under which with CUDA_DEVICE_MAX_CONNECTIONS unset
#                the door refuses them), 16 KiB to DOOR_MAX_BYTES (default 1G), float sum, then
#                gp2p bench comm at the same N and sizes under MPS, DOOR_REPEATS times in turns
#                (default 3), both DOOR_CALLS calls back to back a timing (default 20, nccl-tests'
#                own -n: each timing starts after a barrier, so a root or a rank that runs ahead
#                gains once a timing, and fewer calls would count that gain more), and
#                benches/nccl/door_vs_comm.py over every run (the door issue's busbw >= 0.95 of
#                the communicator's from 64 KiB, by medians); reduce, alltoall and sendrecv
#                once, for #wrong only (DOOR_WRONG_ONLY=0 leaves them out, for a short call);
#                DOOR_TESTS names fewer of the four to compare
#                                                       -> door-{p,t}<N>-<test>[-<k>].txt comm-door-ref-<collective>-<N>[-<k>].*
#                                                          door-vs-comm-<collective>-<N>.txt
#   door-host    host time per dist.all_reduce on "nccl" through the door, 2 processes under MPS,
#                against the gp2p backend and a one-rank real NCCL group in the same processes (the
#                door's trace lines give the served call's steps and the real NCCL's own call time);
#                then the real NCCL's one rank without the door, also under MPS (the wheel)
#                                                       -> door-host-time-2.* nccl-host-time-1.*
#   compress     the compressed all-reduce (int8 and fp8 e4m3, blocks of 64) of bf16 beside the exact
#                one, 1 MiB-64 MiB, among COMPRESS_RANKS processes (default 2 4 8) under MPS, and
#                the speedup per size (the compression issue's 1.7x at 4 MiB and up); among 2 also
#                int8 with the two-shot forced, beside the one-shot two ranks run
#                                                       -> comm-compress-<format>-<N>.* comm-exact-bf16-<N>.*
#                                                          comm-compress-int8-2-two-shot.*
#   plots        the SVGs from the JSON present (also drawn at the end of every call)
#   bench        = probe copy host reduce codec all-reduce collectives nccl criterion
# Investigations (not in the default; files under $OUT/<machine>/investigations/):
#   tune         all_reduce chunk x slots at 64 MiB-1 GiB; copy chunk sizes
#   spread       1 GiB all_reduce in three processes (the spread between processes)
#   exchange     two-rank all_reduce 1 MiB-1 GiB, ring against the one-step exchange
#                (GP2P_EXCHANGE_MAX_BYTES), by transport
#   trace        the driver calls of small enqueues, Rust and Python (the wheel)
#   mp-lines     mp with the line kernel to 4, 16 and 64 KiB (the wheel, two GPUs or more)
#   waits        the communicator's waits for flags (gp2p bench comm --waits): the bounded
#                kernel, stream memory operations a watchdog ends, and ones nothing ends, in
#                turns, WAITS_ROUNDS rounds (default 2), under MPS where ranks share a GPU:
#                all_reduce 1 MiB-256 MiB among 2, 4 and 8 (and 8 with 4 MiB slots),
#                reduce_scatter among 8, the compressed all_reduce among 2, and a timeline of
#                64 MiB among 2 each way; every bench killed past 150 s with the ranks it
#                started (a rank's unbounded waits never give up)
#                                                       -> waits-<round>-<what>-{kernel,watched,unbounded}.*
#   crossover    two ranks sharing one GPU under MPS, all_reduce 1-4 MiB as the one kernel
#                (--algorithm one-shot, room to 8 MiB), as the rounds (two-shot, the one
#                kernel only to 64 KiB) and as the default picks, in turns, CROSSOVER_ROUNDS
#                rounds (default 2): where the rounds, whose waits now name one chunk, overtake
#                the one kernel (choice.rs's one_kernel_max prices that crossing)
#                                                       -> crossover-<round>-{default,one-kernel,rounds}[-odd].*
#   chunks       the rounds' chunk: all_reduce 1-16 MiB among 2 (the rounds forced), 4 and 8
#                processes under MPS with the default chunk (a slot) and with 512 KiB, 1 MiB and
#                2 MiB ones, the in-process
#                engine at the same sizes, and two ranks' 64-256 MiB with four slots beside three
#                                                       -> chunks-<N>-{default,512K,1M,2M}.* chunks-engine-<N>.*
#                                                          slots4-2.* slots4-2-default.*
#   small        what sets 1-4 MiB among 4 and 8 processes under MPS, in turns, SMALL_ROUNDS
#                rounds (default 2): the all-reduce folding through a scratch against
#                zero-copy (one operation fewer a chunk step) and auto (the default: zero-copy
#                landings up to 256 KiB), replayed against enqueued calls among 4, and among 8 the
#                reduce-scatter (N - 1 folds in turn) and the all-gather (one round) beside
#                the all-reduce
#                                                       -> small-<round>-<N>-{scratch,zero-copy,auto}.*
#                                                          small-<round>-4-replay-{off,on}.* small-8-<collective>.*
#   many-chunks  the all-reduce among 4 and 8 processes under MPS, 128 KiB-4 MiB, the rounds
#                (--many-chunks off) beside the two-shot in one flagged-chunk kernel (on, its
#                areas for 4 MiB), in turns, CHUNKS_ROUNDS rounds (default 2)
#                                                       -> many-chunks-<round>-<N>-{rounds,chunks}.*
#   large        what sets 64-256 MiB among 4 and 8 processes under MPS (the rounds, several chunks
#                a share): the default chunk and slots beside smaller chunks and more, smaller
#                slots (the same staging per rank), in turns, LARGE_ROUNDS rounds (default 1)
#                                                       -> large-<round>-<N>-<variant>.*
#   slot-waits   the rounds' first slot waits, each (the default) beside together (GP2P_SLOT_WAITS):
#                all-reduce among 2, 4 and 8 processes under MPS at 2-16 MiB (4-16 among 2,
#                where the rounds start), in turns, SLOT_WAITS_ROUNDS rounds (default 2)
#                                                       -> slot-waits-<round>-<N>-{each,together}.*
#   replay       exact bf16 and int8 all-reduce 1 MiB-64 MiB among REPLAY_RANKS processes (default
#                2 4 8) under MPS, calls enqueued (GP2P_REPLAY=off) beside replayed from graphs
#                (on), in turns, REPLAY_ROUNDS rounds (default 1)
#                                                       -> replay-<round>-{off,on}-{exact-bf16,int8}-<N>.*
#   ab           builds in turns: BUNDLES="bundle-a bundle-b" (release tests and the same-card
#                figures, AB_ROUNDS rounds, default 2) and WHEELS="a.whl b.whl" (the whole
#                copy_ and copy call, copy_call_turns.py, AB_PAIRS pairs in alternating
#                order, default 8, summarised by benches/python/turns_summary.py)
# How long: run `bench` in one device call and `python mp` in another (each is meant to fit
# the device's 10-minute limit; DEADLINE, default 540 s, skips what would not).

# The plots, from whatever JSON DIR holds: ours, with NCCL's or torch's rows beside them where
# the same folder has them. GP2P names the gp2p to draw with.
draw_plots() {
  local dir=$1 gp2p=$2 from=() t
  plot() { # NAME ARGS...: draw NAME.svg; say which
    local name=$1
    shift
    $gp2p bench plot "$@" --plot "$dir/$name.svg" 2>&1 | sed "s|$dir/||"
  }
  if [ -f "$dir/copy-staged.json" ]; then
    from=(--from "$dir/copy-staged.json")
    [ -f "$dir/compare-torch.json" ] && from+=(--from "$dir/compare-torch.json" --series staged --series 'a.cpu().to(dst)')
    plot copy-staged "${from[@]}"
  fi
  [ -f "$dir/host.json" ] && plot host --from "$dir/host.json"
  from=()
  for t in auto scratch zero-copy; do
    [ -f "$dir/all-reduce-$t.json" ] && from+=(--from "$dir/all-reduce-$t.json")
  done
  if [ ${#from[@]} -gt 0 ]; then
    [ -f "$dir/nccl-shm.json" ] && from+=(--from "$dir/nccl-shm.json")
    plot all-reduce "${from[@]}"
  fi
  if [ -f "$dir/all-gather.json" ]; then
    from=(--from "$dir/all-gather.json")
    [ -f "$dir/nccl-shm.json" ] && from+=(--from "$dir/nccl-shm.json")
    plot all-gather "${from[@]}"
  fi
  return 0
}

if [ "${1:-}" = redraw ]; then
  [ -d "${2:-}" ] || { echo "usage: $0 redraw DIR" >&2; exit 2; }
  draw_plots "${2%/}" "${GP2P:-cargo run -q -p gp2p-cli --}"
  exit 0
fi

source "$(dirname "$0")/common.sh"

# Two logical ranks on one GPU; every GPU otherwise.
ranks=$GPUS
[ "$GPUS" -lt 2 ] && ranks=2
last=$((GPUS - 1))

section_probe() {
  record probe.txt "$G" probe >/dev/null
  { "$G" probe --json - >"$RES/probe.json"; } 2>>"$LOGS/probe.log"
  json_head "$RES/probe.json" "bundle/bin/gp2p probe --json -"
  record probe-measure.txt "$G" probe --measure | tail -8
}

section_copy() {
  bench copy-staged copy --route staged --src 0 --dst $((last > 0 ? 1 : 0)) -b 4K -e 1G -f 4 -n 10 -w 3
  bench copy-staged-1G CUDA_VISIBLE_DEVICES=0 copy --route staged -b 1G -e 1G -n 10 -w 3
}

section_host() {
  bench host host -b 4K -e 1G -f 16 -n 10 -w 3
}

section_reduce() {
  bench reduce reduce --dtype all -n 20 -w 5
}

section_codec() {
  local f
  for f in int8 fp8; do
    late && return
    bench "codec-bf16-$f" codec --dtype bf16 --format "$f" --ranks 2 -b 64K -e 64M -f 4 -n 20 -w 5
  done
  late || bench codec-bf16-int8-8 codec --dtype bf16 --format int8 --ranks 8 -b 1M -e 64M -f 4 -n 20 -w 5
}

section_all_reduce() {
  local t
  for t in auto scratch zero-copy; do
    late && return
    bench "all-reduce-$t" all-reduce --ranks "$ranks" --receive "$t" -b 8 -e 1G -f 2 -n 20 -w 5
  done
  for t in auto scratch zero-copy; do
    bench "all-reduce-256M-$t" CUDA_VISIBLE_DEVICES=0 all-reduce --ranks 2 --receive "$t" -b 256M -e 256M -n 10 -w 3
  done
}

section_collectives() {
  local b
  for b in all-gather reduce-scatter broadcast; do
    late && return
    bench "$b" "$b" --ranks "$ranks" -b 1M -e 1G -f 4 -n 10 -w 3
  done
}

section_nccl() {
  if [ "$GPUS" -lt 2 ]; then
    note "nccl: one GPU (NCCL needs a GPU per rank)"
    return
  fi
  record nccl-shm.txt python3 benches/nccl/nccl_shm.py -b 8 -e 1G -f 2 -n 20 -w 5 --json "$RES/nccl-shm.json"
  json_head "$RES/nccl-shm.json" "python3 benches/nccl/nccl_shm.py -b 8 -e 1G -f 2 -n 20 -w 5 --json nccl-shm.json"
}

section_criterion() {
  record criterion.txt "$B/benches/launch" --bench | tail -3
  grep -E '^[a-z_].* time:|^ +time:' "$RES/criterion.txt" | head -20
}

section_python() {
  wheel || return
  record compare-torch.txt python3 benches/python/compare_torch.py --json "$RES/compare-torch.json" | tail -3
  json_head "$RES/compare-torch.json" "python3 benches/python/compare_torch.py --json compare-torch.json"
  local st
  for st in legacy side; do
    late && return
    record python-overhead-$st.txt sh -c "cd benches/python && python3 overhead_parts.py --streams $st --rounds 5 --bind-cpus --json '$RES/python-overhead-$st.json'" >/dev/null
    json_head "$RES/python-overhead-$st.json" "cd benches/python && python3 overhead_parts.py --streams $st --rounds 5 --bind-cpus --json python-overhead-$st.json"
    grep -E 'median of rounds: (whole call - rust call|python layer)' "$RES/python-overhead-$st.txt"
  done
}

section_mp() {
  if [ "$GPUS" -lt 2 ]; then
    note "mp: one GPU (processes on one GPU time its slices, not the collective)"
    return
  fi
  wheel || return
  local i n name
  # Two processes (pairs), and one per GPU where there are more than two.
  for n in 2 $([ "$GPUS" -gt 2 ] && echo "$GPUS"); do
    for i in $(seq 1 "${MP_RUNS:-2}"); do
      late && return
      name=all-reduce-mp-$n-pair$i
      [ "$n" -gt 2 ] && name=all-reduce-mp-$n-run$i
      record "$name.txt" python3 -m torch.distributed.run --nproc-per-node "$n" benches/python/mp_allreduce.py \
        --json "$RES/$name.json" >/dev/null
      json_head "$RES/$name.json" "python3 -m torch.distributed.run --nproc-per-node $n benches/python/mp_allreduce.py --json $name.json"
      note "mp $n ranks, run $i (bytes:gp2p/nccl us): $(grep -E '^ *[0-9]+ ' "$RES/$name.txt" | awk '{printf "%s:%s/%s ", $1, $3, $2}')"
    done
  done
}

section_comm() {
  local n c shared=0
  if [ "$GPUS" -lt 8 ]; then
    mps_start || return
    shared=1
  fi
  for n in 2 4 8; do
    late && break
    bench "comm-all-reduce-$n" comm all-reduce --ranks "$n" -b 1M -e 256M -f 4 -n 5 -w 2 --calls 10
  done
  for c in all-gather reduce-scatter broadcast; do
    late && break
    bench "comm-$c-8" comm "$c" --ranks 8 -b 16M -e 256M -f 4 -n 5 -w 2 --calls 10
  done
  [ "$shared" = 1 ] && mps_stop
  return 0
}

section_door() {
  if ! wheel; then return; fi
  local as=${DOOR_RANKS_AS:-processes} tag build
  case $as in
  processes) tag=p build=build-mp ;;
  threads) tag=t build=build ;;
  *)
    note "door: DOOR_RANKS_AS=$as is neither processes nor threads"
    return
    ;;
  esac
  if [ ! -x "${NCCL_TESTS:-}/$build/all_reduce_perf" ]; then
    note "door: no nccl-tests in NCCL_TESTS/$build (NCCL_TESTS=${NCCL_TESTS:-unset}): build them with benches/device/nccl-tests.sh"
    return
  fi
  # From 16 KiB, below the issue's 64 KiB: the first timed row of a run paid a once-per-process
  # stall at 3f1da72 (all four collectives' first row slow out of place, in place not).
  local n t c k left rc sizes="-b 16K -e ${DOOR_MAX_BYTES:-1G} -f 4" repeats=${DOOR_REPEATS:-3} suffix killed ranks name launch
  local calls=${DOOR_CALLS:-20} compared=${DOOR_TESTS:-all_reduce all_gather reduce_scatter broadcast}
  for n in ${DOOR_RANKS:-2 4 8}; do
    # Processes: the launcher starts N ranks of one binary; threads: one binary runs N.
    if [ "$as" = processes ]; then
      launch=(python3 "$ROOT/benches/nccl/minimpi/mpirun.py" -n "$n" --)
      ranks=()
    else
      launch=()
      ranks=(-t "$n")
    fi
    # Every test once for #wrong; then the four the communicator runs again, in turns with
    # the communicator under MPS, so each size compares by the medians of runs taken alike.
    # A test killed, or the call's deadline, ends the repeats at this N; what ran is compared.
    killed=""
    for k in $(seq 1 "$repeats"); do
      suffix=""
      [ "$k" -gt 1 ] && suffix="-$k"
      for t in $compared reduce alltoall sendrecv; do
        if [[ $t == reduce || $t == alltoall || $t == sendrecv ]]; then
          [ "$k" -gt 1 ] || [ "${DOOR_WRONG_ONLY:-1}" = 0 ] && continue
        fi
        late && break 2
        # Each test within what is left of the call (at most 60 s): one that hangs costs no more.
        left=$((${DEADLINE:-540} - SECONDS))
        [ "$left" -gt 60 ] && left=60
        [ "$left" -lt 1 ] && left=1 # timeout 0 would mean no limit
        name=door-$tag$n-$t$suffix.txt
        [ "$as" = processes ] && { mps_start || return; }
        # TERM first: the launcher passes it to every rank (KILL would leave them on the GPU).
        # -a 0: rank 0's time, as gp2p bench comm reports it (nccl-tests' default is the mean
        # over ranks, which for a broadcast from rank 0 counts ranks that finish after it).
        record "$name" timeout -k 10 "$left" python3 -m geforce_p2p.nccl -- "${launch[@]}" "$NCCL_TESTS/$build/${t}_perf" \
          "${ranks[@]}" $sizes -c 1 -n "$calls" -w 5 -a 0 -d float >/dev/null
        rc=$?
        [ "$as" = processes ] && mps_stop
        note "door $as $n $t$suffix: $(grep -cE '^ +[0-9]+ ' "$RES/$name") rows, $(grep -E 'Out of bounds' "$RES/$name" | tr -s ' ')"
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
          note "door $as $n $t$suffix: killed after $left s; the other tests at $n ranks skipped"
          killed=1
          break
        fi
      done
      mps_start || return
      for t in $compared; do
        late && break
        c=${t//_/-}
        bench "comm-door-ref-$c-$n$suffix" comm "$c" --ranks "$n" $sizes -n 5 -w 2 --calls "$calls" >/dev/null
      done
      mps_stop
      [ -n "$killed" ] && break
    done
    for t in $compared; do
      c=${t//_/-}
      {
        header "python3 benches/nccl/door_vs_comm.py door-$tag$n-$t{,-<k>}.txt comm-door-ref-$c-$n{,-<k>}.json (ranks as $as)"
        # shellcheck disable=SC2046 # the runs' files, each a word
        python3 benches/nccl/door_vs_comm.py $(ls "$RES/door-$tag$n-$t"{,-[0-9]*}.txt "$RES/comm-door-ref-$c-$n"{,-[0-9]*}.json 2>/dev/null)
      } >"$RES/door-vs-comm-$c-$n.txt" 2>&1
      note "door/comm $c, $n ranks: $(tail -1 "$RES/door-vs-comm-$c-$n.txt")"
    done
  done
}

section_door_host() {
  if ! wheel || ! mps_start; then return; fi
  local script=benches/python/door_host_time.py
  # TERM first (KILL 10 s later): torchrun then stops its workers, which would hold the MPS daemon.
  record door-host-time-2.txt GP2P_NCCL_TRACE=500 timeout -k 10 100 python3 -m geforce_p2p.nccl -- \
    python3 -m torch.distributed.run --nproc-per-node 2 --master-port 29611 "$script" "$RES/door-host-time-2.json" >/dev/null
  json_head "$RES/door-host-time-2.json" "GP2P_NCCL_TRACE=500 python3 -m geforce_p2p.nccl -- python3 -m torch.distributed.run --nproc-per-node 2 $script door-host-time-2.json (under an MPS daemon)"
  note "door host time: $(grep -E '^ +[0-9]+ B: door' "$RES/door-host-time-2.txt" | head -1)"
  late || record nccl-host-time-1.txt timeout -k 10 90 python3 -m torch.distributed.run --nproc-per-node 1 \
    --master-port 29612 "$script" "$RES/nccl-host-time-1.json" >/dev/null
  json_head "$RES/nccl-host-time-1.json" "python3 -m torch.distributed.run --nproc-per-node 1 $script nccl-host-time-1.json (under an MPS daemon)"
  mps_stop
}

section_compress() {
  mps_start || return
  local n f args="all-reduce -b 1M -e 64M -f 4 -n 5 -w 2 --dtype bf16 --calls 5"
  for n in ${COMPRESS_RANKS:-2 4 8}; do
    late && break
    # shellcheck disable=SC2086 # args is a list of words
    bench "comm-exact-bf16-$n" comm $args --ranks "$n" >/dev/null
    for f in int8 fp8; do
      late && break
      # shellcheck disable=SC2086
      bench "comm-compress-$f-$n" comm $args --ranks "$n" --compress "$f" >/dev/null
      if [ "$n" = 2 ] && [ "$f" = int8 ]; then
        # Two ranks run the one-shot; the two-shot, forced, beside it.
        # shellcheck disable=SC2086
        bench "comm-compress-$f-$n-two-shot" comm $args --ranks "$n" --compress "$f" --algorithm two-shot >/dev/null
        note "int8 one-shot over two-shot, 2 ranks (bytes: x): $(python3 -c '
import json, sys
times = lambda p: {r["bytes"]: r["time_us"] for r in json.load(open(p))["rows"]}
two, one = times(sys.argv[1]), times(sys.argv[2])
print(" ".join("%dM:%.2f" % (b >> 20, two[b] / one[b]) for b in sorted(one) if b in two))
' "$RES/comm-compress-$f-$n-two-shot.json" "$RES/comm-compress-$f-$n.json" 2>&1)"
      fi
      note "compressed $f over exact, $n ranks (bytes: x): $(python3 -c '
import json, sys
times = lambda p: {r["bytes"]: r["time_us"] for r in json.load(open(p))["rows"]}
exact, comp = times(sys.argv[1]), times(sys.argv[2])
print(" ".join("%dM:%.2f" % (b >> 20, exact[b] / comp[b]) for b in sorted(comp) if b in exact))
' "$RES/comm-exact-bf16-$n.json" "$RES/comm-compress-$f-$n.json" 2>&1)"
    done
  done
  mps_stop
}

section_plots() {
  draw_plots "$RES" "$G"
}

# Investigations: files under investigations/, the same headers.
investigation() { # run the rest with RES one folder down
  local saved=$RES
  RES=$RES/investigations
  mkdir -p "$RES"
  "$@"
  RES=$saved
}

tune() {
  local chunk slots
  for chunk in 1M 2M 4M; do
    for slots in 2 4; do
      late && return
      bench tune-all-reduce-c$chunk-s$slots all-reduce --ranks "$ranks" --receive scratch --chunk "$chunk" --slots "$slots" -b 64M -e 1G -f 4 -n 10 -w 3
    done
    bench tune-copy-c$chunk copy --route staged --src 0 --dst $((last > 0 ? 1 : 0)) --chunk "$chunk" -b 64M -e 1G -f 4 -n 10 -w 3
  done
}

spread() {
  local p
  for p in 1 2 3; do
    bench all-reduce-1G-process$p all-reduce --ranks "$ranks" -b 64M -e 1G -f 2 -n 10 -w 3
  done
}

exchange() {
  local t
  for t in scratch zero-copy auto; do
    late && return
    bench all-reduce-ring-$t all-reduce --ranks 2 --receive "$t" -b 1M -e 1G -f 4 -n 10 -w 3
    bench all-reduce-exchange-$t GP2P_EXCHANGE_MAX_BYTES=4294967296 all-reduce --ranks 2 --receive "$t" -b 1M -e 1G -f 4 -n 10 -w 3
  done
}

trace() {
  record trace-all-reduce.txt "$G" bench all-reduce --ranks 2 -b 8 -e 64K -f 8 -n 20 --trace >/dev/null
  record trace-all-reduce-8M.txt "$G" bench all-reduce --ranks 2 -b 8M -e 8M -n 10 --trace >/dev/null
  record trace-copy.txt "$G" bench copy --route staged --src 0 --dst "$last" -b 4 -e 64K -f 16 -n 20 --trace >/dev/null
  wheel || return
  record trace-python-copy.txt python3 benches/probes/trace_calls.py copy --devices "0,$last" >/dev/null
  record trace-python-comm.txt python3 -m torch.distributed.run --nproc-per-node 2 benches/probes/trace_calls.py comm >/dev/null
}

mp-lines() {
  if [ "$GPUS" -lt 2 ]; then
    note "mp-lines: needs two GPUs"
    return
  fi
  wheel || return
  local lines
  for lines in 4096 16384 65536; do
    late && return
    record all-reduce-mp-lines$lines.txt python3 -m torch.distributed.run --nproc-per-node 2 benches/python/mp_allreduce.py \
      --lines-max-bytes "$lines" --max-bytes 131072 --json "$RES/all-reduce-mp-lines$lines.json" >/dev/null
    json_head "$RES/all-reduce-mp-lines$lines.json" "python3 -m torch.distributed.run --nproc-per-node 2 benches/python/mp_allreduce.py --lines-max-bytes $lines --max-bytes 131072 --json all-reduce-mp-lines$lines.json"
  done
}

# waits: one bench, killed past 150 s with every rank it started (unbounded waits never give
# up, so a rank that fails would leave the others waiting for good).
bounded_bench() {
  local name=$1 rc
  shift
  record "$name.txt" timeout -s KILL 150 "$G" bench "$@" --json "$RES/$name.json" >/dev/null
  rc=$?
  [ "$rc" = 137 ] && pkill -9 -f "$G bench"
  json_head "$RES/$name.json" "$(shown timeout -s KILL 150 "$G" bench "$@" --json "$name.json")"
  note "$name: $(grep -E '^ +[0-9]+M ' "$RES/$name.txt" | awk '{printf "%s %s of bound, enqueue %s us; ", $1, $9, $10}')"
  return "$rc"
}

waits() {
  local shared=0 r n w flag what
  if [ "$GPUS" -lt 8 ]; then
    mps_start || return
    shared=1
  fi
  local a="comm all-reduce -f 4 -n 5 -w 2 --calls 10"
  for r in $(seq 1 "${WAITS_ROUNDS:-2}"); do
    for w in kernel watched unbounded; do
      late && break 2
      flag="--waits $w"
      for n in 2 4 8; do
        # shellcheck disable=SC2086 # a and flag are lists of words
        bounded_bench "waits-$r-all-reduce-$n-$w" $a --ranks "$n" -b 1M -e 256M $flag
      done
      # shellcheck disable=SC2086
      bounded_bench "waits-$r-all-reduce-8-slots4M-$w" $a --ranks 8 -b 4M -e 256M --slot-bytes 4M $flag
      # shellcheck disable=SC2086
      bounded_bench "waits-$r-reduce-scatter-8-$w" comm reduce-scatter -f 4 -n 5 -w 2 --calls 10 --ranks 8 \
        -b 16M -e 256M $flag
      # shellcheck disable=SC2086
      bounded_bench "waits-$r-compressed-2-$w" comm all-reduce -f 4 -n 5 -w 2 --calls 5 --ranks 2 -b 4M -e 64M \
        --dtype bf16 --compress int8 $flag
    done
  done
  for w in kernel watched unbounded; do
    late && break
    what="waits-timeline-2-$w"
    flag="--waits $w"
    # shellcheck disable=SC2086
    bounded_bench "$what" comm all-reduce --ranks 2 -b 64M -e 64M -n 3 -w 1 --calls 5 --timeline "$RES/$what" $flag
  done
  [ "$shared" = 1 ] && mps_stop
  return 0
}

crossover() {
  local r mode sizes flags a="comm all-reduce --ranks 2 -n 5 -w 2 --calls 10"
  mps_start || return
  for r in $(seq 1 "${CROSSOVER_ROUNDS:-2}"); do
    for mode in default one-kernel rounds; do
      case $mode in
      default) flags="" ;;
      one-kernel) flags="--algorithm one-shot --small-max-bytes 8M" ;;
      rounds) flags="--algorithm two-shot --small-max-bytes 64K" ;;
      esac
      for sizes in "-b 1M -e 4M" "-b 1536K -e 3M"; do
        late && break 3
        # shellcheck disable=SC2086 # a, sizes and flags are lists of words
        bench "crossover-$r-$mode$([ "$sizes" = "-b 1M -e 4M" ] || echo -odd)" $a $sizes -f 2 $flags
      done
    done
  done
  mps_stop
  return 0
}

chunks() {
  local n c rounds a="comm all-reduce -f 2 -n 5 -w 2 --calls 10 -b 1M -e 16M"
  mps_start || return
  for n in 2 4 8; do
    late && break
    # Two ranks on the rounds at every size: the chunk moves the model's cut to the one kernel.
    rounds=""
    [ "$n" = 2 ] && rounds="--algorithm two-shot --small-max-bytes 64K"
    # shellcheck disable=SC2086 # a and rounds are lists of words
    bench "chunks-$n-default" $a --ranks $n $rounds
    for c in 512K 1M 2M; do
      late && break
      # shellcheck disable=SC2086
      bench "chunks-$n-$c" $a --ranks $n --chunk-bytes $c $rounds
    done
  done
  mps_stop
  for n in 2 4 8; do
    late || bench "chunks-engine-$n" all-reduce --ranks $n -b 1M -e 16M -f 2 -n 5 -w 2
  done
  mps_start || return
  late || bench slots4-2 comm all-reduce -f 4 -n 5 -w 2 --calls 10 -b 64M -e 256M --ranks 2 --slots 4
  late || bench slots4-2-default comm all-reduce -f 4 -n 5 -w 2 --calls 10 -b 64M -e 256M --ranks 2
  mps_stop
  return 0
}

small() {
  local r n mode c a="comm all-reduce -b 1M -e 4M -f 2 -n 5 -w 2 --calls 10"
  mps_start || return
  for r in $(seq 1 "${SMALL_ROUNDS:-2}"); do
    for n in 4 8; do
      for mode in scratch zero-copy auto; do
        late && break 3
        # shellcheck disable=SC2086 # a is a list of words
        bench "small-$r-$n-$mode" GP2P_RECEIVE=$mode $a --ranks $n
      done
    done
    for mode in off on; do
      late && break 2
      # shellcheck disable=SC2086
      bench "small-$r-4-replay-$mode" GP2P_REPLAY=$mode $a --ranks 4
    done
  done
  for c in reduce-scatter all-gather; do
    late || bench "small-8-$c" comm $c -b 1M -e 4M -f 2 -n 5 -w 2 --calls 10 --ranks 8
  done
  mps_stop
  return 0
}

many_chunks() {
  local r n a="comm all-reduce -b 128K -e 4M -f 2 -n 5 -w 2 --calls 10"
  mps_start || return
  for r in $(seq 1 "${CHUNKS_ROUNDS:-2}"); do
    for n in 4 8; do
      late && break 2
      # shellcheck disable=SC2086 # a is a list of words
      bench "many-chunks-$r-$n-rounds" $a --ranks $n --many-chunks off
      # shellcheck disable=SC2086
      late || bench "many-chunks-$r-$n-chunks" $a --ranks $n --small-max-bytes 4M --many-chunks on
    done
  done
  mps_stop
  return 0
}

# The rounds above one chunk a share: among 4 a share of 256 MiB is four 16 MiB slots' worth, and
# every slot goes round four times in a call, each time after its readers hand it back.
large() {
  local r n v a="comm all-reduce -b 64M -e 256M -f 2 -n 5 -w 2 --calls 10"
  # shellcheck disable=SC2034 # read through the nameref below
  local variants4=("default" "chunk-8M:--chunk-bytes 8M" "chunk-4M:--chunk-bytes 4M" "slots-8x8M:--slots 8 --slot-bytes 8M")
  local variants8=("default" "chunk-4M:--chunk-bytes 4M" "chunk-2M:--chunk-bytes 2M" "slots-8x4M:--slots 8 --slot-bytes 4M")
  mps_start || return
  for r in $(seq 1 "${LARGE_ROUNDS:-1}"); do
    for n in 4 8; do
      local -n variants=variants$n
      for v in "${variants[@]}"; do
        late && break 3
        # shellcheck disable=SC2046,SC2086 # a and the variant's flags are lists of words
        bench "large-$r-$n-${v%%:*}" $a --ranks $n $([[ $v == *:* ]] && echo "${v#*:}")
      done
    done
  done
  mps_stop
  return 0
}

# A call's first waits for its slots in one wait kernel, or one each: host time against the
# first copy out's later start.
slot_waits() {
  local r n w b
  mps_start || return
  for r in $(seq 1 "${SLOT_WAITS_ROUNDS:-2}"); do
    for n in 2 4 8; do
      b=2M
      [ "$n" = 2 ] && b=4M
      for w in each together; do
        late && break 3
        bench "slot-waits-$r-$n-$w" GP2P_SLOT_WAITS=$w comm all-reduce --ranks $n -b $b -e 16M -f 2 -n 5 -w 2 --calls 10
      done
    done
  done
  mps_stop
  return 0
}

# Calls enqueued against replayed from graphs (GP2P_REPLAY), exact bf16 beside int8, in turns:
# what the host's enqueue costs the call where the same buffers recur (a training step's
# buckets, nccl-tests, the bench), and whether compression gains more once it is gone.
replay() {
  local r n rp a="comm all-reduce -b 1M -e 64M -f 4 -n 5 -w 2 --dtype bf16 --calls 5"
  mps_start || return
  for r in $(seq 1 "${REPLAY_ROUNDS:-1}"); do
    for n in ${REPLAY_RANKS:-2 4 8}; do
      for rp in off on; do
        late && break 3
        # shellcheck disable=SC2086 # a is a list of words
        bench "replay-$r-$rp-exact-bf16-$n" GP2P_REPLAY=$rp $a --ranks "$n" >/dev/null
        # shellcheck disable=SC2086
        bench "replay-$r-$rp-int8-$n" GP2P_REPLAY=$rp $a --ranks "$n" --compress int8 >/dev/null
        note "replay $rp, $n ranks, int8 over exact (bytes: x, enqueue/time us exact then int8): $(python3 -c '
import json, sys
rows = lambda p: {r["bytes"]: r for r in json.load(open(p))["rows"]}
e, c = rows(sys.argv[1]), rows(sys.argv[2])
print(" ".join("%dM:%.2f(%.0f/%.0f,%.0f/%.0f)" % (b >> 20, e[b]["time_us"] / c[b]["time_us"], e[b]["enqueue_us"],
    e[b]["time_us"], c[b]["enqueue_us"], c[b]["time_us"]) for b in sorted(c) if b in e))
' "$RES/replay-$r-$rp-exact-bf16-$n.json" "$RES/replay-$r-$rp-int8-$n.json" 2>&1)"
      done
    done
  done
  mps_stop
  return 0
}

# ab: builds in turns. Bundles: the release tests (how long the next driver call waits after
# each kind of release, another stream held) and the same-card figures; wheels: the whole
# copy_ and copy call, copy_call_turns.py in alternating order.
ab() {
  local round bundle i w order
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for bundle in ${BUNDLES:-}; do
      late && return
      local tag
      tag=$(basename "$bundle")-$round
      record "release-test-$tag.log" timeout --signal=KILL 60 "$bundle/tests/gpu_lifetime" --include-ignored --nocapture release_never_stalls >/dev/null
      note "$tag release: $(grep -oE 'release of .*took [0-9.]+[a-zµ]+' "$RES/release-test-$tag.log" | sed 's/ while a stream is held: the next driver call took/:/' | tr '\n' ';')"
      G=$bundle/bin/gp2p bench "copy-1G-$tag" CUDA_VISIBLE_DEVICES=0 copy --route staged -b 1G -e 1G -n 10 -w 3 >/dev/null
      G=$bundle/bin/gp2p bench "all-reduce-256M-$tag" CUDA_VISIBLE_DEVICES=0 all-reduce --ranks 2 -b 256M -e 256M -n 10 -w 3 >/dev/null
      note "$tag: copy 1 GiB $(grep -E '^ +1G ' "$RES/copy-1G-$tag.txt" | tr -s ' ' | cut -d' ' -f6-9); all_reduce 256 MiB $(grep -E '^ +256M ' "$RES/all-reduce-256M-$tag.txt" | tr -s ' ' | cut -d' ' -f7-10)"
    done
  done
  local wheels=()
  read -ra wheels <<<"${WHEELS:-}"
  [ ${#wheels[@]} -eq 2 ] || return
  for w in a b; do
    rm -rf "/tmp/site-$w"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/site-$w" "${wheels[$([ $w = a ] && echo 0 || echo 1)]}" >>"$LOGS/pip.log" 2>&1
  done
  header "cd benches/python && PYTHONPATH=<wheel a or b> python3 copy_call_turns.py --calls 200 --bind-cpus --label <a|b><pair> (a: ${wheels[0]}, b: ${wheels[1]})" >"$RES/turns.txt"
  for i in $(seq 1 "${AB_PAIRS:-8}"); do
    late && break
    order="a b"
    [ $((i % 2)) = 0 ] && order="b a"
    for w in $order; do
      (cd benches/python && PYTHONPATH="/tmp/site-$w" timeout 60 python3 copy_call_turns.py --calls 200 --bind-cpus --label "$w$i" \
        --json "$RES/turns-$w$i.json") >>"$RES/turns.txt" 2>&1
    done
  done
  python3 benches/python/turns_summary.py "$RES" a b | tee -a "$RES/turns.txt"
}

sections=("$@")
[ $# -eq 0 ] && sections=(bench python mp)
for section in "${sections[@]}"; do
  case $section in
  bench) set -- probe copy host reduce codec all-reduce collectives nccl criterion ;;
  *) set -- "$section" ;;
  esac
  for s in "$@"; do
    case $s in
    probe | copy | host | reduce | codec | all-reduce | collectives | nccl | criterion | python | mp | comm | door | door-host | compress | plots)
      late || "section_${s//-/_}"
      ;;
    tune | spread | exchange | trace | mp-lines | waits | crossover | chunks | small | large | replay | ab)
      late || investigation "$s"
      ;;
    slot-waits)
      late || investigation slot_waits
      ;;
    many-chunks)
      late || investigation many_chunks
      ;;
    *)
      echo "figures.sh: no section $s (see its head)" >&2
      exit 2
      ;;
    esac
  done
done
[[ " ${sections[*]} " == *" plots "* ]] || section_plots
finish
