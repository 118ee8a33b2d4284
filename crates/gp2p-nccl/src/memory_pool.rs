//! `ncclMemAlloc` / `ncclMemFree` where no real NCCL is loaded: device memory of the calling
//! thread's current device from the library's own pool, kept by address until freed.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, PoisonError};

use geforce_p2p::{Device, DeviceBuffer};

use crate::error::{Error, Result};

/// What `ncclMemAlloc` handed out, by address.
static HANDED_OUT: LazyLock<Mutex<HashMap<u64, DeviceBuffer<u8>>>> = LazyLock::new(Mutex::default);

/// `size` bytes of device memory on the current device (device 0 where none is current).
///
/// # Errors
/// The driver's, or the pool's.
pub fn alloc(size: usize) -> Result<*mut c_void> {
    let lib = |e: geforce_p2p::cuda::Error| Error::Library(e.into());
    let ordinal = Device::current_ordinal().map_err(lib)?.unwrap_or(0);
    let device = Device::open(ordinal).map_err(lib)?;
    let buffer = DeviceBuffer::<u8>::alloc(&device, size.max(1)).map_err(lib)?;
    let address = buffer.raw_ptr();
    HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner).insert(address, buffer);
    Ok(std::ptr::with_exposed_provenance_mut(address as usize))
}

/// Free what [`alloc`] gave at `ptr`: `false` where it gave nothing there. The door records
/// no use of this memory (the caller's kernels use it), so, as `cudaFree` and NCCL's own
/// `ncclMemFree` do, it waits for the device's work before the memory goes back to the pool.
pub fn free(ptr: *mut c_void) -> bool {
    let address = ptr.expose_provenance() as u64;
    let Some(buffer) = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner).remove(&address) else {
        return false;
    };
    if buffer.device().synchronize().is_err() {
        // The device is gone or broken: keep the memory rather than free it under work.
        std::mem::forget(buffer);
    }
    true
}
