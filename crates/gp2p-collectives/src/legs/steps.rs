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
//! **Overlap within a rank.** A chunk copied out of a range this rank landed in earlier in
//! the call (the all-reduce's folded share) first waits for the last landing into that
//! range; a chunk landed into a range this rank copied out of earlier (in place) first waits
//! for the last copy out of it. The wait names a *mark*, an event recorded on the other
//! lane right after that chunk: one stream runs its steps in order, so the mark covers every
//! chunk before it too, and a lane waits only for a chunk past the last one it waited for.
//! So the all-reduce's second half copies out chunk c as soon as chunk c is folded, while
//! later chunks still land; a wait for every fold so far would hold the send lane idle
//! until the last chunk of the first half had landed and folded. Which of the two a call
//! takes is its [`LaneWaits`]: the one chunk between two ranks, every chunk so far among more.
//!
//! **Point to point among more than two ranks.** A rank not in a transfer has no steps for it,
//! and a slot's flags are kept per reader, so each writer–reader pair meets in its own order.
//! But a writer's slots serve every reader and each call starts at its first slot, so a send
//! may wait until the reader of the writer's previous call has taken that call's data: any
//! order of sends and receives works that would work if every send waited for its receive
//! (NCCL's rule, less its buffering of small sends).

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

/// What a lane's wait for the other lane names, where a chunk of its own overlaps a range
/// the other lane touched earlier in the call.
///
/// Measured on one H100 with N processes sharing its link under MPS
/// (`benches/results/h10080gbhbm3/comm-marks.txt`): waiting for the one chunk took two
/// ranks' all-reduce from 0.731 to 0.878 of its bound at 16 MiB and from 0.854 to 0.907 at
/// 64 MiB, but cost four and eight ranks 3-6 % (64 MiB among 4: 0.912 against 0.973; why is
/// not traced yet). [`LaneWaits::for_ranks`] picks by that; it was measured only with the
/// ranks sharing one link, and on cards of their own the one chunk may pay among more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneWaits {
    /// The last chunk of the other lane that overlaps (a mark recorded right after it).
    EachChunk,
    /// Every chunk the other lane has enqueued so far, where an overlapping chunk is not yet
    /// covered: one wait then covers every chunk up to there (the waits before the marks).
    AllSoFar,
}

impl LaneWaits {
    /// The waits a call among `world` ranks takes: [`LaneWaits::EachChunk`] between two,
    /// [`LaneWaits::AllSoFar`] among more (as measured; see the type).
    pub fn for_ranks(world: usize) -> LaneWaits {
        if world <= 2 { LaneWaits::EachChunk } else { LaneWaits::AllSoFar }
    }
}

/// One step of a rank's side of a call of [`Rounds`]. `leg` indexes the call's legs, `chunk`
/// counts a leg's chunks (of the call's chunk size, at most a slot), `slot` is a slot of the leg's writer (the slot
/// of that chunk), `writer` is a rank; the flags a step names are this rank's own or, for a
/// writer's slot, this rank's flag there (a flag per reader).
#[allow(missing_docs)] // the fields, named alike in every variant, are described above
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegStep {
    /// Wait until every reader's flag of this rank's `slot` is empty.
    WaitSlotFree { slot: usize },
    /// Wait until every reader's flag of this rank's slots `first..first + count` is empty:
    /// the first waits of a call's first run in one ([`first_slot_waits_together`]).
    WaitSlotsFree { first: usize, count: usize },
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
    /// Record mark `mark` of the send lane, which [`LegStep::AfterSent`] of the same mark waits
    /// for: right after the copy out (and its flags) that a later landing must follow. Marks
    /// count from 0 in each of a rank's lists; a record comes only where a wait follows.
    RecordSent { mark: usize },
    /// Wait for the send lane's mark `mark`: the copies out enqueued up to its record.
    AfterSent { mark: usize },
    /// Record mark `mark` of the receive lane, which [`LegStep::AfterLanded`] waits for:
    /// right after the landing (and its hand-back) that a later copy out must follow.
    RecordLanded { mark: usize },
    /// Wait for the receive lane's mark `mark`: the landings enqueued up to its record.
    AfterLanded { mark: usize },
}

