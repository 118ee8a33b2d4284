//! Small all-gathers and broadcasts as one all-reduce kernel: each rank zeroes what it does not
//! contribute, and the ranks sum the whole buffer as bytes (as 4-byte words where it is whole
//! words), which leaves every contribution's bits as they were (x + 0 = x in wrapping integer
//! arithmetic, whatever the bytes mean). The one kernel moves the whole buffer where the
//! pipeline would move a part, but in one launch and one handoff, where the pipeline spends two
//! streams, a flag handshake each way and some twenty driver calls: between two processes on
//! one H100, 256 KiB all-reduced in 30.7 µs where an all-gather of 256 KiB took 63.6 µs, and
//! 1 MiB 95.3 against 86.4 (`benches/results/h10080gbhbm3/comm-door-ref-all-reduce-2.txt`,
//! `comm-door-ref-all-gather-2.txt`).
#![allow(unsafe_code)]

use std::ops::Range;

use gp2p_cuda::raw::{memcpy_dtod_async, memset_elements_async};

use super::*;

/// The largest whole buffer (every rank's part together) two ranks gather or broadcast by a
/// sum (the crossover of the rows above lies between 256 KiB and 1 MiB).
pub(crate) const BY_SUM_MAX_TWO_RANKS: usize = 256 << 10;

impl Communicator {
    /// Whether an all-gather or broadcast whose whole buffer is `bytes` runs as one
    /// all-reduce kernel: between two ranks up to [`BY_SUM_MAX_TWO_RANKS`] (and the one-kernel
    /// path's size); among more, where the all-reduce of `bytes` takes the line kernel.
    pub(super) fn by_sum(&self, bytes: usize) -> bool {
        match self.world() {
            0 | 1 => false,
            2 => bytes <= BY_SUM_MAX_TWO_RANKS.min(self.small_max_bytes()),
            _ => self.many.path(bytes) == ManyPath::Lines,
        }
    }

    /// `bytes` at `whole`, of which `keep` is this rank's contribution (already there, or
    /// copied there from `part`): every other byte zeroed, then every rank's `whole` summed
    /// into every rank's, after this rank's previous call. `note` takes the point after it.
    ///
    /// # Safety
    /// `whole` is `bytes` writable bytes of this rank's device memory and `part`, where given,
    /// `keep.len()` readable bytes of it apart from `whole`; both stay allocated until the
    /// work completes (`note` notes the call's point on them). Every rank makes the same call
    /// (the same `bytes`).
    pub(super) unsafe fn sum_bytes(
        &mut self,
        stream: &Stream,
        (whole, bytes): (RawDevicePtr, usize),
        keep: Range<usize>,
        part: Option<RawDevicePtr>,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let at = |offset: usize| whole + offset as u64;
        let prepared = (|| -> Result<()> {
            // The zeroing writes the caller's buffer, which this rank's previous call (on any
            // stream) may still read or write: after it, as every call is.
            if !(self.capture != Capture::Refused && stream.is_capturing()?)
                && let Some(last) = &self.last
            {
                stream.wait_point(last)?;
            }
            // SAFETY: both ranges lie in `whole`, `bytes` writable bytes of this device (the
            // caller's contract); one byte at a time, so any alignment.
            unsafe {
                memset_elements_async(stream, at(0), 1, 0, keep.start)?;
                memset_elements_async(stream, at(keep.end), 1, 0, bytes - keep.end)?;
            }
            if let Some(part) = part {
                // SAFETY: `keep.len()` bytes of `part` into `keep` of `whole`, apart (the
                // contract).
                unsafe { memcpy_dtod_async(stream, at(keep.start), part, keep.len())? };
            }
            Ok(())
        })();
        if let Err(e) = prepared {
            // The other ranks' calls would wait for this one's: break the communicator, so
            // they hear of it now rather than at the peer timeout.
            self.fail(stream);
            return Err(e);
        }
        let words = whole % 4 == 0 && bytes % 4 == 0;
        if words {
            self.all_reduce_checked::<u32>(InOut::in_place(whole), bytes / 4, stream, ReduceOp::Sum, note)
        } else {
            self.all_reduce_checked::<u8>(InOut::in_place(whole), bytes, stream, ReduceOp::Sum, note)
        }
    }
}
