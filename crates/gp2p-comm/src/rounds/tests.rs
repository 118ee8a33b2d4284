//! Every rank's steps on a model of the segment's slots and flags and of each rank's events:
//! values land where they belong, folded in the owner's order, and no order of running the
//! steps that a GPU may choose deadlocks.

mod model;

use super::*;
use crate::handshake::Lane;
use crate::handshake::tests::chooser;
use model::*;

#[test]
fn every_call_lands_whole_in_the_owners_order_whatever_order_the_gpus_run_the_steps() {
    // Slots of a page: every leg takes several chunks, and the rings wrap within a call. The
    // calls each from slot 0 after the one before, and chained (see `enqueue`).
    let slot_bytes = SHARE_ALIGN;
    for (world, waits) in (2..=8).flat_map(|w| [(w, LaneWaits::EachChunk), (w, LaneWaits::AllSoFar)]) {
        let calls = calls(world);
        for (slots, chained) in [2, 3].into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let what = format!("{world} ranks, {waits:?}, {slots} slots, chained {chained}");
            for seed in 0..3 {
                for one_queue in [false, true] {
                    let mut model = Model::new(&calls, world, slot_bytes, slots, one_queue, chained, waits);
                    // One queue: as the GPU would run both streams in the order enqueued.
                    let left = if one_queue { model.drain(|_| 0) } else { model.drain(chooser(seed + 1)) };
                    assert_eq!(left, 0, "{what}, seed {seed}, one queue {one_queue}: deadlock");
                    model.check();
                    if one_queue {
                        // The queues in enqueue order are the same for every seed.
                        break;
                    }
                }
                // Also the queues in enqueue order, ranks chosen at random.
                let mut model = Model::new(&calls, world, slot_bytes, slots, true, chained, waits);
                assert_eq!(model.drain(chooser(seed + 100)), 0, "{what}, seed {seed}");
                model.check();
            }
        }
    }
}

/// Each call's steps in `model`'s queues with its first slot waits made one, as a pipeline
/// that waits that way enqueues them ([`first_slot_waits_together`]); the merged waits made.
fn first_waits_together(model: &mut Model<'_>, slots: usize) -> usize {
    let mut merged = 0;
    for (r, queues) in model.queues.iter_mut().enumerate() {
        for queue in queues.iter_mut() {
            let queued: Vec<Queued> = queue.drain(..).collect();
            for call in 0..model.calls.len() {
                let of_call: Vec<Queued> = queued.iter().filter(|q| q.call == call).copied().collect();
                let list = first_slot_waits_together(of_call.iter().map(|q| (q.lane, q.step)).collect(), slots);
                // The steps kept are the call's own, in order, less the first waits dropped.
                let mut kept = of_call.iter();
                for (lane, step) in list {
                    if let LegStep::WaitSlotFree { count: 2.., .. } = step {
                        merged += 1;
                        queue.push_back(Queued { call, lane, step, bound: 0 });
                    } else {
                        let q = kept.find(|q| q.step == step).expect("a kept step of the call");
                        queue.push_back(*q);
                    }
                }
            }
        }
        let left = &mut model.left[r];
        left.iter_mut().for_each(|l| *l = 0);
        queues.iter().flatten().for_each(|q| left[q.call] += 1);
    }
    merged
}

#[test]
fn first_slot_waits_made_one_still_land_every_call_whole_and_never_deadlock() {
    // A call's first waits for its slots made one wait before its first copy out: those slots
    // were last read in the call before, which ends before this one starts on the rank.
    for world in 2..=8 {
        let calls = calls(world);
        for slots in [2, 3, 4] {
            for seed in 0..3 {
                for one_queue in [false, true] {
                    let what = format!("{world} ranks, {slots} slots, seed {seed}, one queue {one_queue}");
                    let waits = LaneWaits::for_ranks(world);
                    let mut model = Model::new(&calls, world, SHARE_ALIGN, slots, one_queue, false, waits);
                    assert!(first_waits_together(&mut model, slots) >= calls.len(), "{what}: nothing merged");
                    let left = if one_queue { model.drain(|_| 0) } else { model.drain(chooser(seed + 1)) };
                    assert_eq!(left, 0, "{what}: deadlock");
                    model.check();
                }
            }
        }
    }
}

