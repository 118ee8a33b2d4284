//! The compressed all-reduce's pieces and legs on the CPU: the pieces are the reference's
//! shards cut on blocks, every leg is one wire that fits a slot, and running the legs with
//! the codec's CPU twin gives the reference's bits on every rank.

use gp2p_kernels::compress::{BlockSize, Format, Scheme, all_reduce, decode_wire, encode_wire};

use super::*;
use crate::rounds::{LaneWaits, LegStep, steps};

fn format(format: Format, block: usize) -> WireFormat {
    WireFormat { format, block: BlockSize::new(block).unwrap() }
}

const SLOT: usize = 64 << 10;

#[test]
fn pieces_cut_the_reference_s_shards_on_blocks_into_wires_that_fit_a_slot() {
    for world in 1..=8 {
        for len in [1, 31, 33, 1000, 50_000, 300_001] {
            for block in [32, 256] {
                let f = format(Format::Int8, block);
                let plan = WirePieces::new(len, world, f, SLOT);
                let what = format!("{world} ranks, {len} values, blocks of {block}");
                let blocks = len.div_ceil(block);
                let mut next = 0;
                for (s, pieces) in plan.pieces.iter().enumerate() {
                    let shard = shard_blocks(blocks, world, s);
                    assert_eq!(next, (shard.start * block).min(len), "{what}: shard {s} starts where the last ended");
                    for p in pieces {
                        assert_eq!(p.start, next, "{what}: shard {s}");
                        assert!(!p.is_empty() && p.start % block == 0, "{what}: {p:?}");
                        assert!(f.wire_bytes(p.len()) <= plan.room && plan.room <= SLOT, "{what}: {p:?}");
                        next = p.end;
                    }
                    assert_eq!(next, (shard.end * block).min(len), "{what}: shard {s} covered");
                }
                assert_eq!(next, len);
                assert_eq!(plan.room % WIRE_ALIGN, 0);
                assert_eq!(plan.most, plan.pieces.iter().map(Vec::len).max().unwrap());
            }
        }
    }
    // Long shards: pieces as long as a slot allows (a wire of 8 MiB slots carries over 1.6 M
    // values), however many that makes.
    let plan = WirePieces::new(64 << 20, 2, format(Format::Int8, 64), 8 << 20);
    assert!(plan.pieces[0][0].len() > 1_600_000, "{:?}", plan.pieces[0][0]);
    assert!(plan.most > PIPELINED_PIECES);
}

#[test]
fn a_shard_that_fits_one_slot_is_still_cut_into_pieces_that_pipeline() {
    let int8 = format(Format::Int8, 64);
    // 32 MiB of bf16 between two ranks: a shard of 8 Mi values, whose wire one 64 MiB slot
    // would hold, goes as four pieces of 2 Mi values.
    let plan = WirePieces::new(16 << 20, 2, int8, 64 << 20);
    for pieces in &plan.pieces {
        let lens: Vec<usize> = pieces.iter().map(Range::len).collect();
        assert_eq!(lens, [MIN_PIECE_VALUES; PIPELINED_PIECES]);
    }
    // 16 MiB of bf16 between two: shards of 4 Mi values, two pieces; 4 MiB: one.
    assert!(WirePieces::new(8 << 20, 2, int8, 64 << 20).pieces.iter().all(|p| p.len() == 2));
    assert!(WirePieces::new(2 << 20, 2, int8, 64 << 20).pieces.iter().all(|p| p.len() == 1));
    // 64 MiB among four ranks: shards of 8 Mi values, four pieces of 2 Mi.
    let plan = WirePieces::new(32 << 20, 4, int8, 64 << 20);
    assert!(plan.pieces.iter().all(|p| p.len() == PIPELINED_PIECES && p[0].len() == 2 << 20));
    // A shard of fewer than twice the smallest piece stays whole; an odd length makes four
    // pieces of whole blocks, a quarter of the shard each, the last shorter.
    let plan = WirePieces::new(3 << 20, 2, int8, 64 << 20);
    assert!(plan.pieces.iter().all(|p| p.len() == 1), "{:?}", plan.pieces);
    let len = (24 << 20) + 5;
    let fp8 = format(Format::Fp8E4m3, 256);
    let plan = WirePieces::new(len, 2, fp8, 128 << 20);
    let quarter = shard_blocks(len.div_ceil(256), 2, 0).len().div_ceil(PIPELINED_PIECES) * 256;
    for pieces in &plan.pieces {
        let (last, whole) = pieces.split_last().expect("pieces");
        assert_eq!(pieces.len(), PIPELINED_PIECES, "{pieces:?}");
        assert!(whole.iter().all(|p| p.len() == quarter && p.start % 256 == 0), "{pieces:?}");
        assert!(!last.is_empty() && last.len() < quarter, "{pieces:?}");
    }
}

