//! Schedules for N ranks with host memory in the middle, as plain data: one-shot and
//! two-shot all-reduce, and the reduce-scatter, all-gather and broadcast they are made of
//! (the one-shot and two-shot of custom all-reduce kernels over P2P, with host memory between).
//!
//! Without P2P every byte goes from a card to pinned host memory and from there to a card.
//! The ring ([`crate::schedule`]) makes 2(N−1) dependent trips; these make one or two:
//!
//! | schedule | each card sends | each card receives | host memory bytes | phases after the first |
//! | --- | --- | --- | --- | --- |
//! | one-shot | S | (N−1)·S | N²·S | 1 |
//! | two-shot | S | 2(N−1)/N·S | (3N−2)·S | 2 |
//!
//! Each rank owns one *host area* of the buffer's length, which only it writes and every
//! rank reads ([`Place::Host`]); its own buffer is [`Place::Device`]. A schedule is a list of
//! [`Move`]s, each run by one rank (its DMA or its kernel) in a *phase*. Two kinds of
//! dependency, and an executor must keep both:
//!
//! - Across ranks: a move reads another rank's host area only where a move of an earlier
//!   phase wrote it, so each reader waits for that writer's flag on that range and phase
//!   ([`Move::waits_for`]).
//! - Within a rank: one rank's moves of a phase run in list order (one stream, or streams
//!   joined by events in that order): two-shot's phase 1 publishes with a copy what the
//!   same rank's fold just wrote to its device buffer, which [`Move::waits_for`] does not
//!   list.
//!
//! Ranges are cut into chunks the same way in every phase, so the phases pipeline chunk by
//! chunk.
//!
//! A reducing move folds its sources *in the order listed*, which is rank order for every
//! rank: one-shot gives every rank the same bits, though each computes the sum itself.
//! Two-shot reduces each element once, on the rank that owns its share, and hands that
//! result out.
//!
//! Pure: [`HostSchedule::run_on_host`] executes a schedule on host buffers, which the tests
//! compare with a reference for N = 2..8 (proptest over lengths, chunk sizes and values).
//!
//! ```
//! use gp2p_collectives::host_schedule::HostSchedule;
//!
//! // Four ranks sum ten elements in two phases after the first: every rank gets the total.
//! let s = HostSchedule::two_shot_all_reduce(4, 10, 3, 1);
//! let mut buffers: Vec<Vec<u64>> = (0..4).map(|r| vec![1 << r; 10]).collect();
//! s.run_on_host(&mut buffers, |acc, x, _last| acc + x);
//! assert!(buffers.iter().all(|b| b.iter().all(|&v| v == 15)));
//! assert_eq!(s.phases(), 3);
//! ```

use std::ops::Range;

use crate::schedule::{Action, chunks, segment_aligned};

/// Where a move reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// Rank `r`'s own buffer, in its device memory.
    Device(usize),
    /// Rank `r`'s host area: pinned host memory of the buffer's length that rank `r` writes
    /// and every rank reads.
    Host(usize),
}

/// One move: rank `rank` reads `sources` over `range` and writes `to` over the same range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// Phase: 0 reads only the ranks' own buffers; phase p reads what phases before p wrote.
    pub phase: usize,
    /// The rank whose engine runs the move (its DMA, or its kernel reading mapped memory).
    pub rank: usize,
    /// What it reads, in the order a reduction folds them; one source for a copy.
    pub sources: Vec<Place>,
    /// What it writes (one of the sources, for a reduction in place).
    pub to: Place,
    /// Element range, the same in every place.
    pub range: Range<usize>,
    /// Copy the one source, or fold the sources in order (`last` is always true: each
    /// reducing move completes its elements).
    pub action: Action,
}

impl Move {
    /// The host areas this move reads, each with the writer whose flag for this range it
    /// must wait for: `(writer, phase the writer wrote it in)`. Only the waits across ranks:
    /// a rank's own earlier moves are ordered by running its moves in list order.
    pub fn waits_for<'a>(&'a self, schedule: &'a HostSchedule) -> impl Iterator<Item = (usize, usize)> + 'a {
        self.sources.iter().filter_map(move |place| match *place {
            Place::Host(writer) => schedule.writer_phase(writer, &self.range, self.phase),
            Place::Device(_) => None,
        })
    }
}

