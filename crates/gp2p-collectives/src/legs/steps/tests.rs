//! The steps' order, marks and slot waits, checked on every collective among 2 to 8 ranks.

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
                            |&(_, s)| if let LegStep::WaitSlotFree { slot, count: 1 } = s { Some(slot) } else { None },
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
                    assert_eq!(together[at], (Lane::Send, LegStep::WaitSlotFree { slot: 0, count }), "{what}");
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
                        .filter(|(_, s)| !matches!(s, LegStep::WaitSlotFree { count: 2.., .. }))
                        .copied()
                        .collect();
                    assert_eq!(kept, rest, "{what}");
                }
            }
        }
    }
    assert!(merged_some, "some rank writes several chunks");
    // A run that does not take slots 0, 1, … in turn is left as it is.
    let odd = vec![
        (Lane::Send, LegStep::WaitSlotFree { slot: 1, count: 1 }),
        (Lane::Send, LegStep::WaitSlotFree { slot: 2, count: 1 }),
    ];
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
                let check =
                    |me: (Buf, usize, usize), done: &[(Buf, usize, usize)], covered: usize, waited: Option<usize>| {
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
                assert_eq!(sent_waited, (0..sent_records.len()).collect::<Vec<_>>(), "{what}: each record waited once");
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