#[test]
fn runs_chained_go_on_through_each_writers_slots() {
    let slot_bytes = SHARE_ALIGN;
    for world in 3..=8 {
        let calls = calls(world);
        for slots in [2, 3] {
            // Rank 0's first copy out of each call: in slot 0 where each call starts afresh;
            // chained, some call's goes on from where the call before left off.
            let first_slots = |chained| -> Vec<usize> {
                let queued = enqueue(&calls, 0, slot_bytes, slots, chained, LaneWaits::for_ranks(world));
                (0..calls.len())
                    .filter_map(|call| {
                        queued.iter().filter(|q| q.call == call).find_map(|q| match q.step {
                            LegStep::CopyOut { slot, .. } => Some(slot),
                            _ => None,
                        })
                    })
                    .collect()
            };
            assert!(first_slots(false).iter().all(|&s| s == 0), "{world} ranks");
            assert!(first_slots(true).iter().any(|&s| s != 0), "{world} ranks, {slots} slots");
        }
    }
}

#[test]
fn the_model_sees_a_missing_wait() {
    // Drop every event wait: some order lands a chunk over data not yet sent, or sends a share
    // before it was folded, and the check or the model notices.
    let world = 4;
    let calls = calls(world);
    let mut caught = false;
    for seed in 0..12 {
        let mut model = Model::new(&calls, world, SHARE_ALIGN, 2, false, false, LaneWaits::EachChunk);
        for queues in &mut model.queues {
            for queue in queues.iter_mut() {
                queue.retain(|q| !matches!(q.step, LegStep::AfterSent { .. } | LegStep::AfterLanded { .. }));
            }
        }
        for (r, left) in model.left.iter_mut().enumerate() {
            left.iter_mut().for_each(|l| *l = 0);
            model.queues[r].iter().flatten().for_each(|q| left[q.call] += 1);
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_eq!(model.drain(chooser(seed + 7)), 0);
            model.check();
        }));
        caught |= result.is_err();
    }
    assert!(caught, "without its event waits some order must go wrong, or the model checks nothing");
}

#[test]
fn every_rank_sends_at_most_one_leg_a_round_and_lands_each_writers_at_most_once() {
    // The steps find one send per rank and round (its chunks use its slots in order), and a
    // reader lands each writer's leg of a round once.
    let world = 4;
    for rounds in [
        Rounds::all_reduce(world, 64 * SHARE_ALIGN),
        Rounds::broadcast(world, 64 * SHARE_ALIGN, 2),
        Rounds::all_gather(world, 5, false),
        Rounds::reduce_scatter(world, 5, true),
    ] {
        for round in 0..2 * world {
            for r in 0..world {
                let legs = rounds.legs.iter().filter(|l| l.round == round);
                assert!(legs.clone().filter(|l| l.writer == r).count() <= 1);
                for w in 0..world {
                    assert!(legs.clone().filter(|l| l.writer == w && l.is_read_by(r)).count() <= 1);
                }
            }
        }
    }
}