#[test]
fn every_leg_is_one_chunk_and_a_writer_has_at_most_one_leg_a_round() {
    for world in 2..=8 {
        let plan = WirePieces::new(200_000, world, format(Format::Fp8E4m3, 64), SLOT);
        for (rounds, values) in [plan.to_owners(2), plan.to_all(2)] {
            assert_eq!(rounds.legs.len(), values.len());
            for (leg, &n) in rounds.legs.iter().zip(&values) {
                assert!(leg.bytes <= SLOT && leg.bytes == format(Format::Fp8E4m3, 64).wire_bytes(n));
                let same_round = rounds.legs.iter().filter(|l| l.round == leg.round && l.writer == leg.writer);
                assert_eq!(same_round.count(), 1, "{world} ranks, round {}", leg.round);
            }
            for rank in 0..world {
                let steps = steps(&rounds, rank, SLOT, 3, &[], LaneWaits::for_ranks(world));
                let copies = steps.iter().filter(|(_, s)| matches!(s, LegStep::CopyOut { chunk: 0, .. })).count();
                let sent = rounds.legs.iter().filter(|l| l.writer == rank).count();
                assert_eq!(copies, sent, "{world} ranks, rank {rank}: one copy out a leg");
            }
        }
        // The rooms a rank's wires land in lie apart, inside its wire memory.
        let mut rooms: Vec<usize> =
            (0..world).flat_map(|r| (0..plan.most).map(move |p| (r, p))).map(|(r, p)| plan.got(r, p)).collect();
        rooms.extend((0..plan.most).map(|p| plan.folded(p)));
        rooms.sort_unstable();
        assert!(rooms.windows(2).all(|w| w[1] - w[0] >= plan.room));
        assert!(rooms.last().unwrap() + plan.room <= plan.stages(), "the rooms end where the stages start");
        assert_eq!((plan.stages() % WIRE_ALIGN, plan.bytes()), (0, plan.stages() + 2 * SLOT), "two stages of a slot");
    }
}

/// Each piece of a rank's shard folds, on the receive stream, once the leg `completing_legs`
/// names has landed: that leg brings one of the piece's wires and lands after every other
/// wire of the piece in the rank's steps, and nothing the run does after it touches what the
/// fold reads or writes (the wires' rooms are each written once; the rank sends only other
/// shards, so no copy out reads the piece of the input the decode overwrites in place).
#[test]
fn each_piece_folds_after_the_last_of_its_wires_lands_and_the_run_touches_it_no_more() {
    for world in 2..=8 {
        for (len, slot) in [(200_000, SLOT), (3_000_000, SLOT), (1_000, SLOT), (5_000_000, 4 << 20)] {
            let plan = WirePieces::new(len, world, format(Format::Int8, 64), slot);
            let (rounds, _) = plan.to_owners(2);
            for rank in 0..world {
                let what = format!("{world} ranks, {len} values, rank {rank}");
                let completing = plan.completing_legs(&rounds, rank);
                assert_eq!(completing.len(), plan.pieces[rank].len(), "{what}: a fold a piece");
                let lands: Vec<usize> = steps(&rounds, rank, slot, 3, &[], LaneWaits::for_ranks(world))
                    .into_iter()
                    .filter_map(|(_, s)| if let LegStep::Land { leg, .. } = s { Some(leg) } else { None })
                    .collect();
                for (p, &leg) in completing.iter().enumerate() {
                    let rooms: Vec<usize> = (0..world).filter(|&r| r != rank).map(|r| plan.got(r, p)).collect();
                    let of_piece: Vec<usize> = (0..rounds.legs.len())
                        .filter(|&i| rounds.legs[i].is_read_by(rank) && rooms.contains(&rounds.legs[i].dst.1))
                        .collect();
                    assert_eq!(of_piece.len(), world - 1, "{what}, piece {p}: a wire from every other rank");
                    assert!(of_piece.contains(&leg), "{what}, piece {p}: the completing leg brings a wire of it");
                    let at = |i: usize| lands.iter().position(|&l| l == i).unwrap();
                    assert!(of_piece.iter().all(|&i| at(i) <= at(leg)), "{what}, piece {p}: it lands last");
                }
                // The rank's copies out read only the other shards' values.
                let own =
                    plan.pieces[rank].first().map_or(0, |p| p.start)..plan.pieces[rank].last().map_or(0, |p| p.end);
                for leg in rounds.legs.iter().filter(|l| l.writer == rank) {
                    let start = leg.src.1 / 2;
                    assert!(start >= own.end || start < own.start, "{what}: a copy out reads its own shard");
                }
            }
        }
    }
}

