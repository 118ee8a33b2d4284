//! The steps of a call in rounds ([`Pipeline::run_many`]: more than two ranks, two on one GPU
//! or forced to two-shot, and every compressed call): the rounds module's legs, each step one
//! CUDA call on the pipeline's send or receive stream, and the legs that carry the compressed
//! all-reduce's wires.
#![allow(unsafe_code)]

use gp2p_cuda::RawDevicePtr;
use gp2p_cuda::Stream;
use gp2p_cuda::raw::{
    Codec, MAX_FLAG_BATCH, compress_decode, compress_encode, compress_fold_decode, compress_fold_encode,
    memcpy_dtoh_async, memcpy_htod_async, wire_from_host, wire_to_host, write_flag, write_flags,
};

use super::release::AfterRelease;
use super::slot_waits::SlotWaits;
use super::{ManyTransfer, Pipeline, RankSide, Traced, Waits, land_for_fold, mark, mark_landed, stamp};
use crate::Result;
use crate::handshake::{EMPTY, FULL, Lane};
use crate::rounds::{Buf, LaneWaits, LegLanding, LegStep, chunk_range, first_slot_waits_together, steps};

/// Legs that carry wires (`gp2p_kernels::compress::WireLayout`), each leg one wire that fits
/// one slot. A wire crosses the link as a DMA of its words and codes (its first
/// `exact_offset` bytes) and a kernel that copies the values of the blocks that travel exact
/// (through the device's mapping of the slot, only where there are such blocks), never the
/// rest of its room (4 bytes a value). Encoding and decoding run in device memory, in a stage
/// of a slot's size per stream, so the copy engines carry the bulk.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WireLegs {
    pub(crate) codec: Codec,
    /// How a leg's wire gets into its writer's slot.
    pub(crate) out: WireOut,
    /// What a reader makes of it.
    pub(crate) land: WireLand,
    /// Values of each leg's wire, by leg.
    pub(crate) values: Vec<usize>,
    /// Device memory of a slot's size for the send stream's encodes and the receive stream's
    /// decodes: `[send, receive]`.
    pub(crate) stages: [RawDevicePtr; 2],
    /// The folds of this rank's pieces, each once the last wire of its piece has landed.
    pub(crate) folds: Vec<PieceFold>,
    /// By leg: the piece whose fold (of an earlier run of the same call, see
    /// [`Pipeline::run_chained`]) the leg copies out, which its copy out waits for.
    pub(crate) after_fold: Vec<Option<usize>>,
}

/// The fold of a piece on the receive stream, once the piece's last wire has landed and its
/// slot was handed back, while later pieces cross the link. On that stream a fold also comes
/// before the next landing's copy, which waits for it where its wire is there first.
///
/// - Two-shot ([`FoldInto::Gather`]), a piece of this rank's shard in the first run: its own
///   values exact and the others' wires, folded and encoded once into `out`, then decoded into
///   the piece of the output, then the piece's event is recorded for the second run's copy out
///   of the fold (`WireLegs::after_fold`).
/// - One-shot ([`FoldInto::Result`]): after the piece's event (this rank's encode of the
///   piece, [`WireOut::EncodeKept`]), every rank's wire folded straight into the piece of the
///   output.
///
/// The contract of the folds a run is given ([`Pipeline::run_many`]): each names a piece this
/// rank folds. In the two-shot a piece of its shard: `own` its values in device memory, every
/// wire address but its own a room that only a landing of these rounds writes, `out` a room
/// apart from them and `dst` the piece of the output (or `own` itself, in place), no leg
/// touching `own`, `out` or `dst`. In the one-shot the piece of the round its number names:
/// every wire address a room that only a landing of these rounds or this rank's encode of the
/// piece writes, and `dst` the piece of the output (in place, the piece of the input that
/// encode reads), which no leg touches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PieceFold {
    /// Which piece: its event is the pipeline's of that number.
    pub(crate) piece: usize,
    /// The leg whose landing completes the piece: the last of its legs in the steps.
    pub(crate) after_leg: usize,
    /// The piece's values.
    pub(crate) values: usize,
    /// Every rank's wire of the piece in rank order (for the two-shot 0 for this rank, whose
    /// values are `FoldInto::Gather::own`).
    pub(crate) wires: Vec<RawDevicePtr>,
    /// The piece of the output.
    pub(crate) dst: RawDevicePtr,
    /// Whether the fold is multiplied by the reciprocal of the ranks.
    pub(crate) average: bool,
    /// What the fold makes.
    pub(crate) into: FoldInto,
}