/// A chunk's byte range within its leg: chunk `chunk` of `chunk_bytes` (at most a slot).
pub fn chunk_range(leg: &Leg, chunk: usize, chunk_bytes: usize) -> Range<usize> {
    let start = chunk * chunk_bytes;
    start..(start + chunk_bytes).min(leg.bytes)
}

/// The chunks of one leg a lane of this rank has copied out of (its source) or landed in (its
/// destination) so far: where the leg's range starts, and each chunk's place among the lane's
/// chunks, by chunk.
struct Touched {
    leg: usize,
    at: (Buf, usize),
    bytes: usize,
    places: Vec<usize>,
}

impl Touched {
    /// The latest place, in its lane, of a chunk of this leg that overlaps `[start, start +
    /// len)` of `buf`: a leg's chunks come in order, so its last overlapping chunk so far.
    fn last_overlap(&self, (buf, start): (Buf, usize), len: usize, chunk_bytes: usize) -> Option<usize> {
        let (leg_buf, leg_start) = self.at;
        let (from, to) = (start.max(leg_start), (start + len).min(leg_start + self.bytes));
        if buf != leg_buf || from >= to || self.places.is_empty() {
            return None;
        }
        let (first, last) = ((from - leg_start) / chunk_bytes, (to - 1 - leg_start) / chunk_bytes);
        let last = last.min(self.places.len() - 1);
        (first <= last).then(|| self.places[last])
    }
}

/// The latest place among `touched` of a chunk overlapping `[at, at + len)`: what a step of
/// the other lane on that range must wait for.
fn last_overlap(touched: &[Touched], at: (Buf, usize), len: usize, chunk_bytes: usize) -> Option<usize> {
    touched.iter().filter_map(|t| t.last_overlap(at, len, chunk_bytes)).max()
}

/// Note chunk `chunk` of `leg` (its range in this rank's buffers at `at`) as a lane's chunk
/// at place `place`.
fn touch(touched: &mut Vec<Touched>, leg: &Leg, i: usize, at: (Buf, usize), chunk: usize, place: usize) {
    match touched.iter_mut().find(|t| t.leg == i) {
        Some(t) => t.places.push(place),
        None => touched.push(Touched { leg: i, at, bytes: leg.bytes, places: vec![place] }),
    }
    debug_assert_eq!(touched.iter().find(|t| t.leg == i).map(|t| t.places.len()), Some(chunk + 1), "chunks in order");
}

/// The steps `rank` enqueues for `rounds`, in key order, through `slots` slots, each leg in
/// chunks of `chunk_bytes` (at most a slot's bytes). `sent` is empty for a call's first run;
/// for a run chained after others on the same streams with no join between, it holds each
/// writer's chunks those runs wrote ([`sent_after`]), and each writer's chunks go on through
/// its slots from there rather than from slot 0, which the last of those may still hold.
/// Every rank must pass the same `sent`. Waits across the lanes are placed as `waits` says.
pub fn steps(
    rounds: &Rounds,
    rank: usize,
    chunk_bytes: usize,
    slots: usize,
    sent: &[usize],
    waits: LaneWaits,
) -> Vec<(Lane, LegStep)> {
    keyed_steps(rounds, rank, chunk_bytes, slots, sent, waits).into_iter().map(|(_, lane, step)| (lane, step)).collect()
}

