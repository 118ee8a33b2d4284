//! A rank's calls taken apart on the GPU: the device's clock stamped after every step they
//! enqueue, on the stream the step runs on (`gp2p_cuda::Timeline`), for finding where a
//! call's time goes on machines with no GPU profiler. `gp2p bench comm --timeline` prints
//! them.

use gp2p_cuda::{Stamps, Stream, Timeline};

use super::Communicator;
use crate::Result;

/// Stamps one timeline holds: an all-reduce of 256 MiB among eight ranks, a slot a chunk, stamps
/// about 1,500; marks past the room are counted (`Stamps::dropped`), not stamped.
const TIMELINE_STAMPS: usize = 1 << 14;

impl Communicator {
    /// Stamp the device's clock after every step of this rank's calls from now on, each on
    /// the stream the step runs on ("caller" for the call's start, end and the steps on the
    /// caller's stream; "send" and "receive" for the pipeline's), until
    /// [`Communicator::read_timeline`]. Such calls are enqueued, never replayed from graphs,
    /// and each stamp is a kernel launch: a timeline shows where a call's time goes, not how
    /// fast calls run back to back. A call captured into a graph stamps nothing. Marks past
    /// the timeline's room (16,384 stamps) are not stamped.
    pub fn start_timeline(&mut self) -> Result<()> {
        if self.timeline.is_none() {
            self.timeline = Some(Timeline::new(&self.device, TIMELINE_STAMPS)?);
        }
        Ok(())
    }

    /// The stamps since [`Communicator::start_timeline`], in the order they were enqueued,
    /// once each is written (this waits for them, on `stream`, a stream of this rank's
    /// device), and how many marks found the timeline full; calls stamp nothing more until
    /// the next start. Empty where none was started. The clock is the device's, so the stamps
    /// of ranks sharing a GPU line up.
    pub fn read_timeline(&mut self, stream: &Stream) -> Result<Stamps> {
        let Some(timeline) = self.timeline.take() else { return Ok(Stamps::default()) };
        Ok(timeline.read(stream)?)
    }

    /// Stamp `what` (`bytes` moved) on the caller's `stream`, where the call is traced.
    pub(super) fn mark(&self, stream: &Stream, what: &'static str, bytes: usize) -> Result<()> {
        crate::pipeline::mark(self.side().timeline, stream, "caller", what, bytes)
    }
}
