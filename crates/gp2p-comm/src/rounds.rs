//! The pipeline for more than two ranks: a call is a list of *legs* (plain data, built and
//! proven on host buffers in [`gp2p_collectives::legs`], with the table of what each
//! collective moves), each one rank (the writer) handing a range of one of its buffers to one
//! other rank (the reader) through the writer's slots of the segment, in *rounds*. [`steps`]
//! turns one rank's part of the legs into the steps it enqueues on its two streams, which
//! `pipeline` runs; the tests here run every rank's steps on a model of the flags, slots and
//! events, in many orders, and check that every chunk lands whole, folded in the right order,
//! and that nothing deadlocks.
//!
//! **Slots and flags.** Each rank writes its chunks through its own ring of `slots` slots,
//! in the order of its legs; chunk j of a call (counting every leg of the writer) goes
//! through slot `j % slots`, so a reader knows the slot from the legs alone. Every slot has
//! a flag per reader: the writer waits until every reader's flag of the slot is empty,
//! copies the chunk in once and sets each of its readers' flags full (a leg to every other
//! rank has N−1 readers); each reader waits for its flag to be full, lands the chunk and sets
//! it empty. Whoever read a slot last, and in whatever call, the next writer waits for it.
//!
//! **Order.** Each rank enqueues its steps in the order of their *key* (round, chunk, send
//! before receive, receives by writer: the nearest before first), on two streams. Every wait is for a step of smaller key: a reader's
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

pub(crate) use gp2p_collectives::legs::{Buf, Leg, LegLanding, Rounds};
#[cfg(test)]
pub(crate) use gp2p_collectives::legs::{SHARE_ALIGN, share};

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
    let world = rounds.world;
    let chunks = |i: usize| rounds.legs[i].bytes.div_ceil(slot_bytes);
    for round in 0..rounds_used {
        let in_round = || (0..rounds.legs.len()).filter(|&i| rounds.legs[i].round == round);
        let send = in_round().find(|&i| rounds.legs[i].writer == rank);
        // Landed from the nearest writer before (r − 1, r − 2, …): where every rank reads
        // every other's chunk, each reads a different writer's slot at a time.
        let mut receives: Vec<usize> = in_round().filter(|&i| rounds.legs[i].is_read_by(rank)).collect();
        receives.sort_by_key(|&i| (rank + world - rounds.legs[i].writer) % world);
        let most = send.iter().chain(&receives).map(|&i| chunks(i)).max().unwrap_or(0);
        for chunk in 0..most {
            if let Some(i) = send.filter(|&i| chunk < chunks(i)) {
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
                ]);
                // One copy out, a flag for each of its readers.
                let full = |reader| (Send, ManyStep::SetFlag { writer: rank, slot, reader, value: FULL });
                out.extend(leg.readers(world).map(full));
                out.push((Send, ManyStep::RecordSent));
                if !sources.contains(&i) {
                    sources.push(i);
                }
            }
            for &i in receives.iter().filter(|&&i| chunk < chunks(i)) {
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
