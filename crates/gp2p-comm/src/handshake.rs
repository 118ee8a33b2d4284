//! The pipeline's protocol as data: the steps one rank enqueues for one transfer, in order,
//! on its two streams. `pipeline` turns each step into a CUDA call; the tests here run both
//! ranks' steps on a model of the flags, slots and events, in many orders (and with each
//! rank's streams squeezed into one queue, as a GPU may run them), to check that every
//! chunk lands whole and that no order deadlocks.

// The lanes and flag values of the many-rank steps (gp2p_collectives::legs::steps): one
// vocabulary for both pipelines.
pub(crate) use gp2p_collectives::legs::steps::{EMPTY, FULL, Lane};

/// Whose slot a flag belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Own,
    Peer,
}

/// One step of a rank's side of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Wait for this rank's last receive through `slot` (the event recorded after it).
    AfterReceived { slot: usize },
    /// Wait for this rank's last send through `slot`.
    AfterSent { slot: usize },
    /// Wait (bounded) until the flag of `owner`'s `slot` is `value`.
    WaitFlag { owner: Owner, slot: usize, value: u32 },
    /// Copy chunk `chunk` of the source into this rank's `slot`.
    CopyOut { chunk: usize, slot: usize },
    /// Set the flag of `owner`'s `slot` to `value`.
    SetFlag { owner: Owner, slot: usize, value: u32 },
    /// Record the event of `slot` that [`Step::AfterSent`] waits for.
    RecordSent { slot: usize },
    /// Fold or copy the peer's `slot` into chunk `chunk` of the destination.
    Land { chunk: usize, slot: usize },
    /// Record the event of `slot` that [`Step::AfterReceived`] waits for.
    RecordReceived { slot: usize },
}

