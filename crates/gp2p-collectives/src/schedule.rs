//! Ring schedules as plain data (Thakur, Rabenseifner, Gropp 2005): which rank sends which
//! element range to its successor, and whether the receiver folds it in or stores it.
//!
//! The buffer is cut into `ranks` segments and each segment into chunks; every chunk moves
//! around the ring on its own, so a rank forwards chunk c while chunk c+1 is still arriving.
//! Transfers are listed step by step (and chunk by chunk within a step), and an executor that
//! runs each rank's sends and receives on their own streams, waiting only on the chunk each
//! transfer needs, gets the pipeline.
//!
//! Execution order: transfers run in list order, except that consecutive transfers of one
//! step over one range form an *exchange* ([`Schedule::groups`]): every transfer of a group
//! reads its source before any of them writes its destination. The two-rank all-reduce is
//! one such exchange per chunk — each rank sends its chunk and folds in the other's — which
//! moves the same bytes as the two-step ring in one step, so a small all-reduce waits for
//! one trip through host memory instead of two. Ring schedules have no two transfers of a
//! step over one range, so for them this is plain list order.
//!
//! Pure: the same schedule drives the GPU executor and [`Schedule::run_on_host`], which the
//! tests check on any machine.

use std::ops::Range;

use gp2p_kernels::{Element, REDUCE_VECTOR_BYTES, ReduceOp};
use gp2p_transport::plan::{Chunking, SINGLE_CHUNK_MAX_BYTES};

use crate::env::parse_byte_limit;

/// What the receiver does with a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `dst = op(dst, src)`; `last` marks the step that completes the segment (where avg
    /// divides by the number of ranks).
    Reduce {
        /// Whether this reduction completes the element's value.
        last: bool,
    },
    /// `dst = src`.
    Copy,
}

/// One chunk sent from a rank to the next one in the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Step of the ring algorithm this belongs to (0-based, across both phases).
    pub step: usize,
    /// Sending rank.
    pub from: usize,
    /// Receiving rank (`(from + 1) % ranks`).
    pub to: usize,
    /// Element range, the same in the sender's and the receiver's buffer.
    pub range: Range<usize>,
    /// What the receiver does.
    pub action: Action,
}

/// A collective as a list of transfers over `ranks` buffers of `len` elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Number of ranks.
    pub ranks: usize,
    /// Elements per buffer.
    pub len: usize,
    /// The transfers, in execution order: one by one, except that each exchange group
    /// ([`Schedule::groups`]) reads all its sources before it writes.
    pub transfers: Vec<Transfer>,
}

/// Segment `s` of `len` elements cut into `ranks` nearly equal parts (the first
/// `len % ranks` segments hold one element more).
pub fn segment(ranks: usize, len: usize, s: usize) -> Range<usize> {
    segment_aligned(ranks, len, s, 1)
}

/// Segment `s` of `len` elements cut into `ranks` nearly equal parts whose boundaries fall
/// on multiples of `align` elements (the last may end short at `len`), so that every chunk
/// of a segment keeps the 16-byte alignment the vectorised kernels want.
pub fn segment_aligned(ranks: usize, len: usize, s: usize, align: usize) -> Range<usize> {
    let (ranks, align) = (ranks.max(1), align.max(1));
    let units = len.div_ceil(align);
    let (base, extra) = (units / ranks, units % ranks);
    let start = s * base + s.min(extra);
    let end = start + base + usize::from(s < extra);
    (start * align).min(len)..(end * align).min(len)
}

/// `range` cut into pieces of at most `chunk` elements.
pub(crate) fn chunks(range: Range<usize>, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    let chunk = chunk.max(1);
    (range.start..range.end).step_by(chunk).map(move |s| s..(s + chunk).min(range.end))
}

