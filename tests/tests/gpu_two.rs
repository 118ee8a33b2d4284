//! Two GPUs: copies both ways and the collectives with one buffer per device. The bundle's
//! runner lists these (`two_gpu_*`) as not run where fewer than two GPUs are present.

// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::{CopyOptions, Device, DeviceBuffer, ReduceOp, Route, Stream, transport};
use gp2p_collectives::schedule::segment;
use gp2p_collectives::{
    Collective, Engine, Rank, Transport, all_gather, all_reduce, broadcast, expected, reduce_scatter,
};
use gp2p_tests::{Reference, count_mismatched, fill_random};

fn two() -> [(Device, Stream); 2] {
    let open = |o| {
        let d = Device::open(o).expect("two-GPU tests need CUDA devices 0 and 1");
        let s = Stream::new(&d).unwrap();
        (d, s)
    };
    [open(0), open(1)]
}

fn random<T: Reference>(len: usize, seed: u64) -> Vec<T> {
    let mut v = vec![T::from_byte(0); len];
    fill_random(&mut v, seed);
    v
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_staged_and_auto_copies_both_ways() {
    let [(d0, s0), (d1, s1)] = two();
    for (route, len) in
        [(Route::Staged, 1), (Route::Staged, (64 << 20) + 7), (Route::Auto, 3 << 20), (Route::Staged, 1 << 28)]
    {
        for (src_dev, src_s, dst_dev, dst_s) in [(&d0, &s0, &d1, &s1), (&d1, &s1, &d0, &s0)] {
            let host: Vec<u32> = random(len, len as u64);
            let src = DeviceBuffer::from_host(src_s, &host).unwrap();
            let mut dst = DeviceBuffer::<u32>::alloc(dst_dev, len).unwrap();
            dst.fill_bytes(dst_s, 0xA5).unwrap();
            let options = CopyOptions { route, ..CopyOptions::default() };
            transport().copy(&src.view(..), src_s, &mut dst.view_mut(..), dst_s, options).unwrap();
            let what = format!("{route} {} -> {} len {len}", src_dev.ordinal(), dst_dev.ordinal());
            assert!(dst.to_host_vec(dst_s).unwrap() == host, "{what}");
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_all_reduce_with_both_transports() {
    let pair = two();
    let engine = Engine::new();
    for transport in [Transport::Scratch, Transport::ZeroCopy] {
        for op in ReduceOp::ALL {
            let len = (1 << 22) + 5;
            let inputs: Vec<Vec<f32>> = (0..2).map(|r| random(len, 300 + r)).collect();
            let mut bufs: Vec<DeviceBuffer<f32>> =
                inputs.iter().zip(&pair).map(|(h, (_, s))| DeviceBuffer::from_host(s, h).unwrap()).collect();
            {
                let mut ranks: Vec<Rank<'_, f32>> =
                    bufs.iter_mut().zip(&pair).map(|(b, (_, s))| Rank { buffer: b.view_mut(..), stream: s }).collect();
                all_reduce(&engine, &mut ranks, op, transport).unwrap();
            }
            let want = expected(Collective::AllReduce, &inputs, op);
            for (r, (b, (_, s))) in bufs.iter().zip(&pair).enumerate() {
                let got = b.to_host_vec(s).unwrap();
                let (bad, first) = count_mismatched(&got, &want[r], op);
                assert_eq!(bad, 0, "{transport:?} {op} rank {r}: {bad} wrong: {}", first.join("; "));
            }
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpu_all_gather_reduce_scatter_broadcast() {
    let pair = two();
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
        all_gather(&engine, &views, &mut ranks, Transport::Auto).unwrap();
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
        reduce_scatter(&engine, &views, &mut ranks, ReduceOp::Sum, Transport::Auto).unwrap();
    }
    for (r, (p, (_, s))) in parts.iter().zip(&pair).enumerate() {
        // Both ranks hold the same gathered buffer, so segment r sums to twice itself.
        let want: Vec<u32> = gathered[segment(2, 2 * part, r)].iter().map(|v| v.wrapping_mul(2)).collect();
        assert!(p.to_host_vec(s).unwrap() == want, "reduce_scatter rank {r}");
    }
    let mut ranks: Vec<Rank<'_, u32>> =
        parts.iter_mut().zip(&pair).map(|(b, (_, s))| Rank { buffer: b.view_mut(..), stream: s }).collect();
    broadcast(&engine, &mut ranks, 1, Transport::Auto).unwrap();
    drop(ranks);
    // Rank 1 held its reduce_scatter result; both ranks must now hold exactly that (a
    // broadcast that damaged the root would not pass a comparison with the root itself).
    let root: Vec<u32> = gathered[segment(2, 2 * part, 1)].iter().map(|v| v.wrapping_mul(2)).collect();
    for (r, (p, (_, s))) in parts.iter().zip(&pair).enumerate() {
        assert!(p.to_host_vec(s).unwrap() == root, "broadcast from rank 1: rank {r}");
    }
}