#[test]
fn a_copy_out_marks_its_readers_full_at_once_and_each_hand_back_is_one_flag() {
    // The executor writes a MarkFull's flags as one batch, and runs a landing's work after
    // its hand-back: a copy out is followed by its leg's MarkFull of its slot, the send lane
    // sets no flag else, and the receive lane only hands back, empty, what this rank landed.
    for world in 2..=8 {
        for call in calls(world) {
            for rank in 0..world {
                let steps = steps(&call.rounds, rank, SHARE_ALIGN, 3, &[], LaneWaits::for_ranks(world));
                for (i, &(lane, step)) in steps.iter().enumerate() {
                    let what = format!("{world} ranks, rank {rank}, step {i}: {step:?}");
                    match step {
                        LegStep::CopyOut { leg, slot, .. } => {
                            assert_eq!(steps.get(i + 1), Some(&(Lane::Send, LegStep::MarkFull { leg, slot })), "{what}")
                        }
                        LegStep::MarkFull { .. } => {
                            assert!(lane == Lane::Send && matches!(steps[i - 1].1, LegStep::CopyOut { .. }), "{what}")
                        }
                        LegStep::HandBack { writer, slot } => {
                            assert!(lane == Lane::Receive, "{what}");
                            let LegStep::Land { leg, slot: landed, .. } = steps[i - 1].1 else {
                                panic!("{what}: hands back what it did not land")
                            };
                            assert_eq!((call.rounds.legs[leg].writer, landed), (writer, slot), "{what}");
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

#[test]
fn a_chunk_for_every_other_rank_is_copied_out_once_with_a_flag_for_each() {
    // The all-gather among 4: each rank copies its part (2 chunks) out twice, not 6 times, sets
    // 3 flags a chunk, and lands the other 3 ranks' 2 chunks each, nearest writer before first.
    let world = 4;
    let rounds = Rounds::all_gather(world, 2 * SHARE_ALIGN, false);
    for rank in 0..world {
        let steps = steps(&rounds, rank, SHARE_ALIGN, 3, &[], LaneWaits::for_ranks(world));
        let copies = steps.iter().filter(|(_, s)| matches!(s, LegStep::CopyOut { .. })).count();
        let full: usize = steps
            .iter()
            .filter_map(|(_, s)| match *s {
                LegStep::MarkFull { leg, .. } => Some(rounds.legs[leg].readers(world).count()),
                _ => None,
            })
            .sum();
        assert_eq!((copies, full), (2, 6), "rank {rank}");
        let writers: Vec<usize> = steps
            .iter()
            .filter_map(|(_, s)| if let LegStep::WaitFull { writer, .. } = s { Some(*writer) } else { None })
            .collect();
        let before = |k: usize| (rank + world - k) % world;
        assert_eq!(writers, [1, 2, 3, 1, 2, 3].map(before), "rank {rank}");
    }
}

#[test]
fn the_all_reduces_second_half_copies_out_each_chunk_once_it_alone_is_folded() {
    // Four shares of three chunks each: the first half folds, the second hands the folded
    // share out. Chunk c of the second half waits for the last fold of chunk c alone, so it
    // goes out while later chunks still fold; one wait for every fold would hold the send
    // lane idle until the last chunk had landed. (Four ranks take one wait for every fold by
    // default, [`LaneWaits::for_ranks`]; the marks are what is checked here.)
    let world = 4;
    let rounds = Rounds::all_reduce(world, world * 3 * SHARE_ALIGN);
    let hand_out = rounds.legs.iter().map(|l| l.round).max().expect("legs");
    let last_fold = hand_out - 1;
    for rank in 0..world {
        let steps = steps(&rounds, rank, SHARE_ALIGN, 3, &[], LaneWaits::EachChunk);
        // By mark, the (round, chunk) of the landing its record follows.
        let (mut landing, mut marks, mut waited) = (None, Vec::new(), None);
        let mut copies = 0;
        for (_, step) in &steps {
            match *step {
                LegStep::Land { leg, chunk, .. } => landing = Some((rounds.legs[leg].round, chunk)),
                LegStep::RecordLanded { mark } => {
                    assert_eq!(mark, marks.len(), "rank {rank}: marks in order");
                    marks.push(landing.expect("a record after a landing"));
                }
                LegStep::AfterLanded { mark } => waited = Some(marks[mark]),
                LegStep::CopyOut { leg, chunk, .. } if rounds.legs[leg].round == hand_out => {
                    assert_eq!(
                        waited.take(),
                        Some((last_fold, chunk)),
                        "rank {rank}: chunk {chunk} waits for its fold"
                    );
                    copies += 1;
                }
                _ => {}
            }
        }
        assert_eq!(copies, 3, "rank {rank}: the folded share in three chunks");
    }
}

#[test]
fn slots_start_on_a_page_whatever_the_lines_take() {
    use crate::layout::Layout;
    for world in [2, 3, 8] {
        for lines_max_bytes in [0, 100, 2048, 40_000] {
            let options = crate::CommOptions { lines_max_bytes, small_max_bytes: 100_000, ..Default::default() };
            let layout = Layout::new(world, &options).unwrap();
            assert_eq!(layout.slot(0, 0) % 4096, 0, "{world} ranks, lines for {lines_max_bytes} bytes");
        }
    }
}
