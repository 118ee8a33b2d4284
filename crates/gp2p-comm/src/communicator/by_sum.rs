//! Small all-gathers, broadcasts and reduce-scatters as one all-reduce kernel: each rank zeroes what it does not
//! contribute, and the ranks sum the whole buffer as bytes, which leaves every contribution's
//! bits as they were (x + 0 = x in wrapping integer arithmetic, whatever the bytes mean). Bytes
//! on every rank, whatever its buffer's alignment, so every rank runs the same kernel. The one
//! kernel moves the whole buffer where the pipeline would move a part, but in one launch and
//! one handoff, where the pipeline spends two streams, a flag handshake each way and some
//! twenty driver calls: between two processes on one H100, 256 KiB all-reduced in 30.7 µs
//! where an all-gather of 256 KiB took 63.6 µs, and 1 MiB 95.3 against 86.4
//! (`benches/results/h10080gbhbm3/comm-door-ref-all-reduce-2.txt`,
//! `comm-door-ref-all-gather-2.txt`). Among four and eight processes on one H200 the line
//! kernel's 64 KiB all-reduce took 60 and 215 µs where a 64 KiB broadcast through the rounds
//! took 64 and 270 (`benches/results/h200/eager-rounds.txt`); small all-gathers among more than
//! two are not measured yet. The root's buffer and a gather's own part are written too, with
//! the bits they held. A small reduce-scatter is the all-reduce of the whole buffer into device
//! memory the communicator keeps for it, then a copy of this rank's part (the whole is only
//! read, as the pipeline only reads it).
#![allow(unsafe_code)]

use std::ops::Range;

use gp2p_cuda::raw::{memcpy_dtod_async, memset_elements_async};

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
            // they hear of it now rather than at the peer timeout. What was enqueued may still
            // write the buffers: they are kept until it is done, where a point can be taken.
            self.fail(stream);
            if matches!(stream.is_capturing(), Ok(false))
                && let Ok(point) = stream.point()
            {
                note(&point);
            }
            return Err(e);
        }
        self.all_reduce_checked::<u8>(InOut::in_place(whole), bytes, stream, ReduceOp::Sum, note)
    }

    /// Whether a reduce-scatter of `op` on `T` whose whole buffer is `bytes` runs as one
    /// all-reduce kernel into the communicator's sums and a copy of this rank's part: where
    /// an all-gather of `bytes` would ([`Communicator::by_sum`]; the sums are made at creation
    /// for every size that says yes), unless the communicator compresses such an all-reduce
    /// (a reduce-scatter is never compressed). The same on every rank.
    pub(super) fn scatters_by_sum<T: Element>(&self, bytes: usize, op: ReduceOp) -> bool {
        let compressed =
            self.compress.is_some_and(|c| bytes >= c.min_bytes) && super::compressed::compressible::<T>(op);
        self.by_sum(bytes) && !compressed
    }

    /// A reduce-scatter of `len` elements at `whole` into this rank's part at `part`: every
    /// rank's whole reduced with `op` into the sums by the one kernel, then this rank's part
    /// copied out. The whole is only read; `part` may lie in it (in place). `note_whole` takes
    /// the all-reduce's point, `note_part` the copy's.
    ///
    /// # Safety
    /// `whole` is `len` readable elements of `T` of this rank's device and `part` its
    /// `len / world` writable ones, inside `whole` or apart from it; both stay allocated until
    /// the work completes (the notes). Every rank makes the same call, after
    /// [`Communicator::scatters_by_sum`] said yes.
    pub(super) unsafe fn scatter_by_sum<T: Element>(
        &mut self,
        stream: &Stream,
        (whole, len): (RawDevicePtr, usize),
        part: RawDevicePtr,
        op: ReduceOp,
        note_whole: impl FnOnce(&StreamPoint),
        note_part: impl FnOnce(&StreamPoint),
    ) -> Result<()> {
        let Some(sums) = self.sums.as_ref().map(DeviceBuffer::raw_ptr) else {
            unreachable!("the sums are made at creation for every size by_sum takes")
        };
        let part_bytes = len * size_of::<T>() / self.world();
        let own = sums + (self.rank() * part_bytes) as u64;
        // The copy's point is reserved before the kernel, as every call's is: nothing after a
        // launch that waits for the peers may wait for the device.
        let capturing = self.capture != Capture::Refused && stream.is_capturing()?;
        let reserved = if capturing { None } else { Some(stream.reserve_point()?) };
        let sums_view = |comm: &Self, point: &StreamPoint| {
            if let Some(s) = comm.sums.as_ref() {
                s.view(..).note_use(point);
            }
        };
        let mut at_reduce = None;
        self.all_reduce_checked::<T>(InOut { src: whole, dst: sums }, len, stream, op, |p| {
            note_whole(p);
            at_reduce = Some(p.clone());
        })?;
        if let Some(point) = &at_reduce {
            sums_view(self, point);
        }
        // SAFETY: this rank's part of the sums, which the all-reduce just wrote (earlier on this
        // stream), into `part`, `part_bytes` writable bytes (the contract); apart, since the
        // sums are the communicator's own.
        unsafe { memcpy_dtod_async(stream, part, own, part_bytes)? };
        if let Some(reserved) = reserved {
            // The copy is this call's last work: later calls, and the buffers' and the sums'
            // release, wait for it.
            let point = stream.point_from(reserved)?;
            note_part(&point);
            sums_view(self, &point);
            self.last = Some(point);
        }
        Ok(())
    }
}
