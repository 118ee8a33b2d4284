//! `HostGate`: hold a stream until the host has enqueued everything, for timing.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys;

use crate::driver::check;
use crate::{Result, Stream};

/// Holds a stream closed: work enqueued after [`HostGate::close`] does not start until the
/// gate is opened (or dropped). Benchmarks use it so that the GPU time between two events
/// measures the GPU's work, not the host's enqueueing.
///
/// The stream runs a host function that waits for the gate; keep the gate short-lived, and
/// never block the host on the gated stream while it is closed (that would deadlock).
pub struct HostGate {
    open: Arc<AtomicBool>,
}

impl HostGate {
    /// Close `stream`: later work on it waits until [`HostGate::open`].
    pub fn close(stream: &Stream) -> Result<HostGate> {
        stream.device().bind()?;
        let open = Arc::new(AtomicBool::new(false));
        let data = Arc::into_raw(open.clone()).cast_mut().cast::<c_void>();
        // SAFETY: `wait_until_open` matches CUhostFn and touches only the Arc it is given,
        // whose strong count `into_raw` leaked for it; it calls no CUDA function.
        let code = unsafe { sys::cuLaunchHostFunc(stream.raw(), Some(wait_until_open), data) };
        if let Err(e) = check(code, "cuLaunchHostFunc") {
            // SAFETY: the launch failed, so the callback never runs: take the count back.
            drop(unsafe { Arc::from_raw(data.cast_const().cast::<AtomicBool>()) });
            return Err(e);
        }
        Ok(HostGate { open })
    }

    /// Let the stream run.
    pub fn open(self) {
        // Drop opens.
    }
}

impl Drop for HostGate {
    fn drop(&mut self) {
        self.open.store(true, Ordering::Release);
    }
}

/// Runs on the driver's callback thread: spin (yielding) until the gate opens.
unsafe extern "C" fn wait_until_open(data: *mut c_void) {
    // SAFETY: `data` came from Arc::into_raw in HostGate::close and is consumed once here.
    let open = unsafe { Arc::from_raw(data.cast_const().cast::<AtomicBool>()) };
    while !open.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
}
