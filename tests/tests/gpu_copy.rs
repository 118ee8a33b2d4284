//! GPU: the staged copy on one card (route Staged), its stream semantics and refusals, and
//! the host copies.

// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The interop entry points (raw streams, raw views, raw host pointers) are unsafe fns.
#![allow(unsafe_code)]

use geforce_p2p::ops::{copy_from_host_raw, copy_to_host_raw, reduce, staged_copy};
use geforce_p2p::pinned;
use geforce_p2p::{CopyOptions, Device, DeviceBuffer, PinnedBuffer, ReduceOp, Route, Stream, copy_into, transport};
use gp2p_tests::{POISON, Reference, check_reduce, fill_random, needs, random, with_stream};

const CHUNK: usize = 64 << 10;
const SLOTS: usize = 3;

#[test]
#[ignore = "needs a CUDA GPU"]
fn staged_copy_moves_every_size_exactly() {
    let [(_, stream)] = needs!(gpus: 1).map(with_stream);
    // One byte, around one chunk, several chunks with an odd tail (more chunks than slots).
    let one = DeviceBuffer::from_host(&stream, &[0x5Au8]).unwrap();
    let mut one_out = DeviceBuffer::from_host(&stream, &[0u8]).unwrap();
    staged_copy(&one.view(..), &stream, &mut one_out.view_mut(..), &stream, Some(CHUNK), Some(SLOTS)).unwrap();
    assert_eq!(one_out.to_host_vec(&stream).unwrap(), [0x5A]);
    let per_chunk = CHUNK / 4;
    for (i, len) in [per_chunk - 1, per_chunk, per_chunk + 1, 7 * per_chunk + 13].into_iter().enumerate() {
        let host = random::<u32>(len, 10 + i as u64);
        let src = DeviceBuffer::from_host(&stream, &host).unwrap();
        let mut dst = DeviceBuffer::<u32>::alloc(src.device(), len + 1).unwrap();
        dst.fill_bytes(&stream, POISON).unwrap();
        staged_copy(&src.view(..), &stream, &mut dst.view_mut(..len), &stream, Some(CHUNK), Some(SLOTS)).unwrap();
        let got = dst.to_host_vec(&stream).unwrap();
        assert!(got[..len] == host[..], "len {len}: data differs");
        assert_eq!(got[len], u32::from_byte(POISON), "len {len}: wrote past the end");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn staged_copy_of_one_gib_with_default_chunking() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let len = 1 << 28; // u32: 1 GiB
    let mut host = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    fill_random(host.as_mut_slice().unwrap(), 77);
    let mut src = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    pinned::copy_from_host(&stream, &host.view(..), &mut src.view_mut(..)).unwrap();
    let mut dst = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    dst.fill_bytes(&stream, POISON).unwrap();
    staged_copy(&src.view(..), &stream, &mut dst.view_mut(..), &stream, None, None).unwrap();
    let mut out = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    pinned::copy_to_host(&stream, &dst.view(..), &mut out.view_mut(..)).unwrap();
    assert!(out.as_slice().unwrap() == host.as_slice().unwrap(), "1 GiB staged copy differs");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_hundred_back_to_back_copies_without_host_sync() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let copies = 200;
    let mut cases = Vec::new();
    for i in 0..copies {
        // Sizes from one element to several chunks, so slots are reused across calls.
        let len = [1, 1000, CHUNK / 4 + 3, 5 * CHUNK / 4 + 7][i % 4] + i;
        let host = random::<u32>(len, 5000 + i as u64);
        let src = DeviceBuffer::from_host(&stream, &host).unwrap();
        let mut dst = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
        dst.fill_bytes(&stream, POISON).unwrap();
        cases.push((host, src, dst));
    }
    stream.synchronize().unwrap();
    for (_, src, dst) in &mut cases {
        staged_copy(&src.view(..), &stream, &mut dst.view_mut(..), &stream, Some(CHUNK), Some(SLOTS)).unwrap();
    }
    for (i, (host, _, dst)) in cases.iter().enumerate() {
        assert!(dst.to_host_vec(&stream).unwrap() == *host, "copy {i} of {copies} differs");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copy_is_ordered_between_user_kernels_on_two_streams() {
    let [(device, src_stream)] = needs!(gpus: 1).map(with_stream);
    let dst_stream = Stream::new(&device).unwrap();
    // Keeps a stream busy for a while (a few ms of reduce kernels), so work queued behind it
    // is still pending when the copy is enqueued.
    let big = 1 << 26;
    let ballast = DeviceBuffer::<u32>::alloc(&device, big).unwrap();
    let keep_busy = |stream: &Stream| {
        let mut target = DeviceBuffer::<u32>::alloc(&device, big).unwrap();
        for _ in 0..4 {
            reduce(stream, &mut target.view_mut(..), &ballast.view(..), ReduceOp::Sum, 1).unwrap();
        }
        target // freed by the caller after the copy, so its kernels stay queued meanwhile
    };
    // Staged: one chunk (the one-card single-chunk path) and several chunks (the pipeline);
    // Auto (one device-to-device DMA on one card). Each with both streams idle when the
    // copy is enqueued, and with both still running earlier work.
    let long = 3 * CHUNK / 4 * 5 + 11;
    let cases = [(Route::Staged, 1000), (Route::Staged, long), (Route::Auto, long)]
        .into_iter()
        .flat_map(|(route, len)| [(route, len, false), (route, len, true)]);
    for (case, (route, len, busy)) in cases.enumerate() {
        let seed = 10 * case as u64;
        let (a, s0, b) = (random::<u32>(len, seed + 1), random::<u32>(len, seed + 2), random::<u32>(len, seed + 3));
        let mut src = DeviceBuffer::from_host(&src_stream, &s0).unwrap();
        let add = DeviceBuffer::from_host(&src_stream, &a).unwrap();
        let mut acc = DeviceBuffer::from_host(&dst_stream, &b).unwrap();
        let mut mid = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
        src_stream.synchronize().unwrap();
        dst_stream.synchronize().unwrap();
        // The copy must land after this fill, and read src after the kernel below writes
        // it: with `busy`, both wait behind ballast on their streams.
        let ballasts = busy.then(|| (keep_busy(&dst_stream), keep_busy(&src_stream)));
        mid.fill_bytes(&dst_stream, 0x77).unwrap();
        if !busy {
            dst_stream.synchronize().unwrap();
        }
        // A kernel writes src on src_stream; the copy must start after it; a kernel on
        // dst_stream reads the copy's output; no host synchronisation in between.
        reduce(&src_stream, &mut src.view_mut(..), &add.view(..), ReduceOp::Sum, 1).unwrap();
        let options = CopyOptions { route, chunk_bytes: Some(CHUNK), slots: Some(SLOTS) };
        let taken = transport().copy(&src.view(..), &src_stream, &mut mid.view_mut(..), &dst_stream, options).unwrap();
        assert_eq!(taken, if route == Route::Auto { Route::Peer } else { route });
        reduce(&dst_stream, &mut acc.view_mut(..), &mid.view(..), ReduceOp::Sum, 1).unwrap();
        let got = acc.to_host_vec(&dst_stream).unwrap();
        let copied: Vec<u32> = s0.iter().zip(&a).map(|(x, y)| x.wrapping_add(*y)).collect();
        check_reduce(&got, &b, &copied, ReduceOp::Sum, 1)
            .unwrap_or_else(|e| panic!("{route} len {len}, streams busy: {busy}: {e}"));
        // The source stream's later work also sees the copy done: overwrite src right away.
        src.fill_bytes(&src_stream, 0).unwrap();
        assert!(mid.to_host_vec(&src_stream).unwrap() == copied, "{route} len {len}, busy {busy}: src stream");
        drop(ballasts);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn auto_route_on_one_card_is_a_device_copy_and_borrowed_streams_work() {
    let [(device, owner)] = needs!(gpus: 1).map(with_stream);
    // SAFETY: `owner` outlives `borrowed` and belongs to `device`.
    let borrowed = unsafe { Stream::borrow_raw(&device, owner.raw()) };
    let host = random::<u32>(100_000, 9);
    let src = DeviceBuffer::from_host(&owner, &host).unwrap();
    let mut dst = DeviceBuffer::<u32>::alloc(&device, host.len()).unwrap();
    let route = copy_into(&src.view(..), &borrowed, &mut dst.view_mut(..), &borrowed).unwrap();
    assert_eq!(route, Route::Peer);
    drop(borrowed); // must not destroy the owner's stream
    assert!(dst.to_host_vec(&owner).unwrap() == host);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_copies_are_refused_before_any_work() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let src = DeviceBuffer::from_host(&stream, &[1u32; 64]).unwrap();
    let mut short = DeviceBuffer::from_host(&stream, &[7u32; 63]).unwrap();
    let err = copy_into(&src.view(..), &stream, &mut short.view_mut(..), &stream).unwrap_err();
    assert!(err.to_string().contains("src has 64 elements, but dst has 63"), "{err}");
    let mut both = DeviceBuffer::from_host(&stream, &[3u32; 128]).unwrap();
    let head = both.view(0..64).raw_ptr();
    // SAFETY: 64 elements from element 4 lie inside `both` (128 elements), which outlives the view.
    let overlapping = unsafe { geforce_p2p::DeviceView::<u32>::from_raw(&device, head + 16, 64) };
    let err = transport()
        .copy(&overlapping, &stream, &mut both.view_mut(0..64), &stream, CopyOptions::default())
        .unwrap_err();
    assert!(matches!(err, geforce_p2p::transport::Error::Overlap { .. }), "{err}");
    let bad = CopyOptions { route: Route::Staged, chunk_bytes: Some(0), slots: None };
    assert!(transport().copy(&src.view(..), &stream, &mut short.view_mut(..), &stream, bad).is_err());
    assert!(Device::open(64).is_err_and(|e| e.to_string().contains("does not exist")));
    assert_eq!(short.to_host_vec(&stream).unwrap(), [7; 63], "nothing written");
    assert_eq!(both.to_host_vec(&stream).unwrap(), [3; 128], "nothing written");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn host_copies_round_trip_and_unpinned_memory_is_refused() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let len = (1 << 22) + 3;
    let mut pinned_in = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    fill_random(pinned_in.as_mut_slice().unwrap(), 31);
    let mut pinned_out = PinnedBuffer::<u32>::alloc(&device, len).unwrap();
    let mut dev = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    // Unpinned memory: refused, and nothing is left broken.
    let mut pageable = vec![0u32; len];
    // SAFETY: the vector outlives the (refused) call.
    let err = unsafe { copy_from_host_raw(&stream, pageable.as_ptr(), len, &mut dev.view_mut(..)) }.unwrap_err();
    assert!(err.to_string().contains("not pinned"), "{err}");
    // SAFETY: as above.
    let err = unsafe { copy_to_host_raw(&stream, &dev.view(..), pageable.as_mut_ptr(), len) }.unwrap_err();
    assert!(err.to_string().contains("pin"), "{err}");
    // SAFETY: both pinned buffers outlive the copies, which are synchronised below.
    unsafe {
        copy_from_host_raw(&stream, pinned_in.host_ptr(), len, &mut dev.view_mut(..)).unwrap();
        let out_ptr = pinned_out.view_mut(..).host_mut_ptr();
        copy_to_host_raw(&stream, &dev.view(..), out_ptr, len).unwrap();
    }
    stream.synchronize().unwrap();
    assert!(pinned_out.as_slice().unwrap() == pinned_in.as_slice().unwrap());
    // And a staged copy still works after the refusals.
    let mut copy = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
    staged_copy(&dev.view(..), &stream, &mut copy.view_mut(..), &stream, None, None).unwrap();
    assert!(copy.to_host_vec(&stream).unwrap() == pinned_in.as_slice().unwrap());
}
