//! GPU: the compressed all-reduce's codec kernels (`kernels/compress.cu`) give the bits of the
//! CPU reference (`gp2p_kernels::compress`): N = 2..8 logical ranks on one GPU run the scheme
//! step by step (each rank encodes the other ranks' shards, each owner folds its shard's
//! contributions and encodes the fold, every rank decodes every shard), for f32, f16 and bf16,
//! int8 and fp8, blocks of 32 and 256, on data sets with outliers, zeros, tiny values, NaN
//! and infinities; every rank's result equals the reference's, bit for bit (NaN as NaN), and
//! an encoded wire equals the reference's bytes (wires in device memory there), and a copy of
//! one into pinned memory writes its words, codes and exact blocks and nothing else (and back).
//! The one-shot too: every rank encodes its whole buffer and folds every wire into its
//! output (`fold_decode`), `all_reduce_one_shot`'s bits on every rank.
//! Then the engine's compressed all-reduce (`gp2p_collectives::all_reduce_compressed`, wires
//! in pinned host memory, rounds pipelined across streams) among 2..8 logical ranks: every rank's
//! result equals the reference's bits, on short buffers and on long ones of several rounds,
//! twice in a row (the second call reuses the first's wires).

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use geforce_p2p::cuda::codec::{WireFormat, decode, encode, fold_decode, fold_encode};
use geforce_p2p::kernels::compress::{
    BlockSize, Compressible, Format, Scheme, WireLayout, all_reduce, all_reduce_one_shot, decode_wire, encode_wire,
    shard_blocks,
};
use geforce_p2p::pinned::{copy_from_host, copy_wire_from_host, copy_wire_to_host};
use geforce_p2p::{DeviceBuffer, DeviceView, PinnedBuffer, ReduceOp, Stream, half};
use gp2p_collectives::{Engine, Rank, all_reduce_compressed};
use gp2p_tests::{SplitMix64, max_len, needs, with_stream};

/// Values per rank: several blocks of every size, a short last block.
const LEN: usize = 3 * 256 + 77;

/// One data set: rank r's f32 values before conversion to the input type.
fn data(set: usize, rank: usize, len: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(0xC0DEC + (set as u64) * 131 + rank as u64);
    (0..len)
        .map(|i| {
            let x = rng.next_f64_signed() as f32;
            match set {
                // Plain random values.
                0 => x * 3.0,
                // An outlier every 32 values, 1e4 times the rest.
                1 => {
                    if i % 32 == 5 {
                        x * 1e4
                    } else {
                        x
                    }
                }
                // Zeros, with a tiny block (below 2^-100) and a block of f32 subnormals.
                2 => match i / 32 {
                    0 | 3 => 0.0,
                    1 => x * 1e-32,
                    2 => x * 1e-39,
                    _ => x,
                },
                // A NaN in one block, +inf and -inf in others (on some ranks), the rest random.
                _ => match (i, rank % 3) {
                    (40, 0) => f32::NAN,
                    (300, 1) => f32::INFINITY,
                    (300, 2) | (301, 0) => f32::NEG_INFINITY,
                    _ => x * 100.0,
                },
            }
        })
        .collect()
}

