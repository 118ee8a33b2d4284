//! `Stream`: owned or borrowed CUDA streams, and `StreamFork` for work on internal streams.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult, CUstream, CUstream_flags};
use parking_lot::Mutex;

use crate::driver::{check, take_deferred_error};
use crate::lifetime::{Release, ReservedPoint, StreamId, StreamPoint, give_back_event, release_after};
use crate::{Device, Error, Event, EventKind, Result};

/// A raw `CUstream` handle from other CUDA code (PyTorch's `torch.cuda.Stream.cuda_stream`,
/// CuPy's `Stream.ptr`, cudarc's `CudaStream::cu_stream`).
pub type RawStream = CUstream;

/// A CUDA stream on one device: created by us, or borrowed from another framework (never
/// destroyed by us). `Send + Sync`.
///
/// Dropping an owned stream never blocks: it is destroyed by the reclaimer once the work
/// enqueued on it is done (see [`crate::lifetime`]).
pub struct Stream {
    device: Device,
    raw: CUstream,
    /// Owned streams only (`None` when borrowed): the event of the point the drop takes,
    /// reserved at creation so that dropping makes no driver call that can wait (creating an
    /// event can).
    drop_point: Option<ReservedPoint>,
    identity: Arc<Identity>,
    /// Whether the stream was capturing when it was borrowed for one call
    /// ([`Stream::borrow_raw_for_call`], whose contract keeps it true while this value
    /// lives); `None`: ask the driver each time.
    capture_at_borrow: Option<bool>,
}

/// What every `Stream` value over one driver stream shares: its id, never reused (unlike a
/// raw handle), so a point knows whether it was taken on the stream it is waited on, and the
/// number of points taken so far, held across each record so that the numbers follow the
/// driver's order of records on the stream.
struct Identity {
    id: StreamId,
    points: Mutex<u64>,
}

/// Whether `raw` names the legacy default stream: the null handle, or `CU_STREAM_LEGACY`.
fn is_legacy(raw: CUstream) -> bool {
    /// `CU_STREAM_LEGACY` in cuda.h.
    const LEGACY_HANDLE: usize = 0x1;
    raw.is_null() || raw as usize == LEGACY_HANDLE
}

impl Identity {
    fn fresh() -> Arc<Identity> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Arc::new(Identity { id: NEXT.fetch_add(1, Ordering::Relaxed), points: Mutex::new(0) })
    }

    /// The identity of a borrowed driver stream. A framework hands over the same stream at
    /// every call (PyTorch's current stream); were each borrow a stream of its own, every
    /// allocation it touches would keep a point per call, and every later call would wait
    /// for all of them. The driver's stream id (`cuStreamGetId`) is unique in the process and
    /// never reused, so borrows of one stream share one identity, kept for the process.
    /// The per-thread default stream is one handle for a different stream on each thread, so
    /// each of its borrows (and any stream the driver cannot name) gets an identity of its own.
    /// So does a stream capturing a CUDA graph: asking its id ends the capture as invalidated
    /// (seen on driver 580 with torch's captures). Operations that take points refuse such a
    /// stream ([`Error::Capturing`]); the communicator's calls take none while capturing.
    ///
    /// The legacy default stream (the null or `CU_STREAM_LEGACY` handle) is one stream per
    /// context for the process's life, so it has one identity per device without asking the
    /// driver for its id: a framework on its default stream (PyTorch's, unless told
    /// otherwise) saves a driver call per borrow.
    ///
    /// Also returns whether the stream was capturing, where the driver said (not for the
    /// default streams, which are not asked here).
    fn of_borrowed(device: &Device, raw: CUstream) -> (Arc<Identity>, Option<bool>) {
        /// `CU_STREAM_PER_THREAD` in cuda.h.
        const PER_THREAD: usize = 0x2;
        /// The key of the legacy default stream among the driver's ids, which count up
        /// from small numbers.
        const LEGACY: u64 = u64::MAX;
        if is_legacy(raw) {
            // Its capture status is still asked where the caller wants it (`None`): while a
            // blocking stream of the context captures, the question fails with the
            // driver's own error before anything is enqueued, and the capture survives.
            return (Identity::known(device, LEGACY), None);
        }
        if raw as usize == PER_THREAD || device.bind().is_err() {
            return (Identity::fresh(), None);
        }
        let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        // SAFETY: the caller vouches for the handle (`borrow_raw`'s contract); a context is
        // current; out-pointer to a local.
        let asked = unsafe { sys::cuStreamIsCapturing(raw, &mut capture) };
        crate::trace::mark("cuStreamIsCapturing");
        if asked != CUresult::CUDA_SUCCESS {
            return (Identity::fresh(), None);
        }
        if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return (Identity::fresh(), Some(true));
        }
        let mut driver_id: std::ffi::c_ulonglong = 0;
        // SAFETY: as above.
        let asked = unsafe { sys::cuStreamGetId(raw, &mut driver_id) };
        crate::trace::mark("cuStreamGetId");
        if asked != CUresult::CUDA_SUCCESS {
            return (Identity::fresh(), Some(false));
        }
        (Identity::known(device, driver_id), Some(false))
    }

    /// The identity of the borrowed stream `driver_id` names on `device`, kept for the process.
    fn known(device: &Device, driver_id: u64) -> Arc<Identity> {
        /// Identities of the borrowed streams seen so far, by device ordinal and driver id.
        type Known = Mutex<HashMap<(usize, u64), Arc<Identity>>>;
        static KNOWN: OnceLock<Known> = OnceLock::new();
        let known = KNOWN.get_or_init(Default::default);
        known.lock().entry((device.ordinal(), driver_id)).or_insert_with(Identity::fresh).clone()
    }
}

