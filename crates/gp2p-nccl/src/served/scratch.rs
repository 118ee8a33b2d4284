//! The scratch a served communicator's calls share: a reduce's output on the ranks that are not
//! its root, a pre-multiplying op's scaled copy and its scalar spread over the buffer, the
//! parts an in-place all-to-all sends. Grown
//! by calls outside CUDA graph capture (allocation may synchronise, which a capture forbids) and
//! reused after: a call waits, on its stream, for the last call's use of a buffer before it
//! writes it, and notes its own use after. Captured calls reuse what is there; a buffer a graph
//! may still read is kept for the process's life.

use geforce_p2p::{Device, DeviceBuffer, Stream};

use crate::error::{Error, Result};

/// Buffer 0: the plan's scratch (`crate::plan::Buf::Scratch(0)`); buffer 1: a scale's fill.
pub const FILL: usize = 1;

/// The shared buffers.
#[derive(Default)]
pub struct Scratch {
    buffers: Vec<Option<DeviceBuffer<u8>>>,
    /// Buffers replaced while a captured graph may still read them: kept for good.
    kept: Vec<DeviceBuffer<u8>>,
    /// Whether a call has used scratch while capturing.
    captured: bool,
}

/// One call's use of the scratch.
pub struct Use<'a> {
    scratch: &'a mut Scratch,
    device: &'a Device,
    stream: &'a Stream,
    capturing: bool,
    /// The buffers this call has used.
    used: Vec<usize>,
}

impl Scratch {
    /// The scratch for one call on `stream`.
    ///
    /// # Errors
    /// The driver's, asking whether the stream captures.
    pub fn for_call<'a>(&'a mut self, device: &'a Device, stream: &'a Stream) -> Result<Use<'a>> {
        let capturing = stream.is_capturing().map_err(|e| Error::Library(e.into()))?;
        Ok(Use { scratch: self, device, stream, capturing, used: Vec::new() })
    }
}

impl Use<'_> {
    /// The address of scratch buffer `n`, holding at least `bytes`, ready for this call's
    /// stream.
    ///
    /// # Errors
    /// [`Error::Usage`] where a captured call needs more than there is; the driver's.
    pub fn address(&mut self, n: usize, bytes: usize) -> Result<u64> {
        let cuda = |e: geforce_p2p::cuda::Error| Error::Library(e.into());
        let buffers = &mut self.scratch.buffers;
        if buffers.len() <= n {
            buffers.resize_with(n + 1, || None);
        }
        if buffers[n].as_ref().is_none_or(|b| b.len() < bytes) {
            if self.capturing {
                return Err(Error::Usage {
                    what: format!(
                        "this call needs {bytes} bytes of the communicator's scratch while a CUDA graph is captured, where none can be allocated: make the same call once before capturing (a warm-up), then capture it"
                    ),
                });
            }
            let grown = DeviceBuffer::alloc(self.device, bytes.max(1)).map_err(cuda)?;
            if let Some(old) = buffers[n].replace(grown)
                && self.scratch.captured
            {
                self.scratch.kept.push(old);
            }
        }
        let Some(buffer) = buffers[n].as_ref() else { return Ok(0) };
        if !self.used.contains(&n) {
            if !self.capturing {
                buffer.wait_last_uses(self.stream).map_err(cuda)?;
            }
            self.used.push(n);
        }
        Ok(buffer.raw_ptr())
    }

    /// After the call's work is enqueued: note its point on every buffer it used, so the next
    /// call (and any free) waits for it; a captured call marks the scratch as read by a graph.
    ///
    /// # Errors
    /// The driver's, recording the point.
    pub fn finish(self) -> Result<()> {
        if self.used.is_empty() {
            return Ok(());
        }
        if self.capturing {
            self.scratch.captured = true;
            return Ok(());
        }
        let point = self.stream.point().map_err(|e| Error::Library(e.into()))?;
        for &n in &self.used {
            if let Some(buffer) = &self.scratch.buffers[n] {
                buffer.uses().note(&point);
            }
        }
        Ok(())
    }
}