/// The second run's copies out read the owner's folds, piece p's in round p: what
/// `enqueue_compressed` makes each of them wait for (the fold of the piece its round names).
#[test]
fn each_copy_out_of_the_second_run_reads_the_fold_its_round_names() {
    for world in 2..=8 {
        for (len, slot) in [(200_000, SLOT), (3_000_000, SLOT), (1_000, SLOT)] {
            let plan = WirePieces::new(len, world, format(Format::Int8, 64), slot);
            let (rounds, _) = plan.to_all(2);
            for leg in &rounds.legs {
                let what = format!("{world} ranks, {len} values, writer {}, round {}", leg.writer, leg.round);
                assert!(leg.round < plan.pieces[leg.writer].len(), "{what}: a piece the writer folds");
                assert_eq!(leg.src, (Buf::Part, plan.folded(leg.round)), "{what}");
            }
        }
    }
}

/// Chained after the first run, each writer's chunks of the second go on through its slots
/// from where the first run's left off (not from slot 0, which its last chunk may hold), and
/// every reader lands each chunk from the slot its writer filled.
#[test]
fn the_second_run_goes_on_through_each_writer_s_slots_and_its_readers_agree() {
    use crate::rounds::sent_after;
    let slots = 3;
    for world in 2..=8 {
        for len in [200_000, 3_000_000] {
            let plan = WirePieces::new(len, world, format(Format::Int8, 64), SLOT);
            let ((first, _), (second, _)) = (plan.to_owners(2), plan.to_all(2));
            let sent = sent_after(&first, SLOT, &[]);
            let mut filled = std::collections::HashMap::new();
            for rank in 0..world {
                for (_, step) in steps(&second, rank, SLOT, slots, &sent, LaneWaits::for_ranks(world)) {
                    if let LegStep::CopyOut { leg, slot, .. } = step {
                        filled.insert(leg, slot);
                    }
                }
            }
            for (writer, chunks) in sent.iter().enumerate() {
                if let Some(leg) = second.legs.iter().position(|l| l.writer == writer) {
                    assert_eq!(filled[&leg], chunks % slots, "{world} ranks, {len}: writer {writer}");
                }
            }
            for rank in 0..world {
                for (_, step) in steps(&second, rank, SLOT, slots, &sent, LaneWaits::for_ranks(world)) {
                    if let LegStep::Land { leg, slot, .. } = step {
                        assert_eq!(filled[&leg], slot, "{world} ranks, {len}: rank {rank} lands leg {leg}");
                    }
                }
            }
        }
    }
}

