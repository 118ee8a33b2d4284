//! GPU: the in-process collectives with 2 to 8 logical ranks sharing one GPU (feature
//! `testing`), through the ring's transfers and through the legs (the cost model's choice
//! from three ranks, and each forced). Every result is checked twice: against the same
//! pipeline replayed on host buffers with the CPU reference of each step (tight: the GPU's
//! order of operations), and
//! against a fold of all ranks' inputs computed independently of any schedule (exact for
//! integers, f64 with a bound that grows with n for floats). Outputs start poisoned.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::half::{bf16, f16};
use geforce_p2p::{Device, DeviceBuffer, ReduceOp, Stream};
use gp2p_collectives::cost::Algorithm;
use gp2p_collectives::reference::expected_with;
use gp2p_collectives::schedule::segment;
use gp2p_collectives::{Collective, Engine, Rank, Receive, all_gather, all_reduce, broadcast, reduce_scatter};
use gp2p_tests::{
    POISON, Reference, count_mismatched, count_wrong_vs_fold, device, every_dtype, max_len, needs, random, sanitizer,
};

const RECEIVE_PATHS: [Receive; 2] = [Receive::Scratch, Receive::ZeroCopy];
/// Up to this length results are also compared with the replayed schedule; the replay runs
/// on one thread, so longer cases are checked against the (parallel) fold alone.
const REPLAY_MAX_LEN: usize = 1 << 21;

/// One GPU, one stream per logical rank. The calling test states that it needs the GPU.
struct Ranks {
    device: Device,
    streams: Vec<Stream>,
}

impl Ranks {
    fn new(n: usize) -> Self {
        let device = device(0);
        let streams = (0..n).map(|_| Stream::new(&device).unwrap()).collect();
        Ranks { device, streams }
    }

    fn random<T: Reference>(&self, len: usize, seed: u64) -> Vec<Vec<T>> {
        (0..self.streams.len()).map(|r| random(len, seed.wrapping_mul(31).wrapping_add(r as u64))).collect()
    }