/// What a [`PieceFold`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FoldInto {
    /// The two-shot's fold of this rank's piece, `owner` this rank and `own` its values exact,
    /// encoded into the wire `out` for the gather and decoded into the output.
    Gather { own: RawDevicePtr, owner: usize, out: RawDevicePtr },
    /// The one-shot's result, every rank's wire decoded and folded into the output.
    Result,
}

impl PieceFold {
    /// Enqueue the fold on `stream`; for the two-shot its decode, with `piece_event` recording
    /// the piece's event between; for the one-shot after `piece_event` waited for it. What it
    /// did last, for a traced call's stamp.
    ///
    /// # Safety
    /// Every wire it reads is in device memory, written by work before it on `stream` or (the
    /// one-shot's own) before the piece's event; for the two-shot `own` holds the piece's
    /// values; all left unwritten until the fold completes. For the two-shot `out` is a room
    /// for the fold's wire apart from them; `dst` is the piece of the output (in place,
    /// `own` itself, which the fold reads before the decode writes it), which nothing else
    /// touches meanwhile; all of it this device's and allocated until then.
    unsafe fn enqueue(
        &self,
        stream: &Stream,
        codec: Codec,
        timeline: Option<Traced<'_>>,
        lane: Lane,
        piece_event: impl FnOnce() -> Result<()>,
    ) -> Result<Option<(&'static str, usize)>> {
        let (values, dst, average) = (self.values, self.dst, self.average);
        let bytes = values * codec.dtype.size_bytes();
        match self.into {
            FoldInto::Gather { own, owner, out } => {
                // SAFETY: the caller's contract.
                unsafe { compress_fold_encode(stream, codec, own, values, &self.wires, owner, average, out)? };
                mark(timeline, stream, lane.name(), "fold encode", bytes)?;
                // The fold's wire is made: what a copy out of it waits for (the decode only reads it).
                piece_event()?;
                // SAFETY: the fold just written, into the piece of the output (the caller's contract).
                unsafe { compress_decode(stream, codec, out, values, dst)? };
                Ok(Some(("decode own", bytes)))
            }
            FoldInto::Result => {
                // This rank's wire of the piece is encoded, from the input the fold may overwrite.
                piece_event()?;
                // SAFETY: the caller's contract.
                unsafe { compress_fold_decode(stream, codec, &self.wires, values, average, dst)? };
                Ok(Some(("fold decode", bytes)))
            }
        }
    }
}

/// How a wire leg's copy out fills the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireOut {
    /// Encode the leg's source, values of `codec.dtype`, into it.
    Encode,
    /// Encode the leg's source into this rank's room at the leg's destination (where its
    /// readers land it: the one-shot's rooms lie alike on every rank), copy that into it, and
    /// record the piece's event (the leg's round) once encoded, for this rank's fold of it.
    EncodeKept,
    /// Copy the wire at the leg's source into it.
    Copy,
}

impl WireOut {
    /// Where a leg's wire is encoded, if it is: `stage` the send stage, `kept` the room.
    fn encoded_at(self, stage: RawDevicePtr, kept: RawDevicePtr) -> Option<RawDevicePtr> {
        match self {
            WireOut::Encode => Some(stage),
            WireOut::EncodeKept => Some(kept),
            WireOut::Copy => None,
        }
    }
}

/// How a reader lands a wire leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireLand {
    /// Copy the wire into the destination.
    Copy,
    /// Decode it into the destination's values of `codec.dtype`.
    Decode,
}

