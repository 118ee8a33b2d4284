//! GPU: the two-rank one-kernel exchanges behind small and middling all-reduces between two
//! GPUs, the line exchange (data and sequence numbers in mapped host memory) and the chunk
//! exchange (flagged 4 KiB chunks): every op and dtype at odd lengths, back-to-back calls,
//! a peer that never comes; and on one GPU, that ranks sharing a device never take them
//! (their two kernels might not run at once), while the kernels themselves, and the chunk
//! exchange's replays from graphs, still run there through the test-only constructors that
//! put both ranks on one device with grids that fit beside each other.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use geforce_p2p::kernels::CHUNK_BYTES;
use geforce_p2p::pinned::{ChunkExchange, Error as PinnedError, LineExchange, PairExchange};
use geforce_p2p::{Device, DeviceBuffer, ReduceOp, Stream};
use gp2p_collectives::reference::expected;
use gp2p_collectives::{
    CHUNK_EXCHANGE_MAX_BYTES, Collective, Engine, LINE_EXCHANGE_WINS_UP_TO, Rank, Receive, all_reduce,
};
use gp2p_tests::{Reference, count_mismatched, device, every_dtype, needs, random};

/// Two ranks' fresh random inputs of `len` elements uploaded on `streams`, `run` over their
/// buffers, and every element of each rank's result checked against the reference (`what`
/// says which case failed).
fn checked_all_reduce<T: Reference>(
    len: usize,
    op: ReduceOp,
    seed: u64,
    streams: [&Stream; 2],
    what: &str,
    run: impl FnOnce(&mut [DeviceBuffer<T>]),
) {
    let inputs: Vec<Vec<T>> = (0..2).map(|r| random(len, seed * 7 + r as u64)).collect();
    let mut bufs: Vec<DeviceBuffer<T>> =
        inputs.iter().zip(streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect();
    run(&mut bufs);
    let want = expected(Collective::AllReduce, &inputs, op);
    for (r, b) in bufs.iter().enumerate() {
        let got = b.to_host_vec(streams[r]).unwrap();
        let (bad, first) = count_mismatched(&got, &want[r], op);
        assert_eq!(bad, 0, "{} {op} len {len} {what} rank {r}: {}", T::DTYPE, first.join("; "));
    }
}

/// One all_reduce of two ranks through the engine: on two devices, or (`shared`) two logical
/// ranks on device 0 sharing one stream. The calling test states what it needs.
fn case<T: Reference>(engine: &Engine, len: usize, op: ReduceOp, shared: bool, seed: u64) {
    let devices = if shared { [device(0), device(0)] } else { [device(0), device(1)] };
    let streams = [Stream::new(&devices[0]).unwrap(), Stream::new(&devices[1]).unwrap()];
    let ranks_streams = if shared { [&streams[0], &streams[0]] } else { [&streams[0], &streams[1]] };
    checked_all_reduce::<T>(len, op, seed, ranks_streams, &format!("shared {shared}"), |bufs| {
        let mut ranks: Vec<Rank<'_, T>> =
            bufs.iter_mut().zip(ranks_streams).map(|(b, stream)| Rank { buffer: b.view_mut(..), stream }).collect();
        all_reduce(engine, &mut ranks, op, Receive::Auto).unwrap();
    });
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_small_all_reduces_take_the_line_exchange_for_every_op_and_dtype() {
    let _serial = gp2p_tests::serial();
    // compute_80: on the Turing build the engine would quietly take the ring instead.
    needs!(gpus: 2, concurrent_kernels, compute_80);
    let engine = Engine::new().with_line_exchange_max(LINE_EXCHANGE_WINS_UP_TO);
    let mut seed = 0;
    // Odd lengths around the 16-byte groups; f64 at the last one fills the lines exactly.
    for len in [1, 3, 17, 129, LINE_EXCHANGE_WINS_UP_TO / 8] {
        for op in ReduceOp::ALL {
            seed += 1;
            every_dtype!(case(&engine, len, op, false, seed));
        }
    }
    case::<u8>(&engine, LINE_EXCHANGE_WINS_UP_TO, ReduceOp::Sum, false, 99);
    case::<i8>(&engine, LINE_EXCHANGE_WINS_UP_TO - 1, ReduceOp::Max, false, 98);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ranks_sharing_a_device_never_take_the_line_exchange() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let err = LineExchange::new([&device, &device], 4096, Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("needs two devices"), "{err}");
    // The engine takes the DMA exchange instead, even when asked for lines.
    let engine = Engine::new().with_line_exchange_max(LINE_EXCHANGE_WINS_UP_TO);
    for (i, len) in [1usize, 17, 1000].into_iter().enumerate() {
        case::<f32>(&engine, len, ReduceOp::Sum, true, 500 + i as u64);
        case::<u8>(&engine, len, ReduceOp::Max, true, 600 + i as u64);
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_back_to_back_line_exchanges_without_host_sync() {
    let _serial = gp2p_tests::serial();
    // Each call on buffers of its own, with fresh data, so every call's result is checked on
    // its own: a chain of sums on one buffer would double each time and reach zero after 32
    // calls, hiding any call after those. (An earlier version computed its expectation with
    // a shift masked to 5 bits and failed for that reason, not the exchange's.)
    let devices = needs!(gpus: 2, concurrent_kernels, compute_80);
    let streams = [Stream::new(&devices[0]).unwrap(), Stream::new(&devices[1]).unwrap()];
    let engine = Engine::new().with_line_exchange_max(LINE_EXCHANGE_WINS_UP_TO);
    let calls = 300;
    for len in [5usize, 333, LINE_EXCHANGE_WINS_UP_TO / 4] {
        let seed = 1000 * len as u64;
        let inputs: Vec<[Vec<u32>; 2]> =
            (0..calls).map(|c| [0, 1].map(|r| random(len, seed + 2 * c as u64 + r))).collect();
        let mut bufs: Vec<[DeviceBuffer<u32>; 2]> =
            inputs.iter().map(|pair| [0, 1].map(|r| DeviceBuffer::from_host(&streams[r], &pair[r]).unwrap())).collect();
        for pair in &streams {
            pair.synchronize().unwrap();
        }
        for pair in &mut bufs {
            let [b0, b1] = pair;
            let mut ranks = vec![
                Rank { buffer: b0.view_mut(..), stream: &streams[0] },
                Rank { buffer: b1.view_mut(..), stream: &streams[1] },
            ];
            all_reduce(&engine, &mut ranks, ReduceOp::Sum, Receive::Auto).unwrap();
        }
        for (c, (pair, input)) in bufs.iter().zip(&inputs).enumerate() {
            let want: Vec<u32> = input[0].iter().zip(&input[1]).map(|(a, b)| a.wrapping_add(*b)).collect();
            for r in 0..2 {
                assert!(pair[r].to_host_vec(&streams[r]).unwrap() == want, "len {len} call {c} rank {r}");
            }
        }
    }
}

/// Rank 1's stream held past the timeout: rank 0's kernel gives up, the next call says so
/// (once), rank 1's side is complete, and the exchange works again afterwards.
fn a_peer_that_never_comes<E: PairExchange + std::fmt::Debug>(
    test: &str,
    devices: [Device; 2],
    len: usize,
    prepare: impl Fn(&mut E, Duration),
) {
    let make = |timeout: Duration| {
        E::create([&devices[0], &devices[1]], 64 << 10, timeout).map(|mut exchange| {
            prepare(&mut exchange, timeout);
            exchange
        })
    };
    let builds: Vec<_> = devices.iter().map(|d| (d.ordinal(), d.ptx_target())).collect();
    if let Some(why) = gp2p_tests::lacks_compute_80(&builds) {
        // The Turing build (GP2P_PTX_TARGET=compute_75) refuses the one-kernel exchanges, and
        // says so; the rest of the test is not run there.
        let err = make(Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("not offered"), "{err}");
        println!("{}", gp2p_tests::not_run_line(test, &why));
        return;
    }
    let streams = [Stream::new(&devices[0]).unwrap(), Stream::new(&devices[1]).unwrap()];
    let mut exchange = make(Duration::from_millis(50)).unwrap();
    exchange.set_start_together(false);
    let (x, y) = (random::<u32>(len, 1), random::<u32>(len, 2));
    let mut a = DeviceBuffer::from_host(&streams[0], &x).unwrap();
    let mut b = DeviceBuffer::from_host(&streams[1], &y).unwrap();
    // Rank 1's stream is held well past the timeout: rank 0's kernel gives up.
    let gate = gp2p_tests::hold(&streams[1]);
    let sum_op = ReduceOp::Sum;
    exchange.all_reduce([&mut a.view_mut(..), &mut b.view_mut(..)], [&streams[0], &streams[1]], sum_op, 1).unwrap();
    streams[0].synchronize().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    gate.open();
    streams[1].synchronize().unwrap();
    let err = exchange
        .all_reduce([&mut a.view_mut(..), &mut b.view_mut(..)], [&streams[0], &streams[1]], sum_op, 1)
        .unwrap_err();
    assert_eq!(err, PinnedError::PeerTimeout { rank: 0, peer: 1, timeout: Duration::from_millis(50) });
    assert!(err.to_string().contains("rank 0 waited") && err.to_string().contains("rank 1"), "{err}");
    // Rank 1 still found rank 0's published data: its side is complete.
    let sum: Vec<u32> = y.iter().zip(&x).map(|(p, q)| p.wrapping_add(*q)).collect();
    assert!(b.to_host_vec(&streams[1]).unwrap() == sum, "rank 1 folded rank 0's data");
    // The failure is reported once; the exchange works again afterwards.
    a.upload(&streams[0], &x).unwrap();
    b.upload(&streams[1], &y).unwrap();
    exchange.set_start_together(true);
    exchange.all_reduce([&mut a.view_mut(..), &mut b.view_mut(..)], [&streams[0], &streams[1]], sum_op, 1).unwrap();
    let sum: Vec<u32> = x.iter().zip(&y).map(|(p, q)| p.wrapping_add(*q)).collect();
    assert!(a.to_host_vec(&streams[0]).unwrap() == sum);
    assert!(b.to_host_vec(&streams[1]).unwrap() == sum);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_a_peer_that_never_comes_times_out_and_the_next_call_says_so() {
    let _serial = gp2p_tests::serial();
    let devices = needs!(gpus: 2);
    let test = "gpu_lines::two_gpu_a_peer_that_never_comes_times_out_and_the_next_call_says_so";
    a_peer_that_never_comes::<LineExchange>(test, devices, 100, |_, _| ());
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_a_chunk_exchange_peer_that_never_comes_times_out_and_the_next_call_says_so() {
    let _serial = gp2p_tests::serial();
    let devices = needs!(gpus: 2);
    let test = "gpu_lines::two_gpu_a_chunk_exchange_peer_that_never_comes_times_out_and_the_next_call_says_so";
    // Several chunks, the last one partial; a peer that never begins the call is given the
    // queue timeout, here the same as the timeout.
    a_peer_that_never_comes::<ChunkExchange>(test, devices, 10_001, |x, timeout| x.set_queue_timeout(timeout));
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_a_chunk_exchange_peer_behind_queued_work_is_waited_for_past_the_timeout() {
    let _serial = gp2p_tests::serial();
    let devices = needs!(gpus: 2, concurrent_kernels, compute_80);
    let streams = [Stream::new(&devices[0]).unwrap(), Stream::new(&devices[1]).unwrap()];
    // 50 ms once the peer began the call, the default queue timeout (a minute) before.
    let mut exchange = ChunkExchange::new([&devices[0], &devices[1]], 64 << 10, Duration::from_millis(50)).unwrap();
    let (x, y) = (random::<f32>(10_001, 11), random::<f32>(10_001, 12));
    let mut a = DeviceBuffer::from_host(&streams[0], &x).unwrap();
    let mut b = DeviceBuffer::from_host(&streams[1], &y).unwrap();
    // Rank 1's stream is held four times the timeout: work queued before the call.
    let gate = gp2p_tests::hold(&streams[1]);
    exchange
        .all_reduce([&mut a.view_mut(..), &mut b.view_mut(..)], [&streams[0], &streams[1]], ReduceOp::Sum, 1)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!gate.expired(), "the gate held rank 1 for the whole wait");
    gate.open();
    let sum: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
    assert!(a.to_host_vec(&streams[0]).unwrap() == sum, "rank 0 waited for rank 1 and folded its data");
    let sum: Vec<f32> = y.iter().zip(&x).map(|(p, q)| p + q).collect();
    assert!(b.to_host_vec(&streams[1]).unwrap() == sum);
    // No kernel gave up: the next call would report it.
    exchange
        .all_reduce([&mut a.view_mut(..), &mut b.view_mut(..)], [&streams[0], &streams[1]], ReduceOp::Sum, 1)
        .unwrap();
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_all_reduces_up_to_the_limit_take_the_chunk_exchange_for_every_op_and_dtype() {
    let _serial = gp2p_tests::serial();
    needs!(gpus: 2, concurrent_kernels, compute_80);
    // Explicitly on: GP2P_CHUNK_EXCHANGE_MAX_BYTES may turn the default off.
    let engine = Engine::new().with_chunk_exchange_max(CHUNK_EXCHANGE_MAX_BYTES);
    let mut seed = 5000;
    // One chunk, a partial 16-byte group, several chunks with a partial last one, and more
    // chunks than blocks (each block then takes several).
    for len in [1, 7, 4099, 300_007] {
        for op in ReduceOp::ALL {
            seed += 1;
            every_dtype!(case(&engine, len, op, false, seed));
        }
    }
    // Exactly the limit.
    case::<u8>(&engine, CHUNK_EXCHANGE_MAX_BYTES, ReduceOp::Sum, false, 97);
    case::<f32>(&engine, CHUNK_EXCHANGE_MAX_BYTES / 4, ReduceOp::Avg, false, 96);
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_back_to_back_chunk_exchanges_on_two_stream_pairs_without_host_sync() {
    let _serial = gp2p_tests::serial();
    let devices = needs!(gpus: 2, concurrent_kernels, compute_80);
    let pairs: Vec<[Stream; 2]> =
        (0..2).map(|_| [Stream::new(&devices[0]).unwrap(), Stream::new(&devices[1]).unwrap()]).collect();
    let mut exchange = ChunkExchange::new([&devices[0], &devices[1]], 1 << 20, Duration::from_secs(5)).unwrap();
    back_to_back_chunk_exchanges(&mut exchange, &pairs, 200_001, 7000);
}

/// 300 sum calls of `exchange` queued with no host sync between, taking the stream pairs in
/// turn, lengths alternating between 333 and `long` elements (so each replayed graph is set
/// anew), each on buffers of its own with fresh data; then every call's result checked. Each
/// call is ordered after the one before, on whichever streams that ran, and both kernels
/// count calls on their device.
fn back_to_back_chunk_exchanges(exchange: &mut ChunkExchange, pairs: &[[Stream; 2]], long: usize, seed: u64) {
    let calls = 300u64;
    let len_of = |c: u64| if c.is_multiple_of(2) { 333 } else { long };
    let inputs: Vec<[Vec<u32>; 2]> = (0..calls).map(|c| [0, 1].map(|r| random(len_of(c), seed + 2 * c + r))).collect();
    let mut bufs: Vec<[DeviceBuffer<u32>; 2]> =
        inputs.iter().map(|pair| [0, 1].map(|r| DeviceBuffer::from_host(&pairs[0][r], &pair[r]).unwrap())).collect();
    for (c, pair) in bufs.iter_mut().enumerate() {
        let streams = &pairs[c % pairs.len()];
        let [b0, b1] = pair;
        exchange
            .all_reduce([&mut b0.view_mut(..), &mut b1.view_mut(..)], [&streams[0], &streams[1]], ReduceOp::Sum, 1)
            .unwrap();
    }
    for (c, (pair, input)) in bufs.iter().zip(&inputs).enumerate() {
        let want: Vec<u32> = input[0].iter().zip(&input[1]).map(|(a, b)| a.wrapping_add(*b)).collect();
        for r in 0..2 {
            assert!(pair[r].to_host_vec(&pairs[c % pairs.len()][r]).unwrap() == want, "call {c} rank {r}");
        }
    }
    assert!(exchange.is_in_step());
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_line_exchanges_while_the_reclaimer_frees_many_buffers() {
    // A free may wait for its device to go idle while holding a driver lock that the launch
    // of the second rank's kernel needs; with the first rank's kernel already waiting for
    // the second, the pair then stalled until the timeout and the call came out unfolded.
    // Found after gpu_lines' back-to-back test left the reclaimer 1,800 buffers to free.
    let _serial = gp2p_tests::serial();
    let devices = needs!(gpus: 2, concurrent_kernels, compute_80);
    let streams = [Stream::new(&devices[0]).unwrap(), Stream::new(&devices[1]).unwrap()];
    let timeout = Duration::from_secs(1);
    let mut exchange = LineExchange::new([&devices[0], &devices[1]], 4096, timeout).unwrap();
    for round in 0..8u64 {
        let doomed: Vec<DeviceBuffer<u8>> =
            (0..600).map(|i| DeviceBuffer::alloc(&devices[i % 2], 4096).unwrap()).collect();
        let (x, y) = (random::<f64>(33, 2 * round), random::<f64>(33, 2 * round + 1));
        let mut a = DeviceBuffer::from_host(&streams[0], &x).unwrap();
        let mut b = DeviceBuffer::from_host(&streams[1], &y).unwrap();
        drop(doomed); // 600 frees queued for the reclaimer, which starts on them at once
        exchange
            .all_reduce([&mut a.view_mut(..), &mut b.view_mut(..)], [&streams[0], &streams[1]], ReduceOp::Sum, 1)
            .unwrap();
        let want: Vec<f64> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
        assert!(a.to_host_vec(&streams[0]).unwrap() == want, "round {round}: rank 0 did not fold rank 1's data");
        let want: Vec<f64> = y.iter().zip(&x).map(|(p, q)| p + q).collect();
        assert!(b.to_host_vec(&streams[1]).unwrap() == want, "round {round}: rank 1 did not fold rank 0's data");
    }
    // No kernel gave up waiting: the next call would report it.
    let mut a = DeviceBuffer::from_host(&streams[0], &[1.0f64]).unwrap();
    let mut b = DeviceBuffer::from_host(&streams[1], &[2.0f64]).unwrap();
    exchange
        .all_reduce([&mut a.view_mut(..), &mut b.view_mut(..)], [&streams[0], &streams[1]], ReduceOp::Sum, 1)
        .unwrap();
    assert_eq!(a.to_host_vec(&streams[0]).unwrap(), vec![3.0]);
}

/// One call of `exchange` with both ranks on one device, on `streams` (two of that device),
/// checked element by element against the reference.
fn one_device_case<T: Reference>(
    exchange: &mut impl PairExchange,
    streams: &[Stream; 2],
    len: usize,
    op: ReduceOp,
    seed: u64,
) {
    let divide_by = if op == ReduceOp::Avg { 2 } else { 1 };
    checked_all_reduce::<T>(len, op, seed, [&streams[0], &streams[1]], "one device", |bufs| {
        let [b0, b1] = bufs else { unreachable!() };
        exchange
            .all_reduce([&mut b0.view_mut(..), &mut b1.view_mut(..)], [&streams[0], &streams[1]], op, divide_by)
            .unwrap();
    });
}

/// [`one_device_case`] for every op and dtype at each of `lens`, seeds from `seed` on.
fn one_device_every_case(exchange: &mut impl PairExchange, streams: &[Stream; 2], lens: &[usize], mut seed: u64) {
    for &len in lens {
        for op in ReduceOp::ALL {
            seed += 1;
            every_dtype!(one_device_case(exchange, streams, len, op, seed));
        }
    }
}

/// A chunk exchange with both ranks on `device`, for up to 64 chunks (fewer where the device
/// has fewer multiprocessors: each grid within one block per multiprocessor), and its
/// largest buffer in bytes.
fn one_device_chunk_exchange(device: &Device) -> (ChunkExchange, usize) {
    let max_bytes = ChunkExchange::max_bytes_sharing_a_device(device).min(64 * CHUNK_BYTES);
    let mut exchange = ChunkExchange::sharing_a_device_for_tests(device, max_bytes, Duration::from_secs(2)).unwrap();
    exchange.set_queue_timeout(Duration::from_secs(5));
    (exchange, max_bytes)
}

/// Two streams of `device`, created one after the other (so on different hardware queues).
fn stream_pair(device: &Device) -> [Stream; 2] {
    [Stream::new(device).unwrap(), Stream::new(device).unwrap()]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_chunk_exchange_kernels_for_every_op_and_dtype_with_both_ranks_on_the_device() {
    // The chunk exchange's kernels and their replays from graphs, where there is one GPU:
    // both ranks on it, each grid within one block per multiprocessor.
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1, concurrent_kernels, compute_80);
    let streams = stream_pair(&device);
    let (mut exchange, max_bytes) = one_device_chunk_exchange(&device);
    // One chunk, a partial 16-byte group, several chunks with a partial last one, and (f64,
    // at the last length) every chunk of the areas.
    one_device_every_case(&mut exchange, &streams, &[1, 7, 4099, max_bytes / 8], 9000);
    assert!(exchange.is_in_step());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_back_to_back_chunk_exchanges_on_two_stream_pairs_without_host_sync() {
    // Both ranks on the one GPU (see `back_to_back_chunk_exchanges`).
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1, concurrent_kernels, compute_80);
    let pairs = [stream_pair(&device), stream_pair(&device)];
    let (mut exchange, max_bytes) = one_device_chunk_exchange(&device);
    back_to_back_chunk_exchanges(&mut exchange, &pairs, max_bytes / 4 - 3, 8000);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_gpu_line_exchange_kernels_for_every_op_and_dtype_with_both_ranks_on_the_device() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1, concurrent_kernels, compute_80);
    let streams = stream_pair(&device);
    let mut exchange =
        LineExchange::sharing_a_device_for_tests(&device, LINE_EXCHANGE_WINS_UP_TO, Duration::from_secs(2)).unwrap();
    exchange.set_start_together(false);
    one_device_every_case(&mut exchange, &streams, &[1, 3, 17, 129, LINE_EXCHANGE_WINS_UP_TO / 8], 9500);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunk_exchanges_sharing_a_device_refuse_grids_that_would_not_fit() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let too_big = ChunkExchange::max_bytes_sharing_a_device(&device) + 1;
    let err = ChunkExchange::sharing_a_device_for_tests(&device, too_big, Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("must fit"), "{err}");
    let err = ChunkExchange::new([&device, &device], 4096, Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("needs two devices"), "{err}");
}