impl Schedule {
    /// Two-rank all-reduce as one exchange per chunk: both ranks send the chunk and each
    /// folds the other's into its own (rank 0 computes `op(x0, x1)`, rank 1 `op(x1, x0)`:
    /// sums and products commute bitwise, avg divides the commuted sum, and min and max pick
    /// the same value, up to the sign of a zero). Chunk boundaries fall on multiples of
    /// `align` elements.
    pub fn all_reduce_exchange(len: usize, chunk: usize, align: usize) -> Schedule {
        let chunk = chunk.max(1).next_multiple_of(align.max(1));
        let mut transfers = Vec::new();
        for range in chunks(0..len, chunk) {
            for from in 0..2 {
                let action = Action::Reduce { last: true };
                transfers.push(Transfer { step: 0, from, to: 1 - from, range: range.clone(), action });
            }
        }
        Schedule { ranks: 2, len, transfers }
    }

    /// Ring all-reduce: a reduce-scatter after which rank r holds the reduced segment
    /// (r + 1) % ranks, then an all-gather of those segments.
    pub fn all_reduce(ranks: usize, len: usize, chunk: usize) -> Schedule {
        Self::all_reduce_aligned(ranks, len, chunk, 1)
    }

    /// [`Schedule::all_reduce`] with segment boundaries on multiples of `align` elements
    /// (pass a `chunk` that is a multiple of `align` too).
    pub fn all_reduce_aligned(ranks: usize, len: usize, chunk: usize, align: usize) -> Schedule {
        let mut s = Schedule { ranks, len, transfers: Vec::new() };
        s.push_reduce_scatter(0, chunk, 0, align);
        s.push_all_gather(1, chunk, ranks.saturating_sub(1), align);
        s
    }

    /// Ring reduce-scatter: afterwards rank r holds the reduced segment r.
    pub fn reduce_scatter(ranks: usize, len: usize, chunk: usize) -> Schedule {
        let mut s = Schedule { ranks, len, transfers: Vec::new() };
        s.push_reduce_scatter(1, chunk, 0, 1);
        s
    }

    /// Ring all-gather: rank r starts with segment r filled; afterwards every rank holds all.
    pub fn all_gather(ranks: usize, len: usize, chunk: usize) -> Schedule {
        let mut s = Schedule { ranks, len, transfers: Vec::new() };
        s.push_all_gather(0, chunk, 0, 1);
        s
    }

    /// Broadcast from `root` along the ring, chunk by chunk, each rank forwarding what it
    /// received to the next.
    pub fn broadcast(ranks: usize, len: usize, chunk: usize, root: usize) -> Schedule {
        let mut transfers = Vec::new();
        for hop in 0..ranks.saturating_sub(1) {
            let from = (root + hop) % ranks;
            for range in chunks(0..len, chunk) {
                transfers.push(Transfer { step: hop, from, to: (from + 1) % ranks, range, action: Action::Copy });
            }
        }
        Schedule { ranks, len, transfers }
    }

    /// Reduce-scatter steps: at step t rank r sends segment (r − t − shift) mod n.
    fn push_reduce_scatter(&mut self, shift: usize, chunk: usize, first_step: usize, align: usize) {
        let n = self.ranks;
        for t in 0..n.saturating_sub(1) {
            for from in 0..n {
                let seg = (from + 2 * n - t - shift) % n;
                for range in chunks(segment_aligned(n, self.len, seg, align), chunk) {
                    let action = Action::Reduce { last: t + 2 == n };
                    self.transfers.push(Transfer { step: first_step + t, from, to: (from + 1) % n, range, action });
                }
            }
        }
    }

    /// All-gather steps: at step t rank r sends segment (r + shift − t) mod n.
    fn push_all_gather(&mut self, shift: usize, chunk: usize, first_step: usize, align: usize) {
        let n = self.ranks;
        for t in 0..n.saturating_sub(1) {
            for from in 0..n {
                let seg = (from + shift + n - t) % n;
                for range in chunks(segment_aligned(n, self.len, seg, align), chunk) {
                    self.transfers.push(Transfer {
                        step: first_step + t,
                        from,
                        to: (from + 1) % n,
                        range,
                        action: Action::Copy,
                    });
                }
            }
        }
    }

