//! GPU: the communicator among 3 to 8 processes, all on the first GPU (where one GPU is all
//! there is; on a machine with N GPUs the same code runs one per GPU). The test starts as
//! rank 0 and runs itself again for every other rank (the children, selected by
//! GP2P_COMM_MANY_RANK = "rank world id"); every rank checks every result against a CPU
//! reference: each knows every rank's input, which comes from seeds.
//!
//! Processes sharing a GPU take turns in time slices of about 2 ms unless an MPS control
//! daemon runs (`benches/device/suite.sh many` starts one as a plain process): where fewer
//! GPUs than ranks are visible and no daemon is named (CUDA_MPS_PIPE_DIRECTORY), the tests
//! that run collectives say they were not run. Rank r runs on GPU r modulo the GPUs visible.

// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![forbid(unsafe_code)]

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use geforce_p2p::cuda::codec::WireFormat;
use geforce_p2p::kernels::compress::{self, BlockSize, Compressible, Format, Scheme};
use geforce_p2p::{DeviceBuffer, ReduceOp, Stream, half};
use gp2p_comm::{Algorithm, CommOptions, Communicator, FlagWaits, Receive, UniqueId};
use gp2p_tests::{Reference, count_mismatched, count_wrong_vs_fold, device, every_dtype, needs, random};

/// Set in each child: its rank, the world size and the unique id, space-separated.
const CHILD_ENV: &str = "GP2P_COMM_MANY_RANK";

fn child_log(rank: usize) -> PathBuf {
    std::env::temp_dir().join(format!("gp2p-comm-many-{}-rank{rank}.log", std::process::id()))
}

/// The other ranks' processes, held by rank 0: killed if rank 0 fails before waiting for
/// their verdicts.
struct Children(Vec<(usize, std::process::Child)>);