/// A collective over `ranks` buffers of `len` elements, as moves through host memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSchedule {
    /// Number of ranks.
    pub ranks: usize,
    /// Elements per buffer.
    pub len: usize,
    /// The moves, phase by phase; within a phase, one rank's moves run in list order.
    pub moves: Vec<Move>,
}

impl HostSchedule {
    fn new(ranks: usize, len: usize) -> HostSchedule {
        HostSchedule { ranks, len, moves: Vec::new() }
    }

    /// Rank `r`'s share: segment `r` of `len` cut into `ranks` parts on `align` boundaries.
    pub fn share(&self, r: usize, align: usize) -> Range<usize> {
        segment_aligned(self.ranks, self.len, r, align)
    }

    fn copy(&mut self, phase: usize, rank: usize, from: Place, to: Place, range: Range<usize>) {
        self.moves.push(Move { phase, rank, sources: vec![from], to, range, action: Action::Copy });
    }

    /// Rank `rank` folds every rank's data over `range`, in rank order, into `to`: its own
    /// from its device buffer, the others' from their host areas.
    fn fold(&mut self, phase: usize, rank: usize, to: Place, range: Range<usize>) {
        let sources = (0..self.ranks).map(|r| if r == rank { Place::Device(r) } else { Place::Host(r) }).collect();
        self.moves.push(Move { phase, rank, sources, to, range, action: Action::Reduce { last: true } });
    }

    /// One-shot all-reduce: every rank writes its buffer to its host area (phase 0), then
    /// folds all N in rank order into its own buffer (phase 1). For small buffers: one trip
    /// through host memory, (N−1)·S received per card.
    pub fn one_shot_all_reduce(ranks: usize, len: usize, chunk: usize) -> HostSchedule {
        let mut s = HostSchedule::new(ranks, len);
        if ranks < 2 {
            return s;
        }
        for r in 0..ranks {
            for range in chunks(0..len, chunk) {
                s.copy(0, r, Place::Device(r), Place::Host(r), range);
            }
        }
        for r in 0..ranks {
            for range in chunks(0..len, chunk) {
                s.fold(1, r, Place::Device(r), range);
            }
        }
        s
    }

    /// Two-shot all-reduce: every rank writes the other ranks' shares of its buffer to its
    /// host area (phase 0); each rank folds its own share from all N in rank order and
    /// writes the result to its host area too (phase 1); every rank copies the others'
    /// results in (phase 2). Shares fall on `align`-element boundaries.
    pub fn two_shot_all_reduce(ranks: usize, len: usize, chunk: usize, align: usize) -> HostSchedule {
        let mut s = HostSchedule::reduce_scatter_aligned(ranks, len, chunk, align);
        if ranks < 2 {
            return s;
        }
        for r in 0..ranks {
            for range in chunks(s.share(r, align), chunk) {
                s.copy(1, r, Place::Device(r), Place::Host(r), range);
            }
        }
        s.push_gather(2, chunk, align);
        s
    }

    /// Reduce-scatter: afterwards rank r's buffer holds, over its share, the fold of every
    /// rank's share r (elsewhere it is unspecified).
    pub fn reduce_scatter(ranks: usize, len: usize, chunk: usize) -> HostSchedule {
        Self::reduce_scatter_aligned(ranks, len, chunk, 1)
    }

    fn reduce_scatter_aligned(ranks: usize, len: usize, chunk: usize, align: usize) -> HostSchedule {
        let mut s = HostSchedule::new(ranks, len);
        if ranks < 2 {
            return s;
        }
        for r in 0..ranks {
            for q in (0..ranks).filter(|&q| q != r) {
                for range in chunks(s.share(q, align), chunk) {
                    s.copy(0, r, Place::Device(r), Place::Host(r), range);
                }
            }
        }
        for r in 0..ranks {
            for range in chunks(s.share(r, align), chunk) {
                s.fold(1, r, Place::Device(r), range);
            }
        }
        s
    }

