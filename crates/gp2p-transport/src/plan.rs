//! Chunk plans: how a transfer is cut for the staging pipeline. Pure, tested without a GPU.

use std::ops::Range;

/// Transfers up to this size go as one chunk: no pipeline, so the least latency.
pub const SINGLE_CHUNK_MAX_BYTES: usize = 1 << 20;
/// Chunks never get smaller than this in a pipeline: below it, per-chunk driver calls and
/// event waits cost more than the overlap gains.
pub const MIN_CHUNK_BYTES: usize = 1 << 20;
/// Nor larger than this: the pipeline's fill and drain (one chunk each way) stay under 2 %
/// of a 1 GiB copy, and host enqueue time stays small (measured: 16 MiB chunks, 2 %).
pub const MAX_CHUNK_BYTES: usize = 16 << 20;
/// A pipelined transfer aims at about this many chunks.
pub const TARGET_CHUNKS: usize = 32;
/// Pinned slots in a ring: enough that the producer runs ahead while the consumer drains.
pub const DEFAULT_SLOTS: usize = 4;

/// How a transfer is cut: chunk size and slot count, chosen from the size or overridden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    /// Bytes per chunk (the last may be shorter).
    pub chunk_bytes: usize,
    /// Slots in the staging ring.
    pub slots: usize,
}

impl Chunking {
    /// Refuses overrides of zero (a chunk of no bytes, a ring of no slots). Every caller that
    /// takes overrides checks them here, before any work.
    pub fn check_overrides(chunk_bytes: Option<usize>, slots: Option<usize>) -> crate::Result<()> {
        for (name, value) in [("chunk_bytes", chunk_bytes), ("slots", slots)] {
            if value == Some(0) {
                return Err(crate::Error::InvalidOption { name, reason: "must be at least 1 when given".into() });
            }
        }
        Ok(())
    }

    /// The chunking for `bytes`: one chunk up to [`SINGLE_CHUNK_MAX_BYTES`], else about
    /// [`TARGET_CHUNKS`] chunks of a whole number of MiB within [MIN, MAX]_CHUNK_BYTES.
    /// `chunk_bytes` / `slots` override the choice.
    pub fn for_bytes(bytes: usize, chunk_bytes: Option<usize>, slots: Option<usize>) -> Chunking {
        let chosen = if bytes <= SINGLE_CHUNK_MAX_BYTES {
            bytes.max(1)
        } else {
            pipelined_chunk_bytes(bytes, TARGET_CHUNKS, MAX_CHUNK_BYTES)
        };
        Chunking { chunk_bytes: chunk_bytes.unwrap_or(chosen), slots: slots.unwrap_or(DEFAULT_SLOTS) }
    }

    /// The plan for `len` elements of `element_bytes` each. Chunk boundaries fall on whole
    /// elements: the chunk is rounded down to a multiple of the element size (at least one).
    pub fn plan(&self, len: usize, element_bytes: usize) -> ChunkPlan {
        let per_chunk = (self.chunk_bytes / element_bytes.max(1)).max(1);
        ChunkPlan { len, per_chunk }
    }
}

/// The chunk of a pipelined transfer of `bytes`: about `target_chunks` chunks of a whole
/// number of MiB, within [`MIN_CHUNK_BYTES`] and `max_chunk_bytes`.
pub fn pipelined_chunk_bytes(bytes: usize, target_chunks: usize, max_chunk_bytes: usize) -> usize {
    (bytes / target_chunks.max(1)).next_multiple_of(MIN_CHUNK_BYTES).clamp(MIN_CHUNK_BYTES, max_chunk_bytes)
}

/// Consecutive element ranges covering `0..len`, each `per_chunk` long but the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    len: usize,
    per_chunk: usize,
}

impl ChunkPlan {
    /// Number of chunks (0 for an empty transfer).
    pub fn count(&self) -> usize {
        self.len.div_ceil(self.per_chunk)
    }

    /// Elements per full chunk.
    pub fn per_chunk(&self) -> usize {
        self.per_chunk
    }

    /// The chunks, in order.
    pub fn chunks(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.count()).map(|i| {
            let start = i * self.per_chunk;
            start..(start + self.per_chunk).min(self.len)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zero_overrides_are_refused_by_name() {
        assert!(Chunking::check_overrides(None, None).is_ok());
        assert!(Chunking::check_overrides(Some(1), Some(1)).is_ok());
        let chunk = Chunking::check_overrides(Some(0), Some(4)).unwrap_err().to_string();
        assert!(chunk.contains("chunk_bytes"), "{chunk}");
        let slots = Chunking::check_overrides(None, Some(0)).unwrap_err().to_string();
        assert!(slots.contains("slots"), "{slots}");
    }

    #[test]
    fn sizes_pick_their_chunking() {
        assert_eq!(Chunking::for_bytes(4096, None, None).chunk_bytes, 4096, "small: one chunk");
        assert_eq!(Chunking::for_bytes(1 << 20, None, None).chunk_bytes, 1 << 20);
        assert_eq!(Chunking::for_bytes(64 << 20, None, None).chunk_bytes, 2 << 20);
        assert_eq!(Chunking::for_bytes(1 << 30, None, None).chunk_bytes, MAX_CHUNK_BYTES);
        assert_eq!(Chunking::for_bytes(3 << 20, None, None).chunk_bytes, MIN_CHUNK_BYTES);
        let forced = Chunking::for_bytes(1 << 30, Some(65536), Some(3));
        assert_eq!((forced.chunk_bytes, forced.slots), (65536, 3));
    }

    #[test]
    fn a_chunk_holds_at_least_one_element() {
        let plan = Chunking { chunk_bytes: 3, slots: 1 }.plan(5, 8);
        assert_eq!(plan.chunks().collect::<Vec<_>>(), [0..1, 1..2, 2..3, 3..4, 4..5]);
        assert_eq!(Chunking::for_bytes(0, None, None).plan(0, 4).count(), 0);
    }

    proptest! {
        #[test]
        fn every_element_moves_exactly_once_in_order(len in 0usize..200_000, chunk in 1usize..70_000, elem in prop::sample::select(vec![1usize, 2, 4, 8])) {
            let plan = Chunking { chunk_bytes: chunk, slots: 4 }.plan(len, elem);
            let chunks: Vec<_> = plan.chunks().collect();
            prop_assert_eq!(chunks.len(), plan.count());
            let mut next = 0;
            for (i, c) in chunks.iter().enumerate() {
                prop_assert_eq!(c.start, next, "contiguous and in order");
                prop_assert!(!c.is_empty());
                if i + 1 < chunks.len() {
                    prop_assert_eq!(c.len(), plan.per_chunk(), "only the last chunk is short");
                } else {
                    prop_assert!(c.len() <= plan.per_chunk());
                }
                prop_assert!(c.len() * elem <= chunk.max(elem), "a chunk fits its slot");
                next = c.end;
            }
            prop_assert_eq!(next, len, "every element covered");
        }

        #[test]
        fn chosen_chunks_fit_the_bounds(bytes in 1usize..(4usize << 30)) {
            let c = Chunking::for_bytes(bytes, None, None);
            if bytes <= SINGLE_CHUNK_MAX_BYTES {
                prop_assert_eq!(c.chunk_bytes, bytes);
            } else {
                prop_assert!((MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&c.chunk_bytes));
                prop_assert_eq!(c.chunk_bytes % MIN_CHUNK_BYTES, 0);
            }
            prop_assert!(c.slots >= 2, "a pipeline needs two slots to overlap");
        }
    }
}
