//! Work a landing leaves until its slot is handed back: a fold of the scratch or a decode of
//! the receive stage reads only the device memory the landing's DMA filled, so the reader
//! sets the slot's flag empty first and the writer may fill the slot again meanwhile (in the
//! exchange also after the event that lets this rank's next send into the slot go; in the
//! rounds before the event that later copies out of the folded range wait for). A fold that
//! reads the slot across the link (zero-copy) cannot wait: it runs before the flag.
#![allow(unsafe_code)]

use gp2p_cuda::raw::{Codec, compress_decode, reduce};
use gp2p_cuda::{RawDevicePtr, SourceMemory, Stream};
use gp2p_kernels::{DType, ReduceOp};

use crate::Result;
use crate::handshake::Lane;

/// One landing's work after its DMA, with the bytes it stands for (a traced call's stamp).
#[derive(Debug, Clone, Copy)]
pub(super) enum AfterRelease {
    /// Decode the wire of `values` values at `wire` into `dst`.
    Decode { codec: Codec, wire: RawDevicePtr, values: usize, dst: RawDevicePtr, bytes: usize },
    /// Fold `elements` of `dtype` at `from` into `to` under `op` (dividing by `divide_by`).
    Fold {
        to: RawDevicePtr,
        from: RawDevicePtr,
        elements: usize,
        dtype: DType,
        op: ReduceOp,
        divide_by: u32,
        source: SourceMemory,
        bytes: usize,
    },
}

impl AfterRelease {
    /// A landing's work: left in `pending` where it reads device memory alone (a decode of
    /// the stage, a fold of the scratch), to run once the slot is handed back
    /// ([`AfterRelease::run_pending`]); enqueued on `stream` now where it reads the slot (a
    /// zero-copy fold). What it did now, for a traced call's stamp.
    ///
    /// # Safety
    /// As for [`AfterRelease::enqueue`], the slot holding the landing's bytes until work
    /// enqueued now completes; `pending` is empty.
    pub(super) unsafe fn now_or_after_release(
        self,
        stream: &Stream,
        pending: &mut Option<AfterRelease>,
    ) -> Result<Option<(&'static str, usize)>> {
        debug_assert!(pending.is_none(), "a landing's work left behind");
        match self {
            AfterRelease::Decode { .. } | AfterRelease::Fold { source: SourceMemory::Device, .. } => {
                *pending = Some(self);
                Ok(None)
            }
            // SAFETY: the caller's contract.
            AfterRelease::Fold { source: SourceMemory::ZeroCopy, .. } => Ok(Some(unsafe { self.enqueue(stream)? })),
        }
    }

    /// The work `pending` holds, enqueued on `stream` once a landing on `lane` has handed its
    /// slot back (never on the send lane, whose flags hand no landing's slot back).
    ///
    /// # Safety
    /// As for [`AfterRelease::enqueue`].
    pub(super) unsafe fn run_pending(
        pending: &mut Option<AfterRelease>,
        lane: Lane,
        stream: &Stream,
    ) -> Result<Option<(&'static str, usize)>> {
        match if lane == Lane::Receive { pending.take() } else { None } {
            // SAFETY: the caller's contract.
            Some(work) => Ok(Some(unsafe { work.enqueue(stream)? })),
            None => Ok(None),
        }
    }

    /// Enqueue it on `stream`; what it did and its bytes, for a traced call's stamp.
    ///
    /// # Safety
    /// The source holds the landing's bytes once `stream` reaches the work and stays unwritten
    /// until it completes; the destination is the landing's, which nothing else touches
    /// meanwhile; both stay allocated until then.
    pub(super) unsafe fn enqueue(self, stream: &Stream) -> Result<(&'static str, usize)> {
        match self {
            AfterRelease::Decode { codec, wire, values, dst, bytes } => {
                // SAFETY: the caller's contract.
                unsafe { compress_decode(stream, codec, wire, values, dst)? };
                Ok(("decode", bytes))
            }
            AfterRelease::Fold { to, from, elements, dtype, op, divide_by, source, bytes } => {
                // SAFETY: the caller's contract.
                unsafe { reduce(stream, to, from, elements, dtype, op, divide_by, source)? };
                Ok((fold_name(source), bytes))
            }
        }
    }
}

/// What a traced fold is called: of the scratch, or of the slot read across the link.
fn fold_name(source: SourceMemory) -> &'static str {
    if source == SourceMemory::Device { "fold" } else { "fold zero-copy" }
}
