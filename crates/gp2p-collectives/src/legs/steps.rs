//! A rank's part of a call's legs as the steps it enqueues on its two streams (a send stream
//! and a receive stream): the one pipeline both executors run, the one-process-per-GPU
//! communicator (`gp2p-comm`) with flags in shared host memory that GPU kernels wait on, and
//! the in-process [`crate::Engine`] with stream points (events) in their place. `gp2p-comm`'s
//! tests run every rank's steps on a model of the flags, slots and events, in many orders,
//! and check that every chunk lands whole, folded in the right order, and that nothing
//! deadlocks.
//!
//! **Slots and flags.** Each rank writes its chunks through its own ring of `slots` slots,
//! in the order of its legs; chunk j of a call (counting every leg of the writer) goes
//! through slot `j % slots`, so a reader knows the slot from the legs alone. Every slot has
//! a flag per reader: the writer waits until every reader's flag of the slot is empty,
//! copies the chunk in once and sets each of its readers' flags full in one step
//! ([`LegStep::MarkFull`]; a leg to every other rank has N−1 readers); each reader waits for
//! its flag to be full, lands the chunk and sets it empty ([`LegStep::HandBack`]). Whoever
//! read a slot last, and in whatever call, the next writer waits for it.
//!
//! **Order.** Each rank's steps come in the order of their [`Key`] (round, chunk, send
//! before receive; receives by writer, the nearest before first). Every wait is for a step
//! of smaller key: a reader's for the writer's send of the same round and chunk, a writer's
//! for the slot's earlier reader, and a rank's own event waits for records enqueued before.
//! So the step that has not run with the smallest key (and, among a rank's steps of one
//! key, the first in its queue) can always run, whether the GPU runs the two streams apart or
//! as one queue in the order they were enqueued: no order deadlocks. The legs must give a
//! writer at most one leg a round (every constructor of [`Rounds`] does; the legs of
//! [`crate::schedule::Schedule::to_rounds`], made for pricing, do not).
//! An executor that enqueues every rank from one thread (the engine) merges the ranks' steps
//! by key, so every record comes before the waits for it.
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

use super::{Buf, Leg, Rounds};

/// Which of a rank's two streams a step runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    /// The stream that copies chunks out of the rank's buffers into its slots.
    Send,
    /// The stream that lands other ranks' chunks.
    Receive,
}

impl Lane {
    /// The stream's name in timelines and messages: "send" or "receive".
    pub fn name(self) -> &'static str {
        match self {
            Lane::Send => "send",
            Lane::Receive => "receive",
        }
    }
}

/// A flag's value: its slot may be written (by its writer).
pub const EMPTY: u32 = 0;
/// A flag's value: its slot holds a chunk for the flag's reader.
pub const FULL: u32 = 1;

/// Where a step falls in the order every wait respects: its round, its chunk within the
/// round, and its lane (sends first).
pub type Key = (usize, usize, Lane);

/// One step of a rank's side of a call of [`Rounds`]. `leg` indexes the call's legs, `chunk`
/// counts a leg's chunks (of the call's chunk size, at most a slot), `slot` is a slot of the leg's writer (the slot
/// of that chunk), `writer` is a rank; the flags a step names are this rank's own or, for a
/// writer's slot, this rank's flag there (a flag per reader).
#[allow(missing_docs)] // the fields, named alike in every variant, are described above
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegStep {
    /// Wait until every reader's flag of this rank's `slot` is empty.
    WaitSlotFree { slot: usize },
    /// Copy chunk `chunk` of leg `leg`'s source into this rank's `slot`.
    CopyOut { leg: usize, chunk: usize, slot: usize },
    /// Set this rank's `slot`'s flag to [`FULL`] for every reader of leg `leg`: the chunk the
    /// copy out before put there is theirs to land (one write of several flags where the
    /// executor can).
    MarkFull { leg: usize, slot: usize },
    /// Set this rank's flag of `writer`'s `slot` back to [`EMPTY`]: the chunk there is landed.
    HandBack { writer: usize, slot: usize },
    /// Wait (bounded) until this rank's flag of `writer`'s `slot` is [`FULL`]: the chunk
    /// there is this rank's to land.
    WaitFull { writer: usize, slot: usize },
    /// Fold or copy `slot` of the leg's writer into chunk `chunk` of the leg's destination.
    Land { leg: usize, chunk: usize, slot: usize },
    /// Record the event [`LegStep::AfterSent`] waits for: on the send lane, after the copies out
    /// so far, and only right before a wait for it (an event a wait binds to as recorded
    /// last, so a record no wait follows would be an operation for nothing).
    RecordSent,
    /// Wait for the copies out enqueued so far.
    AfterSent,
    /// Record the event [`LegStep::AfterLanded`] waits for: on the receive lane, after the
    /// landings so far, and only right before a wait for it.
    RecordLanded,
    /// Wait for the landings enqueued so far.
    AfterLanded,
}

