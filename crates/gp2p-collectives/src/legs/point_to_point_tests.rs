//! Sends and receives among more than two ranks, each its own call (no group), run through
//! the steps a rank enqueues for them ([`steps`] of [`Rounds::send`]) against a model of the
//! slots and their flags, each rank's calls one after another and the ranks' lanes
//! interleaved at random. What the communicator's and the door's docs promise: a program
//! completes here whenever it would complete with every send waiting for its receive, with
//! every chunk landed from its own message; sorted by (writer, reader), as the door orders a
//! group, every program completes; and a program that needs NCCL's buffering of small sends
//! waits here.

use proptest::prelude::*;

use super::Rounds;
use super::steps::{Lane, LaneWaits, LegStep, steps};

const CHUNK: usize = 4096;

/// One call of one rank: a send to `peer` or a receive from it, of message `msg` (a number
/// every rank's call for it shares), `chunks` chunks long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Send { peer: usize, chunks: usize, msg: usize },
    Recv { peer: usize, chunks: usize, msg: usize },
}

impl Call {
    /// (writer, reader) of this call made by `rank`.
    fn pair(self, rank: usize) -> (usize, usize) {
        match self {
            Call::Send { peer, .. } => (rank, peer),
            Call::Recv { peer, .. } => (peer, rank),
        }
    }

    fn msg_and_chunks(self) -> (usize, usize) {
        match self {
            Call::Send { chunks, msg, .. } | Call::Recv { chunks, msg, .. } => (msg, chunks),
        }
    }
}

/// A small deterministic generator for the interleavings.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Run every rank's `programs` through `slots` slots a rank, the next step taken among the
/// ready ones at random (`seed`). Err says where it stalled (no step can run) or what landed
/// wrong.
fn run(world: usize, slots: usize, programs: &[Vec<Call>], seed: u64) -> Result<(), String> {
    let waits = LaneWaits::for_ranks(world);
    // Each rank's calls, each as its two lanes' steps.
    let lanes: Vec<Vec<[Vec<LegStep>; 2]>> = programs
        .iter()
        .enumerate()
        .map(|(rank, calls)| {
            calls
                .iter()
                .map(|&call| {
                    let ((writer, reader), (_, chunks)) = (call.pair(rank), call.msg_and_chunks());
                    let all =
                        steps(&Rounds::send(world, chunks * CHUNK, writer, reader), rank, CHUNK, slots, &[], waits);
                    let lane = |l: Lane| all.iter().filter(|(x, _)| *x == l).map(|&(_, s)| s).collect();
                    [lane(Lane::Send), lane(Lane::Receive)]
                })
                .collect()
        })
        .collect();
    // full[w][s][r]: reader r's flag of writer w's slot s; held[w][s]: the chunk it holds.
    let mut full = vec![vec![vec![false; world]; slots]; world];
    let mut held: Vec<Vec<Option<(usize, usize)>>> = vec![vec![None; slots]; world];
    let (mut call, mut at) = (vec![0usize; world], vec![[0usize; 2]; world]);
    let mut rng = Rng(seed);
    loop {
        for r in 0..world {
            while call[r] < lanes[r].len() && (0..2).all(|l| at[r][l] == lanes[r][call[r]][l].len()) {
                call[r] += 1;
                at[r] = [0, 0];
            }
        }
        let mut ready = Vec::new();
        for r in (0..world).filter(|&r| call[r] < lanes[r].len()) {
            for l in 0..2 {
                let Some(&step) = lanes[r][call[r]][l].get(at[r][l]) else { continue };
                let can = match step {
                    LegStep::WaitSlotFree { slot, count } => full[r][slot..slot + count].iter().flatten().all(|f| !f),
                    LegStep::WaitFull { writer, slot } => full[writer][slot][r],
                    LegStep::AfterSent { .. } | LegStep::AfterLanded { .. } => {
                        return Err(format!("rank {r}: a one-leg call waits across its lanes: {step:?}"));
                    }
                    _ => true,
                };
                if can {
                    ready.push((r, l, step));
                }
            }
        }
        if ready.is_empty() {
            if (0..world).all(|r| call[r] == lanes[r].len()) {
                return Ok(());
            }
            return Err(format!("stalled at calls {call:?}"));
        }
        let (r, l, step) = ready[rng.below(ready.len())];
        let this = programs[r][call[r]];
        let ((writer, reader), (msg, _)) = (this.pair(r), this.msg_and_chunks());
        match step {
            LegStep::CopyOut { chunk, slot, .. } => held[r][slot] = Some((msg, chunk)),
            LegStep::MarkFull { slot, .. } => full[r][slot][reader] = true,
            LegStep::Land { chunk, slot, .. } if held[writer][slot] != Some((msg, chunk)) => {
                return Err(format!(
                    "rank {r} landed {:?} from rank {writer}'s slot {slot} for chunk {chunk} of message {msg}",
                    held[writer][slot]
                ));
            }
            LegStep::HandBack { writer, slot } => full[writer][slot][r] = false,
            _ => {}
        }
        at[r][l] += 1;
    }
}

