//! The compressed all-reduce's layout: which values each piece carries and where its wires
//! sit in pinned host memory. The arithmetic is `gp2p_kernels::compress::all_reduce`'s, and
//! its result is that reference's bits: blocks are dealt to the ranks as its shards
//! ([`shard_blocks`]), so each block has the owner it has there.
//!
//! Each shard is cut into pieces of whole blocks, piece j of every shard making round j.
//! In round j every rank encodes its values of the other shards' pieces into wires of their
//! own ("up"), each owner folds its piece with those wires and encodes the fold ("down"), and
//! every rank decodes every down wire. Rounds pipeline: a rank encodes round j + 1 while the
//! down wires of round j are decoded, so both directions of its link carry bytes at once.
//! Every wire of a call has its own place (nothing is overwritten within a call), 16-byte
//! aligned, as the codec's kernels need: the up wires in one area, the down wires in another.

use std::ops::Range;

use gp2p_cuda::codec::WireFormat;
use gp2p_kernels::compress::shard_blocks;

/// Wires start on this many bytes.
const WIRE_ALIGN: usize = 16;
/// A piece aims at this many values: a wire of about 1 MiB in int8 or fp8, long enough that a
/// kernel crossing the link runs at its rate, short enough that rounds overlap.
const PIECE_VALUES: usize = 1 << 20;
/// At most this many rounds a call, so the events a call records stay few: longer pieces
/// past that.
const MAX_ROUNDS: usize = 16;

/// One piece: the values it carries and its wires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The shard it belongs to, whose rank folds it.
    pub(crate) owner: usize,
    /// The round it travels in.
    pub(crate) round: usize,
    /// Its values, as element indices of every rank's buffer.
    pub(crate) values: Range<usize>,
    /// Per rank, where its up wire of this piece starts in the up area (`None` for the
    /// owner, whose values never leave it).
    pub(crate) up: Vec<Option<usize>>,
    /// Where the owner's encoded fold starts in the down area.
    pub(crate) down: usize,
    /// Bytes of each of its wires.
    pub(crate) wire_bytes: usize,
}

/// Every piece of a call, in rounds, and the pinned bytes their wires take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WirePlan {
    pub(crate) pieces: Vec<Piece>,
    pub(crate) rounds: usize,
    /// Bytes of the up area: every rank's wires to the owners.
    pub(crate) up_bytes: usize,
    /// Bytes of the down area: the owners' encoded folds.
    pub(crate) down_bytes: usize,
}

impl WirePlan {
    /// The plan for `len` values on each of `ranks` ranks in `format`.
    pub(crate) fn new(len: usize, ranks: usize, format: WireFormat) -> WirePlan {
        let size = format.block.get();
        let blocks = len.div_ceil(size);
        let ranks = ranks.max(1);
        let widest = (0..ranks).map(|k| shard_blocks(blocks, ranks, k).len()).max().unwrap_or(0);
        let mut piece_blocks = (PIECE_VALUES / size).max(1);
        if widest.div_ceil(piece_blocks) > MAX_ROUNDS {
            piece_blocks = widest.div_ceil(MAX_ROUNDS);
        }
        let rounds = widest.div_ceil(piece_blocks);
        let mut pieces = Vec::new();
        let (mut up_bytes, mut down_bytes) = (0, 0);
        let room = |at: &mut usize, bytes: usize| {
            let start = *at;
            *at += bytes.next_multiple_of(WIRE_ALIGN).max(WIRE_ALIGN);
            start
        };
        for round in 0..rounds {
            for owner in 0..ranks {
                let shard = shard_blocks(blocks, ranks, owner);
                let first = shard.start + round * piece_blocks;
                if first >= shard.end {
                    continue;
                }
                let last = (first + piece_blocks).min(shard.end);
                let values = (first * size).min(len)..(last * size).min(len);
                let wire_bytes = format.wire_bytes(values.len());
                let up = (0..ranks).map(|r| (r != owner).then(|| room(&mut up_bytes, wire_bytes))).collect();
                let down = room(&mut down_bytes, wire_bytes);
                pieces.push(Piece { owner, round, values, up, down, wire_bytes });
            }
        }
        WirePlan { pieces, rounds, up_bytes, down_bytes }
    }

    /// The pieces of round `round`.
    pub(crate) fn round(&self, round: usize) -> impl Iterator<Item = &Piece> {
        self.pieces.iter().filter(move |p| p.round == round)
    }
}

#[cfg(test)]
mod tests;