impl Children {
    fn wait(mut self) {
        let mut failed = Vec::new();
        for (rank, mut child) in std::mem::take(&mut self.0) {
            let ok = child.wait().unwrap().success();
            let output = std::fs::read_to_string(child_log(rank)).unwrap_or_default();
            let _ = std::fs::remove_file(child_log(rank));
            if !ok {
                failed.push(format!("rank {rank} failed:\n{output}"));
            }
        }
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One rank of an N-process test.
struct Ranked {
    rank: usize,
    world: usize,
    stream: Stream,
    comm: Communicator,
    children: Children,
    _serial: Option<std::sync::MutexGuard<'static, ()>>,
}

fn is_child() -> bool {
    std::env::var(CHILD_ENV).is_ok()
}

/// Whether `world` ranks can run here at a useful pace: a GPU each, or an MPS daemon to share
/// one; otherwise prints the not-run line for `test`. Rank 0 decides (its children run only
/// if it starts them).
fn runs_here(test: &str, world: usize) -> bool {
    if is_child() {
        return true;
    }
    let gpus = geforce_p2p::Device::count().unwrap_or(0);
    if gpus >= world || std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").is_some() {
        return true;
    }
    let reason = format!(
        "needs {world} GPUs, or an MPS daemon for {world} processes sharing fewer (benches/device/suite.sh many)"
    );
    println!("{}", gp2p_tests::not_run_line(test, &reason));
    false
}

/// This process's rank, the world and the id: from the environment in a child, else rank 0
/// of `world`, with the other ranks started on `test`.
fn rank_world_id(test: &str, world: usize) -> (usize, usize, UniqueId, Children) {
    if let Ok(text) = std::env::var(CHILD_ENV) {
        let parts: Vec<&str> = text.split(' ').collect();
        let (rank, world) = (parts[0].parse().unwrap(), parts[1].parse().unwrap());
        return (rank, world, parts[2].parse().expect("the parent's unique id"), Children(Vec::new()));
    }
    let id = UniqueId::new().expect("a unique id (is /dev/shm there?)");
    let exe = std::env::current_exe().unwrap();
    let children = (1..world)
        .map(|rank| {
            // Each child's output goes to a file, shown only if it fails: its libtest summary
            // must not reach the runner, which counts summary lines.
            let log = File::create(child_log(rank)).expect("a log file for a child rank");
            let child = Command::new(&exe)
                .args([test, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, format!("{rank} {world} {id}"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("starting a child rank");
            (rank, child)
        })
        .collect();
    (0, world, id, Children(children))
}

/// Waits for the peers as long as time slicing among `world` processes may take, and for
/// them to join as long as a sanitizer's start of eight takes (under memcheck one of eight
/// compressing ranks missed the default 30 s: `benches/results/h10080gbhbm3/memcheck-comm-many.log`).
fn sharing(options: CommOptions) -> CommOptions {
    CommOptions { peer_timeout: Duration::from_secs(60), join_timeout: Duration::from_secs(120), ..options }
}

impl Ranked {
    fn start(test: &str, world: usize, options: CommOptions) -> Ranked {
        let serial = (!is_child()).then(gp2p_tests::serial);
        let (rank, world, id, children) = rank_world_id(test, world);
        let gpus = geforce_p2p::Device::count().unwrap().max(1);
        let dev = device(rank % gpus);
        let stream = Stream::new(&dev).unwrap();
        let comm = Communicator::new(&id, rank, world, &dev, options).unwrap();
        Ranked { rank, world, stream, comm, children, _serial: serial }
    }

    fn finish(self) {
        let Ranked { comm, children, .. } = self;
        drop(comm);
        children.wait();
    }
}

/// Every rank's input for case `case`.
fn inputs_of<T: Reference>(world: usize, len: usize, seed: u64, case: u64) -> Vec<Vec<T>> {
    (0..world).map(|r| random(len, seed * 100_000 + case * 16 + r as u64)).collect()
}

/// `got` against `op` over every rank's `inputs[..][range]`, within the fold's rounding.
fn check_fold<T: Reference>(what: &str, got: &[T], inputs: &[Vec<T>], range: std::ops::Range<usize>, op: ReduceOp) {
    let parts: Vec<&[T]> = inputs.iter().map(|v| &v[range.clone()]).collect();
    let (bad, first) = count_wrong_vs_fold(got, &parts, op);
    assert_eq!(bad, 0, "{} {what}: {}", T::DTYPE, first.join("; "));
}

/// A result to check once every call is queued.
type Check = Box<dyn FnOnce(&Stream)>;

/// Every collective at odd lengths, on both paths (the line kernel up to
/// `lines_max_bytes`, the rounds above), each op for the reductions; enqueued back to back,
/// checked once all are queued. All ranks must hold the same bits after an all-reduce.
fn every_collective<T: Reference>(comm: &mut Communicator, stream: &Stream, seed: u64) {
    let (rank, world) = (comm.rank(), comm.world());
    let lines_len = comm.lines_max_bytes() / size_of::<T>();
    let rounds_len = (300 << 10) / size_of::<T>() + 3;
    let mut case = 0u64;
    let mut pending: Vec<Check> = Vec::new();
    for len in [1, 7, 255, 4099, lines_len, lines_len + 1, rounds_len] {
        for op in ReduceOp::ALL {
            case += 1;
            let inputs = inputs_of::<T>(world, len, seed, case);
            let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
            // Out of place on every other rank, in turn: each call pairs either kind.
            if (case as usize + rank).is_multiple_of(2) {
                comm.all_reduce(&mut buf.view_mut(..), stream, op).unwrap();
                pending.push(Box::new(move |s| {
                    let got = buf.to_host_vec(s).unwrap();
                    check_fold(&format!("rank {rank} all_reduce {op} len {len}"), &got, &inputs, 0..len, op);
                }));
            } else {
                let mut out = DeviceBuffer::<T>::alloc(stream.device(), len).unwrap();
                comm.all_reduce_into(&buf.view(..), &mut out.view_mut(..), stream, op).unwrap();
                pending.push(Box::new(move |s| {
                    let got = out.to_host_vec(s).unwrap();
                    check_fold(&format!("rank {rank} all_reduce_into {op} len {len}"), &got, &inputs, 0..len, op);
                    assert!(buf.to_host_vec(s).unwrap() == inputs[rank], "rank {rank} all_reduce_into wrote its input");
                }));
            }
        }
    }
    let part = (100 << 10) / size_of::<T>() + 5;
    for op in ReduceOp::ALL {
        case += 1;
        let inputs = inputs_of::<T>(world, world * part, seed, case);
        let input = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        let mut output = DeviceBuffer::<T>::alloc(stream.device(), part).unwrap();
        comm.reduce_scatter(&input.view(..), &mut output.view_mut(..), stream, op).unwrap();
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        comm.reduce_scatter_in_place(&mut buf.view_mut(..), stream, op).unwrap();
        pending.push(Box::new(move |s| {
            let mine = rank * part..(rank + 1) * part;
            let got = output.to_host_vec(s).unwrap();
            check_fold(&format!("rank {rank} reduce_scatter {op}"), &got, &inputs, mine.clone(), op);
            let whole = buf.to_host_vec(s).unwrap();
            check_fold(&format!("rank {rank} reduce_scatter_in_place {op}"), &whole[mine.clone()], &inputs, mine, op);
        }));
    }
    case += 1;
    let inputs = inputs_of::<T>(world, part, seed, case);
    let input = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
    let mut output = DeviceBuffer::<T>::alloc(stream.device(), world * part).unwrap();
    comm.all_gather(&input.view(..), &mut output.view_mut(..), stream).unwrap();
    // In place: this rank's input is its part of the output; the other parts hold stale
    // numbers, which the call overwrites.
    let mut whole: Vec<T> = random(world * part, seed + 999);
    whole[rank * part..(rank + 1) * part].copy_from_slice(&inputs[rank]);
    let mut buf = DeviceBuffer::from_host(stream, &whole).unwrap();
    comm.all_gather_in_place(&mut buf.view_mut(..), stream).unwrap();
    pending.push(Box::new(move |s| {
        let want = inputs.concat();
        for (what, got) in [("all_gather", output.to_host_vec(s).unwrap()), ("in place", buf.to_host_vec(s).unwrap())] {
            let (bad, first) = count_mismatched(&got, &want, ReduceOp::Sum);
            assert_eq!(bad, 0, "rank {rank} {} {what}: {}", T::DTYPE, first.join("; "));
        }
    }));
    for root in [0, world - 1] {
        for len in [3, rounds_len] {
            case += 1;
            let inputs = inputs_of::<T>(world, len, seed, case);
            let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
            comm.broadcast(&mut buf.view_mut(..), stream, root).unwrap();
            pending.push(Box::new(move |s| {
                assert!(buf.to_host_vec(s).unwrap() == inputs[root], "rank {rank} broadcast from {root} len {len}");
            }));
        }
    }
    // Point to point from rank 1 to the last rank; the others make no call.
    for len in [3, rounds_len] {
        case += 1;
        let inputs = inputs_of::<T>(world, len, seed, case);
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        if rank == 1 {
            comm.send(&buf.view(..), stream, world - 1).unwrap();
        } else if rank == world - 1 {
            comm.recv(&mut buf.view_mut(..), stream, 1).unwrap();
        }
        let want = if rank == world - 1 { inputs[1].clone() } else { inputs[rank].clone() };
        pending.push(Box::new(move |s| {
            assert!(buf.to_host_vec(s).unwrap() == want, "rank {rank} send from 1 len {len}");
        }));
    }
    for check in pending {
        check(stream);
    }
}

/// Every all-reduce must give every rank the same bits: rank 0 gathers every rank's result
/// of a float sum through the communicator itself and compares.
fn same_bits_everywhere(comm: &mut Communicator, stream: &Stream, len: usize) {
    let (rank, world) = (comm.rank(), comm.world());
    let inputs = inputs_of::<f32>(world, len, 77, len as u64);
    let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
    comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
    let mut all = DeviceBuffer::<f32>::alloc(stream.device(), world * len).unwrap();
    comm.all_gather(&buf.view(..), &mut all.view_mut(..), stream).unwrap();
    let all = all.to_host_vec(stream).unwrap();
    for r in 1..world {
        assert!(all[r * len..(r + 1) * len] == all[..len], "rank {r}'s sum of {len} differs from rank 0's");
    }
}

fn every_collective_among(test: &str, world: usize) {
    if !runs_here(test, world) {
        return;
    }
    let mut r = Ranked::start(test, world, sharing(CommOptions::for_world(world)));
    assert_eq!((r.comm.world(), r.world), (world, world));
    every_dtype!(every_collective(&mut r.comm, &r.stream, 5));
    for len in [1000, 100_003] {
        same_bits_everywhere(&mut r.comm, &r.stream, len);
    }
    // A thousand calls without synchronisation (fifty under a sanitizer, which runs every
    // kernel slowly), the line kernel and the rounds in turn, each on a buffer of its own.
    let count = if gp2p_tests::sanitizer().is_some() { 50 } else { 1000 };
    let (rank, stream) = (r.rank, &r.stream);
    let mut calls = Vec::new();
    for c in 0..count {
        let len = if c % 10 == 9 { 70_001 } else { 333 };
        let inputs = inputs_of::<u32>(world, len, 3, c);
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        r.comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
        calls.push((inputs, buf));
    }
    for (c, (inputs, buf)) in calls.iter().enumerate() {
        let want: Vec<u32> =
            (0..inputs[0].len()).map(|i| inputs.iter().fold(0u32, |acc, v| acc.wrapping_add(v[i]))).collect();
        assert!(buf.to_host_vec(stream).unwrap() == want, "rank {rank} call {c}");
    }
    drop(calls);
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_three_processes_run_every_collective_op_and_dtype() {
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    every_collective_among("one_gpu_three_processes_run_every_collective_op_and_dtype", 3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_run_every_collective_op_and_dtype() {
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    every_collective_among("one_gpu_four_processes_run_every_collective_op_and_dtype", 4);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_eight_processes_run_every_collective_op_and_dtype() {
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    every_collective_among("one_gpu_eight_processes_run_every_collective_op_and_dtype", 8);
}

/// Every op and dtype at odd lengths among `world` processes made with `algorithm` and
/// `receive` forced, against the fold. With two-shot forced the rounds take every
/// all-reduce above the one-kernel sizes (among more than two every size, the smallest
/// too, whose shares are empty on most ranks); with scratch every chunk lands by DMA into
/// device memory before its fold.
fn folds_among(test: &str, world: usize, lens: &'static [usize], algorithm: Option<Algorithm>, receive: Receive) {
    // A one-kernel path up to 2 KiB only and slots of 64 KiB, so the pipeline runs from
    // small lengths on and long ones take several chunks a share.
    let options = CommOptions { algorithm, receive, ..small_pipeline(world, 64 << 10, None) };
    folds_with(test, world, lens, options);
}

/// `options` with two ranks' exchange forced ([`Algorithm::OneShot`]): ranks sharing one GPU
/// take the rounds otherwise.
fn exchange(options: CommOptions) -> CommOptions {
    CommOptions { algorithm: Some(Algorithm::OneShot), ..options }
}

/// Options whose one-kernel path stops at 2 KiB, with slots of `slot_bytes` and chunks of
/// `chunk_bytes` (None: by the message).
fn small_pipeline(world: usize, slot_bytes: usize, chunk_bytes: Option<usize>) -> CommOptions {
    CommOptions { small_max_bytes: 2 << 10, slot_bytes, chunk_bytes, ..CommOptions::for_world(world) }
}

/// [`folds_among`]'s all-reduces with the communicator made with `options`.
fn folds_with(test: &str, world: usize, lens: &'static [usize], options: CommOptions) {
    if !runs_here(test, world) {
        return;
    }
    // Waits that never give up would leave every other rank's process stuck on the GPU if one
    // rank failed: each process ends itself past a deadline instead.
    let deadline = (options.waits == FlagWaits::Unbounded).then(|| ExitPast::start(test, UNBOUNDED_TEST_DEADLINE));
    let mut r = Ranked::start(test, world, sharing(options));
    assert_eq!(r.comm.waits(), options.waits, "the waits asked for");
    let (rank, world) = (r.rank, r.world);
    fn cases<T: Reference>(comm: &mut Communicator, stream: &Stream, rank: usize, world: usize, lens: &[usize]) {
        let mut pending: Vec<Check> = Vec::new();
        for (case, &len) in lens.iter().enumerate() {
            for (o, op) in ReduceOp::ALL.into_iter().enumerate() {
                let inputs = inputs_of::<T>(world, len, 41, (case * 8 + o) as u64);
                let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
                comm.all_reduce(&mut buf.view_mut(..), stream, op).unwrap();
                pending.push(Box::new(move |s| {
                    let got = buf.to_host_vec(s).unwrap();
                    check_fold(&format!("rank {rank} {op} len {len}"), &got, &inputs, 0..len, op);
                }));
            }
        }
        for check in pending {
            check(stream);
        }
    }
    every_dtype!(cases(&mut r.comm, &r.stream, rank, world, lens));
    r.finish();
    drop(deadline);
}

/// How long a test of unbounded waits may take in any of its processes: well past what its
/// few calls take (under a sanitizer too), well before the suite's runner gives up on the
/// whole binary (`benches/device/suite.sh`).
const UNBOUNDED_TEST_DEADLINE: Duration = Duration::from_secs(240);

/// A thread that ends this process, saying why, if it is still running `deadline` after
/// `start` and the value has not been dropped.
struct ExitPast(Arc<AtomicBool>);

impl ExitPast {
    fn start(test: &str, deadline: Duration) -> ExitPast {
        let done = Arc::new(AtomicBool::new(false));
        let (watched, test) = (Arc::clone(&done), test.to_string());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !watched.load(Ordering::Relaxed) {
                if start.elapsed() > deadline {
                    eprintln!(
                        "{test}: still running after {deadline:?} (a rank's waits never gave up); ending this process"
                    );
                    std::process::exit(3);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        ExitPast(done)
    }
}

impl Drop for ExitPast {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

const TWO_RANK_LENS: &[usize] = &[1, 255, 4099, 70_001, 300_007];

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_forced_to_two_shot_run_the_rounds_above_the_one_kernel_sizes() {
    let test = "one_gpu_two_processes_forced_to_two_shot_run_the_rounds_above_the_one_kernel_sizes";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_among(test, 2, TWO_RANK_LENS, Some(Algorithm::TwoShot), Receive::ZeroCopy);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_fold_from_a_scratch_in_the_exchange() {
    let test = "one_gpu_two_processes_fold_from_a_scratch_in_the_exchange";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    // The exchange where the two share the GPU takes the rounds unless one-shot is forced.
    folds_among(test, 2, TWO_RANK_LENS, Some(Algorithm::OneShot), Receive::Scratch);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_fold_from_a_scratch_in_the_rounds() {
    let test = "one_gpu_two_processes_fold_from_a_scratch_in_the_rounds";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_among(test, 2, TWO_RANK_LENS, Some(Algorithm::TwoShot), Receive::Scratch);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_forced_to_two_shot_run_the_rounds_at_every_size() {
    let test = "one_gpu_four_processes_forced_to_two_shot_run_the_rounds_at_every_size";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_among(test, 4, &[1, 3, 7, 255, 4099], Some(Algorithm::TwoShot), Receive::ZeroCopy);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_fold_from_a_scratch() {
    let test = "one_gpu_four_processes_fold_from_a_scratch";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_among(test, 4, &[1, 255, 4099, 70_001, 300_007], None, Receive::Scratch);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_exchange_in_chunks_by_the_message() {
    // Slots of 4 MiB: 1.3 M elements of 4 bytes cross in four chunks of a quarter, the last
    // shorter; of one byte, in two of 1 MiB; 70,001 in one.
    let test = "one_gpu_two_processes_exchange_in_chunks_by_the_message";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with(test, 2, &[70_001, 1_300_007], exchange(small_pipeline(2, 4 << 20, None)));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_exchange_in_fixed_chunks_smaller_than_a_slot() {
    let test = "one_gpu_two_processes_exchange_in_fixed_chunks_smaller_than_a_slot";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with(test, 2, TWO_RANK_LENS, exchange(small_pipeline(2, 256 << 10, Some(64 << 10))));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_three_processes_run_the_rounds_in_fixed_chunks_smaller_than_a_slot() {
    // Slots of 256 KiB, chunks of 64 KiB: 300,007 elements' shares take up to seven chunks,
    // through the default slots (four a rank among three).
    let test = "one_gpu_three_processes_run_the_rounds_in_fixed_chunks_smaller_than_a_slot";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with(test, 3, &[1, 4099, 70_001, 300_007], small_pipeline(3, 256 << 10, Some(64 << 10)));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_three_processes_fold_small_landings_in_place_and_large_ones_through_the_scratch() {
    // Slots (so chunks) of 384 KiB and the default receive, which folds landings of at most
    // 256 KiB in place: 460,801 elements' shares of about 600 KiB (4-byte types) land as a
    // 384 KiB chunk through the scratch, then about 216 KiB in place, in one call; of one byte
    // every landing in place, of two every one through the scratch, of eight both, in turn.
    let test = "one_gpu_three_processes_fold_small_landings_in_place_and_large_ones_through_the_scratch";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with(test, 3, &[460_801], small_pipeline(3, 384 << 10, None));
}

/// Options whose one-kernel path runs the lines to 64 KiB and the two-shot in flagged chunks
/// above them to 1 MiB (the rounds past it), among `world` ranks.
fn many_chunks(world: usize) -> CommOptions {
    CommOptions { small_max_bytes: 1 << 20, many_chunks: true, ..CommOptions::for_world(world) }
}

/// Lengths for [`many_chunks`]' communicator, in one: 1,001 the lines for every dtype; 70,001
/// and 100,003 the flagged chunks for every dtype (of one byte just past the lines, of eight
/// up to 800 KiB); 16,411 the lines of one and two bytes, the chunks of four and eight;
/// 300,007 the chunks up to two bytes, the rounds of four and eight; 1,048,583 the rounds for
/// every dtype. So each kernel's calls follow the others'.
const MANY_CHUNK_LENS: &[usize] = &[1_001, 70_001, 16_411, 100_003, 300_007, 1_048_583];

/// [`folds_with`] on [`many_chunks`]' communicator, after checking it takes the chunks where
/// the lengths say.
fn folds_in_many_chunks(test: &str, world: usize) {
    let paths = gp2p_comm::choice::AllReducePaths::of(world, &many_chunks(world), None).unwrap();
    assert_eq!(paths.path_name(70_001), "two-shot (flagged chunks)");
    assert_eq!(paths.path_name(300_007 * 4), "two-shot (rounds)");
    folds_with(test, world, MANY_CHUNK_LENS, many_chunks(world));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_three_processes_run_the_two_shot_in_flagged_chunks() {
    let test = "one_gpu_three_processes_run_the_two_shot_in_flagged_chunks";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_in_many_chunks(test, 3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_eight_processes_run_the_two_shot_in_flagged_chunks() {
    let test = "one_gpu_eight_processes_run_the_two_shot_in_flagged_chunks";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_in_many_chunks(test, 8);
}

/// The pipelines the stream waits are tried on: the rounds among two (slots of 64 KiB, chunks
/// a slot: long shares take several), the exchange among two (chunks of 64 KiB through slots
/// of 256 KiB) and the rounds among four.
#[derive(Debug, Clone, Copy)]
enum WaitsOn {
    TwoRounds,
    TwoExchange,
    FourRounds,
}

/// [`folds_with`] on `on` with every wait of the pipeline `waits`.
fn folds_with_waits(test: &str, waits: FlagWaits, on: WaitsOn) {
    let (world, lens, options) = match on {
        WaitsOn::TwoRounds => {
            (2, TWO_RANK_LENS, CommOptions { algorithm: Some(Algorithm::TwoShot), ..small_pipeline(2, 64 << 10, None) })
        }
        WaitsOn::TwoExchange => (2, TWO_RANK_LENS, exchange(small_pipeline(2, 256 << 10, Some(64 << 10)))),
        WaitsOn::FourRounds => (4, &[1, 4099, 70_001, 300_007][..], small_pipeline(4, 64 << 10, None)),
    };
    folds_with(test, world, lens, CommOptions { waits, ..options });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_run_the_rounds_with_watched_waits() {
    let test = "one_gpu_two_processes_run_the_rounds_with_watched_waits";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with_waits(test, FlagWaits::Watched, WaitsOn::TwoRounds);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_exchange_with_watched_waits() {
    let test = "one_gpu_two_processes_exchange_with_watched_waits";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with_waits(test, FlagWaits::Watched, WaitsOn::TwoExchange);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_run_the_rounds_with_watched_waits() {
    let test = "one_gpu_four_processes_run_the_rounds_with_watched_waits";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with_waits(test, FlagWaits::Watched, WaitsOn::FourRounds);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_run_the_rounds_with_unbounded_waits() {
    let test = "one_gpu_two_processes_run_the_rounds_with_unbounded_waits";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with_waits(test, FlagWaits::Unbounded, WaitsOn::TwoRounds);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_exchange_with_unbounded_waits() {
    let test = "one_gpu_two_processes_exchange_with_unbounded_waits";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with_waits(test, FlagWaits::Unbounded, WaitsOn::TwoExchange);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_run_the_rounds_with_unbounded_waits() {
    let test = "one_gpu_four_processes_run_the_rounds_with_unbounded_waits";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    folds_with_waits(test, FlagWaits::Unbounded, WaitsOn::FourRounds);
}

/// Rank `r`'s bytes of case `case`, `len` of them: f32 specials where whole words (NaN with
/// payloads of either sign, −0.0, infinities, a subnormal), which a gather must keep bit for bit.
fn gather_bytes(r: usize, len: usize, case: usize) -> Vec<u8> {
    let specials = [0x7fc0_1234u32, 0xffc0_0001, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 1, 0x3f80_0000];
    let mut bytes: Vec<u8> = random::<u32>(len.div_ceil(4), (case * 16 + r) as u64)
        .iter()
        .enumerate()
        .flat_map(|(i, &x)| if i % 3 == 0 { specials[(i / 3 + r) % specials.len()] } else { x }.to_le_bytes())
        .collect();
    bytes.truncate(len);
    bytes
}

/// `bytes` on the device `offset` bytes into a buffer of its own (so the view starts off any
/// word boundary where `offset` is odd).
fn placed(stream: &Stream, bytes: &[u8], offset: usize) -> DeviceBuffer<u8> {
    let mut host = vec![0xa5u8; offset];
    host.extend_from_slice(bytes);
    DeviceBuffer::from_host(stream, &host).unwrap()
}

/// Small all-gathers (apart and in place) and broadcasts from every root, whole words and
/// odd bytes, each rank's bits as they were, and reduce-scatters of bytes (sum and max, apart
/// and in place, the rest of an in-place buffer as it was): the sizes that go as one
/// all-reduce kernel (`by_sum`), and above them. Odd ranks' buffers start a byte off a word boundary on
/// the even cases, so ranks of one call differ in alignment.
fn small_gathers_among(test: &str, world: usize) {
    if !runs_here(test, world) {
        return;
    }
    let mut r = Ranked::start(test, world, sharing(CommOptions::for_world(world)));
    let (rank, stream) = (r.rank, &r.stream);
    let mut pending: Vec<Check> = Vec::new();
    let above = (256 << 10) / world + 4;
    for (case, part) in [1, 3, 4, 1001, 4096, 4099, 16_384, above, 2 * above].into_iter().enumerate() {
        let off = usize::from(case % 2 == 0 && rank % 2 == 1);
        let parts: Vec<Vec<u8>> = (0..world).map(|q| gather_bytes(q, part, case)).collect();
        let want = parts.concat();
        let input = placed(stream, &parts[rank], off);
        let mut out = placed(stream, &gather_bytes(world + 1, part * world, case), off);
        r.comm.all_gather(&input.view(off..), &mut out.view_mut(off..), stream).unwrap();
        let mut stale = gather_bytes(world + 2, part * world, case);
        stale[rank * part..(rank + 1) * part].copy_from_slice(&parts[rank]);
        let mut in_place = placed(stream, &stale, off);
        r.comm.all_gather_in_place(&mut in_place.view_mut(off..), stream).unwrap();
        let mut broadcasts = Vec::new();
        for root in 0..world {
            let mut buf = placed(stream, &parts[rank], off);
            r.comm.broadcast(&mut buf.view_mut(off..), stream, root).unwrap();
            broadcasts.push((root, buf));
        }
        // Reduce-scatters of bytes (wrapping sums and maxima: exact), apart and in place.
        let wholes: Vec<Vec<u8>> = (0..world).map(|q| gather_bytes(q, part * world, case + 100)).collect();
        let mine = rank * part..(rank + 1) * part;
        let reduced = |f: fn(u8, u8) -> u8| -> Vec<u8> {
            (mine.clone()).map(|i| wholes.iter().skip(1).fold(wholes[0][i], |a, w| f(a, w[i]))).collect()
        };
        let mut scatters = Vec::new();
        for (op, f) in [(ReduceOp::Sum, u8::wrapping_add as fn(u8, u8) -> u8), (ReduceOp::Max, u8::max)] {
            let input = placed(stream, &wholes[rank], off);
            let mut out = placed(stream, &gather_bytes(world + 3, part, case), off);
            r.comm.reduce_scatter(&input.view(off..), &mut out.view_mut(off..), stream, op).unwrap();
            let mut in_place = placed(stream, &wholes[rank], off);
            r.comm.reduce_scatter_in_place(&mut in_place.view_mut(off..), stream, op).unwrap();
            let mut want_in_place = wholes[rank].clone();
            want_in_place[mine.clone()].copy_from_slice(&reduced(f));
            scatters.push((op, input, out, in_place, reduced(f), want_in_place));
        }
        let own_whole = wholes[rank].clone();
        let root_parts = parts.clone();
        pending.push(Box::new(move |s| {
            let what = format!("rank {rank} of {world}, parts of {part} bytes, {off} byte(s) off");
            for (op, input, out, in_place, want, want_in_place) in scatters {
                assert!(out.to_host_vec(s).unwrap()[off..] == want[..], "{what}: reduce_scatter {op}");
                assert!(in_place.to_host_vec(s).unwrap()[off..] == want_in_place[..], "{what}: in place {op}");
                assert!(input.to_host_vec(s).unwrap()[off..] == own_whole[..], "{what}: {op} changed its input");
            }
            assert!(out.to_host_vec(s).unwrap()[off..] == want[..], "{what}: all_gather");
            assert!(in_place.to_host_vec(s).unwrap()[off..] == want[..], "{what}: all_gather_in_place");
            assert!(input.to_host_vec(s).unwrap()[off..] == root_parts[rank][..], "{what}: the gather's input changed");
            for (root, buf) in broadcasts {
                assert!(buf.to_host_vec(s).unwrap()[off..] == root_parts[root][..], "{what}: broadcast from {root}");
            }
        }));
    }
    for check in pending {
        check(stream);
    }
    every_dtype!(small_scatters(&mut r.comm, &r.stream, 23));
    r.finish();
}

/// Small reduce-scatters of every op on `T` (the one all-reduce kernel and a copy), apart and
/// in place, each followed at once by a reduce-scatter on a second stream, which must wait
/// for the first's copy before its kernel writes the same device memory.
fn small_scatters<T: Reference>(comm: &mut Communicator, stream: &Stream, seed: u64) {
    let (rank, world) = (comm.rank(), comm.world());
    let other = Stream::new(comm.device()).unwrap();
    let mut pending: Vec<Check> = Vec::new();
    let mut case = 0u64;
    for part in [1, 257, 4099] {
        for op in ReduceOp::ALL {
            for s in [stream, &other] {
                case += 1;
                let inputs = inputs_of::<T>(world, world * part, seed, case);
                let input = DeviceBuffer::from_host(s, &inputs[rank]).unwrap();
                let mut out = DeviceBuffer::<T>::alloc(s.device(), part).unwrap();
                comm.reduce_scatter(&input.view(..), &mut out.view_mut(..), s, op).unwrap();
                let mut buf = DeviceBuffer::from_host(s, &inputs[rank]).unwrap();
                comm.reduce_scatter_in_place(&mut buf.view_mut(..), s, op).unwrap();
                let mine = rank * part..(rank + 1) * part;
                pending.push(Box::new(move |st| {
                    let what = format!("rank {rank} reduce_scatter {op} part {part}");
                    check_fold(&what, &out.to_host_vec(st).unwrap(), &inputs, mine.clone(), op);
                    let got = buf.to_host_vec(st).unwrap();
                    check_fold(&format!("{what} in place"), &got[mine.clone()], &inputs, mine.clone(), op);
                    // The inputs are finite (no NaN), so == says whether they stayed.
                    let kept = got.iter().zip(&inputs[rank]).enumerate().all(|(i, (g, x))| mine.contains(&i) || g == x);
                    assert!(kept, "{what} in place: the other parts changed");
                }));
            }
        }
    }
    other.synchronize().unwrap();
    for check in pending {
        check(stream);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_gather_scatter_and_broadcast_small_buffers_bit_for_bit() {
    let test = "one_gpu_two_processes_gather_scatter_and_broadcast_small_buffers_bit_for_bit";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    small_gathers_among(test, 2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_three_processes_gather_scatter_and_broadcast_small_buffers_bit_for_bit() {
    let test = "one_gpu_three_processes_gather_scatter_and_broadcast_small_buffers_bit_for_bit";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    small_gathers_among(test, 3);
}

/// Rank r's values of the compressed case `case`: random, with an outlier every 32 values,
/// a block of zeros, a tiny block, and on some ranks a NaN and infinities, as `T`.
fn compressible_inputs<T: Compressible>(world: usize, len: usize, case: u64) -> Vec<Vec<T>> {
    (0..world)
        .map(|r| {
            let mut rng = gp2p_tests::SplitMix64::new(0xC0 + case * 64 + r as u64);
            (0..len)
                .map(|i| {
                    let x = rng.next_f64_signed() as f32 * 3.0;
                    let v = match (i / 32 % 64, i % 32) {
                        (5, _) => 0.0,
                        (6, _) => x * 1e-33,
                        (_, 7) => x * 1e4,
                        (9, 3) if r % 3 == 1 => f32::NAN,
                        (11, 4) if r % 3 == 2 => f32::INFINITY,
                        (11, 5) if r % 3 == 0 => f32::NEG_INFINITY,
                        _ => x,
                    };
                    T::from_f32(v)
                })
                .collect()
        })
        .collect()
}

/// The compressed all-reduce of every float type, format, op and a few block sizes and
/// lengths (slots of 64 KiB, so long buffers take several pieces a shard), each in place and
/// then out of place on every rank (the second call reuses the wires): every rank's result
/// equals `gp2p_kernels::compress::all_reduce_by`'s for the communicator's shots (the one-shot
/// between two ranks), bit for bit (NaN as NaN). Every mismatch is
/// gathered, with its first values, before the test fails.
fn compressed_case<T: Compressible>(
    comm: &mut Communicator,
    stream: &Stream,
    lens: &[(usize, usize)],
    case: &mut u64,
    failed: &mut Vec<String>,
) {
    let (rank, world) = (comm.rank(), comm.world());
    for &(len, block) in lens {
        for format in Format::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                *case += 1;
                let block = BlockSize::new(block).unwrap();
                let inputs = compressible_inputs::<T>(world, len, *case);
                let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
                let want =
                    compress::all_reduce_by(&refs, op, Scheme { format, block }, comm.compressed_shots(len)).unwrap();
                let wire = WireFormat { format, block };
                let input = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
                let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
                comm.all_reduce_compressed(&mut buf.view_mut(..), stream, op, wire).unwrap();
                let mut out = DeviceBuffer::<T>::alloc(stream.device(), len).unwrap();
                comm.all_reduce_compressed_into(&input.view(..), &mut out.view_mut(..), stream, op, wire).unwrap();
                let what = format!("rank {rank} of {world}, {} {len} values, {format}/{}, {op}", T::DTYPE, block.get());
                // NaN as NaN in a result (its payload is the fold's); an input keeps its bits.
                let bits = |a: &T| a.to_f32().to_bits();
                let same_result = |a: &T, b: &T| bits(a) == bits(b) || (a.to_f32().is_nan() && b.to_f32().is_nan());
                for (how, got) in
                    [("in place", buf.to_host_vec(stream).unwrap()), ("into", out.to_host_vec(stream).unwrap())]
                {
                    if let Some(wrong) = differences(&got, &want[rank], same_result) {
                        failed.push(format!("{what}, {how}: {wrong}"));
                    }
                }
                // Listed, not asserted: a rank that stopped here would leave the others waiting
                // for its next call until the peer timeout, hiding what changed.
                let after = input.to_host_vec(stream).unwrap();
                if let Some(changed) = differences(&after, &inputs[rank], |a, b| bits(a) == bits(b)) {
                    failed.push(format!("{what}: the input changed: {changed}"));
                }
            }
        }
    }
}

/// Where `got` differs from `want` under `same`: how many values and the first few, or None.
fn differences<T: Compressible>(got: &[T], want: &[T], same: impl Fn(&T, &T) -> bool) -> Option<String> {
    let at: Vec<usize> = (0..want.len()).filter(|&i| !same(&got[i], &want[i])).collect();
    let first: Vec<String> =
        at.iter().take(4).map(|&i| format!("[{i}] {:e} where {:e}", got[i].to_f32(), want[i].to_f32())).collect();
    (!at.is_empty()).then(|| format!("{} values differ: {}", at.len(), first.join(", ")))
}

/// The lengths and block sizes of [`compressed_among`]'s cases.
const COMPRESSED_LENS: &[(usize, usize)] = &[(1, 32), (1000, 32), (70_001, 64), (300_000, 256)];

fn compressed_among(test: &str, world: usize) {
    compressed_with(
        test,
        world,
        CommOptions { slot_bytes: 64 << 10, ..CommOptions::for_world(world) },
        COMPRESSED_LENS,
    );
}

/// [`compressed_case`] of every float type with the communicator made with `options`.
fn compressed_with(test: &str, world: usize, options: CommOptions, lens: &[(usize, usize)]) {
    if !runs_here(test, world) {
        return;
    }
    let mut r = Ranked::start(test, world, sharing(options));
    let (mut case, mut failed) = (0, Vec::new());
    compressed_case::<f32>(&mut r.comm, &r.stream, lens, &mut case, &mut failed);
    compressed_case::<half::f16>(&mut r.comm, &r.stream, lens, &mut case, &mut failed);
    compressed_case::<half::bf16>(&mut r.comm, &r.stream, lens, &mut case, &mut failed);
    assert!(failed.is_empty(), "{} calls wrong:\n{}", failed.len(), failed[..failed.len().min(24)].join("\n"));
    let mut ints = DeviceBuffer::from_host(&r.stream, &[1i32; 10]).unwrap();
    let wire = WireFormat { format: Format::Int8, block: BlockSize::new(32).unwrap() };
    let refused = r.comm.all_reduce_compressed(&mut ints.view_mut(..), &r.stream, ReduceOp::Sum, wire).unwrap_err();
    assert!(refused.to_string().contains("f32, f16 or bf16"), "{refused}");
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_compressed_shards_in_pipelined_pieces_give_the_reference_s_bits() {
    // The one-shot, forced (above two million values two ranks take the two-shot, which the
    // next test forces), slots of 32 MiB: buffers of about 8.8 Mi values (blocks of 64) and
    // 16 Mi (blocks of 128) go as four even pieces (`PIPELINED_PIECES`), by the pieces' rule,
    // not the slot.
    let test = "one_gpu_two_processes_compressed_shards_in_pipelined_pieces_give_the_reference_s_bits";
    if !is_child() {
        needs!(gpus: 1);
    }
    let options =
        CommOptions { slot_bytes: 32 << 20, algorithm: Some(Algorithm::OneShot), ..CommOptions::for_world(2) };
    compressed_with(test, 2, options, &[(8_800_003, 64), (16 << 20, 128)]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_forced_two_shot_compressed_gives_the_reference_s_bits() {
    // The two-shot, forced, through slots of 32 MiB: the short cases, then shards of about
    // 4.4 Mi values (blocks of 64) and of 8 Mi (blocks of 128) as two and four even pieces (at
    // least 2 Mi values each).
    let test = "one_gpu_two_processes_forced_two_shot_compressed_gives_the_reference_s_bits";
    if !is_child() {
        needs!(gpus: 1);
    }
    let two_shot =
        |slot_bytes| CommOptions { slot_bytes, algorithm: Some(Algorithm::TwoShot), ..CommOptions::for_world(2) };
    let mut lens = COMPRESSED_LENS.to_vec();
    lens.extend([(8_800_003, 64), (16 << 20, 128)]);
    compressed_with(test, 2, two_shot(32 << 20), &lens);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_compressed_all_reduce_gives_the_reference_s_bits() {
    if !is_child() {
        needs!(gpus: 1);
    }
    compressed_among("one_gpu_two_processes_compressed_all_reduce_gives_the_reference_s_bits", 2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_compressed_all_reduce_gives_the_reference_s_bits() {
    if !is_child() {
        needs!(gpus: 1);
    }
    compressed_among("one_gpu_four_processes_compressed_all_reduce_gives_the_reference_s_bits", 4);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_eight_processes_compressed_all_reduce_gives_the_reference_s_bits() {
    if !is_child() {
        needs!(gpus: 1);
    }
    compressed_among("one_gpu_eight_processes_compressed_all_reduce_gives_the_reference_s_bits", 8);
}

/// The last rank leaves after one call; every other rank's next call gives up within the
/// timeout, the one after says so, and nothing is left in /dev/shm.
fn a_rank_exits(test: &str, world: usize, len: usize, waits: FlagWaits) {
    if !runs_here(test, world) {
        return;
    }
    let sanitized = gp2p_tests::sanitizer().is_some();
    // Long enough for every rank's first call under time slicing, short enough to tell one
    // timeout per call from one per chunk.
    let timeout = Duration::from_secs(if sanitized { 20 } else { 5 });
    let options = CommOptions { peer_timeout: timeout, waits, ..CommOptions::for_world(world) };
    let mut r = Ranked::start(test, world, options);
    assert_eq!(r.comm.waits(), waits);
    let (rank, stream, comm) = (r.rank, &r.stream, &mut r.comm);
    let inputs = inputs_of::<f32>(world, len, 9, 1);
    let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
    comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
    stream.synchronize().unwrap();
    if rank == world - 1 {
        // Leaves as a crashed process would, without a word.
        std::process::exit(0);
    }
    let path = format!("/dev/shm{}", comm.segment_name());
    assert!(!std::path::Path::new(&path).exists(), "{path} is gone once every rank joined");
    let started = Instant::now();
    comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
    stream.synchronize().unwrap();
    let waited = started.elapsed();
    // A rank may hear of it from another's give-up before its own wait ends.
    assert!(waited < timeout * 4, "rank {rank}: the call gave up after {waited:?} (timeout {timeout:?})");
    let err = comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("waited") || text.contains("broken") || text.contains("gave up"), "rank {rank}: {text}");
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_one_exits_mid_run_and_every_other_errors_within_the_timeout() {
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    a_rank_exits(
        "one_gpu_four_processes_one_exits_mid_run_and_every_other_errors_within_the_timeout",
        4,
        1000,
        FlagWaits::Kernel,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_one_exits_mid_rounds_and_every_other_errors_within_the_timeout() {
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    a_rank_exits(
        "one_gpu_four_processes_one_exits_mid_rounds_and_every_other_errors_within_the_timeout",
        4,
        1 << 20,
        FlagWaits::Kernel,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_four_processes_one_exits_mid_rounds_with_watched_waits_and_every_other_errors_within_the_timeout() {
    // The rounds' waits as stream memory operations: the watchdog, not a kernel's clock,
    // gives up on the rank that left and ends the others' waits.
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    a_rank_exits(
        "one_gpu_four_processes_one_exits_mid_rounds_with_watched_waits_and_every_other_errors_within_the_timeout",
        4,
        1 << 20,
        FlagWaits::Watched,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_ranks_that_disagree_on_the_world_size_are_refused() {
    let test = "one_gpu_ranks_that_disagree_on_the_world_size_are_refused";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    let _serial = (!is_child()).then(gp2p_tests::serial);
    // Rank 0 says three ranks and starts two others, which say four.
    let (rank, world, id, children) = rank_world_id(test, 3);
    let world = if rank == 0 { world } else { 4 };
    let options = CommOptions { join_timeout: Duration::from_secs(10), ..CommOptions::for_world(world) };
    match Communicator::new(&id, rank, world, &device(0), options) {
        Ok(_) => panic!("rank {rank} of {world} joined a communicator of other sizes"),
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("world") || text.contains("rank") || text.contains("size"), "rank {rank}: {text}");
        }
    }
    children.wait();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn more_ranks_than_the_communicator_takes_are_refused_by_name_at_creation() {
    needs!(gpus: 1, compute_80);
    let id = UniqueId::new().unwrap();
    let err = Communicator::new(&id, 0, 9, &device(0), CommOptions::default()).unwrap_err();
    assert!(err.to_string().contains("world: 9 ranks; pass between 1 and 8"), "{err}");
}

/// Calls replayed from graphs (`CommOptions::replay_calls`): each buffer called four times
/// with new values, so the first call is enqueued, the second captured into a graph and the
/// two after launch it. All-reduces of every op on every dtype through the pipeline (two ranks'
/// exchange, the rounds among more, slots of 256 KiB so the larger length takes several
/// chunks), all-gathers and broadcasts of bytes through the pipeline, and compressed
/// all-reduces of bf16, each result checked against the reference after its call; and the
/// counts say every key went so.
fn replayed_among(test: &str, world: usize) {
    if !runs_here(test, world) {
        return;
    }
    const CALLS: usize = 4;
    // Two ranks replay the exchange (the rounds: three ranks).
    let small = small_pipeline(world, 256 << 10, None);
    let options = CommOptions { replay_calls: Some(true), ..if world == 2 { exchange(small) } else { small } };
    let mut r = Ranked::start(test, world, sharing(options));
    fn cases<T: Reference>(comm: &mut Communicator, stream: &Stream) {
        let (rank, world) = (comm.rank(), comm.world());
        for (case, len) in [4099usize, 300_007].into_iter().enumerate() {
            let mut buf = DeviceBuffer::<T>::alloc(comm.device(), len).unwrap();
            for call in 0..CALLS {
                for (o, op) in ReduceOp::ALL.into_iter().enumerate() {
                    let inputs = inputs_of::<T>(world, len, 47, (case * 64 + call * 8 + o) as u64);
                    buf.upload(stream, &inputs[rank]).unwrap();
                    comm.all_reduce(&mut buf.view_mut(..), stream, op).unwrap();
                    let got = buf.to_host_vec(stream).unwrap();
                    check_fold(&format!("rank {rank} {op} len {len} call {call}"), &got, &inputs, 0..len, op);
                }
            }
        }
    }
    every_dtype!(cases(&mut r.comm, &r.stream));
    let (rank, stream) = (r.rank, &r.stream);
    // Above the sizes a gather or broadcast takes as one all-reduce kernel (`by_sum`).
    let part = 300_001;
    let mut input = DeviceBuffer::<u8>::alloc(r.comm.device(), part).unwrap();
    let mut out = DeviceBuffer::<u8>::alloc(r.comm.device(), part * world).unwrap();
    let mut own = DeviceBuffer::<u8>::alloc(r.comm.device(), part).unwrap();
    let root = world - 1;
    for call in 0..CALLS {
        let parts: Vec<Vec<u8>> = (0..world).map(|q| gather_bytes(q, part, 200 + call)).collect();
        input.upload(stream, &parts[rank]).unwrap();
        r.comm.all_gather(&input.view(..), &mut out.view_mut(..), stream).unwrap();
        assert!(out.to_host_vec(stream).unwrap() == parts.concat(), "rank {rank}: all_gather, call {call}");
        own.upload(stream, &parts[rank]).unwrap();
        r.comm.broadcast(&mut own.view_mut(..), stream, root).unwrap();
        assert!(own.to_host_vec(stream).unwrap() == parts[root], "rank {rank}: broadcast from {root}, call {call}");
    }
    // The compressed all-reduce (two ranks' one-shot, whose encodes and folds meet through
    // events, and the two-shot among three), its pieces several slots' worth: the reference's
    // bits after every call.
    let len = 300_007;
    let scheme = Scheme { format: Format::Int8, block: BlockSize::new(64).unwrap() };
    let wire = WireFormat { format: scheme.format, block: scheme.block };
    let mut buf = DeviceBuffer::<half::bf16>::alloc(r.comm.device(), len).unwrap();
    for call in 0..CALLS {
        let inputs = compressible_inputs::<half::bf16>(world, len, 500 + call as u64);
        let refs: Vec<&[half::bf16]> = inputs.iter().map(Vec::as_slice).collect();
        let want = compress::all_reduce_by(&refs, ReduceOp::Sum, scheme, r.comm.compressed_shots(len)).unwrap();
        buf.upload(stream, &inputs[rank]).unwrap();
        r.comm.all_reduce_compressed(&mut buf.view_mut(..), stream, ReduceOp::Sum, wire).unwrap();
        let same = |a: &half::bf16, b: &half::bf16| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let wrong = differences(&buf.to_host_vec(stream).unwrap(), &want[rank], same);
        assert!(wrong.is_none(), "rank {rank}: compressed call {call}: {wrong:?}");
    }
    let Some(counts) = r.comm.replay_counts() else { unreachable!("replays were asked for") };
    assert_eq!((counts.failed_captures, counts.first_failure.as_deref()), (0, None), "rank {rank}");
    assert!(counts.captured > 0, "rank {rank}: {counts:?}");
    assert_eq!(counts.replayed, 2 * counts.captured, "rank {rank}: every key replayed twice: {counts:?}");
    assert_eq!(counts.enqueued, counts.captured, "rank {rank}: and enqueued once: {counts:?}");
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_replay_their_exchanges_from_graphs() {
    let test = "one_gpu_two_processes_replay_their_exchanges_from_graphs";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    replayed_among(test, 2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_three_processes_replay_their_rounds_from_graphs() {
    let test = "one_gpu_three_processes_replay_their_rounds_from_graphs";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    replayed_among(test, 3);
}

/// Traced calls (`Communicator::start_timeline`) among `world` processes with replays on: an
/// all-reduce through the pipeline (slots of 256 KiB, several chunks) three times, then a
/// compressed one, each result checked; the stamps must tell the call's story in order: the
/// call's start first and its end last on the caller's stream, each stream's stamps in time
/// order between them, copies out on the send stream that moved at most the buffer and the
/// folds' or copies' landings on the receive stream. Traced calls are never replayed, and
/// once read the timeline is off: the next calls replay and stamp nothing.
fn traced_among(test: &str, world: usize) {
    if !runs_here(test, world) {
        return;
    }
    // Two ranks trace the exchange's steps (the rounds': three ranks).
    let small = small_pipeline(world, 256 << 10, None);
    let options = CommOptions { replay_calls: Some(true), ..if world == 2 { exchange(small) } else { small } };
    let mut r = Ranked::start(test, world, sharing(options));
    let (rank, stream) = (r.rank, &r.stream);
    let len = 300_007;
    let mut buf = DeviceBuffer::<f32>::alloc(r.comm.device(), len).unwrap();
    let check_story = |stamps: &[geforce_p2p::cuda::Stamp], what: &str| {
        let (first, last) = (stamps.first().unwrap(), stamps.last().unwrap());
        assert_eq!((first.mark.stream, first.mark.what), ("caller", "start"), "rank {rank} {what}");
        assert_eq!((last.mark.stream, last.mark.what), ("caller", "end"), "rank {rank} {what}");
        assert!(stamps.iter().all(|s| s.ns >= first.ns && s.ns <= last.ns), "rank {rank} {what}: {stamps:?}");
        for name in ["caller", "send", "receive"] {
            let times: Vec<u64> = stamps.iter().filter(|s| s.mark.stream == name).map(|s| s.ns).collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "rank {rank} {what}: {name} out of order: {times:?}");
        }
    };
    for call in 0..3u64 {
        let inputs = inputs_of::<f32>(world, len, 53, call);
        buf.upload(stream, &inputs[rank]).unwrap();
        r.comm.start_timeline().unwrap();
        r.comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
        let stamps = r.comm.read_timeline(stream).unwrap().stamps;
        check_fold(
            &format!("rank {rank} traced call {call}"),
            &buf.to_host_vec(stream).unwrap(),
            &inputs,
            0..len,
            ReduceOp::Sum,
        );
        check_story(&stamps, &format!("call {call}"));
        let sent: usize =
            stamps.iter().filter(|s| (s.mark.stream, s.mark.what) == ("send", "copy out")).map(|s| s.mark.bytes).sum();
        assert!(sent > 0 && sent <= len * 4, "rank {rank} call {call}: {sent} bytes copied out");
        let landings = ["fold", "fold zero-copy", "land copy", "land dma"];
        assert!(
            stamps.iter().any(|s| s.mark.stream == "receive" && landings.contains(&s.mark.what)),
            "rank {rank} call {call}: no landing stamped: {stamps:?}"
        );
    }
    let Some(counts) = r.comm.replay_counts() else { unreachable!("replays were asked for") };
    assert_eq!((counts.replayed, counts.captured), (0, 0), "rank {rank}: traced calls are enqueued: {counts:?}");
    for call in 0..3u64 {
        let inputs = inputs_of::<f32>(world, len, 59, call);
        buf.upload(stream, &inputs[rank]).unwrap();
        r.comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
        check_fold(
            &format!("rank {rank} call {call} after"),
            &buf.to_host_vec(stream).unwrap(),
            &inputs,
            0..len,
            ReduceOp::Sum,
        );
    }
    assert_eq!(r.comm.read_timeline(stream).unwrap(), Default::default(), "rank {rank}: off once read");
    let Some(counts) = r.comm.replay_counts() else { unreachable!("replays were asked for") };
    assert!(counts.replayed > 0, "rank {rank}: untraced calls replay again: {counts:?}");
    let inputs = compressible_inputs::<half::bf16>(world, len, 77);
    let refs: Vec<&[half::bf16]> = inputs.iter().map(Vec::as_slice).collect();
    let scheme = Scheme { format: Format::Int8, block: BlockSize::new(64).unwrap() };
    let want = compress::all_reduce_by(&refs, ReduceOp::Sum, scheme, r.comm.compressed_shots(len)).unwrap();
    let mut wide = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
    r.comm.start_timeline().unwrap();
    let wire = WireFormat { format: scheme.format, block: scheme.block };
    r.comm.all_reduce_compressed(&mut wide.view_mut(..), stream, ReduceOp::Sum, wire).unwrap();
    let stamps = r.comm.read_timeline(stream).unwrap().stamps;
    let bits = |a: &half::bf16| a.to_bits();
    let same = |a: &half::bf16, b: &half::bf16| bits(a) == bits(b) || (a.is_nan() && b.is_nan());
    let got = wide.to_host_vec(stream).unwrap();
    assert!(differences(&got, &want[rank], same).is_none(), "rank {rank}: the traced compressed call");
    check_story(&stamps, "compressed");
    // Two ranks fold every wire into the output once (the one-shot, up to its size); the
    // two-shot folds a shard into a wire and decodes the gathered ones.
    let steps: &[&str] = match r.comm.compressed_shots(len) {
        compress::Shots::One => &["encode", "wire dma", "exact blocks", "fold decode"],
        compress::Shots::Two => &["fold encode", "encode", "wire dma", "exact blocks", "decode"],
    };
    for what in steps {
        assert!(stamps.iter().any(|s| s.mark.what == *what), "rank {rank}: no {what} stamped: {stamps:?}");
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_stamp_every_step_of_a_traced_call() {
    let test = "one_gpu_two_processes_stamp_every_step_of_a_traced_call";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    traced_among(test, 2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_three_processes_stamp_every_step_of_a_traced_call() {
    let test = "one_gpu_three_processes_stamp_every_step_of_a_traced_call";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    traced_among(test, 3);
}
