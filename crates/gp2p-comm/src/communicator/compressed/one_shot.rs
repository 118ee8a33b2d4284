//! The one-shot compressed all-reduce between two ranks: every rank's whole buffer crosses as
//! wires, and every rank folds every rank's wire, its own included, straight into its output
//! (`gp2p_kernels::compress::all_reduce_one_shot`'s bits: one rounding of each input, none
//! after the fold).
//!
//! The buffer is cut into pieces whose wire fits a slot, up to four even ones where it is
//! long enough ([`crate::compression::one_shot_piece_blocks`]). In round p each rank encodes
//! piece p of its input into its own room for it (kept for its fold) and copies that into its
//! slot; the other rank copies it into the same room of its own wire memory (the rooms lie
//! alike on every rank). Once piece p's wire has landed, the rank folds both wires of the
//! piece into that piece of its output, after its own encode of the piece (an event between
//! its two streams: in place, the fold overwrites what the encode reads), while later pieces
//! cross. So each link carries the buffer's wire W once up and once down, the two-shot's bytes
//! between two ranks, in one trip through host memory and with nothing between the two
//! directions but the piece's own landing.

use std::ops::Range;

use gp2p_collectives::legs::{Buf, Readers};
use gp2p_cuda::codec::WireFormat;

use super::{cut_into_pieces, rounds_of, widest_room, wire_leg};
use crate::compression::one_shot_piece_blocks;
use crate::rounds::Rounds;

/// The pieces of one one-shot call and where their wires sit in the wire memory: rank r's
/// wire of piece p at `got(r, p)` on every rank, each in a room of `room` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OneShotPieces {
    /// The pieces' values as element indices, in order.
    pub(crate) pieces: Vec<Range<usize>>,
    /// Bytes of the widest piece's wire, on the wire alignment: at most a slot.
    pub(crate) room: usize,
    world: usize,
    format: WireFormat,
}

impl OneShotPieces {
    /// The pieces of `len` values among `world` ranks through slots of `slot_bytes`.
    pub(crate) fn new(len: usize, world: usize, format: WireFormat, slot_bytes: usize) -> OneShotPieces {
        let size = format.block.get();
        let blocks = 0..len.div_ceil(size);
        let pieces = cut_into_pieces(blocks, one_shot_piece_blocks(len, format, slot_bytes), size, len);
        OneShotPieces { room: widest_room(&pieces, format), pieces, world, format }
    }

    /// Bytes of wire memory a rank needs: a room per rank and piece.
    pub(crate) fn bytes(&self) -> usize {
        self.world * self.pieces.len() * self.room
    }

    /// Offset of rank `writer`'s wire of piece `piece`, the same on every rank.
    pub(crate) fn got(&self, writer: usize, piece: usize) -> usize {
        (writer * self.pieces.len() + piece) * self.room
    }

    /// The legs: in round p every rank sends its wire of piece p (encoded from its input,
    /// [`Buf::Main`]) to every other rank, which copies it to `got(writer, p)` of its wire
    /// memory ([`Buf::Part`]); with each leg's values.
    pub(crate) fn legs(&self, dtype_size: usize) -> (Rounds, Vec<usize>) {
        let mut legs = Vec::new();
        for (p, values) in self.pieces.iter().enumerate() {
            for writer in 0..self.world {
                let (src, dst) = ((Buf::Main, values.start * dtype_size), (Buf::Part, self.got(writer, p)));
                legs.push(wire_leg(p, writer, Readers::Others, src, dst, values, self.format));
            }
        }
        rounds_of(self.world, legs)
    }

    /// For each piece, the leg of `rounds` (from [`OneShotPieces::legs`]) whose landing on
    /// `rank` completes it: between two ranks, the other rank's leg of the piece's round,
    /// the only one `rank` lands. `None` among more ranks, where several land in one round.
    pub(crate) fn completing_legs(&self, rounds: &Rounds, rank: usize) -> Option<Vec<usize>> {
        if self.world != 2 {
            return None;
        }
        let landed_in = |p: usize| rounds.legs.iter().position(|leg| leg.round == p && leg.is_read_by(rank));
        (0..self.pieces.len()).map(landed_in).collect()
    }
}

#[cfg(test)]
mod tests {
    use gp2p_kernels::ReduceOp;
    use gp2p_kernels::compress::{BlockSize, Format, Scheme, all_reduce_one_shot, decode_wire, encode_wire};

