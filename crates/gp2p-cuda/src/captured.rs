//! Work enqueued once into a CUDA graph by stream capture, then launched as one driver call
//! as often as the same work is wanted again: for callers whose every call enqueues the same
//! long sequence (the communicator's pipeline enqueues hundreds of copies, flags and waits
//! for one large call among eight ranks). Enqueuing costs the host a driver call per
//! operation, and once the driver's queue for the device is full each further call waits for
//! the device; a launch of the graph is one call whatever the graph holds.
//!
//! ```no_run
//! # fn main() -> gp2p_cuda::Result<()> {
//! use gp2p_cuda::{Captured, Device, DeviceBuffer, Stream};
//!
//! let device = Device::open(0)?;
//! let (capturing, stream) = (Stream::new(&device)?, Stream::new(&device)?);
//! let buffer = DeviceBuffer::<u8>::alloc(&device, 1 << 20)?;
//! let target = buffer.raw_ptr();
//! // Nothing runs here: the fill is recorded into the graph.
//! let fill = Captured::capture(&capturing, || {
//!     // SAFETY: the buffer's bytes, on the capturing stream's device.
//!     unsafe { gp2p_cuda::raw::memset_elements_async(&capturing, target, 1, 7, 1 << 20) }
//! })?;
//! // SAFETY: the buffer outlives the launch (synchronised below) and nothing else touches it.
//! unsafe { fill.launch(&stream)? };
//! stream.synchronize()?;
//! # Ok(())
//! # }
//! ```
#![allow(unsafe_code)]

use cudarc::driver::sys::{self, CUgraph, CUgraphExec};

use crate::driver::{check, defer_error};
use crate::{Device, Error, Result, Stream};

/// An executable graph made from what one capture recorded, on one device.
pub struct Captured {
    graph: CUgraph,
    exec: CUgraphExec,
    device: Device,
}

// SAFETY: the graph handles are driver objects, not tied to the thread that made them; a
// launch binds the device's context first, and the destroy calls name the graph itself. Not
// `Sync`: the driver's graph calls are not safe on one graph from two threads at once.
unsafe impl Send for Captured {}

impl Captured {
    /// Record what `enqueue` puts on `stream`, and on every stream that waits on work of it
    /// during the call and is joined back into it by the end, into a graph; and make the graph
    /// executable. Nothing of it runs. `stream` must be a stream of this crate's own
    /// ([`Stream::new`]) that nothing else enqueues on meanwhile and that is not capturing;
    /// other threads' driver calls are not restricted meanwhile (relaxed capture).
    ///
    /// # Errors
    /// `enqueue`'s error (the capture is ended and dropped), or the driver's: a borrowed
    /// stream, an operation that cannot be captured, a side stream not joined back.
    pub fn capture<E: From<Error>>(
        stream: &Stream,
        enqueue: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<Captured, E> {
        if stream.is_borrowed() {
            return Err(Error::InvalidArgument {
                name: "stream",
                reason: String::from(
                    "capture records on a stream of this crate's own (Stream::new), not a borrowed one",
                ),
            }
            .into());
        }
        stream.device().bind()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a live stream of the bound context.
        check(unsafe { sys::cuStreamBeginCapture_v2(stream.raw(), mode) }, "cuStreamBeginCapture")?;
        // Ended whatever `enqueue` does, a panic included, so the stream (and the streams that
        // joined its capture) never stay capturing.
        let mut capturing = Capturing { stream, ended: false };
        let enqueued = enqueue();
        let mut captured =
            Captured { graph: capturing.end()?, exec: std::ptr::null_mut(), device: stream.device().clone() };
        enqueued?;
        if captured.graph.is_null() {
            return Err(Error::InvalidArgument {
                name: "enqueue",
                reason: String::from("the driver returned no graph"),
            }
            .into());
        }
        // SAFETY: a live graph of the bound context; out-pointer into `captured`, which frees
        // it on drop.
        let code = unsafe { sys::cuGraphInstantiateWithFlags(&mut captured.exec, captured.graph, 0) };
        check(code, "cuGraphInstantiate")?;
        Ok(captured)
    }

    /// Enqueue everything the capture recorded on `stream`, as one driver call: it runs after
    /// the work enqueued on `stream` before, and work enqueued there after waits for all of it.
    ///
    /// # Safety
    /// Everything the recorded operations touch (the memory of their copies, kernels and flag
    /// writes) is as their enqueue required again now: allocated, and held until the launch
    /// completes on `stream`; and launches of this graph may run one after another (a launch
    /// is ordered after the earlier launches of the same graph).
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        if stream.device() != &self.device {
            return Err(Error::WrongDevice {
                what: "the captured graph",
                got: self.device.ordinal(),
                expected: stream.device().ordinal(),
            });
        }
        self.device.bind()?;
        // SAFETY: a live executable graph of this device's context, bound; a live stream of
        // it. What the graph touches is the caller's contract.
        check(unsafe { sys::cuGraphLaunch(self.exec, stream.raw()) }, "cuGraphLaunch")
    }
}

/// A capture begun on `stream`, ended once: by [`Capturing::end`], else on drop (a panic).
struct Capturing<'a> {
    stream: &'a Stream,
    ended: bool,
}

impl Capturing<'_> {
    /// End the capture: the graph it recorded (null where the driver made none).
    fn end(&mut self) -> Result<CUgraph> {
        self.ended = true;
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun by `Captured::capture`, ended only here);
        // out-pointer to a local.
        check(unsafe { sys::cuStreamEndCapture(self.stream.raw(), &mut graph) }, "cuStreamEndCapture")?;
        Ok(graph)
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        match self.end() {
            Ok(graph) if !graph.is_null() => {
                // SAFETY: a live graph nobody else holds, destroyed once.
                defer_error(check(unsafe { sys::cuGraphDestroy(graph) }, "cuGraphDestroy"));
            }
            Ok(_) => {}
            Err(e) => defer_error(Err(e)),
        }
    }
}

impl Drop for Captured {
    /// Never blocks: an executable graph still running is freed by the driver once it
    /// completes.
    fn drop(&mut self) {
        if !self.exec.is_null() {
            // SAFETY: a live executable graph, destroyed once.
            defer_error(check(unsafe { sys::cuGraphExecDestroy(self.exec) }, "cuGraphExecDestroy"));
        }
        if !self.graph.is_null() {
            // SAFETY: a live graph, destroyed once, after its executable.
            defer_error(check(unsafe { sys::cuGraphDestroy(self.graph) }, "cuGraphDestroy"));
        }
    }
}

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Captured(device {})", self.device.ordinal())
    }
}
