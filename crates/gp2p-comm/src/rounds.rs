//! The pipeline for more than two ranks as data: a call is a list of *legs*, each one rank
//! (the writer) handing a range of one of its buffers to one other rank (the reader) through
//! the writer's slots of the segment, in *rounds*. [`steps`] turns one rank's part of the
//! legs into the steps it enqueues on its two streams, which `pipeline` runs; the tests here
//! run every rank's steps on a model of the flags, slots and events, in many orders, and
//! check that every chunk lands whole, folded in the right order, and that nothing deadlocks.
//!
//! The collectives (reference/many-cards-facts.md §4, two-shot with host memory between):
//!
//! | call | legs | each card sends | each card receives |
//! | --- | --- | --- | --- |
//! | all-reduce | rounds 1..N: rank r sends share r+k of its buffer to rank r+k, which folds it into its share; rounds N..2N-1: rank r sends its folded share to rank r+k | 2(N−1)/N·S | 2(N−1)/N·S |
//! | reduce-scatter | the first half of the all-reduce, folding into the output | (N−1)/N·S | (N−1)/N·S |
//! | all-gather | the second half, from the input | (N−1)·P | (N−1)·P |
//! | broadcast | the root sends the buffer to rank root+k in round k | (N−1)·S (root) | S |
//! | send / recv | one leg | S | S |
//!
//! Each rank folds its share in a fixed order (its own data, then ranks r−1, r−2, …), and
//! only the share's owner folds it: every rank ends with the same bits.
//!
//! **Slots and flags.** Each rank writes its chunks through its own ring of `slots` slots,
//! in the order of its legs; chunk j of a call (counting every leg of the writer) goes
//! through slot `j % slots`, so a reader knows the slot from the legs alone. Every slot has
//! a flag per reader: the writer waits until every reader's flag of the slot is empty,
//! copies the chunk in and sets its reader's flag full; the reader waits for its flag to be
//! full, lands the chunk and sets it empty. Whoever read a slot last, and in whatever call,
//! the next writer waits for it.
//!
//! **Order.** Each rank enqueues its steps in the order of their *key* (round, chunk, send
//! before receive), on two streams. Every wait is for a step of smaller key: a reader's
//! for the writer's send of the same key, a writer's for the slot's earlier reader, and a
//! rank's own event waits for records enqueued before. So the step of smallest key that has
//! not run can always run, whether the GPU runs the two streams apart or as one queue in the
//! order they were enqueued: no order deadlocks.
//!
//! **Overlap within a rank.** A send whose source overlaps a range this rank landed earlier
//! in the call (the all-reduce's folded share) first waits for this rank's landings so far;
//! a landing into a range this rank sent from earlier in the call (in place) first waits for
//! its sends so far. One wait covers everything enqueued before it, so a lane waits again
//! only for chunks enqueued since: the all-reduce's second half waits once, at its start,
//! and then copies out chunk c + 1 while chunk c lands.
//!
//! **Point to point among more than two ranks.** A writer's slots serve every reader, so a
//! send may wait until the reader of an earlier call's chunk has taken it: every rank must
//! make its sends and receives (and collectives) in one order that all ranks agree on, as if
//! every call involved every rank.

use std::ops::Range;

use crate::handshake::{EMPTY, FULL, Lane};

/// Which of a call's device buffers a leg reads or writes on its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buf {
    /// The buffer every call has: the all-reduce's, the gather's output, the scatter's
    /// input, the broadcast's or the send's.
    Main,
    /// The separate part of an all-gather (its input) or reduce-scatter (its output).
    Part,
}

/// What the reader does with a leg's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LegLanding {
    Copy,
    /// Fold into the destination; `last`: the last fold of these elements (avg divides).
    Fold {
        last: bool,
    },
}

/// One rank's range handed to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leg {
    pub(crate) round: usize,
    pub(crate) writer: usize,
    pub(crate) reader: usize,
    /// The writer's buffer and byte offset the leg reads.
    pub(crate) src: (Buf, usize),
    /// The reader's buffer and byte offset it lands in.
    pub(crate) dst: (Buf, usize),
    pub(crate) bytes: usize,
    pub(crate) landing: LegLanding,
}

/// One call's legs, by round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rounds {
    pub(crate) world: usize,
    pub(crate) legs: Vec<Leg>,
}

/// Shares start on multiples of this many bytes (a multiple of every element size, and a
/// page: each share's copies start page-aligned).
pub(crate) const SHARE_ALIGN: usize = 4096;