    /// All-gather: rank r starts with its share filled; every rank writes its share to its
    /// host area (phase 0) and copies the others' in (phase 1).
    pub fn all_gather(ranks: usize, len: usize, chunk: usize) -> HostSchedule {
        let mut s = HostSchedule::new(ranks, len);
        if ranks < 2 {
            return s;
        }
        for r in 0..ranks {
            for range in chunks(s.share(r, 1), chunk) {
                s.copy(0, r, Place::Device(r), Place::Host(r), range);
            }
        }
        s.push_gather(1, chunk, 1);
        s
    }

    /// Broadcast: `root` writes its buffer to its host area (phase 0), every other rank
    /// copies it in (phase 1).
    pub fn broadcast(ranks: usize, len: usize, chunk: usize, root: usize) -> HostSchedule {
        let mut s = HostSchedule::new(ranks, len);
        if ranks < 2 {
            return s;
        }
        for range in chunks(0..len, chunk) {
            s.copy(0, root, Place::Device(root), Place::Host(root), range);
        }
        for r in (0..ranks).filter(|&r| r != root) {
            for range in chunks(0..len, chunk) {
                s.copy(1, r, Place::Host(root), Place::Device(r), range);
            }
        }
        s
    }

    /// Every rank copies every other rank's share from that rank's host area.
    fn push_gather(&mut self, phase: usize, chunk: usize, align: usize) {
        for r in 0..self.ranks {
            for q in (0..self.ranks).filter(|&q| q != r) {
                for range in chunks(self.share(q, align), chunk) {
                    self.copy(phase, r, Place::Host(q), Place::Device(r), range);
                }
            }
        }
    }

    /// The number of phases (dependent trips through host memory, plus the first write).
    pub fn phases(&self) -> usize {
        self.moves.iter().map(|m| m.phase + 1).max().unwrap_or(0)
    }

    /// The latest phase before `before` in which `writer` wrote its host area over a range
    /// that overlaps `range`.
    fn writer_phase(&self, writer: usize, range: &Range<usize>, before: usize) -> Option<(usize, usize)> {
        self.moves
            .iter()
            .filter(|m| m.phase < before && m.rank == writer && m.to == Place::Host(writer))
            .filter(|m| m.range.start < range.end && range.start < m.range.end)
            .map(|m| m.phase)
            .max()
            .map(|phase| (writer, phase))
    }

    /// Bytes each rank's link carries, `(up, down)` per rank (device to host, host to
    /// device), for `element_bytes`-sized elements. A fold reads its own device data
    /// without crossing the link.
    pub fn link_bytes(&self, element_bytes: usize) -> Vec<(usize, usize)> {
        let mut bytes = vec![(0, 0); self.ranks];
        for m in &self.moves {
            let n = m.range.len() * element_bytes;
            if let Place::Host(_) = m.to {
                bytes[m.rank].0 += n;
            }
            let from_host = m.sources.iter().filter(|p| matches!(p, Place::Host(_))).count();
            bytes[m.rank].1 += from_host * n;
        }
        bytes
    }

    /// Bytes of host memory written and read, all ranks together.
    pub fn host_memory_bytes(&self, element_bytes: usize) -> usize {
        self.link_bytes(element_bytes).iter().map(|(up, down)| up + down).sum()
    }

