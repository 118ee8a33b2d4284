//! `HostAllocation`: untyped pinned host memory, portable and mapped into every device, under
//! the lifetime rule (freed by the reclaimer once the GPU work noted on it is done).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr::NonNull;

use cudarc::driver::sys;

use crate::driver::check;
use crate::lifetime::{LastUses, Release, release_after};
use crate::{Device, Error, RawDevicePtr, Result};

/// Page-locked host memory from `cuMemHostAlloc(PORTABLE | DEVICEMAP)`: pinned for every
/// context and mapped into every device's address space; not write-combined, so the CPU
/// reads it at full speed. Starts zeroed. The typed buffers of `gp2p-pinned` are built on it.
///
/// Lifetime: operations note their GPU work on [`HostAllocation::uses`]; dropping never
/// blocks, and the memory is freed once that work is done.
pub struct HostAllocation {
    ptr: NonNull<u8>,
    bytes: usize,
    device: Device,
    uses: LastUses,
}

// SAFETY: the memory is exclusively owned like a Box<[u8]>; the use record is behind a lock;
// Device is Send + Sync. Handing out access to the bytes is the typed owner's business.
unsafe impl Send for HostAllocation {}
// SAFETY: as above; `&HostAllocation` gives out only addresses, never references to the bytes.
unsafe impl Sync for HostAllocation {}

impl HostAllocation {
    /// `bytes` zeroed bytes; `device` supplies the context for the call (the memory is usable
    /// from every device). Zero bytes allocate nothing.
    pub fn new(device: &Device, bytes: usize) -> Result<Self> {
        device.require_host_mapping()?;
        let ptr = if bytes == 0 {
            // Aligned for any element; never dereferenced with a non-zero length.
            NonNull::<u64>::dangling().cast::<u8>()
        } else {
            let raw = alloc_pinned(device, bytes)?;
            // SAFETY: the driver returned `bytes` writable bytes; zeroing initialises them.
            unsafe { std::ptr::write_bytes(raw.as_ptr(), 0, bytes) };
            raw
        };
        Ok(HostAllocation { ptr, bytes, device: device.clone(), uses: LastUses::new() })
    }

    /// The host address of the first byte.
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Where GPU work last used the memory.
    pub fn uses(&self) -> &LastUses {
        &self.uses
    }

    /// The address `device` uses for the first byte (the mapping of this memory into its
    /// address space; equal to the host address wherever unified addressing is on).
    pub fn device_ptr(&self, device: &Device) -> Result<RawDevicePtr> {
        if self.bytes == 0 {
            return Ok(0);
        }
        crate::raw::mapped_device_ptr(device, self.ptr.as_ptr())
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let release = Release::HostMemory { device: self.device.clone(), ptr: self.ptr.as_ptr().cast() };
            release_after(self.uses.take(), release);
        }
    }
}

impl std::fmt::Debug for HostAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostAllocation({} bytes at {:p})", self.bytes, self.ptr)
    }
}

fn alloc_pinned(device: &Device, bytes: usize) -> Result<NonNull<u8>> {
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    let mut raw: *mut c_void = std::ptr::null_mut();
    device.bind()?;
    // SAFETY: a context is current (flushing releases runs on this thread and leaves it so);
    // out-pointer to a local.
    let code = crate::lifetime::retry_after_releases(|| unsafe { sys::cuMemHostAlloc(&mut raw, bytes, flags) });
    check(code, "cuMemHostAlloc")?;
    NonNull::new(raw.cast::<u8>())
        .ok_or_else(|| Error::InvalidArgument { name: "bytes", reason: "cuMemHostAlloc returned null".into() })
}
