//! GPU: the ring collectives with logical ranks sharing one GPU (feature `testing`), checked
//! against the same schedule run on host buffers with the CPU reference of each step.

// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::{Device, DeviceBuffer, ReduceOp, Stream};
use gp2p_collectives::schedule::segment;
use gp2p_collectives::{
    Collective, Engine, Rank, Transport, all_gather, all_reduce, broadcast, expected, reduce_scatter,
};
use gp2p_tests::{Reference, fill_random};

fn device() -> Device {
    Device::open(0).expect("GPU tests need CUDA device 0")
}

fn check<T: Reference>(got: &[T], want: &[T], op: ReduceOp, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let wrong: Vec<usize> = (0..got.len()).filter(|&i| !T::matches(got[i], want[i], op)).take(4).collect();
    assert!(
        wrong.is_empty(),
        "{what}: elements {wrong:?} differ, e.g. got {:?} want {:?}",
        got[wrong[0]],
        want[wrong[0]]
    );
}

/// One all_reduce over `n` logical ranks of `len` elements, verified.
fn all_reduce_case<T: Reference>(engine: &Engine, n: usize, len: usize, op: ReduceOp, transport: Transport, seed: u64) {
    let device = device();
    let streams: Vec<Stream> = (0..n).map(|_| Stream::new(&device).unwrap()).collect();
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| {
            let mut v = vec![T::from_byte(0); len];
            fill_random(&mut v, seed + r as u64);
            v
        })
        .collect();
    let mut bufs: Vec<DeviceBuffer<T>> =
        inputs.iter().zip(&streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect();
    {
        let mut ranks: Vec<Rank<'_, T>> =
            bufs.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
        all_reduce(engine, &mut ranks, op, transport).unwrap();
    }
    let want = expected(Collective::AllReduce, &inputs, op);
    for (r, (buf, s)) in bufs.iter().zip(&streams).enumerate() {
        let got = buf.to_host_vec(s).unwrap();
        check(&got, &want[r], op, &format!("{} {op} n={n} len={len} {transport:?} rank {r}", T::DTYPE));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_reduce_every_op_on_logical_ranks() {
    let engine = Engine::new();
    let mut seed = 100;
    for n in [2, 3, 4] {
        for transport in [Transport::Scratch, Transport::ZeroCopy] {
            for op in ReduceOp::ALL {
                for len in [1, n - 1, n + 1, 1000, (1 << 20) + 3] {
                    if len == 0 {
                        continue;
                    }
                    seed += 10;
                    all_reduce_case::<f32>(&engine, n, len, op, transport, seed);
                    all_reduce_case::<i32>(&engine, n, len, op, transport, seed + 5);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_reduce_other_dtypes_and_auto() {
    let engine = Engine::new();
    for op in ReduceOp::ALL {
        all_reduce_case::<u8>(&engine, 3, 70_001, op, Transport::Auto, 7);
        all_reduce_case::<f64>(&engine, 2, 70_001, op, Transport::Auto, 8);
        all_reduce_case::<u64>(&engine, 4, 70_001, op, Transport::Auto, 9);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_hundred_back_to_back_all_reduces_without_host_sync() {
    let engine = Engine::new();
    let device = device();
    let streams = [Stream::new(&device).unwrap(), Stream::new(&device).unwrap()];
    let len = 50_000;
    let mut cases = Vec::new();
    for i in 0..100u64 {
        let inputs: Vec<Vec<f32>> = (0..2)
            .map(|r| {
                let mut v = vec![0f32; len];
                fill_random(&mut v, 9000 + 2 * i + r);
                v
            })
            .collect();
        let bufs: Vec<DeviceBuffer<f32>> =
            inputs.iter().zip(&streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect();
        cases.push((inputs, bufs));
    }
    for (_, bufs) in &mut cases {
        let mut ranks: Vec<Rank<'_, f32>> =
            bufs.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
        all_reduce(&engine, &mut ranks, ReduceOp::Sum, Transport::ZeroCopy).unwrap();
    }
    for (i, (inputs, bufs)) in cases.iter().enumerate() {
        let want = expected(Collective::AllReduce, inputs, ReduceOp::Sum);
        for (r, (b, s)) in bufs.iter().zip(&streams).enumerate() {
            check(&b.to_host_vec(s).unwrap(), &want[r], ReduceOp::Sum, &format!("call {i} rank {r}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_gather_reduce_scatter_and_broadcast_on_three_logical_ranks() {
    let engine = Engine::new();
    let device = device();
    let n = 3;
    let streams: Vec<Stream> = (0..n).map(|_| Stream::new(&device).unwrap()).collect();
    let part = 33_333;
    let host_in: Vec<Vec<u32>> = (0..n)
        .map(|r| {
            let mut v = vec![0u32; part];
            fill_random(&mut v, 40 + r as u64);
            v
        })
        .collect();
    let inputs: Vec<DeviceBuffer<u32>> =
        host_in.iter().zip(&streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect();
    let mut outputs: Vec<DeviceBuffer<u32>> = (0..n).map(|_| DeviceBuffer::alloc(&device, n * part).unwrap()).collect();
    for (o, s) in outputs.iter_mut().zip(&streams) {
        o.fill_bytes(s, 0xA5).unwrap();
    }
    {
        let views: Vec<_> = inputs.iter().map(|b| b.view(..)).collect();
        let mut ranks: Vec<Rank<'_, u32>> =
            outputs.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
        all_gather(&engine, &views, &mut ranks, Transport::Auto).unwrap();
    }
    let gathered: Vec<u32> = host_in.concat();
    for (o, s) in outputs.iter().zip(&streams) {
        assert!(o.to_host_vec(s).unwrap() == gathered, "all_gather");
    }
    // reduce_scatter of the gathered buffers (one per rank, with different data).
    let rs_in: Vec<Vec<u32>> = (0..n)
        .map(|r| {
            let mut v = vec![0u32; n * part];
            fill_random(&mut v, 70 + r as u64);
            v
        })
        .collect();
    let rs_bufs: Vec<DeviceBuffer<u32>> =
        rs_in.iter().zip(&streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect();
    let mut rs_out: Vec<DeviceBuffer<u32>> = (0..n).map(|_| DeviceBuffer::alloc(&device, part).unwrap()).collect();
    {
        let views: Vec<_> = rs_bufs.iter().map(|b| b.view(..)).collect();
        let mut ranks: Vec<Rank<'_, u32>> =
            rs_out.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
        reduce_scatter(&engine, &views, &mut ranks, ReduceOp::Max, Transport::Scratch).unwrap();
    }
    for (r, (o, s)) in rs_out.iter().zip(&streams).enumerate() {
        let seg = segment(n, n * part, r);
        let want: Vec<u32> = seg.clone().map(|i| rs_in.iter().map(|v| v[i]).max().unwrap()).collect();
        assert!(o.to_host_vec(s).unwrap() == want, "reduce_scatter rank {r}");
        assert!(rs_bufs[r].to_host_vec(s).unwrap() == rs_in[r], "reduce_scatter left input {r} alone");
    }
    // broadcast from rank 1.
    let mut bc: Vec<DeviceBuffer<u32>> =
        rs_in.iter().zip(&streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect();
    {
        let mut ranks: Vec<Rank<'_, u32>> =
            bc.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
        broadcast(&engine, &mut ranks, 1, Transport::Auto).unwrap();
        assert!(broadcast(&engine, &mut ranks, 3, Transport::Auto).is_err(), "root out of range");
    }
    for (b, s) in bc.iter().zip(&streams) {
        assert!(b.to_host_vec(s).unwrap() == rs_in[1], "broadcast");
    }
}
