//! A model of the segment's slots and flags and of each rank's events, which runs every rank's
//! steps in an order it is given, and the calls it runs them on.

use std::collections::VecDeque;

use super::super::*;
use crate::handshake::{EMPTY, FULL, Lane};

/// One call of the model: its legs, and its buffers' lengths in bytes (one byte is one
/// element here).
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub(super) rounds: Rounds,
    pub(super) main: usize,
    pub(super) part: usize,
    pub(super) kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    AllReduce,
    ReduceScatter { in_place: bool },
    AllGather { in_place: bool },
    Broadcast { root: usize },
    Send { writer: usize, reader: usize },
}

impl Call {
    pub(super) fn new(world: usize, kind: Kind, bytes: usize) -> Call {
        let (rounds, main, part) = match kind {
            Kind::AllReduce => (Rounds::all_reduce(world, bytes), bytes, 0),
            Kind::ReduceScatter { in_place } => (Rounds::reduce_scatter(world, bytes, in_place), world * bytes, bytes),
            Kind::AllGather { in_place } => (Rounds::all_gather(world, bytes, in_place), world * bytes, bytes),
            Kind::Broadcast { root } => (Rounds::broadcast(world, bytes, root), bytes, 0),
            Kind::Send { writer, reader } => (Rounds::send(world, bytes, writer, reader), bytes, 0),
        };
        Call { rounds, main, part, kind }
    }
}

/// The fold the model applies: order matters, so a fold in the wrong order shows.
fn fold(acc: u64, x: u64) -> u64 {
    acc.wrapping_mul(1_000_003).wrapping_add(x)
}

/// A step as enqueued, with an event wait bound to the count of its mark's records enqueued
/// before it (a wait binds to its event's latest record, and each mark is an event).
#[derive(Debug, Clone, Copy)]
pub(super) struct Queued {
    pub(super) call: usize,
    pub(super) lane: Lane,
    pub(super) step: LegStep,
    pub(super) bound: usize,
}

/// Every call's steps for `rank`, each call's slots from 0, or, `chained`, each call's as a run
/// chained after the calls before (going on through every writer's slots).
pub(super) fn enqueue(
    calls: &[Call],
    rank: usize,
    slot_bytes: usize,
    slots: usize,
    chained: bool,
    waits: LaneWaits,
) -> Vec<Queued> {
    // Records enqueued so far, per mark: (sent, landed).
    let (mut sent, mut landed): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let count = |records: &mut Vec<usize>, mark: usize| {
        ran(records, mark);
        records[mark]
    };
    let mut out = Vec::new();
    let mut written = Vec::new();
    for (call, c) in calls.iter().enumerate() {
        let list = steps(&c.rounds, rank, slot_bytes, slots, if chained { &written } else { &[] }, waits);
        if chained {
            written = sent_after(&c.rounds, slot_bytes, &written);
        }
        for (lane, step) in list {
            let bound = match step {
                LegStep::RecordSent { mark } => count(&mut sent, mark),
                LegStep::RecordLanded { mark } => count(&mut landed, mark),
                LegStep::AfterSent { mark } => sent.get(mark).copied().unwrap_or(0),
                LegStep::AfterLanded { mark } => landed.get(mark).copied().unwrap_or(0),
                _ => 0,
            };
            out.push(Queued { call, lane, step, bound });
        }
    }
    out
}

/// What a slot holds: the call, leg and chunk copied in, and the bytes.
type SlotContent = Option<(usize, usize, usize, Vec<u64>)>;

pub(super) struct Model<'a> {
    pub(super) calls: &'a [Call],
    world: usize,
    slot_bytes: usize,
    pub(super) queues: Vec<Vec<VecDeque<Queued>>>,
    /// flags[writer][slot][reader]
    flags: Vec<Vec<Vec<u32>>>,
    slots: Vec<Vec<SlotContent>>,
    /// Records run, per rank and mark: (sent, landed).
    records: Vec<(Vec<usize>, Vec<usize>)>,
    /// main[call][rank], part[call][rank]
    main: Vec<Vec<Vec<u64>>>,
    part: Vec<Vec<Vec<u64>>>,
    /// Folds of each element of each rank's destination (to check `last`), per call.
    folds: Vec<Vec<Vec<usize>>>,
    pub(super) left: Vec<Vec<usize>>,
    /// Whether the calls run as runs chained one after another (see [`enqueue`]).
    chained: bool,
}

/// One more record of `mark` run.
fn ran(records: &mut Vec<usize>, mark: usize) {
    if records.len() <= mark {
        records.resize(mark + 1, 0);
    }
    records[mark] += 1;
}

fn initial(call: usize, rank: usize, len: usize, salt: u64) -> Vec<u64> {
    (0..len).map(|i| ((call as u64 + 1) << 40) ^ ((rank as u64 + 1) << 20) ^ (i as u64 * 7 + salt)).collect()
}

