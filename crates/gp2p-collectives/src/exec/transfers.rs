//! The ring's executor: a schedule's transfers, each a chunk sent through its ring edge's
//! staging slots and folded or copied in on the receiver, with the waits that order them.

use super::*;

/// What one transfer waits for, besides its ring's slot, as indices of earlier transfers of
/// the schedule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Waits {
    /// The sender's send stream waits for this transfer's fold into the sender (a chunk is
    /// forwarded only once it has arrived).
    pub(super) send_after_fold: Option<usize>,
    /// The receiver's receive stream waits for this transfer's send from the receiver (a
    /// range is overwritten only once it has been sent).
    pub(super) receive_after_send: Option<usize>,
}

/// Which earlier transfer each transfer of `schedule` waits for, in the order the executor
/// enqueues (a group's sends, then its receives). Pure: worked out once per call, before
/// anything is enqueued. The waits name the stream points the staging rings take anyway
/// (*landed* after a send, the fold's point after a receive), so no event is recorded for
/// them.
pub(super) fn plan_waits(schedule: &Schedule) -> Vec<Waits> {
    let n = schedule.ranks;
    // Per rank, by range start: the transfer that last received into / sent from it.
    let mut last_received: Vec<HashMap<usize, usize>> = vec![HashMap::new(); n];
    let mut last_sent: Vec<HashMap<usize, usize>> = vec![HashMap::new(); n];
    let mut waits = vec![Waits::default(); schedule.transfers.len()];
    let mut first = 0;
    for group in schedule.groups() {
        let indices = first..first + group.len();
        first = indices.end;
        for (i, t) in indices.clone().zip(group) {
            waits[i].send_after_fold = last_received[t.from].get(&t.range.start).copied();
            last_sent[t.from].insert(t.range.start, i);
        }
        for (i, t) in indices.zip(group) {
            waits[i].receive_after_send = last_sent[t.to].get(&t.range.start).copied();
            last_received[t.to].insert(t.range.start, i);
        }
    }
    waits
}

/// Enqueue every transfer of `schedule` on the forked streams, through each sender's
/// ring edge, with the waits `waits` lays out.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_transfers<T: Element>(
    ranks: &mut [Rank<'_, T>],
    schedule: &Schedule,
    waits: &[Waits],
    op: ReduceOp,
    forks: &[StreamFork],
    rings: &mut [&mut StagingRing],
    scratch: &mut [Option<DeviceBuffer<T>>],
) -> Result<()> {
    let n = ranks.len();
    let count = schedule.transfers.len();
    let (mut landed, mut folded): (Vec<Option<StreamPoint>>, Vec<Option<StreamPoint>>) =
        (vec![None; count], vec![None; count]);
    let earlier = |points: &[Option<StreamPoint>], j: usize| -> Result<StreamPoint> {
        points[j].clone().ok_or(Error::ScheduleOrder { transfer: j })
    };
    let mut first = 0;
    for group in schedule.groups() {
        let indices = first..first + group.len();
        first = indices.end;
        // Every send of a group before any receive: a rank's receive may overwrite the range
        // its own send of the group reads.
        let mut sent = Vec::with_capacity(group.len());
        for (i, t) in indices.clone().zip(group) {
            let send = &forks[t.from].streams()[SEND];
            if let Some(j) = waits[i].send_after_fold {
                send.wait_point(&earlier(&folded, j)?)?;
            }
            let whole = ranks[t.from].buffer.as_view();
            let chunk = rings[t.from].send(send, &whole.slice(t.range.clone()))?;
            landed[i] = Some(chunk.landed().clone());
            sent.push(chunk);
        }
        for ((i, t), chunk) in indices.zip(group).zip(sent) {
            let recv = &forks[t.to].streams()[RECV];
            if let Some(j) = waits[i].receive_after_send {
                recv.wait_point(&earlier(&landed, j)?)?;
            }
            let mut dst = ranks[t.to].buffer.slice_mut(t.range.clone());
            let fold = match t.action {
                Action::Copy => Fold::Copy,
                Action::Reduce { last } => {
                    let divide_by = step_divisor(op, last, n);
                    match &mut scratch[t.to] {
                        None => Fold::ZeroCopy { op, divide_by },
                        Some(buf) => Fold::Scratch { scratch: buf.view_mut(..), op, divide_by },
                    }
                }
            };
            folded[i] = Some(rings[t.from].receive(chunk, recv, &mut dst, fold)?);
        }
    }
    Ok(())
}
