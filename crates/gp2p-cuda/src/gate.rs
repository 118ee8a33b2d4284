//! `HostGate`: hold a stream until the host has enqueued everything, for timing.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys;

#[cfg(doc)]
use crate::Error;
use crate::driver::check;
use crate::{Result, Stream};

/// Holds a stream closed: work enqueued after [`HostGate::close`] does not start until the
/// gate is opened (or dropped). Benchmarks use it so that the GPU time between two events
/// measures the GPU's work, not the host's enqueueing.
///
/// The stream runs a host function that waits for the gate; keep the gate short-lived, and
/// never block the host on the gated stream while it is closed (that would deadlock, unless
/// the gate was closed with a deadline: [`HostGate::close_until`]).
pub struct HostGate {
    state: Arc<GateState>,
}

struct GateState {
    open: AtomicBool,
    /// The gate opens by itself after this long, if given.
    deadline: Option<Duration>,
    /// Set by the host function when the deadline, not the owner, opened the gate.
    expired: AtomicBool,
}

impl HostGate {
    /// Close `stream`: later work on it waits until [`HostGate::open`]. A stream capturing a
    /// CUDA graph is refused ([`Error::Capturing`]).
    pub fn close(stream: &Stream) -> Result<HostGate> {
        Self::close_with(stream, None)
    }

    /// As [`HostGate::close`], but the gate opens by itself `deadline` after the stream
    /// reaches it: a benchmark whose enqueueing blocks (the driver's queue full behind the
    /// gate) then times host and GPU together instead of deadlocking.
    /// [`HostGate::expired`] tells afterwards whether that happened.
    pub fn close_until(stream: &Stream, deadline: Duration) -> Result<HostGate> {
        Self::close_with(stream, Some(deadline))
    }

    /// Whether the deadline opened the gate before [`HostGate::open`] did.
    pub fn expired(&self) -> bool {
        self.state.expired.load(Ordering::Acquire)
    }

    fn close_with(stream: &Stream, deadline: Option<Duration>) -> Result<HostGate> {
        // A capture would record the host function into its graph, and every launch of the
        // graph would run it again on the state counted for one run ([`Error::Capturing`]).
        stream.refuse_capture()?;
        stream.device().bind()?;
        let state = Arc::new(GateState { open: AtomicBool::new(false), deadline, expired: AtomicBool::new(false) });
        let data = Arc::into_raw(state.clone()).cast_mut().cast::<c_void>();
        // SAFETY: `wait_until_open` matches CUhostFn and touches only the Arc it is given,
        // whose strong count `into_raw` leaked for it; it calls no CUDA function.
        let code = unsafe { sys::cuLaunchHostFunc(stream.raw(), Some(wait_until_open), data) };
        if let Err(e) = check(code, "cuLaunchHostFunc") {
            // SAFETY: the launch failed, so the callback never runs: take the count back.
            drop(unsafe { Arc::from_raw(data.cast_const().cast::<GateState>()) });
            return Err(e);
        }
        Ok(HostGate { state })
    }

    /// Let the stream run.
    pub fn open(self) {
        // Drop opens.
    }
}

impl Drop for HostGate {
    fn drop(&mut self) {
        self.state.open.store(true, Ordering::Release);
    }
}

/// Runs on the driver's callback thread: spin (yielding) until the gate opens, or its
/// deadline passes.
unsafe extern "C" fn wait_until_open(data: *mut c_void) {
    // SAFETY: `data` came from Arc::into_raw in HostGate::close_with and is consumed once here.
    let state = unsafe { Arc::from_raw(data.cast_const().cast::<GateState>()) };
    let start = Instant::now();
    while !state.open.load(Ordering::Acquire) {
        if state.deadline.is_some_and(|d| start.elapsed() >= d) {
            state.expired.store(true, Ordering::Release);
            return;
        }
        std::thread::yield_now();
    }
}
