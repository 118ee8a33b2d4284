//! Messages above the one-kernel path's size between two ranks: a pipeline of DMA copies through
//! slots of the shared segment, handed over chunk by chunk by flags the GPUs set and wait on.
//!
//! Each rank has `slots` slots of `slot_bytes` in the segment and one flag per slot, a
//! handshake between the slot's two users: its sender sets it to 1 once the slot holds a
//! chunk (a stream memory operation after the device → slot copy), its receiver back to 0
//! once it has read it (folded by a kernel that reads the mapped slot in place or, with a
//! scratch, a device copy of it made by DMA: see [`crate::receive`]; or copied slot →
//! device). The steps, their order and why no order a GPU may run them in deadlocks
//! are in [`crate::handshake`], which checks them on a model; this module turns each step into
//! one CUDA call on one of two streams forked from the caller's.
//!
//! The streams join back into the caller's (also when enqueueing fails part-way, so the
//! caller's later work still waits for whatever was enqueued), so up to `slots` chunks are in
//! flight and both directions of the link are busy at once. A call waits for the same values
//! every time and keeps no count on the host, so a CUDA graph that captured it can be
//! replayed. Every wait is the bounded wait kernel: a peer that never arrives costs one
//! timeout and marks the communicator broken in the segment, which every rank's later waits
//! and calls see.
#![allow(unsafe_code)]

use std::sync::Mutex;

use gp2p_cuda::raw::{
    Codec, GiveUp, compress_decode, compress_encode, memcpy_dtod_async, memcpy_dtoh_async, memcpy_htod_async, reduce,
    wait_flag, wait_flags, wire_from_host, wire_to_host, write_flag,
};
use gp2p_cuda::{Captured, Device, Event, EventKind, RawDevicePtr, SourceMemory, Stream, StreamFork};
use gp2p_kernels::{DType, ReduceOp};

use crate::Result;
use crate::handshake::{EMPTY, Lane, Owner, Step, plan};
use crate::layout::Layout;
use crate::replay::{ReplayCounts, Replays};
use crate::rounds::{Buf, LegLanding, LegStep, Rounds, chunk_range, steps};

/// Streams a rank's pipeline forks from the caller's: one sends, one receives.
const FORKED_STREAMS: usize = 2;

/// The streams one rank's calls run on: the caller's and the pipeline's forks. Ranks that share
/// a device's CUDA context each want that many of its hardware queues (the NCCL door checks).
pub const STREAMS_PER_RANK: usize = 1 + FORKED_STREAMS;

/// What happens to the peer's chunks where they land.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landing {
    /// `dst = op(dst, peer)`, dividing by `divide_by` for avg.
    Fold { op: ReduceOp, divide_by: u32 },
    /// `dst = peer`.
    Copy,
}

/// One rank's side of one transfer of `bytes` bytes of `dtype` (the peer enqueues the
/// matching side: it receives what this rank sends, and sends what this rank receives).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Transfer {
    pub(crate) bytes: usize,
    pub(crate) dtype: DType,
    /// Device memory this rank sends.
    pub(crate) send: Option<RawDevicePtr>,
    /// Device memory the peer's bytes land in, and how.
    pub(crate) receive: Option<(RawDevicePtr, Landing)>,
    /// A copy within this rank's device before the exchange, on the caller's stream:
    /// `(dst, src, bytes)` (this rank's own part of an all-gather or reduce-scatter).
    pub(crate) local: Option<(RawDevicePtr, RawDevicePtr, usize)>,
}

/// Where this process sees the staging area: the device's mapping (for kernels and stream
/// memory operations) and the host's (for DMA copies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staging {
    pub(crate) device: RawDevicePtr,
    pub(crate) host: *mut u8,
}

/// What a transfer needs of this rank's communicator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankSide<'a> {
    pub(crate) staging: Staging,
    pub(crate) layout: &'a Layout,
    pub(crate) rank: usize,
    /// How long each wait for the peer may last.
    pub(crate) timeout_ns: u64,
    /// Device memory of a slot's size, only for the receive stream: where a chunk to fold
    /// lands by DMA first. None: the fold reads the slot in place (zero-copy).
    pub(crate) scratch: Option<RawDevicePtr>,
}

