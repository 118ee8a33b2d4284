//! Messages above the one-kernel path's size between two ranks: a pipeline of DMA copies through
//! slots of the shared segment, handed over chunk by chunk by flags the GPUs set and wait on.
//!
//! Each rank has `slots` slots of `slot_bytes` in the segment and one flag per slot, a
//! handshake between the slot's two users: its sender sets it to 1 once the slot holds a
//! chunk (a stream memory operation after the device → slot copy), its receiver back to 0
//! once it has read it (folded by a kernel that reads the mapped slot in place or, where it
//! is larger than the rank's in-place limit, copied by DMA into a scratch in device memory
//! and folded from there once the slot is handed back: see [`crate::receive`] and `release`;
//! or copied slot → device). The steps, their order and why no order a GPU may run them in deadlocks
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
use std::sync::atomic::AtomicU32;

use gp2p_cuda::raw::{GiveUp, memcpy_dtod_async, memcpy_dtoh_async, memcpy_htod_async, write_flag};
use gp2p_cuda::{Captured, Device, Event, EventKind, RawDevicePtr, SourceMemory, Stream, StreamFork, Timeline};
use gp2p_kernels::{DType, ReduceOp};

use crate::Result;
use crate::handshake::{Lane, Owner, Step, plan};
use crate::layout::Layout;
use crate::replay::{ReplayCounts, Replays};
use crate::rounds::{LegStep, Rounds, sent_after};
use marks::Marks;

mod many;
mod marks;
mod release;
mod slot_waits;
mod wait;

pub(crate) use many::{FoldInto, PieceFold, WireLand, WireLegs, WireOut};
use release::AfterRelease;
pub use slot_waits::SLOT_WAITS_VAR;
pub(crate) use slot_waits::SlotWaits;
use wait::FlagWait;
pub(crate) use wait::{LEFT, RELEASED, WATCHED_EMPTY, Waits};

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
    /// How each wait for a peer's flag runs, and how long a bounded one may last.
    pub(crate) waits: Waits,
    /// The number each lane's last watched wait took (see `wait::FlagWait`).
    pub(crate) numbers: &'a [AtomicU32; 2],
    /// Device memory of a slot's size, only for the receive stream: where a chunk to fold of
    /// more than `receive` folds in place lands by DMA first (`RankSide::scratch_for`);
    /// a smaller one, or any without a scratch, is folded from the slot in place (zero-copy).
    pub(crate) scratch: Option<RawDevicePtr>,
    pub(crate) receive: gp2p_collectives::Receive,
    /// Where a traced call stamps each step it enqueues (see [`mark`]); such a call is always
    /// enqueued, never replayed.
    pub(crate) timeline: Option<Traced<'a>>,
}

impl RankSide<'_> {
    /// This rank's waits for flags: a bounded one gives up into the rank's failed word and
    /// the communicator's broken word, and returns at once where either is set.
    fn flag_wait(&self) -> FlagWait<'_> {
        let word = |offset: usize| self.staging.device + offset as u64;
        let give_up = GiveUp { failed: word(self.layout.flag(self.rank)), broken: word(self.layout.broken()) };
        FlagWait::new(self.waits, give_up, self.numbers)
    }
}

/// A call's timeline as the communicator lends it to the call's steps: their stamps are noted
/// once, with the call's point, which every stream of the call joins before it is taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Traced<'a>(&'a Timeline);

impl<'a> Traced<'a> {
    /// # Safety
    /// Before `timeline` can be read or dropped, the caller notes on it
    /// ([`Timeline::note_use`]) a point taken after every stamp the steps enqueue with it: on
    /// the caller's stream, once the call's streams have joined back into it.
    pub(crate) unsafe fn new(timeline: &'a Timeline) -> Traced<'a> {
        Traced(timeline)
    }
}

/// Everything a call's enqueue depends on, so that a graph of it may stand for a later call
/// with the same key (`crate::replay`): the transfer and the rank's side of the staging area.
/// One pipeline serves one communicator, whose layout does not change.
#[derive(Debug)]
pub(crate) enum CallKey {
    Two(SideKey, Transfer),
    Many(SideKey, Vec<ManyTransfer>),
}

/// A [`RankSide`] but its layout, by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SideKey {
    staging: (RawDevicePtr, usize),
    rank: usize,
    waits: Waits,
    scratch: Option<RawDevicePtr>,
    receive: gp2p_collectives::Receive,
}

