//! Collectives as *legs*, plain data: each leg is one rank (the writer) handing a byte range
//! of one of its buffers to one or every other rank (its readers), which copy or fold it in, in
//! numbered *rounds*. The one-process-per-GPU communicator (`gp2p-comm`) runs them, each
//! writer's chunks through its own slots of host memory; [`Rounds::run_on_host`] runs them on
//! host vectors, which the tests here check against a reference for N = 2..8; and
//! [`Schedule::to_rounds`](crate::schedule::Schedule::to_rounds) gives the in-process engine's
//! ring schedules in the same form (the engine itself still runs the ring's transfers).
//!
//! The collectives (two-shot with host memory between). A
//! leg has one reader, or every rank but its writer: the chunk the writer copies out once is
//! read by all of them, so nothing goes up twice.
//!
//! | call | legs | each card sends | each card receives |
//! | --- | --- | --- | --- |
//! | all-reduce | rounds 1..N: rank r sends share r+k of its buffer to rank r+k, which folds it into its share; round N: rank r sends its folded share to every other rank | S | 2(N−1)/N·S |
//! | reduce-scatter | the first half of the all-reduce, folding into the output | (N−1)/N·S | (N−1)/N·S |
//! | all-gather | one round: rank r sends its input to every other rank | P | (N−1)·P |
//! | broadcast | one round: the root sends the buffer to every other rank | S (root) | S |
//! | send / recv | one leg | S | S |
//!
//! Each rank folds its share in a fixed order (its own data, then ranks r−1, r−2, …), and
//! only the share's owner folds it: every rank ends with the same bits. No leg reads a range
//! another leg of its round writes.
//!
//! ```
//! use gp2p_collectives::legs::Rounds;
//!
//! // Three ranks sum 64 KiB of u64 a rank: every rank ends with the total.
//! let n = 8192;
//! let rounds = Rounds::all_reduce(3, n * 8);
//! let mut main: Vec<Vec<u64>> = (0..3).map(|r| vec![1 << r; n]).collect();
//! rounds.run_on_host(&mut main, &mut [], |acc, x, _last| acc + x);
//! assert!(main.iter().all(|b| b.iter().all(|&v| v == 7)));
//! ```

use std::ops::Range;

pub mod steps;

/// Which of a call's device buffers a leg reads or writes on its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// The buffer every call has: the all-reduce's, the gather's output, the scatter's
    /// input, the broadcast's or the send's.
    Main,
    /// The separate part of an all-gather (its input) or reduce-scatter (its output).
    Part,
}

/// What the reader does with a leg's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegLanding {
    /// Copy into the destination.
    Copy,
    /// Fold into the destination; `last`: the last fold of these elements (avg divides).
    Fold {
        /// Whether this fold completes the elements' value.
        last: bool,
    },
}

/// Who lands a leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readers {
    /// One rank.
    One(usize),
    /// Every rank but the writer, each landing the same bytes at the same offset: one copy
    /// out serves them all.
    Others,
}

/// One rank's range handed to one or every other rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leg {
    /// The round it runs in: a leg reads only what legs of earlier rounds wrote.
    pub round: usize,
    /// The rank whose buffer it reads (and whose slots carry it, between processes).
    pub writer: usize,
    /// The ranks whose buffers it lands in.
    pub readers: Readers,
    /// The writer's buffer and byte offset the leg reads.
    pub src: (Buf, usize),
    /// The reader's buffer and byte offset it lands in.
    pub dst: (Buf, usize),
    /// How many bytes.
    pub bytes: usize,
    /// Copied or folded in.
    pub landing: LegLanding,
}

impl Leg {
    /// A copy in round `round` from `writer` to every other rank.
    fn to_others(round: usize, writer: usize, src: (Buf, usize), dst: (Buf, usize), bytes: usize) -> Leg {
        Leg { round, writer, readers: Readers::Others, src, dst, bytes, landing: LegLanding::Copy }
    }

    /// Whether `rank` lands this leg.
    pub fn is_read_by(&self, rank: usize) -> bool {
        match self.readers {
            Readers::One(reader) => reader == rank,
            Readers::Others => rank != self.writer,
        }
    }

    /// The ranks that land it among `world`, from the writer's next rank on.
    pub fn readers(&self, world: usize) -> impl Iterator<Item = usize> + '_ {
        (1..world).map(move |k| (self.writer + k) % world).filter(|&r| self.is_read_by(r))
    }
}

/// One call's legs, by round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rounds {
    /// Ranks.
    pub world: usize,
    /// The legs, round by round (within a round, in the order an executor enqueues them).
    pub legs: Vec<Leg>,
}