    /// Execute on host buffers (one per rank, `len` elements), phase by phase: copies as
    /// copies, folds as `reduce(acc, next, last)` over the sources in order. What a GPU
    /// executor does, without a GPU.
    pub fn run_on_host<V: Clone>(&self, buffers: &mut [Vec<V>], reduce: impl Fn(&V, &V, bool) -> V) {
        let mut host: Vec<Vec<Option<V>>> = vec![vec![None; self.len]; self.ranks];
        for phase in 0..self.phases() {
            // Reads of a phase see what earlier phases wrote: run each rank's moves in order
            // on a snapshot of the host areas as they were at the phase's start, so no move
            // can read a host write of its own phase (which an executor could not order).
            let snapshot = host.clone();
            for m in self.moves.iter().filter(|m| m.phase == phase) {
                let read = |place: Place, i: usize, buffers: &[Vec<V>]| -> V {
                    match place {
                        Place::Device(r) => buffers[r][i].clone(),
                        Place::Host(r) => snapshot[r][i].clone().unwrap_or_else(|| {
                            panic!("phase {phase}: rank {} reads host area {r} at {i} before anyone wrote it", m.rank)
                        }),
                    }
                };
                for i in m.range.clone() {
                    let value = match m.action {
                        Action::Copy => read(m.sources[0], i, buffers),
                        Action::Reduce { .. } => {
                            let mut acc = read(m.sources[0], i, buffers);
                            for (k, &place) in m.sources.iter().enumerate().skip(1) {
                                acc = reduce(&acc, &read(place, i, buffers), k + 1 == m.sources.len());
                            }
                            acc
                        }
                    };
                    match m.to {
                        Place::Device(r) => buffers[r][i] = value,
                        Place::Host(r) => host[r][i] = Some(value),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Inputs where a wrong fold order or a lost or doubled term shows: rank r element i is
    /// a distinct power-of-two-weighted value, and the fold records its order.
    fn inputs(ranks: usize, len: usize) -> Vec<Vec<u64>> {
        (0..ranks).map(|r| (0..len).map(|i| (i as u64 * 131 + 7) << (4 * r)).collect()).collect()
    }

    fn sum(inputs: &[Vec<u64>]) -> Vec<u64> {
        (0..inputs[0].len()).map(|i| inputs.iter().map(|b| b[i]).sum()).collect()
    }

    #[test]
    fn one_shot_gives_every_rank_the_sum_folded_in_rank_order() {
        for ranks in 2..=8 {
            for len in [0, 1, 5, 7, 64, 1001] {
                let ins = inputs(ranks, len);
                let mut bufs = ins.clone();
                HostSchedule::one_shot_all_reduce(ranks, len, 3).run_on_host(&mut bufs, |a, b, _| a + b);
                assert!(bufs.iter().all(|b| *b == sum(&ins)), "ranks {ranks} len {len}");
                // Order: a fold that records its sources shows rank order on every rank.
                let mut order: Vec<Vec<Vec<usize>>> = (0..ranks).map(|r| vec![vec![r]; len]).collect();
                HostSchedule::one_shot_all_reduce(ranks, len, 3)
                    .run_on_host(&mut order, |a, b, _| a.iter().chain(b).copied().collect());
                let ranks_in_order: Vec<usize> = (0..ranks).collect();
                assert!(order.iter().flatten().all(|o| *o == ranks_in_order), "ranks {ranks} len {len}");
            }
        }
    }

    #[test]
    fn two_shot_reduces_each_element_once_and_hands_the_result_out() {
        for ranks in 2..=8 {
            for len in [0, 1, 3, 7, 8, 63, 1001] {
                let ins = inputs(ranks, len);
                let mut bufs = ins.clone();
                let s = HostSchedule::two_shot_all_reduce(ranks, len, 4, 1);
                s.run_on_host(&mut bufs, |a, b, _| a + b);
                assert!(bufs.iter().all(|b| *b == sum(&ins)), "ranks {ranks} len {len}");
                assert_eq!(s.phases(), if len == 0 { 0 } else { 3 });
                // Every rank's value of an element is the one fold its share's owner made.
                let mut folds: Vec<Vec<Vec<usize>>> = (0..ranks).map(|r| vec![vec![r]; len]).collect();
                s.run_on_host(&mut folds, |a, b, _| a.iter().chain(b).copied().collect());
                assert!(folds.iter().flatten().all(|o| *o == (0..ranks).collect::<Vec<_>>()));
            }
        }
    }

    #[test]
    fn reduce_scatter_all_gather_and_broadcast_leave_what_they_promise() {
        for ranks in 2..=8 {
            let len = 37;
            let ins = inputs(ranks, len);
            let total = sum(&ins);
            let mut bufs = ins.clone();
            let rs = HostSchedule::reduce_scatter(ranks, len, 5);
            rs.run_on_host(&mut bufs, |a, b, _| a + b);
            for (r, b) in bufs.iter().enumerate() {
                assert_eq!(b[rs.share(r, 1)], total[rs.share(r, 1)], "reduce_scatter rank {r} of {ranks}");
            }
            let ag = HostSchedule::all_gather(ranks, len, 5);
            let mut parts: Vec<Vec<u64>> = (0..ranks)
                .map(|r| (0..len).map(|i| if ag.share(r, 1).contains(&i) { ins[r][i] } else { 0 }).collect())
                .collect();
            ag.run_on_host(&mut parts, |a, b, _| a + b);
            let whole: Vec<u64> =
                (0..len).map(|i| ins[(0..ranks).find(|&r| ag.share(r, 1).contains(&i)).unwrap()][i]).collect();
            assert!(parts.iter().all(|p| *p == whole), "all_gather of {ranks}");
            for root in [0, ranks - 1] {
                let mut bufs = ins.clone();
                HostSchedule::broadcast(ranks, len, 5, root).run_on_host(&mut bufs, |a, b, _| a + b);
                assert!(bufs.iter().all(|b| *b == ins[root]), "broadcast from {root} of {ranks}");
            }
        }
    }

    #[test]
    fn the_bytes_moved_are_the_table_in_the_module_docs() {
        // S = 8 ranks x 1024 elements of 4 bytes, shares equal: the formulas hold exactly.
        for ranks in 2..=8 {
            let len = ranks * 1024;
            let s = len * 4;
            let one = HostSchedule::one_shot_all_reduce(ranks, len, 256);
            assert!(one.link_bytes(4).iter().all(|&(up, down)| up == s && down == (ranks - 1) * s));
            assert_eq!(one.host_memory_bytes(4), ranks * ranks * s);
            assert_eq!(one.phases(), 2);
            let two = HostSchedule::two_shot_all_reduce(ranks, len, 256, 1);
            assert!(two.link_bytes(4).iter().all(|&(up, down)| up == s && down == 2 * (ranks - 1) * s / ranks));
            assert_eq!(two.host_memory_bytes(4), (3 * ranks - 2) * s);
            assert_eq!(two.phases(), 3);
        }
    }

    #[test]
    fn the_schedules_move_what_the_cost_model_prices() {
        use crate::cost::{Algorithm, traffic};
        // Equal shares (len a multiple of N): the schedules' counted bytes are the model's.
        for ranks in 2..=8 {
            let len = ranks * 512;
            let bytes = len * 4;
            for (algorithm, schedule) in [
                (Algorithm::OneShot, HostSchedule::one_shot_all_reduce(ranks, len, 100)),
                (Algorithm::TwoShot, HostSchedule::two_shot_all_reduce(ranks, len, 100, 1)),
            ] {
                let priced = traffic(algorithm, ranks, bytes);
                for &(up, down) in &schedule.link_bytes(4) {
                    assert_eq!(up as f64, priced.up_bytes, "{algorithm:?} up, {ranks} ranks");
                    assert_eq!(down as f64, priced.down_bytes, "{algorithm:?} down, {ranks} ranks");
                }
                assert_eq!(schedule.host_memory_bytes(4) as f64, priced.host_dram_bytes, "{algorithm:?}");
                // The model counts the trips after the first write.
                assert_eq!(schedule.phases() - 1, priced.phases, "{algorithm:?}");
            }
        }
    }

    #[test]
    fn every_host_read_waits_for_the_writer_of_that_range_in_an_earlier_phase() {
        for ranks in 2..=8 {
            let s = HostSchedule::two_shot_all_reduce(ranks, 101, 7, 1);
            for m in &s.moves {
                let hosts = m.sources.iter().filter(|p| matches!(p, Place::Host(_))).count();
                let waits: Vec<(usize, usize)> = m.waits_for(&s).collect();
                assert_eq!(waits.len(), hosts, "{m:?}");
                assert!(waits.iter().all(|&(_, phase)| phase < m.phase), "{m:?}");
                // The gather reads results (phase 1), not the inputs of phase 0.
                if m.phase == 2 {
                    assert!(waits.iter().all(|&(_, phase)| phase == 1), "{m:?}");
                }
            }
        }
    }

    /// Every rank's result of one-shot and two-shot for every op over fresh random `T`s
    /// equals the kernels' CPU reference folded in rank order (x0, then x1, …, avg dividing
    /// at the last step), bit for bit: what the GPU executors must reproduce.
    fn every_op_matches_the_kernel_reference<T>(ranks: usize, len: usize, chunk: usize, seed: u64)
    where
        T: gp2p_kernels::reference::Reference + PartialEq + std::fmt::Debug,
    {
        use gp2p_kernels::ReduceOp;
        use gp2p_kernels::reference::fill_random;

        use crate::schedule::step_divisor;
        let inputs: Vec<Vec<T>> = (0..ranks)
            .map(|r| {
                let mut v = vec![T::from_byte(0); len];
                fill_random(&mut v, seed ^ (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                v
            })
            .collect();
        // Equal, or both NaN (a product of random values may overflow to one).
        #[allow(clippy::eq_op)]
        let same = |a: &T, b: &T| a == b || (a != a && b != b);
        for op in ReduceOp::ALL {
            let want: Vec<T> = (0..len)
                .map(|i| {
                    (1..ranks).fold(inputs[0][i], |acc, r| {
                        T::reference(acc, inputs[r][i], op, step_divisor(op, r + 1 == ranks, ranks))
                    })
                })
                .collect();
            for s in [
                HostSchedule::one_shot_all_reduce(ranks, len, chunk),
                HostSchedule::two_shot_all_reduce(ranks, len, chunk, 4),
            ] {
                let mut bufs = inputs.clone();
                s.run_on_host(&mut bufs, |a, b, last| T::reference(*a, *b, op, step_divisor(op, last, ranks)));
                for (r, b) in bufs.iter().enumerate() {
                    let wrong = b.iter().zip(&want).position(|(got, want)| !same(got, want));
                    assert!(wrong.is_none(), "{op:?}, {ranks} ranks, rank {r}: element {wrong:?} of {len}");
                }
            }
        }
    }

    proptest! {
        // Ten dtypes, five ops and two schedules a case: fewer cases keep it a second or two.
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn every_op_and_dtype_matches_the_kernels_reference(
            ranks in 2usize..=8,
            len in 0usize..130,
            chunk in 1usize..40,
            seed in any::<u64>(),
        ) {
            use gp2p_kernels::half::{bf16, f16};
            every_op_matches_the_kernel_reference::<f32>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<f64>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<f16>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<bf16>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<i8>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<u8>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<i32>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<u32>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<i64>(ranks, len, chunk, seed);
            every_op_matches_the_kernel_reference::<u64>(ranks, len, chunk, seed);
        }
    }

    proptest! {
        #[test]
        fn every_schedule_matches_the_reference(
            ranks in 2usize..=8,
            len in 0usize..300,
            chunk in 1usize..64,
            align in prop::sample::select(vec![1usize, 2, 4, 8]),
            seed in any::<u64>(),
        ) {
            let ins: Vec<Vec<u64>> = (0..ranks)
                .map(|r| (0..len).map(|i| (seed ^ (r as u64 * 0x9E37_79B9) ^ i as u64) % 1000).collect())
                .collect();
            let total = sum(&ins);
            for s in [
                HostSchedule::one_shot_all_reduce(ranks, len, chunk),
                HostSchedule::two_shot_all_reduce(ranks, len, chunk, align),
            ] {
                let mut bufs = ins.clone();
                s.run_on_host(&mut bufs, |a, b, _| a + b);
                prop_assert!(bufs.iter().all(|b| *b == total));
                // Every element's value comes from exactly one fold, whose last step (and only
                // that one) says so: avg divides there once.
                let mut lasts: Vec<Vec<u32>> = (0..ranks).map(|_| vec![0; len]).collect();
                s.run_on_host(&mut lasts, |a, _, last| a + u32::from(last));
                prop_assert!(lasts.iter().flatten().all(|&n| n == 1));
            }
        }
    }
}
