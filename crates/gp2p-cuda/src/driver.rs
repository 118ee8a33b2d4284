//! Loading and initialising the driver, turning `CUresult` codes into errors, the
//! deferred-error slot that lets `Drop` report failures without panicking, and the driver's
//! address type, which every module from `raw` up passes around.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use parking_lot::Mutex;

use crate::{Error, Result};

/// A raw device address.
pub type RawDevicePtr = CUdeviceptr;

/// Whether the CUDA driver library can be loaded on this machine. Never panics.
pub fn is_driver_present() -> bool {
    !matches!(init(), Err(Error::NoDriver))
}

/// Load and initialise the driver once per process; every entry point calls this first.
///
/// cudarc panics when it cannot find libcuda, so its presence is checked before any call.
pub(crate) fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: is_culib_present only tries to open the library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoDriver);
        }
        // SAFETY: the library is present; cuInit takes no pointers and flags must be 0.
        init_outcome(unsafe { sys::cuInit(0) })
    })
    .clone()
}

/// What cuInit's answer means. A driver that sees no device (none installed, or all hidden
/// by CUDA_VISIBLE_DEVICES) leaves nothing to do, as no driver does: [`Error::NoDevice`],
/// which callers treat as unavailable (exit 2 in gp2p), not a driver failure.
fn init_outcome(code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_ERROR_NO_DEVICE {
        return Err(Error::NoDevice { ordinal: 0, count: 0 });
    }
    check(code, "cuInit")
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> Result<(u32, u32)> {
    init()?;
    let mut version = 0;
    // SAFETY: the out-pointer is a valid local.
    check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
    let version = u32::try_from(version).unwrap_or(0);
    Ok((version / 1000, (version % 1000) / 10))
}

/// Turn a `CUresult` into `Ok(())` or an [`Error::Driver`] naming `call`.
pub fn check(code: CUresult, call: &'static str) -> Result<()> {
    crate::trace::mark(call);
    if code == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver is loaded (we only get here after a driver call returned), and
    // cuGetErrorName writes a pointer to a static NUL-terminated string or leaves it null.
    let named = unsafe { sys::cuGetErrorName(code, &mut name_ptr) } == CUresult::CUDA_SUCCESS;
    let name = if named && !name_ptr.is_null() {
        // SAFETY: non-null and NUL-terminated, owned by the driver for the process lifetime.
        unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy().into_owned()
    } else {
        format!("{code:?}")
    };
    Err(Error::Driver { call, name, code: code as u32 })
}

static DEFERRED: Mutex<Option<Error>> = Mutex::new(None);

/// Keep the first error that a `Drop` could not return, for [`take_deferred_error`].
pub(crate) fn defer_error(result: Result<()>) {
    if let Err(e) = result {
        DEFERRED.lock().get_or_insert(e);
    }
}

/// The first error a destructor met since the last call, if any. [`crate::Stream::synchronize`]
/// returns it too, so a failure in `Drop` surfaces at the next synchronisation.
pub fn take_deferred_error() -> Option<Error> {
    DEFERRED.lock().take()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_that_sees_no_device_is_unavailable_like_no_driver() {
        let none = init_outcome(CUresult::CUDA_ERROR_NO_DEVICE).unwrap_err();
        assert!(matches!(none, Error::NoDevice { ordinal: 0, count: 0 }) && none.is_unavailable(), "{none}");
        assert!(init_outcome(CUresult::CUDA_SUCCESS).is_ok());
    }

    #[test]
    fn success_is_ok() {
        assert_eq!(check(CUresult::CUDA_SUCCESS, "cuTest"), Ok(()));
    }

    #[test]
    fn deferred_errors_keep_the_first() {
        let first = Error::InvalidArgument { name: "a", reason: "first".into() };
        defer_error(Err(first.clone()));
        defer_error(Err(Error::NoDriver));
        assert_eq!(take_deferred_error(), Some(first));
        assert_eq!(take_deferred_error(), None);
    }
}