    use super::*;
    use crate::communicator::compressed::WIRE_ALIGN;
    use crate::rounds::{LaneWaits, LegStep, steps};

    fn int8(block: usize) -> WireFormat {
        WireFormat { format: Format::Int8, block: BlockSize::new(block).unwrap() }
    }

    #[test]
    fn pieces_cover_the_buffer_in_order_each_wire_in_its_room_and_a_slot() {
        const SLOT: usize = 32 << 20;
        for (len, block, slot, count) in [
            (0, 64, SLOT, 0),
            (1, 64, SLOT, 1),
            (100, 32, SLOT, 1),
            // Pieces of at least a million values, up to four.
            (2 << 20, 64, SLOT, 2),
            (3 << 20, 256, SLOT, 3),
            (1 << 20, 64, SLOT, 1),
            (5 << 20, 64, SLOT, 4),
            // Rooms of about 5 bytes a value: a slot holds about 6.4 million values.
            (64 << 20, 64, SLOT, 11),
            // A small slot takes more pieces: no wire is wider than a slot.
            (1 << 20, 64, 64 << 10, 82),
        ] {
            let format = int8(block);
            let plan = OneShotPieces::new(len, 2, format, slot);
            assert_eq!(plan.pieces.len(), count, "{len} values, slot {slot}");
            let mut next = 0;
            for piece in &plan.pieces {
                assert_eq!(piece.start, next);
                assert!(piece.start % block == 0 && !piece.is_empty());
                assert!(format.wire_bytes(piece.len()) <= plan.room && plan.room <= slot);
                next = piece.end;
            }
            assert_eq!(next, len);
            assert_eq!(plan.room % WIRE_ALIGN, 0);
            // Every room apart: two ranks' rooms of every piece tile the wire memory.
            let mut offsets: Vec<usize> =
                (0..2).flat_map(|r| (0..count).map(move |p| (r, p))).map(|(r, p)| plan.got(r, p)).collect();
            offsets.sort_unstable();
            assert!(offsets.windows(2).all(|w| w[1] - w[0] == plan.room));
            assert_eq!(plan.bytes(), 2 * count * plan.room);
        }
    }

    #[test]
    fn each_rank_sends_each_piece_once_and_lands_the_other_s_in_its_room() {
        let format = int8(64);
        let plan = OneShotPieces::new(3 << 20, 2, format, 32 << 20);
        let (rounds, values) = plan.legs(2);
        assert_eq!(rounds.legs.len(), 2 * plan.pieces.len());
        for (leg, &n) in rounds.legs.iter().zip(&values) {
            let piece = &plan.pieces[leg.round];
            assert_eq!(n, piece.len());
            assert_eq!(leg.src, (Buf::Main, piece.start * 2));
            assert_eq!(leg.dst, (Buf::Part, plan.got(leg.writer, leg.round)));
            assert_eq!(leg.bytes, format.wire_bytes(n));
            assert!(leg.is_read_by(1 - leg.writer) && !leg.is_read_by(leg.writer));
        }
        for rank in 0..2 {
            let completing = plan.completing_legs(&rounds, rank).unwrap();
            for (p, &i) in completing.iter().enumerate() {
                assert_eq!((rounds.legs[i].round, rounds.legs[i].writer), (p, 1 - rank));
            }
        }
        let three = OneShotPieces::new(3 << 20, 3, format, 32 << 20);
        assert_eq!(three.completing_legs(&three.legs(2).0, 0), None, "only two ranks");
    }