/// Everything a call's enqueue depends on, so that a graph of it may stand for a later call
/// with the same key (`crate::replay`): the transfer and the rank's side of the staging area.
/// One pipeline serves one communicator, whose layout does not change.
#[derive(Debug)]
pub(crate) enum CallKey {
    Two(SideKey, Transfer),
    Many(SideKey, ManyTransfer),
}

/// A [`RankSide`] but its layout, by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SideKey {
    staging: (RawDevicePtr, usize),
    rank: usize,
    timeout_ns: u64,
    scratch: Option<RawDevicePtr>,
}

impl SideKey {
    fn of(side: &RankSide<'_>) -> SideKey {
        SideKey {
            staging: (side.staging.device, side.staging.host as usize),
            rank: side.rank,
            timeout_ns: side.timeout_ns,
            scratch: side.scratch,
        }
    }
}

/// The streams and events of one rank's pipeline.
pub(crate) struct Pipeline {
    /// Calls replayed from graphs, captured on a stream of their own (`crate::replay`); None:
    /// every call enqueued.
    replays: Option<(Stream, Mutex<Replays<CallKey, Captured>>)>,
    fork: StreamFork,
    /// Per slot, recorded on the send stream once this rank's chunk has left for the slot.
    sent: Vec<Event>,
    /// Per slot, recorded on the receive stream once the peer's chunk in that slot was read.
    received: Vec<Event>,
    /// More than two ranks: recorded after every copy out, and after every landing.
    many_sent: Event,
    many_landed: Event,
}

/// One rank's side of a call of more than two ranks (see the `rounds` module).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ManyTransfer {
    pub(crate) rounds: Rounds,
    pub(crate) dtype: DType,
    /// This rank's [`Buf::Main`] and [`Buf::Part`] (0 where the call has none).
    pub(crate) main: RawDevicePtr,
    pub(crate) part: RawDevicePtr,
    /// The op folds use, and what the last fold of each element divides by.
    pub(crate) op: ReduceOp,
    pub(crate) divide_by: u32,
    /// A copy within this rank's device first, on the caller's stream: `(dst, src, bytes)`.
    pub(crate) local: Option<(RawDevicePtr, RawDevicePtr, usize)>,
    /// Where every leg carries a wire of the compressed all-reduce rather than bytes: how.
    pub(crate) wires: Option<WireLegs>,
}

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
}