    /// The transfers in execution groups: runs of consecutive transfers of one step over one
    /// range (an exchange), each read before any of the run writes. Ring schedules give
    /// groups of one.
    pub fn groups(&self) -> impl Iterator<Item = &[Transfer]> {
        self.transfers.chunk_by(|a, b| a.step == b.step && a.range == b.range)
    }

    /// Execute on host buffers, group by group: `reduce(dst, src, last)` for reduce
    /// transfers, a copy for the others. What the GPU executor does, without a GPU.
    pub fn run_on_host<V: Clone>(&self, buffers: &mut [Vec<V>], reduce: impl Fn(&V, &V, bool) -> V) {
        for group in self.groups() {
            let sources: Vec<Vec<V>> = group.iter().map(|t| buffers[t.from][t.range.clone()].to_vec()).collect();
            for (t, src) in group.iter().zip(sources) {
                let dst = &mut buffers[t.to][t.range.clone()];
                match t.action {
                    Action::Copy => dst.clone_from_slice(&src),
                    Action::Reduce { last } => {
                        for (d, s) in dst.iter_mut().zip(&src) {
                            *d = reduce(d, s, last);
                        }
                    }
                }
            }
        }
    }

    /// The same transfers as legs ([`crate::legs`]), the form the communicator runs: step
    /// `s` is round `s`, element ranges become byte ranges of `element_bytes`-sized elements
    /// of each rank's [`Buf::Main`](crate::legs::Buf::Main). An exchange group (one step, one
    /// range) is one round, whose legs all read before any lands.
    pub fn to_rounds(&self, element_bytes: usize) -> crate::legs::Rounds {
        use crate::legs::{Buf, Leg, LegLanding, Readers, Rounds};
        let legs = self
            .transfers
            .iter()
            .filter(|t| !t.range.is_empty())
            .map(|t| {
                let at = (Buf::Main, t.range.start * element_bytes);
                let landing = match t.action {
                    Action::Copy => LegLanding::Copy,
                    Action::Reduce { last } => LegLanding::Fold { last },
                };
                let bytes = t.range.len() * element_bytes;
                Leg { round: t.step, writer: t.from, readers: Readers::One(t.to), src: at, dst: at, bytes, landing }
            })
            .collect();
        Rounds { world: self.ranks, legs }
    }

    /// Bytes each rank sends (and receives) for `element_bytes`-sized elements.
    pub fn bytes_per_rank(&self, element_bytes: usize) -> Vec<usize> {
        let mut sent = vec![0; self.ranks];
        for t in &self.transfers {
            sent[t.from] += t.range.len() * element_bytes;
        }
        sent
    }
}

/// Which collective a schedule is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// In-place all-reduce.
    AllReduce,
    /// All-gather into buffers of n parts.
    AllGather,
    /// Reduce-scatter of buffers of n parts.
    ReduceScatter,
    /// Broadcast from `root`.
    Broadcast {
        /// The rank whose buffer everyone receives.
        root: usize,
    },
}

/// Two-rank all-reduces of up to this many bytes exchange their buffers in one step
/// ([`Schedule::all_reduce_exchange`]); larger ones run the ring, unless the environment
/// variable [`EXCHANGE_MAX_VAR`] sets another limit. The transport's one-chunk limit: below
/// it a collective is bound by latency, above it by bandwidth.
pub const EXCHANGE_MAX_BYTES: usize = SINGLE_CHUNK_MAX_BYTES;