impl Pipeline {
    /// This rank's steps of `run` in chunks of `chunk_bytes` after runs that wrote `sent`
    /// (`crate::rounds::steps`), a first run's first slot waits made one where this
    /// pipeline's [`SlotWaits`] says so and the waits are the wait kernel's.
    pub(super) fn steps_of(
        &self,
        run: &ManyTransfer,
        side: &RankSide<'_>,
        chunk_bytes: usize,
        sent: &[usize],
    ) -> Vec<(Lane, LegStep)> {
        let (world, slots) = (run.rounds.world, side.layout.slot_count);
        let list = steps(&run.rounds, side.rank, chunk_bytes, slots, sent, LaneWaits::for_ranks(world));
        let bounded = matches!(side.waits, Waits::Bounded { .. });
        if self.slot_waits == SlotWaits::Together && sent.is_empty() && bounded {
            first_slot_waits_together(list, slots)
        } else {
            list
        }
    }

    /// `steps`, this rank's of `transfer` (`crate::rounds::steps`, going on through each
    /// writer's slots from the runs chained before), each as one CUDA call on the forked
    /// streams; the events of their marks are made already.
    ///
    /// # Safety
    /// As for [`Pipeline::run_many`].
    pub(super) unsafe fn enqueue_rounds(
        &self,
        side: RankSide<'_>,
        transfer: &ManyTransfer,
        steps: &[(Lane, LegStep)],
    ) -> Result<()> {
        let wait = side.flag_wait();
        let RankSide { staging, layout, rank, timeline, .. } = side;
        let [send, receive] = self.fork.streams() else { unreachable!("the fork was made with two streams") };
        let slot_bytes = layout.slot_bytes();
        let chunk_bytes = transfer.chunk_bytes(layout);
        let device_at = |offset: usize| staging.device + offset as u64;
        let host_at = |offset: usize| staging.host.wrapping_add(offset);
        let at = |(buf, offset): (Buf, usize)| {
            (if buf == Buf::Main { transfer.main } else { transfer.part }) + offset as u64
        };
        let legs = &transfer.rounds.legs;
        // A wire leg (one chunk): the leg, its wire's values and block.
        let wire_leg = |wires: &WireLegs, i: usize, chunk: usize| {
            let (leg, values, block) = (&legs[i], wires.values[i], wires.codec.block);
            debug_assert!(chunk == 0 && leg.bytes <= slot_bytes, "a wire leg is one chunk");
            (leg, values, block)
        };
        // A wire leg encoded while its slot was still being waited for (see `WaitSlotFree`).
        let mut encoded: Option<usize> = None;
        // What a landing leaves to do once its slot is handed back (see `Land`).
        let mut after_release: Option<AfterRelease> = None;
        // A piece's fold due once the landing that completes it hands its slot back.
        let mut fold_due: Option<&PieceFold> = None;
        for (at_step, &(lane, step)) in steps.iter().enumerate() {
            let stream = if lane == Lane::Send { send } else { receive };
            // Why each call below is sound: flags and slots come from the layout, in the
            // registered area; a leg's ranges lie in the caller's buffers (its contract). The
            // steps write a slot only once every reader's flag of it is empty and read it only
            // once this rank's flag is full, and order a copy out after this rank's landings
            // in the same range, and a landing after its copies out (see `rounds`).
            // What the step did, for a traced call's stamp after it (none after a flag's write
            // or an event's record, which take no time of their own).
            let done: Option<(&str, usize)> = match step {
                LegStep::WaitSlotFree { slot, count } => {
                    // A wire leg's encode writes only the send stage, which this stream's earlier
                    // copies out have finished with: it runs before the wait, off the path from
                    // a slot handed back to its next copy out.
                    if let (Some(wires), Some((_, LegStep::CopyOut { leg: i, chunk, .. }))) =
                        (&transfer.wires, steps.get(at_step + 1))
                        && let Some(wire) = wires.out.encoded_at(wires.stages[0], at(legs[*i].dst))
                    {
                        let (leg, values, _) = wire_leg(wires, *i, *chunk);
                        // SAFETY: the leg's source holds `values` values (the caller's contract;
                        // any landing it waits for was waited for before this step); the send
                        // stage holds a slot's bytes and only this stream uses it, and a kept
                        // wire's room is this rank's alone until its fold, which waits for the
                        // piece's event recorded below.
                        unsafe { self.encode_wire(stream, wires, leg.round, values, wire, at(leg.src), timeline)? };
                        encoded = Some(*i);
                    }
                    // `steps` and `first_slot_waits_together` wait for slots of this rank's only.
                    debug_assert!(slot + count <= layout.slot_count, "slots {slot}+{count} of {}", layout.slot_count);
                    let flags = device_at(layout.full(rank, slot, 0));
                    // SAFETY: the `world` flags of each of these slots, this rank's (asserted
                    // above), which lie side by side (`Layout::full`), and its give-up words.
                    unsafe { wait.enqueue(stream, lane, flags, count * layout.world, EMPTY)? };
                    Some(("wait slot free", 0))
                }
                LegStep::WaitFull { writer, slot } => {
                    let flag = device_at(layout.full(writer, slot, rank));
                    // SAFETY: a flag and this rank's give-up words of the registered area.
                    unsafe { wait.enqueue(stream, lane, flag, 1, FULL)? };
                    Some(("wait flag", 0))
                }
                LegStep::MarkFull { leg, slot } => {
                    // The readers' flags in one write: a leg has at most world − 1 readers.
                    const { assert!(crate::MAX_RANKS - 1 <= MAX_FLAG_BATCH) };
                    let mut batch = [0; MAX_FLAG_BATCH];
                    let mut count = 0;
                    for reader in legs[leg].readers(layout.world) {
                        batch[count] = device_at(layout.full(rank, slot, reader));
                        count += 1;
                    }
                    // SAFETY: flags of the registered area.
                    unsafe { write_flags(stream, &batch[..count], wait.value(FULL))? };
                    None
                }
                LegStep::HandBack { writer, slot } => {
                    // SAFETY: a flag of the registered area.
                    unsafe { write_flag(stream, device_at(layout.full(writer, slot, rank)), wait.value(EMPTY))? };
                    // SAFETY: the landing's bytes sit in device memory this stream alone uses
                    // (the receive stage or the scratch), put there by its earlier work; the
                    // destination is the leg's, which nothing else of the call touches
                    // meanwhile; the slot, handed back above, is not read.
                    let pending = unsafe { AfterRelease::run_pending(&mut after_release, lane, stream)? };
                    // Likewise a piece's fold, once the landing that completed it handed back
                    // (hand-backs are on the receive lane, as the fold).
                    match (fold_due.take(), &transfer.wires) {
                        (Some(fold), Some(wires)) => {
                            debug_assert!(pending.is_none(), "a wire landed by copy leaves no work");
                            // The two-shot records the piece's event once the fold's wire is made
                            // (a later run's copy out of it waits for it); the one-shot waits
                            // for it (this rank's encode of the piece).
                            let piece_event = || match fold.into {
                                FoldInto::Gather { .. } => Ok(self.piece_event(fold.piece, |e| e.record(stream))??),
                                FoldInto::Result => Ok(self.piece_event(fold.piece, |e| stream.wait(e))??),
                            };
                            // The one-shot's piece p travels in round p, whose encode records its event.
                            let in_its_round = fold.piece == legs[fold.after_leg].round;
                            debug_assert!(
                                fold.into != FoldInto::Result || in_its_round,
                                "one-shot piece off its round"
                            );
                            // SAFETY: the piece's wires were landed by this stream (its last
                            // just now), into rooms of the call's wire memory that no leg of
                            // the run writes again. Two-shot: its own values are the input's,
                            // which the run only reads, and which no leg reads where the decode
                            // writes (a rank sends only the other shards); its fold's room and
                            // piece of the output are its own (the caller's contract). One-shot:
                            // its own wire is its encode's, which the event's wait orders before
                            // the fold, and so is that encode's read of the input the fold may
                            // overwrite in place; no copy out reads the input after the encode.
                            unsafe { fold.enqueue(stream, wires.codec, timeline, lane, piece_event)? }
                        }
                        _ => pending,
                    }
                }
                LegStep::CopyOut { leg: i, chunk, slot } if transfer.wires.is_some() => {
                    let Some(wires) = &transfer.wires else { unreachable!("matched on it") };
                    let (leg, values, block) = wire_leg(wires, i, chunk);
                    let (slot_host, slot_device) =
                        (host_at(layout.slot(rank, slot)), device_at(layout.slot(rank, slot)));
                    let wire = wires.out.encoded_at(wires.stages[0], at(leg.dst)).unwrap_or(at(leg.src));
                    // A fold an earlier run made: its piece's event, recorded there after it.
                    if let Some(piece) = wires.after_fold.get(i).copied().flatten() {
                        self.piece_event(piece, |event| stream.wait(event))??;
                    }
                    // SAFETY: this rank's slot, free (the steps waited), holds the wire's room
                    // (the leg's bytes, at most a slot), and so does the send stage, which only
                    // this stream uses; the leg's source holds `values` values or a wire of
                    // them (the caller's contract).
                    unsafe {
                        if wires.out != WireOut::Copy && encoded.take() != Some(i) {
                            self.encode_wire(stream, wires, leg.round, values, wire, at(leg.src), timeline)?;
                        }
                        let dma = |bytes| stamp(timeline, stream, lane.name(), "wire dma", bytes);
                        wire_to_host(stream, block, wire, values, slot_host, slot_device, dma)?;
                    }
                    Some(("exact blocks", 0))
                }
                LegStep::Land { leg: i, chunk, slot } if transfer.wires.is_some() => {
                    let Some(wires) = &transfer.wires else { unreachable!("matched on it") };
                    let (leg, values, block) = wire_leg(wires, i, chunk);
                    let (slot_host, slot_device) =
                        (host_at(layout.slot(leg.writer, slot)), device_at(layout.slot(leg.writer, slot)));
                    let wire = match wires.land {
                        WireLand::Copy => at(leg.dst),
                        WireLand::Decode => wires.stages[1],
                    };
                    // SAFETY: the writer's slot, full (the steps waited), holding the leg's
                    // wire; into a room for it, the leg's destination or the receive stage
                    // (only this stream uses it), which nothing else of the call touches
                    // meanwhile; the words the exact blocks' copy reads are the ones the DMA
                    // just put there (same stream).
                    unsafe {
                        let dma = |bytes| stamp(timeline, stream, lane.name(), "wire dma", bytes);
                        wire_from_host(stream, block, slot_host, slot_device, values, wire, dma)?;
                    }
                    // The piece this landing completes folds once the slot is handed back.
                    debug_assert!(fold_due.is_none(), "a piece's fold left behind");
                    fold_due = wires.folds.iter().find(|f| f.after_leg == i);
                    // The decode reads the receive stage only: it runs once the slot is handed
                    // back, off the path from the writer's copy out to its next one.
                    if wires.land == WireLand::Decode {
                        let (codec, dst, bytes) = (wires.codec, at(leg.dst), values * transfer.dtype.size_bytes());
                        let decode = AfterRelease::Decode { codec, wire, values, dst, bytes };
                        // SAFETY: the decode reads the stage, so it waits for the hand-back.
                        unsafe { decode.now_or_after_release(stream, &mut after_release)? };
                    }
                    Some(("exact blocks", 0))
                }
                LegStep::CopyOut { leg, chunk, slot } => {
                    let leg = &legs[leg];
                    let range = chunk_range(leg, chunk, chunk_bytes);
                    let to = host_at(layout.slot(rank, slot)).cast();
                    // SAFETY: this rank's slot, free (the steps waited), and a chunk of the
                    // leg's source.
                    unsafe { memcpy_dtoh_async(stream, to, at(leg.src) + range.start as u64, range.len())? };
                    Some(("copy out", range.len()))
                }
                LegStep::Land { leg, chunk, slot } => {
                    let leg = &legs[leg];
                    let range = chunk_range(leg, chunk, chunk_bytes);
                    let to = at(leg.dst) + range.start as u64;
                    match leg.landing {
                        LegLanding::Fold { last } => {
                            let (host, mapped) =
                                (host_at(layout.slot(leg.writer, slot)), device_at(layout.slot(leg.writer, slot)));
                            let elements = range.len() / transfer.dtype.size_bytes();
                            let divide_by = if last { transfer.divide_by } else { 1 };
                            // SAFETY: the writer's slot, full (the steps waited), into a chunk
                            // of the leg's destination, which nothing else of the call touches
                            // meanwhile; the scratch holds a slot and only this stream uses it.
                            let (from, source) = unsafe {
                                let scratch = side.scratch_for(range.len());
                                let (from, source) = land_for_fold(stream, scratch, host, mapped, range.len())?;
                                mark_landed(timeline, stream, lane, source, range.len())?;
                                (from, source)
                            };
                            let (dtype, op, bytes) = (transfer.dtype, transfer.op, range.len());
                            let fold = AfterRelease::Fold { to, from, elements, dtype, op, divide_by, source, bytes };
                            // SAFETY: the fold reads the scratch (left until the slot is handed back)
                            // or the slot (enqueued now, before the flag); `to` as for the landing.
                            unsafe { fold.now_or_after_release(stream, &mut after_release)? }
                        }
                        LegLanding::Copy => {
                            let from = host_at(layout.slot(leg.writer, slot)).cast();
                            // SAFETY: as for the fold.
                            unsafe { memcpy_htod_async(stream, to, from, range.len())? };
                            Some(("land copy", range.len()))
                        }
                    }
                }
                LegStep::RecordSent { mark } => {
                    self.many_mark(false, mark, |event| event.record(stream))??;
                    None
                }
                LegStep::AfterSent { mark } => {
                    self.many_mark(false, mark, |event| stream.wait(event))??;
                    Some(("after sent", 0))
                }
                LegStep::RecordLanded { mark } => {
                    self.many_mark(true, mark, |event| event.record(stream))??;
                    None
                }
                LegStep::AfterLanded { mark } => {
                    self.many_mark(true, mark, |event| stream.wait(event))??;
                    Some(("after landed", 0))
                }
            };
            if let Some((what, bytes)) = done {
                mark(timeline, stream, lane.name(), what, bytes)?;
            }
        }
        debug_assert!(after_release.is_none(), "every landing's fold and decode is enqueued");
        debug_assert!(fold_due.is_none(), "every piece's fold is enqueued");
        Ok(())
    }

    /// Encode `values` values at `src` into `wire` on the send `stream` for a wire leg of round
    /// `round`; where the wire is kept ([`WireOut::EncodeKept`]), then record the piece's event
    /// (the leg's round) for this rank's fold of it.
    ///
    /// # Safety
    /// `src` holds `values` values of the codec's type and `wire` a room for their wire, both
    /// this device's, apart, and nothing else writes `src` or touches `wire` until the encode
    /// completes (for a kept wire, until the fold that waits for the event).
    #[allow(clippy::too_many_arguments)]
    unsafe fn encode_wire(
        &self,
        stream: &Stream,
        wires: &WireLegs,
        round: usize,
        values: usize,
        wire: RawDevicePtr,
        src: RawDevicePtr,
        timeline: Option<Traced<'_>>,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { compress_encode(stream, wires.codec, src, values, wire)? };
        mark(timeline, stream, Lane::Send.name(), "encode", values * wires.codec.dtype.size_bytes())?;
        if wires.out == WireOut::EncodeKept {
            self.piece_event(round, |event| event.record(stream))??;
        }
        Ok(())
    }
}