/// The legs run on host memory with the codec's CPU twin, as the pipeline runs them: the
/// first run's copy out encodes, its landing copies the wire; each owner folds in rank order
/// and decodes its own pieces; the second run's landing decodes.
fn run_on_the_cpu(inputs: &[Vec<f32>], op: ReduceOp, f: WireFormat, slot: usize) -> Vec<Vec<f32>> {
    let (world, len) = (inputs.len(), inputs[0].len());
    let plan = WirePieces::new(len, world, f, slot);
    let mut memory = vec![vec![0u8; plan.bytes()]; world];
    let (to_owners, values) = plan.to_owners(4);
    for (leg, n) in to_owners.legs.iter().zip(values) {
        let Readers::One(owner) = leg.readers else { panic!("a first-run leg has one reader") };
        let start = leg.src.1 / 4;
        let wire = encode_wire(f.format, f.block, &inputs[leg.writer][start..start + n]);
        assert!(wire.len() <= leg.bytes);
        memory[owner][leg.dst.1..leg.dst.1 + wire.len()].copy_from_slice(&wire);
    }
    let decoded = |wire: &[u8], n: usize| -> Vec<f32> {
        decode_wire(f.format, f.block, n, wire).iter().flat_map(|b| b.dequantize()).collect()
    };
    let mut outputs = vec![vec![f32::NAN; len]; world];
    for (rank, pieces) in plan.pieces.iter().enumerate() {
        for (p, values) in pieces.iter().enumerate() {
            let mut fold: Vec<f32> = Vec::new();
            for (r, input) in inputs.iter().enumerate() {
                let part = if r == rank {
                    input[values.clone()].to_vec()
                } else {
                    decoded(&memory[rank][plan.got(r, p)..], values.len())
                };
                if r == 0 {
                    fold = part;
                } else {
                    fold.iter_mut().zip(part).for_each(|(a, v)| *a += v);
                }
            }
            if op == ReduceOp::Avg {
                let reciprocal = 1.0 / world as f32;
                fold.iter_mut().for_each(|a| *a *= reciprocal);
            }
            let wire = encode_wire(f.format, f.block, &fold);
            memory[rank][plan.folded(p)..plan.folded(p) + wire.len()].copy_from_slice(&wire);
            outputs[rank][values.clone()].copy_from_slice(&decoded(&wire, values.len()));
        }
    }
    let (to_all, values) = plan.to_all(4);
    for (leg, n) in to_all.legs.iter().zip(values) {
        let wire = memory[leg.writer][leg.src.1..leg.src.1 + leg.bytes].to_vec();
        let start = leg.dst.1 / 4;
        for reader in leg.readers(world) {
            outputs[reader][start..start + n].copy_from_slice(&decoded(&wire, n));
        }
    }
    outputs
}

#[test]
fn the_legs_run_on_the_cpu_give_every_rank_the_reference_s_bits() {
    for world in 2..=5 {
        for (len, block, fmt) in [(1000, 32, Format::Int8), (40_000, 256, Format::Fp8E4m3), (70_001, 64, Format::Int8)]
        {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let f = format(fmt, block);
                let inputs: Vec<Vec<f32>> = (0..world)
                    .map(|r| (0..len).map(|i| ((i * 7919 + r * 104_729) % 2001) as f32 / 37.0 - 27.0).collect())
                    .collect();
                let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                let want = all_reduce(&refs, op, Scheme { format: fmt, block: f.block }).unwrap();
                // Slots of 64 KiB: the longer buffers take several pieces a shard.
                let got = run_on_the_cpu(&inputs, op, f, SLOT);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for (r, out) in got.iter().enumerate() {
                    assert_eq!(bits(out), bits(&want[r]), "{world} ranks, {len} values, {fmt}/{block}, {op}, rank {r}");
                }
            }
        }
    }
    // Shards that one 32 MiB slot holds, cut into pieces for pipelining (three ranks, shards of
    // about 4.1 Mi values: two even pieces each, not two of 2 Mi and a sliver).
    let (world, len, f) = (3, 12_800_003, format(Format::Int8, 64));
    let plan = WirePieces::new(len, world, f, 32 << 20);
    assert!(plan.pieces.iter().all(|p| p.len() == 2), "{:?}", plan.pieces);
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|r| (0..len).map(|i| ((i * 7919 + r * 104_729) % 2001) as f32 / 37.0 - 27.0).collect())
        .collect();
    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let want = all_reduce(&refs, ReduceOp::Sum, Scheme { format: Format::Int8, block: f.block }).unwrap();
    let got = run_on_the_cpu(&inputs, ReduceOp::Sum, f, 32 << 20);
    for (r, out) in got.iter().enumerate() {
        assert!(out.iter().zip(&want[r]).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {r}");
    }
}
