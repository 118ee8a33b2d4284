//! Two GPUs: copies both ways and the collectives with one buffer per device. Each test
//! states `needs!(gpus: 2)`, so where fewer are present it is reported as not run.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::{CopyOptions, Device, DeviceBuffer, ReduceOp, Route, Stream, transport};
use gp2p_collectives::reference::expected;
use gp2p_collectives::schedule::segment;
use gp2p_collectives::{Collective, Engine, Rank, Receive, all_gather, all_reduce, broadcast, reduce_scatter};
use gp2p_tests::{POISON, Reference, count_mismatched, needs, random, with_stream};

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_staged_and_auto_copies_both_ways() {
    let _serial = gp2p_tests::serial();
    let [(d0, s0), (d1, s1)] = needs!(gpus: 2).map(with_stream);
    for (route, len) in
        [(Route::Staged, 1), (Route::Staged, (64 << 20) + 7), (Route::Auto, 3 << 20), (Route::Staged, 1 << 28)]
    {
        for (src_dev, src_s, dst_dev, dst_s) in [(&d0, &s0, &d1, &s1), (&d1, &s1, &d0, &s0)] {
            let host: Vec<u32> = random(len, len as u64);
            let src = DeviceBuffer::from_host(src_s, &host).unwrap();
            let mut dst = DeviceBuffer::<u32>::alloc(dst_dev, len).unwrap();
            dst.fill_bytes(dst_s, POISON).unwrap();
            let options = CopyOptions { route, ..CopyOptions::default() };
            transport().copy(&src.view(..), src_s, &mut dst.view_mut(..), dst_s, options).unwrap();
            let what = format!("{route} {} -> {} len {len}", src_dev.ordinal(), dst_dev.ordinal());
            assert!(dst.to_host_vec(dst_s).unwrap() == host, "{what}");
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_all_reduce_with_both_receive_paths() {
    let _serial = gp2p_tests::serial();
    let pair = needs!(gpus: 2).map(with_stream);
    let engine = Engine::new();
    for receive in [Receive::Scratch, Receive::ZeroCopy] {
        for op in ReduceOp::ALL {
            let len = (1 << 22) + 5;
            let inputs: Vec<Vec<f32>> = (0..2).map(|r| random(len, 300 + r)).collect();
            let mut bufs: Vec<DeviceBuffer<f32>> =
                inputs.iter().zip(&pair).map(|(h, (_, s))| DeviceBuffer::from_host(s, h).unwrap()).collect();
            {
                let mut ranks: Vec<Rank<'_, f32>> =
                    bufs.iter_mut().zip(&pair).map(|(b, (_, s))| Rank { buffer: b.view_mut(..), stream: s }).collect();
                all_reduce(&engine, &mut ranks, op, receive).unwrap();
            }
            let want = expected(Collective::AllReduce, &inputs, op);
            for (r, (b, (_, s))) in bufs.iter().zip(&pair).enumerate() {
                let got = b.to_host_vec(s).unwrap();
                let (bad, first) = count_mismatched(&got, &want[r], op);
                assert_eq!(bad, 0, "{receive:?} {op} rank {r}: {bad} wrong: {}", first.join("; "));
            }
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_all_gather_reduce_scatter_broadcast() {
    let _serial = gp2p_tests::serial();
    let pair = needs!(gpus: 2).map(with_stream);
    let engine = Engine::new();
    let part = 1_000_003;
    let host_in: Vec<Vec<u32>> = (0..2).map(|r| random(part, 500 + r)).collect();
    let inputs: Vec<DeviceBuffer<u32>> =
        host_in.iter().zip(&pair).map(|(h, (_, s))| DeviceBuffer::from_host(s, h).unwrap()).collect();
    let mut outputs: Vec<DeviceBuffer<u32>> =
        pair.iter().map(|(d, _)| DeviceBuffer::alloc(d, 2 * part).unwrap()).collect();
    {
        let views: Vec<_> = inputs.iter().map(|b| b.view(..)).collect();
        let mut ranks: Vec<Rank<'_, u32>> =
            outputs.iter_mut().zip(&pair).map(|(b, (_, s))| Rank { buffer: b.view_mut(..), stream: s }).collect();
        all_gather(&engine, &views, &mut ranks, Receive::Auto).unwrap();
    }
    let gathered = host_in.concat();
    for (o, (_, s)) in outputs.iter().zip(&pair) {
        assert!(o.to_host_vec(s).unwrap() == gathered, "all_gather");
    }
    let mut parts: Vec<DeviceBuffer<u32>> = pair.iter().map(|(d, _)| DeviceBuffer::alloc(d, part).unwrap()).collect();
    {
        let views: Vec<_> = outputs.iter().map(|b| b.view(..)).collect();
        let mut ranks: Vec<Rank<'_, u32>> =
            parts.iter_mut().zip(&pair).map(|(b, (_, s))| Rank { buffer: b.view_mut(..), stream: s }).collect();
        reduce_scatter(&engine, &views, &mut ranks, ReduceOp::Sum, Receive::Auto).unwrap();
    }
    for (r, (p, (_, s))) in parts.iter().zip(&pair).enumerate() {
        // Both ranks hold the same gathered buffer, so segment r sums to twice itself.
        let want: Vec<u32> = gathered[segment(2, 2 * part, r)].iter().map(|v| v.wrapping_mul(2)).collect();
        assert!(p.to_host_vec(s).unwrap() == want, "reduce_scatter rank {r}");
    }
    let mut ranks: Vec<Rank<'_, u32>> =
        parts.iter_mut().zip(&pair).map(|(b, (_, s))| Rank { buffer: b.view_mut(..), stream: s }).collect();
    broadcast(&engine, &mut ranks, 1, Receive::Auto).unwrap();
    drop(ranks);
    // Rank 1 held its reduce_scatter result; both ranks must now hold exactly that (a
    // broadcast that damaged the root would not pass a comparison with the root itself).
    let root: Vec<u32> = gathered[segment(2, 2 * part, 1)].iter().map(|v| v.wrapping_mul(2)).collect();
    for (r, (p, (_, s))) in parts.iter().zip(&pair).enumerate() {
        assert!(p.to_host_vec(s).unwrap() == root, "broadcast from rank 1: rank {r}");
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_dropping_either_side_of_a_pending_copy_is_safe_and_does_not_block() {
    let _serial = gp2p_tests::serial();
    // The sequence that killed the context before the lifetime rule: the copy waits behind
    // earlier work on the source stream, its destination (then its source) is dropped right
    // away, and fresh memory on the destination device is written at once.
    let [(d0, s0), (d1, s1)] = needs!(gpus: 2).map(with_stream);
    let len = 1 << 22;
    for route in [Route::Auto, Route::Staged] {
        for drop_dst in [true, false] {
            let host: Vec<u32> = random(len, 77);
            let src = DeviceBuffer::from_host(&s0, &host).unwrap();
            let mut dst = DeviceBuffer::<u32>::alloc(&d1, len).unwrap();
            let mut keep = DeviceBuffer::<u32>::alloc(&d1, len).unwrap();
            let options = CopyOptions { route, ..CopyOptions::default() };
            // The pair's ring and streams are made by a first copy, outside the gate.
            transport().copy(&src.view(..), &s0, &mut keep.view_mut(..), &s1, options).unwrap();
            s1.synchronize().unwrap();
            let (s1b, s0b) = (Stream::new(&d1).unwrap(), Stream::new(&d0).unwrap());
            let gate = gp2p_tests::hold(&s0);
            transport().copy(&src.view(..), &s0, &mut dst.view_mut(..), &s1, options).unwrap();
            // A second copy out of dst, so the kept result proves the first one ran in full.
            keep.view_mut(..).copy_from(&s1, &dst.view(..)).unwrap();
            let start = std::time::Instant::now();
            if drop_dst {
                drop(dst);
            } else {
                drop(src);
            }
            let took = start.elapsed();
            let fresh = DeviceBuffer::from_host(&s1b, &vec![0x5A5A_5A5Au32; len]).unwrap();
            let fresh0 = DeviceBuffer::from_host(&s0b, &vec![0x5A5A_5A5Au32; len]).unwrap();
            gate.open();
            s0.synchronize().unwrap();
            s1.synchronize().unwrap();
            let what = format!("{route}, dropped {}", if drop_dst { "dst" } else { "src" });
            assert!(keep.to_host_vec(&s1).unwrap() == host, "{what}: copy result");
            assert!(fresh.to_host_vec(&s1b).unwrap().iter().all(|&v| v == 0x5A5A_5A5A), "{what}: fresh memory on 1");
            assert!(fresh0.to_host_vec(&s0).unwrap().iter().all(|&v| v == 0x5A5A_5A5A), "{what}: fresh memory on 0");
            // (The fresh allocations may wait for the held stream: the driver synchronises
            // there on the two-H200 machine. The gate's deadline bounds that wait.)
            println!("{what}: drop took {:.1} us", took.as_secs_f64() * 1e6);
            assert!(took < gp2p_tests::drop_limit(), "{what}: the drop blocked for {took:?}");
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_zero_length_copies_order_both_streams() {
    let _serial = gp2p_tests::serial();
    let [(d0, s0), (d1, s1)] = needs!(gpus: 2).map(with_stream);
    let src = DeviceBuffer::<u32>::alloc(&d0, 4).unwrap();
    let mut dst = DeviceBuffer::<u32>::alloc(&d1, 4).unwrap();
    let options = CopyOptions { route: Route::Staged, ..CopyOptions::default() };
    // The pair's state is made by a first copy, outside the gate.
    transport().copy(&src.view(..), &s0, &mut dst.view_mut(..), &s1, options).unwrap();
    s1.synchronize().unwrap();
    for gate_src in [true, false] {
        let (gated, other) = if gate_src { (&s0, &s1) } else { (&s1, &s0) };
        let gate = gp2p_tests::hold(gated);
        transport().copy(&src.view(0..0), &s0, &mut dst.view_mut(0..0), &s1, options).unwrap();
        let after = other.point().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let ran_early = after.is_complete().unwrap();
        gate.open();
        after.synchronize().unwrap();
        assert!(!ran_early, "gated {}: the other stream did not wait", if gate_src { "src" } else { "dst" });
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_small_all_reduces_through_the_default_engine() {
    // The default engine's path for small two-rank all-reduces (the DMA exchange: the line
    // exchange is opt-in, and gpu_lines tests it for every op and dtype).
    let _serial = gp2p_tests::serial();
    fn case<T: Reference>(engine: &Engine, pair: &[(Device, Stream); 2], len: usize, op: ReduceOp, seed: u64) {
        let inputs: Vec<Vec<T>> = (0..2).map(|r| random(len, seed + r)).collect();
        let mut bufs: Vec<DeviceBuffer<T>> =
            inputs.iter().zip(pair).map(|(h, (_, s))| DeviceBuffer::from_host(s, h).unwrap()).collect();
        {
            let mut ranks: Vec<Rank<'_, T>> =
                bufs.iter_mut().zip(pair).map(|(b, (_, s))| Rank { buffer: b.view_mut(..), stream: s }).collect();
            all_reduce(engine, &mut ranks, op, Receive::Auto).unwrap();
        }
        let want = expected(Collective::AllReduce, &inputs, op);
        for (r, (b, (_, s))) in bufs.iter().zip(pair).enumerate() {
            let (bad, first) = count_mismatched(&b.to_host_vec(s).unwrap(), &want[r], op);
            assert_eq!(bad, 0, "{} {op} len {len} rank {r}: {}", T::DTYPE, first.join("; "));
        }
    }
    let pair = needs!(gpus: 2).map(with_stream);
    let engine = Engine::new();
    let mut seed = 900;
    for len in [1, 1027, (64 << 10) / 4 + 3] {
        for op in ReduceOp::ALL {
            seed += 2;
            case::<f32>(&engine, &pair, len, op, seed);
            case::<geforce_p2p::half::bf16>(&engine, &pair, len, op, seed);
            case::<u8>(&engine, &pair, len, op, seed);
            case::<i64>(&engine, &pair, len, op, seed);
        }
    }
}
