//! The legs' executor: each rank's steps of a collective's rounds (`crate::legs::steps`),
//! merged by key over every rank, run with stream points through a fan-out of pinned slots per
//! writer.

use super::*;

/// Refuses legs [`run_legs`] cannot run: one outside the ranks' buffers ([`Buf::Part`]: the
/// engine runs every collective in place), or a writer with two legs in one round (the steps
/// take one; [`crate::schedule::Schedule::to_rounds`] makes such legs, for pricing).
pub(super) fn check_runnable(rounds: &Rounds) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for (i, leg) in rounds.legs.iter().enumerate() {
        let reason = if leg.src.0 != Buf::Main || leg.dst.0 != Buf::Main {
            "reads or writes Buf::Part; the in-process engine runs every collective in place"
        } else if !seen.insert((leg.round, leg.writer)) {
            "is its writer's second leg of its round; the steps take one a writer and round"
        } else {
            continue;
        };
        return Err(Error::UnrunnableLegs { leg: i, reason });
    }
    Ok(())
}

/// Enqueue every rank's steps of `rounds`, merged by key, on the forked streams: a copy out
/// fills the writer's fan-out (waiting there for the slot's readers), a landing lands from it
/// (waiting there for the fill), and a rank's records and waits of its own sends and
/// landings are stream points. The flag steps are what those points already do.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_legs<T: Element>(
    ranks: &mut [Rank<'_, T>],
    rounds: &Rounds,
    slot_bytes: usize,
    slots: usize,
    op: ReduceOp,
    forks: &[StreamFork],
    fanouts: &mut [&mut FanOut],
    scratch: &mut [Option<DeviceBuffer<T>>],
) -> Result<()> {
    let n = ranks.len();
    let size = size_of::<T>();
    let mut merged: Vec<_> = (0..n)
        .flat_map(|r| {
            keyed_steps(rounds, r, slot_bytes, slots, &[], LaneWaits::for_ranks(rounds.world))
                .into_iter()
                .enumerate()
                .map(move |(i, s)| (s.0, r, i, s.1, s.2))
        })
        .collect();
    merged.sort_unstable_by_key(|&(key, r, i, _, _)| (key, r, i));
    // Per rank: the point after its last copy out and landing, and by mark the ones its
    // records took.
    let mut last: Vec<(Option<StreamPoint>, Option<StreamPoint>)> = vec![(None, None); n];
    let mut recorded: Vec<(Marked, Marked)> = vec![(Vec::new(), Vec::new()); n];
    let elements = |at: usize, range: std::ops::Range<usize>| (at + range.start) / size..(at + range.end) / size;
    for (_, r, _, lane, step) in merged {
        let stream = &forks[r].streams()[if lane == Lane::Send { SEND } else { RECV }];
        match step {
            LegStep::CopyOut { leg, chunk, slot } => {
                let leg = &rounds.legs[leg];
                let range = elements(leg.src.1, chunk_range(leg, chunk, slot_bytes));
                let whole = ranks[r].buffer.as_view();
                last[r].0 = Some(fanouts[r].fill(slot, stream, &whole.slice(range))?);
            }
            LegStep::Land { leg, chunk, slot } => {
                let leg = &rounds.legs[leg];
                let range = elements(leg.dst.1, chunk_range(leg, chunk, slot_bytes));
                let mut dst = ranks[r].buffer.slice_mut(range);
                let fold = match leg.landing {
                    LegLanding::Copy => Fold::Copy,
                    LegLanding::Fold { last } => {
                        let divide_by = step_divisor(op, last, n);
                        match &mut scratch[r] {
                            None => Fold::ZeroCopy { op, divide_by },
                            Some(buf) => Fold::Scratch { scratch: buf.view_mut(..), op, divide_by },
                        }
                    }
                };
                last[r].1 = Some(fanouts[leg.writer].land(slot, r, stream, &mut dst, fold)?);
            }
            LegStep::RecordSent { mark } => record(&mut recorded[r].0, mark, &last[r].0, (r, "send"))?,
            LegStep::RecordLanded { mark } => record(&mut recorded[r].1, mark, &last[r].1, (r, "receive"))?,
            LegStep::AfterSent { mark } => after(stream, &recorded[r].0, mark, (r, "send"))?,
            LegStep::AfterLanded { mark } => after(stream, &recorded[r].1, mark, (r, "receive"))?,
            // The fan-out's points are the flags: a fill waits for the slot's readers, a
            // landing for the fill.
            LegStep::WaitSlotFree { .. }
            | LegStep::MarkFull { .. }
            | LegStep::HandBack { .. }
            | LegStep::WaitFull { .. } => {}
        }
    }
    Ok(())
}

/// A rank's records of one lane, by mark.
type Marked = Vec<StreamPoint>;

/// Keep `point`, the lane's last chunk, as its record `mark`: a lane's records come
/// numbered in order, each after a chunk of the lane (`crate::legs::steps`); `(rank, lane)`
/// names them in the error where they do not ([`Error::MarkOrder`], as the transfers'
/// executor refuses a wait on a transfer not yet enqueued).
fn record(
    marks: &mut Marked,
    mark: usize,
    point: &Option<StreamPoint>,
    (rank, lane): (usize, &'static str),
) -> Result<()> {
    match point {
        Some(point) if marks.len() == mark => {
            marks.push(point.clone());
            Ok(())
        }
        _ => Err(Error::MarkOrder { rank, lane, mark, what: "recorded out of turn or before any chunk of its lane" }),
    }
}

/// Have `stream` wait for the other lane's record `mark`, which the merge by key put before.
fn after(stream: &Stream, marks: &Marked, mark: usize, (rank, lane): (usize, &'static str)) -> Result<()> {
    let point = marks.get(mark).ok_or(Error::MarkOrder { rank, lane, mark, what: "waited on before its record" })?;
    Ok(stream.wait_point(point)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_before_any_chunk_of_its_lane_is_refused_by_mark_and_lane() {
        let mut marks = Marked::new();
        match record(&mut marks, 0, &None, (3, "receive")) {
            Err(Error::MarkOrder { rank: 3, lane: "receive", mark: 0, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(marks.is_empty(), "nothing kept");
        let text = record(&mut marks, 2, &None, (1, "send")).unwrap_err().to_string();
        assert!(text.contains("mark 2 of rank 1's send lane") && text.contains("internal error"), "{text}");
    }
}