/// Share `index` of `bytes` cut into `parts` near-equal pieces on [`SHARE_ALIGN`] boundaries
/// (the last ones may be shorter or empty).
pub(crate) fn share(parts: usize, bytes: usize, index: usize) -> Range<usize> {
    let pages = bytes.div_ceil(SHARE_ALIGN);
    let (base, extra) = (pages / parts, pages % parts);
    let first = index * base + index.min(extra);
    let last = first + base + usize::from(index < extra);
    (first * SHARE_ALIGN).min(bytes)..(last * SHARE_ALIGN).min(bytes)
}

impl Rounds {
    fn new(world: usize) -> Rounds {
        Rounds { world, legs: Vec::new() }
    }

    fn push(&mut self, leg: Leg) {
        if leg.bytes > 0 {
            self.legs.push(leg);
        }
    }

    /// Two-shot all-reduce of `bytes` in place (every rank's [`Buf::Main`]).
    pub(crate) fn all_reduce(world: usize, bytes: usize) -> Rounds {
        let mut rounds = Rounds::new(world);
        rounds.push_scatter(|reader| (Buf::Main, share(world, bytes, reader).start), |r| share(world, bytes, r));
        for k in 1..world {
            for writer in 0..world {
                let reader = (writer + k) % world;
                let range = share(world, bytes, writer);
                let at = (Buf::Main, range.start);
                let landing = LegLanding::Copy;
                rounds.push(Leg {
                    round: world - 1 + k,
                    writer,
                    reader,
                    src: at,
                    dst: at,
                    bytes: range.len(),
                    landing,
                });
            }
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
                let src = (Buf::Main, range.start);
                self.push(Leg { round: k, writer, reader, src, dst: dst(reader), bytes: range.len(), landing });
            }
        }
    }

    /// Reduce-scatter of `world` parts of `part_bytes` from [`Buf::Main`]: rank r's part r is
    /// folded into [`Buf::Part`] (which holds its own part already), or in place into its
    /// part r of [`Buf::Main`].
    pub(crate) fn reduce_scatter(world: usize, part_bytes: usize, in_place: bool) -> Rounds {
        let mut rounds = Rounds::new(world);
        let part = |r: usize| r * part_bytes..(r + 1) * part_bytes;
        let dst = |r: usize| if in_place { (Buf::Main, r * part_bytes) } else { (Buf::Part, 0) };
        rounds.push_scatter(dst, part);
        rounds
    }

    /// All-gather of `part_bytes` a rank into part r of every rank's [`Buf::Main`], from
    /// [`Buf::Part`] or, in place, from the writer's own part of [`Buf::Main`].
    pub(crate) fn all_gather(world: usize, part_bytes: usize, in_place: bool) -> Rounds {
        let mut rounds = Rounds::new(world);
        for k in 1..world {
            for writer in 0..world {
                let reader = (writer + k) % world;
                let src = if in_place { (Buf::Main, writer * part_bytes) } else { (Buf::Part, 0) };
                let dst = (Buf::Main, writer * part_bytes);
                rounds.push(Leg { round: k, writer, reader, src, dst, bytes: part_bytes, landing: LegLanding::Copy });
            }
        }
        rounds
    }

    /// `root`'s [`Buf::Main`] to every other rank's, one rank a round.
    pub(crate) fn broadcast(world: usize, bytes: usize, root: usize) -> Rounds {
        let mut rounds = Rounds::new(world);
        for k in 1..world {
            let at = (Buf::Main, 0);
            let reader = (root + k) % world;
            rounds.push(Leg { round: k, writer: root, reader, src: at, dst: at, bytes, landing: LegLanding::Copy });
        }
        rounds
    }

    /// `writer`'s [`Buf::Main`] into `reader`'s.
    pub(crate) fn send(world: usize, bytes: usize, writer: usize, reader: usize) -> Rounds {
        let mut rounds = Rounds::new(world);
        let at = (Buf::Main, 0);
        rounds.push(Leg { round: 0, writer, reader, src: at, dst: at, bytes, landing: LegLanding::Copy });
        rounds
    }
}

/// One step of a rank's side of a call of [`Rounds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManyStep {
    /// Wait until every reader's flag of this rank's `slot` is empty.
    WaitSlotFree { slot: usize },
    /// Copy chunk `chunk` of leg `leg`'s source into this rank's `slot`.
    CopyOut { leg: usize, chunk: usize, slot: usize },
    /// Set `reader`'s flag of `writer`'s `slot` to `value`.
    SetFlag { writer: usize, slot: usize, reader: usize, value: u32 },
    /// Wait (bounded) until `reader`'s flag of `writer`'s `slot` is `value`.
    WaitFlag { writer: usize, slot: usize, reader: usize, value: u32 },
    /// Fold or copy `slot` of the leg's writer into chunk `chunk` of the leg's destination.
    Land { leg: usize, chunk: usize, slot: usize },
    /// Record the event [`ManyStep::AfterSent`] waits for (after a copy out).
    RecordSent,
    /// Wait for the copies out enqueued so far.
    AfterSent,
    /// Record the event [`ManyStep::AfterLanded`] waits for (after a landing).
    RecordLanded,
    /// Wait for the landings enqueued so far.
    AfterLanded,
}

