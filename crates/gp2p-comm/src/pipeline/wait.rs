//! How a pipeline step waits for flags in the segment: the bounded wait kernel, which gives
//! up after the peer timeout and marks the communicator broken, or, for measuring what that
//! kernel costs, stream memory operations that only the flags end
//! ([`crate::CommOptions::unbounded_waits`]).
#![allow(unsafe_code)]

use gp2p_cuda::raw::{GiveUp, wait_flag, wait_flags, wait_flags_unbounded};
use gp2p_cuda::{RawDevicePtr, Stream};

use crate::Result;

/// What a rank's waits for flags are, for one call.
#[derive(Debug, Clone, Copy)]
pub(super) struct FlagWait {
    /// Where a bounded wait that gives up says so, and learns that another did.
    pub(super) give_up: GiveUp,
    /// How long a bounded wait may last.
    pub(super) timeout_ns: u64,
    /// Stream memory operations with no end but the flags, in place of the kernel.
    pub(super) unbounded: bool,
}

impl FlagWait {
    /// Enqueue on `stream` a wait until each of the `count` consecutive `u32` flags from
    /// `flags` equals `value`.
    ///
    /// # Safety
    /// As for [`wait_flags`] (bounded) or [`wait_flags_unbounded`], whichever `self` makes.
    pub(super) unsafe fn enqueue(&self, stream: &Stream, flags: RawDevicePtr, count: usize, value: u32) -> Result<()> {
        // SAFETY: the caller's contract, for whichever wait runs.
        unsafe {
            if self.unbounded {
                wait_flags_unbounded(stream, flags, count, value)?;
            } else if count == 1 {
                wait_flag(stream, flags, value, self.give_up, self.timeout_ns)?;
            } else {
                wait_flags(stream, flags, count, value, self.give_up, self.timeout_ns)?;
            }
        }
        Ok(())
    }
}
