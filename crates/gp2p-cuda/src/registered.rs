//! `HostRegistration`: host memory allocated elsewhere (a shared-memory mapping another
//! process also maps), page-locked and mapped into every device by the driver, under the
//! lifetime rule.
#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys;

use crate::driver::check;
use crate::lifetime::{LastUses, Release, release_after};
use crate::{Device, Error, RawDevicePtr, Result};

/// Memory the registration keeps mapped: the owner of the mapping (a shared-memory segment,
/// say), held until the driver has let go of the pages.
pub type MappingOwner = Arc<dyn Any + Send + Sync>;

/// Host memory registered with `cuMemHostRegister(PORTABLE | DEVICEMAP)`: page-locked for
/// every context and mapped into every device's address space while the registration lives.
///
/// Lifetime: operations note their GPU work on [`HostRegistration::uses`]. Dropping never
/// blocks: once that work is done, the reclaimer unregisters the memory and only then drops
/// the mapping's owner, so the pages stay mapped for as long as the driver or the GPU may
/// touch them.
pub struct HostRegistration {
    ptr: NonNull<u8>,
    bytes: usize,
    device: Device,
    uses: LastUses,
    owner: Option<MappingOwner>,
}

// SAFETY: the registration hands out addresses only, never references to the bytes; the use
// record is behind a lock; the owner is Send + Sync.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Register the `bytes` bytes at `ptr`; `device` supplies the context for the call (the
    /// registration is portable: every device maps the memory).
    ///
    /// # Safety
    /// - `ptr..ptr + bytes` is a live, readable and writable mapping of this process, page
    ///   aligned at both ends, that stays mapped for as long as `owner` is alive;
    /// - nothing else registers or unregisters these pages meanwhile (registering the same
    ///   pages twice fails; concurrent registrations of shared pages from several processes
    ///   have been seen to fail now and then, so callers serialise them).
    pub unsafe fn new(device: &Device, ptr: NonNull<u8>, bytes: usize, owner: MappingOwner) -> Result<Self> {
        device.require_host_mapping()?;
        if bytes == 0 {
            return Err(Error::InvalidArgument { name: "bytes", reason: "nothing to register (0 bytes)".into() });
        }
        device.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller vouches for the range (live, page aligned, unregistered); a
        // context is current.
        let code = unsafe { sys::cuMemHostRegister_v2(ptr.as_ptr().cast::<c_void>(), bytes, flags) };
        check(code, "cuMemHostRegister")?;
        Ok(HostRegistration { ptr, bytes, device: device.clone(), uses: LastUses::new(), owner: Some(owner) })
    }

    /// The first byte, as this process's CPU sees it.
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The address `device` uses for the first byte.
    pub fn device_ptr(&self, device: &Device) -> Result<RawDevicePtr> {
        crate::raw::mapped_device_ptr(device, self.ptr.as_ptr())
    }

    /// Where GPU work last used the memory.
    pub fn uses(&self) -> &LastUses {
        &self.uses
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let release = Release::HostRegistration {
            device: self.device.clone(),
            ptr: self.ptr.as_ptr().cast(),
            owner: self.owner.take(),
        };
        release_after(self.uses.take(), release);
    }
}

impl std::fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostRegistration({} bytes at {:p})", self.bytes, self.ptr)
    }
}