/// The environment variable that overrides [`EXCHANGE_MAX_BYTES`] (a byte count, read once),
/// for finding where the exchange and the ring cross on a pair of cards: the limit was set on
/// one H200 with both ranks on its one link, while between processes on two H200s the
/// communicator's exchange through slots reached 0.88-0.95 of duplex at 64 MiB-1 GiB, where
/// the in-process ring reached 0.74-0.85 (benches/results/h200-x2/).
pub const EXCHANGE_MAX_VAR: &str = "GP2P_EXCHANGE_MAX_BYTES";

/// [`EXCHANGE_MAX_BYTES`], or the byte count in [`EXCHANGE_MAX_VAR`] (read once; anything
/// else is ignored, with a note on stderr).
fn exchange_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let value = std::env::var(EXCHANGE_MAX_VAR).ok();
        parse_byte_limit(EXCHANGE_MAX_VAR, value.as_deref(), EXCHANGE_MAX_BYTES, usize::MAX, "the ring runs above it")
    })
}

/// The exact schedule the entry points run for `ranks` buffers of `len` elements of `T`.
///
/// Chunks follow the transport's chunking of the whole buffer (about 32 chunks of 1 to 16
/// MiB, one chunk up to 1 MiB), or `chunk_bytes` where given: the host enqueues a few
/// driver calls per chunk, so chunks sized by the buffer keep that cost a small, fixed share
/// of the GPU time whatever the number of ranks. For all-reduce, segment boundaries fall on
/// 16 bytes so every chunk takes the kernels' vector path. The chunk size never changes the
/// order in which an element is folded, so tests and benches replay it (with any chunk) on
/// host buffers to get results folded in the GPU's order.
pub fn schedule_for<T: Element>(
    collective: Collective,
    ranks: usize,
    len: usize,
    chunk_bytes: Option<usize>,
) -> Schedule {
    let align = (REDUCE_VECTOR_BYTES / size_of::<T>()).max(1);
    let chunk = (Chunking::for_bytes(len * size_of::<T>(), chunk_bytes, None).chunk_bytes / size_of::<T>()).max(1);
    match collective {
        // Two ranks with a small buffer exchange it in one step: the ring's bytes, one trip
        // through host memory instead of two (measured on an H200, 8 B to 256 KiB: 18-38 us
        // against the ring's 26-63). Larger buffers take the ring, whose all-gather half
        // lands by DMA; the exchange folds every byte in, which costs bandwidth at 2 MiB and
        // more (zero-copy at 128 MiB: 0.63 of duplex against 0.85).
        Collective::AllReduce if ranks == 2 && len.saturating_mul(size_of::<T>()) <= exchange_max() => {
            Schedule::all_reduce_exchange(len, chunk, align)
        }
        Collective::AllReduce => Schedule::all_reduce_aligned(ranks, len, chunk.next_multiple_of(align), align),
        Collective::AllGather => Schedule::all_gather(ranks, len, chunk),
        Collective::ReduceScatter => Schedule::reduce_scatter(ranks, len, chunk),
        Collective::Broadcast { root } => Schedule::broadcast(ranks, len, chunk, root),
    }
}

