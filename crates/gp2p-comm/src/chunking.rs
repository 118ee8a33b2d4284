//! How the pipeline cuts a message into chunks, each one DMA through a slot of the segment
//! and one handoff: fewer chunks cost fewer driver calls and handoffs, more chunks keep both
//! directions of the link busy sooner (see `crate::choice::all_reduce_prediction`'s fill).

/// Chunks start on page boundaries (every DMA of a chunk starts page-aligned in its slot).
const PAGE: usize = 4096;

/// A leg is cut into this many chunks where each keeps [`MIN_PIPELINE_CHUNK`] bytes: the first
/// chunk goes up before anything comes down and the last comes down after everything went up,
/// so a leg sent as one slot-sized chunk keeps each direction idle for that chunk's time.
pub const PIPELINE_CHUNKS: usize = 4;

/// The smallest chunk [`pipeline_chunk`] cuts a leg into: each chunk costs a handoff (a flag
/// each way) and about ten driver calls to enqueue.
pub const MIN_PIPELINE_CHUNK: usize = 1 << 20;

/// Bytes of each chunk of a leg of `leg_bytes` (two ranks' exchange: the whole buffer) with
/// slots of `slot_bytes`: `fixed` where given, else the leg in [`PIPELINE_CHUNKS`] even chunks
/// of whole pages, at least [`MIN_PIPELINE_CHUNK`], at most a slot. Both sides of a leg
/// compute the same from its length.
///
/// ```
/// use gp2p_comm::{MIN_PIPELINE_CHUNK, pipeline_chunk};
///
/// const MIB: usize = 1 << 20;
/// assert_eq!(pipeline_chunk(16 * MIB, 8 * MIB, None), 4 * MIB, "four chunks");
/// assert_eq!(pipeline_chunk(256 * MIB, 8 * MIB, None), 8 * MIB, "a slot at most");
/// assert_eq!(pipeline_chunk(2 * MIB, 8 * MIB, None), MIN_PIPELINE_CHUNK, "1 MiB at least");
/// assert_eq!(pipeline_chunk(16 * MIB, 8 * MIB, Some(8 * MIB)), 8 * MIB, "or as given");
/// ```
///
/// # Panics
/// Where `slot_bytes` or `fixed` is 0 (no chunk could carry anything).
pub fn pipeline_chunk(leg_bytes: usize, slot_bytes: usize, fixed: Option<usize>) -> usize {
    assert!(slot_bytes > 0 && fixed != Some(0), "pipeline_chunk: a slot and a chunk hold at least a byte");
    if let Some(fixed) = fixed {
        return fixed.min(slot_bytes);
    }
    leg_bytes.div_ceil(PIPELINE_CHUNKS).next_multiple_of(PAGE).clamp(MIN_PIPELINE_CHUNK.min(slot_bytes), slot_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn chunks_are_a_quarter_of_the_leg_on_pages_between_the_floor_and_a_slot() {
        let slot = 8 * MIB;
        assert_eq!(pipeline_chunk(16 * MIB, slot, None), 4 * MIB);
        assert_eq!(pipeline_chunk(24 * MIB + 4, slot, None), 6 * MIB + PAGE, "rounded up to a page");
        assert_eq!(pipeline_chunk(64 * MIB, slot, None), slot, "at most a slot");
        assert_eq!(pipeline_chunk(3 * MIB, slot, None), MIN_PIPELINE_CHUNK, "at least the floor");
        assert_eq!(pipeline_chunk(0, slot, None), MIN_PIPELINE_CHUNK, "nothing to cut still names a size");
        assert_eq!(pipeline_chunk(16 * MIB, 512 << 10, None), 512 << 10, "slots below the floor bound it");
        assert_eq!(pipeline_chunk(16 * MIB, slot, Some(2 * MIB)), 2 * MIB, "a fixed chunk wins");
        assert_eq!(pipeline_chunk(16 * MIB, slot, Some(16 * MIB)), slot, "but never past a slot");
        for bytes in [1, PAGE, 5 * MIB + 3, 33 * MIB, 1 << 30] {
            let chunk = pipeline_chunk(bytes, slot, None);
            assert!(
                chunk % PAGE == 0
                    && chunk <= slot
                    && bytes.div_ceil(chunk) <= PIPELINE_CHUNKS.max(bytes.div_ceil(slot))
            );
        }
    }
}
