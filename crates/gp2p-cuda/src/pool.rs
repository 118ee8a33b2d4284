//! Device memory from a stream-ordered pool of the library's own, one per device.
//!
//! `cuMemAlloc` and `cuMemFree` synchronise the whole device: a free waits until every stream
//! is idle, and meanwhile driver calls of other threads wait too. The reclaimer frees memory
//! whose last uses are done, so with `cuMemFree` one long kernel anywhere on the device (or a
//! stream held by a test gate) stalled unrelated threads behind a release. A pool allocation
//! and its free are operations on a stream, ordered with that stream's work only: the pool's
//! own stream, where nothing else runs, so an allocation is usable by any stream once that
//! stream is synchronised (which waits for nothing but the pool's own operations), and a free
//! enqueued there once the memory's last uses completed is released at once.
//!
//! The pool is the library's, not the device's default pool that the CUDA runtime and
//! frameworks allocate from (cudarc, for one): its attributes and peer access are set here
//! without changing theirs.
#![allow(unsafe_code)]

use std::ptr;

use cudarc::driver::sys::{self, CUdeviceptr, CUmemoryPool, CUstream};

use crate::driver::check;
use crate::{Device, Result};

/// Freed memory the pool keeps for the next allocations instead of giving it back to the
/// system at the next synchronisation (the pool's default keeps none, and the synchronise in
/// every allocation would then return and re-map memory each time). What is beyond goes back,
/// so a large buffer dropped leaves its memory to other allocators (torch's, say).
const KEPT_BYTES: u64 = 256 << 20;

/// A device's pool and the stream its operations run on; both live as long as the process
/// (like the primary context the device keeps retained).
pub(crate) struct MemoryPool {
    pool: CUmemoryPool,
    stream: CUstream,
}

// SAFETY: opaque driver handles; the driver API may be called on them from any thread.
unsafe impl Send for MemoryPool {}
// SAFETY: as above; nothing here is mutated after creation.
unsafe impl Sync for MemoryPool {}

impl MemoryPool {
    /// The pool of device `ordinal` (its context current), or `None` where the device has no
    /// stream-ordered allocator (then memory comes from `cuMemAlloc` as before).
    pub(crate) fn for_device(raw: sys::CUdevice, ordinal: usize) -> Result<Option<MemoryPool>> {
        let mut supported = 0;
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
        // SAFETY: a valid device handle; out-pointer to a local.
        check(unsafe { sys::cuDeviceGetAttribute(&mut supported, attr, raw) }, "cuDeviceGetAttribute")?;
        if supported == 0 {
            return Ok(None);
        }
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: i32::try_from(ordinal).unwrap_or(i32::MAX),
            },
            win32SecurityAttributes: ptr::null_mut(),
            reserved: [0; 64],
        };
        let mut pool: CUmemoryPool = ptr::null_mut();
        // SAFETY: props describes device memory of this device, no export handles; out-pointer
        // to a local.
        check(unsafe { sys::cuMemPoolCreate(&mut pool, &props) }, "cuMemPoolCreate")?;
        let mut kept = KEPT_BYTES;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        // SAFETY: the pool just made; the attribute takes a u64, read during the call.
        let code = unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&raw mut kept).cast()) };
        if let Err(e) = check(code, "cuMemPoolSetAttribute") {
            // SAFETY: the pool just made, nothing allocated from it.
            unsafe { sys::cuMemPoolDestroy(pool) };
            return Err(e);
        }
        let mut stream: CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the device's context is current (the caller's contract); out-pointer to a local.
        if let Err(e) = check(unsafe { sys::cuStreamCreate(&mut stream, flags) }, "cuStreamCreate") {
            // SAFETY: the pool just made, nothing allocated from it.
            unsafe { sys::cuMemPoolDestroy(pool) };
            return Err(e);
        }
        Ok(Some(MemoryPool { pool, stream }))
    }

    /// `bytes` of device memory, usable by every stream of the device when this returns.
    /// The device's context must be current.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<CUdeviceptr> {
        let mut dptr: CUdeviceptr = 0;
        // Out of memory: once what was dropped is released (its frees are on this pool's
        // stream, so the retry can reuse it), the retry may succeed.
        let code = crate::lifetime::retry_after_releases(|| {
            // SAFETY: a live pool and stream of the current context; out-pointer to a local.
            unsafe { sys::cuMemAllocFromPoolAsync(&mut dptr, bytes, self.pool, self.stream) }
        });
        check(code, "cuMemAllocFromPoolAsync")?;
        // Other streams may use it once the pool's stream has passed the allocation: that
        // stream runs only the pool's allocations and frees, none of which waits for anything.
        // SAFETY: a live stream of the current context.
        if let Err(e) = check(unsafe { sys::cuStreamSynchronize(self.stream) }, "cuStreamSynchronize") {
            // SAFETY: allocated above, never handed out.
            unsafe { sys::cuMemFreeAsync(dptr, self.stream) };
            return Err(e);
        }
        Ok(dptr)
    }

    /// Give `ptr` back to the pool. The device's context must be current.
    ///
    /// # Safety
    /// `ptr` came from [`MemoryPool::alloc`] of this pool, is freed once, and every use of
    /// it by the GPU has completed.
    pub(crate) unsafe fn free(&self, ptr: CUdeviceptr) -> Result<()> {
        // SAFETY: the caller's contract; the free waits for nothing (the pool's stream has
        // nothing else pending that matters to this memory).
        check(unsafe { sys::cuMemFreeAsync(ptr, self.stream) }, "cuMemFreeAsync")
    }

    /// Let `accessor` read and write this pool's memory (peer access: the context-level
    /// `cuCtxEnablePeerAccess` does not cover pool memory, and a peer copy into pool memory
    /// that was not granted has been reported to succeed without writing). Never called for
    /// the pool's own device.
    pub(crate) fn grant(&self, accessor: &Device) -> Result<()> {
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: i32::try_from(accessor.ordinal()).unwrap_or(i32::MAX),
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: a live pool; one descriptor, read during the call.
        check(unsafe { sys::cuMemPoolSetAccess(self.pool, &desc, 1) }, "cuMemPoolSetAccess")
    }
}