impl SideKey {
    fn of(side: &RankSide<'_>) -> SideKey {
        SideKey {
            staging: (side.staging.device, side.staging.host as usize),
            rank: side.rank,
            waits: side.waits,
            scratch: side.scratch,
            receive: side.receive,
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
    /// Calls in rounds, by mark (`LegStep::RecordSent`, `LegStep::RecordLanded`): recorded
    /// after the copy out, or the landing, that a chunk of the other lane then waits for.
    many_sent: Marks,
    many_landed: Marks,
    /// Per piece of this rank's shard of a compressed call, recorded on the receive stream
    /// once the piece is folded, for the second run's copy out of the fold.
    folded: Marks,
    /// How a call's first copies out wait for their slots ([`SLOT_WAITS_VAR`]).
    slot_waits: SlotWaits,
}

/// One rank's side of a call in rounds (see the `rounds` module): among more than two ranks,
/// and between two on one GPU, forced to two-shot, or compressed.
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

impl ManyTransfer {
    /// Bytes of a chunk of its legs: wires cross a slot whole (one chunk a leg), bytes in the
    /// rounds' chunks.
    pub(crate) fn chunk_bytes(&self, layout: &Layout) -> usize {
        if self.wires.is_some() { layout.slot_bytes() } else { layout.rounds_chunk() }
    }
}

impl Pipeline {
    pub(crate) fn new(device: &Device, slots: usize, slot_waits: SlotWaits) -> Result<Pipeline> {
        let events = || (0..slots).map(|_| Event::new(device, EventKind::Sync)).collect::<Result<Vec<_>, _>>();
        Ok(Pipeline {
            replays: None,
            fork: StreamFork::new(device, FORKED_STREAMS)?,
            sent: events()?,
            received: events()?,
            many_sent: Marks::default(),
            many_landed: Marks::default(),
            folded: Marks::default(),
            slot_waits,
        })
    }

    /// The event of piece `piece` of a compressed call: recorded after its fold in the two-shot,
    /// after this rank's encode of it in the one-shot (see [`Pipeline::run_chained`], which
    /// makes it before a call's enqueue).
    pub(super) fn piece_event<R>(&self, piece: usize, use_it: impl FnOnce(&Event) -> R) -> Result<R> {
        self.folded.with(self.fork.streams()[0].device(), piece, use_it)
    }

    /// Mark `mark` of the copies out (`landed` false) or the landings of a call in rounds.
    pub(super) fn many_mark<R>(&self, landed: bool, mark: usize, use_it: impl FnOnce(&Event) -> R) -> Result<R> {
        let marks = if landed { &self.many_landed } else { &self.many_sent };
        marks.with(self.fork.streams()[0].device(), mark, use_it)
    }

    /// [`Pipeline::run`] for a call in rounds (see [`ManyTransfer`]): this rank's steps of
    /// `transfer.rounds` (see [`crate::rounds::steps`]).
    ///
    /// # Safety
    /// - every leg's source range (on this rank as writer) is readable device memory and
    ///   every destination range (as reader) writable device memory on the stream's device,
    ///   within `main` or `part`, aligned for `dtype`, held until the work completes on
    ///   `stream`; `local` as for [`Transfer::local`];
    /// - for wire legs, each of `wires.folds` as [`PieceFold`]'s contract says;
    /// - `side` as for [`Pipeline::run`], with a layout for the rounds' world;
    /// - every other rank in the legs enqueues its side of the same rounds (else the waits
    ///   end at their timeout, and the destinations hold whatever the slots held).
    pub(crate) unsafe fn run_many(&self, stream: &Stream, side: RankSide<'_>, transfer: &ManyTransfer) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.run_chained(stream, side, std::slice::from_ref(transfer)) }
    }

    /// [`Pipeline::run_many`] for `runs` one after the other on the pipeline's two streams, with
    /// no join between them: each stream goes on to the next run once done with its part of
    /// the one before. What a later run needs of an earlier one crosses streams only where
    /// its legs say: a copy out of a compressed call's fold waits for that piece's fold alone
    /// (`WireLegs::after_fold`), so the second run's first pieces go up while the first run's
    /// last ones still come down. Each writer's chunks go on through its slots from run to
    /// run, so a later run's first chunk never waits for the slot an earlier run's last chunk
    /// holds. `runs[0]`'s `local` copy comes first; the others have none.
    ///
    /// # Safety
    /// As for [`Pipeline::run_many`], for each run; and a later run touches what an earlier
    /// run's legs or folds write only where its waits (the flags, `after_fold`) order it after
    /// them.
    pub(crate) unsafe fn run_chained(&self, stream: &Stream, side: RankSide<'_>, runs: &[ManyTransfer]) -> Result<()> {
        debug_assert!(runs.iter().skip(1).all(|run| run.local.is_none()), "only the first run copies locally");
        let side_key = SideKey::of(&side);
        let is_key = |k: &CallKey| matches!(k, CallKey::Many(s, t) if *s == side_key && t.as_slice() == runs);
        let key = || CallKey::Many(side_key, runs.to_vec());
        let local = runs.first().and_then(|run| run.local);
        // Made before anything is enqueued: making an event may wait for the device, which
        // must not happen between steps other ranks wait on.
        let pieces = runs.iter().filter_map(|run| run.wires.as_ref()).flat_map(|w| &w.folds).map(|f| f.piece).max();
        if let Some(piece) = pieces {
            self.piece_event(piece, |_| ())?;
        }
        // Each run's steps, each writer's chunks going on through its slots from the runs
        // before; and, made before anything is enqueued too, the events of their marks.
        let mut sent = Vec::new();
        let run_steps: Vec<Vec<(Lane, LegStep)>> = runs
            .iter()
            .map(|run| {
                let chunk_bytes = run.chunk_bytes(side.layout);
                let list = self.steps_of(run, &side, chunk_bytes, &sent);
                sent = sent_after(&run.rounds, chunk_bytes, &sent);
                list
            })
            .collect();
        for landed in [false, true] {
            let marks = run_steps.iter().flatten().filter_map(|&(_, step)| match step {
                LegStep::RecordSent { mark } if !landed => Some(mark),
                LegStep::RecordLanded { mark } if landed => Some(mark),
                _ => None,
            });
            if let Some(most) = marks.max() {
                self.many_mark(landed, most, |_| ())?;
            }
        }
        let enqueue_runs = || {
            runs.iter().zip(&run_steps).try_for_each(|(run, list)| {
                // SAFETY: the caller's contract, for each run in turn, with its steps.
                unsafe { self.enqueue_rounds(side, run, list) }
            })
        };
        // SAFETY: the caller's contract, passed on (`local` included), for the call enqueued
        // on any stream of this device and for a graph of it launched on `stream`.
        let enqueue = |on: &Stream| unsafe { self.forked(on, side, local, enqueue_runs) };
        if side.timeline.is_some() {
            return enqueue(stream);
        }
        // SAFETY: as for `enqueue`.
        unsafe { self.replayed(stream, is_key, key, enqueue) }
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
        let enqueue =
            |on: &Stream| unsafe { self.forked(on, side, transfer.local, || self.enqueue_chunks(side, transfer)) };
        if side.timeline.is_some() {
            return enqueue(stream);
        }
        // SAFETY: as for `enqueue`.
        unsafe { self.replayed(stream, is_key, key, enqueue) }
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
        side: RankSide<'_>,
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
            mark(side.timeline, stream, "caller", "local copy", bytes)?;
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
        let wait = side.flag_wait();
        let RankSide { staging, layout, rank, timeline, .. } = side;
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
        let (sends, receives) = (transfer.send.is_some(), transfer.receive.is_some());
        let (src, (dst, landing)) = (transfer.send.unwrap_or(0), transfer.receive.unwrap_or((0, Landing::Copy)));
        // A fold of the scratch waits for its slot's flag (`release`).
        let mut after_release: Option<AfterRelease> = None;
        for (lane, step) in plan(sends, receives, transfer.bytes.div_ceil(chunk_bytes), self.sent.len()) {
            let stream = if lane == Lane::Send { send } else { receive };
            // Why each call below is sound: flags and slots come from the layout, in the
            // registered area; chunk ranges lie in the caller's ranges (`src` is used only by
            // a sending rank's plan, `dst` by a receiving one's). The plan's handshakes write a
            // slot only once its flag is empty and read it only once full, and its events order
            // a landing after this rank's own copy out of the same range (see `handshake`).
            // What the step did, for a traced call's stamp (as in `enqueue_rounds`).
            let done: Option<(&str, usize)> = match step {
                Step::AfterSent { slot } => {
                    stream.wait(&self.sent[slot])?;
                    Some(("after sent", 0))
                }
                Step::AfterReceived { slot } => {
                    stream.wait(&self.received[slot])?;
                    Some(("after received", 0))
                }
                Step::RecordSent { slot } => {
                    self.sent[slot].record(stream)?;
                    None
                }
                Step::RecordReceived { slot } => {
                    self.received[slot].record(stream)?;
                    // A fold of the scratch runs after the event too: the send it lets go (the
                    // slot's next turn) reads another chunk than the fold writes, and the call's
                    // join covers it.
                    // SAFETY: the fold reads the scratch, which this stream alone uses, filled
                    // by the landing before; `dst` as for the landing.
                    unsafe { AfterRelease::run_pending(&mut after_release, lane, stream)? }
                }
                Step::WaitFlag { owner, slot, value } => {
                    // SAFETY: a flag and this rank's give-up words of the registered area.
                    unsafe { wait.enqueue(stream, lane, flag(owner, slot), 1, value)? };
                    Some(("wait flag", 0))
                }
                Step::SetFlag { owner, slot, value } => {
                    // SAFETY: a flag of the registered area.
                    unsafe { write_flag(stream, flag(owner, slot), wait.value(value))? };
                    None
                }
                Step::CopyOut { chunk, slot } => {
                    let (start, len) = range(chunk);
                    let to = host_at(layout.slot(rank, slot)).cast();
                    // SAFETY: this rank's slot, empty (the plan waited), and a chunk of `src`.
                    unsafe { memcpy_dtoh_async(stream, to, src + start as u64, len)? };
                    Some(("copy out", len))
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
                            let (from, source) = unsafe {
                                let (from, source) = land_for_fold(stream, side.scratch_for(len), host, mapped, len)?;
                                mark_landed(timeline, stream, lane, source, len)?;
                                (from, source)
                            };
                            let (dtype, bytes) = (transfer.dtype, len);
                            let fold = AfterRelease::Fold { to, from, elements, dtype, op, divide_by, source, bytes };
                            // SAFETY: the fold reads the scratch (left until the slot is handed back)
                            // or the slot (enqueued now, before the flag); `to` as for the landing.
                            unsafe { fold.now_or_after_release(stream, &mut after_release)? }
                        }
                        Landing::Copy => {
                            let from = host_at(layout.slot(peer, slot)).cast();
                            // SAFETY: as for the fold.
                            unsafe { memcpy_htod_async(stream, to, from, len)? };
                            Some(("land copy", len))
                        }
                    }
                }
            };
            if let Some((what, bytes)) = done {
                mark(timeline, stream, lane.name(), what, bytes)?;
            }
        }
        debug_assert!(after_release.is_none(), "every landing's fold is enqueued");
        Ok(())
    }
}

