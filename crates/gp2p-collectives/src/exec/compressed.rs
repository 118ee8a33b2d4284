//! The compressed all-reduce on GPUs: the rounds of [`crate::compressed::WirePlan`], each
//! rank's encodes, folds and the decode of its own pieces on its send stream, its decodes of
//! the others' pieces on its receive stream, and stream points between ranks at round
//! granularity. The wires live in two pinned areas per group (up and down), kept between
//! calls and grown when a call needs more; the codec runs in device memory (a stage, an
//! inbox, a fold and a landing room per rank), and a wire crosses the link as a DMA of its
//! scales and codes and a kernel for its exact blocks, never the rest of its room (4 bytes a
//! value). So each rank's link carries W up and 2(N−1)/N·W down for a buffer whose wire is W
//! bytes, where the exact ring moves 2(N−1)/N of the buffer each way.

use std::any::TypeId;

use gp2p_cuda::codec::{WireFormat, decode, encode, fold_encode};
use gp2p_cuda::{Device, DeviceBuffer, Stream, StreamPoint};
use gp2p_kernels::{Element, ReduceOp};
use gp2p_pinned::{PinnedBuffer, copy_wire_from_host, copy_wire_to_host};

use super::{Engine, RECV, Rank, SEND, take_buffer};
use crate::Result;
use crate::compressed::WirePlan;

/// Wires start on this many bytes in device memory (the codec's alignment).
const WIRE_ALIGN: usize = gp2p_cuda::raw::WIRE_ALIGN;

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
        let room = widest.next_multiple_of(WIRE_ALIGN);
        let mut vram = Vec::with_capacity(ranks.len());
        for (r, rank) in ranks.iter().enumerate() {
            let streams = group.forks[r].fork(rank.stream)?;
            // The last call's readers of these wires may still run, on any rank; only the
            // send stream writes wires.
            up.wait_last_uses(&streams[SEND])?;
            down.wait_last_uses(&streams[SEND])?;
            let cache = &mut group.buffers[r];
            let mut take = |key, len, user| take_buffer::<u8>(cache, key, &devices[r], len, user);
            vram.push(RankWires {
                fold: take("fold", room, &streams[SEND])?,
                stage: take("wire stage", room, &streams[SEND])?,
                inbox: take("wire inbox", ranks.len() * room, &streams[SEND])?,
                landing: take("wire landing", room, &streams[RECV])?,
            });
        }
        let streams: Vec<[&Stream; 2]> = group.forks.iter().map(|f| [&f.streams()[SEND], &f.streams()[RECV]]).collect();
        let areas = [&mut up, &mut down];
        let result = enqueue_rounds(ranks, &streams, &plan, areas, &mut vram, room, op, format);
        let mut joined = Ok(());
        for (r, rank) in ranks.iter().enumerate() {
            joined = joined.and(group.forks[r].join(rank.stream));
        }
        for (cache, wires) in group.buffers.iter_mut().zip(vram) {
            let RankWires { fold, stage, inbox, landing } = wires;
            for (key, buffer) in
                [("fold", fold), ("wire stage", stage), ("wire inbox", inbox), ("wire landing", landing)]
            {
                cache.insert((key, TypeId::of::<u8>()), Box::new(buffer));
            }
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

/// One rank's wires in device memory: its fold, the stage its encodes go through, a room per
/// rank for the wires it folds, and the room its receive stream lands the others' folds in.
struct RankWires {
    fold: DeviceBuffer<u8>,
    stage: DeviceBuffer<u8>,
    inbox: DeviceBuffer<u8>,
    landing: DeviceBuffer<u8>,
}

/// Round by round: every rank encodes its values of the other owners' pieces in device
/// memory and copies each wire's bytes that matter into the up area (send stream); each
/// owner, once every other rank's encodes of the round are done, copies those wires into its
/// device memory, folds its piece into its fold wire, decodes its own result from there and
/// copies the wire to the down area (send stream, in that order, so the decode overwrites only
/// values the fold has read); every rank, once every other owner's copy of the round is done,
/// copies their folds into device memory and decodes them into its buffer (receive stream).
/// Every crossing is a DMA of a wire's scales and codes and a kernel for its exact blocks
/// (`gp2p_pinned::copy_wire_to_host`, `copy_wire_from_host`). The encodes of a later round
/// read other values than the decodes of earlier rounds write.
#[allow(clippy::too_many_arguments)]
fn enqueue_rounds<T: Element>(
    ranks: &mut [Rank<'_, T>],
    streams: &[[&Stream; 2]],
    plan: &WirePlan,
    [up, down]: [&mut PinnedBuffer<u8>; 2],
    vram: &mut [RankWires],
    room: usize,
    op: ReduceOp,
    format: WireFormat,
) -> Result<()> {
    let average = op == ReduceOp::Avg;
    for round in 0..plan.rounds {
        let mut encoded = Vec::with_capacity(ranks.len());
        for (r, rank) in ranks.iter().enumerate() {
            let (send, stage) = (streams[r][SEND], &mut vram[r].stage);
            for piece in plan.round(round) {
                let Some(at) = piece.up[r] else { continue };
                let src = rank.buffer.as_view().slice(piece.values.clone());
                encode(send, format, &src, &mut stage.view_mut(..room))?;
                let to = &mut up.view_mut(at..at + piece.wire_bytes);
                copy_wire_to_host(send, format, src.len(), &stage.view(..room), to)?;
            }
            encoded.push(send.point()?);
        }
        let mut folded = Vec::with_capacity(ranks.len());
        for (r, rank) in ranks.iter_mut().enumerate() {
            let send = streams[r][SEND];
            if let Some(piece) = plan.round(round).find(|p| p.owner == r) {
                wait_others(send, &encoded, r)?;
                let (n, bytes) = (piece.values.len(), piece.wire_bytes);
                let RankWires { fold, inbox, .. } = &mut vram[r];
                for (q, at) in piece.up.iter().enumerate() {
                    let Some(at) = at else { continue };
                    let to = &mut inbox.view_mut(q * room..(q + 1) * room);
                    copy_wire_from_host(send, format, n, &up.view(*at..at + bytes), to)?;
                }
                let got: Vec<_> = piece
                    .up
                    .iter()
                    .enumerate()
                    .map(|(q, at)| at.map(|_| inbox.view(q * room..(q + 1) * room)))
                    .collect();
                let wires: Vec<_> = got.iter().map(Option::as_ref).collect();
                let own = rank.buffer.as_view().slice(piece.values.clone());
                fold_encode(send, format, &own, &wires, r, average, &mut fold.view_mut(..room))?;
                let wire = fold.view(..room);
                decode(send, format, &wire, &mut rank.buffer.slice_mut(piece.values.clone()))?;
                copy_wire_to_host(send, format, n, &wire, &mut down.view_mut(piece.down..piece.down + bytes))?;
            }
            folded.push(send.point()?);
        }
        for (r, rank) in ranks.iter_mut().enumerate() {
            let (receive, landing) = (streams[r][RECV], &mut vram[r].landing);
            wait_others(receive, &folded, r)?;
            for piece in plan.round(round).filter(|p| p.owner != r) {
                let wire = down.view(piece.down..piece.down + piece.wire_bytes);
                copy_wire_from_host(receive, format, piece.values.len(), &wire, &mut landing.view_mut(..room))?;
                decode(receive, format, &landing.view(..room), &mut rank.buffer.slice_mut(piece.values.clone()))?;
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
