//! GPU: the one-process-per-GPU communicator, two processes on two GPUs. The test starts as
//! rank 0, runs itself again as rank 1 (the child selected by GP2P_COMM_TEST_RANK1, which
//! carries the unique id), and both check every result against a CPU reference: each rank
//! knows both ranks' inputs, which come from seeds.

// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![forbid(unsafe_code)]

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use geforce_p2p::{DeviceBuffer, ReduceOp, Stream};
use gp2p_collectives::Collective;
use gp2p_collectives::reference::expected;
use gp2p_comm::{CommOptions, Communicator, FlagWaits, UniqueId};
use gp2p_tests::{Reference, count_mismatched, device, every_dtype, needs, random};

/// Set in the child: the unique id, as hex.
const CHILD_ENV: &str = "GP2P_COMM_TEST_RANK1";

/// This process's rank and the communicator's id: rank 1 in the child, else rank 0 with a
/// child started on `test` (returned, to be waited for).
fn rank_and_id(test: &str) -> (usize, UniqueId, Option<std::process::Child>) {
    if let Ok(hex) = std::env::var(CHILD_ENV) {
        return (1, hex.parse().expect("the parent's unique id"), None);
    }
    let id = UniqueId::new().expect("a unique id (is /dev/shm there?)");
    let exe = std::env::current_exe().unwrap();
    // The child's output goes to a file, shown only if it fails: its libtest summary must not
    // reach the runner, which counts summary lines.
    let log = File::create(child_log()).expect("a log file for rank 1");
    let child = Command::new(exe)
        .args([test, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, id.to_string())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting rank 1");
    (0, id, Some(child))
}

fn child_log() -> PathBuf {
    std::env::temp_dir().join(format!("gp2p-comm-rank1-{}.log", std::process::id()))
}

fn wait_for(child: Option<std::process::Child>) {
    if let Some(mut child) = child {
        let ok = child.wait().unwrap().success();
        let output = std::fs::read_to_string(child_log()).unwrap_or_default();
        let _ = std::fs::remove_file(child_log());
        assert!(ok, "rank 1 failed:\n{output}");
    }
}

/// Whether this process is rank 1, started by rank 0.
fn is_child() -> bool {
    std::env::var(CHILD_ENV).is_ok()
}

/// Rank 1's process, held by rank 0: killed if rank 0 fails before waiting for its verdict,
/// rather than left to run on.
struct Child(Option<std::process::Child>);

impl Child {
    /// Wait for rank 1's verdict (nothing to wait for in rank 1 itself).
    fn wait(mut self) {
        wait_for(self.0.take());
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One rank of a two-process test: its communicator on its device, a stream, and (rank 0)
/// the child to wait for and the suite's serial lock.
struct Ranked {
    rank: usize,
    stream: Stream,
    comm: Communicator,
    child: Child,
    _serial: Option<std::sync::MutexGuard<'static, ()>>,
}

impl Ranked {
    /// Start (rank 0: also start rank 1 on `test`) and join the communicator, rank r on
    /// device r.
    fn start(test: &str, options: CommOptions) -> Ranked {
        Ranked::start_on(test, options, |rank| rank)
    }

    /// [`Ranked::start`] with both ranks on the first GPU. Their kernels then take turns on
    /// it (time slices, two contexts), so each waits for its peer up to 30 s, not `options`'.
    fn start_sharing_first_gpu(test: &str, options: CommOptions) -> Ranked {
        let options = CommOptions { peer_timeout: std::time::Duration::from_secs(30), ..options };
        Ranked::start_on(test, options, |_| 0)
    }

    /// [`Ranked::start`] with rank r on device `device_of(r)`.
    fn start_on(test: &str, options: CommOptions, device_of: fn(usize) -> usize) -> Ranked {
        let serial = (!is_child()).then(gp2p_tests::serial);
        let (rank, id, child) = rank_and_id(test);
        let child = Child(child);
        let dev = device(device_of(rank));
        let stream = Stream::new(&dev).unwrap();
        let comm = Communicator::new(&id, rank, 2, &dev, options).unwrap();
        Ranked { rank, stream, comm, child, _serial: serial }
    }

    /// Drop the communicator and (rank 0) wait for rank 1's verdict.
    fn finish(self) {
        let Ranked { comm, child, .. } = self;
        drop(comm);
        child.wait();
    }
}

/// One all_reduce per op at odd lengths, enqueued back to back on one stream; results
/// checked once all are queued. 255 elements take the line kernel for every dtype (at most
/// 2040 bytes), in many 16-byte groups: both planes of its lines.
fn every_op<T: Reference>(comm: &mut Communicator, stream: &Stream, seed: u64) {
    let max_len = comm.small_max_bytes() / size_of::<T>();
    let lens = [1usize, 7, 255, 4099, max_len];
    let cases: Vec<(usize, ReduceOp)> = lens.into_iter().flat_map(|len| ReduceOp::ALL.map(|op| (len, op))).collect();
    all_reduces::<T>(comm, stream, &cases, seed * 1000);
}

/// One all_reduce per `(len, op)` case on fresh random data, enqueued back to back on one
/// stream; results checked once all are queued.
fn all_reduces<T: Reference>(comm: &mut Communicator, stream: &Stream, cases: &[(usize, ReduceOp)], seed: u64) {
    let rank = comm.rank();
    let mut calls = Vec::new();
    for (c, &(len, op)) in cases.iter().enumerate() {
        let inputs: Vec<Vec<T>> = (0..2).map(|r| random(len, seed + 2 * c as u64 + r as u64)).collect();
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        // Out of place on one rank of each call, in turn: either kind pairs with the other.
        let out = if (c + rank).is_multiple_of(2) {
            comm.all_reduce(&mut buf.view_mut(..), stream, op).unwrap();
            None
        } else {
            let mut out = DeviceBuffer::<T>::alloc(stream.device(), len).unwrap();
            comm.all_reduce_into(&buf.view(..), &mut out.view_mut(..), stream, op).unwrap();
            Some(out)
        };
        calls.push((len, op, inputs, buf, out));
    }
    for (len, op, inputs, buf, out) in &calls {
        let want = expected(Collective::AllReduce, inputs, *op).swap_remove(rank);
        let result = out.as_ref().unwrap_or(buf);
        let (bad, first) = count_mismatched(&result.to_host_vec(stream).unwrap(), &want, *op);
        let how = if out.is_some() { "into" } else { "in place" };
        assert_eq!(bad, 0, "rank {rank} {} {op} {how} len {len}: {}", T::DTYPE, first.join("; "));
        if out.is_some() {
            assert!(buf.to_host_vec(stream).unwrap() == inputs[rank], "rank {rank} all_reduce_into wrote its input");
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_two_processes_all_reduce_every_op_and_dtype_and_a_thousand_back_to_back() {
    let test = "two_gpu_two_processes_all_reduce_every_op_and_dtype_and_a_thousand_back_to_back";
    if !is_child() {
        // Not `concurrent_kernels`: the two kernels that wait for each other are in two
        // processes, which a sanitizer's one-kernel-at-a-time within a process leaves alone.
        needs!(gpus: 2, compute_80);
    }
    let mut r = Ranked::start(test, CommOptions::default());
    let (rank, stream) = (r.rank, &r.stream);
    every_dtype!(every_op(&mut r.comm, stream, 7));
    // A thousand calls without host synchronisation, each on a buffer of its own, taking
    // the line kernel and the flagged chunks in turn (both number their calls from one
    // device counter).
    let mut calls = Vec::new();
    for c in 0..1000u64 {
        let len = if c % 2 == 0 { 333 } else { 5_001 };
        let inputs: Vec<Vec<u32>> = (0..2).map(|r| random(len, 100_000 + 2 * c + r)).collect();
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        r.comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
        calls.push((inputs, buf));
    }
    for (c, (inputs, buf)) in calls.iter().enumerate() {
        let want: Vec<u32> = inputs[0].iter().zip(&inputs[1]).map(|(a, b)| a.wrapping_add(*b)).collect();
        assert!(buf.to_host_vec(stream).unwrap() == want, "rank {rank} call {c}");
    }
    r.finish();
}

/// Options that send the pipeline's chunks through small slots, so a few hundred KiB take
/// many chunks and wrap around the slots several times; the one-kernel path stops at
/// 128 KiB, so a few hundred KiB take the pipeline.
fn small_slots() -> CommOptions {
    CommOptions { small_max_bytes: 128 << 10, slot_bytes: 64 << 10, slots: 2, ..CommOptions::default() }
}

/// Every collective through the pipeline at odd lengths (each op for the reductions),
/// enqueued back to back on one stream; results checked once all are queued.
fn every_collective<T: Reference>(comm: &mut Communicator, stream: &Stream, seed: u64) {
    let rank = comm.rank();
    let just_above = comm.small_max_bytes() / size_of::<T>() + 1;
    let many_chunks = (300 << 10) / size_of::<T>() + 3;
    let mut pending: Vec<(String, Vec<T>, DeviceBuffer<T>, ReduceOp)> = Vec::new();
    let inputs_of = |len: usize, case: u64| -> Vec<Vec<T>> {
        (0..2).map(|r| random(len, seed * 10_000 + case * 2 + r as u64)).collect()
    };
    let mut case = 0;
    for len in [just_above, many_chunks] {
        for op in ReduceOp::ALL {
            case += 1;
            let inputs = inputs_of(len, case);
            let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
            comm.all_reduce(&mut buf.view_mut(..), stream, op).unwrap();
            let want = expected(Collective::AllReduce, &inputs, op).swap_remove(rank);
            pending.push((format!("all_reduce {op} len {len}"), want, buf, op));
        }
    }
    let len = many_chunks;
    for op in ReduceOp::ALL {
        case += 1;
        let inputs = inputs_of(2 * len, case);
        let input = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        let mut output = DeviceBuffer::<T>::alloc(stream.device(), len).unwrap();
        comm.reduce_scatter(&input.view(..), &mut output.view_mut(..), stream, op).unwrap();
        let want = expected(Collective::ReduceScatter, &inputs, op).swap_remove(rank);
        pending.push((format!("reduce_scatter {op} len {len}"), want, output, op));
    }
    case += 1;
    let inputs = inputs_of(len, case);
    let input = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
    let mut output = DeviceBuffer::<T>::alloc(stream.device(), 2 * len).unwrap();
    comm.all_gather(&input.view(..), &mut output.view_mut(..), stream).unwrap();
    pending.push((format!("all_gather len {len}"), inputs.concat(), output, ReduceOp::Sum));
    // NCCL's in-place forms: this rank's input is its part of the output, its output its
    // part of the input.
    case += 1;
    let inputs = inputs_of(len, case);
    // The peer's part holds stale numbers, which the call overwrites.
    let mut whole: Vec<T> = random(2 * len, seed + 999);
    whole[rank * len..(rank + 1) * len].copy_from_slice(&inputs[rank]);
    let mut buf = DeviceBuffer::from_host(stream, &whole).unwrap();
    comm.all_gather_in_place(&mut buf.view_mut(..), stream).unwrap();
    pending.push((format!("all_gather_in_place len {len}"), inputs.concat(), buf, ReduceOp::Sum));
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        case += 1;
        let inputs = inputs_of(2 * len, case);
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        comm.reduce_scatter_in_place(&mut buf.view_mut(..), stream, op).unwrap();
        let mut want = inputs[rank].clone();
        let mine = expected(Collective::ReduceScatter, &inputs, op).swap_remove(rank);
        want[rank * len..(rank + 1) * len].copy_from_slice(&mine);
        pending.push((format!("reduce_scatter_in_place {op} len {len}"), want, buf, op));
    }
    for root in 0..2 {
        case += 1;
        let inputs = inputs_of(len, case);
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        comm.broadcast(&mut buf.view_mut(..), stream, root).unwrap();
        pending.push((format!("broadcast from {root} len {len}"), inputs[root].clone(), buf, ReduceOp::Sum));
    }
    // Point to point both ways, one short message and one of many chunks: the receiver's
    // buffer becomes the sender's, the sender's stays as it was. A peer that is this rank or
    // outside the world is refused before anything is enqueued (the calls still pair up).
    let mut buf = DeviceBuffer::<T>::alloc(stream.device(), 3).unwrap();
    let to_self = comm.send(&buf.view(..), stream, rank).unwrap_err();
    assert!(to_self.to_string().contains(&format!("peer: {rank} is not another rank")), "{to_self}");
    let outside = comm.recv(&mut buf.view_mut(..), stream, 2).unwrap_err();
    assert!(outside.to_string().contains("peer: 2 is not another rank"), "{outside}");
    drop(buf);
    for len in [3, len] {
        for sender in 0..2 {
            case += 1;
            let inputs = inputs_of(len, case);
            let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
            if rank == sender {
                comm.send(&buf.view(..), stream, 1 - rank).unwrap();
            } else {
                comm.recv(&mut buf.view_mut(..), stream, sender).unwrap();
            }
            pending.push((format!("send from {sender} len {len}"), inputs[sender].clone(), buf, ReduceOp::Sum));
        }
    }
    for (what, want, buf, op) in pending {
        let got = buf.to_host_vec(stream).unwrap();
        let (bad, first) = count_mismatched(&got, &want, op);
        assert_eq!(bad, 0, "rank {rank} {} {what}: {}", T::DTYPE, first.join("; "));
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_two_processes_pipeline_runs_every_collective_op_and_dtype_and_mixes_with_the_line_path() {
    let test = "two_gpu_two_processes_pipeline_runs_every_collective_op_and_dtype_and_mixes_with_the_line_path";
    if !is_child() {
        // As above: the waits across ranks are in two processes.
        needs!(gpus: 2, compute_80);
    }
    let mut r = Ranked::start(test, small_slots());
    let rank = r.rank;
    let paths = r.comm.all_reduce_paths();
    let past = paths.small_max + 1;
    assert!(!paths.shared_link && paths.path_name(past) == "exchange", "rank {rank}: cards of their own: {paths:?}");
    every_dtype!(every_collective(&mut r.comm, &r.stream, 11));
    // Two hundred calls without host synchronisation (twenty under a sanitizer, which runs
    // every kernel slowly), line path and pipeline in turn, on two streams in turn: each call
    // is ordered after the rank's previous one on either stream.
    let other = Stream::new(r.comm.device()).unwrap();
    let count = if gp2p_tests::sanitizer().is_some() { 20 } else { 200 };
    let mut calls = Vec::new();
    for c in 0..count {
        let len = if c % 2 == 0 { 333 } else { 70_001 };
        let stream = if c % 3 == 0 { &other } else { &r.stream };
        let inputs: Vec<Vec<u32>> = (0..2).map(|r| random(len, 200_000 + 2 * c + r)).collect();
        let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        r.comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
        calls.push((inputs, buf, stream));
    }
    for (c, (inputs, buf, stream)) in calls.iter().enumerate() {
        let want: Vec<u32> = inputs[0].iter().zip(&inputs[1]).map(|(a, b)| a.wrapping_add(*b)).collect();
        assert!(buf.to_host_vec(stream).unwrap() == want, "rank {rank} call {c} ({} elements)", want.len());
    }
    drop(calls);
    r.finish();
}

/// Rank 1 leaves after one call of `len` f32s; rank 0's next call gives up within the
/// timeout and the one after says so. (The callers check the test's needs.)
fn a_peer_exits(test: &str, len: usize) {
    // Under a sanitizer every launch is slow: a longer timeout, so that the first call (which
    // must succeed) never waits it out, and the bound below still tells one timeout per call
    // from one per chunk.
    let sanitized = gp2p_tests::sanitizer().is_some();
    let timeout = std::time::Duration::from_millis(if sanitized { 2000 } else { 300 });
    let mut r = Ranked::start(test, CommOptions { peer_timeout: timeout, ..small_slots() });
    let (rank, stream, comm) = (r.rank, &r.stream, &mut r.comm);
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| random(len, 90 + r as u64)).collect();
    let mut buf = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
    comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
    stream.synchronize().unwrap();
    if rank == 1 {
        // Rank 1 leaves after one call, as a crashed process would, without a word.
        std::process::exit(0);
    }
    // The shared name was unlinked once both ranks joined: nothing is left in /dev/shm.
    let path = format!("/dev/shm{}", comm.segment_name());
    assert!(!std::path::Path::new(&path).exists(), "{path} is gone once both ranks joined");
    let started = std::time::Instant::now();
    comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap();
    stream.synchronize().unwrap();
    let waited = started.elapsed();
    assert!(waited >= timeout && waited < timeout * 10, "the call gave up after {waited:?} (timeout {timeout:?})");
    let err = comm.all_reduce(&mut buf.view_mut(..), stream, ReduceOp::Sum).unwrap_err();
    assert!(err.to_string().contains("waited") && err.to_string().contains("rank 1"), "{err}");
    r.finish();
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_a_peer_that_exits_mid_run_gives_the_survivor_an_error_within_the_timeout() {
    if !is_child() {
        // Not `concurrent_kernels`: the two kernels that wait for each other are in two
        // processes, which a sanitizer's one-kernel-at-a-time within a process leaves alone.
        needs!(gpus: 2, compute_80);
    }
    a_peer_exits("two_gpu_a_peer_that_exits_mid_run_gives_the_survivor_an_error_within_the_timeout", 1000);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_a_peer_that_exits_mid_pipeline_gives_the_survivor_an_error_within_the_timeout() {
    if !is_child() {
        // As above: the waits across ranks are in two processes.
        needs!(gpus: 2, compute_80);
    }
    // Many chunks: one lost peer costs one timeout per call, not one per chunk.
    a_peer_exits("two_gpu_a_peer_that_exits_mid_pipeline_gives_the_survivor_an_error_within_the_timeout", 1 << 20);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_ranks_made_with_other_options_of_the_same_size_are_refused_by_name() {
    let test = "two_gpu_ranks_made_with_other_options_of_the_same_size_are_refused_by_name";
    if !is_child() {
        needs!(gpus: 2, compute_80);
    }
    let _serial = (!is_child()).then(gp2p_tests::serial);
    let (rank, id, child) = rank_and_id(test);
    let child = Child(child);
    let dev = device(rank);
    // 2 x 128 KiB and 4 x 64 KiB slots: the same segment size, other offsets.
    let (slot_bytes, slots) = if rank == 0 { (128 << 10, 2) } else { (64 << 10, 4) };
    let options = CommOptions { slot_bytes, slots, ..CommOptions::default() };
    match Communicator::new(&id, rank, 2, &dev, options) {
        Err(gp2p_comm::Error::OptionsMismatch { rank: other, .. }) => assert_eq!(other, 1 - rank),
        other => panic!("rank {rank}: {other:?}"),
    }
    child.wait();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_share_it_on_both_paths() {
    // Where one GPU is all there is, both ranks run on it: their kernels, in two contexts,
    // take turns on the GPU (time slices), so each wait lasts until the other's turn.
    let test = "one_gpu_two_processes_share_it_on_both_paths";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    let mut r = Ranked::start_sharing_first_gpu(test, small_slots());
    // One device, one link: past the one kernel the rounds, unforced.
    let paths = r.comm.all_reduce_paths();
    let past = paths.small_max + 1;
    assert!(paths.shared_link && paths.path_name(past) == "two-shot (rounds)", "rank {}: {paths:?}", r.rank);
    every_dtype!(every_op(&mut r.comm, &r.stream, 11));
    let cases = [(7, ReduceOp::Sum), (4099, ReduceOp::Max), (70_001, ReduceOp::Sum), (300_007, ReduceOp::Min)];
    all_reduces::<f32>(&mut r.comm, &r.stream, &cases, 500);
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_fold_many_chunks_a_block_through_the_handoff_barriers() {
    // The chunk kernel's teams hand each chunk over at named barriers four chunks deep, and
    // reuse them from the fifth chunk of a block on. With one block on rank 0 and three on
    // rank 1 (each rank may pick its own grid), a 128 KiB call is 32 chunks in one block on
    // rank 0 (every barrier reused seven times) and up to 11 a block on rank 1: every op and
    // dtype at odd lengths and at the limit, the line kernel off so that every call takes the
    // chunks. Both ranks on the first GPU.
    let test = "one_gpu_two_processes_fold_many_chunks_a_block_through_the_handoff_barriers";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    let chunk_blocks = if is_child() { 3 } else { 1 };
    let options = CommOptions { chunk_blocks, lines_max_bytes: 0, ..small_slots() };
    let mut r = Ranked::start_sharing_first_gpu(test, options);
    every_dtype!(every_op(&mut r.comm, &r.stream, 17));
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_processes_take_the_line_kernel_up_to_64_kib_when_told() {
    // CommOptions::lines_max_bytes at its bound: the line kernel in its one block (512 threads
    // past 4 KiB) over one or more 16-byte groups per thread, every op and dtype (4099
    // elements: 4099-32792 bytes, one to five groups a thread), and f32 up to the last element
    // that fits (eight groups a thread: two batches). Both ranks on the first GPU.
    let test = "two_processes_take_the_line_kernel_up_to_64_kib_when_told";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    let options = CommOptions { lines_max_bytes: 64 << 10, ..small_slots() };
    let mut r = Ranked::start_sharing_first_gpu(test, options);
    assert_eq!(r.comm.lines_max_bytes(), 64 << 10, "the option reached the communicator");
    every_dtype!(every_op(&mut r.comm, &r.stream, 13));
    let cases = [16_383usize, 16_384, 9_999].map(|len| (len, ReduceOp::Sum));
    all_reduces::<f32>(&mut r.comm, &r.stream, &cases, 900);
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_two_processes_replay_the_small_path_on_the_same_and_on_other_buffers() {
    // The small path's launches are replayed from graphs (gp2p_cuda::LaunchCache), a few per
    // kernel: a call like one a graph holds replays it as it is, another buffer or another
    // grid (the chunk kernel's grows with the size) gets a graph of its own while the kernel
    // has fewer than eight, and is set into the kernel's least recently used one after. Ten
    // buffers of the line kernel (61 elements) and ten of the chunk kernel at two grids
    // (3,001 and 30,001 elements), more than either kernel keeps graphs for, in a pattern of
    // repeats, switches and cycles, back to back with no synchronisation; every call checked:
    // each doubles its buffer (both ranks hold the same values after their first call on
    // it), so a replay with a stale buffer or grid leaves a wrong count somewhere.
    let test = "one_gpu_two_processes_replay_the_small_path_on_the_same_and_on_other_buffers";
    if !is_child() {
        needs!(gpus: 1, compute_80);
    }
    let mut r = Ranked::start_sharing_first_gpu(test, small_slots());
    let (rank, stream) = (r.rank, &r.stream);
    let lens: Vec<usize> = (0..20).map(|b| [61, 61, 3_001, 30_001][b / 10 * 2 + b % 2]).collect();
    let inputs: Vec<Vec<Vec<u32>>> = lens
        .iter()
        .enumerate()
        .map(|(b, &len)| (0..2).map(|r| random(len, 7_000 + 2 * b as u64 + r)).collect())
        .collect();
    let mut bufs: Vec<DeviceBuffer<u32>> =
        inputs.iter().map(|i| DeviceBuffer::from_host(stream, &i[rank]).unwrap()).collect();
    let mut calls = [0u32; 20];
    let switches = [0usize, 0, 0, 1, 1, 0, 10, 10, 11, 11, 10, 12, 13, 12, 12, 11, 13, 13, 10, 1, 10, 11, 0, 12];
    let cycles = (0..3).flat_map(|_| 0..20);
    for b in switches.into_iter().chain(cycles).chain((0..20).rev()) {
        r.comm.all_reduce(&mut bufs[b].view_mut(..), stream, ReduceOp::Sum).unwrap();
        calls[b] += 1;
    }
    for (b, buf) in bufs.iter().enumerate() {
        let factor = 1u32 << (calls[b] - 1);
        let want: Vec<u32> =
            inputs[b][0].iter().zip(&inputs[b][1]).map(|(x, y)| x.wrapping_add(*y).wrapping_mul(factor)).collect();
        assert!(buf.to_host_vec(stream).unwrap() == want, "rank {rank} buffer {b} of {} ({} calls)", lens[b], calls[b]);
    }
    r.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_waits_are_refused_where_the_ranks_are_threads_of_one_process() {
    // Streams of one process may share a hardware queue, where a stream memory wait holds
    // up the work behind it: every rank refuses, naming the option, watched or unbounded.
    let [dev] = needs!(gpus: 1);
    for waits in [FlagWaits::Watched, FlagWaits::Unbounded] {
        let id = UniqueId::new().expect("a unique id (is /dev/shm there?)");
        let options = CommOptions { waits, ..CommOptions::default() };
        let (a, b) = std::thread::scope(|s| {
            let (id, dev1) = (&id, dev.clone());
            let rank1 = s.spawn(move || Communicator::new(id, 1, 2, &dev1, options).err());
            (Communicator::new(id, 0, 2, &dev, options).err(), rank1.join().expect("rank 1 panicked"))
        });
        for (rank, refused) in [(0, a), (1, b)] {
            let err = refused.unwrap_or_else(|| panic!("rank {rank} made a communicator with {waits:?} waits"));
            assert!(matches!(err, gp2p_comm::Error::InvalidOption { name: "waits", .. }), "rank {rank}: {err}");
            assert!(err.to_string().contains("a process per rank"), "rank {rank}: {err}");
        }
    }
}