    /// In each rank's steps, its copy out of a piece (whose encode records the piece's event)
    /// comes before the landing its fold of the piece follows (whose fold waits for that
    /// event): the record is enqueued before the wait, so the wait is for this call's encode.
    /// And no landing on a rank writes its own rooms, which only its encodes write.
    #[test]
    fn each_piece_s_encode_is_enqueued_before_its_fold_and_no_landing_writes_an_own_room() {
        for (len, slot) in [(3 << 20, 32 << 20), (1 << 20, 64 << 10), (1000, 64 << 10)] {
            let plan = OneShotPieces::new(len, 2, int8(64), slot);
            let (rounds, _) = plan.legs(2);
            for rank in 0..2 {
                let list = steps(&rounds, rank, slot, 3, &[], LaneWaits::for_ranks(2));
                let at = |want: &dyn Fn(&LegStep) -> bool| list.iter().position(|(_, s)| want(s)).unwrap();
                for (p, &leg) in plan.completing_legs(&rounds, rank).unwrap().iter().enumerate() {
                    let own = rounds.legs.iter().position(|l| l.round == p && l.writer == rank).unwrap();
                    let copied = at(&|s| matches!(s, LegStep::CopyOut { leg: i, .. } if *i == own));
                    let landed = at(&|s| matches!(s, LegStep::Land { leg: i, .. } if *i == leg));
                    assert!(copied < landed, "{len} values, rank {rank}, piece {p}");
                }
                for leg in rounds.legs.iter().filter(|l| l.is_read_by(rank)) {
                    let own_rooms: Vec<usize> = (0..plan.pieces.len()).map(|p| plan.got(rank, p)).collect();
                    assert!(!own_rooms.contains(&leg.dst.1), "{len} values: rank {rank} lands in its own room");
                }
            }
        }
    }

    /// The legs run on host memory with the codec's CPU twin, as the pipeline runs them: each
    /// writer encodes into its own room and every reader copies the wire into the same room
    /// of its memory; then each rank folds, for each piece, every rank's room of the piece in
    /// rank order into its output, from the rooms its completing leg and its own encode
    /// filled (the order between them is the test above's).
    fn run_on_the_cpu(inputs: &[Vec<f32>], op: ReduceOp, f: WireFormat, slot: usize) -> Vec<Vec<f32>> {
        let (world, len) = (inputs.len(), inputs[0].len());
        let plan = OneShotPieces::new(len, world, f, slot);
        let mut memory = vec![vec![0u8; plan.bytes()]; world];
        let mut outputs = inputs.to_vec();
        let (rounds, values) = plan.legs(4);
        let completing: Vec<Vec<usize>> = (0..world).map(|r| plan.completing_legs(&rounds, r).unwrap()).collect();
        for (leg, &n) in rounds.legs.iter().zip(&values) {
            let start = leg.src.1 / 4;
            let wire = encode_wire(f.format, f.block, &inputs[leg.writer][start..start + n]);
            assert!(wire.len() <= leg.bytes && leg.bytes <= plan.room);
            for rank in std::iter::once(leg.writer).chain(leg.readers(world)) {
                memory[rank][leg.dst.1..leg.dst.1 + wire.len()].copy_from_slice(&wire);
            }
        }
        for (i, leg) in rounds.legs.iter().enumerate() {
            for rank in leg.readers(world) {
                let Some(p) = completing[rank].iter().position(|&c| c == i) else { continue };
                let piece = plan.pieces[p].clone();
                let mut fold: Vec<f32> = Vec::new();
                for r in 0..world {
                    let room = &memory[rank][plan.got(r, p)..];
                    let part: Vec<f32> =
                        decode_wire(f.format, f.block, piece.len(), room).iter().flat_map(|b| b.dequantize()).collect();
                    if r == 0 {
                        fold = part;
                    } else {
                        fold.iter_mut().zip(part).for_each(|(a, v)| *a += v);
                    }
                }
                if op == ReduceOp::Avg {
                    fold.iter_mut().for_each(|a| *a *= 1.0 / world as f32);
                }
                outputs[rank][piece].copy_from_slice(&fold);
            }
        }
        outputs
    }

    #[test]
    fn the_legs_run_on_the_cpu_give_both_ranks_the_one_shot_reference_s_bits() {
        for (len, block, fmt, slot) in [
            (1000usize, 32, Format::Int8, 64 << 10),
            (40_000, 256, Format::Fp8E4m3, 64 << 10),
            (70_001, 64, Format::Int8, 64 << 10),
            (2_000_003, 64, Format::Int8, 32 << 20),
        ] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let f = WireFormat { format: fmt, block: BlockSize::new(block).unwrap() };
                let inputs: Vec<Vec<f32>> = (0..2)
                    .map(|r| (0..len).map(|i| ((i * 7919 + r * 104_729) % 2001) as f32 / 37.0 - 27.0).collect())
                    .collect();
                let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                let want = all_reduce_one_shot(&refs, op, Scheme { format: fmt, block: f.block }).unwrap();
                let got = run_on_the_cpu(&inputs, op, f, slot);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for r in 0..2 {
                    assert_eq!(bits(&got[r]), bits(&want[r]), "{len} values, {fmt}/{block}, {op}, rank {r}");
                }
            }
        }
    }
}