/// The divisor of a reduce step: for avg, the number of ranks on the step that completes an
/// element, 1 everywhere else (the kernels' avg then just sums).
pub fn step_divisor(op: ReduceOp, last: bool, ranks: usize) -> u32 {
    if last && op == ReduceOp::Avg { ranks as u32 } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Symbolic values: how many times each rank's input went into an element, and how many
    /// times the element was completed (`last`).
    #[derive(Debug, Clone, PartialEq)]
    struct Contributions {
        counts: Vec<u32>,
        completions: u32,
    }

    fn inputs(ranks: usize, len: usize) -> Vec<Vec<Contributions>> {
        (0..ranks)
            .map(|r| {
                let mut counts = vec![0; ranks];
                counts[r] = 1;
                vec![Contributions { counts, completions: 0 }; len]
            })
            .collect()
    }

    fn fold(d: &Contributions, s: &Contributions, last: bool) -> Contributions {
        Contributions {
            counts: d.counts.iter().zip(&s.counts).map(|(a, b)| a + b).collect(),
            completions: d.completions + s.completions + u32::from(last),
        }
    }

    #[test]
    fn segments_partition_the_buffer() {
        assert_eq!((0..3).map(|s| segment(3, 10, s)).collect::<Vec<_>>(), [0..4, 4..7, 7..10]);
        assert_eq!((0..4).map(|s| segment(4, 2, s)).collect::<Vec<_>>(), [0..1, 1..2, 2..2, 2..2]);
        assert_eq!(segment(1, 5, 0), 0..5);
    }

    #[test]
    fn an_exchange_reads_both_sides_before_writing() {
        let s = Schedule::all_reduce_exchange(5, 2, 1);
        assert_eq!(s.groups().count(), 3, "one exchange per chunk");
        assert!(s.groups().all(|g| g.len() == 2 && g[0].from != g[1].from));
        let mut bufs = vec![vec![1, 2, 3, 4, 5], vec![10, 20, 30, 40, 50]];
        s.run_on_host(&mut bufs, |d, s, _| d * 100 + s);
        assert_eq!(bufs[0], [110, 220, 330, 440, 550]);
        assert_eq!(bufs[1], [1001, 2002, 3003, 4004, 5005], "rank 1 folded rank 0's input, not its result");
        assert_eq!(s.bytes_per_rank(4), Schedule::all_reduce(2, 5, 2).bytes_per_rank(4), "the ring's bytes");
    }

    #[test]
    fn ring_schedules_have_groups_of_one() {
        for s in [Schedule::all_reduce(4, 100, 7), Schedule::all_gather(3, 50, 4), Schedule::broadcast(3, 20, 8, 1)] {
            assert!(s.groups().all(|g| g.len() == 1));
        }
    }

    #[test]
    fn one_rank_has_nothing_to_send() {
        assert!(Schedule::all_reduce(1, 100, 7).transfers.is_empty());
        assert!(Schedule::broadcast(1, 100, 7, 0).transfers.is_empty());
    }

    #[test]
    fn all_reduce_moves_the_textbook_bytes() {
        // 2(n−1)/n · S per rank, for a length that divides evenly.
        let s = Schedule::all_reduce(4, 4000, 64);
        assert!(s.bytes_per_rank(4).iter().all(|&b| b == 2 * 3 * 1000 * 4));
        let s = Schedule::all_gather(4, 4000, 64);
        assert!(s.bytes_per_rank(4).iter().all(|&b| b == 3 * 1000 * 4));
    }

    proptest! {
        #[test]
        fn aligned_segments_partition_on_aligned_boundaries(ranks in 1usize..=8, len in 0usize..2000, align in 1usize..=16) {
            let mut next = 0;
            for s in 0..ranks {
                let seg = segment_aligned(ranks, len, s, align);
                prop_assert_eq!(seg.start, next);
                prop_assert!(seg.start % align == 0 || seg.start == len);
                next = seg.end;
            }
            prop_assert_eq!(next, len);
        }

        #[test]
        fn all_reduce_folds_every_input_once_into_every_rank(ranks in 1usize..=8, len in 0usize..400, chunk_units in 1usize..10, align in prop::sample::select(vec![1usize, 2, 4, 16])) {
            let chunk = chunk_units * align;
            let s = Schedule::all_reduce_aligned(ranks, len, chunk, align);
            let mut bufs = inputs(ranks, len);
            s.run_on_host(&mut bufs, fold);
            for (r, buf) in bufs.iter().enumerate() {
                for (i, v) in buf.iter().enumerate() {
                    prop_assert!(v.counts.iter().all(|&c| c == 1), "rank {} element {}: {:?}", r, i, v.counts);
                    prop_assert_eq!(v.completions, u32::from(ranks > 1), "completed exactly once");
                }
            }
            for t in &s.transfers {
                prop_assert_eq!(t.to, (t.from + 1) % ranks);
                prop_assert!(!t.range.is_empty() && t.range.len() <= chunk);
                prop_assert_eq!(t.range.start % align, 0, "chunks start aligned");
            }
        }

        #[test]
        fn exchange_folds_both_inputs_once_into_both_ranks(len in 0usize..400, chunk in 1usize..40, align in prop::sample::select(vec![1usize, 2, 4, 16])) {
            let s = Schedule::all_reduce_exchange(len, chunk, align);
            let mut bufs = inputs(2, len);
            s.run_on_host(&mut bufs, fold);
            for buf in &bufs {
                prop_assert!(buf.iter().all(|v| v.counts == [1, 1] && v.completions == 1));
            }
            for t in &s.transfers {
                prop_assert_eq!(t.to, 1 - t.from);
                prop_assert_eq!(t.range.start % align, 0, "chunks start aligned");
            }
        }

        #[test]
        fn reduce_scatter_leaves_rank_r_with_segment_r(ranks in 1usize..=8, len in 0usize..400, chunk in 1usize..40) {
            let s = Schedule::reduce_scatter(ranks, len, chunk);
            let mut bufs = inputs(ranks, len);
            s.run_on_host(&mut bufs, fold);
            for (r, buf) in bufs.iter().enumerate() {
                for i in segment(ranks, len, r) {
                    prop_assert!(buf[i].counts.iter().all(|&c| c == 1), "rank {} element {}", r, i);
                }
            }
        }

        #[test]
        fn all_gather_delivers_every_segment_everywhere(ranks in 1usize..=8, len in 0usize..400, chunk in 1usize..40) {
            let s = Schedule::all_gather(ranks, len, chunk);
            // Rank r starts with its own segment holding the value r + 1, zeros elsewhere.
            let mut bufs: Vec<Vec<usize>> = (0..ranks)
                .map(|r| (0..len).map(|i| if segment(ranks, len, r).contains(&i) { r + 1 } else { 0 }).collect())
                .collect();
            s.run_on_host(&mut bufs, |_, _, _| unreachable!("all-gather only copies"));
            for buf in &bufs {
                for seg in 0..ranks {
                    prop_assert!(buf[segment(ranks, len, seg)].iter().all(|&v| v == seg + 1));
                }
            }
        }

        #[test]
        fn broadcast_reaches_every_rank(ranks in 1usize..=8, len in 0usize..300, chunk in 1usize..40, root_seed in 0usize..8) {
            let root = root_seed % ranks;
            let s = Schedule::broadcast(ranks, len, chunk, root);
            let mut bufs: Vec<Vec<usize>> = (0..ranks).map(|r| vec![if r == root { 7 } else { 0 }; len]).collect();
            s.run_on_host(&mut bufs, |_, _, _| unreachable!("broadcast only copies"));
            prop_assert!(bufs.iter().all(|b| b.iter().all(|&v| v == 7)));
        }
    }

    #[test]
    fn two_ranks_exchange_small_buffers_and_ring_large_ones() {
        let steps = |s: &Schedule| s.transfers.iter().map(|t| t.step).max().map_or(0, |m| m + 1);
        let small = EXCHANGE_MAX_BYTES / 4;
        assert_eq!(steps(&schedule_for::<f32>(Collective::AllReduce, 2, small, None)), 1, "exchange");
        assert_eq!(steps(&schedule_for::<f32>(Collective::AllReduce, 2, small + 1, None)), 2, "ring");
        assert_eq!(steps(&schedule_for::<f32>(Collective::AllReduce, 3, 100, None)), 4, "ring for three");
    }

    #[test]
    fn only_the_completing_avg_step_divides() {
        assert_eq!(step_divisor(ReduceOp::Avg, true, 4), 4);
        assert_eq!(step_divisor(ReduceOp::Avg, false, 4), 1);
        assert_eq!(step_divisor(ReduceOp::Sum, true, 4), 1);
    }
}