/// A chunk's byte range within its leg: chunk `chunk` of `chunk_bytes` (at most a slot).
pub fn chunk_range(leg: &Leg, chunk: usize, chunk_bytes: usize) -> Range<usize> {
    let start = chunk * chunk_bytes;
    start..(start + chunk_bytes).min(leg.bytes)
}

/// Whether `[a, a + a_len)` of buffer `a_buf` and `[b, b + b_len)` of `b_buf` overlap.
fn overlaps((a_buf, a): (Buf, usize), a_len: usize, (b_buf, b): (Buf, usize), b_len: usize) -> bool {
    a_buf == b_buf && a < b + b_len && b < a + a_len
}

/// The steps `rank` enqueues for `rounds`, in key order, through `slots` slots, each leg in
/// chunks of `chunk_bytes` (at most a slot's bytes). `sent` is empty for a call's first run;
/// for a run chained after others on the same streams with no join between, it holds each
/// writer's chunks those runs wrote ([`sent_after`]), and each writer's chunks go on through
/// its slots from there rather than from slot 0, which the last of those may still hold.
/// Every rank must pass the same `sent`.
pub fn steps(rounds: &Rounds, rank: usize, chunk_bytes: usize, slots: usize, sent: &[usize]) -> Vec<(Lane, LegStep)> {
    keyed_steps(rounds, rank, chunk_bytes, slots, sent).into_iter().map(|(_, lane, step)| (lane, step)).collect()
}

/// Each writer's chunks written once `rounds` (in chunks of `chunk_bytes`) have run after runs
/// that wrote `sent` ([`steps`]): the `sent` of a run chained after them.
pub fn sent_after(rounds: &Rounds, chunk_bytes: usize, sent: &[usize]) -> Vec<usize> {
    first_chunks(rounds, chunk_bytes, sent).1
}

/// Each leg's first chunk in its writer's run of chunks (which slot it takes, modulo the
/// slots), and each writer's chunks after the legs, starting from `sent` (empty: none).
fn first_chunks(rounds: &Rounds, chunk_bytes: usize, sent: &[usize]) -> (Vec<usize>, Vec<usize>) {
    debug_assert!(sent.is_empty() || sent.len() == rounds.world, "a count per writer, or none");
    let mut sent: Vec<usize> = (0..rounds.world).map(|w| sent.get(w).copied().unwrap_or(0)).collect();
    let first = rounds
        .legs
        .iter()
        .map(|leg| {
            let first = sent[leg.writer];
            sent[leg.writer] += leg.bytes.div_ceil(chunk_bytes);
            first
        })
        .collect();
    (first, sent)
}

