//! `HostAllocation`: untyped pinned host memory, portable and mapped into every device, under
//! the lifetime rule (freed by the reclaimer once the GPU work noted on it is done).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr::NonNull;

use cudarc::driver::sys;

use crate::driver::check;
use crate::host_cache;
use crate::lifetime::{LastUses, Release, release_after};
use crate::{Device, Error, RawDevicePtr, Result};

/// Page-locked host memory from `cuMemHostAlloc(PORTABLE | DEVICEMAP)`: pinned for every
/// context and mapped into every device's address space; not write-combined, so the CPU
/// reads it at full speed. Starts zeroed. The typed buffers of `gp2p-pinned` are built on it.
///
/// Lifetime: operations note their GPU work on [`HostAllocation::uses`]; dropping never
/// blocks, and once that work is done the memory is kept for the next allocation of about
/// the same size, never handed back to the driver behind the caller's back (freeing pinned
/// memory waits for the whole device): [`crate::release_cached_host_memory`] does that.
pub struct HostAllocation {
    ptr: NonNull<u8>,
    bytes: usize,
    /// The block's size (`host_cache::block_bytes(bytes)`), which it goes back to the cache as.
    block: usize,
    uses: LastUses,
}

// SAFETY: the memory is exclusively owned like a Box<[u8]>; the use record is behind a lock;
// Device is Send + Sync. Handing out access to the bytes is the typed owner's business.
unsafe impl Send for HostAllocation {}
// SAFETY: as above; `&HostAllocation` gives out only addresses, never references to the bytes.
unsafe impl Sync for HostAllocation {}

impl HostAllocation {
    /// `bytes` zeroed bytes; `device` supplies the context for the call (the memory is usable
    /// from every device). Zero bytes allocate nothing. A block freed earlier is reused when
    /// one of the size class is cached (no driver call then).
    pub fn new(device: &Device, bytes: usize) -> Result<Self> {
        device.require_host_mapping()?;
        let (ptr, block) = if bytes == 0 {
            // Aligned for any element; never dereferenced with a non-zero length.
            (NonNull::<u64>::dangling().cast::<u8>(), 0)
        } else {
            let block = host_cache::block_bytes(bytes);
            let raw = match host_cache::take(block) {
                Some(cached) => cached,
                None => alloc_pinned(device, block)?,
            };
            // SAFETY: the block has at least `bytes` writable bytes that nothing else uses (a
            // fresh allocation, or a cached one whose owner and GPU work are gone); zeroing
            // initialises them.
            unsafe { std::ptr::write_bytes(raw.as_ptr(), 0, bytes) };
            (raw, block)
        };
        Ok(HostAllocation { ptr, bytes, block, uses: LastUses::new() })
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
            let give_back = host_cache::put;
            release_after(self.uses.take(), Release::HostMemory { ptr: self.ptr, block: self.block, give_back });
        }
    }
}

impl std::fmt::Debug for HostAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostAllocation({} bytes at {:p})", self.bytes, self.ptr)
    }
}

/// A new block from the driver. Out of memory, it waits for what was dropped to be released
/// and tries again; still out of memory, it hands the cached blocks back to the driver and
/// tries once more (both may block).
fn alloc_pinned(device: &Device, bytes: usize) -> Result<NonNull<u8>> {
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    let mut raw: *mut c_void = std::ptr::null_mut();
    device.bind()?;
    // SAFETY: a context is current (bound above; flushing releases and the cache's release run
    // on this thread and leave it so); out-pointer to a local.
    let mut allocate = || unsafe { sys::cuMemHostAlloc(&mut raw, bytes, flags) };
    let mut code = crate::lifetime::retry_after_releases(&mut allocate);
    // A failed release (a block the driver would not take back) leaves the error to the retry.
    if code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
        && host_cache::release_cached_host_memory(device).is_ok_and(|b| b > 0)
    {
        code = allocate();
    }
    check(code, "cuMemHostAlloc")?;
    NonNull::new(raw.cast::<u8>())
        .ok_or_else(|| Error::InvalidArgument { name: "bytes", reason: "cuMemHostAlloc returned null".into() })
}
