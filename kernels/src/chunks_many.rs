//! The two-shot all-reduce among 3 to 8 ranks in one flagged-chunk kernel per rank (`chunks.cu`,
//! `chunks_many`): its kernel names and the layout of a rank's area.

use std::ops::RangeInclusive;

use crate::{CHUNK_BYTES, CHUNK_FLAG_STRIDE, DType, ReduceOp};

/// The ranks [`chunks_many_kernel_name`]'s kernel takes (two ranks have their own kernel,
/// `chunks_kernel_name`).
pub const CHUNKS_MANY_WORLD: RangeInclusive<usize> = 3..=8;

/// The exported name of the many-rank flagged-chunk all-reduce kernel for `op` on `dtype`, in
/// [`crate::CHUNKS`].
///
/// Signature `(const T* src, T* dst, u64 n, char* areas, u64 area_stride, u32 rank, u32 world,
/// u32 divisor, u64 timeout_ns, u64 queue_timeout_ns, u32* failed, u32* seq_counter,
/// u64 half_stride, u64 area_chunks, u32* broken)`: each rank stores `src` into its data area of mapped host memory in
/// [`CHUNK_BYTES`] chunks and flags each with the call's number; chunk c's owner, rank
/// `c % world`, waits for every rank's flag of it, folds them in rank order into `dst` and
/// into its reduced area (slot `c / world`) and flags that; every other rank waits for the
/// owner's flag and copies the folded chunk into `dst`. Rank q's area is `q * area_stride`
/// bytes after `areas`, laid out as [`chunks_many_area`] lays out one of `area_chunks`
/// chunks; numbering, halves, waits and
/// launch shape are those of `chunks_kernel_name`'s kernel. `n` must span at least `world`
/// chunks, so that every rank owns one (the kernel does nothing otherwise).
pub fn chunks_many_kernel_name(op: ReduceOp, dtype: DType) -> &'static str {
    const NAMES: [[&str; DType::ALL.len()]; ReduceOp::ALL.len()] = kernel_names!("gp2p_chunks_many_");
    NAMES[op.index()][dtype.index()]
}

/// Where the parts of one rank's area for one call lie, for buffers of up to some size
/// among some ranks ([`chunks_many_area`]), in bytes from the area's start: the data's chunks
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunksManyArea {
    /// The chunks this rank folded, one for each chunk it owns.
    pub reduced_offset: usize,
    /// The data's flags, one every [`CHUNK_FLAG_STRIDE`] bytes.
    pub flags_offset: usize,
    /// The folded chunks' flags, likewise.
    pub reduced_flags_offset: usize,
    /// The whole area.
    pub bytes: usize,
}

/// The layout of a rank's area for buffers of up to `bytes` among `world` ranks: whole chunks
/// of data, the chunks a rank owns (one in `world`, rounded up) folded, then each part's flags.
/// Every offset is a multiple of [`CHUNK_FLAG_STRIDE`], so an area starting on a 64-byte
/// boundary keeps every 16-byte load and flag aligned.
pub const fn chunks_many_area(bytes: usize, world: usize) -> ChunksManyArea {
    let chunks = bytes.div_ceil(CHUNK_BYTES);
    let owned = chunks.div_ceil(if world == 0 { 1 } else { world });
    let reduced_offset = chunks * CHUNK_BYTES;
    let flags_offset = reduced_offset + owned * CHUNK_BYTES;
    let reduced_flags_offset = flags_offset + chunks * CHUNK_FLAG_STRIDE;
    ChunksManyArea {
        reduced_offset,
        flags_offset,
        reduced_flags_offset,
        bytes: reduced_flags_offset + owned * CHUNK_FLAG_STRIDE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_area_holds_whole_chunks_the_owned_share_and_a_flag_for_each() {
        // 1 MiB among 4: 256 chunks, 64 owned.
        let area = chunks_many_area(1 << 20, 4);
        assert_eq!(area.reduced_offset, 1 << 20);
        assert_eq!(area.flags_offset, (1 << 20) + 64 * CHUNK_BYTES);
        assert_eq!(area.reduced_flags_offset, area.flags_offset + 256 * CHUNK_FLAG_STRIDE);
        assert_eq!(area.bytes, area.reduced_flags_offset + 64 * CHUNK_FLAG_STRIDE);
        // A partial chunk is a whole one, and owned slots round up: 3 chunks among 8 own 1.
        let odd = chunks_many_area(2 * CHUNK_BYTES + 1, 8);
        assert_eq!((odd.reduced_offset, odd.flags_offset), (3 * CHUNK_BYTES, 4 * CHUNK_BYTES));
        assert_eq!(odd.bytes, 4 * CHUNK_BYTES + 4 * CHUNK_FLAG_STRIDE);
        for part in [area.reduced_offset, area.flags_offset, area.reduced_flags_offset, area.bytes] {
            assert_eq!(part % CHUNK_FLAG_STRIDE, 0);
        }
    }
}