// SAFETY: CUstream is an opaque driver handle; enqueueing from several threads is allowed
// by the driver API (the order between threads is then the caller's business).
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream on `device` (it does not synchronise with the legacy
    /// default stream).
    pub fn new(device: &Device) -> Result<Stream> {
        device.bind()?;
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; out-pointer to a local.
        check(unsafe { sys::cuStreamCreate(&mut raw, flags) }, "cuStreamCreate")?;
        let drop_point = match ReservedPoint::new(device) {
            Ok(reserved) => reserved,
            Err(e) => {
                // SAFETY: the stream was just created and nothing was enqueued on it.
                let _ = unsafe { sys::cuStreamDestroy_v2(raw) };
                return Err(e);
            }
        };
        Ok(Stream {
            device: device.clone(),
            raw,
            drop_point: Some(drop_point),
            identity: Identity::fresh(),
            capture_at_borrow: None,
        })
    }

    /// The legacy default stream of `device`'s primary context: where the CUDA runtime and
    /// PyTorch enqueue unless told otherwise. It waits for, and is waited for by, every
    /// blocking stream of the context (the library's own streams are non-blocking).
    pub fn legacy(device: &Device) -> Stream {
        // SAFETY: the null handle names the legacy default stream of the current context,
        // which every call through this stream binds to `device`'s primary context first;
        // the device keeps that context retained for the process, so the stream outlives
        // anything enqueued on it, and borrowed streams are never destroyed.
        unsafe { Stream::borrow_raw(device, std::ptr::null_mut()) }
    }

    /// Borrow a stream created elsewhere. A null handle means the legacy default stream.
    ///
    /// # Safety
    /// `raw` must be a stream of `device`'s primary context (or null) and must stay alive for
    /// as long as the returned `Stream` and anything enqueued through it are in use. It is
    /// never destroyed by this crate.
    pub unsafe fn borrow_raw(device: &Device, raw: RawStream) -> Stream {
        let identity = Identity::of_borrowed(device, raw).0;
        Stream { device: device.clone(), raw, drop_point: None, identity, capture_at_borrow: None }
    }

    /// As [`Stream::borrow_raw`], for one call of a framework's stream: the driver is asked
    /// once, here, whether the stream is capturing a CUDA graph, and that answer stands for
    /// the returned value's life: [`Stream::is_capturing`] and the refusals before anything
    /// is enqueued read it instead of asking again (a staged copy asked twice per stream
    /// before its work, the communicator twice per call). The refusal where an operation
    /// records its use, after its work, still asks the driver. Fails only where the driver
    /// refuses the question (the legacy default stream while a blocking stream of the context
    /// captures); the caller refuses a capturing stream with [`Stream::refuse_capture`], or
    /// lets the call be captured.
    ///
    /// # Safety
    /// As [`Stream::borrow_raw`], and no capture begins or ends on `raw` while the returned
    /// value lives: drop it before the call that borrowed it returns. (Frameworks begin and
    /// end captures between calls, on the capturing thread.)
    pub unsafe fn borrow_raw_for_call(device: &Device, raw: RawStream) -> Result<Stream> {
        let (identity, capturing) = Identity::of_borrowed(device, raw);
        let mut stream = Stream { device: device.clone(), raw, drop_point: None, identity, capture_at_borrow: None };
        let capturing = match capturing {
            Some(capturing) => capturing,
            None => stream.is_capturing()?,
        };
        stream.capture_at_borrow = Some(capturing);
        Ok(stream)
    }

    /// The device this stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle, for interop and for the driver calls of sibling crates.
    pub fn raw(&self) -> RawStream {
        self.raw
    }

    /// Whether `other` enqueues on the same driver stream (two `Stream` values may wrap one
    /// handle: a borrowed stream and its owner, say).
    pub fn is_same_as(&self, other: &Stream) -> bool {
        self.device == other.device && self.raw == other.raw
    }

    /// Whether this stream was borrowed with [`Stream::borrow_raw`].
    pub fn is_borrowed(&self) -> bool {
        self.drop_point.is_none()
    }

    /// Make later work on this stream wait (on the GPU) for the work `event` captured at its
    /// latest record. The event may belong to any device.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live; cross-context waits are allowed by the driver.
        check(unsafe { sys::cuStreamWaitEvent(self.raw, event.raw(), 0) }, "cuStreamWaitEvent")
    }

    /// Capture the work enqueued on this stream so far as a [`StreamPoint`]: the last-use
    /// record of the operations that touch memory, and the cheapest way to order another
    /// stream after this one.
    ///
    /// Every operation enqueues its work and then notes a point on what it touched. If the
    /// point cannot be taken, this waits for the stream before returning the error, so that
    /// work enqueued before it has no use left to note: a buffer dropped after the error is
    /// not freed under it. (Only on this error path does taking a point block.)
    pub fn point(&self) -> Result<StreamPoint> {
        // The event is taken before the identity's lock, which every borrow of this driver
        // stream shares: creating an event can wait for the device.
        match self.reserve_point() {
            Ok(reserved) => self.point_from(reserved),
            Err(e) => Err(self.settle_after(e)),
        }
    }

    /// Set aside an event for a point to be taken on this stream later with
    /// [`Stream::point_from`], whose only driver call is then the record (see
    /// [`ReservedPoint`]).
    pub fn reserve_point(&self) -> Result<ReservedPoint> {
        ReservedPoint::new(&self.device)
    }

    /// [`Stream::point`] with an event reserved before (its only driver call is the record,
    /// which never waits). The reservation must come from a stream of this device. As with
    /// `point`, a failure waits for the stream before it returns.
    pub fn point_from(&self, reserved: ReservedPoint) -> Result<StreamPoint> {
        self.record(reserved).map_err(|e| self.settle_after(e))
    }

    /// Record `reserved` as this stream's next point; on failure, return the error without
    /// waiting (the callers decide whether to). Every operation that touches memory records
    /// one, so this is where work captured into a graph is refused: on a borrowed stream,
    /// whose owner may capture it (safely, through cudarc); an owned stream's handle is
    /// captured only through raw driver calls.
    fn record(&self, reserved: ReservedPoint) -> Result<StreamPoint> {
        let event = reserved.into_event();
        let refused = if event.device() != &self.device {
            Some(Error::WrongDevice {
                what: "reserved point",
                got: event.device().ordinal(),
                expected: self.device.ordinal(),
            })
        } else if is_legacy(self.raw) {
            // The legacy default stream never captures: no capture can start on it or take
            // it in (while a blocking stream of the context captures, work on it fails
            // instead, at the enqueue that precedes any point). Not asking saves a driver
            // call per point.
            None
        } else if !self.is_borrowed() {
            None
        } else {
            // The driver is asked even where the borrow's answer is kept: this is the net for
            // a capture another thread began on the stream meanwhile.
            match self.driver_says_capturing() {
                Ok(true) => Some(Error::Capturing),
                Ok(false) => None,
                Err(e) => Some(e),
            }
        };
        if let Some(e) = refused {
            give_back_event(event);
            return Err(e);
        }
        let mut count = self.identity.points.lock();
        *count += 1;
        StreamPoint::record_with(self, *count, event)
    }

    /// Wait for everything enqueued so far (ignoring how that goes: `error` is what the
    /// caller reports), for when a point after enqueued work could not be taken.
    fn settle_after(&self, error: Error) -> Error {
        if self.device.bind().is_ok() {
            // SAFETY: live stream handle. The result is not taken: a context failure shows
            // in `error` or at the next call, and a destructor's deferred error stays queued
            // for its owner (Stream::synchronize would take it).
            let _ = unsafe { sys::cuStreamSynchronize(self.raw) };
        }
        error
    }

    /// Make later work on this stream wait (on the GPU) for the work `point` captured. A
    /// point taken on this very stream is not waited for: the stream's own order already
    /// puts that work first, and a GPU-side wait costs microseconds on a small copy's
    /// critical path.
    pub fn wait_point(&self, point: &StreamPoint) -> Result<()> {
        if point.stream_id() == self.identity.id {
            return Ok(());
        }
        self.wait(point.event())
    }

    /// Refuse a borrowed stream that is capturing a CUDA graph ([`Error::Capturing`]),
    /// before anything is enqueued on it: an operation's buffers record their last use once,
    /// at capture, and would not know about the replays. Every operation checks this (asking
    /// the driver) when it records its use, after its work is enqueued, and the refusal there
    /// also invalidates the capture (a deliberate capture-illegal wait, which
    /// compute-sanitizer reports as an API error); callers that take a stream from elsewhere
    /// (the Python bindings, the staged copies, the collectives) check here first so that
    /// nothing is captured at all. An owned stream passes: only raw driver calls capture it.
    pub fn refuse_capture(&self) -> Result<()> {
        if self.is_borrowed() && self.is_capturing()? { Err(Error::Capturing) } else { Ok(()) }
    }

    /// Whether the stream is capturing a CUDA graph: work enqueued now is recorded into the
    /// graph, not run. A stream borrowed for one call ([`Stream::borrow_raw_for_call`])
    /// answers what the driver said at the borrow.
    pub fn is_capturing(&self) -> Result<bool> {
        match self.capture_at_borrow {
            Some(capturing) => Ok(capturing),
            None => self.driver_says_capturing(),
        }
    }

    /// Whether the driver says the stream is capturing now.
    fn driver_says_capturing(&self) -> Result<bool> {
        self.device.bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: live stream handle; out-pointer to a local.
        check(unsafe { sys::cuStreamIsCapturing(self.raw, &mut status) }, "cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Whether everything enqueued on this stream so far is done, without blocking. Work
    /// that depends on the stream's past need not wait for it when this says `true`.
    pub fn is_idle(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: live stream handle.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            CUresult::CUDA_ERROR_NOT_READY => {
                crate::trace::mark("cuStreamQuery");
                Ok(false)
            }
            code => check(code, "cuStreamQuery").map(|()| true),
        }
    }

    pub(crate) fn id(&self) -> StreamId {
        self.identity.id
    }

    /// Block the host until everything enqueued on this stream is done. Also returns the
    /// first error a destructor met since the last call (see [`crate::take_deferred_error`]).
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: live stream handle.
        check(unsafe { sys::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")?;
        take_deferred_error().map_or(Ok(()), Err)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let Some(reserved) = self.drop_point.take() else {
            return; // borrowed: its owner destroys it
        };
        // Destroyed once the work enqueued so far is done, by the reclaimer: the destroy
        // itself is allowed while busy, but whatever the work reads must outlive it, and
        // the releases that wait for it are ordered by this point. The record is the only
        // driver call here; should it fail (a broken context), the stream is destroyed at
        // once, which the driver allows while work is pending, and the drop does not wait:
        // the memory that work touches keeps points of its own.
        let points = self.record(reserved).map(|p| vec![p]).unwrap_or_default();
        release_after(points, Release::Stream { device: self.device.clone(), raw: self.raw });
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_borrowed() { "borrowed" } else { "owned" };
        write!(f, "Stream({kind} {:p} on device {})", self.raw, self.device.ordinal())
    }
}

/// Internal streams that start after a caller's stream and rejoin it: how an op uses
/// several copy engines at once while still behaving like one call on the caller's stream.
///
/// ```no_run
/// # fn demo() -> gp2p_cuda::Result<()> {
/// use gp2p_cuda::{Device, Stream, StreamFork};
/// let device = Device::open(0)?;
/// let caller = Stream::new(&device)?;
/// let fork = StreamFork::new(&device, 2)?;
/// let [up, down] = fork.fork(&caller)? else { unreachable!() };
/// // ... enqueue on `up` and `down`: both start after earlier work on `caller` ...
/// fork.join(&caller)?; // later work on `caller` sees everything done on them
/// # Ok(()) }
/// ```
///
/// Reusable across calls; each `fork` must be followed by a `join` before the next `fork`
/// (the type does not track this: it is a building block, not a guard).
pub struct StreamFork {
    streams: Vec<Stream>,
    forked: Vec<Event>,
    joined: Vec<Event>,
}

/// Callers one fork or join can serve at once (a copy has one per side).
const MAX_CALLERS: usize = 2;

impl StreamFork {
    /// `count` internal streams on `device`.
    pub fn new(device: &Device, count: usize) -> Result<StreamFork> {
        if count == 0 {
            return Err(Error::InvalidArgument { name: "count", reason: "a fork needs at least one stream".into() });
        }
        let streams = (0..count).map(|_| Stream::new(device)).collect::<Result<Vec<_>>>()?;
        let joined = (0..count).map(|_| Event::new(device, EventKind::Sync)).collect::<Result<Vec<_>>>()?;
        let forked = (0..MAX_CALLERS).map(|_| Event::new(device, EventKind::Sync)).collect::<Result<Vec<_>>>()?;
        Ok(StreamFork { streams, forked, joined })
    }

    /// Make every internal stream wait for the work enqueued on `caller` so far; returns them.
    pub fn fork(&self, caller: &Stream) -> Result<&[Stream]> {
        self.fork_after(&[caller])
    }

    /// Make every internal stream wait for the work enqueued so far on each of `callers`
    /// (at most two, all on this fork's device); returns the internal streams.
    pub fn fork_after(&self, callers: &[&Stream]) -> Result<&[Stream]> {
        if callers.len() > self.forked.len() {
            return Err(Error::InvalidArgument {
                name: "callers",
                reason: format!("{} callers, a fork serves at most {MAX_CALLERS}", callers.len()),
            });
        }
        let device = self.streams[0].device();
        for (caller, event) in callers.iter().zip(&self.forked) {
            if caller.device() != device {
                return Err(Error::WrongDevice {
                    what: "fork caller",
                    got: caller.device().ordinal(),
                    expected: device.ordinal(),
                });
            }
            event.record(caller)?;
            for s in &self.streams {
                s.wait(event)?;
            }
        }
        Ok(&self.streams)
    }

    /// Make `caller` wait for everything enqueued on the internal streams so far.
    pub fn join(&self, caller: &Stream) -> Result<()> {
        self.join_into(&[caller])
    }

    /// Make each of `callers` (of any device) wait for everything enqueued on the internal
    /// streams so far.
    pub fn join_into(&self, callers: &[&Stream]) -> Result<()> {
        for (s, e) in self.streams.iter().zip(&self.joined) {
            e.record(s)?;
            for caller in callers {
                caller.wait(e)?;
            }
        }
        Ok(())
    }

    /// The internal streams.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// The device the internal streams are on.
    pub fn device(&self) -> &Device {
        self.streams[0].device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legacy_stream_has_two_handles_and_the_per_thread_stream_is_not_one() {
        let handle = |raw: usize| -> CUstream { std::ptr::without_provenance_mut(raw) };
        assert!(is_legacy(handle(0)), "null");
        assert!(is_legacy(handle(0x1)), "CU_STREAM_LEGACY");
        assert!(!is_legacy(handle(0x2)), "CU_STREAM_PER_THREAD is another stream on each thread");
        assert!(!is_legacy(handle(0x7f00_dead_b000)), "a created stream");
    }
}