/// Equal bits, or both NaN.
fn same<T: Compressible>(a: T, b: T) -> bool {
    let (x, y) = (a.to_f32(), b.to_f32());
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

fn case<T: Compressible + geforce_p2p::Element>(
    stream: &Stream,
    scheme: Scheme,
    ranks: usize,
    set: usize,
    op: ReduceOp,
) {
    let what = format!("{} {} block {} N {ranks} set {set} {op}", T::DTYPE, scheme.format, scheme.block.get());
    let inputs: Vec<Vec<T>> = (0..ranks).map(|r| data(set, r, LEN).into_iter().map(T::from_f32).collect()).collect();
    let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let want = all_reduce(&refs, op, scheme).unwrap();
    let format = WireFormat { format: scheme.format, block: scheme.block };
    let device = stream.device();
    let on_gpu: Vec<DeviceBuffer<T>> = inputs.iter().map(|v| DeviceBuffer::from_host(stream, v).unwrap()).collect();
    let size = scheme.block.get();
    let blocks = LEN.div_ceil(size);
    let values = |k: usize| {
        let b = shard_blocks(blocks, ranks, k);
        (b.start * size).min(LEN)..(b.end * size).min(LEN)
    };
    // A wire's room, rounded to 16 bytes so the next one starts aligned.
    let room = |len: usize| format.wire_bytes(len).next_multiple_of(16).max(16);
    let total: usize = (0..ranks).map(|k| room(values(k).len()) * (ranks + 1)).sum();
    let mut wires = DeviceBuffer::<u8>::alloc(device, total).unwrap();
    let mut outputs: Vec<DeviceBuffer<T>> = (0..ranks).map(|_| DeviceBuffer::alloc(device, LEN).unwrap()).collect();
    let mut offset = 0;
    for k in 0..ranks {
        let range = values(k);
        let n = range.len();
        let at: Vec<usize> = (0..=ranks).map(|j| offset + j * room(n)).collect();
        offset += (ranks + 1) * room(n);
        // Up: every rank but the owner encodes its part of shard k into wire r; then the
        // owner folds them, with its own values, into wire `ranks`.
        for r in (0..ranks).filter(|&r| r != k) {
            let src = on_gpu[r].view(range.clone());
            encode(stream, format, &src, &mut wires.view_mut(at[r]..at[r] + room(n))).unwrap();
        }
        let (ups, mut folded) = wires.view_mut(..).split_at_mut(at[ranks]);
        let ups = ups.as_view();
        let views: Vec<Option<DeviceView<'_, u8>>> =
            (0..ranks).map(|r| (r != k).then(|| ups.slice(at[r]..at[r] + room(n)))).collect();
        let refs: Vec<Option<&DeviceView<'_, u8>>> = views.iter().map(Option::as_ref).collect();
        let own = on_gpu[k].view(range.clone());
        let mut out = folded.slice_mut(..room(n));
        fold_encode(stream, format, &own, &refs, k, op == ReduceOp::Avg, &mut out).unwrap();
        // Down: every rank decodes the folded shard into its output.
        for out in &mut outputs {
            let wire = wires.view(at[ranks]..at[ranks] + room(n));
            decode(stream, format, &wire, &mut out.view_mut(range.clone())).unwrap();
        }
    }
    for (rank, out) in outputs.iter().enumerate() {
        let got = out.to_host_vec(stream).unwrap();
        let wrong = (0..LEN).filter(|&i| !same(got[i], want[rank][i])).count();
        let first = (0..LEN).find(|&i| !same(got[i], want[rank][i]));
        assert_eq!(
            wrong,
            0,
            "{what}: rank {rank} differs from the reference at {wrong} values, first {first:?}: {:?} vs {:?}",
            first.map(|i| got[i].to_f32()),
            first.map(|i| want[rank][i].to_f32())
        );
    }
}

/// The one-shot step by step: every rank encodes its whole buffer, and every rank folds all
/// the wires into its output (`fold_decode`); each rank's result against
/// `all_reduce_one_shot`'s bits.
fn one_shot_case<T: Compressible + geforce_p2p::Element>(
    stream: &Stream,
    scheme: Scheme,
    ranks: usize,
    set: usize,
    op: ReduceOp,
) {
    let what = format!("one-shot {} {} block {} N {ranks} set {set} {op}", T::DTYPE, scheme.format, scheme.block.get());
    let inputs: Vec<Vec<T>> = (0..ranks).map(|r| data(set, r, LEN).into_iter().map(T::from_f32).collect()).collect();
    let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let want = all_reduce_one_shot(&refs, op, scheme).unwrap();
    let format = WireFormat { format: scheme.format, block: scheme.block };
    let room = format.wire_bytes(LEN).next_multiple_of(16);
    let mut wires = DeviceBuffer::<u8>::alloc(stream.device(), room * ranks).unwrap();
    for (r, input) in inputs.iter().enumerate() {
        let src = DeviceBuffer::from_host(stream, input).unwrap();
        encode(stream, format, &src.view(..), &mut wires.view_mut(r * room..(r + 1) * room)).unwrap();
    }
    for rank in 0..ranks {
        // In place, as the communicator folds: the output starts as the rank's input.
        let mut out = DeviceBuffer::from_host(stream, &inputs[rank]).unwrap();
        let views: Vec<DeviceView<'_, u8>> = (0..ranks).map(|r| wires.view(r * room..(r + 1) * room)).collect();
        let refs: Vec<&DeviceView<'_, u8>> = views.iter().collect();
        fold_decode(stream, format, &refs, op == ReduceOp::Avg, &mut out.view_mut(..)).unwrap();
        let got = out.to_host_vec(stream).unwrap();
        let wrong = (0..LEN).filter(|&i| !same(got[i], want[rank][i])).count();
        let first = (0..LEN).find(|&i| !same(got[i], want[rank][i]));
        assert_eq!(wrong, 0, "{what}: rank {rank} differs from the reference at {wrong} values, first {first:?}");
    }
}

fn every_case<T: Compressible + geforce_p2p::Element>(stream: &Stream) {
    for format in Format::ALL {
        for block in [32, 256] {
            let scheme = Scheme { format, block: BlockSize::new(block).unwrap() };
            for ranks in 2..=8 {
                for set in 0..4 {
                    let op = if (ranks + set) % 2 == 0 { ReduceOp::Sum } else { ReduceOp::Avg };
                    case::<T>(stream, scheme, ranks, set, op);
                    one_shot_case::<T>(stream, scheme, ranks, set, op);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_codec_gives_the_reference_bits_for_f32() {
    let [(_, stream)] = needs!(gpus: 1).map(with_stream);
    every_case::<f32>(&stream);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_codec_gives_the_reference_bits_for_f16_and_bf16() {
    let [(_, stream)] = needs!(gpus: 1).map(with_stream);
    every_case::<half::f16>(&stream);
    every_case::<half::bf16>(&stream);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_encoded_wire_is_the_reference_s_bytes() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    for format in Format::ALL {
        for set in 0..4 {
            let block = BlockSize::new(64).unwrap();
            let values = data(set, 0, LEN);
            let want = encode_wire(format, block, &values);
            let src = DeviceBuffer::from_host(&stream, &values).unwrap();
            let layout = WireLayout { values: LEN, block };
            let mut wire = DeviceBuffer::<u8>::alloc(&device, layout.bytes()).unwrap();
            let zeros = PinnedBuffer::<u8>::alloc(&device, layout.bytes()).unwrap();
            copy_from_host(&stream, &zeros.view(..), &mut wire.view_mut(..)).unwrap();
            encode(&stream, WireFormat { format, block }, &src.view(..), &mut wire.view_mut(..)).unwrap();
            let got = wire.to_host_vec(&stream).unwrap();
            // Compared as text: exact blocks may hold NaN, which is never equal to itself.
            assert_eq!(
                format!("{:?}", decode_wire(format, block, LEN, &got)),
                format!("{:?}", decode_wire(format, block, LEN, &want)),
                "{format} set {set}: blocks"
            );
            assert_eq!(got, want, "{format} set {set}: every byte, untouched ones zero");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_wire_copied_to_host_memory_carries_its_words_codes_and_exact_blocks_only() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    const UNTOUCHED: u8 = 0xAB;
    for format in Format::ALL {
        // Sets 2 and 3 have blocks that travel exact (tiny, subnormal, NaN, infinities).
        for set in 0..4 {
            let block = BlockSize::new(32).unwrap();
            let values = data(set, 1, LEN);
            let want = encode_wire(format, block, &values);
            let layout = WireLayout { values: LEN, block };
            let src = DeviceBuffer::from_host(&stream, &values).unwrap();
            let mut wire = DeviceBuffer::<u8>::zeroed(&device, layout.bytes()).unwrap();
            let wire_format = WireFormat { format, block };
            encode(&stream, wire_format, &src.view(..), &mut wire.view_mut(..)).unwrap();
            let mut host = PinnedBuffer::<u8>::alloc(&device, layout.bytes()).unwrap();
            host.as_mut_slice().unwrap().fill(UNTOUCHED);
            copy_wire_to_host(&stream, wire_format, LEN, &wire.view(..), &mut host.view_mut(..)).unwrap();
            let got = host.as_slice().unwrap();
            let dense = layout.exact_offset();
            assert_eq!(got[..dense], want[..dense], "{format} set {set}: words and codes");
            let mut exact_blocks = 0;
            for b in 0..layout.blocks() {
                let word = u32::from_ne_bytes(want[4 * b..4 * b + 4].try_into().unwrap());
                let values = b * 32..((b + 1) * 32).min(LEN);
                let bytes = dense + 4 * values.start..dense + 4 * values.end;
                if word == geforce_p2p::kernels::compress::EXACT_WORD {
                    exact_blocks += 1;
                    assert_eq!(got[bytes.clone()], want[bytes], "{format} set {set}: exact block {b}");
                } else {
                    assert!(got[bytes].iter().all(|&x| x == UNTOUCHED), "{format} set {set}: block {b} is scaled");
                }
            }
            assert_eq!(exact_blocks > 0, set >= 2, "{format} set {set}: the data sets' exact blocks");
            // And back: the same bytes that matter land in device memory, decoding as the original.
            let mut back = DeviceBuffer::<u8>::zeroed(&device, layout.bytes()).unwrap();
            copy_wire_from_host(&stream, wire_format, LEN, &host.view(..), &mut back.view_mut(..)).unwrap();
            let landed = back.to_host_vec(&stream).unwrap();
            assert_eq!(
                format!("{:?}", decode_wire(format, block, LEN, &landed)),
                format!("{:?}", decode_wire(format, block, LEN, &want)),
                "{format} set {set}: the wire back from host memory"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_codec_arguments_are_refused() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let format = WireFormat { format: Format::Int8, block: BlockSize::new(32).unwrap() };
    let src = DeviceBuffer::from_host(&stream, &[1.0f32; 100]).unwrap();
    let mut small = DeviceBuffer::<u8>::alloc(&device, format.wire_bytes(100) - 1).unwrap();
    let e = encode(&stream, format, &src.view(..), &mut small.view_mut(..)).unwrap_err();
    assert!(e.to_string().contains("wire"), "{e}");
    let ints = DeviceBuffer::from_host(&stream, &[1i32; 100]).unwrap();
    let mut wire = DeviceBuffer::<u8>::alloc(&device, format.wire_bytes(100)).unwrap();
    let e = encode(&stream, format, &ints.view(..), &mut wire.view_mut(..)).unwrap_err();
    assert!(e.to_string().contains("f32, f16 or bf16"), "{e}");
    let e = fold_encode(&stream, format, &src.view(..), &[None, None], 0, false, &mut wire.view_mut(..)).unwrap_err();
    assert!(e.to_string().contains("rank 1's wire is missing"), "{e}");
}

/// The engine's compressed all-reduce among `ranks` logical ranks (one stream each on this
/// GPU) against the reference, bit for bit on every rank, called twice on fresh data so the
/// second call reuses the first's wire areas.
fn engine_case<T: Compressible + geforce_p2p::Element>(
    engine: &Engine,
    streams: &[Stream],
    scheme: Scheme,
    len: usize,
    set: usize,
    op: ReduceOp,
) {
    let ranks = streams.len();
    let format = WireFormat { format: scheme.format, block: scheme.block };
    for call in 0..2 {
        let what = format!(
            "{} {} block {} N {ranks} len {len} set {set} {op} call {call}",
            T::DTYPE,
            scheme.format,
            scheme.block.get()
        );
        let inputs: Vec<Vec<T>> =
            (0..ranks).map(|r| data(set, r + 10 * call, len).into_iter().map(T::from_f32).collect()).collect();
        let refs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
        let want = all_reduce(&refs, op, scheme).unwrap();
        let mut buffers: Vec<DeviceBuffer<T>> =
            inputs.iter().zip(streams).map(|(v, s)| DeviceBuffer::from_host(s, v).unwrap()).collect();
        let mut ranks_of: Vec<Rank<'_, T>> =
            buffers.iter_mut().zip(streams).map(|(b, s)| Rank { buffer: b.view_mut(..), stream: s }).collect();
        all_reduce_compressed(engine, &mut ranks_of, op, format).unwrap();
        drop(ranks_of);
        for (rank, (out, stream)) in buffers.iter().zip(streams).enumerate() {
            let got = out.to_host_vec(stream).unwrap();
            let wrong = (0..len).filter(|&i| !same(got[i], want[rank][i])).count();
            let first = (0..len).find(|&i| !same(got[i], want[rank][i]));
            assert_eq!(
                wrong,
                0,
                "{what}: rank {rank} differs from the reference at {wrong} values, first {first:?}: {:?} vs {:?}",
                first.map(|i| got[i].to_f32()),
                first.map(|i| want[rank][i].to_f32())
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_engine_s_compressed_all_reduce_gives_the_reference_bits_on_every_rank() {
    let [(device, _)] = needs!(gpus: 1).map(with_stream);
    let engine = Engine::new();
    for ranks in 2..=8 {
        let streams: Vec<Stream> = (0..ranks).map(|_| Stream::new(&device).unwrap()).collect();
        for format in Format::ALL {
            for (block, set) in [(32, 0), (256, 1), (64, 2), (128, 3)] {
                let scheme = Scheme { format, block: BlockSize::new(block).unwrap() };
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    engine_case::<f32>(&engine, &streams, scheme, LEN, set, op);
                    engine_case::<half::bf16>(&engine, &streams, scheme, LEN, set, op);
                }
                engine_case::<half::f16>(&engine, &streams, scheme, LEN, set, ReduceOp::Sum);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_engine_s_compressed_all_reduce_runs_many_rounds_of_a_long_buffer() {
    let [(device, _)] = needs!(gpus: 1).map(with_stream);
    let engine = Engine::new();
    // Pieces of a million values: three rounds at two ranks, shards of several pieces (one
    // round under the sanitizers' GP2P_TEST_MAX_LEN: under racecheck, at full length, the
    // process was killed, exit status 9, with no hazard reported).
    let len = 5_000_003.min(max_len());
    for ranks in [2, 3, 8] {
        let streams: Vec<Stream> = (0..ranks).map(|_| Stream::new(&device).unwrap()).collect();
        let scheme = Scheme { format: Format::Int8, block: BlockSize::new(128).unwrap() };
        engine_case::<half::bf16>(&engine, &streams, scheme, len, 0, ReduceOp::Sum);
        let scheme = Scheme { format: Format::Fp8E4m3, block: BlockSize::new(32).unwrap() };
        engine_case::<f32>(&engine, &streams, scheme, len, 3, ReduceOp::Avg);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_engine_refuses_what_it_cannot_compress_before_enqueueing() {
    let [(device, stream)] = needs!(gpus: 1).map(with_stream);
    let engine = Engine::new();
    let format = WireFormat { format: Format::Int8, block: BlockSize::new(32).unwrap() };
    let mut a = DeviceBuffer::from_host(&stream, &[1.0f32; 64]).unwrap();
    let other = Stream::new(&device).unwrap();
    let mut b = DeviceBuffer::from_host(&other, &[2.0f32; 64]).unwrap();
    let mut ranks = [Rank { buffer: a.view_mut(..), stream: &stream }, Rank { buffer: b.view_mut(..), stream: &other }];
    let e = all_reduce_compressed(&engine, &mut ranks, ReduceOp::Max, format).unwrap_err();
    assert!(e.to_string().contains("takes sum or avg of f32, f16 or bf16, not max of f32"), "{e}");
    let mut ints =
        [DeviceBuffer::from_host(&stream, &[1i32; 8]).unwrap(), DeviceBuffer::from_host(&other, &[1i32; 8]).unwrap()];
    let [x, y] = &mut ints;
    let mut int_ranks =
        [Rank { buffer: x.view_mut(..), stream: &stream }, Rank { buffer: y.view_mut(..), stream: &other }];
    let e = all_reduce_compressed(&engine, &mut int_ranks, ReduceOp::Sum, format).unwrap_err();
    assert!(e.to_string().contains("not sum of i32"), "{e}");
    drop(ranks);
    assert_eq!(a.to_host_vec(&stream).unwrap(), vec![1.0f32; 64], "nothing ran");
}