    fn upload<T: Reference>(&self, host: &[Vec<T>]) -> Vec<DeviceBuffer<T>> {
        host.iter().zip(&self.streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect()
    }

    fn poisoned<T: Reference>(&self, len: usize) -> Vec<DeviceBuffer<T>> {
        self.streams
            .iter()
            .map(|s| {
                let mut b = DeviceBuffer::alloc(&self.device, len).unwrap();
                b.fill_bytes(s, POISON).unwrap();
                b
            })
            .collect()
    }

    fn ranks<'a, T: Reference>(&'a self, bufs: &'a mut [DeviceBuffer<T>]) -> Vec<Rank<'a, T>> {
        bufs.iter_mut().zip(&self.streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect()
    }

    fn download<T: Reference>(&self, bufs: &[DeviceBuffer<T>]) -> Vec<Vec<T>> {
        bufs.iter().zip(&self.streams).map(|(b, s)| b.to_host_vec(s).unwrap()).collect()
    }
}

/// `got` equals the replayed `want` element by element, within the per-step tolerance.
fn check_replay<T: Reference>(got: &[T], want: &[T], op: ReduceOp, what: &str) {
    let (wrong, first) = count_mismatched(got, want, op);
    assert_eq!(wrong, 0, "{what}: {wrong} elements differ from the replayed schedule: {}", first.join("; "));
}

/// `got` is `op` over `inputs`, computed without the schedule.
fn check_fold<T: Reference>(got: &[T], inputs: &[&[T]], op: ReduceOp, what: &str) {
    let (wrong, first) = count_wrong_vs_fold(got, inputs, op);
    assert_eq!(wrong, 0, "{what}: {wrong} elements differ from the fold of the inputs: {}", first.join("; "));
}

/// One in-place all_reduce over `n` logical ranks of `len` elements, verified both ways.
fn all_reduce_case<T: Reference>(engine: &Engine, n: usize, len: usize, op: ReduceOp, receive: Receive, seed: u64) {
    let ranks = Ranks::new(n);
    let inputs = ranks.random::<T>(len, seed);
    let mut bufs = ranks.upload(&inputs);
    all_reduce(engine, &mut ranks.ranks(&mut bufs), op, receive).unwrap();
    let got = ranks.download(&bufs);
    let what = |r: usize| format!("all_reduce {} {op} n={n} len={len} {receive:?} rank {r}", T::DTYPE);
    let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    for (r, rank_got) in got.iter().enumerate() {
        check_fold(rank_got, &refs, op, &what(r));
        // Every rank ends with the same values (0-ulp tolerance, which takes +0 and -0 as one:
        // two ranks' min or max may differ there, as all_reduce's docs say).
        let (differ, first) = count_mismatched(rank_got, &got[0], ReduceOp::Sum);
        assert_eq!(differ, 0, "{}: differs from rank 0: {}", what(r), first.join("; "));
    }
    if len <= REPLAY_MAX_LEN {
        let want = expected_with(Collective::AllReduce, &inputs, op, engine.forced_algorithm().unwrap());
        for (r, (got, want)) in got.iter().zip(&want).enumerate() {
            check_replay(got, want, op, &what(r));
        }
    }
}

fn all_gather_case<T: Reference>(engine: &Engine, n: usize, part: usize, receive: Receive, seed: u64) {
    let ranks = Ranks::new(n);
    let inputs = ranks.random::<T>(part, seed);
    let bufs = ranks.upload(&inputs);
    let mut outputs = ranks.poisoned::<T>(n * part);
    let views: Vec<_> = bufs.iter().map(|b| b.view(..)).collect();
    all_gather(engine, &views, &mut ranks.ranks(&mut outputs), receive).unwrap();
    let gathered = inputs.concat();
    for (r, got) in ranks.download(&outputs).iter().enumerate() {
        assert!(*got == gathered, "all_gather {} n={n} part={part} {receive:?} rank {r}", T::DTYPE);
    }
    assert!(ranks.download(&bufs) == inputs, "all_gather left its inputs alone");
}

fn reduce_scatter_case<T: Reference>(
    engine: &Engine,
    n: usize,
    part: usize,
    op: ReduceOp,
    receive: Receive,
    seed: u64,
) {
    let ranks = Ranks::new(n);
    let inputs = ranks.random::<T>(n * part, seed);
    let bufs = ranks.upload(&inputs);
    let mut outputs = ranks.poisoned::<T>(part);
    let views: Vec<_> = bufs.iter().map(|b| b.view(..)).collect();
    reduce_scatter(engine, &views, &mut ranks.ranks(&mut outputs), op, receive).unwrap();
    let want = expected_with(Collective::ReduceScatter, &inputs, op, engine.forced_algorithm().unwrap());
    for (r, got) in ranks.download(&outputs).iter().enumerate() {
        let what = format!("reduce_scatter {} {op} n={n} part={part} {receive:?} rank {r}", T::DTYPE);
        check_replay(got, &want[r], op, &what);
        let seg = segment(n, n * part, r);
        let refs: Vec<&[T]> = inputs.iter().map(|v| &v[seg.clone()]).collect();
        check_fold(got, &refs, op, &what);
    }
    assert!(ranks.download(&bufs) == inputs, "reduce_scatter left its inputs alone");
}

fn broadcast_case<T: Reference>(engine: &Engine, n: usize, len: usize, root: usize, seed: u64) {
    let ranks = Ranks::new(n);
    let inputs = ranks.random::<T>(len, seed);
    let mut bufs = ranks.upload(&inputs);
    broadcast(engine, &mut ranks.ranks(&mut bufs), root, Receive::Auto).unwrap();
    for (r, got) in ranks.download(&bufs).iter().enumerate() {
        assert!(*got == inputs[root], "broadcast {} n={n} len={len} root {root}: rank {r}", T::DTYPE);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_reduce_every_op_and_dtype_on_two_to_four_ranks() {
    needs!(gpus: 1);
    let engine = Engine::new();
    let mut seed = 1;
    for n in [2, 3, 4] {
        for receive in RECEIVE_PATHS {
            for op in ReduceOp::ALL {
                for len in [n + 1, 70_001] {
                    seed += 1;
                    every_dtype!(all_reduce_case(&engine, n, len, op, receive, seed));
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_reduce_f32_and_bf16_full_sweep() {
    needs!(gpus: 1);
    let engine = Engine::new();
    let mut seed = 1000;
    for n in [2, 3, 4] {
        for receive in RECEIVE_PATHS {
            for len in [1, n - 1, n + 1, (1 << 20) + 3, 1 << 28] {
                if len > max_len() {
                    continue;
                }
                let ops: &[ReduceOp] =
                    if len > REPLAY_MAX_LEN { &[ReduceOp::Sum] } else { &[ReduceOp::Sum, ReduceOp::Avg] };
                for &op in ops {
                    seed += 1;
                    all_reduce_case::<f32>(&engine, n, len, op, receive, seed);
                    all_reduce_case::<bf16>(&engine, n, len, op, receive, seed);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn auto_receive_gives_the_same_results() {
    needs!(gpus: 1);
    let engine = Engine::new();
    for op in ReduceOp::ALL {
        all_reduce_case::<f16>(&engine, 3, 300_001, op, Receive::Auto, 7);
        all_reduce_case::<i64>(&engine, 2, 300_001, op, Receive::Auto, 8);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_hundred_back_to_back_all_reduces_without_host_sync() {
    needs!(gpus: 1);
    let engine = Engine::new();
    let ranks = Ranks::new(2);
    let len = 50_000;
    let mut cases: Vec<_> = (0..100)
        .map(|i| {
            let inputs = ranks.random::<f32>(len, 9000 + i);
            let bufs = ranks.upload(&inputs);
            (inputs, bufs)
        })
        .collect();
    for (i, (_, bufs)) in cases.iter_mut().enumerate() {
        let receive = RECEIVE_PATHS[i % 2];
        all_reduce(&engine, &mut ranks.ranks(bufs), ReduceOp::Sum, receive).unwrap();
    }
    for (i, (inputs, bufs)) in cases.iter().enumerate() {
        let want = expected_with(Collective::AllReduce, inputs, ReduceOp::Sum, engine.forced_algorithm().unwrap());
        for (r, got) in ranks.download(bufs).iter().enumerate() {
            check_replay(got, &want[r], ReduceOp::Sum, &format!("call {i} rank {r}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_gather_reduce_scatter_and_broadcast_on_two_to_four_ranks() {
    needs!(gpus: 1);
    let engine = Engine::new();
    let mut seed = 5000;
    for n in [2, 3, 4] {
        for receive in RECEIVE_PATHS {
            for part in [1, 3, 33_333] {
                seed += 1;
                every_dtype!(all_gather_case(&engine, n, part, receive, seed));
                for op in ReduceOp::ALL {
                    reduce_scatter_case::<f32>(&engine, n, part, op, receive, seed);
                    reduce_scatter_case::<u8>(&engine, n, part, op, receive, seed);
                }
            }
        }
        every_dtype!(reduce_scatter_case(&engine, n, 1000, ReduceOp::Max, Receive::Auto, seed));
        for root in 0..n {
            broadcast_case::<u32>(&engine, n, 100_003, root, seed + root as u64);
        }
        broadcast_case::<bf16>(&engine, n, 1, n - 1, seed);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_ring_and_the_legs_each_forced_run_every_collective_op_and_dtype_on_three_to_eight_ranks() {
    needs!(gpus: 1);
    // Under compute-sanitizer (every launch slow) a cut: two ops, three dtypes, 3 and 8 ranks.
    let full = sanitizer().is_none();
    let ops: &[ReduceOp] = if full { &ReduceOp::ALL } else { &[ReduceOp::Sum, ReduceOp::Avg] };
    let long = 100_003.min(max_len());
    let mut seed = 7000;
    for algorithm in [Algorithm::Ring, Algorithm::TwoShot] {
        let engine = Engine::new().with_algorithm(algorithm).unwrap();
        for n in if full { vec![3, 4, 8] } else { vec![3, 8] } {
            for receive in RECEIVE_PATHS {
                for &op in ops {
                    // Lengths smaller than the ranks, odd, and past a page a share.
                    for len in [n - 1, 2 * n + 1, long] {
                        seed += 1;
                        if full {
                            every_dtype!(all_reduce_case(&engine, n, len, op, receive, seed));
                        } else {
                            all_reduce_case::<f32>(&engine, n, len, op, receive, seed);
                            all_reduce_case::<bf16>(&engine, n, len, op, receive, seed);
                            all_reduce_case::<i8>(&engine, n, len, op, receive, seed);
                        }
                    }
                    reduce_scatter_case::<f32>(&engine, n, long / n, op, receive, seed);
                }
                every_dtype!(reduce_scatter_case(&engine, n, 3, ReduceOp::Sum, receive, seed));
                every_dtype!(all_gather_case(&engine, n, long / 10, receive, seed));
            }
            every_dtype!(broadcast_case(&engine, n, long, n / 2, seed));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_legs_with_small_slots_wrap_every_slot_many_times_a_call() {
    needs!(gpus: 1);
    // 4 KiB chunks through each writer's four slots: every share takes many chunks, and a
    // slot is filled again only once every reader of its last chunk is done with it.
    let engine = Engine::with_chunk_bytes(4096).unwrap().with_algorithm(Algorithm::TwoShot).unwrap();
    let long = 300_007.min(max_len());
    for receive in RECEIVE_PATHS {
        all_reduce_case::<f32>(&engine, 3, long, ReduceOp::Sum, receive, 91);
        all_reduce_case::<bf16>(&engine, 8, long, ReduceOp::Avg, receive, 92);
        reduce_scatter_case::<i32>(&engine, 4, long / 6, ReduceOp::Min, receive, 93);
        all_gather_case::<i8>(&engine, 5, long / 3, receive, 94);
    }
    broadcast_case::<u64>(&engine, 6, long / 2, 5, 95);
    // Forced one-shot is refused by name: the engine runs ring or two-shot.
    let err = Engine::new().with_algorithm(Algorithm::OneShot).err().expect("one-shot refused");
    assert!(err.to_string().contains("ring or two-shot"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_rank_and_empty_buffers_are_no_ops() {
    needs!(gpus: 1);
    let engine = Engine::new();
    let one = Ranks::new(1);
    let inputs = one.random::<f32>(1001, 3);
    let mut bufs = one.upload(&inputs);
    all_reduce(&engine, &mut one.ranks(&mut bufs), ReduceOp::Avg, Receive::Auto).unwrap();
    broadcast(&engine, &mut one.ranks(&mut bufs), 0, Receive::Auto).unwrap();
    assert!(one.download(&bufs) == inputs, "n = 1: avg divides by 1, broadcast copies nothing");
    let three = Ranks::new(3);
    let mut empty: Vec<DeviceBuffer<i32>> = (0..3).map(|_| DeviceBuffer::alloc(&three.device, 0).unwrap()).collect();
    all_reduce(&engine, &mut three.ranks(&mut empty), ReduceOp::Sum, Receive::ZeroCopy).unwrap();
    let views: Vec<_> = empty.iter().map(|b| b.view(..)).collect();
    let mut out: Vec<DeviceBuffer<i32>> = (0..3).map(|_| DeviceBuffer::alloc(&three.device, 0).unwrap()).collect();
    all_gather(&engine, &views, &mut three.ranks(&mut out), Receive::Scratch).unwrap();
    reduce_scatter(&engine, &views, &mut three.ranks(&mut out), ReduceOp::Min, Receive::Scratch).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_is_refused_and_nothing_is_written() {
    needs!(gpus: 1);
    let engine = Engine::new();
    let ranks = Ranks::new(3);
    let mut bufs = ranks.poisoned::<f32>(10);
    bufs[2] = ranks.poisoned::<f32>(11).pop().unwrap();
    let err = all_reduce(&engine, &mut ranks.ranks(&mut bufs), ReduceOp::Sum, Receive::Auto).unwrap_err();
    assert!(err.to_string().contains("rank 2"), "{err}");
    let err = broadcast(&engine, &mut ranks.ranks(&mut bufs[..2]), 2, Receive::Auto).unwrap_err();
    assert!(err.to_string().contains("root 2"), "{err}");
    // all_gather: outputs of the wrong size; reduce_scatter: inputs of the wrong size.
    let inputs = ranks.upload(&ranks.random::<f32>(4, 1));
    let views: Vec<_> = inputs.iter().map(|b| b.view(..)).collect();
    let mut out = ranks.poisoned::<f32>(11);
    assert!(all_gather(&engine, &views, &mut ranks.ranks(&mut out), Receive::Auto).is_err());
    assert!(reduce_scatter(&engine, &views, &mut ranks.ranks(&mut out), ReduceOp::Sum, Receive::Auto).is_err());
    assert!(all_gather(&engine, &views[..2], &mut ranks.ranks(&mut out), Receive::Auto).is_err(), "input count");
    assert!(Engine::with_chunk_bytes(0).is_err());
    let poison = f32::from_byte(POISON);
    for b in ranks.download(&bufs).iter().chain(&ranks.download(&out)) {
        assert!(b.iter().all(|v| v.to_bits() == poison.to_bits()), "a refused call wrote");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_chunk_override_changes_nothing_but_the_pipeline() {
    needs!(gpus: 1);
    // 4 KiB chunks: many chunks per segment, more than the four slots of every ring edge.
    let engine = Engine::with_chunk_bytes(4096).unwrap();
    for receive in RECEIVE_PATHS {
        all_reduce_case::<f32>(&engine, 3, 100_003, ReduceOp::Sum, receive, 77);
        all_reduce_case::<u8>(&engine, 4, 100_003, ReduceOp::Prod, receive, 78);
        reduce_scatter_case::<i32>(&engine, 2, 50_001, ReduceOp::Min, receive, 79);
        all_gather_case::<i8>(&engine, 3, 9_999, receive, 80);
    }
}
