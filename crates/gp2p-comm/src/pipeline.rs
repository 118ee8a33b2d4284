//! Messages above the line path's size between two ranks: a pipeline of DMA copies through
//! slots of the shared segment, handed over chunk by chunk by flags the GPUs set and wait on.
//!
//! Each rank has `slots` slots of `slot_bytes` in the segment and one flag per slot, a
//! handshake between the slot's two users: its sender sets it to 1 once the slot holds a
//! chunk, its receiver (the peer) back to 0 once it has read it, and each waits for the
//! other's value before touching the slot. Chunk `i` of a call goes through slot
//! `i % slots` on both ranks. Per chunk:
//!
//! - the send stream waits for the slot's flag to be 0, copies the chunk device → slot (DMA),
//!   and sets the flag to 1 (a stream memory operation, after the copy);
//! - the receive stream waits for the peer's flag to be 1 (and, when this rank also sends, for
//!   its own copy of the chunk, by an event: in place, the fold overwrites what the send copies
//!   out), then folds the peer's slot into the destination with a kernel that reads the mapped
//!   slot in place, or copies it slot → device (DMA), and sets the peer's flag back to 0.
//!
//! The two streams fork from the caller's stream and join back into it (also when enqueueing
//! fails part-way, so the caller's later work still waits for whatever was enqueued), so up
//! to `slots` chunks are in flight and both directions of the link are busy at once. The send
//! of chunk `i` also waits, by an event, for this rank's receive of chunk `i - slots` (the
//! same slot's previous turn): the handshakes already order them across ranks, and with the
//! event every order in which a GPU may run the two streams' work (a graph's branches on one
//! queue, say) is free of deadlock. A call waits for the same values every time and keeps no
//! count on the host, so a CUDA graph that captured it can be replayed. Every wait is the
//! bounded wait kernel: a peer that never arrives costs one timeout and marks the
//! communicator broken in the segment, which every rank's later waits and calls see.
#![allow(unsafe_code)]

use gp2p_cuda::raw::{GiveUp, memcpy_dtod_async, memcpy_dtoh_async, memcpy_htod_async, reduce, wait_flag, write_flag};
use gp2p_cuda::{Device, Event, EventKind, RawDevicePtr, SourceMemory, Stream, StreamFork};
use gp2p_kernels::{DType, ReduceOp};

use crate::Result;
use crate::communicator::Layout;

/// A slot's flag: empty (the sender may write it) or full (the receiver may read it).
const EMPTY: u32 = 0;
const FULL: u32 = 1;

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
#[derive(Debug, Clone, Copy)]
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

/// The streams and events of one rank's pipeline.
pub(crate) struct Pipeline {
    fork: StreamFork,
    /// Per slot, recorded on the send stream once this rank's chunk has left for the slot.
    sent: Vec<Event>,
    /// Per slot, recorded on the receive stream once the peer's chunk in that slot was read.
    received: Vec<Event>,
}

impl Pipeline {
    pub(crate) fn new(device: &Device, slots: usize) -> Result<Pipeline> {
        let events = || (0..slots).map(|_| Event::new(device, EventKind::Sync)).collect::<Result<Vec<_>, _>>();
        Ok(Pipeline { fork: StreamFork::new(device, 2)?, sent: events()?, received: events()? })
    }

