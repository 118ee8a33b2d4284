//! GPU: the lifetime rule. Buffers, pinned memory, rings, streams and engines dropped while
//! their work is still queued (behind a closed `HostGate`) neither block nor free memory in
//! use; the staging ring refuses misuse; views index like slices; zero-length copies still
//! order their streams; a shared event is never trusted to know who recorded it last.

// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The raw event record below stands for foreign code holding the handle.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use geforce_p2p::pinned::{Error as PinnedError, Fold, copy_from_host, copy_to_host};
use geforce_p2p::{
    CopyOptions, Device, DeviceBuffer, Event, EventKind, PinnedBuffer, ReduceOp, Route, StagingRing, Stream, Transport,
};
use gp2p_collectives::{Engine, Rank, Receive, all_reduce, reduce_scatter};
use gp2p_tests::{HostGate, POISON, Reference, drop_limit, hold, max_len, needs, random};

/// How long a test lets queued work sit before checking it has not run.
const SETTLE: Duration = Duration::from_millis(20);

/// Drop `value`, returning how long the drop took.
fn timed_drop<T>(value: T) -> Duration {
    let start = Instant::now();
    drop(value);
    start.elapsed()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn drops_never_block_and_never_free_memory_still_in_use() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let caller = Stream::new(&device).unwrap();
    let len = (1usize << 22).min(max_len()); // 16 MiB of u32: a multi-chunk staged copy
    let host = random::<u32>(len, 1);
    let src = DeviceBuffer::from_host(&caller, &host).unwrap();
    let mut out = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    let (a_host, b_host) = (random::<u32>(len, 2), random::<u32>(len, 3));
    let mut a = DeviceBuffer::from_host(&caller, &a_host).unwrap();
    let mut b = DeviceBuffer::from_host(&caller, &b_host).unwrap();
    let transport = Transport::new();
    let engine = Engine::new();
    let staged = CopyOptions { route: Route::Staged, chunk_bytes: Some(1 << 20), slots: Some(3) };
    // Everything that allocates is made before the gate closes (a driver allocation may wait
    // for the device): the buffers, and the engines' rings and scratch by a first run.
    let mut mid = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    transport.copy(&src.view(..), &caller, &mut mid.view_mut(..), &caller, staged).unwrap();
    let (mut warm_a, mut warm_b) =
        (DeviceBuffer::<u32>::alloc(&device, len).unwrap(), DeviceBuffer::<u32>::alloc(&device, len).unwrap());
    {
        let mut ranks = vec![
            Rank { buffer: warm_a.view_mut(..), stream: &caller },
            Rank { buffer: warm_b.view_mut(..), stream: &caller },
        ];
        all_reduce(&engine, &mut ranks, ReduceOp::Sum, Receive::Scratch).unwrap();
    }
    let mut pinned = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    let mut back = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    let mut ring = StagingRing::new(&device, &device, 2, 4096).unwrap();
    let small: Vec<u32> = (0..1000).collect();
    let small_src = DeviceBuffer::from_host(&caller, &small).unwrap();
    let mut small_dst = DeviceBuffer::<u32>::alloc(&device, small.len()).unwrap();
    let side = Stream::new(&device).unwrap();
    let mut side_buf = DeviceBuffer::<u32>::alloc(&device, 1024).unwrap();
    let writer = Stream::new(&device).unwrap();
    caller.synchronize().unwrap();
    let mut drops: Vec<(&str, Duration)> = Vec::new();

    let gate = hold(&caller);
    // Everything below queues behind the gate; each helper is dropped right after its last
    // enqueue, as temporaries and worker-owned objects are in real code.
    transport.copy(&src.view(..), &caller, &mut mid.view_mut(..), &caller, staged).unwrap();
    copy_to_host(&caller, &mid.view(..), &mut pinned.view_mut(..)).unwrap();
    drops.push(("DeviceBuffer (copied into, then read by a DMA)", timed_drop(mid)));
    copy_from_host(&caller, &pinned.view(..), &mut back.view_mut(..)).unwrap();
    drops.push(("PinnedBuffer (DMA in and out pending)", timed_drop(pinned)));
    out.view_mut(..).copy_from(&caller, &back.view(..)).unwrap();
    drops.push(("DeviceBuffer (source of a pending copy)", timed_drop(back)));
    drops.push(("Transport (rings and streams of a pending copy)", timed_drop(transport)));
    ring.pass(&caller, &small_src.view(..), &caller, &mut small_dst.view_mut(..), Fold::Copy).unwrap();
    drops.push(("StagingRing (a pass pending)", timed_drop(ring)));
    {
        let mut ranks =
            vec![Rank { buffer: a.view_mut(..), stream: &caller }, Rank { buffer: b.view_mut(..), stream: &caller }];
        all_reduce(&engine, &mut ranks, ReduceOp::Sum, Receive::Scratch).unwrap();
    }
    drops.push(("collectives Engine (an all_reduce pending)", timed_drop(engine)));
    side.wait_point(&caller.point().unwrap()).unwrap();
    side_buf.fill_bytes(&side, 0x11).unwrap();
    drops.push(("Stream (waiting behind the gate)", timed_drop(side)));
    drops.push(("DeviceBuffer (written on a dropped stream)", timed_drop(side_buf)));
    drops.push(("DeviceBuffer (read by pending work, then dropped)", timed_drop(warm_a)));
    // Every drop above happened while the work was still held.
    assert!(!gate.expired() && !caller.is_idle().unwrap(), "the gate must still hold the work");

    // Fresh memory written at once: had any of the above been freed, these could take its
    // place, and the queued work would then read or write them.
    let mut fresh: Vec<DeviceBuffer<u32>> = Vec::new();
    for _ in 0..6 {
        let mut f = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
        f.fill_bytes(&writer, 0xEE).unwrap();
        fresh.push(f);
    }
    let mut fresh_pinned = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    fresh_pinned.as_mut_slice().unwrap().fill(0xEEEE_EEEE);
    writer.synchronize().unwrap();
    // (An allocation may wait for the held stream: the driver synchronises there on some
    // systems, the two-H200 machine among them. The gate's deadline bounds that wait.)
    gate.open();
    caller.synchronize().unwrap();
    assert!(out.to_host_vec(&caller).unwrap() == host, "the chain of copies through dropped buffers");
    let sum: Vec<u32> = a_host.iter().zip(&b_host).map(|(x, y)| x.wrapping_add(*y)).collect();
    assert!(a.to_host_vec(&caller).unwrap() == sum, "all_reduce rank 0 after the engine was dropped");
    assert!(b.to_host_vec(&caller).unwrap() == sum, "all_reduce rank 1 after the engine was dropped");
    assert_eq!(small_dst.to_host_vec(&caller).unwrap(), small, "ring pass after the ring was dropped");
    for f in &fresh {
        assert!(f.to_host_vec(&writer).unwrap().iter().all(|&v| v == 0xEEEE_EEEE), "fresh memory overwritten");
    }
    assert!(fresh_pinned.as_slice().unwrap().iter().all(|&v| v == 0xEEEE_EEEE), "fresh pinned memory overwritten");
    drop(warm_b);
    for (what, took) in &drops {
        println!("drop of {what}: {:.1} us", took.as_secs_f64() * 1e6);
    }
    for (what, took) in &drops {
        assert!(*took < drop_limit(), "dropping a {what} blocked the host for {took:?}");
    }
    assert_eq!(geforce_p2p::cuda::take_deferred_error(), None, "no destructor failed");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_shared_event_is_never_trusted_to_know_who_recorded_it_last() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let (s1, s2) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    // Deterministic: recorded on s1 through the API, then on the gated s2 by code holding the
    // raw handle. A wait on s1 must still wait for s2's record (an older version skipped it,
    // believing s1 recorded last).
    // The events are made before the gate closes: creating one may wait for the device to go
    // idle (the driver grows its event pool), which would wait out the gate and let s1 pass.
    let event = Event::new(&device, EventKind::Sync).unwrap();
    let reserved = s1.reserve_point().unwrap();
    let gate = hold(&s2);
    event.record(&s1).unwrap();
    // SAFETY: both handles are live and of the same context; this is what foreign code
    // holding `Event::raw` may do.
    let code = unsafe { cudarc::driver::sys::cuEventRecord(event.raw(), s2.raw()) };
    assert_eq!(code, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    s1.wait(&event).unwrap();
    let after = s1.point_from(reserved).unwrap();
    let start = Instant::now();
    std::thread::sleep(SETTLE);
    let (ran_past, gated_done) = (after.is_complete().unwrap(), event.is_complete().unwrap());
    let (expired, slept) = (gate.expired(), start.elapsed());
    assert!(
        !ran_past,
        "s1 ran past a wait on work still gated on s2 (s2's record done: {gated_done}, gate expired: {expired}, \
         slept {slept:?})"
    );
    assert!(!expired);
    gate.open();
    after.synchronize().unwrap();

    // Racing: two threads record one event on s1 and on the gated s2, many times; whoever
    // recorded last, a wait on s1 must never let s1 pass while the event is incomplete.
    for round in 0..200 {
        let event = Event::new(&device, EventKind::Sync).unwrap();
        let reserved = s1.reserve_point().unwrap();
        let gate = hold(&s2);
        std::thread::scope(|scope| {
            scope.spawn(|| event.record(&s1).unwrap());
            scope.spawn(|| event.record(&s2).unwrap());
        });
        s1.wait(&event).unwrap();
        let after = s1.point_from(reserved).unwrap();
        settle(&s1, Duration::from_millis(2));
        let passed_early = after.is_complete().unwrap() && !event.is_complete().unwrap();
        gate.open();
        s1.synchronize().unwrap();
        assert!(!passed_early, "round {round}: s1 passed a wait on an incomplete event");
    }
}

/// Sleep until `stream` is idle or `limit` passes (a stand-in for synchronize on a stream
/// that may be waiting on a held one).
fn settle(stream: &Stream, limit: Duration) {
    let start = Instant::now();
    while !stream.is_idle().unwrap() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn concurrent_reduce_scatters_never_lose_a_work_buffer_in_use() {
    let _serial = gp2p_tests::serial();
    // Two threads share one engine (and so its cached work buffers). Thread A's calls sit
    // behind a gate while thread B's calls of other sizes take, replace and give back the
    // cached buffers, and then write fresh memory: A's buffers must survive until A's work ran.
    let [device] = needs!(gpus: 1);
    let engine = Engine::new();
    let n = 2;
    let run = |stream_count: usize, len_per_rank: usize, rounds: usize, gated: bool, seed: u64| {
        let streams: Vec<Stream> = (0..stream_count).map(|_| Stream::new(&device).unwrap()).collect();
        let inputs: Vec<Vec<u32>> = (0..n).map(|r| random::<u32>(n * len_per_rank, seed + r as u64)).collect();
        let ins: Vec<DeviceBuffer<u32>> =
            inputs.iter().zip(&streams).map(|(h, s)| DeviceBuffer::from_host(s, h).unwrap()).collect();
        let mut outs: Vec<Vec<DeviceBuffer<u32>>> = (0..rounds)
            .map(|_| (0..n).map(|_| DeviceBuffer::alloc(&device, len_per_rank).unwrap()).collect())
            .collect();
        if gated {
            // A first run makes the group, its rings and its work buffer, outside the gate.
            let mut warm: Vec<DeviceBuffer<u32>> =
                (0..n).map(|_| DeviceBuffer::alloc(&device, len_per_rank).unwrap()).collect();
            let views: Vec<_> = ins.iter().map(|b| b.view(..)).collect();
            let mut ranks: Vec<Rank<'_, u32>> =
                warm.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
            reduce_scatter(&engine, &views, &mut ranks, ReduceOp::Sum, Receive::Scratch).unwrap();
            drop(ranks);
            streams.iter().for_each(|s| s.synchronize().unwrap());
        }
        let gates: Vec<HostGate> = if gated { streams.iter().map(hold).collect() } else { Vec::new() };
        for o in &mut outs {
            {
                let views: Vec<_> = ins.iter().map(|b| b.view(..)).collect();
                let mut ranks: Vec<Rank<'_, u32>> =
                    o.iter_mut().zip(&streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
                reduce_scatter(&engine, &views, &mut ranks, ReduceOp::Sum, Receive::Scratch).unwrap();
            }
        }
        if gated {
            // Held while the other thread's calls replace the cached buffers. (An allocation
            // may wait for the held streams on some drivers; the gates' deadline bounds it.)
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(gates);
        for (round, o) in outs.iter().enumerate() {
            for (r, (buf, s)) in o.iter().zip(&streams).enumerate() {
                let want: Vec<u32> = (0..len_per_rank)
                    .map(|i| inputs[0][r * len_per_rank + i].wrapping_add(inputs[1][r * len_per_rank + i]))
                    .collect();
                assert!(buf.to_host_vec(s).unwrap() == want, "gated {gated}, round {round}, rank {r}");
            }
        }
    };
    std::thread::scope(|scope| {
        scope.spawn(|| run(2, 1 << 18, 3, true, 100));
        scope.spawn(|| {
            for (i, len) in [1000, 1 << 19, 77, 1 << 20, 4096, 1 << 18].into_iter().enumerate() {
                run(2, len, 2, false, 200 + i as u64);
                let writer = Stream::new(&device).unwrap();
                for _ in 0..4 {
                    let mut f = DeviceBuffer::<u32>::alloc(&device, 1 << 21).unwrap();
                    f.fill_bytes(&writer, 0xEE).unwrap();
                }
                writer.synchronize().unwrap();
            }
        });
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_staging_ring_refuses_misuse_before_any_work() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let stream = Stream::new(&device).unwrap();
    let data: Vec<u32> = (0..64).collect();
    let src = DeviceBuffer::from_host(&stream, &data).unwrap();
    let mut dst = DeviceBuffer::<u32>::alloc(&device, 64).unwrap();
    dst.fill_bytes(&stream, POISON).unwrap();
    let mut ring = StagingRing::new(&device, &device, 2, 4096).unwrap();
    let mut other = StagingRing::new(&device, &device, 2, 4096).unwrap();

    let first = ring.send(&stream, &src.view(..32)).unwrap();
    let second = ring.send(&stream, &src.view(32..)).unwrap();
    let busy = ring.send(&stream, &src.view(..)).unwrap_err();
    assert_eq!(busy, PinnedError::SlotBusy { slot: 0 }, "{busy}");
    assert!(busy.to_string().contains("never received"), "{busy}");

    let foreign = other.send(&stream, &src.view(..32)).unwrap();
    let err = ring.receive(foreign, &stream, &mut dst.view_mut(..32), Fold::Copy).unwrap_err();
    assert!(matches!(err, PinnedError::ForeignChunk { .. }), "{err}");
    stream.synchronize().unwrap();
    assert!(dst.to_host_vec(&stream).unwrap().iter().all(|&v| v == u32::from_byte(POISON)), "a refusal wrote nothing");

    ring.receive(first, &stream, &mut dst.view_mut(..32), Fold::Copy).unwrap();
    ring.receive(second, &stream, &mut dst.view_mut(32..), Fold::Copy).unwrap();
    let empty = ring.drain(0, &stream, &mut dst.view_mut(..32)).unwrap_err();
    assert_eq!(empty, PinnedError::SlotEmpty { slot: 0 });
    assert_eq!(dst.to_host_vec(&stream).unwrap(), data, "the legitimate receives");
    // The other ring's slot still holds its chunk: it refuses to be filled again there.
    assert!(matches!(other.fill(0, &stream, &src.view(..1)), Err(PinnedError::SlotBusy { slot: 0 })));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn views_index_like_slices_and_split_without_unsafe() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let stream = Stream::new(&device).unwrap();
    let mut buf = DeviceBuffer::<u32>::alloc(&device, 100).unwrap();
    assert!(buf.get(90..200).is_none(), "out of bounds is refused, not clamped to 10 elements");
    assert!(buf.get(101..).is_none());
    assert_eq!(buf.get(90..100).map(|v| v.len()), Some(10));
    assert_eq!(buf.get(100..).map(|v| v.len()), Some(0));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| buf.view(90..200).len()));
    let message = caught.unwrap_err();
    let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("90..200") && text.contains("100 elements"), "{text}");
    let mut pinned = PinnedBuffer::<u32>::alloc(&device, 10).unwrap();
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pinned.view_mut(5..11).len())).is_err());

    let (mut head, mut tail) = buf.view_mut(..).split_at_mut(40);
    assert_eq!((head.len(), tail.len()), (40, 60));
    head.fill_bytes(&stream, 0x01).unwrap();
    tail.fill_bytes(&stream, 0x02).unwrap();
    let got = buf.to_host_vec(&stream).unwrap();
    assert!(got[..40].iter().all(|&v| v == 0x0101_0101) && got[40..].iter().all(|&v| v == 0x0202_0202));
    let ones: Vec<u32> = vec![9; 60];
    let src = DeviceBuffer::from_host(&stream, &ones).unwrap();
    let (_, mut tail) = buf.view_mut(..).split_at_mut(40);
    tail.copy_from(&stream, &src.view(..)).unwrap();
    assert_eq!(buf.to_host_vec(&stream).unwrap()[40..], ones[..]);
    pinned.as_mut_slice().unwrap().fill(3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn zero_length_copies_order_both_streams() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let (s_src, s_dst) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let src = DeviceBuffer::<u32>::alloc(&device, 8).unwrap();
    let mut dst = DeviceBuffer::<u32>::alloc(&device, 8).unwrap();
    for route in [Route::Auto, Route::Staged] {
        let options = CopyOptions { route, ..CopyOptions::default() };
        // The pair's state is made by a first copy, outside the gate.
        geforce_p2p::transport().copy(&src.view(..), &s_src, &mut dst.view_mut(..), &s_dst, options).unwrap();
        s_dst.synchronize().unwrap();
        s_src.synchronize().unwrap();
        for gate_src in [true, false] {
            let (gated, other) = if gate_src { (&s_src, &s_dst) } else { (&s_dst, &s_src) };
            let gate = hold(gated);
            geforce_p2p::transport().copy(&src.view(0..0), &s_src, &mut dst.view_mut(0..0), &s_dst, options).unwrap();
            let after = other.point().unwrap();
            std::thread::sleep(SETTLE);
            let ran_early = after.is_complete().unwrap();
            assert!(!gate.expired());
            gate.open();
            after.synchronize().unwrap();
            assert!(!ran_early, "{route}: an empty copy did not order the other stream after the gated one");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn borrowing_one_stream_at_every_call_keeps_one_use_for_it() {
    let _serial = gp2p_tests::serial();
    // A framework hands over its current stream at each call (the Python package borrows it
    // anew every time). Each borrow must count as that one stream: were each a stream of its
    // own, the buffer would keep a point per call and every later call would wait on all.
    let [device] = needs!(gpus: 1);
    let owner = Stream::new(&device).unwrap();
    let mut buffer = DeviceBuffer::<u32>::alloc(&device, 1024).unwrap();
    let gate = hold(&owner);
    for byte in 0..40u8 {
        // SAFETY: `owner` outlives every borrow and the work enqueued through them (it is
        // synchronised below before it drops).
        let borrowed = unsafe { Stream::borrow_raw(&device, owner.raw()) };
        buffer.fill_bytes(&borrowed, byte).unwrap();
    }
    assert_eq!(buffer.uses().stream_count(), 1, "40 borrows of one stream, all pending");
    let other = Stream::new(&device).unwrap();
    other.wait_point(&owner.point().unwrap()).unwrap();
    buffer.fill_bytes(&other, 40).unwrap();
    assert_eq!(buffer.uses().stream_count(), 2, "a second stream is a second use");
    gate.open();
    other.synchronize().unwrap();
    owner.synchronize().unwrap();
    assert_eq!(buffer.to_host_vec(&other).unwrap(), vec![u32::from_ne_bytes([40; 4]); 1024]);
}

/// Run `body` while `stream` captures a CUDA graph in `mode`. The capture ends (and the
/// graph it made, if any, is destroyed) before this returns, so an assertion that fails
/// afterwards leaves no capture open for the binary's later tests. Returns what `body` gave
/// and what ending the capture said.
fn while_capturing<R>(
    stream: &Stream,
    mode: cudarc::driver::sys::CUstreamCaptureMode,
    body: impl FnOnce() -> R,
) -> (R, cudarc::driver::sys::CUresult) {
    use cudarc::driver::sys::{CUresult, cuGraphDestroy, cuStreamBeginCapture_v2, cuStreamEndCapture};
    // SAFETY: a live stream of the current context (Stream::new bound it).
    assert_eq!(unsafe { cuStreamBeginCapture_v2(stream.raw(), mode) }, CUresult::CUDA_SUCCESS);
    let given = body();
    let mut graph = std::ptr::null_mut();
    // SAFETY: the capture begun above, on the same stream; out-pointer to a local.
    let ended = unsafe { cuStreamEndCapture(stream.raw(), &mut graph) };
    if !graph.is_null() {
        // SAFETY: the graph the capture made, destroyed once.
        unsafe { cuGraphDestroy(graph) };
    }
    (given, ended)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn borrowing_a_capturing_stream_leaves_its_capture_valid() {
    use cudarc::driver::sys::{CUresult, CUstreamCaptureMode, CUstreamCaptureStatus};
    let _serial = gp2p_tests::serial();
    // torch hands over its capture stream inside `torch.cuda.graph`: naming that stream by
    // its driver id (what a borrow does otherwise) ended the capture as invalidated.
    let [device] = needs!(gpus: 1);
    let owner = Stream::new(&device).unwrap();
    let mut buffer = DeviceBuffer::<u32>::alloc(&device, 1024).unwrap();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    let ((asked, status, seen_capturing), ended) = while_capturing(&owner, mode, || {
        // SAFETY: `owner` outlives the borrow, which enqueues nothing.
        let borrowed = unsafe { Stream::borrow_raw(&device, owner.raw()) };
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: live stream; out-pointer to a local.
        let asked = unsafe { cudarc::driver::sys::cuStreamIsCapturing(owner.raw(), &mut status) };
        (asked, status, borrowed.is_capturing())
    });
    assert_eq!(asked, CUresult::CUDA_SUCCESS);
    assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, "the borrow ended the capture");
    assert!(seen_capturing.unwrap(), "the borrowed stream says it is not capturing");
    assert_eq!(ended, CUresult::CUDA_SUCCESS, "the capture was invalidated");
    // Uncaptured again, the stream is named as before: one use for every borrow.
    let gate = hold(&owner);
    for byte in 0..3u8 {
        // SAFETY: as above; synchronised below.
        let again = unsafe { Stream::borrow_raw(&device, owner.raw()) };
        buffer.fill_bytes(&again, byte).unwrap();
    }
    assert_eq!(buffer.uses().stream_count(), 1, "3 borrows of one stream, all pending");
    gate.open();
    owner.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stream_borrowed_for_one_call_keeps_the_capture_status_it_was_borrowed_with() {
    use cudarc::driver::sys::{CUresult, CUstreamCaptureMode};
    let _serial = gp2p_tests::serial();
    // The Python bindings borrow torch's streams per call and ask once whether each captures;
    // every refusal later in the call reads that answer instead of the driver.
    let [device] = needs!(gpus: 1);
    let owner = Stream::new(&device).unwrap();
    let len = 70_001;
    let data = random(len, 91);
    let src = DeviceBuffer::from_host(&owner, &data).unwrap();
    let mut dst = DeviceBuffer::<f32>::alloc(&device, len).unwrap();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    // SAFETY: `owner` outlives the borrow. Against the contract a capture begins while it
    // lives, to show that the answer is the borrow's; nothing is enqueued through it.
    let before = unsafe { Stream::borrow_raw_for_call(&device, owner.raw()) }.unwrap();
    let ((capturing, refused, kept), ended) = while_capturing(&owner, mode, || {
        // SAFETY: `owner` outlives the borrow, dropped inside the capture; nothing is enqueued.
        let borrowed = unsafe { Stream::borrow_raw_for_call(&device, owner.raw()) }.unwrap();
        (borrowed.is_capturing().unwrap(), borrowed.refuse_capture(), before.is_capturing().unwrap())
    });
    assert!(capturing, "borrowed inside a capture, the stream says it is not capturing");
    assert!(matches!(refused, Err(geforce_p2p::cuda::Error::Capturing)), "{refused:?}");
    assert!(!kept, "borrowed before the capture, the stream asked the driver again");
    assert_eq!(ended, CUresult::CUDA_SUCCESS, "the borrow or the refusal invalidated the capture");
    drop(before);
    // Borrowed outside a capture it works as any borrow: a staged copy through it is right.
    // SAFETY: as above; synchronised below, before `owner` drops.
    let borrowed = unsafe { Stream::borrow_raw_for_call(&device, owner.raw()) }.unwrap();
    assert!(!borrowed.is_capturing().unwrap() && borrowed.refuse_capture().is_ok());
    let options = CopyOptions { route: Route::Staged, chunk_bytes: Some(64 << 10), slots: None };
    Transport::new().copy(&src.view(..), &borrowed, &mut dst.view_mut(..), &borrowed, options).unwrap();
    assert_eq!(dst.to_host_vec(&owner).unwrap(), data);
    // The legacy default stream is asked at the borrow too (it never captures).
    // SAFETY: the null handle is the legacy default stream, alive for the process.
    let legacy = unsafe { Stream::borrow_raw_for_call(&device, std::ptr::null_mut()) }.unwrap();
    assert!(!legacy.is_capturing().unwrap());
    drop(borrowed);
    owner.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_operation_on_a_borrowed_capturing_stream_is_refused() {
    use cudarc::driver::sys::{CUresult, CUstreamCaptureMode};
    let _serial = gp2p_tests::serial();
    // A graph replays the work as captured, long after the buffers' last-use records (taken
    // once, at capture) say it is done: the memory could be freed or reused by then.
    let [device] = needs!(gpus: 1);
    let owner = Stream::new(&device).unwrap();
    let mut buffer = DeviceBuffer::<u32>::alloc(&device, 1024).unwrap();
    // SAFETY: `owner` outlives the borrow and anything enqueued through it.
    let borrowed = unsafe { Stream::borrow_raw(&device, owner.raw()) };
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // Checked first, nothing is enqueued and the owner's capture stays valid.
    let (refused, ended) = while_capturing(&owner, mode, || borrowed.refuse_capture());
    assert!(matches!(refused, Err(geforce_p2p::cuda::Error::Capturing)), "{refused:?}");
    assert_eq!(ended, CUresult::CUDA_SUCCESS, "the owner's (empty) capture ends well");
    assert!(owner.refuse_capture().is_ok() && borrowed.refuse_capture().is_ok(), "owned, or not capturing");
    // Found only where the operation records its use, after its work was enqueued: the
    // refusal invalidates the capture with a capture-illegal wait, an API error that
    // compute-sanitizer reports, so that part runs without one.
    if let Some(tool) = gp2p_tests::sanitizer() {
        println!("the refusal after enqueueing not run: it provokes an API error on purpose, which {tool} reports");
    } else {
        let (refused, ended) = while_capturing(&owner, mode, || buffer.fill_bytes(&borrowed, 7));
        assert!(matches!(refused, Err(geforce_p2p::cuda::Error::Capturing)), "{refused:?}");
        assert_ne!(ended, CUresult::CUDA_SUCCESS, "a graph was made of refused work");
    }
    // The stream works again once the capture is over.
    buffer.fill_bytes(&borrowed, 9).unwrap();
    assert_eq!(buffer.to_host_vec(&owner).unwrap(), vec![u32::from_ne_bytes([9; 4]); 1024]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn staged_copies_and_ring_collectives_on_a_borrowed_capturing_stream_are_refused_before_enqueueing() {
    use cudarc::driver::sys::{CUresult, CUstreamCaptureMode};
    let _serial = gp2p_tests::serial();
    // Captured, their DMAs through the library's pinned staging slots would replay at every
    // graph launch into slots reused since, or (once the engine or transport is dropped) into
    // pinned blocks handed to another owner.
    let [device] = needs!(gpus: 1);
    let owner = Stream::new(&device).unwrap();
    // SAFETY: `owner` outlives the borrow and anything enqueued through it.
    let borrowed = unsafe { Stream::borrow_raw(&device, owner.raw()) };
    // The second rank's stream, not capturing: one capturing rank refuses the whole call.
    let other = Stream::new(&device).unwrap();
    let len = 300_007;
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| random(len, 70 + r)).collect();
    let src = DeviceBuffer::from_host(&owner, &inputs[0]).unwrap();
    let mut dst = DeviceBuffer::<f32>::alloc(&device, len).unwrap();
    let mut ring =
        [DeviceBuffer::from_host(&owner, &inputs[0]).unwrap(), DeviceBuffer::from_host(&owner, &inputs[1]).unwrap()];
    owner.synchronize().unwrap();
    let (transport, engine) = (Transport::new(), Engine::new());
    let options = CopyOptions { route: Route::Staged, chunk_bytes: Some(64 << 10), slots: None };
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    let (copied, ended) = while_capturing(&owner, mode, || {
        transport.copy(&src.view(..), &borrowed, &mut dst.view_mut(..), &borrowed, options)
    });
    assert!(copied.as_ref().is_err_and(|e| e.to_string().contains("captur")), "{copied:?}");
    assert_eq!(ended, CUresult::CUDA_SUCCESS, "the staged copy invalidated the capture");
    let (reduced, ended) = while_capturing(&owner, mode, || {
        let [a, b] = &mut ring;
        let mut ranks =
            [Rank { buffer: a.view_mut(..), stream: &other }, Rank { buffer: b.view_mut(..), stream: &borrowed }];
        all_reduce(&engine, &mut ranks, ReduceOp::Sum, Receive::Scratch)
    });
    assert!(reduced.as_ref().is_err_and(|e| e.to_string().contains("captur")), "{reduced:?}");
    assert_eq!(ended, CUresult::CUDA_SUCCESS, "the all_reduce invalidated the capture");
    // Nothing was enqueued: uncaptured, both run and are right.
    transport.copy(&src.view(..), &borrowed, &mut dst.view_mut(..), &borrowed, options).unwrap();
    assert_eq!(dst.to_host_vec(&owner).unwrap(), inputs[0]);
    let [a, b] = &mut ring;
    let mut ranks =
        [Rank { buffer: a.view_mut(..), stream: &other }, Rank { buffer: b.view_mut(..), stream: &borrowed }];
    all_reduce(&engine, &mut ranks, ReduceOp::Sum, Receive::Scratch).unwrap();
    let want: Vec<f32> = inputs[0].iter().zip(&inputs[1]).map(|(x, y)| x + y).collect();
    // Each rank's result is ordered on its own stream: read there (on `owner`, rank 0's read
    // raced the all_reduce's last work on `other`, which racecheck's slow kernels showed).
    assert_eq!(ring[0].to_host_vec(&other).unwrap(), want);
    assert_eq!(ring[1].to_host_vec(&owner).unwrap(), want);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_release_never_stalls_other_threads_while_a_stream_is_held() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    // Device memory goes back to the library's stream-ordered pool (cuMemFreeAsync); a
    // stream's destroy is deferred by the driver.
    releases_leave_other_threads_alone(&device, &[DEVICE_MEMORY, A_STREAM]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_pinned_release_never_stalls_other_threads_while_a_stream_is_held() {
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    // cuMemFreeHost waits for the whole device (0.98 s behind a 1 s gate on two H200s): the
    // reclaimer keeps the block for reuse instead.
    releases_leave_other_threads_alone(&device, &[PINNED_HOST_MEMORY]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dropped_pinned_memory_is_reused_zeroed_and_handed_back_on_request() {
    use geforce_p2p::cuda::{cached_host_bytes, lifetime::flush_releases, release_cached_host_memory};
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let stream = Stream::new(&device).unwrap();
    // Blocks earlier tests dropped would be taken before this test's.
    flush_releases();
    release_cached_host_memory(&device).unwrap();
    // An odd size: its block is rounded up, and a request a little smaller shares it.
    let len = 300_007;
    let mut first = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    first.as_mut_slice().unwrap().fill(0xA5A5_A5A5);
    let on_gpu = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    let gate = hold(&stream);
    geforce_p2p::pinned::copy_to_host(&stream, &on_gpu.view(..), &mut first.view_mut(..)).unwrap();
    let address = first.host_ptr() as usize;
    drop(first); // its copy still queued: the block must not be reused before it runs
    std::thread::sleep(SETTLE); // the reclaimer has taken the release up and polls its copy
    let meanwhile = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    assert_ne!(meanwhile.host_ptr() as usize, address, "a block reused under its pending copy");
    gate.open();
    stream.synchronize().unwrap();
    flush_releases();
    assert!(cached_host_bytes() >= len * 4, "the dropped block is not cached: {} bytes", cached_host_bytes());
    let second = PinnedBuffer::<u32>::alloc(&device, len - 1000).unwrap();
    assert_eq!(second.host_ptr() as usize, address, "the cached block of the size class was not reused");
    assert!(second.as_slice().unwrap().iter().all(|&x| x == 0), "a reused block is not zeroed");
    assert!(geforce_p2p::is_pinned(second.host_ptr().cast(), second.bytes()).unwrap());
    drop(second);
    flush_releases();
    let cached = cached_host_bytes();
    let freed = release_cached_host_memory(&device).unwrap();
    assert!(freed >= cached && freed >= len * 4, "handed back {freed} of {cached} cached bytes");
    assert_eq!(cached_host_bytes(), 0);
}

/// Waiting for the releases handed over since a mark (what the NCCL door's `ncclCommDestroy`
/// does for its communicator's) waits for those, after their GPU work, and not for an older
/// release whose work is still held: another owner's pending work never holds it up.
#[test]
#[ignore = "needs a CUDA GPU"]
fn waiting_for_the_releases_since_a_mark_skips_older_pending_ones() {
    use geforce_p2p::cuda::lifetime::{releases_queued, wait_for_releases_since};
    let _serial = gp2p_tests::serial();
    let [device] = needs!(gpus: 1);
    let (held, free) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let len = 1 << 20;
    let host = random::<u32>(len, 7);
    let (older, mine) =
        (DeviceBuffer::from_host(&held, &host).unwrap(), DeviceBuffer::from_host(&free, &host).unwrap());
    held.synchronize().unwrap();
    free.synchronize().unwrap();
    let mut pinned = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    let gate = hold(&held);
    copy_to_host(&held, &older.view(..), &mut pinned.view_mut(..)).unwrap();
    drop(older); // its copy waits behind the gate: its release stays pending
    let mark = releases_queued();
    let mut back = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    copy_to_host(&free, &mine.view(..), &mut back.view_mut(..)).unwrap();
    drop(mine);
    let start = Instant::now();
    wait_for_releases_since(mark);
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(1), "waited {waited:?}: held up by the older, gated release");
    // Its copy ran before its memory went: the data it read is whole.
    assert_eq!(back.as_slice().unwrap(), &host[..], "the copy out of the released buffer");
    gate.open();
    held.synchronize().unwrap();
    assert_eq!(pinned.as_slice().unwrap(), &host[..]);
}

/// Set in the child processes of the exit test: each drops queued work and exits at once.
const EXIT_CHILD: &str = "GP2P_TEST_EXIT_CHILD";

/// A process that drops buffers, pinned memory and streams with work still queued and exits
/// at once ends with status 0: the reclaimer thread, still releasing them while the process
/// exits and the driver tears itself down, must not fault.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_process_that_exits_right_after_dropping_queued_work_ends_cleanly() {
    const NAME: &str = "a_process_that_exits_right_after_dropping_queued_work_ends_cleanly";
    if std::env::var_os(EXIT_CHILD).is_some() {
        drop_queued_work_and_exit();
    }
    let _serial = gp2p_tests::serial();
    let [_device] = needs!(gpus: 1);
    let exe = std::env::current_exe().unwrap();
    for run in 0..12 {
        let out = std::process::Command::new(&exe)
            // --nocapture: the child's line must reach its stdout before it exits.
            .args(["--exact", NAME, "--include-ignored", "--test-threads=1", "--nocapture"])
            .env(EXIT_CHILD, "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "run {run}: the child ended with {}\n{stdout}\n{stderr}", out.status);
        assert!(stdout.contains("exiting after the drops"), "run {run}: the child did not get to its drops:\n{stdout}");
    }
}

/// The exit test's child: streams, device buffers and pinned blocks dropped behind copies
/// still running, then `exit` with the reclaimer's graves still full.
fn drop_queued_work_and_exit() -> ! {
    let device = Device::open(0).unwrap();
    let len = 1 << 20;
    for seed in 0..8 {
        let stream = Stream::new(&device).unwrap();
        let src = DeviceBuffer::from_host(&stream, &random::<u32>(len, seed)).unwrap();
        let mut pinned = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
        for _ in 0..4 {
            copy_to_host(&stream, &src.view(..), &mut pinned.view_mut(..)).unwrap();
        }
        drop((src, pinned, stream));
    }
    println!("exiting after the drops");
    std::process::exit(0);
}

/// A kind of resource the release tests drop: its name and how one is made (idle).
type Released = (&'static str, fn(&Device) -> Box<dyn std::any::Any>);

const DEVICE_MEMORY: Released = ("device memory", |d| Box::new(DeviceBuffer::<u32>::alloc(d, 1 << 20).unwrap()));
const PINNED_HOST_MEMORY: Released =
    ("pinned host memory", |d| Box::new(PinnedBuffer::<u32>::alloc(d, 1 << 20).unwrap()));
const A_STREAM: Released = ("a stream", |d| Box::new(Stream::new(d).unwrap()));

/// A drop hands its memory to the reclaimer and returns at once; the release must not then
/// make driver calls on other threads wait until every stream of the device is idle. Each
/// kind alone: made and left idle before another stream is held closed, dropped while it is,
/// then one driver call (an event record) timed on this thread.
fn releases_leave_other_threads_alone(device: &Device, kinds: &[Released]) {
    let (held, caller) = (Stream::new(device).unwrap(), Stream::new(device).unwrap());
    let limit = Duration::from_secs(1);
    let mut seen = Vec::new();
    for &(kind, make) in kinds {
        let dropped = make(device);
        let reserved = caller.reserve_point().unwrap();
        let gate = HostGate::close_until(&held, limit).unwrap();
        drop(dropped);
        std::thread::sleep(SETTLE); // the reclaimer takes the release up meanwhile
        let start = Instant::now();
        let point = caller.point_from(reserved).unwrap();
        let spent = start.elapsed();
        let expired = gate.expired();
        gate.open();
        point.synchronize().unwrap();
        held.synchronize().unwrap();
        println!("release of {kind} while a stream is held: the next driver call took {spent:?}");
        seen.push((kind, spent, expired));
    }
    let stalled: Vec<_> = seen.iter().filter(|(_, spent, expired)| *expired || *spent > limit / 10).collect();
    assert!(stalled.is_empty(), "driver calls waited for the held stream behind a release: {stalled:?}");
}