/// A chunk's byte range within its leg: chunk `chunk` of `slot_bytes`.
pub(crate) fn chunk_range(leg: &Leg, chunk: usize, slot_bytes: usize) -> Range<usize> {
    let start = chunk * slot_bytes;
    start..(start + slot_bytes).min(leg.bytes)
}

/// Whether `[a, a + a_len)` of buffer `a_buf` and `[b, b + b_len)` of `b_buf` overlap.
fn overlaps((a_buf, a): (Buf, usize), a_len: usize, (b_buf, b): (Buf, usize), b_len: usize) -> bool {
    a_buf == b_buf && a < b + b_len && b < a + a_len
}

/// The steps `rank` enqueues for `rounds`, in key order, with `slots` slots of `slot_bytes`.
pub(crate) fn steps(rounds: &Rounds, rank: usize, slot_bytes: usize, slots: usize) -> Vec<(Lane, ManyStep)> {
    use Lane::{Receive, Send};
    // Each writer's chunks in order: the slot of the first chunk of each leg.
    let mut first_slot = vec![0; rounds.legs.len()];
    let mut sent = vec![0usize; rounds.world];
    for (i, leg) in rounds.legs.iter().enumerate() {
        first_slot[i] = sent[leg.writer];
        sent[leg.writer] += leg.bytes.div_ceil(slot_bytes);
    }
    let slot_of = |leg: usize, chunk: usize| (first_slot[leg] + chunk) % slots;
    let mut out = Vec::new();
    // The legs this rank has copied out of, or landed in, since the other lane last waited
    // for them: a wait binds to the latest record, so it covers every chunk enqueued before
    // it, and only a leg with chunks enqueued after that wait calls for another.
    let (mut sources, mut landed): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let rounds_used = rounds.legs.iter().map(|l| l.round + 1).max().unwrap_or(0);
    for round in 0..rounds_used {
        let find = |mine: &dyn Fn(&Leg) -> bool| rounds.legs.iter().position(|l| l.round == round && mine(l));
        let send = find(&|l| l.writer == rank);
        let receive = find(&|l| l.reader == rank);
        let chunks = |leg: Option<usize>| leg.map_or(0, |i| rounds.legs[i].bytes.div_ceil(slot_bytes));
        for chunk in 0..chunks(send).max(chunks(receive)) {
            if let Some(i) = send.filter(|&i| chunk < chunks(Some(i))) {
                let leg = &rounds.legs[i];
                let range = chunk_range(leg, chunk, slot_bytes);
                let src = (leg.src.0, leg.src.1 + range.start);
                let after_landing = landed.iter().any(|&j: &usize| {
                    let l: &Leg = &rounds.legs[j];
                    overlaps(src, range.len(), l.dst, l.bytes)
                });
                if after_landing {
                    out.push((Send, ManyStep::AfterLanded));
                    landed.clear();
                }
                let slot = slot_of(i, chunk);
                out.extend([
                    (Send, ManyStep::WaitSlotFree { slot }),
                    (Send, ManyStep::CopyOut { leg: i, chunk, slot }),
                    (Send, ManyStep::SetFlag { writer: rank, slot, reader: leg.reader, value: FULL }),
                    (Send, ManyStep::RecordSent),
                ]);
                if !sources.contains(&i) {
                    sources.push(i);
                }
            }
            if let Some(i) = receive.filter(|&i| chunk < chunks(Some(i))) {
                let leg = &rounds.legs[i];
                let range = chunk_range(leg, chunk, slot_bytes);
                let dst = (leg.dst.0, leg.dst.1 + range.start);
                let after_sending = sources.iter().any(|&j: &usize| {
                    let l: &Leg = &rounds.legs[j];
                    overlaps(dst, range.len(), l.src, l.bytes)
                });
                if after_sending {
                    out.push((Receive, ManyStep::AfterSent));
                    sources.clear();
                }
                let (writer, slot) = (leg.writer, slot_of(i, chunk));
                out.extend([
                    (Receive, ManyStep::WaitFlag { writer, slot, reader: rank, value: FULL }),
                    (Receive, ManyStep::Land { leg: i, chunk, slot }),
                    (Receive, ManyStep::SetFlag { writer, slot, reader: rank, value: EMPTY }),
                    (Receive, ManyStep::RecordLanded),
                ]);
                if !landed.contains(&i) {
                    landed.push(i);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