/// Whether `programs` complete when every send waits for its receive: both at the head of
/// their ranks' calls, they end together.
fn completes_with_waiting_sends(programs: &[Vec<Call>]) -> bool {
    let world = programs.len();
    let mut at = vec![0usize; world];
    loop {
        let mut moved = false;
        for r in 0..world {
            if let Some(&Call::Send { peer, .. }) = programs[r].get(at[r])
                && let Some(&Call::Recv { peer: from, .. }) = programs[peer].get(at[peer])
                && from == r
            {
                at[r] += 1;
                at[peer] += 1;
                moved = true;
            }
        }
        if (0..world).all(|r| at[r] == programs[r].len()) {
            return true;
        }
        if !moved {
            return false;
        }
    }
}

/// Each rank's calls sorted by (writer, reader), stably: the door's order of a group.
fn grouped(programs: &[Vec<Call>]) -> Vec<Vec<Call>> {
    let mut sorted = programs.to_vec();
    for (rank, calls) in sorted.iter_mut().enumerate() {
        calls.sort_by_key(|c| c.pair(rank));
    }
    sorted
}

fn send(peer: usize, chunks: usize, msg: usize) -> Call {
    Call::Send { peer, chunks, msg }
}

fn recv(peer: usize, chunks: usize, msg: usize) -> Call {
    Call::Recv { peer, chunks, msg }
}

#[test]
fn ungrouped_sends_and_receives_among_three_in_orders_nccl_accepts_complete() {
    for chunks in [1, 9] {
        let n = chunks;
        let cases: [(&str, Vec<Vec<Call>>); 3] = [
            // Rank 1 takes rank 2's message first, then rank 0's.
            ("two writers", vec![vec![send(1, n, 0)], vec![recv(2, n, 1), recv(0, n, 0)], vec![send(1, n, 1)]]),
            // One writer, its readers in its order.
            ("one writer", vec![vec![send(1, n, 0), send(2, n, 1)], vec![recv(0, n, 0)], vec![recv(0, n, 1)]]),
            // Rank 1's only call meets rank 0's second.
            ("second call", vec![vec![send(2, n, 0), send(1, n, 1)], vec![recv(0, n, 1)], vec![recv(0, n, 0)]]),
        ];
        for (name, programs) in cases {
            assert!(completes_with_waiting_sends(&programs), "{name}");
            for slots in 1..=4 {
                for seed in 0..40 {
                    let why = |e| format!("{name}, {chunks} chunk(s), {slots} slot(s), seed {seed}: {e}");
                    run(3, slots, &programs, seed).map_err(why).unwrap();
                    run(3, slots, &grouped(&programs), seed).map_err(why).unwrap();
                }
            }
        }
    }
}