/// Shares start on multiples of this many bytes (a multiple of every element size, and a
/// page: each share's copies start page-aligned).
pub const SHARE_ALIGN: usize = 4096;

/// Share `index` of `bytes` cut into `parts` near-equal pieces on [`SHARE_ALIGN`] boundaries
/// (the last ones may be shorter or empty).
pub fn share(parts: usize, bytes: usize, index: usize) -> Range<usize> {
    let pages = bytes.div_ceil(SHARE_ALIGN);
    let (base, extra) = (pages / parts, pages % parts);
    let first = index * base + index.min(extra);
    let last = first + base + usize::from(index < extra);
    (first * SHARE_ALIGN).min(bytes)..(last * SHARE_ALIGN).min(bytes)
}

/// [`Rounds::traffic`] of [`Rounds::all_reduce`]`(world, bytes)` without making its legs (the
/// communicator prices it on every small call): rank w, owner of share s_w, sends the other
/// shares to their owners and its folded share once, S in all; it lands N−1 folds of its share
/// and every other share, S + (N−2)·s_w; host memory sees N·S written and 2(N−1)·S read,
/// (3N−2)·S; N rounds.
pub fn all_reduce_traffic(world: usize, bytes: usize) -> crate::cost::Traffic {
    if world < 2 || bytes == 0 {
        return crate::cost::Traffic { up_bytes: 0.0, down_bytes: 0.0, host_dram_bytes: 0.0, phases: 0 };
    }
    // Shares are near-equal, the first ones the largest.
    let (n, s) = (world as f64, bytes as f64);
    crate::cost::Traffic {
        up_bytes: s,
        down_bytes: s + (n - 2.0) * share(world, bytes, 0).len() as f64,
        host_dram_bytes: (3.0 * n - 2.0) * s,
        phases: world,
    }
}

impl Rounds {
    fn new(world: usize) -> Rounds {
        Rounds { world, legs: Vec::new() }
    }

    fn push(&mut self, leg: Leg) {
        if leg.bytes > 0 && leg.readers(self.world).next().is_some() {
            self.legs.push(leg);
        }
    }

    /// Two-shot all-reduce of `bytes` in place (every rank's [`Buf::Main`]).
    pub fn all_reduce(world: usize, bytes: usize) -> Rounds {
        let mut rounds = Rounds::new(world);
        rounds.push_scatter(|reader| (Buf::Main, share(world, bytes, reader).start), |r| share(world, bytes, r));
        for writer in 0..world {
            let range = share(world, bytes, writer);
            let at = (Buf::Main, range.start);
            rounds.push(Leg::to_others(world, writer, at, at, range.len()));
        }
        rounds
    }

    /// Rounds 1..N: every writer sends share `writer + k` (its range from `range`) to that
    /// rank, which folds it at `dst(reader)`.
    fn push_scatter(&mut self, dst: impl Fn(usize) -> (Buf, usize), range: impl Fn(usize) -> Range<usize>) {
        let world = self.world;
        for k in 1..world {
            for writer in 0..world {
                let reader = (writer + k) % world;
                let range = range(reader);
                let landing = LegLanding::Fold { last: k + 1 == world };
                let (src, readers) = ((Buf::Main, range.start), Readers::One(reader));
                self.push(Leg { round: k, writer, readers, src, dst: dst(reader), bytes: range.len(), landing });
            }
        }
    }

    /// Reduce-scatter of `world` parts of `part_bytes` from [`Buf::Main`]: rank r's part r is
    /// folded into [`Buf::Part`] (which holds its own part already), or in place into its
    /// part r of [`Buf::Main`].
    pub fn reduce_scatter(world: usize, part_bytes: usize, in_place: bool) -> Rounds {
        let mut rounds = Rounds::new(world);
        let part = |r: usize| r * part_bytes..(r + 1) * part_bytes;
        let dst = |r: usize| if in_place { (Buf::Main, r * part_bytes) } else { (Buf::Part, 0) };
        rounds.push_scatter(dst, part);
        rounds
    }

    /// All-gather of `part_bytes` a rank into part r of every rank's [`Buf::Main`], from
    /// [`Buf::Part`] or, in place, from the writer's own part of [`Buf::Main`].
    pub fn all_gather(world: usize, part_bytes: usize, in_place: bool) -> Rounds {
        let mut rounds = Rounds::new(world);
        for writer in 0..world {
            let src = if in_place { (Buf::Main, writer * part_bytes) } else { (Buf::Part, 0) };
            let dst = (Buf::Main, writer * part_bytes);
            rounds.push(Leg::to_others(1, writer, src, dst, part_bytes));
        }
        rounds
    }