/// Where a fold reads a chunk of `bytes` that sits in a slot (`host` and `mapped` its two
/// mappings): the slot itself, read across the link (zero-copy), or, with a scratch, the
/// scratch after a DMA of the chunk into it on `stream`.
///
/// # Safety
/// The slot holds the chunk until what reads it on `stream` is done: the fold that follows
/// (zero-copy), or the DMA (with a scratch); `scratch`, where given, is device memory of at
/// least `bytes` that only `stream` uses.
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

/// Stamp `what` (`bytes` moved) on `stream`, called `name`, where the call is traced (`stream`
/// the caller's or one the call joins back into it).
pub(crate) fn mark(
    timeline: Option<Traced<'_>>,
    stream: &Stream,
    name: &'static str,
    what: &'static str,
    bytes: usize,
) -> Result<()> {
    Ok(stamp(timeline, stream, name, what, bytes)?)
}

/// [`mark`] with the CUDA layer's error, for hooks of that layer's calls.
pub(crate) fn stamp(
    timeline: Option<Traced<'_>>,
    stream: &Stream,
    name: &'static str,
    what: &'static str,
    bytes: usize,
) -> gp2p_cuda::Result<()> {
    match timeline {
        // SAFETY: the stamp is on a stream of the call, whose point the communicator notes on
        // the timeline (`Traced::new`'s contract).
        Some(Traced(timeline)) => unsafe { timeline.mark_unnoted(stream, name, what, bytes) },
        None => Ok(()),
    }
}

/// A traced landing's DMA into the scratch, stamped apart from the fold that follows it.
fn mark_landed(
    timeline: Option<Traced<'_>>,
    stream: &Stream,
    lane: Lane,
    source: SourceMemory,
    bytes: usize,
) -> Result<()> {
    if source == SourceMemory::Device { mark(timeline, stream, lane.name(), "land dma", bytes) } else { Ok(()) }
}