#[test]
fn a_pipeline_of_ranks_each_sending_on_then_receiving_completes_whatever_the_message() {
    // Pipeline-parallel stages: rank r sends to r + 1, then receives from r - 1.
    for world in 3..=8 {
        let programs: Vec<Vec<Call>> = (0..world)
            .map(|r| {
                let mut calls = Vec::new();
                if r + 1 < world {
                    calls.push(send(r + 1, 9, r));
                }
                if r > 0 {
                    calls.push(recv(r - 1, 9, r - 1));
                }
                calls
            })
            .collect();
        for (slots, seed) in (1..=4).flat_map(|s| (0..10).map(move |seed| (s, seed))) {
            run(world, slots, &programs, seed).unwrap_or_else(|e| panic!("{world} ranks, {slots} slot(s): {e}"));
        }
    }
}

#[test]
fn a_program_that_needs_nccls_buffering_of_small_sends_waits_here() {
    // Rank 0's send to 2 needs the slot its send to 1 still holds; rank 1 first waits for rank
    // 2, which first waits for rank 0: a cycle once every send waits for its receive, which
    // NCCL only runs for messages its buffers hold. Documented (docs/nccl-door.md): it waits
    // here until the peer timeout.
    let programs = vec![
        vec![send(1, 1, 0), send(2, 1, 1)],
        vec![recv(2, 1, 2), recv(0, 1, 0)],
        vec![recv(0, 1, 1), send(1, 1, 2)],
    ];
    assert!(!completes_with_waiting_sends(&programs));
    for slots in 1..=4 {
        assert!(run(3, slots, &programs, 1).is_err(), "{slots} slot(s)");
    }
    run(3, 1, &grouped(&programs), 1).expect("grouped, it completes");
}

/// Random programs of `world` ranks from `seed`: up to 10 messages between random pairs, each
/// rank's calls shuffled but kept in order for each pair (NCCL's matching is per pair).
fn random_programs(world: usize, seed: u64) -> Vec<Vec<Call>> {
    let mut rng = Rng(seed);
    let messages: Vec<(usize, usize, usize)> = (0..1 + rng.below(10))
        .map(|_| {
            let from = rng.below(world);
            (from, (from + 1 + rng.below(world - 1)) % world, 1 + rng.below(6))
        })
        .collect();
    (0..world)
        .map(|rank| {
            let calls: Vec<Call> = messages
                .iter()
                .enumerate()
                .filter_map(|(msg, &(from, to, chunks))| {
                    (from == rank)
                        .then(|| send(to, chunks, msg))
                        .or_else(|| (to == rank).then(|| recv(from, chunks, msg)))
                })
                .collect();
            let mut order = calls.clone();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            // Each pair's calls back in their own order, at the places the shuffle gave the pair.
            let mut per_pair: Vec<Call> = calls;
            order
                .iter()
                .map(|c| {
                    let i =
                        per_pair.iter().position(|d| d.pair(rank) == c.pair(rank)).expect("a call of the pair left");
                    per_pair.remove(i)
                })
                .collect()
        })
        .collect()
}

proptest! {
    #[test]
    fn random_ungrouped_programs_that_complete_with_waiting_sends_complete_here(
        world in 3usize..=8, slots in 1usize..=4, seed in any::<u64>(),
    ) {
        let programs = random_programs(world, seed);
        let outcome = run(world, slots, &programs, seed ^ 0x5eed);
        if let Err(e) = &outcome {
            prop_assert!(!e.contains("landed"), "{e}: {programs:?}");
        }
        if completes_with_waiting_sends(&programs) {
            prop_assert!(outcome.is_ok(), "{:?}: {programs:?}", outcome);
        }
        prop_assert_eq!(run(world, slots, &grouped(&programs), seed), Ok(()), "grouped: {:?}", grouped(&programs));
    }
}
