//! How a pipeline step waits for flags in the segment: the bounded wait kernel, which gives
//! up after the peer timeout and marks the communicator broken, or, for measuring what that
//! kernel costs, stream memory operations that only the flags end
//! ([`crate::CommOptions::unbounded_waits`]).
#![allow(unsafe_code)]

use gp2p_cuda::raw::{GiveUp, wait_flag, wait_flags, wait_flags_unbounded};
use gp2p_cuda::{RawDevicePtr, Stream};

use crate::Result;

/// A communicator's waits for flags, as its options made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waits {
    /// The wait kernel, giving up after this long ([`crate::CommOptions::peer_timeout`]).
    Bounded { timeout_ns: u64 },
    /// Stream memory operations with no end but the flags.
    Unbounded,
}

/// A rank's waits for flags in one call: [`Waits`] with the words a bounded wait reports to.
#[derive(Debug, Clone, Copy)]
pub(super) enum FlagWait {
    Bounded { give_up: GiveUp, timeout_ns: u64 },
    Unbounded,
}

// One unbounded wait covers a slot's flag of every rank: a world the communicator takes never
// makes more than a batch holds.
const _: () = assert!(crate::MAX_RANKS <= gp2p_cuda::raw::MAX_FLAG_BATCH);

impl FlagWait {
    /// A rank's waits as `waits` makes them, a bounded one giving up into `give_up`.
    pub(super) fn new(waits: Waits, give_up: GiveUp) -> FlagWait {
        match waits {
            Waits::Unbounded => FlagWait::Unbounded,
            Waits::Bounded { timeout_ns } => FlagWait::Bounded { give_up, timeout_ns },
        }
    }

    /// Enqueue on `stream` a wait until each of the `count` consecutive `u32` flags from
    /// `flags` (at most a world's) equals `value`.
    ///
    /// # Safety
    /// As for [`wait_flags`] (bounded) or [`wait_flags_unbounded`], whichever `self` makes.
    pub(super) unsafe fn enqueue(&self, stream: &Stream, flags: RawDevicePtr, count: usize, value: u32) -> Result<()> {
        // SAFETY: the caller's contract, for whichever wait runs.
        unsafe {
            match *self {
                FlagWait::Unbounded => wait_flags_unbounded(stream, flags, count, value)?,
                FlagWait::Bounded { give_up, timeout_ns } if count == 1 => {
                    wait_flag(stream, flags, value, give_up, timeout_ns)?;
                }
                FlagWait::Bounded { give_up, timeout_ns } => {
                    wait_flags(stream, flags, count, value, give_up, timeout_ns)?;
                }
            }
        }
        Ok(())
    }
}
