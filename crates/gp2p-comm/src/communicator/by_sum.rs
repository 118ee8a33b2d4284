//! Small all-gathers, broadcasts and reduce-scatters as one all-reduce kernel: each rank zeroes what it does not
//! contribute, and the ranks sum the whole buffer as bytes, which leaves every contribution's
//! bits as they were (x + 0 = x in wrapping integer arithmetic, whatever the bytes mean). Bytes
//! on every rank, whatever its buffer's alignment, so every rank runs the same kernel. The one
//! kernel moves the whole buffer where the pipeline would move a part, but in one launch and
//! one handoff, where the pipeline spends two streams, a flag handshake each way and some
//! twenty driver calls: between two processes on one H100, 256 KiB all-reduced in 30.7 µs
//! where an all-gather of 256 KiB took 63.6 µs, and 1 MiB 95.3 against 86.4
//! (`benches/results/h10080gbhbm3/comm-door-ref-all-reduce-2.txt` and
//! `comm-door-ref-all-gather-2.txt` as of cb54137, since replaced by later runs).
//! Among four and eight processes on one H200 the line
//! kernel's 64 KiB all-reduce took 60 and 215 µs where a 64 KiB broadcast through the rounds
//! took 64 and 270 (`benches/results/h200/eager-rounds.txt`); small all-gathers among more than
//! two are not measured yet. The root's buffer and a gather's own part are written too, with
//! the bits they held. A small reduce-scatter is the all-reduce of the whole buffer into device
//! memory the communicator keeps for it, then a copy of this rank's part (the whole is only
//! read, as the pipeline only reads it).
#![allow(unsafe_code)]

use std::ops::Range;

use super::all_reduce::Around;
use super::*;

/// The largest whole buffer (every rank's part together) two ranks gather or broadcast by a
/// sum (the crossover of the rows above lies between 256 KiB and 1 MiB).
pub(crate) const BY_SUM_MAX_TWO_RANKS: usize = 256 << 10;

impl Communicator {
    /// The largest whole buffer [`Communicator::by_sum`] takes among `world` ranks with
    /// `layout`: 0 for one rank.
    pub(super) fn largest_by_sum(world: usize, layout: &Layout) -> usize {
        match world {
            0 | 1 => 0,
            2 => BY_SUM_MAX_TWO_RANKS.min(layout.small_max),
            _ => layout.lines_max,
        }
    }

    /// Whether an all-gather or broadcast whose whole buffer is `bytes` runs as one
    /// all-reduce kernel: between two ranks up to [`BY_SUM_MAX_TWO_RANKS`] (at most the
    /// one-kernel path's size); among more, where the all-reduce of `bytes` takes the line
    /// kernel. The same on every rank: it depends on the call's size and the options ranks
    /// compare at creation.
    pub(super) fn by_sum(&self, bytes: usize) -> bool {
        bytes <= Self::largest_by_sum(self.world(), &self.layout)
            && (self.world() == 2 || self.many.path(bytes) == ManyPath::Lines)
    }

    /// `bytes` at `whole`, of which `keep` is this rank's contribution (already there, or
    /// copied there from `part`): every other byte zeroed, then every rank's `whole` summed
    /// into every rank's, all in one call. `note` takes the point after it.
    ///
    /// # Safety
    /// `whole` is `bytes` writable bytes of this rank's device memory and `part`, where given,
    /// `keep.len()` readable bytes of it apart from `whole`; both stay allocated until the
    /// work completes (`note` notes the call's point on them). Every rank makes the same call
    /// (the same `bytes`), after [`Communicator::by_sum`] said yes.
    pub(super) unsafe fn sum_bytes(
        &mut self,
        stream: &Stream,
        (whole, bytes): (RawDevicePtr, usize),
        keep: Range<usize>,
        part: Option<RawDevicePtr>,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let at = |offset: usize| whole + offset as u64;
        let around = Around {
            zero: [(at(0), keep.start), (at(keep.end), bytes - keep.end)],
            before: part.map(|part| (at(keep.start), part, keep.len())),
            after: None,
        };
        // SAFETY: `whole` is `bytes` on this device, in place, within the one kernel's size
        // (`by_sum`); the zeroed ranges lie in it, the copy's source apart (the contract).
        unsafe { self.one_kernel::<u8>(InOut::in_place(whole), bytes, stream, ReduceOp::Sum, &around, note) }
    }

    /// A reduce-scatter of `len` elements at `whole` into this rank's part at `part`: every
    /// rank's whole reduced with `op` into the sums by the one kernel, then this rank's part
    /// copied out, in one call. The whole is only read; `part` may lie in it (in place).
    /// `note` takes the point after the copy.
    ///
    /// # Safety
    /// `whole` is `len` readable elements of `T` of this rank's device and `part` its
    /// `len / world` writable ones, inside `whole` or apart from it; both stay allocated until
    /// the work completes (`note`). Every rank makes the same call, after
    /// [`Communicator::by_sum`] said yes for the whole's bytes.
    pub(super) unsafe fn scatter_by_sum<T: Element>(
        &mut self,
        stream: &Stream,
        (whole, len): (RawDevicePtr, usize),
        part: RawDevicePtr,
        op: ReduceOp,
        note: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let Some(sums) = self.sums.as_ref().map(DeviceBuffer::raw_ptr) else {
            unreachable!("the sums are made at creation for every size by_sum takes")
        };
        let part_bytes = len * size_of::<T>() / self.world();
        let own = sums + (self.rank() * part_bytes) as u64;
        let around = Around { after: Some((part, own, part_bytes)), ..Around::default() };
        // SAFETY: `whole` on this device into the sums (the communicator's own, apart, as large
        // as any whole `by_sum` takes, noted by every call), within the one kernel's size; then
        // this rank's part of the sums into `part` (the contract).
        unsafe { self.one_kernel::<T>(InOut { src: whole, dst: sums }, len, stream, op, &around, note) }
    }
}
