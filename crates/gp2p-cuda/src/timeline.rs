//! Where a call's time goes on the GPU: a stamp of the device's global clock after each step
//! the call enqueues, on the stream the step runs on. The machines this library is measured on
//! have no GPU profiler, and an event's time is only comparable within its own context; the
//! global clock is one for every context of the device, so the stamps of ranks that share a
//! GPU as processes line up with each other.
//!
//! A stamp is a one-thread kernel ([`gp2p_kernels::STAMP_KERNEL`]) that runs once the work
//! queued before it on its stream is done: the gap between two stamps of one stream is the
//! step between them, its wait for other streams included. Each costs a launch (a few
//! microseconds of host time and a little of the GPU's), so a timeline describes one call
//! taken apart, not the speed of calls at full tilt.
//!
//! ```no_run
//! use gp2p_cuda::{Device, Stream, Timeline};
//!
//! # fn main() -> gp2p_cuda::Result<()> {
//! let device = Device::open(0)?;
//! let stream = Stream::new(&device)?;
//! let timeline = Timeline::new(&device, 64)?;
//! timeline.mark(&stream, "caller", "start", 0)?;
//! // ... enqueue the work to time on `stream` ...
//! timeline.mark(&stream, "caller", "work", 0)?;
//! for stamp in timeline.read(&stream)?.stamps {
//!     println!("{:>12} ns  {} {}", stamp.ns, stamp.mark.stream, stamp.mark.what);
//! }
//! # Ok(())
//! # }
//! ```
#![allow(unsafe_code)]

use std::sync::Mutex;

use crate::{Device, DeviceBuffer, Result, Stream, StreamPoint, raw};

/// What a stamp stands for: the step that ended on `stream` just before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The stream's name, as the caller calls it ("send", "receive", "caller", ...).
    pub stream: &'static str,
    /// The step that ended there, in a word or two ("copy out", "wait flag", ...).
    pub what: &'static str,
    /// Bytes the step moved, 0 where it moved none.
    pub bytes: usize,
}

/// A mark and the global clock's nanoseconds when its stream got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// What the stamp stands for.
    pub mark: Mark,
    /// The device's global clock, in nanoseconds (comparable across the device's contexts).
    pub ns: u64,
}

/// What a timeline held when read: its stamps in the order marked, and how many marks found
/// no room.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stamps {
    /// Every stamp taken, in the order marked.
    pub stamps: Vec<Stamp>,
    /// Marks made once the timeline was full, not stamped.
    pub dropped: usize,
}

/// Stamps of the device's global clock, in the order they were enqueued (see the module doc).
pub struct Timeline {
    stamps: DeviceBuffer<u64>,
    marks: Mutex<Marks>,
}

#[derive(Default)]
struct Marks {
    taken: Vec<Mark>,
    /// Marks asked for once every stamp was taken: not stamped.
    dropped: usize,
}

impl Timeline {
    /// A timeline of up to `capacity` stamps on `device`.
    pub fn new(device: &Device, capacity: usize) -> Result<Timeline> {
        Ok(Timeline { stamps: DeviceBuffer::zeroed(device, capacity.max(1))?, marks: Mutex::new(Marks::default()) })
    }

    /// Stamp the clock on `stream` once the work queued there so far is done, as `what` on the
    /// stream called `name`, `bytes` moved. Past the capacity nothing is stamped, and the read
    /// counts the mark as dropped. The stamp's use of the timeline is noted with a point of
    /// `stream` (creating an event where none is spare: between steps that other processes
    /// wait on, [`Timeline::mark_unnoted`] under one point noted afterwards is the safer way).
    pub fn mark(&self, stream: &Stream, name: &'static str, what: &'static str, bytes: usize) -> Result<()> {
        // SAFETY: the point taken right after covers the stamp (same stream), noted at once.
        unsafe { self.mark_unnoted(stream, name, what, bytes)? };
        self.note_use(&stream.point()?);
        Ok(())
    }

    /// [`Timeline::mark`] without noting the stamp's use: for callers that note one point for
    /// many marks ([`Timeline::note_use`]), since taking a point may create an event, and
    /// creating one can wait for the device.
    ///
    /// # Safety
    /// Before this timeline is read or dropped, [`Timeline::note_use`] is given a point of a
    /// stream that waited for `stream`'s work up to this mark (the same stream after it, or
    /// one joined from it), or the caller waits for that work itself.
    pub unsafe fn mark_unnoted(
        &self,
        stream: &Stream,
        name: &'static str,
        what: &'static str,
        bytes: usize,
    ) -> Result<()> {
        let mut marks = self.marks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let index = marks.taken.len();
        if index >= self.stamps.len() {
            marks.dropped += 1;
            return Ok(());
        }
        // SAFETY: one u64 of this timeline's buffer, on the stream's device (the launch checks
        // it), which outlives the kernel by the caller's contract; each mark has its own.
        unsafe { raw::stamp(stream, self.stamps.view(index..=index).raw_ptr())? };
        marks.taken.push(Mark { stream: name, what, bytes });
        Ok(())
    }

    /// Note that work up to `point` stamps this timeline: it is not freed, and a read waits,
    /// until that work is done.
    pub fn note_use(&self, point: &StreamPoint) {
        self.stamps.view(..).note_use(point);
    }

    /// Every stamp taken since the last read, in the order marked, once each is written (this
    /// waits for every noted use), and how many marks were dropped; the timeline is then empty.
    pub fn read(&self, stream: &Stream) -> Result<Stamps> {
        let mut marks = self.marks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.stamps.uses().synchronize()?;
        let clock = self.stamps.to_host_vec(stream)?;
        let stamps = marks.taken.drain(..).zip(clock).map(|(mark, ns)| Stamp { mark, ns }).collect();
        Ok(Stamps { stamps, dropped: std::mem::take(&mut marks.dropped) })
    }
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline").field("capacity", &self.stamps.len()).finish_non_exhaustive()
    }
}
