//! The compressed all-reduce on GPUs: the rounds of [`crate::compressed::WirePlan`], each
//! rank's encodes, folds and the decode of its own pieces on its send stream, its decodes of
//! the others' pieces on its receive stream, and stream points between ranks at round
//! granularity. The wires live in two pinned areas per group (up and down), kept between
//! calls and grown when a call needs more. An owner folds into a wire in its VRAM, decodes its
//! own result from there and copies the wire's bytes that matter (not its whole room, whose
//! exact area is 4 bytes a value) to the down area for the others, so each rank's
//! link carries W up and 2(N−1)/N·W down for a buffer whose wire is W bytes, where the exact
//! ring moves 2(N−1)/N of the buffer each way.

use std::any::TypeId;

use gp2p_cuda::codec::{WireFormat, decode};
use gp2p_cuda::{Device, DeviceBuffer, Stream, StreamPoint};
use gp2p_kernels::{Element, ReduceOp};
use gp2p_pinned::{PinnedBuffer, copy_wire_to_host, decode_from_host, encode_to_host, fold_encode_from_host};

use super::{Engine, RECV, Rank, SEND, take_buffer};
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
        let widest = plan.pieces.iter().map(|p| p.wire_bytes).max().unwrap_or(0);
        let group = self.group(devices)?;
        let mut group = group.lock();
        let group = &mut *group;
        let [up, down] = std::mem::take(&mut group.wires);
        // A cached area too small is dropped: freed once the work noted on it is done.
        let mut up = cached_or_new(up, plan.up_bytes, &devices[0])?;
        let mut down = cached_or_new(down, plan.down_bytes, &devices[0])?;
        let mut folds = Vec::with_capacity(ranks.len());
        for (r, rank) in ranks.iter().enumerate() {
            let streams = group.forks[r].fork(rank.stream)?;
            // The last call's readers of these wires may still run, on any rank; only the
            // send stream writes wires.
            up.wait_last_uses(&streams[SEND])?;
            down.wait_last_uses(&streams[SEND])?;
            folds.push(take_buffer::<u8>(&mut group.buffers[r], "fold", &devices[r], widest, &streams[SEND])?);
        }
        let streams: Vec<[&Stream; 2]> = group.forks.iter().map(|f| [&f.streams()[SEND], &f.streams()[RECV]]).collect();
        let areas = [&mut up, &mut down];
        let result = enqueue_rounds(ranks, &streams, &plan, areas, &mut folds, op, format);
        let mut joined = Ok(());
        for (r, rank) in ranks.iter().enumerate() {
            joined = joined.and(group.forks[r].join(rank.stream));
        }
        for (cache, fold) in group.buffers.iter_mut().zip(folds) {
            cache.insert(("fold", TypeId::of::<u8>()), Box::new(fold));
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
/// area (send stream); each owner, once every other rank's encodes of the round are done,
/// folds its piece into its VRAM wire, decodes its own result from there and copies the wire
/// (what matters of it) to the down area (send stream, in that order, so the decode overwrites only values the
/// fold has read); every rank, once every other owner's copy of the round is done, decodes
/// their pieces into its buffer (receive stream). The encodes of a later round read other
/// values than the decodes of earlier rounds write.
fn enqueue_rounds<T: Element>(
    ranks: &mut [Rank<'_, T>],
    streams: &[[&Stream; 2]],
    plan: &WirePlan,
    [up, down]: [&mut PinnedBuffer<u8>; 2],
    folds: &mut [DeviceBuffer<u8>],
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
            encoded.push(streams[r][SEND].point()?);
        }
        let mut folded = Vec::with_capacity(ranks.len());
        for (r, rank) in ranks.iter_mut().enumerate() {
            let send = streams[r][SEND];
            if let Some(piece) = plan.round(round).find(|p| p.owner == r) {
                wait_others(send, &encoded, r)?;
                let bytes = piece.wire_bytes;
                let wires: Vec<_> = piece.up.iter().map(|at| at.map(|at| up.view(at..at + bytes))).collect();
                let own = rank.buffer.as_view().slice(piece.values.clone());
                fold_encode_from_host(send, format, &own, &wires, r, average, &mut folds[r].view_mut(..bytes))?;
                let wire = folds[r].view(..bytes);
                decode(send, format, &wire, &mut rank.buffer.slice_mut(piece.values.clone()))?;
                let to = &mut down.view_mut(piece.down..piece.down + bytes);
                copy_wire_to_host(send, format, piece.values.len(), &wire, to)?;
            }
            folded.push(send.point()?);
        }
        for (r, rank) in ranks.iter_mut().enumerate() {
            let receive = streams[r][RECV];
            wait_others(receive, &folded, r)?;
            for piece in plan.round(round).filter(|p| p.owner != r) {
                let wire = down.view(piece.down..piece.down + piece.wire_bytes);
                decode_from_host(receive, format, &wire, &mut rank.buffer.slice_mut(piece.values.clone()))?;
            }
        }
    }
    Ok(())
}

/// `stream` waits for every rank's point but rank `own`'s.
fn wait_others(stream: &Stream, points: &[StreamPoint], own: usize) -> Result<()> {
    for (q, done) in points.iter().enumerate() {
        if q != own {
            stream.wait_point(done)?;
        }
    }
    Ok(())
}
