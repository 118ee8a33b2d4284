//! The compressed all-reduce on GPUs: the rounds of [`crate::compressed::WirePlan`], each
//! rank's encodes and folds on its send stream, its decodes on its receive stream, and
//! stream points between ranks at round granularity. The wires live in one pinned buffer
//! per group, kept between calls and grown when a call needs more.

use gp2p_cuda::codec::WireFormat;
use gp2p_cuda::{Device, Event, EventKind, Stream};
use gp2p_kernels::{Element, ReduceOp};
use gp2p_pinned::{PinnedBuffer, decode_from_host, encode_to_host, fold_encode_from_host};

use super::{Engine, RECV, Rank, SEND};
use crate::Result;
use crate::compressed::WirePlan;

impl Engine {
    /// Every rank's buffer becomes the compressed sum (or average) of all ranks' buffers: see
    /// [`crate::all_reduce_compressed`], which checks the arguments first.
    pub(crate) fn run_compressed<T: Element>(
        &self,
        ranks: &mut [Rank<'_, T>],
        devices: &[Device],
        op: ReduceOp,
        format: WireFormat,
    ) -> Result<()> {
        let plan = WirePlan::new(ranks[0].buffer.len(), ranks.len(), format);
        let group = self.group(devices)?;
        let mut group = group.lock();
        let [up, down] = std::mem::take(&mut group.wires);
        // A cached area too small is dropped: freed once the work noted on it is done.
        let mut up = cached_or_new(up, plan.up_bytes, &devices[0])?;
        let mut down = cached_or_new(down, plan.down_bytes, &devices[0])?;
        let forks = &group.forks;
        for (r, rank) in ranks.iter().enumerate() {
            let streams = forks[r].fork(rank.stream)?;
            // The last call's readers of these wires may still run, on any rank; only the
            // send stream writes wires.
            up.wait_last_uses(&streams[SEND])?;
            down.wait_last_uses(&streams[SEND])?;
        }
        let streams: Vec<[&Stream; 2]> = forks.iter().map(|f| [&f.streams()[SEND], &f.streams()[RECV]]).collect();
        let result = enqueue_rounds(ranks, devices, &streams, &plan, [&mut up, &mut down], op, format);
        let mut joined = Ok(());
        for (r, rank) in ranks.iter().enumerate() {
            joined = joined.and(forks[r].join(rank.stream));
        }
        group.wires = [Some(up), Some(down)];
        result?;
        Ok(joined?)
    }
}

/// `cached` if it holds `bytes`, else a new pinned buffer that does.
fn cached_or_new(cached: Option<PinnedBuffer<u8>>, bytes: usize, device: &Device) -> Result<PinnedBuffer<u8>> {
    match cached {
        Some(buffer) if buffer.len() >= bytes => Ok(buffer),
        _ => Ok(PinnedBuffer::alloc(device, bytes.max(1))?),
    }
}

/// Round by round: every rank encodes its values of the other owners' pieces into the up
/// area (send stream); each owner, once every rank's encodes of the round are done, folds its
/// piece and encodes the fold into the down area (send stream); every rank, once every
/// owner's fold of the round is done, decodes every piece of the round into its buffer
/// (receive stream). An owner decodes its own piece only after the round's folds, so never
/// over values its fold still reads; the encodes of a later round read other values than
/// the decodes of earlier rounds write.
fn enqueue_rounds<T: Element>(
    ranks: &mut [Rank<'_, T>],
    devices: &[Device],
    streams: &[[&Stream; 2]],
    plan: &WirePlan,
    [up, down]: [&mut PinnedBuffer<u8>; 2],
    op: ReduceOp,
    format: WireFormat,
) -> Result<()> {
    let average = op == ReduceOp::Avg;
    for round in 0..plan.rounds {
        let mut encoded = Vec::with_capacity(ranks.len());
        for (r, rank) in ranks.iter().enumerate() {
            for piece in plan.round(round) {
                let Some(at) = piece.up[r] else { continue };
                let src = rank.buffer.as_view().slice(piece.values.clone());
                encode_to_host(streams[r][SEND], format, &src, &mut up.view_mut(at..at + piece.wire_bytes))?;
            }
            encoded.push(point(&devices[r], streams[r][SEND])?);
        }
        let mut folded = Vec::with_capacity(ranks.len());
        for (r, rank) in ranks.iter().enumerate() {
            if let Some(piece) = plan.round(round).find(|p| p.owner == r) {
                for (q, done) in encoded.iter().enumerate() {
                    if q != r {
                        streams[r][SEND].wait(done)?;
                    }
                }
                let wires: Vec<_> = piece.up.iter().map(|at| at.map(|at| up.view(at..at + piece.wire_bytes))).collect();
                let own = rank.buffer.as_view().slice(piece.values.clone());
                let mut out = down.view_mut(piece.down..piece.down + piece.wire_bytes);
                fold_encode_from_host(streams[r][SEND], format, &own, &wires, r, average, &mut out)?;
            }
            folded.push(point(&devices[r], streams[r][SEND])?);
        }
        for (r, rank) in ranks.iter_mut().enumerate() {
            for done in &folded {
                streams[r][RECV].wait(done)?;
            }
            for piece in plan.round(round) {
                let wire = down.view(piece.down..piece.down + piece.wire_bytes);
                let mut dst = rank.buffer.slice_mut(piece.values.clone());
                decode_from_host(streams[r][RECV], format, &wire, &mut dst)?;
            }
        }
    }
    Ok(())
}

/// An event recorded on `stream` now, for other ranks' streams to wait on.
fn point(device: &Device, stream: &Stream) -> Result<Event> {
    let event = Event::new(device, EventKind::Sync)?;
    event.record(stream)?;
    Ok(event)
}
