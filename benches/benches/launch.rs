//! Host-side cost of planning and enqueueing a reduce launch. On a machine without a GPU
//! only the planning bench runs.

// criterion_group! generates undocumented items.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use geforce_p2p::cuda::reduce_launch_config;
use geforce_p2p::{DType, Device, DeviceBuffer, ReduceOp, Stream, ops};
use std::hint::black_box;

fn planning(c: &mut Criterion) {
    c.bench_function("reduce_launch_config 1 GiB f32", |b| {
        b.iter(|| reduce_launch_config(black_box(1 << 28), black_box(DType::F32), black_box(132)))
    });
}

fn enqueue(c: &mut Criterion) {
    let Ok(device) = Device::open(0) else {
        eprintln!("no CUDA device: skipping the enqueue bench");
        return;
    };
    let (Ok(stream), Ok(mut dst), Ok(src)) = (
        Stream::new(&device),
        DeviceBuffer::<f32>::alloc(&device, 1 << 20),
        DeviceBuffer::<f32>::alloc(&device, 1 << 20),
    ) else {
        eprintln!("could not set up the enqueue bench");
        return;
    };
    c.bench_function("enqueue reduce 4 MiB f32", |b| {
        b.iter(|| ops::reduce(&stream, &mut dst.view_mut(..), &src.view(..), ReduceOp::Sum, 1))
    });
    let _ = stream.synchronize();
}

criterion_group!(benches, planning, enqueue);
criterion_main!(benches);