/// [`steps`] with each step's [`Key`] (non-decreasing along the list).
pub fn keyed_steps(
    rounds: &Rounds,
    rank: usize,
    chunk_bytes: usize,
    slots: usize,
    sent: &[usize],
) -> Vec<(Key, Lane, LegStep)> {
    use Lane::{Receive, Send};
    let (first_chunk, _) = first_chunks(rounds, chunk_bytes, sent);
    let slot_of = |leg: usize, chunk: usize| (first_chunk[leg] + chunk) % slots;
    let mut out: Vec<(Key, Lane, LegStep)> = Vec::new();
    // The legs this rank has copied out of, or landed in, since the other lane last waited
    // for them: a wait binds to the latest record, so it covers every chunk enqueued before
    // it, and only a leg with chunks enqueued after that wait calls for another.
    let (mut sources, mut landed): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    // Whether a copy out, or a landing, was enqueued since that lane's last record: a wait
    // needs a record after them, which is made only where a wait follows.
    let (mut sent_unrecorded, mut landed_unrecorded) = (false, false);
    let rounds_used = rounds.legs.iter().map(|l| l.round + 1).max().unwrap_or(0);
    let world = rounds.world;
    let chunks = |i: usize| rounds.legs[i].bytes.div_ceil(chunk_bytes);
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
                let range = chunk_range(leg, chunk, chunk_bytes);
                let src = (leg.src.0, leg.src.1 + range.start);
                let after_landing = landed.iter().any(|&j: &usize| {
                    let l: &Leg = &rounds.legs[j];
                    overlaps(src, range.len(), l.dst, l.bytes)
                });
                if after_landing {
                    if std::mem::take(&mut landed_unrecorded) {
                        out.push(((round, chunk, Send), Receive, LegStep::RecordLanded));
                    }
                    out.push(((round, chunk, Send), Send, LegStep::AfterLanded));
                    landed.clear();
                }
                let slot = slot_of(i, chunk);
                // One copy out, then its readers' flags.
                out.extend([
                    ((round, chunk, Send), Send, LegStep::WaitSlotFree { slot }),
                    ((round, chunk, Send), Send, LegStep::CopyOut { leg: i, chunk, slot }),
                    ((round, chunk, Send), Send, LegStep::MarkFull { leg: i, slot }),
                ]);
                sent_unrecorded = true;
                if !sources.contains(&i) {
                    sources.push(i);
                }
            }
            for &i in receives.iter().filter(|&&i| chunk < chunks(i)) {
                let leg = &rounds.legs[i];
                let range = chunk_range(leg, chunk, chunk_bytes);
                let dst = (leg.dst.0, leg.dst.1 + range.start);
                let after_sending = sources.iter().any(|&j: &usize| {
                    let l: &Leg = &rounds.legs[j];
                    overlaps(dst, range.len(), l.src, l.bytes)
                });
                if after_sending {
                    if std::mem::take(&mut sent_unrecorded) {
                        out.push(((round, chunk, Receive), Send, LegStep::RecordSent));
                    }
                    out.push(((round, chunk, Receive), Receive, LegStep::AfterSent));
                    sources.clear();
                }
                let (writer, slot) = (leg.writer, slot_of(i, chunk));
                out.extend([
                    ((round, chunk, Receive), Receive, LegStep::WaitFull { writer, slot }),
                    ((round, chunk, Receive), Receive, LegStep::Land { leg: i, chunk, slot }),
                    ((round, chunk, Receive), Receive, LegStep::HandBack { writer, slot }),
                ]);
                landed_unrecorded = true;
                if !landed.contains(&i) {
                    landed.push(i);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's steps in the order the in-process engine enqueues them (`exec::run_legs`
    /// sorts by key, then rank, then place in the rank's list).
    fn merged(rounds: &Rounds, slot_bytes: usize, slots: usize) -> Vec<(usize, LegStep)> {
        let mut all: Vec<(Key, usize, usize, LegStep)> = (0..rounds.world)
            .flat_map(|r| {
                keyed_steps(rounds, r, slot_bytes, slots, &[])
                    .into_iter()
                    .enumerate()
                    .map(move |(i, (k, _, s))| (k, r, i, s))
            })
            .collect();
        all.sort_unstable_by_key(|&(k, r, i, _)| (k, r, i));
        all.into_iter().map(|(_, r, _, s)| (r, s)).collect()
    }

    /// Calls of every collective among `world`, in chunks of `page`: a share of several
    /// chunks, one smaller than a chunk, parts in and out of place, a broadcast from the last.
    fn calls(world: usize, page: usize) -> [Rounds; 6] {
        [
            Rounds::all_reduce(world, 3 * world * page + 5 * 8),
            Rounds::all_reduce(world, page / 2),
            Rounds::all_gather(world, 2 * page + 8, true),
            Rounds::all_gather(world, 2 * page + 8, false),
            Rounds::reduce_scatter(world, page + 8, true),
            Rounds::broadcast(world, 5 * page, world - 1),
        ]
    }

    #[test]
    fn merged_by_key_every_landing_follows_its_fill_and_every_fill_its_slots_last_readers() {
        // What stream points need of the host's order: a landing binds to the slot's latest
        // fill, which must be its own chunk's; a fill may come only once every reader of the
        // slot's last chunk has landed it (its point is what the fill waits for).
        let page = 4096;
        for world in 3..=8 {
            let calls = calls(world, page);
            for slots in [1, 2, 3] {
                let mut content: Vec<Vec<Option<(usize, usize)>>> = vec![vec![None; slots]; world];
                let mut unread: Vec<Vec<Vec<usize>>> = vec![vec![Vec::new(); slots]; world];
                for (c, rounds) in calls.iter().enumerate() {
                    for (rank, step) in merged(rounds, page, slots) {
                        let what = format!("{world} ranks, {slots} slots, call {c}, rank {rank}: {step:?}");
                        match step {
                            LegStep::CopyOut { leg, chunk, slot } => {
                                assert!(
                                    unread[rank][slot].is_empty(),
                                    "{what}: fills over readers {:?}",
                                    unread[rank][slot]
                                );
                                content[rank][slot] = Some((leg, chunk));
                                unread[rank][slot] = rounds.legs[leg].readers(world).collect();
                            }
                            LegStep::Land { leg, chunk, slot } => {
                                let writer = rounds.legs[leg].writer;
                                assert_eq!(content[writer][slot], Some((leg, chunk)), "{what}: lands another chunk");
                                let left = &mut unread[writer][slot];
                                let at = left.iter().position(|&r| r == rank);
                                assert!(at.is_some(), "{what}: lands a chunk not for it, or twice");
                                left.retain(|&r| r != rank);
                            }
                            _ => {}
                        }
                    }
                    // Every chunk of the call was landed by all its readers.
                    assert!(unread.iter().flatten().all(Vec::is_empty), "{world} ranks, {slots} slots, call {c}");
                }
            }
        }
    }

    /// A record is made only where a wait of its kind follows before the next record, and
    /// every wait binds to a record made after the last copy out (or landing) before it: so
    /// a wait covers everything its lane enqueued, as a record after every step did.
    #[test]
    fn each_record_is_waited_for_and_each_wait_covers_its_lane_s_steps_before_it() {
        let page = 4096;
        for world in 2..=8 {
            let calls = calls(world, page);
            let mut waits = 0;
            for (c, rounds) in calls.iter().enumerate() {
                for rank in 0..world {
                    let what = format!("{world} ranks, call {c}, rank {rank}");
                    let list = steps(rounds, rank, page, 3, &[]);
                    // (a step of the lane's kind since its last record, a record not yet waited for)
                    let (mut sent, mut landed) = ((false, false), (false, false));
                    for (_, step) in list {
                        match step {
                            LegStep::CopyOut { .. } => sent.0 = true,
                            LegStep::Land { .. } => landed.0 = true,
                            LegStep::RecordSent => {
                                assert!(!sent.1, "{what}: a record of sends no wait used");
                                sent = (false, true);
                            }
                            LegStep::RecordLanded => {
                                assert!(!landed.1, "{what}: a record of landings no wait used");
                                landed = (false, true);
                            }
                            LegStep::AfterSent => {
                                assert!(!sent.0 && sent.1, "{what}: a wait for sends without a record after them");
                                (sent.1, waits) = (false, waits + 1);
                            }
                            LegStep::AfterLanded => {
                                assert!(
                                    !landed.0 && landed.1,
                                    "{what}: a wait for landings without a record after them"
                                );
                                (landed.1, waits) = (false, waits + 1);
                            }
                            _ => {}
                        }
                    }
                    assert!(!sent.1 && !landed.1, "{what}: a record left without a wait");
                }
            }
            assert!(waits > 0, "{world} ranks: the calls wait across lanes somewhere");
        }
    }
}
