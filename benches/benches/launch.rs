//! Host-side costs: planning and enqueueing a reduce launch and a 1 GiB staged copy. On a
//! machine without a GPU only the planning benches run.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// criterion_group! generates undocumented items.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use geforce_p2p::cuda::{SourceMemory, reduce_launch_config};
use geforce_p2p::transport::plan::Chunking;
use geforce_p2p::{DType, Device, DeviceBuffer, ReduceOp, Stream, ops};

const GIB: usize = 1 << 30;

fn planning(c: &mut Criterion) {
    c.bench_function("reduce_launch_config 1 GiB f32", |b| {
        b.iter(|| reduce_launch_config(black_box(1 << 28), black_box(DType::F32), black_box(132), SourceMemory::Device))
    });
    c.bench_function("plan a 1 GiB copy", |b| {
        b.iter(|| {
            let plan = Chunking::for_bytes(black_box(GIB), None, None).plan(GIB / 4, 4);
            plan.chunks().map(|r| r.len()).sum::<usize>()
        })
    });
}

fn enqueue(c: &mut Criterion) {
    let Ok(device) = Device::open(0) else {
        eprintln!("no CUDA device: skipping the enqueue benches");
        return;
    };
    let (Ok(stream), Ok(mut dst), Ok(src)) = (
        Stream::new(&device),
        DeviceBuffer::<u32>::alloc(&device, GIB / 4),
        DeviceBuffer::<u32>::alloc(&device, GIB / 4),
    ) else {
        eprintln!("could not set up the enqueue benches");
        return;
    };
    c.bench_function("enqueue reduce 4 MiB f32", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                let _ = ops::reduce(&stream, &mut dst.view_mut(..1 << 20), &src.view(..1 << 20), ReduceOp::Sum, 1);
                total += t0.elapsed();
            }
            let _ = stream.synchronize();
            total
        })
    });
    let mut group = c.benchmark_group("staged copy");
    group.sample_size(10);
    group.bench_function("enqueue a 1 GiB staged copy", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // Start from an idle GPU so only the host's enqueue work is timed.
                let _ = stream.synchronize();
                let t0 = Instant::now();
                let _ = ops::staged_copy(&src.view(..), &stream, &mut dst.view_mut(..), &stream, None, None);
                total += t0.elapsed();
            }
            let _ = stream.synchronize();
            total
        })
    });
    group.finish();
}

criterion_group!(benches, planning, enqueue);
criterion_main!(benches);