/// `list`, one rank's [`steps`] of a call's first run (`sent` empty, so its chunk j takes slot
/// j mod `slots`), with the waits for the slots its first chunks take made one
/// [`LegStep::WaitSlotsFree`] in place of the first, and the others of them dropped. Those
/// slots were last read in an earlier call, every step of which comes before any of this
/// call's (a rank's call starts on the GPU once its call before has ended), so no order
/// deadlocks still; the first copy out then waits for the slowest reader
/// of all of them, where each waited for its own: one wait enqueued where there were as many
/// as the slots (a kernel launch each, where the communicator waits by kernels). Unchanged
/// where the rank writes one chunk, or where the waits do not take slots 0, 1, … in turn.
pub fn first_slot_waits_together(list: Vec<(Lane, LegStep)>, slots: usize) -> Vec<(Lane, LegStep)> {
    let waited = list.iter().filter_map(|&(_, step)| match step {
        LegStep::WaitSlotFree { slot } => Some(slot),
        _ => None,
    });
    // The run of first uses: slots 0, 1, … in the order the waits come.
    let count = waited.take(slots).enumerate().take_while(|&(i, slot)| i == slot).count();
    if count < 2 {
        return list;
    }
    let mut seen = 0;
    let mut out = Vec::with_capacity(list.len() + 1 - count);
    for (lane, step) in list {
        match step {
            LegStep::WaitSlotFree { .. } if seen < count => {
                if seen == 0 {
                    out.push((lane, LegStep::WaitSlotsFree { first: 0, count }));
                }
                seen += 1;
            }
            step => out.push((lane, step)),
        }
    }
    out
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
    waits: LaneWaits,
) -> Vec<(Key, Lane, LegStep)> {
    use Lane::{Receive, Send};
    let (first_chunk, _) = first_chunks(rounds, chunk_bytes, sent);
    let slot_of = |leg: usize, chunk: usize| (first_chunk[leg] + chunk) % slots;
    let legs = &rounds.legs;
    // The steps with each wait naming the other lane's chunk it needs (its place among that
    // lane's chunks) in place of a mark, and where each chunk's steps end in the list.
    let mut out: Vec<(Key, Lane, LegStep)> = Vec::new();
    let (mut copied, mut landed): (Vec<Touched>, Vec<Touched>) = (Vec::new(), Vec::new());
    let (mut copy_ends, mut land_ends): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    // How many of the other lane's chunks each lane has waited for: a wait covers every chunk
    // of that lane before the one it names (one stream runs them in order).
    let (mut sends_covered, mut landings_covered) = (0, 0);
    let rounds_used = legs.iter().map(|l| l.round + 1).max().unwrap_or(0);
    let world = rounds.world;
    let chunks = |i: usize| legs[i].bytes.div_ceil(chunk_bytes);
    // The place a wait names, given the other lane's last overlapping chunk (not yet
    // covered) and how many chunks that lane has so far.
    let named = |overlap: usize, so_far: usize| match waits {
        LaneWaits::EachChunk => overlap,
        LaneWaits::AllSoFar => so_far - 1,
    };
    for round in 0..rounds_used {
        let in_round = || (0..legs.len()).filter(|&i| legs[i].round == round);
        let send = in_round().find(|&i| legs[i].writer == rank);
        // Landed from the nearest writer before (r − 1, r − 2, …): where every rank reads
        // every other's chunk, each reads a different writer's slot at a time.
        let mut receives: Vec<usize> = in_round().filter(|&i| legs[i].is_read_by(rank)).collect();
        receives.sort_by_key(|&i| (rank + world - legs[i].writer) % world);
        let most = send.iter().chain(&receives).map(|&i| chunks(i)).max().unwrap_or(0);
        for chunk in 0..most {
            if let Some(i) = send.filter(|&i| chunk < chunks(i)) {
                let leg = &legs[i];
                let range = chunk_range(leg, chunk, chunk_bytes);
                let src = (leg.src.0, leg.src.1 + range.start);
                // A chunk folded (or landed) into this source earlier: copy out once it is.
                if let Some(overlap) = last_overlap(&landed, src, range.len(), chunk_bytes)
                    && overlap >= landings_covered
                {
                    let place = named(overlap, land_ends.len());
                    out.push(((round, chunk, Send), Send, LegStep::AfterLanded { mark: place }));
                    landings_covered = place + 1;
                }
                let slot = slot_of(i, chunk);
                // One copy out, then its readers' flags.
                out.extend([
                    ((round, chunk, Send), Send, LegStep::WaitSlotFree { slot }),
                    ((round, chunk, Send), Send, LegStep::CopyOut { leg: i, chunk, slot }),
                    ((round, chunk, Send), Send, LegStep::MarkFull { leg: i, slot }),
                ]);
                touch(&mut copied, leg, i, leg.src, chunk, copy_ends.len());
                copy_ends.push(out.len());
            }
            for &i in receives.iter().filter(|&&i| chunk < chunks(i)) {
                let leg = &legs[i];
                let range = chunk_range(leg, chunk, chunk_bytes);
                let dst = (leg.dst.0, leg.dst.1 + range.start);
                // A chunk copied out of this destination earlier (in place): land once it is.
                if let Some(overlap) = last_overlap(&copied, dst, range.len(), chunk_bytes)
                    && overlap >= sends_covered
                {
                    let place = named(overlap, copy_ends.len());
                    out.push(((round, chunk, Receive), Receive, LegStep::AfterSent { mark: place }));
                    sends_covered = place + 1;
                }
                let (writer, slot) = (leg.writer, slot_of(i, chunk));
                out.extend([
                    ((round, chunk, Receive), Receive, LegStep::WaitFull { writer, slot }),
                    ((round, chunk, Receive), Receive, LegStep::Land { leg: i, chunk, slot }),
                    ((round, chunk, Receive), Receive, LegStep::HandBack { writer, slot }),
                ]);
                touch(&mut landed, leg, i, leg.dst, chunk, land_ends.len());
                land_ends.push(out.len());
            }
        }
    }
    with_marks(out, &copy_ends, &land_ends)
}