/// The steps of one rank's side of a transfer of `chunks` chunks through `slots` slots, in
/// the order they are enqueued: per chunk, its send steps (if this rank sends), then its
/// receive steps (if it receives). Chunk `i` goes through slot `i % slots` on both ranks.
///
/// - The send waits for the slot's flag to be empty, copies the chunk in and sets the flag
///   full; the receive waits for the peer's flag to be full, lands the chunk and sets the
///   flag empty: each flag alternates between its two writers.
/// - A rank that also receives makes the receive of chunk `i` wait for its own send of it
///   (in place, the landing overwrites what the send copies out), and the send of chunk `i`
///   wait for its receive of chunk `i - slots` (the slot's previous turn), so that the
///   steps can run in any order a GPU may choose without waiting on each other in a cycle.
pub(crate) fn plan(sends: bool, receives: bool, chunks: usize, slots: usize) -> Vec<(Lane, Step)> {
    use Lane::{Receive, Send};
    let mut steps = Vec::new();
    for chunk in 0..chunks {
        let slot = chunk % slots;
        if sends {
            if receives && chunk >= slots {
                steps.push((Send, Step::AfterReceived { slot }));
            }
            steps.extend([
                (Send, Step::WaitFlag { owner: Owner::Own, slot, value: EMPTY }),
                (Send, Step::CopyOut { chunk, slot }),
                (Send, Step::SetFlag { owner: Owner::Own, slot, value: FULL }),
                (Send, Step::RecordSent { slot }),
            ]);
        }
        if receives {
            if sends {
                steps.push((Receive, Step::AfterSent { slot }));
            }
            steps.extend([
                (Receive, Step::WaitFlag { owner: Owner::Peer, slot, value: FULL }),
                (Receive, Step::Land { chunk, slot }),
                (Receive, Step::SetFlag { owner: Owner::Peer, slot, value: EMPTY }),
                (Receive, Step::RecordReceived { slot }),
            ]);
        }
    }
    steps
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// One call of the model: the chunk count, and which ranks send (the other rank
    /// receives what each sends).
    #[derive(Debug, Clone, Copy)]
    struct Call {
        chunks: usize,
        senders: [bool; 2],
    }

    /// A step as enqueued: an event wait bound to the record made last before it (as
    /// `cuStreamWaitEvent` binds), a record numbered, and the call it belongs to.
    #[derive(Debug, Clone, Copy)]
    struct Queued {
        call: usize,
        lane: Lane,
        step: Step,
        /// For a record: its number on its event; for an event wait: the record it waits for
        /// (0: none was made yet, so it does not wait).
        record: usize,
    }

    /// A rank's steps as enqueued, call after call, with the events' records bound.
    fn enqueue(
        calls: &[Call],
        r: usize,
        slots: usize,
        plan: &dyn Fn(bool, bool, usize) -> Vec<(Lane, Step)>,
    ) -> Vec<Queued> {
        let (mut sent, mut received) = (vec![0; slots], vec![0; slots]);
        let mut out = Vec::new();
        for (call, c) in calls.iter().enumerate() {
            for (lane, step) in plan(c.senders[r], c.senders[1 - r], c.chunks) {
                let record = match step {
                    Step::RecordSent { slot } => {
                        sent[slot] += 1;
                        sent[slot]
                    }
                    Step::RecordReceived { slot } => {
                        received[slot] += 1;
                        received[slot]
                    }
                    Step::AfterSent { slot } => sent[slot],
                    Step::AfterReceived { slot } => received[slot],
                    _ => 0,
                };
                out.push(Queued { call, lane, step, record });
            }
        }
        out
    }

    /// A small deterministic generator (xorshift), so a failure repeats (the rounds' model
    /// uses it too).
    pub(crate) fn chooser(seed: u64) -> impl FnMut(usize) -> usize {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).max(1);
        move |n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        }
    }

    /// A random order of `steps` that a GPU could run them in as one queue: each lane's
    /// steps in order, event waits after their records, calls one after another (the fork
    /// waits for the join), and nothing else considered (flags are invisible to the GPU's
    /// scheduler).
    fn one_queue(steps: &[Queued], choose: &mut impl FnMut(usize) -> usize) -> Vec<Queued> {
        let mut placed = vec![false; steps.len()];
        let mut order = Vec::new();
        // Whether an event wait's record is placed (other steps wait for no record).
        let records_placed = |placed: &[bool], step: &Step, record: usize| {
            let matches = |q: &Queued| match (step, q.step) {
                (Step::AfterSent { slot }, Step::RecordSent { slot: s }) => *slot == s,
                (Step::AfterReceived { slot }, Step::RecordReceived { slot: s }) => *slot == s,
                _ => false,
            };
            let waits = matches!(step, Step::AfterSent { .. } | Step::AfterReceived { .. });
            !waits || steps.iter().zip(placed).filter(|(q, p)| **p && matches(q)).count() >= record
        };
        while order.len() < steps.len() {
            let candidates: Vec<usize> = (0..steps.len())
                .filter(|&i| !placed[i])
                .filter(|&i| {
                    let q = &steps[i];
                    let earlier_unplaced =
                        steps[..i].iter().zip(&placed).any(|(e, p)| !p && (e.call < q.call || e.lane == q.lane));
                    !earlier_unplaced && records_placed(&placed, &q.step, q.record)
                })
                .collect();
            let i = candidates[choose(candidates.len())];
            placed[i] = true;
            order.push(steps[i]);
        }
        order
    }

    /// Both ranks' queues run on a model of the flags, slots and events.
    struct Model {
        /// queues[rank][queue]: two lanes, or one queue for both.
        queues: [Vec<VecDeque<Queued>>; 2],
        /// events[rank][sent = 0 / received = 1][slot]: records run.
        events: [[Vec<usize>; 2]; 2],
        flags: [Vec<u32>; 2],
        /// What each rank's slots hold: (call, chunk) last copied in.
        slots: [Vec<Option<(usize, usize)>>; 2],
        /// Chunks each rank copied out, by call.
        copied_out: [Vec<Vec<bool>>; 2],
        /// Steps of each call not yet run, by rank.
        left: [Vec<usize>; 2],
        calls: Vec<Call>,
    }

    impl Model {
        fn new(calls: &[Call], slots: usize, queues: [Vec<VecDeque<Queued>>; 2]) -> Model {
            let left = |r: usize| {
                let mut left = vec![0; calls.len()];
                queues[r].iter().flatten().for_each(|q| left[q.call] += 1);
                left
            };
            let copied = || calls.iter().map(|c| vec![false; c.chunks]).collect::<Vec<_>>();
            Model {
                left: [left(0), left(1)],
                queues,
                events: [[vec![0; slots], vec![0; slots]], [vec![0; slots], vec![0; slots]]],
                flags: [vec![EMPTY; slots], vec![EMPTY; slots]],
                slots: [vec![None; slots], vec![None; slots]],
                copied_out: [copied(), copied()],
                calls: calls.to_vec(),
            }
        }

        fn ready(&self, r: usize, q: &Queued) -> bool {
            if q.call > 0 && self.left[r][q.call - 1] > 0 {
                return false;
            }
            let owner = |o: Owner| if o == Owner::Own { r } else { 1 - r };
            match q.step {
                Step::AfterSent { slot } => self.events[r][0][slot] >= q.record,
                Step::AfterReceived { slot } => self.events[r][1][slot] >= q.record,
                Step::WaitFlag { owner: o, slot, value } => self.flags[owner(o)][slot] == value,
                _ => true,
            }
        }

        fn run(&mut self, r: usize, q: Queued) {
            let peer = 1 - r;
            let owner = |o: Owner| if o == Owner::Own { r } else { peer };
            match q.step {
                Step::CopyOut { chunk, slot } => {
                    self.slots[r][slot] = Some((q.call, chunk));
                    self.copied_out[r][q.call][chunk] = true;
                }
                Step::SetFlag { owner: o, slot, value } => self.flags[owner(o)][slot] = value,
                Step::RecordSent { slot } => self.events[r][0][slot] += 1,
                Step::RecordReceived { slot } => self.events[r][1][slot] += 1,
                Step::Land { chunk, slot } => {
                    assert_eq!(self.slots[peer][slot], Some((q.call, chunk)), "rank {r} landed a wrong chunk");
                    if self.calls[q.call].senders[r] {
                        assert!(self.copied_out[r][q.call][chunk], "rank {r} landed chunk {chunk} before sending it");
                    }
                }
                Step::AfterSent { .. } | Step::AfterReceived { .. } | Step::WaitFlag { .. } => {}
            }
            self.left[r][q.call] -= 1;
        }

        /// Run what is ready, choosing with `choose`, until nothing is; returns how many steps
        /// are left (more than 0: a deadlock).
        fn drain(&mut self, mut choose: impl FnMut(usize) -> usize) -> usize {
            loop {
                let mut ready = Vec::new();
                for r in 0..2 {
                    for (i, queue) in self.queues[r].iter().enumerate() {
                        if queue.front().is_some_and(|q| self.ready(r, q)) {
                            ready.push((r, i));
                        }
                    }
                }
                let Some(&(r, i)) = (!ready.is_empty()).then(|| &ready[choose(ready.len())]) else {
                    return self.queues.iter().flatten().map(VecDeque::len).sum();
                };
                let q = self.queues[r][i].pop_front().expect("a ready queue has a front");
                self.run(r, q);
            }
        }
    }

    fn calls() -> Vec<Call> {
        let both = [true, true];
        vec![
            Call { chunks: 7, senders: both },          // an all-reduce
            Call { chunks: 1, senders: both },          // a short one right after
            Call { chunks: 5, senders: [true, false] }, // broadcast from rank 0
            Call { chunks: 4, senders: [false, true] }, // broadcast from rank 1
            Call { chunks: 9, senders: both },          // all-gather or reduce-scatter
            Call { chunks: 2, senders: [false, true] },
            Call { chunks: 3, senders: both },
        ]
    }

    fn two_lanes(steps: Vec<Queued>) -> Vec<VecDeque<Queued>> {
        let lane = |l: Lane| steps.iter().filter(|q| q.lane == l).copied().collect();
        vec![lane(Lane::Send), lane(Lane::Receive)]
    }

    /// Steps left after running `calls` with each rank's steps as one queue in an order
    /// drawn with `seed`, from `plan`.
    fn one_queue_left(slots: usize, seed: u64, plan: &dyn Fn(bool, bool, usize) -> Vec<(Lane, Step)>) -> usize {
        let calls = calls();
        let mut choose = chooser(seed);
        let queues = [0, 1].map(|r| vec![one_queue(&enqueue(&calls, r, slots, plan), &mut choose).into()]);
        Model::new(&calls, slots, queues).drain(chooser(seed + 1))
    }

    #[test]
    fn every_chunk_lands_whole_whatever_the_two_streams_interleave() {
        for slots in [2, 3, 4] {
            let plan = |s, r, c| plan(s, r, c, slots);
            for seed in 1..100 {
                let calls = calls();
                let queues = [0, 1].map(|r| two_lanes(enqueue(&calls, r, slots, &plan)));
                assert_eq!(Model::new(&calls, slots, queues).drain(chooser(seed)), 0, "{slots} slots, seed {seed}");
            }
        }
    }

    #[test]
    fn no_order_a_gpu_may_run_a_ranks_steps_in_deadlocks() {
        for slots in [2, 3] {
            for seed in 1..40 {
                assert_eq!(
                    one_queue_left(slots, seed, &|s, r, c| plan(s, r, c, slots)),
                    0,
                    "{slots} slots, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn without_the_wait_for_a_slots_previous_receive_some_order_deadlocks() {
        // The check above is not vacuous: without that wait a rank's sends may run ahead of
        // its receives, and both ranks then wait for each other.
        let unguarded = |s, r, c| {
            let mut steps = plan(s, r, c, 2);
            steps.retain(|(_, step)| !matches!(step, Step::AfterReceived { .. }));
            steps
        };
        assert!((1..150).any(|seed| one_queue_left(2, seed, &unguarded) > 0), "no order deadlocked");
    }

    #[test]
    fn the_plan_pairs_every_flag_write_with_a_wait_for_the_other_value() {
        let steps = plan(true, true, 5, 2);
        let count = |f: &dyn Fn(&Step) -> bool| steps.iter().filter(|(_, s)| f(s)).count();
        assert_eq!(count(&|s| matches!(s, Step::CopyOut { .. })), 5);
        assert_eq!(count(&|s| matches!(s, Step::Land { .. })), 5);
        assert_eq!(
            count(&|s| matches!(s, Step::AfterReceived { .. })),
            3,
            "chunks 2.. wait for their slot's last turn"
        );
        for (lane, step) in &steps {
            if let Step::SetFlag { owner, value, .. } = step {
                let expected = if *lane == Lane::Send { (Owner::Own, FULL) } else { (Owner::Peer, EMPTY) };
                assert_eq!((*owner, *value), expected);
            }
        }
        assert!(plan(false, false, 3, 2).is_empty());
        assert!(plan(true, false, 3, 2).iter().all(|(lane, _)| *lane == Lane::Send));
    }
}