impl<'a> Model<'a> {
    /// Every rank's steps of `calls` queued by lane, or on `one_queue` each, the calls
    /// `chained` (see [`enqueue`]) or each from slot 0.
    pub(super) fn new(
        calls: &'a [Call],
        world: usize,
        slot_bytes: usize,
        slots: usize,
        one_queue: bool,
        chained: bool,
        waits: LaneWaits,
    ) -> Model<'a> {
        let queues: Vec<Vec<VecDeque<Queued>>> = (0..world)
            .map(|r| {
                let steps = enqueue(calls, r, slot_bytes, slots, chained, waits);
                if one_queue {
                    vec![steps.into_iter().collect()]
                } else {
                    let lane = |l: Lane| steps.iter().filter(|q| q.lane == l).copied().collect();
                    vec![lane(Lane::Send), lane(Lane::Receive)]
                }
            })
            .collect();
        let left = (0..world)
            .map(|r| {
                let mut left = vec![0; calls.len()];
                queues[r].iter().flatten().for_each(|q| left[q.call] += 1);
                left
            })
            .collect();
        let main: Vec<Vec<Vec<u64>>> = calls
            .iter()
            .enumerate()
            .map(|(c, call)| (0..world).map(|r| initial(c, r, call.main, 0)).collect())
            .collect();
        // The local copy the communicator makes before the pipeline: a gather's own part, a
        // scatter's own part into its output.
        let part = calls
            .iter()
            .enumerate()
            .map(|(c, call)| {
                (0..world)
                    .map(|r| match call.kind {
                        Kind::ReduceScatter { in_place: false } => {
                            main[c][r][r * call.part..(r + 1) * call.part].to_vec()
                        }
                        _ => initial(c, r, call.part, 99),
                    })
                    .collect()
            })
            .collect::<Vec<Vec<Vec<u64>>>>();
        let mut main = main;
        for (c, call) in calls.iter().enumerate() {
            if let Kind::AllGather { in_place: false } = call.kind {
                for r in 0..world {
                    main[c][r][r * call.part..(r + 1) * call.part].copy_from_slice(&part[c][r]);
                }
            }
        }
        let folds = calls.iter().map(|call| (0..world).map(|_| vec![0; call.main.max(call.part)]).collect()).collect();
        Model {
            calls,
            world,
            slot_bytes,
            queues,
            flags: vec![vec![vec![EMPTY; world]; slots]; world],
            slots: vec![vec![None; slots]; world],
            records: vec![(Vec::new(), Vec::new()); world],
            main,
            part,
            folds,
            left,
            chained,
        }
    }

    fn ready(&self, r: usize, q: &Queued) -> bool {
        // Calls wait for the rank's call before (each call's first step on the GPU does);
        // chained runs don't, and only their flags and events order them.
        if !self.chained && q.call > 0 && self.left[r][q.call - 1] > 0 {
            return false;
        }
        match q.step {
            LegStep::WaitSlotFree { slot, count } => {
                self.flags[r][slot..slot + count].iter().flatten().all(|&f| f == EMPTY)
            }
            LegStep::WaitFull { writer, slot } => self.flags[writer][slot][r] == FULL,
            LegStep::AfterSent { mark } => self.records[r].0.get(mark).copied().unwrap_or(0) >= q.bound,
            LegStep::AfterLanded { mark } => self.records[r].1.get(mark).copied().unwrap_or(0) >= q.bound,
            _ => true,
        }
    }

    fn buffer(&mut self, call: usize, rank: usize, buf: Buf) -> &mut Vec<u64> {
        match buf {
            Buf::Main => &mut self.main[call][rank],
            Buf::Part => &mut self.part[call][rank],
        }
    }

    fn run(&mut self, r: usize, q: Queued) {
        let rounds = &self.calls[q.call].rounds;
        match q.step {
            LegStep::CopyOut { leg, chunk, slot } => {
                let l = &rounds.legs[leg];
                assert_eq!(l.writer, r);
                let range = chunk_range(l, chunk, self.slot_bytes);
                let (buf, at) = l.src;
                let data = self.buffer(q.call, r, buf)[at + range.start..at + range.end].to_vec();
                self.slots[r][slot] = Some((q.call, leg, chunk, data));
            }
            LegStep::Land { leg, chunk, slot } => {
                let l = rounds.legs[leg].clone();
                assert!(l.is_read_by(r), "rank {r} landed a leg not for it");
                let Some((call, got_leg, got_chunk, data)) = self.slots[l.writer][slot].clone() else {
                    panic!("rank {r} landed from an empty slot");
                };
                assert_eq!((call, got_leg, got_chunk), (q.call, leg, chunk), "rank {r} landed the wrong chunk");
                let range = chunk_range(&l, chunk, self.slot_bytes);
                let (buf, at) = l.dst;
                let start = at + range.start;
                for (i, x) in data.into_iter().enumerate() {
                    let dst = &mut self.buffer(q.call, r, buf)[start + i];
                    match l.landing {
                        LegLanding::Copy => *dst = x,
                        LegLanding::Fold { last } => {
                            *dst = fold(*dst, x);
                            let folds = &mut self.folds[q.call][r][start + i];
                            *folds += 1;
                            assert_eq!(last, *folds == self.world - 1, "`last` marks the last fold");
                        }
                    }
                }
            }
            LegStep::MarkFull { leg, slot } => {
                for reader in self.calls[q.call].rounds.legs[leg].readers(self.world) {
                    self.flags[r][slot][reader] = FULL;
                }
            }
            LegStep::HandBack { writer, slot } => self.flags[writer][slot][r] = EMPTY,
            LegStep::RecordSent { mark } => ran(&mut self.records[r].0, mark),
            LegStep::RecordLanded { mark } => ran(&mut self.records[r].1, mark),
            _ => {}
        }
        self.left[r][q.call] -= 1;
    }

    /// Runs what is ready, chosen with `choose`, until nothing is; returns the steps left.
    pub(super) fn drain(&mut self, mut choose: impl FnMut(usize) -> usize) -> usize {
        loop {
            let mut ready = Vec::new();
            for r in 0..self.world {
                for (i, queue) in self.queues[r].iter().enumerate() {
                    if queue.front().is_some_and(|q| self.ready(r, q)) {
                        ready.push((r, i));
                    }
                }
            }
            if ready.is_empty() {
                return self.queues.iter().flatten().map(VecDeque::len).sum();
            }
            let (r, i) = ready[choose(ready.len())];
            let q = self.queues[r][i].pop_front().expect("a ready queue has a front");
            self.run(r, q);
        }
    }

    /// Every call's result against what it should be.
    pub(super) fn check(&self) {
        let world = self.world;
        for (c, call) in self.calls.iter().enumerate() {
            let inputs: Vec<Vec<u64>> = (0..world).map(|r| initial(c, r, call.main, 0)).collect();
            let input = |r: usize| &inputs[r];
            // The owner's fold: its own, then ranks r-1, r-2, ...
            let owner_fold = |owner: usize, element: usize| {
                (1..world).fold(input(owner)[element], |acc, k| fold(acc, input((owner + world - k) % world)[element]))
            };
            for r in 0..world {
                let main = &self.main[c][r];
                match call.kind {
                    Kind::AllReduce => {
                        for q in 0..world {
                            for e in share(world, call.main, q) {
                                assert_eq!(main[e], owner_fold(q, e), "call {c} rank {r} element {e}");
                            }
                        }
                    }
                    Kind::ReduceScatter { in_place } => {
                        let got =
                            if in_place { &main[r * call.part..(r + 1) * call.part] } else { &self.part[c][r][..] };
                        for (i, v) in got.iter().enumerate() {
                            assert_eq!(*v, owner_fold(r, r * call.part + i), "call {c} rank {r} element {i}");
                        }
                    }
                    Kind::AllGather { in_place } => {
                        for w in 0..world {
                            let want = if in_place {
                                input(w)[w * call.part..(w + 1) * call.part].to_vec()
                            } else {
                                initial(c, w, call.part, 99)
                            };
                            assert_eq!(
                                &main[w * call.part..(w + 1) * call.part],
                                &want[..],
                                "call {c} rank {r} part {w}"
                            );
                        }
                    }
                    Kind::Broadcast { root } => assert_eq!(main, input(root), "call {c} rank {r}"),
                    Kind::Send { writer, reader } => {
                        let want = if r == reader { input(writer) } else { input(r) };
                        assert_eq!(main, want, "call {c} rank {r}");
                    }
                }
            }
        }
    }
}

pub(super) fn calls(world: usize) -> Vec<Call> {
    let page = SHARE_ALIGN;
    vec![
        Call::new(world, Kind::AllReduce, 3 * world * page + 5),
        Call::new(world, Kind::AllReduce, page / 2),
        Call::new(world, Kind::ReduceScatter { in_place: false }, 2 * page + 3),
        Call::new(world, Kind::ReduceScatter { in_place: true }, page + 1),
        Call::new(world, Kind::AllGather { in_place: false }, 2 * page + 7),
        Call::new(world, Kind::AllGather { in_place: true }, 3),
        Call::new(world, Kind::Broadcast { root: world - 1 }, 5 * page),
        Call::new(world, Kind::Send { writer: 1, reader: if world > 2 { world - 1 } else { 0 } }, 3 * page),
        Call::new(world, Kind::AllReduce, 7 * page),
    ]
}