/// `out` with a record right after each chunk some wait names (after a landing's hand-back,
/// which a fold may wait for, and after a copy out's flags), and each wait naming its record's
/// mark: the lane's records numbered from 0 in order.
fn with_marks(out: Vec<(Key, Lane, LegStep)>, copy_ends: &[usize], land_ends: &[usize]) -> Vec<(Key, Lane, LegStep)> {
    // By chunk place: whether a wait names it, and its record's mark if one does (the count
    // of places before it that a wait names).
    let numbered = |ends: &[usize], named: &dyn Fn(&LegStep) -> Option<usize>| {
        let mut needed = vec![false; ends.len()];
        out.iter().filter_map(|(_, _, s)| named(s)).for_each(|place| needed[place] = true);
        let marks: Vec<usize> =
            needed.iter().scan(0, |next, &n| Some(std::mem::replace(next, *next + usize::from(n)))).collect();
        (needed, marks)
    };
    let (sent_needed, sent_marks) =
        numbered(copy_ends, &|s| if let LegStep::AfterSent { mark } = *s { Some(mark) } else { None });
    let (landed_needed, landed_marks) =
        numbered(land_ends, &|s| if let LegStep::AfterLanded { mark } = *s { Some(mark) } else { None });
    // Where records go: after position `end` of `out`, by position.
    let mut records: Vec<(usize, Lane, LegStep)> = Vec::new();
    for place in (0..copy_ends.len()).filter(|&p| sent_needed[p]) {
        records.push((copy_ends[place], Lane::Send, LegStep::RecordSent { mark: sent_marks[place] }));
    }
    for place in (0..land_ends.len()).filter(|&p| landed_needed[p]) {
        records.push((land_ends[place], Lane::Receive, LegStep::RecordLanded { mark: landed_marks[place] }));
    }
    records.sort_by_key(|r| r.0);
    let mut records = records.into_iter().peekable();
    let mut marked = Vec::with_capacity(out.len() + records.len());
    for (at, (key, lane, step)) in out.into_iter().enumerate() {
        let step = match step {
            LegStep::AfterSent { mark: place } => LegStep::AfterSent { mark: sent_marks[place] },
            LegStep::AfterLanded { mark: place } => LegStep::AfterLanded { mark: landed_marks[place] },
            step => step,
        };
        marked.push((key, lane, step));
        while let Some((_, lane, record)) = records.next_if(|r| r.0 == at + 1) {
            marked.push((key, lane, record));
        }
    }
    marked
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's steps in the order the in-process engine enqueues them (`exec::run_legs`
    /// sorts by key, then rank, then place in the rank's list).
    fn merged(rounds: &Rounds, slot_bytes: usize, slots: usize, waits: LaneWaits) -> Vec<(usize, LegStep)> {
        let mut all: Vec<(Key, usize, usize, LegStep)> = (0..rounds.world)
            .flat_map(|r| {
                keyed_steps(rounds, r, slot_bytes, slots, &[], waits)
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
        for (world, waits) in (3..=8).flat_map(|w| [(w, LaneWaits::EachChunk), (w, LaneWaits::AllSoFar)]) {
            let calls = calls(world, page);
            for slots in [1, 2, 3] {
                let mut content: Vec<Vec<Option<(usize, usize)>>> = vec![vec![None; slots]; world];
                let mut unread: Vec<Vec<Vec<usize>>> = vec![vec![Vec::new(); slots]; world];
                for (c, rounds) in calls.iter().enumerate() {
                    for (rank, step) in merged(rounds, page, slots, waits) {
                        let what = format!("{world} ranks, {slots} slots, {waits:?}, call {c}, rank {rank}: {step:?}");
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

    #[test]
    fn a_first_runs_first_slot_waits_become_one_where_the_first_was_and_every_other_step_stays() {
        let page = 4096;
        let mut merged_some = false;
        for world in 2..=8 {
            for slots in [2, 3, 4] {
                for (c, rounds) in calls(world, page).iter().enumerate() {
                    for rank in 0..world {
                        let what = format!("{world} ranks, {slots} slots, call {c}, rank {rank}");
                        let list = steps(rounds, rank, page, slots, &[], LaneWaits::for_ranks(world));
                        let is_wait = |s: &LegStep| matches!(s, LegStep::WaitSlotFree { .. });
                        let waited: Vec<usize> = list
                            .iter()
                            .filter_map(
                                |&(_, s)| if let LegStep::WaitSlotFree { slot } = s { Some(slot) } else { None },
                            )
                            .collect();
                        assert!(waited.iter().enumerate().all(|(j, &slot)| slot == j % slots), "{what}: {waited:?}");
                        let together = first_slot_waits_together(list.clone(), slots);
                        let count = waited.len().min(slots);
                        if count < 2 {
                            assert_eq!(together, list, "{what}");
                            continue;
                        }
                        merged_some = true;
                        let at = list.iter().position(|(_, s)| is_wait(s)).expect("a wait");
                        assert_eq!(together[at], (Lane::Send, LegStep::WaitSlotsFree { first: 0, count }), "{what}");
                        // The rest in order: the list less its first `count` waits.
                        let mut dropped = 0;
                        let rest: Vec<(Lane, LegStep)> = list
                            .iter()
                            .filter(|(_, s)| {
                                let drop = is_wait(s) && dropped < count;
                                dropped += usize::from(drop);
                                !drop
                            })
                            .copied()
                            .collect();
                        let kept: Vec<(Lane, LegStep)> = together
                            .iter()
                            .filter(|(_, s)| !matches!(s, LegStep::WaitSlotsFree { .. }))
                            .copied()
                            .collect();
                        assert_eq!(kept, rest, "{what}");
                    }
                }
            }
        }
        assert!(merged_some, "some rank writes several chunks");
        // A run that does not take slots 0, 1, … in turn is left as it is.
        let odd =
            vec![(Lane::Send, LegStep::WaitSlotFree { slot: 1 }), (Lane::Send, LegStep::WaitSlotFree { slot: 2 })];
        assert_eq!(first_slot_waits_together(odd.clone(), 3), odd);
    }

    /// Each record is waited for, after it, and its marks count 0, 1, … in order; each wait
    /// binds to a record made after the last chunk of the other lane that overlaps its own
    /// chunk (a fold before its copy out, a copy out before a landing in place), or with
    /// [`LaneWaits::AllSoFar`] after the other lane's last chunk so far: so the chunk waits
    /// for what it must, and for no more than its [`LaneWaits`] says.
    #[test]
    fn each_wait_follows_the_last_overlapping_chunk_of_the_other_lane_and_each_record_is_waited_for() {
        let page = 4096;
        for (world, mode) in (2..=8).flat_map(|w| [(w, LaneWaits::EachChunk), (w, LaneWaits::AllSoFar)]) {
            let calls = calls(world, page);
            let mut waits = 0;
            for (c, rounds) in calls.iter().enumerate() {
                for rank in 0..world {
                    let what = format!("{world} ranks, {mode:?}, call {c}, rank {rank}");
                    let list = steps(rounds, rank, page, 3, &[], mode);
                    // What a wait just before a chunk should cover: the other lane's chunks up
                    // to the last overlapping one, or all of them so far.
                    let wanted = |needed: usize, so_far: usize| match mode {
                        LaneWaits::EachChunk => needed + 1,
                        LaneWaits::AllSoFar => so_far,
                    };
                    // Where the step before was a wait: what its lane covered before it.
                    let mut waited_from: Option<usize> = None;
                    // Per lane: each chunk's range, and each record's mark with the chunks before it.
                    let (mut copied, mut landed) = (Vec::new(), Vec::new());
                    let (mut sent_records, mut landed_records): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
                    let (mut sent_waited, mut landed_waited) = (Vec::new(), Vec::new());
                    // What each lane's waits cover so far: chunks of the other lane.
                    let (mut sends_covered, mut landings_covered) = (0, 0);
                    let range = |leg: usize, chunk: usize, at: (Buf, usize)| {
                        let r = chunk_range(&rounds.legs[leg], chunk, page);
                        (at.0, at.1 + r.start, r.len())
                    };
                    // A chunk `me` of one lane, after the other lane's chunks `done` of which its
                    // waits cover `covered`: the last overlapping one is covered, and a wait just
                    // before (`waited`: what was covered before it) was needed and covers what the
                    // mode names.
                    let check = |me: (Buf, usize, usize),
                                 done: &[(Buf, usize, usize)],
                                 covered: usize,
                                 waited: Option<usize>| {
                        let (buf, at, len) = me;
                        let needed = done.iter().rposition(|&(b, a, l)| b == buf && a < at + len && at < a + l);
                        assert!(needed.is_some() || waited.is_none(), "{what}: waits before {me:?}, which needs none");
                        if let Some(needed) = needed {
                            assert!(needed < covered, "{what}: {me:?} goes before the other lane's chunk {needed}");
                            if let Some(from) = waited {
                                assert!(needed >= from, "{what}: waits before {me:?}, whose chunk was covered");
                                assert_eq!(covered, wanted(needed, done.len()), "{what}: waits for {me:?}");
                            }
                        }
                    };
                    for (_, step) in list {
                        match step {
                            LegStep::CopyOut { leg, chunk, .. } => {
                                let me = range(leg, chunk, rounds.legs[leg].src);
                                check(me, &landed, landings_covered, waited_from.take());
                                copied.push(me);
                            }
                            LegStep::Land { leg, chunk, .. } => {
                                let me = range(leg, chunk, rounds.legs[leg].dst);
                                check(me, &copied, sends_covered, waited_from.take());
                                landed.push(me);
                            }
                            LegStep::RecordSent { mark } => {
                                assert_eq!(mark, sent_records.len(), "{what}: marks in order");
                                sent_records.push(copied.len());
                            }
                            LegStep::RecordLanded { mark } => {
                                assert_eq!(mark, landed_records.len(), "{what}: marks in order");
                                landed_records.push(landed.len());
                            }
                            LegStep::AfterSent { mark } => {
                                waited_from = Some(sends_covered);
                                waited(&what, &sent_records, mark, &mut sends_covered, &mut sent_waited);
                            }
                            LegStep::AfterLanded { mark } => {
                                waited_from = Some(landings_covered);
                                waited(&what, &landed_records, mark, &mut landings_covered, &mut landed_waited);
                            }
                            _ => {}
                        }
                    }
                    waits += sent_waited.len() + landed_waited.len();
                    assert_eq!(
                        sent_waited,
                        (0..sent_records.len()).collect::<Vec<_>>(),
                        "{what}: each record waited once"
                    );
                    assert_eq!(
                        landed_waited,
                        (0..landed_records.len()).collect::<Vec<_>>(),
                        "{what}: each record waited once"
                    );
                }
            }
            assert!(waits > 0, "{world} ranks, {mode:?}: the calls wait across lanes somewhere");
        }
    }

    /// A wait for `mark` of a lane whose records each cover the chunks in `records` (by
    /// mark): the mark was made, and covers chunks past what `covered` counted; counts it.
    fn waited(what: &str, records: &[usize], mark: usize, covered: &mut usize, waited: &mut Vec<usize>) {
        let covers = records.get(mark).copied().unwrap_or_else(|| panic!("{what}: waits for mark {mark} unmade"));
        assert!(covers > *covered, "{what}: a wait that covers nothing new");
        *covered = covers;
        waited.push(mark);
    }
}