    /// `root`'s [`Buf::Main`] to every other rank's.
    pub fn broadcast(world: usize, bytes: usize, root: usize) -> Rounds {
        let mut rounds = Rounds::new(world);
        let at = (Buf::Main, 0);
        rounds.push(Leg::to_others(1, root, at, at, bytes));
        rounds
    }

    /// `writer`'s [`Buf::Main`] into `reader`'s.
    pub fn send(world: usize, bytes: usize, writer: usize, reader: usize) -> Rounds {
        let mut rounds = Rounds::new(world);
        let at = (Buf::Main, 0);
        let readers = Readers::One(reader);
        rounds.push(Leg { round: 0, writer, readers, src: at, dst: at, bytes, landing: LegLanding::Copy });
        rounds
    }

    /// Run on host vectors, round by round: every leg of a round reads its source before any
    /// of them lands (no leg reads what another of its round writes, so this is the order the
    /// communicator's pipeline keeps too), then copies it or folds it in with
    /// `reduce(acc, x, last)`. `main[r]` and `part[r]` are rank `r`'s buffers as vectors of `V`
    /// (byte offsets and lengths are divided by its size); `part` may be empty where no leg
    /// touches [`Buf::Part`]. What a rank keeps of its own (its part of an all-gather's output,
    /// its part of a reduce-scatter's `Buf::Part`) is the caller's to put there first, as the
    /// executors do.
    pub fn run_on_host<V: Clone>(&self, main: &mut [Vec<V>], part: &mut [Vec<V>], reduce: impl Fn(&V, &V, bool) -> V) {
        let size = std::mem::size_of::<V>().max(1);
        let elements = |at: usize, bytes: usize| at / size..(at + bytes) / size;
        let Some(last_round) = self.legs.iter().map(|l| l.round).max() else {
            return;
        };
        for round in 0..=last_round {
            let legs: Vec<&Leg> = self.legs.iter().filter(|l| l.round == round).collect();
            let sources: Vec<Vec<V>> = legs
                .iter()
                .map(|l| {
                    let from = if l.src.0 == Buf::Main { &main[l.writer] } else { &part[l.writer] };
                    from[elements(l.src.1, l.bytes)].to_vec()
                })
                .collect();
            for (l, src) in legs.iter().zip(sources) {
                for reader in l.readers(self.world) {
                    let to = if l.dst.0 == Buf::Main { &mut main[reader] } else { &mut part[reader] };
                    let dst = &mut to[elements(l.dst.1, l.bytes)];
                    match l.landing {
                        LegLanding::Copy => dst.clone_from_slice(&src),
                        LegLanding::Fold { last } => {
                            for (d, x) in dst.iter_mut().zip(&src) {
                                *d = reduce(d, x, last);
                            }
                        }
                    }
                }
            }
        }
    }

    /// What these legs move, as the cost model counts it ([`crate::cost::price`] prices it):
    /// each card's bytes up (the most any rank writes) and down (the most any rank lands),
    /// every leg written into host memory once and read once by each of its readers, and one
    /// dependent trip through host memory a round. The two-shot all-reduce of S bytes over N
    /// ranks with even shares moves S up and 2(N−1)/N·S down a card and (3N−2)·S through host
    /// memory in N rounds: the table's two-shot bytes, in N phases where the table has 2.
    pub fn traffic(&self) -> crate::cost::Traffic {
        let received = self.bytes_received();
        // Each leg written into host memory once and read once by each of its readers.
        let host: usize = self.legs.iter().map(|l| l.bytes).sum::<usize>() + received.iter().sum::<usize>();
        let mut rounds: Vec<usize> = self.legs.iter().map(|l| l.round).collect();
        rounds.sort_unstable();
        rounds.dedup();
        crate::cost::Traffic {
            up_bytes: self.bytes_sent().into_iter().max().unwrap_or(0) as f64,
            down_bytes: received.into_iter().max().unwrap_or(0) as f64,
            host_dram_bytes: host as f64,
            phases: rounds.len(),
        }
    }

    /// Bytes each rank lands (its legs as a reader).
    pub fn bytes_received(&self) -> Vec<usize> {
        let mut received = vec![0; self.world];
        for l in &self.legs {
            for reader in l.readers(self.world) {
                received[reader] += l.bytes;
            }
        }
        received
    }

    /// Bytes each rank sends (its legs as writer).
    pub fn bytes_sent(&self) -> Vec<usize> {
        let mut sent = vec![0; self.world];
        for l in &self.legs {
            sent[l.writer] += l.bytes;
        }
        sent
    }
}

#[cfg(test)]
mod point_to_point_tests;
#[cfg(test)]
mod tests;
