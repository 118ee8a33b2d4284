//! How a pipeline step waits for flags in the segment ([`crate::FlagWaits`]): the bounded
//! wait kernel, which gives up after the peer timeout and marks the communicator broken;
//! stream memory operations that the communicator's watchdog ends (watched); or stream
//! memory operations that only their flags end (unbounded, for measuring).
//!
//! Watched waits give flags other values, so that one value, [`RELEASED`], ends a wait for
//! a full slot and a wait for an empty one alike: [`WATCHED_FULL`] and [`WATCHED_EMPTY`] are
//! one bit each, a wait holds until its bit is set, and the watchdog writes both bits. Each
//! watched wait also writes its lane's progress word before it holds (its number in the
//! run) and after ([`LEFT`] added), which is all the watchdog reads to tell a wait that has
//! lasted too long.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use gp2p_cuda::raw::{GiveUp, MAX_FLAG_BATCH, Note, Until, wait_flag, wait_flags, wait_flags_stream};
use gp2p_cuda::{RawDevicePtr, Stream};

use crate::Result;
use crate::handshake::{EMPTY, FULL, Lane};

/// A watched flag's value where its slot holds a chunk for its reader.
pub(crate) const WATCHED_FULL: u32 = 1;
/// A watched flag's value where its slot may be written: every flag starts so.
pub(crate) const WATCHED_EMPTY: u32 = 2;
/// What the watchdog writes to every flag to end every watched wait.
pub(crate) const RELEASED: u32 = WATCHED_FULL | WATCHED_EMPTY;
/// Added to a progress word once its wait has ended.
pub(crate) const LEFT: u32 = 1 << 31;

/// A communicator's waits for flags, as its options made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waits {
    /// The wait kernel, giving up after this long ([`crate::CommOptions::peer_timeout`]).
    Bounded { timeout_ns: u64 },
    /// Stream memory operations, noted in the rank's progress words (send, receive lanes).
    Watched { progress: [RawDevicePtr; 2] },
    /// Stream memory operations with no end but the flags.
    Unbounded,
}

/// A rank's waits for flags in one run of a call: [`Waits`] with the words a bounded wait
/// reports to, and the number each lane's last watched wait took (the rank's, shared with
/// its watchdog: numbers rise across runs and calls, so one seen twice is one wait).
#[derive(Debug)]
pub(super) struct FlagWait<'a> {
    waits: Waits,
    give_up: GiveUp,
    numbers: &'a [AtomicU32; 2],
}

/// The number after `number` (from 1, short of [`LEFT`], then round again).
pub(crate) fn next_number(number: u32) -> u32 {
    number % (LEFT - 1) + 1
}

// One wait covers a slot's flag of every rank: a world the communicator takes never makes
// more than a batch holds, with a watched wait's two progress writes.
const _: () = assert!(crate::MAX_RANKS <= MAX_FLAG_BATCH);

impl<'a> FlagWait<'a> {
    /// A rank's waits as `waits` makes them, a bounded one giving up into `give_up`, watched
    /// ones numbered on from `numbers`.
    pub(super) fn new(waits: Waits, give_up: GiveUp, numbers: &'a [AtomicU32; 2]) -> FlagWait<'a> {
        FlagWait { waits, give_up, numbers }
    }

    /// The value a flag holds for `value` ([`EMPTY`] or [`FULL`]) under these waits.
    pub(super) fn value(&self, value: u32) -> u32 {
        match (self.waits, value) {
            (Waits::Watched { .. }, EMPTY) => WATCHED_EMPTY,
            (Waits::Watched { .. }, FULL) => WATCHED_FULL,
            _ => value,
        }
    }

    /// Enqueue on `stream`, `lane`'s stream, a wait until each of the `count` consecutive `u32`
    /// flags from `flags` holds `value` ([`EMPTY`] or [`FULL`]): at most a world's for stream
    /// waits (a batch); the wait kernel takes several slots' (`slot_waits`).
    ///
    /// # Safety
    /// As for [`wait_flags`] (bounded) or [`wait_flags_stream`] (stream waits), and a
    /// watched wait's progress word is its rank's in the same registered area.
    pub(super) unsafe fn enqueue(
        &self,
        stream: &Stream,
        lane: Lane,
        flags: RawDevicePtr,
        count: usize,
        value: u32,
    ) -> Result<()> {
        debug_assert!(value == EMPTY || value == FULL, "a flag is empty or full");
        // SAFETY: the caller's contract, for whichever wait runs.
        unsafe {
            match self.waits {
                Waits::Unbounded => wait_flags_stream(stream, flags, count, Until::Equal(value), None)?,
                Waits::Bounded { timeout_ns } if count == 1 => {
                    wait_flag(stream, flags, value, self.give_up, timeout_ns)?;
                }
                Waits::Bounded { timeout_ns } => wait_flags(stream, flags, count, value, self.give_up, timeout_ns)?,
                Waits::Watched { progress } => {
                    let lane = lane as usize;
                    // Counted once enqueued (a rank's calls enqueue from one thread at a time):
                    // a number the GPU will never write would keep the watchdog waiting for it.
                    let number = next_number(self.numbers[lane].load(Ordering::Acquire));
                    // Entered, every flag's wait, left: one batch.
                    let note = Note { word: progress[lane], entered: number, left: number | LEFT };
                    wait_flags_stream(stream, flags, count, Until::AnyBit(self.value(value)), Some(note))?;
                    self.numbers[lane].store(number, Ordering::Release);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_released_value_ends_both_kinds_of_watched_wait_and_no_other_value_ends_both() {
        let numbers = [AtomicU32::new(0), AtomicU32::new(0)];
        let wait = FlagWait::new(Waits::Watched { progress: [4, 8] }, GiveUp { failed: 12, broken: 16 }, &numbers);
        let (full, empty) = (wait.value(FULL), wait.value(EMPTY));
        // A wait holds until the flag has a bit of the mask: the value it waits for.
        let ends = |flag: u32, mask: u32| flag & mask != 0;
        assert!(ends(full, full) && !ends(full, empty), "a full flag ends only the wait for full");
        assert!(ends(empty, empty) && !ends(empty, full), "an empty flag ends only the wait for empty");
        assert!(ends(RELEASED, full) && ends(RELEASED, empty), "the released value ends both");
        assert!(!ends(0, full) && !ends(0, empty), "a flag never set ends neither");
        assert_eq!(LEFT & (full | empty | RELEASED), 0);
        // Numbers run from 1 short of LEFT, round again, never 0 and never with LEFT.
        assert_eq!((next_number(0), next_number(1), next_number(LEFT - 2)), (1, 2, LEFT - 1));
        assert_eq!(next_number(LEFT - 1), 1);
        // The kernel's and the unbounded waits keep the values the steps name.
        for waits in [Waits::Bounded { timeout_ns: 1 }, Waits::Unbounded] {
            let plain = FlagWait::new(waits, GiveUp { failed: 12, broken: 16 }, &numbers);
            assert_eq!((plain.value(EMPTY), plain.value(FULL)), (EMPTY, FULL));
        }
    }
}
