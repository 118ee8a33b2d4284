//! GPU: cudarc's memory and streams used in place (feature `cudarc`): copies and all_reduce
//! on cudarc allocations and streams, interleaved with cudarc's own work, no host
//! synchronisation until the results are read back; a cudarc slice dropped right after the
//! enqueue is freed only after the work that reads it, even when that work ran on another
//! stream than the one its view was made for; an all-reduce on a capturing cudarc stream is
//! refused before either rank's kernel is enqueued.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};
use geforce_p2p::cuda::interop::{CudarcStream, CudarcView, CudarcViewMut};
use geforce_p2p::{CopyOptions, Device, ReduceOp, Route, transport};
use gp2p_collectives::reference::expected;
use gp2p_collectives::{Collective, Engine, Rank, Receive, all_reduce};
use gp2p_tests::{count_mismatched, device, needs, random};

fn context(ordinal: usize) -> (Arc<CudaContext>, Arc<CudaStream>, Arc<CudaStream>) {
    // Our library opens the primary context first, as an application mixing the two would.
    device(ordinal);
    let ctx = CudaContext::new(ordinal).unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    (ctx, a, b)
}

/// Run `body` while cudarc's `stream` captures a graph (relaxed mode); returns what `body`
/// gave and what ending the capture said (the graph, if any, is dropped).
fn while_capturing<R>(stream: &Arc<CudaStream>, body: impl FnOnce() -> R) -> (R, Result<(), DriverError>) {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    let given = body();
    (given, stream.end_capture(CUgraphInstantiate_flags(0)).map(drop))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn staged_copies_of_cudarc_memory_on_cudarc_streams() {
    // Serial with the capture tests: cudarc's stream creation, run while another test's
    // stream captured, was refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidated
    // that capture, failing both tests (once, in the suite at ef17ada).
    let _serial = gp2p_tests::serial();
    needs!(gpus: 1);
    let (_ctx, s1, s2) = context(0);
    let len = (3 << 20) + 5; // several chunks
    let host = random::<f32>(len, 1);
    let staging = s1.clone_htod(&host).unwrap();
    let mut src: CudaSlice<f32> = s1.alloc_zeros(len).unwrap();
    let mut dst: CudaSlice<f32> = s2.alloc_zeros(len).unwrap();
    let mut out: CudaSlice<f32> = s2.alloc_zeros(len).unwrap();
    // cudarc writes src, ours copies it across streams, cudarc reads the copy: no host sync.
    s1.memcpy_dtod(&staging, &mut src).unwrap();
    {
        let b = CudarcStream::new(&s2).unwrap();
        // The view is ordered on s1 (after cudarc's write there), but the copy runs on s2:
        // the wrapper still makes s1 wait for it before cudarc may free `src`.
        s2.join(&s1).unwrap();
        let from = CudarcView::new(&src, &s1).unwrap();
        let mut to = CudarcViewMut::new(&mut dst, &s2).unwrap();
        let options = CopyOptions { route: Route::Staged, chunk_bytes: Some(1 << 20), slots: Some(3) };
        transport().copy(&from.view(), &b, &mut to.view_mut(), &b, options).unwrap();
    }
    drop(src); // cudarc frees it stream-ordered, after the read event the view recorded
    s2.memcpy_dtod(&dst, &mut out).unwrap();
    assert!(s2.clone_dtoh(&out).unwrap() == host, "the copy seen by cudarc's later work");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_leaked_wrapper_still_orders_cudarcs_free_after_the_work() {
    // mem::forget is safe: a wrapper that never drops must not let cudarc free (and reuse)
    // the memory under work still queued through its views.
    let _serial = gp2p_tests::serial();
    needs!(gpus: 1);
    let (_ctx, s1, s2) = context(0);
    let len = (1 << 20) + 3;
    let host = random::<f32>(len, 2);
    let src: CudaSlice<f32> = s1.clone_htod(&host).unwrap();
    let mut dst: CudaSlice<f32> = s2.alloc_zeros(len).unwrap();
    s2.join(&s1).unwrap();
    let b = CudarcStream::new(&s2).unwrap();
    let options = CopyOptions { route: Route::Staged, chunk_bytes: Some(1 << 20), slots: Some(2) };
    {
        // Once before the gate: the transport's staging ring is allocated now, not behind it
        // (an allocation may wait for a held stream).
        let (from, mut to) = (CudarcView::new(&src, &s1).unwrap(), CudarcViewMut::new(&mut dst, &s2).unwrap());
        transport().copy(&from.view(), &b, &mut to.view_mut(), &b, options).unwrap();
    }
    s2.memset_zeros(&mut dst).unwrap();
    s2.synchronize().unwrap();
    let gate = gp2p_tests::hold(&b); // the copy below waits behind it
    let held = std::time::Instant::now();
    let from = CudarcView::new(&src, &s1).unwrap();
    let mut to = CudarcViewMut::new(&mut dst, &s2).unwrap();
    transport().copy(&from.view(), &b, &mut to.view_mut(), &b, options).unwrap();
    std::mem::forget(from);
    std::mem::forget(to);
    // cudarc frees `src` on s1 and hands the memory to the next allocation there, which
    // cudarc zeroes: both must wait for the held copy. (Zeroed on the GPU: a refill copied
    // from pageable host memory blocks the host until s1 reaches it, past the gate.)
    let copied = held.elapsed();
    drop(src);
    let freed = held.elapsed();
    let poison: CudaSlice<f32> = s1.alloc_zeros(len).unwrap();
    let refilled = held.elapsed();
    // Which host call waited on the gate, if one did: the times since it closed.
    assert!(
        !gate.expired(),
        "the copy was still held when cudarc freed and refilled (since the gate closed: copy \
         enqueued at {copied:?}, src freed at {freed:?}, refilled at {refilled:?})"
    );
    drop(gate);
    drop(b);
    assert!(s2.clone_dtoh(&dst).unwrap() == host, "the copy read the memory before cudarc reused it");
    drop(poison);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_reduce_of_cudarc_memory_interleaved_with_cudarc_work() {
    // Serial with the capture tests, as above.
    let _serial = gp2p_tests::serial();
    needs!(gpus: 1);
    // Two GPUs when there are, else two logical ranks on one (feature `testing`).
    let count = Device::count().unwrap();
    let ordinals = if count >= 2 { [0, 1] } else { [0, 0] };
    let ranks: Vec<_> = ordinals.iter().map(|&o| context(o)).collect();
    let engine = Engine::new();
    for (case, len) in [1usize, 1000, (1 << 20) + 3].into_iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..2).map(|r| random::<f32>(len, 10 * case as u64 + r)).collect();
        let mut bufs: Vec<CudaSlice<f32>> = Vec::new();
        for ((_, s, _), input) in ranks.iter().zip(&inputs) {
            // Written by cudarc on its stream just before the collective.
            let staged = s.clone_htod(input).unwrap();
            let mut b: CudaSlice<f32> = s.alloc_zeros(len).unwrap();
            s.memcpy_dtod(&staged, &mut b).unwrap();
            bufs.push(b);
        }
        {
            let streams: Vec<CudarcStream<'_>> = ranks.iter().map(|(_, s, _)| CudarcStream::new(s).unwrap()).collect();
            let mut views: Vec<CudarcViewMut<'_, f32>> =
                bufs.iter_mut().zip(&ranks).map(|(b, (_, s, _))| CudarcViewMut::new(b, s).unwrap()).collect();
            let mut rank_list: Vec<Rank<'_, f32>> =
                views.iter_mut().zip(&streams).map(|(v, s)| Rank { buffer: v.view_mut(), stream: s }).collect();
            all_reduce(&engine, &mut rank_list, ReduceOp::Sum, Receive::Auto).unwrap();
        }
        let want = expected(Collective::AllReduce, &inputs, ReduceOp::Sum);
        for (r, (b, (_, s, _))) in bufs.iter().zip(&ranks).enumerate() {
            // Read by cudarc after the collective, on the same stream: sees the result.
            let mut copy: CudaSlice<f32> = s.alloc_zeros(len).unwrap();
            s.memcpy_dtod(b, &mut copy).unwrap();
            let got = s.clone_dtoh(&copy).unwrap();
            let (bad, first) = count_mismatched(&got, &want[r], ReduceOp::Sum);
            assert_eq!(bad, 0, "len {len} rank {r}: {}", first.join("; "));
        }
    }
}

/// A two-rank sum of cudarc slices on cudarc streams (each on its own device) through
/// `engine`.
fn sum_on(
    engine: &Engine,
    views: [&mut CudarcViewMut<'_, f32>; 2],
    streams: [&CudarcStream<'_>; 2],
) -> Result<(), gp2p_collectives::Error> {
    let [v0, v1] = views;
    let mut ranks =
        vec![Rank { buffer: v0.view_mut(), stream: streams[0] }, Rank { buffer: v1.view_mut(), stream: streams[1] }];
    all_reduce(engine, &mut ranks, ReduceOp::Sum, Receive::Auto)
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn an_all_reduce_on_a_capturing_stream_is_refused_before_either_rank_enqueues() {
    // The one-kernel exchange numbers calls on each device: a call that enqueued rank 0's
    // kernel and not rank 1's would leave the two out of step. A capturing stream is refused
    // before anything is enqueued, so the capture stays valid and the next call pairs up.
    let _serial = gp2p_tests::serial();
    needs!(gpus: 2, concurrent_kernels, compute_80);
    let (_c0, a0, _) = context(0);
    let (_c1, a1, _) = context(1);
    let (s0, s1) = (CudarcStream::new(&a0).unwrap(), CudarcStream::new(&a1).unwrap());
    let engine = Engine::new();
    // A first call makes the engine's exchange (allocations and module loads stay outside
    // the capture below).
    let mut warm = [a0.clone_htod(&[1.0f32; 4]).unwrap(), a1.clone_htod(&[2.0f32; 4]).unwrap()];
    {
        let [w0, w1] = &mut warm;
        let (mut v0, mut v1) = (CudarcViewMut::new(w0, &a0).unwrap(), CudarcViewMut::new(w1, &a1).unwrap());
        sum_on(&engine, [&mut v0, &mut v1], [&s0, &s1]).unwrap();
    }
    assert_eq!(a1.clone_dtoh(&warm[1]).unwrap(), vec![3.0f32; 4]);
    let len = 10_001;
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| random(len, 40 + r)).collect();
    let mut bufs = [a0.clone_htod(&inputs[0]).unwrap(), a1.clone_htod(&inputs[1]).unwrap()];
    {
        // The views (and cudarc's waits they take) come before the capture begins.
        let [b0, b1] = &mut bufs;
        let (mut v0, mut v1) = (CudarcViewMut::new(b0, &a0).unwrap(), CudarcViewMut::new(b1, &a1).unwrap());
        let (refused, ended) = while_capturing(&a1, || sum_on(&engine, [&mut v0, &mut v1], [&s0, &s1]));
        let err = refused.expect_err("rank 1's stream is capturing");
        assert!(err.to_string().contains("captur"), "{err}");
        assert!(ended.is_ok(), "the capture stayed valid: {:?}", ended.err());
        sum_on(&engine, [&mut v0, &mut v1], [&s0, &s1]).unwrap();
    }
    let want = expected(Collective::AllReduce, &inputs, ReduceOp::Sum);
    for (r, (buf, stream)) in bufs.iter().zip([&a0, &a1]).enumerate() {
        let got = stream.clone_dtoh(buf).unwrap();
        let (bad, first) = count_mismatched(&got, &want[r], ReduceOp::Sum);
        assert_eq!(bad, 0, "rank {r}: {}", first.join("; "));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gate_on_a_capturing_stream_is_refused_and_the_capture_stays_valid() {
    // Captured, the gate's host function would run at every launch of the graph, each time
    // on state counted for one run.
    let _serial = gp2p_tests::serial();
    needs!(gpus: 1);
    let (_ctx, s1, _) = context(0);
    let b = CudarcStream::new(&s1).unwrap();
    let (refused, ended) = while_capturing(&s1, || geforce_p2p::cuda::HostGate::close(&b));
    let Err(err) = refused else { panic!("a gate closed on a capturing stream") };
    assert!(err.to_string().contains("captur"), "{err}");
    assert!(ended.is_ok(), "the capture stayed valid: {:?}", ended.err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_of_a_non_primary_cudarc_context_is_refused() {
    // The library's kernels run in the primary context, where memory of another context is
    // not mapped: wrapping such a stream (or its memory) must fail, not fault.
    let _serial = gp2p_tests::serial();
    needs!(gpus: 1);
    device(0);
    let ctx = CudaContext::new_non_primary(0, 0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let Err(err) = CudarcStream::new(&stream) else { panic!("a non-primary context's stream was borrowed") };
    assert!(err.to_string().contains("primary context"), "{err}");
    let buf: CudaSlice<f32> = stream.alloc_zeros(4).unwrap();
    let Err(err) = CudarcView::new(&buf, &stream) else { panic!("a non-primary context's memory was viewed") };
    assert!(err.to_string().contains("primary context"), "{err}");
}