/// How a wire leg's copy out fills the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireOut {
    /// Encode the leg's source, values of `codec.dtype`, into it.
    Encode,
    /// Copy the wire at the leg's source into it.
    Copy,
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
    pub(crate) fn new(device: &Device, slots: usize) -> Result<Pipeline> {
        let events = || (0..slots).map(|_| Event::new(device, EventKind::Sync)).collect::<Result<Vec<_>, _>>();
        let event = || Event::new(device, EventKind::Sync);
        Ok(Pipeline {
            replays: None,
            fork: StreamFork::new(device, FORKED_STREAMS)?,
            sent: events()?,
            received: events()?,
            many_sent: event()?,
            many_landed: event()?,
        })
    }

    /// [`Pipeline::run`] for a call of more than two ranks: this rank's steps of
    /// `transfer.rounds` (see [`crate::rounds::steps`]).
    ///
    /// # Safety
    /// - every leg's source range (on this rank as writer) is readable device memory and
    ///   every destination range (as reader) writable device memory on the stream's device,
    ///   within `main` or `part`, aligned for `dtype`, held until the work completes on
    ///   `stream`; `local` as for [`Transfer::local`];
    /// - `side` as for [`Pipeline::run`], with a layout for the rounds' world;
    /// - every other rank in the legs enqueues its side of the same rounds (else the waits
    ///   end at their timeout, and the destinations hold whatever the slots held).
    pub(crate) unsafe fn run_many(&self, stream: &Stream, side: RankSide<'_>, transfer: &ManyTransfer) -> Result<()> {
        let side_key = SideKey::of(&side);
        let is_key = |k: &CallKey| matches!(k, CallKey::Many(s, t) if *s == side_key && t == transfer);
        let key = || CallKey::Many(side_key, transfer.clone());
        // SAFETY: the caller's contract, passed on (`local` included), for the call enqueued
        // on any stream of this device and for a graph of it launched on `stream`.
        unsafe {
            self.replayed(stream, is_key, key, |on| {
                self.forked(on, transfer.local, || self.enqueue_rounds(side, transfer))
            })
        }
    }

    /// How the calls ran, where they replay from graphs.
    pub(crate) fn replay_counts(&self) -> Option<ReplayCounts> {
        let (_, replays) = self.replays.as_ref()?;
        Some(replays.lock().unwrap_or_else(std::sync::PoisonError::into_inner).counts().clone())
    }

    /// Replay calls from graphs from now on (see `crate::replay`).
    pub(crate) fn replay_calls(&mut self, device: &Device) -> Result<()> {
        self.replays = Some((Stream::new(device)?, Mutex::new(Replays::new())));
        Ok(())
    }

    /// Run the call `is_key` knows (`key` makes its key) on `stream`: `enqueue` it there
    /// (`enqueue(s)` enqueues the call on stream `s`), or, with replays on and `stream` not
    /// capturing already, launch a graph of it, captured first from `enqueue` on the
    /// pipeline's capture stream.
    ///
    /// # Safety
    /// `enqueue` on any stream of this device is sound (the call's contract), and so is a
    /// launch on `stream` of what it enqueued, for a call with the same key: the key holds
    /// every buffer and size the call touches.
    unsafe fn replayed(
        &self,
        stream: &Stream,
        is_key: impl Fn(&CallKey) -> bool,
        key: impl FnOnce() -> CallKey,
        enqueue: impl Fn(&Stream) -> Result<()>,
    ) -> Result<()> {
        let Some((capturing, replays)) = &self.replays else { return enqueue(stream) };
        if stream.is_capturing()? {
            // The caller's own capture records the call as enqueued.
            return enqueue(stream);
        }
        let mut replays = replays.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let capture = || Captured::capture(capturing, || enqueue(capturing));
        // SAFETY: a graph of this very call (same key), launched where the call would be
        // enqueued: the caller's contract covers what it touches.
        let launch = |graph: &Captured| unsafe { graph.launch(stream) }.map_err(Into::into);
        replays.run(is_key, key, capture, launch, || enqueue(stream))
    }

    /// The steps of [`Pipeline::run_many`], each as one CUDA call on the forked streams.
    ///
    /// # Safety
    /// As for [`Pipeline::run_many`].
    unsafe fn enqueue_rounds(&self, side: RankSide<'_>, transfer: &ManyTransfer) -> Result<()> {
        let RankSide { staging, layout, rank, timeout_ns, scratch } = side;
        let [send, receive] = self.fork.streams() else { unreachable!("the fork was made with two streams") };
        let slot_bytes = layout.slot_bytes();
        // Wires cross a slot whole (one chunk a leg); bytes in the rounds' chunks.
        let chunk_bytes = if transfer.wires.is_some() { slot_bytes } else { layout.rounds_chunk() };
        let device_at = |offset: usize| staging.device + offset as u64;
        let host_at = |offset: usize| staging.host.wrapping_add(offset);
        let give_up = GiveUp { failed: device_at(layout.flag(rank)), broken: device_at(layout.broken()) };
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
        for (lane, step) in steps(&transfer.rounds, rank, chunk_bytes, layout.slot_count) {
            let stream = if lane == Lane::Send { send } else { receive };
            // Why each call below is sound: flags and slots come from the layout, in the
            // registered area; a leg's ranges lie in the caller's buffers (its contract). The
            // steps write a slot only once every reader's flag of it is empty and read it only
            // once this rank's flag is full, and order a copy out after this rank's landings
            // in the same range, and a landing after its copies out (see `rounds`).
            match step {
                LegStep::WaitSlotFree { slot } => {
                    let flags = device_at(layout.full(rank, slot, 0));
                    // SAFETY: this slot's `world` flags and this rank's give-up words.
                    unsafe { wait_flags(stream, flags, layout.world, EMPTY, give_up, timeout_ns)? }
                }
                LegStep::WaitFlag { writer, slot, reader, value } => {
                    let flag = device_at(layout.full(writer, slot, reader));
                    // SAFETY: a flag and this rank's give-up words of the registered area.
                    unsafe { wait_flag(stream, flag, value, give_up, timeout_ns)? }
                }
                LegStep::SetFlag { writer, slot, reader, value } => {
                    // SAFETY: a flag of the registered area.
                    unsafe { write_flag(stream, device_at(layout.full(writer, slot, reader)), value)? }
                }
                LegStep::CopyOut { leg: i, chunk, slot } if transfer.wires.is_some() => {
                    let Some(wires) = &transfer.wires else { unreachable!("matched on it") };
                    let (leg, values, block) = wire_leg(wires, i, chunk);
                    let (slot_host, slot_device) =
                        (host_at(layout.slot(rank, slot)), device_at(layout.slot(rank, slot)));
                    let wire = match wires.out {
                        WireOut::Copy => at(leg.src),
                        WireOut::Encode => wires.stages[0],
                    };
                    // SAFETY: this rank's slot, free (the steps waited), holds the wire's room
                    // (the leg's bytes, at most a slot), and so does the send stage, which only
                    // this stream uses; the leg's source holds `values` values or a wire of
                    // them (the caller's contract).
                    unsafe {
                        if wires.out == WireOut::Encode {
                            compress_encode(stream, wires.codec, at(leg.src), values, wire)?;
                        }
                        wire_to_host(stream, block, wire, values, slot_host, slot_device)?;
                    }
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
                        wire_from_host(stream, block, slot_host, slot_device, values, wire)?;
                        if wires.land == WireLand::Decode {
                            compress_decode(stream, wires.codec, wire, values, at(leg.dst))?;
                        }
                    }
                }
                LegStep::CopyOut { leg, chunk, slot } => {
                    let leg = &legs[leg];
                    let range = chunk_range(leg, chunk, chunk_bytes);
                    let to = host_at(layout.slot(rank, slot)).cast();
                    // SAFETY: this rank's slot, free (the steps waited), and a chunk of the
                    // leg's source.
                    unsafe { memcpy_dtoh_async(stream, to, at(leg.src) + range.start as u64, range.len())? }
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
                            unsafe {
                                let (from, source) = land_for_fold(stream, scratch, host, mapped, range.len())?;
                                reduce(stream, to, from, elements, transfer.dtype, transfer.op, divide_by, source)?
                            }
                        }
                        LegLanding::Copy => {
                            let from = host_at(layout.slot(leg.writer, slot)).cast();
                            // SAFETY: as for the fold.
                            unsafe { memcpy_htod_async(stream, to, from, range.len())? }
                        }
                    }
                }
                LegStep::RecordSent => self.many_sent.record(stream)?,
                LegStep::AfterSent => stream.wait(&self.many_sent)?,
                LegStep::RecordLanded => self.many_landed.record(stream)?,
                LegStep::AfterLanded => stream.wait(&self.many_landed)?,
            }
        }
        Ok(())
    }

    /// Enqueue this rank's side of `transfer` after the work queued on `stream`; work queued
    /// there afterwards sees it done. Returns once everything is enqueued.
    ///
    /// # Safety
    /// - `transfer.send` addresses `bytes` readable bytes and `transfer.receive` `bytes`
    ///   writable bytes of device memory on the stream's device, aligned for `dtype`, that stay
    ///   allocated and untouched by others until the work completes on `stream`; they are
    ///   the same range or do not overlap;
    /// - `transfer.local`'s destination and source are `bytes` bytes each of device memory on
    ///   the stream's device, apart, held likewise;
    /// - `side.staging` is where this process maps the registered staging area laid out as
    ///   `side.layout`, which stays registered until then;
    /// - the peer enqueues the matching side, with the same bytes, on a device that runs at
    ///   the same time (else the waits end at their timeout, and the destination holds
    ///   whatever the slots held).
    pub(crate) unsafe fn run(&self, stream: &Stream, side: RankSide<'_>, transfer: Transfer) -> Result<()> {
        let side_key = SideKey::of(&side);
        let is_key = |k: &CallKey| matches!(k, CallKey::Two(s, t) if *s == side_key && *t == transfer);
        let key = || CallKey::Two(side_key, transfer);
        // SAFETY: the caller's contract, passed on (`local` included), for the call enqueued
        // on any stream of this device and for a graph of it launched on `stream`.
        unsafe {
            self.replayed(stream, is_key, key, |on| {
                self.forked(on, transfer.local, || self.enqueue_chunks(side, transfer))
            })
        }
    }

    /// What both kinds of call do around their steps: releases paused, `local` copied on the
    /// caller's stream, then `enqueue` (unsafe: the caller's contract) on the streams forked
    /// from it, which join back into it whatever happened.
    ///
    /// # Safety
    /// `local` as for [`Transfer::local`]; `enqueue` may be called with the fork made, and the
    /// caller's contract covers what it enqueues.
    unsafe fn forked(
        &self,
        stream: &Stream,
        local: Option<(RawDevicePtr, RawDevicePtr, usize)>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        // Nothing the reclaimer frees may fall between this rank's chunks: a free that waits
        // for the device to go idle would wait for a chunk whose peer waits for a chunk not
        // yet enqueued here (see gp2p_cuda::pause_releases).
        let _paused = gp2p_cuda::pause_releases();
        if let Some((dst, src, bytes)) = local {
            // SAFETY: both ranges are the caller's, on this device, apart (its contract).
            unsafe { memcpy_dtod_async(stream, dst, src, bytes)? };
        }
        if let Err(e) = self.fork.fork(stream) {
            // A fork that failed part-way leaves a side stream waiting on the caller's: join it
            // back (a capture must end with every stream joined).
            let _ = self.fork.join(stream);
            return Err(e.into());
        }
        let enqueued = enqueue();
        // Joined whatever happened: the caller's later work waits for what was enqueued.
        let joined = self.fork.join(stream);
        enqueued.and(joined.map_err(Into::into))
    }

    /// The chunks of [`Pipeline::run`], on the forked streams: the steps of
    /// [`crate::handshake::plan`], each as one CUDA call.
    ///
    /// # Safety
    /// As for [`Pipeline::run`].
    unsafe fn enqueue_chunks(&self, side: RankSide<'_>, transfer: Transfer) -> Result<()> {
        let RankSide { staging, layout, rank, timeout_ns, scratch } = side;
        let [send, receive] = self.fork.streams() else { unreachable!("the fork was made with two streams") };
        let peer = 1 - rank;
        // Both ranks send and receive the same bytes, so they cut the same chunks.
        let chunk_bytes = layout.exchange_chunk(transfer.bytes);
        let device_at = |offset: usize| staging.device + offset as u64;
        // Only an address (offsets from the layout lie in the staging area); the copies use it.
        let host_at = |offset: usize| staging.host.wrapping_add(offset);
        let owner_of = |owner: Owner| if owner == Owner::Own { rank } else { peer };
        let flag = |owner: Owner, slot: usize| {
            let writer = owner_of(owner);
            device_at(layout.full(writer, slot, 1 - writer))
        };
        // Chunk `chunk`'s offset and length.
        let range = |chunk: usize| (chunk * chunk_bytes, chunk_bytes.min(transfer.bytes - chunk * chunk_bytes));
        let give_up = GiveUp { failed: device_at(layout.flag(rank)), broken: device_at(layout.broken()) };
        let (sends, receives) = (transfer.send.is_some(), transfer.receive.is_some());
        let (src, (dst, landing)) = (transfer.send.unwrap_or(0), transfer.receive.unwrap_or((0, Landing::Copy)));
        for (lane, step) in plan(sends, receives, transfer.bytes.div_ceil(chunk_bytes), self.sent.len()) {
            let stream = if lane == Lane::Send { send } else { receive };
            // Why each call below is sound: flags and slots come from the layout, in the
            // registered area; chunk ranges lie in the caller's ranges (`src` is used only by
            // a sending rank's plan, `dst` by a receiving one's). The plan's handshakes write a
            // slot only once its flag is empty and read it only once full, and its events order
            // a landing after this rank's own copy out of the same range (see `handshake`).
            match step {
                Step::AfterSent { slot } => stream.wait(&self.sent[slot])?,
                Step::AfterReceived { slot } => stream.wait(&self.received[slot])?,
                Step::RecordSent { slot } => self.sent[slot].record(stream)?,
                Step::RecordReceived { slot } => self.received[slot].record(stream)?,
                Step::WaitFlag { owner, slot, value } => {
                    // SAFETY: a flag and this rank's give-up words of the registered area.
                    unsafe { wait_flag(stream, flag(owner, slot), value, give_up, timeout_ns)? }
                }
                Step::SetFlag { owner, slot, value } => {
                    // SAFETY: a flag of the registered area.
                    unsafe { write_flag(stream, flag(owner, slot), value)? }
                }
                Step::CopyOut { chunk, slot } => {
                    let (start, len) = range(chunk);
                    let to = host_at(layout.slot(rank, slot)).cast();
                    // SAFETY: this rank's slot, empty (the plan waited), and a chunk of `src`.
                    unsafe { memcpy_dtoh_async(stream, to, src + start as u64, len)? }
                }
                Step::Land { chunk, slot } => {
                    let (start, len) = range(chunk);
                    let to = dst + start as u64;
                    match landing {
                        Landing::Fold { op, divide_by } => {
                            let (host, mapped) = (host_at(layout.slot(peer, slot)), device_at(layout.slot(peer, slot)));
                            let elements = len / transfer.dtype.size_bytes();
                            // SAFETY: the peer's slot, full (the plan waited), into a chunk of
                            // `dst`, which no other step of the call touches meanwhile; the
                            // scratch holds a slot and only this stream uses it.
                            unsafe {
                                let (from, source) = land_for_fold(stream, scratch, host, mapped, len)?;
                                reduce(stream, to, from, elements, transfer.dtype, op, divide_by, source)?
                            }
                        }
                        Landing::Copy => {
                            let from = host_at(layout.slot(peer, slot)).cast();
                            // SAFETY: as for the fold.
                            unsafe { memcpy_htod_async(stream, to, from, len)? }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Where a fold reads a chunk of `bytes` that sits in a slot (`host` and `mapped` its two
/// mappings): the slot itself, read across the link (zero-copy), or, with a scratch, the
/// scratch after a DMA of the chunk into it on `stream`.
///
/// # Safety
/// The slot holds the chunk until the fold that follows on `stream` is done; `scratch`, where
/// given, is device memory of at least `bytes` that only `stream` uses.
unsafe fn land_for_fold(
    stream: &Stream,
    scratch: Option<RawDevicePtr>,
    host: *mut u8,
    mapped: RawDevicePtr,
    bytes: usize,
) -> Result<(RawDevicePtr, SourceMemory)> {
    match scratch {
        None => Ok((mapped, SourceMemory::ZeroCopy)),
        Some(scratch) => {
            // SAFETY: the caller's contract: the slot's chunk into the scratch, both `bytes`.
            unsafe { memcpy_htod_async(stream, scratch, host.cast(), bytes)? };
            Ok((scratch, SourceMemory::Device))
        }
    }
}
