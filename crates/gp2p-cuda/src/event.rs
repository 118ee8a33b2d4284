//! `Event`: CUDA events for ordering streams and for timing.
#![allow(unsafe_code)]

use cudarc::driver::sys::{self, CUevent, CUevent_flags, CUresult};

use crate::driver::{check, defer_error};
use crate::{Device, Error, Result, Stream};

/// Whether an event records timestamps. Sync-only events are cheaper to record and wait on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Records a timestamp, for [`Event::elapsed_ms`].
    Timing,
    /// Ordering only (`CU_EVENT_DISABLE_TIMING`).
    Sync,
}

/// A CUDA event on one device. `Send + Sync`.
///
/// Stream ordering: [`Event::record`] captures the work enqueued on a stream so far;
/// [`Stream::wait`] makes another stream (of any device) wait for exactly the latest record
/// made before the wait, and waiting on an event never recorded does not wait at all. An
/// event may be re-recorded, by any thread, so a wait never assumes which stream recorded
/// it last; [`crate::StreamPoint`] is the immutable kind that can be trusted for that.
pub struct Event {
    device: Device,
    raw: CUevent,
    kind: EventKind,
}

// SAFETY: CUevent is an opaque driver handle; the driver API is thread-safe.
unsafe impl Send for Event {}
// SAFETY: as above; &Event only passes the handle to thread-safe driver calls.
unsafe impl Sync for Event {}

impl Event {
    /// Create an event on `device`.
    pub fn new(device: &Device, kind: EventKind) -> Result<Event> {
        device.bind()?;
        let flags = match kind {
            EventKind::Timing => CUevent_flags::CU_EVENT_DEFAULT,
            EventKind::Sync => CUevent_flags::CU_EVENT_DISABLE_TIMING,
        };
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: the device's context is current; out-pointer to a local.
        check(unsafe { sys::cuEventCreate(&mut raw, flags as u32) }, "cuEventCreate")?;
        Ok(Event { device: device.clone(), raw, kind })
    }

    /// Capture the work enqueued on `stream` so far. The stream must be on this event's device.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        if stream.device() != &self.device {
            return Err(Error::WrongDevice {
                what: "event",
                got: self.device.ordinal(),
                expected: stream.device().ordinal(),
            });
        }
        self.device.bind()?;
        // SAFETY: both handles are live and belong to the same context.
        check(unsafe { sys::cuEventRecord(self.raw, stream.raw()) }, "cuEventRecord")
    }

    /// Block the host until the captured work is done.
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: live event handle.
        check(unsafe { sys::cuEventSynchronize(self.raw) }, "cuEventSynchronize")
    }

    /// Whether the captured work is done, without blocking.
    pub fn is_complete(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: live event handle.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_ERROR_NOT_READY => {
                crate::trace::mark("cuEventQuery");
                Ok(false)
            }
            code => check(code, "cuEventQuery").map(|()| true),
        }
    }

    /// Milliseconds between two recorded timing events; waits for `end` first.
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        for (what, e) in [("start", start), ("end", end)] {
            if e.kind != EventKind::Timing {
                return Err(Error::InvalidArgument {
                    name: what,
                    reason: "created as EventKind::Sync, which records no time".into(),
                });
            }
        }
        end.synchronize()?;
        let mut ms = 0f32;
        // SAFETY: both are live timing events; out-pointer to a local.
        check(unsafe { sys::cuEventElapsedTime(&mut ms, start.raw, end.raw) }, "cuEventElapsedTime")?;
        Ok(ms)
    }

    /// The device this event belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle, for interop (other code may wait on it or record it).
    pub fn raw(&self) -> CUevent {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // The driver defers destruction until recorded work completes, so this never blocks.
        let result = self.device.bind().and_then(|()| {
            // SAFETY: we own the handle and drop it once.
            check(unsafe { sys::cuEventDestroy_v2(self.raw) }, "cuEventDestroy")
        });
        defer_error(result);
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:?} on device {})", self.kind, self.device.ordinal())
    }
}
