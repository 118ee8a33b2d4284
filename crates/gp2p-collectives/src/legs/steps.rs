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
    /// Wait until every reader's flag of this rank's slots `slot..slot + count` is empty: one
    /// slot, or the first waits of a call's first run in one ([`first_slot_waits_together`]).
    WaitSlotFree { slot: usize, count: usize },
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
/// [`LegStep::WaitSlotFree`] of them all in place of the first, and the others of them dropped. Those
/// slots were last read in an earlier call, every step of which comes before any of this
/// call's (a rank's call starts on the GPU once its call before has ended), so no order
/// deadlocks still; the first copy out then waits for the slowest reader
/// of all of them, where each waited for its own: one wait enqueued where there were as many
/// as the slots (a kernel launch each, where the communicator waits by kernels). Unchanged
/// where the rank writes one chunk, or where the waits do not take slots 0, 1, … in turn.
pub fn first_slot_waits_together(list: Vec<(Lane, LegStep)>, slots: usize) -> Vec<(Lane, LegStep)> {
    let waited = list.iter().filter_map(|&(_, step)| match step {
        LegStep::WaitSlotFree { slot, .. } => Some(slot),
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
                    out.push((lane, LegStep::WaitSlotFree { slot: 0, count }));
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
                    ((round, chunk, Send), Send, LegStep::WaitSlotFree { slot, count: 1 }),
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
mod tests;
