//! GPU: pinned memory, `is_pinned`, stream fork/join ordering, and staging-ring reuse.

// No unsafe here: raw driver calls go through gp2p_cuda::raw and the safe APIs above it.
#![forbid(unsafe_code)]
// A failing test is how a test reports; unwrap/expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::cuda::reduce;
use geforce_p2p::pinned::{
    Error as PinnedError, FanOut, Fold, RingCache, copy_from_host, copy_to_host, is_pinned, round_trip,
};
use geforce_p2p::{DeviceBuffer, Event, EventKind, PinnedBuffer, ReduceOp, StagingRing, Stream, StreamFork};
use gp2p_tests::{POISON, check_reduce, fill_random, needs, with_stream};

#[test]
#[ignore = "needs a CUDA GPU"]
fn is_pinned_says_no_for_pageable_memory_and_leaves_no_sticky_error() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let pageable = vec![7u8; 1 << 20];
    assert!(!is_pinned(pageable.as_ptr(), pageable.len()).unwrap());
    assert!(!is_pinned(std::ptr::null(), 16).unwrap());
    assert!(is_pinned(std::ptr::null(), 0).unwrap(), "an empty range needs no pinning");

    let pinned = PinnedBuffer::<u8>::alloc(&device, 1 << 20).unwrap();
    assert!(is_pinned(pinned.host_ptr(), pinned.len()).unwrap());
    assert!(is_pinned(pinned.host_ptr().wrapping_add(4096), 1000).unwrap(), "a sub-range is pinned");
    assert!(
        !is_pinned(pinned.host_ptr(), pinned.len() + (64 << 20)).unwrap(),
        "a range running past the allocation is not"
    );

    // After the refusals, a launch and a copy still work.
    let mut dst = DeviceBuffer::from_host(&stream, &[1u32, 2, 3]).unwrap();
    let src = DeviceBuffer::from_host(&stream, &[10u32, 20, 30]).unwrap();
    reduce(&stream, &mut dst.view_mut(..), &src.view(..), ReduceOp::Sum, 1).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(dst.to_host_vec(&stream).unwrap(), [11, 22, 33]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_round_trip_is_exact_and_host_access_waits_for_the_dma() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let n = (1 << 24) + 5;
    let mut host = PinnedBuffer::<u64>::alloc(&device, n).unwrap();
    fill_random(host.as_mut_slice().unwrap(), 42);
    let expected = host.as_slice().unwrap().to_vec();
    let mut dev = DeviceBuffer::<u64>::alloc(&device, n).unwrap();
    copy_from_host(&stream, &host.view(..), &mut dev.view_mut(..)).unwrap();
    let mut back = PinnedBuffer::<u64>::alloc(&device, n).unwrap();
    copy_to_host(&stream, &dev.view(..), &mut back.view_mut(..)).unwrap();
    // No stream synchronisation: as_slice must wait for the DMA itself.
    assert!(back.as_slice().unwrap() == expected.as_slice());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dma_round_trip_lands_src_in_host_and_dst_and_refuses_other_lengths() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let n = 4099;
    let mut data = vec![0u32; n];
    fill_random(&mut data, 7);
    let src = DeviceBuffer::from_host(&stream, &data).unwrap();
    let mut host = PinnedBuffer::<u32>::alloc(&device, n).unwrap();
    let mut dst = DeviceBuffer::<u32>::alloc(&device, n).unwrap();
    dst.fill_bytes(&stream, 0xA5).unwrap();
    round_trip(&stream, &src.view(..), &mut host.view_mut(..), &mut dst.view_mut(..)).unwrap();
    assert!(host.as_slice().unwrap() == data.as_slice(), "the host leg");
    assert!(dst.to_host_vec(&stream).unwrap() == data, "the device leg");
    let err = round_trip(&stream, &src.view(..), &mut host.view_mut(..n - 1), &mut dst.view_mut(..)).unwrap_err();
    assert!(matches!(err, PinnedError::LengthMismatch { got: 4098, expected: 4099, .. }), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forked_streams_start_after_the_caller_and_rejoin_it() {
    let [(device, caller)] = needs!(gpus: 1).map(with_stream);
    let n = 1 << 26;
    let mut a_host = PinnedBuffer::<f32>::alloc(&device, n).unwrap();
    let mut b_host = PinnedBuffer::<f32>::alloc(&device, n).unwrap();
    fill_random(a_host.as_mut_slice().unwrap(), 1);
    fill_random(b_host.as_mut_slice().unwrap(), 2);
    let mut a = DeviceBuffer::<f32>::alloc(&device, n).unwrap();
    let mut b = DeviceBuffer::<f32>::alloc(&device, n).unwrap();
    copy_from_host(&caller, &a_host.view(..), &mut a.view_mut(..)).unwrap();
    copy_from_host(&caller, &b_host.view(..), &mut b.view_mut(..)).unwrap();
    // The caller's reduce must finish before the forked stream reads `a`...
    reduce(&caller, &mut a.view_mut(..), &b.view(..), ReduceOp::Sum, 1).unwrap();
    let fork = StreamFork::new(&device, 2).unwrap();
    let inner = fork.fork(&caller).unwrap();
    let mut out = PinnedBuffer::<f32>::alloc(&device, n).unwrap();
    copy_to_host(&inner[1], &a.view(..), &mut out.view_mut(..)).unwrap();
    fork.join(&caller).unwrap();
    // ...and the caller's later work sees what the forked streams did.
    let done = Event::new(&device, EventKind::Sync).unwrap();
    done.record(&caller).unwrap();
    done.synchronize().unwrap();
    let expected_a = a_host.as_slice().unwrap();
    check_reduce(out.as_slice().unwrap(), expected_a, b_host.as_slice().unwrap(), ReduceOp::Sum, 1).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn staging_ring_is_reused_across_back_to_back_calls_without_host_sync() {
    let [(device, caller)] = needs!(gpus: 1).map(with_stream);
    let slot_bytes = 64 << 10;
    let mut ring = StagingRing::new(&device, &device, 3, slot_bytes).unwrap();
    let slot_elems = ring.slot_bytes() / 4;
    let fork = StreamFork::new(&device, 2).unwrap();
    let calls = 40;
    let mut sources = Vec::new();
    let mut outputs = Vec::new();
    for call in 0..calls {
        // Lengths vary: part of a slot, exactly one, several with a short tail, more than slots.
        let len = [1, slot_elems - 1, slot_elems, 7 * slot_elems + 13][call % 4] + call;
        let mut host = vec![0u32; len];
        fill_random(&mut host, 1000 + call as u64);
        let src = DeviceBuffer::from_host(&caller, &host).unwrap();
        let mut dst = DeviceBuffer::<u32>::alloc(&device, len).unwrap();
        dst.fill_bytes(&caller, POISON).unwrap();
        sources.push((host, src));
        outputs.push(dst);
    }
    caller.synchronize().unwrap();
    // Every call: chunks through the ring, D2H on one stream and H2D on the other, no host
    // synchronisation anywhere between the calls.
    for ((_, src), dst) in sources.iter().zip(outputs.iter_mut()) {
        let streams = fork.fork(&caller).unwrap();
        let (up, down) = (&streams[0], &streams[1]);
        let len = src.len();
        let mut start = 0;
        while start < len {
            let end = (start + slot_elems).min(len);
            let slot = ring.next_slot();
            ring.fill(slot, up, &src.view(start..end)).unwrap();
            ring.drain(slot, down, &mut dst.view_mut(start..end)).unwrap();
            start = end;
        }
        fork.join(&caller).unwrap();
    }
    caller.synchronize().unwrap();
    for (call, ((host, _), dst)) in sources.iter().zip(&outputs).enumerate() {
        let got = dst.to_host_vec(&caller).unwrap();
        assert!(got == *host, "call {call} of {calls}: staged data differs");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn staging_ring_zero_copy_reduce_folds_every_chunk_once() {
    let [(device, caller)] = needs!(gpus: 1).map(with_stream);
    let mut ring = StagingRing::new(&device, &device, 2, 1 << 16).unwrap();
    let slot_elems = ring.slot_bytes() / 4;
    let fork = StreamFork::new(&device, 2).unwrap();
    let len = 5 * slot_elems + 3;
    let mut a = vec![0f32; len];
    let mut b = vec![0f32; len];
    fill_random(&mut a, 5);
    fill_random(&mut b, 6);
    let src = DeviceBuffer::from_host(&caller, &b).unwrap();
    let mut acc = DeviceBuffer::from_host(&caller, &a).unwrap();
    for _round in 0..2 {
        let streams = fork.fork(&caller).unwrap();
        let mut start = 0;
        while start < len {
            let end = (start + slot_elems).min(len);
            let slot = ring.next_slot();
            ring.fill(slot, &streams[0], &src.view(start..end)).unwrap();
            ring.drain_zero_copy(slot, &streams[1], &mut acc.view_mut(start..end), ReduceOp::Max, 1).unwrap();
            start = end;
        }
        fork.join(&caller).unwrap();
    }
    let got = acc.to_host_vec(&caller).unwrap();
    check_reduce(&got, &a, &b, ReduceOp::Max, 1).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn staging_ring_pass_folds_by_copy_zero_copy_and_scratch() {
    let [(device, caller)] = needs!(gpus: 1).map(with_stream);
    let mut ring = StagingRing::new(&device, &device, 3, 1 << 16).unwrap();
    let chunk = ring.slot_bytes() / 4;
    let fork = StreamFork::new(&device, 2).unwrap();
    let len = 7 * chunk + 5;
    let Landings { a, b, src, mut copied, mut summed, mut maxed, mut scratch } = Landings::new(&caller, len, chunk, 11);
    let streams = fork.fork(&caller).unwrap();
    let (up, down) = (&streams[0], &streams[1]);
    for start in (0..len).step_by(chunk) {
        let range = start..(start + chunk).min(len);
        let piece = src.view(range.clone());
        ring.pass(up, &piece, down, &mut copied.view_mut(range.clone()), Fold::Copy).unwrap();
        let zero_copy = Fold::ZeroCopy { op: ReduceOp::Sum, divide_by: 1 };
        ring.pass(up, &piece, down, &mut summed.view_mut(range.clone()), zero_copy).unwrap();
        let via_scratch = Fold::Scratch { scratch: scratch.view_mut(..), op: ReduceOp::Max, divide_by: 1 };
        ring.pass(up, &piece, down, &mut maxed.view_mut(range), via_scratch).unwrap();
    }
    // Refused before any work, by the pinned layer's own variants: lengths differ, and a
    // scratch shorter than the chunk.
    let err = ring.pass(up, &src.view(..10), down, &mut copied.view_mut(..11), Fold::Copy).unwrap_err();
    assert!(matches!(err, PinnedError::LengthMismatch { got: 10, expected: 11, .. }), "{err}");
    let short = Fold::Scratch { scratch: scratch.view_mut(..9), op: ReduceOp::Max, divide_by: 1 };
    let err = ring.pass(up, &src.view(..10), down, &mut maxed.view_mut(..10), short).unwrap_err();
    assert_eq!(err, PinnedError::ScratchTooShort { got: 9, needed: 10 });
    fork.join(&caller).unwrap();
    Landings::check(&caller, (&a, &b), [&copied, &summed, &maxed]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_fan_out_is_filled_once_and_landed_by_every_reader_by_copy_zero_copy_and_scratch() {
    let [(device, caller)] = needs!(gpus: 1).map(with_stream);
    // Four ranks on one device: rank 0 writes, ranks 1-3 read, through two slots, so every
    // fill after the second waits for three readers of the chunk before.
    let readers = vec![device.clone(); 4];
    let mut fan = FanOut::new(&device, &readers, 2, 1 << 16).unwrap();
    let chunk = fan.slot_bytes() / 4;
    let len = 9 * chunk + 7;
    let Landings { a, b, src, mut copied, mut summed, mut maxed, mut scratch } = Landings::new(&caller, len, chunk, 21);
    let writer = StreamFork::new(&device, 1).unwrap();
    let landers = StreamFork::new(&device, 3).unwrap();
    let up = &writer.fork(&caller).unwrap()[0];
    let down = landers.fork(&caller).unwrap();
    for (i, start) in (0..len).step_by(chunk).enumerate() {
        let range = start..(start + chunk).min(len);
        let slot = i % fan.slots();
        fan.fill(slot, up, &src.view(range.clone())).unwrap();
        fan.land(slot, 1, &down[0], &mut copied.view_mut(range.clone()), Fold::Copy).unwrap();
        let zero_copy = Fold::ZeroCopy { op: ReduceOp::Sum, divide_by: 1 };
        fan.land(slot, 2, &down[1], &mut summed.view_mut(range.clone()), zero_copy).unwrap();
        let via_scratch = Fold::Scratch { scratch: scratch.view_mut(..), op: ReduceOp::Max, divide_by: 1 };
        fan.land(slot, 3, &down[2], &mut maxed.view_mut(range), via_scratch).unwrap();
    }
    // Refused before any work: more than the last fill put in the slot (the tail chunk of 7
    // elements went through slot 1), a chunk larger than a slot, a slot past the end, a
    // reader out of range, and a slot never filled.
    let err = fan.land(1, 1, &down[0], &mut copied.view_mut(..8), Fold::Copy).unwrap_err();
    assert_eq!(err, PinnedError::ReceiveSize { got: 32, sent: 28 });
    let mut fresh = FanOut::new(&device, &readers, 2, 1 << 16).unwrap();
    let err = fresh.fill(0, up, &src.view(..chunk + 1)).unwrap_err();
    assert!(matches!(err, PinnedError::ChunkTooLarge { .. }), "{err}");
    let err = fresh.fill(2, up, &src.view(..1)).unwrap_err();
    assert!(matches!(err, PinnedError::NoSuchSlot { slot: 2, slots: 2 }), "{err}");
    let err = fresh.land(0, 4, &down[0], &mut copied.view_mut(..1), Fold::Copy).unwrap_err();
    assert!(err.to_string().contains("reader 4"), "{err}");
    let err = fresh.land(1, 1, &down[0], &mut copied.view_mut(..1), Fold::Copy).unwrap_err();
    assert_eq!(err, PinnedError::SlotEmpty { slot: 1 });
    writer.join(&caller).unwrap();
    landers.join(&caller).unwrap();
    Landings::check(&caller, (&a, &b), [&copied, &summed, &maxed]);
}

/// What the fold tests land and check: `b` (random, seed + 1) sent from `src` onto
/// `copied` (poisoned first) by copy, onto `summed` (holding `a`, random, seed) by a zero-copy
/// sum and onto `maxed` (holding `a`) by a max through a scratch of one chunk.
struct Landings {
    a: Vec<f32>,
    b: Vec<f32>,
    src: DeviceBuffer<f32>,
    copied: DeviceBuffer<f32>,
    summed: DeviceBuffer<f32>,
    maxed: DeviceBuffer<f32>,
    scratch: DeviceBuffer<f32>,
}

impl Landings {
    fn new(caller: &Stream, len: usize, chunk: usize, seed: u64) -> Landings {
        let device = caller.device();
        let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
        fill_random(&mut a, seed);
        fill_random(&mut b, seed + 1);
        let src = DeviceBuffer::from_host(caller, &b).unwrap();
        let mut copied = DeviceBuffer::<f32>::alloc(device, len).unwrap();
        copied.fill_bytes(caller, POISON).unwrap();
        let summed = DeviceBuffer::from_host(caller, &a).unwrap();
        let maxed = DeviceBuffer::from_host(caller, &a).unwrap();
        let scratch = DeviceBuffer::<f32>::alloc(device, chunk).unwrap();
        Landings { a, b, src, copied, summed, maxed, scratch }
    }

    /// `copied` is `b`; `summed` and `maxed` are `a` summed and maxed with `b`, element by
    /// element against the CPU.
    fn check(caller: &Stream, (a, b): (&[f32], &[f32]), [copied, summed, maxed]: [&DeviceBuffer<f32>; 3]) {
        assert!(copied.to_host_vec(caller).unwrap() == b, "Fold::Copy");
        check_reduce(&summed.to_host_vec(caller).unwrap(), a, b, ReduceOp::Sum, 1).unwrap();
        check_reduce(&maxed.to_host_vec(caller).unwrap(), a, b, ReduceOp::Max, 1).unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ring_cache_keeps_a_ring_per_slot_count_across_alternating_calls() {
    // Collectives pick 2 slots for large chunks across devices and 4 otherwise: a cache of
    // one ring replaced it (a pinned allocation and a free) at every alternation.
    let [device] = needs!(gpus: 1);
    let mut cache = RingCache::new();
    let small = cache.ensure(&device, &device, 4, 1 << 20).unwrap().id();
    let large = cache.ensure(&device, &device, 2, 4 << 20).unwrap().id();
    assert_ne!(small, large);
    for _ in 0..3 {
        assert_eq!(cache.ensure(&device, &device, 4, 1 << 20).unwrap().id(), small, "the 4-slot ring is kept");
        assert_eq!(cache.ensure(&device, &device, 2, 4 << 20).unwrap().id(), large, "the 2-slot ring is kept");
    }
    // Smaller slots than held reuse the ring; bigger ones replace only that count's ring.
    assert_eq!(cache.ensure(&device, &device, 4, 4096).unwrap().id(), small);
    let bigger = cache.ensure(&device, &device, 4, 2 << 20).unwrap();
    assert!(bigger.id() != small && bigger.slot_bytes() >= 2 << 20);
    assert_eq!(cache.ensure(&device, &device, 2, 4 << 20).unwrap().id(), large);
}
