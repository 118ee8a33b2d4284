//! Messages above the line path's size between two ranks: a pipeline of DMA copies through
//! slots of the shared segment, flagged chunk by chunk from the GPU.
//!
//! Each rank has `slots` slots of `slot_bytes` in the segment, and per slot two flags: `ready`
//! (the sequence number of the chunk its sender last put there) and `done` (the sequence
//! number of the chunk its receiver last finished reading from the *peer's* same slot).
//! Chunks are numbered by a counter every rank advances alike (by the chunk count of each
//! call, whatever its role), and chunk `q` goes through slot `q % slots`. Per chunk:
//!
//! - the send stream waits until the peer is done with the slot's previous chunk, copies the
//!   chunk device → slot (DMA), and sets the slot's `ready` to `q` (a stream memory
//!   operation, after the copy);
//! - the receive stream waits for the peer's `ready` (and, when this rank also sends, its own,
//!   since in place the fold overwrites what the send copies out), then folds the peer's slot
//!   into the destination with a kernel that reads the mapped slot in place, or copies it
//!   slot → device (DMA), and sets its `done` to `q`.
//!
//! The two streams fork from the caller's stream and join back into it, so up to `slots`
//! chunks are in flight and both directions of the link are busy at once. Every wait is the
//! bounded wait kernel: a peer that never arrives costs one timeout and sets this rank's
//! give-up flag, which the next call reports.
#![allow(unsafe_code)]

use gp2p_cuda::raw::{FlagWait, memcpy_dtoh_async, memcpy_htod_async, reduce, wait_flags, write_flag};
use gp2p_cuda::{Device, RawDevicePtr, SourceMemory, Stream, StreamFork};
use gp2p_kernels::{DType, ReduceOp};

use crate::Result;
use crate::communicator::Layout;

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
}

/// Where this process sees the staging area: the device's mapping (for kernels and stream
/// memory operations) and the host's (for DMA copies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staging {
    pub(crate) device: RawDevicePtr,
    pub(crate) host: *mut u8,
}

/// The streams and counters of one rank's pipeline.
pub(crate) struct Pipeline {
    fork: StreamFork,
    /// Chunks enqueued so far, by every call.
    chunks: u64,
    /// The sequence number of the chunk this rank last sent through each slot (0: none),
    /// which the peer's `done` must reach before the slot is written again.
    last_sent: Vec<u32>,
}

impl Pipeline {
    pub(crate) fn new(device: &Device, slots: usize) -> Result<Pipeline> {
        Ok(Pipeline { fork: StreamFork::new(device, 2)?, chunks: 0, last_sent: vec![0; slots] })
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
        let peer = 1 - rank;
        let slot_bytes = layout.slot_bytes();
        let chunk_count = transfer.bytes.div_ceil(slot_bytes);
        // Nothing the reclaimer frees may fall between this rank's chunks: a free that waits
        // for the device to go idle would wait for a chunk whose peer waits for a chunk not
        // yet enqueued here (see gp2p_cuda::pause_releases).
        let _paused = gp2p_cuda::pause_releases();
        let [send, receive] = self.fork.fork(stream)? else { unreachable!("the fork was made with two streams") };
        let device_at = |offset: usize| staging.device + offset as u64;
        // Only an address (offsets from the layout lie in the staging area); the copies use it.
        let host_at = |offset: usize| staging.host.wrapping_add(offset);
        let failed = device_at(layout.flag(rank));
        for chunk in 0..chunk_count {
            self.chunks += 1;
            let seq = self.chunks as u32;
            let slot = self.chunks as usize % self.last_sent.len();
            let start = chunk * slot_bytes;
            let len = slot_bytes.min(transfer.bytes - start);
            if let Some(src) = transfer.send {
                let previous = self.last_sent[slot];
                // SAFETY: flags and slot come from the layout, in the registered area;
                // `src + start` is `len` bytes of the caller's range; the peer writes `done`
                // only after it finished reading this slot's previous chunk.
                unsafe {
                    if previous != 0 {
                        let wait =
                            FlagWait { first: device_at(layout.done(peer, slot)), second: 0, target: previous, failed };
                        wait_flags(send, wait, timeout_ns)?;
                    }
                    memcpy_dtoh_async(send, host_at(layout.slot(rank, slot)).cast(), src + start as u64, len)?;
                    write_flag(send, device_at(layout.ready(rank, slot)), seq)?;
                }
                self.last_sent[slot] = seq;
            }
            if let Some((dst, landing)) = transfer.receive {
                let own = if transfer.send.is_some() { device_at(layout.ready(rank, slot)) } else { 0 };
                let wait = FlagWait { first: device_at(layout.ready(peer, slot)), second: own, target: seq, failed };
                let dst = dst + start as u64;
                // SAFETY: as above; the peer's slot holds chunk `seq` once its `ready` says so,
                // and is not rewritten until this rank's `done` says it was read.
                unsafe {
                    wait_flags(receive, wait, timeout_ns)?;
                    match landing {
                        Landing::Fold { op, divide_by } => {
                            let src = device_at(layout.slot(peer, slot));
                            let elements = len / transfer.dtype.size_bytes();
                            let source = SourceMemory::ZeroCopy;
                            reduce(receive, dst, src, elements, transfer.dtype, op, divide_by, source)?;
                        }
                        Landing::Copy => memcpy_htod_async(receive, dst, host_at(layout.slot(peer, slot)).cast(), len)?,
                    }
                    write_flag(receive, device_at(layout.done(rank, slot)), seq)?;
                }
            }
        }
        self.fork.join(stream)?;
        Ok(())
    }
}