    /// Enqueue this rank's side of `transfer` after the work queued on `stream`; work queued
    /// there afterwards sees it done. Returns once everything is enqueued.
    ///
    /// # Safety
    /// - `transfer.send` addresses `bytes` readable bytes and `transfer.receive` `bytes`
    ///   writable bytes of device memory on the stream's device, aligned for `dtype`, that stay
    ///   allocated and untouched by others until the work completes on `stream`; they are
    ///   the same range or do not overlap;
    /// - `staging` is where this process maps the registered staging area laid out as
    ///   `layout`, which stays registered until then;
    /// - the peer enqueues the matching side, with the same bytes, on a device that runs at
    ///   the same time (else the waits end at their timeout, and the destination holds
    ///   whatever the slots held).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn run(
        &mut self,
        stream: &Stream,
        staging: Staging,
        layout: &Layout,
        rank: usize,
        transfer: Transfer,
        timeout_ns: u64,
    ) -> Result<()> {
        // Nothing the reclaimer frees may fall between this rank's chunks: a free that waits
        // for the device to go idle would wait for a chunk whose peer waits for a chunk not
        // yet enqueued here (see gp2p_cuda::pause_releases).
        let _paused = gp2p_cuda::pause_releases();
        if let Some((dst, src, bytes)) = transfer.local {
            // SAFETY: both ranges are the caller's, on this device, apart (its contract).
            unsafe { memcpy_dtod_async(stream, dst, src, bytes)? };
        }
        if let Err(e) = self.fork.fork(stream) {
            // A fork that failed part-way leaves a side stream waiting on the caller's: join it
            // back (a capture must end with every stream joined).
            let _ = self.fork.join(stream);
            return Err(e.into());
        }
        // SAFETY: the caller's contract, passed on.
        let enqueued = unsafe { self.enqueue_chunks(staging, layout, rank, transfer, timeout_ns) };
        // Joined whatever happened: the caller's later work waits for what was enqueued.
        let joined = self.fork.join(stream);
        enqueued.and(joined.map_err(Into::into))
    }

    /// The chunks of [`Pipeline::run`], on the forked streams.
    ///
    /// # Safety
    /// As for [`Pipeline::run`].
    unsafe fn enqueue_chunks(
        &self,
        staging: Staging,
        layout: &Layout,
        rank: usize,
        transfer: Transfer,
        timeout_ns: u64,
    ) -> Result<()> {
        let [send, receive] = self.fork.streams() else { unreachable!("the fork was made with two streams") };
        let peer = 1 - rank;
        let slot_bytes = layout.slot_bytes();
        let slots = self.sent.len();
        let device_at = |offset: usize| staging.device + offset as u64;
        // Only an address (offsets from the layout lie in the staging area); the copies use it.
        let host_at = |offset: usize| staging.host.wrapping_add(offset);
        let give_up = GiveUp { failed: device_at(layout.flag(rank)), broken: device_at(layout.broken()) };
        for (chunk, start) in (0..transfer.bytes).step_by(slot_bytes).enumerate() {
            let slot = chunk % slots;
            let len = slot_bytes.min(transfer.bytes - start);
            if let Some(src) = transfer.send {
                if chunk >= slots && transfer.receive.is_some() {
                    send.wait(&self.received[slot])?;
                }
                let flag = device_at(layout.full(rank, slot));
                // SAFETY: the flag and slot come from the layout, in the registered area;
                // `src + start` is `len` bytes of the caller's range; the slot is written only
                // once its receiver has set its flag back to empty.
                unsafe {
                    wait_flag(send, flag, EMPTY, give_up, timeout_ns)?;
                    memcpy_dtoh_async(send, host_at(layout.slot(rank, slot)).cast(), src + start as u64, len)?;
                    write_flag(send, flag, FULL)?;
                }
                self.sent[slot].record(send)?;
            }
            if let Some((dst, landing)) = transfer.receive {
                if transfer.send.is_some() {
                    receive.wait(&self.sent[slot])?;
                }
                let flag = device_at(layout.full(peer, slot));
                let dst = dst + start as u64;
                // SAFETY: as above; the peer's slot holds this chunk once its flag is full, and
                // is not rewritten until this rank sets it back to empty, after reading it.
                unsafe {
                    wait_flag(receive, flag, FULL, give_up, timeout_ns)?;
                    match landing {
                        Landing::Fold { op, divide_by } => {
                            let src = device_at(layout.slot(peer, slot));
                            let elements = len / transfer.dtype.size_bytes();
                            let source = SourceMemory::ZeroCopy;
                            reduce(receive, dst, src, elements, transfer.dtype, op, divide_by, source)?;
                        }
                        Landing::Copy => memcpy_htod_async(receive, dst, host_at(layout.slot(peer, slot)).cast(), len)?,
                    }
                    write_flag(receive, flag, EMPTY)?;
                }
                self.received[slot].record(receive)?;
            }
        }
        Ok(())
    }
}
